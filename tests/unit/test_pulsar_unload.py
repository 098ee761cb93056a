"""Topic names, the admin client's redirects and credentials, and the unload plan.

The admin client is tested against a loopback HTTP server that answers as a broker's admin API
does (307 to the owner, 204, 404 with Pulsar's ``{"reason": ...}``); tests/pulsar unloads
topics on a real broker.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bklib.pulsar.admin import AdminSettings, PulsarAdmin, PulsarAdminError
from bklib.pulsar.topics import InvalidTopicName, TopicName, parse_topic
from bklib.pulsar.unload import ledgers_changed, topics_to_unload, unload_topics
from bklib.states import ActionKind, ActionStatus
from bklib.testing.ports import free_port


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("persistent://public/default/t1", "/admin/v2/persistent/public/default/t1/unload"),
        (
            "persistent://public/default/my topic-partition-2",
            "/admin/v2/persistent/public/default/my+topic-partition-2/unload",
        ),
        ("persistent://t/ns/a%b", "/admin/v2/persistent/t/ns/a%25b/unload"),
        ("persistent://prop/use/ns/t", "/admin/persistent/prop/use/ns/t/unload"),  # v1
    ],
)
def test_admin_paths(name: str, path: str) -> None:
    topic = parse_topic(name)
    assert topic.admin_path("unload") == path
    assert str(topic) == name


@pytest.mark.parametrize("name", ["public/default/t", "http://x/y/z", "persistent://a/b", ""])
def test_bad_topic_names(name: str) -> None:
    with pytest.raises(InvalidTopicName):
        parse_topic(name)


def _row(lid: int, action: str, status: str) -> dict[str, object]:
    return {"ledger_id": lid, "action": action, "status": status}


def test_plan_names_each_topic_once_for_changed_ledgers_only() -> None:
    rows = [
        _row(1, ActionKind.COPY, ActionStatus.DONE),
        _row(1, ActionKind.METADATA_UPDATE, ActionStatus.DONE),
        _row(2, ActionKind.FENCE_AND_CLOSE, ActionStatus.DONE),
        _row(3, ActionKind.METADATA_UPDATE, ActionStatus.FAILED),  # nothing changed
        _row(4, ActionKind.METADATA_UPDATE, ActionStatus.PLANNED),
        _row(5, ActionKind.METADATA_UPDATE, ActionStatus.DONE),
    ]
    assert ledgers_changed(rows) == {1, 2, 5}
    assert ledgers_changed(rows, dry_run=True) == {4}
    topics = {1: "persistent://a/b/t", 2: "persistent://a/b/t", 5: None, 4: "persistent://a/b/u"}
    assert topics_to_unload({1, 2, 5}, topics) == {"persistent://a/b/t": [1, 2]}


class _Broker(BaseHTTPRequestHandler):
    """Two "brokers" in one server: /owner/... owns topics, the rest redirect there."""

    seen: list[tuple[str, str, str | None]] = []
    dead_port = 0

    def do_PUT(self) -> None:
        self.seen.append(("PUT", self.path, self.headers.get("Authorization")))
        if "/elsewhere/" in self.path:  # owned by a broker we cannot reach
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{self.dead_port}{self.path}")
            self.end_headers()
            return
        if not self.path.startswith("/owner/"):
            self.send_response(307)
            self.send_header("Location", "/owner" + self.path)
            self.end_headers()
            return
        if "/missing/" in self.path:
            body = json.dumps({"reason": "Topic not found"}).encode()
            self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def broker() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Broker)
    _Broker.seen = []
    _Broker.dead_port = free_port()
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_unload_follows_the_redirect_with_the_token(broker: str) -> None:
    admin = PulsarAdmin(AdminSettings(broker, token="jwt.abc"))
    admin.unload(TopicName("persistent", "public", "default", "t1"))
    path = "/admin/v2/persistent/public/default/t1/unload"
    assert _Broker.seen == [
        ("PUT", path, "Bearer jwt.abc"),
        ("PUT", "/owner" + path, "Bearer jwt.abc"),
    ]
    with pytest.raises(PulsarAdminError) as exc:
        admin.unload(TopicName("persistent", "public", "missing", "t"))
    assert exc.value.status == 404 and "Topic not found" in str(exc.value)


def test_unloads_are_rated_and_an_unreachable_api_is_tried_once() -> None:
    plan = {f"persistent://a/b/t{i}": [i] for i in range(3)}
    dead = PulsarAdmin(AdminSettings(f"http://127.0.0.1:{free_port()}", timeout=2.0))
    out = unload_topics(dead, plan, per_second=1000)
    assert [o.status for o in out] == [ActionStatus.FAILED] * 3
    assert len({o.error for o in out}) == 1 and "unreachable" in str(out[0].error)
    assert all(o.finished_at == o.started_at for o in out[1:])  # not tried again


def test_an_unreachable_owner_fails_its_topic_only(broker: str) -> None:
    plan = {"persistent://a/elsewhere/t1": [1], "persistent://a/b/t2": [2]}
    out = unload_topics(PulsarAdmin(AdminSettings(broker, timeout=2.0)), plan, per_second=1000)
    assert [o.status for o in out] == [ActionStatus.FAILED, ActionStatus.DONE]
    assert "unreachable" in str(out[0].error)


def test_rate_and_outcomes_against_a_broker(broker: str) -> None:
    plan = {
        "persistent://a/b/t1": [1],
        "persistent://a/missing/t2": [2],  # deleted meanwhile: skipped, not failed
        "persistent://a/b/t3": [3, 4],
    }
    sleeps: list[float] = []
    out = unload_topics(
        PulsarAdmin(AdminSettings(broker)), plan, per_second=0.5, sleep=sleeps.append
    )
    assert [o.status for o in out] == [ActionStatus.DONE, ActionStatus.SKIPPED, ActionStatus.DONE]
    assert len(sleeps) == 2 and all(1.5 < s <= 2.0 for s in sleeps)
    dry = unload_topics(None, plan, dry_run=True)
    assert {o.status for o in dry} == {ActionStatus.PLANNED} and len(_Broker.seen) == 6
    named = unload_topics(None, plan)  # no admin API: the operator's step, with the command
    assert {o.status for o in named} == {ActionStatus.MANUAL}
    assert "pulsar-admin topics unload persistent://a/b/t1" in str(named[0].error)


def test_topics_awaiting_unload_until_a_later_unload() -> None:
    from datetime import datetime, timedelta, timezone

    from bklib.pulsar.unload import topics_awaiting_unload

    t0 = datetime(2026, 11, 27, tzinfo=timezone.utc)

    def unload(topic: str, status: str, minute: int) -> dict[str, object]:
        return {
            "ledger_id": 1,
            "action": ActionKind.UNLOAD_TOPIC,
            "status": status,
            "started_at": t0 + timedelta(minutes=minute),
            "topic": topic,
        }

    rows = [
        unload("persistent://a/b/t1", ActionStatus.MANUAL, 1),  # no URL given
        unload("persistent://a/b/t2", ActionStatus.FAILED, 1),  # the admin API refused
        unload("persistent://a/b/t2", ActionStatus.DONE, 2),  # a later run did it
        unload("persistent://a/b/t3", ActionStatus.SKIPPED, 1),  # deleted meanwhile
        unload("persistent://a/b/t4", ActionStatus.PLANNED, 1),  # a dry run changes nothing
        {**unload("persistent://a/b/t5", ActionStatus.DONE, 1), "action": ActionKind.COPY},
    ]
    assert topics_awaiting_unload(rows) == ["persistent://a/b/t1"]
    rows.append(unload("persistent://a/b/t1", ActionStatus.PLANNED, 3))
    assert topics_awaiting_unload(rows) == ["persistent://a/b/t1"]
    rows.append(unload("persistent://a/b/t1", ActionStatus.DONE, 4))
    assert topics_awaiting_unload(rows) == []
