"""A real Pulsar broker over three Java bookies on Pulsar's metadata driver
(``metadata-store:zk:``): messages produced with PyPI's pulsar-client come back whole, and the
topics' ledgers are in ZooKeeper where bklib reads them.

The test prints (``-s``) and writes to ``<tmp_path>/report.json`` its timings, the broker's
memory and CPU to start, and the znodes under ``/ledgers`` that Pulsar's driver wrote.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pulsar
import pytest

from tests.pulsar.harness import LEDGERS_ROOT, PulsarCluster, znode_tree

pytestmark = [pytest.mark.integration, pytest.mark.pulsar]

TOPICS = ["persistent://public/default/smoke-a", "persistent://public/default/smoke-b"]
MESSAGES = 50


def _payload(topic: str, i: int) -> bytes:
    return f"{topic.rsplit('/', 1)[1]}:{i}:".encode() + bytes(range(i % 50, i % 50 + 40))


def test_produce_consume_on_pulsar_driver(
    pulsar_cluster: Callable[..., AbstractContextManager[PulsarCluster]],
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    t_start = time.monotonic()
    with pulsar_cluster(driver="pulsar", bookies=3) as cluster:
        broker = cluster.broker
        assert broker is not None
        report: dict[str, object] = {
            "timings_s": dict(cluster.timings),
            "broker_rss_mb_after_start": round(broker.rss_bytes() / 2**20, 1),
            "broker_cpu_s_to_start": round(broker.cpu_seconds(), 1),
        }
        broker.health_check()

        client = pulsar.Client(
            broker.service_url,
            operation_timeout_seconds=30,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
        )
        try:
            t0 = time.monotonic()
            consumers = {
                t: client.subscribe(
                    t,
                    "smoke",
                    initial_position=pulsar.InitialPosition.Earliest,
                )
                for t in TOPICS
            }
            for t in TOPICS:
                producer = client.create_producer(t, batching_enabled=False)
                for i in range(MESSAGES):
                    producer.send(_payload(t, i), properties={"i": str(i)})
                producer.close()
            t1 = time.monotonic()
            for t, consumer in consumers.items():
                got = []
                for _ in range(MESSAGES):
                    msg = consumer.receive(timeout_millis=30000)
                    got.append((msg.properties()["i"], msg.data()))
                    consumer.acknowledge(msg)
                assert got == [(str(i), _payload(t, i)) for i in range(MESSAGES)], cluster.logs()
                consumer.close()
            report["timings_s"] = {
                **cluster.timings,
                "produce": t1 - t0,
                "consume": time.monotonic() - t1,
            }
        finally:
            client.close()

        # Each topic's managed ledger names its ledgers in the metadata store.
        for t in TOPICS:
            ml = f"/managed-ledgers/public/default/persistent/{t.rsplit('/', 1)[1]}"
            assert cluster.zk.exists(ml), (ml, znode_tree(cluster.zk, "/managed-ledgers", 5))

        report["ledgers_znodes"] = znode_tree(cluster.zk, LEDGERS_ROOT, depth=4)
        report["root_znodes"] = znode_tree(cluster.zk, "/", depth=1)
        report["layout_znode"] = bool(cluster.zk.exists(f"{LEDGERS_ROOT}/LAYOUT"))
        report["broker_rss_mb_end"] = round(broker.rss_bytes() / 2**20, 1)
        report["broker_cpu_s_end"] = round(broker.cpu_seconds(), 1)
    report["test_s"] = round(time.monotonic() - t_start, 1)
    (tmp_path / "report.json").write_text(json.dumps(report, indent=2))
    print("pulsar smoke report:", json.dumps(report, indent=2))
    for k, v in report.items():
        record_property(k, v)
    # Pulsar's driver keeps the bookies' registrations where BookKeeper's does.
    ledgers = report["ledgers_znodes"]
    assert isinstance(ledgers, list) and f"{LEDGERS_ROOT}/available" in ledgers
