"""Quiet by default: progress as a bar on a terminal and as periodic lines otherwise, JSON logs
for schedulers, and the one line a missing Spark install gets."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from jobs.cli.config import configure_logging, pop_log_format
from jobs.runtime import logs as logsetup
from jobs.runtime import progress
from jobs.runtime.messages import SPARK_EXTRA, one_line, spark_missing
from jobs.runtime.progress import Progress, track


class _Tty(io.StringIO):
    """stderr as a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    """Records of the ``t.progress`` logger."""
    got: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record)

    logger = logging.getLogger("t.progress")
    handler = Keep()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield got
    finally:
        logger.removeHandler(handler)


@pytest.fixture(autouse=True)
def _text_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts from text logs, no progress override, and leaves no handler behind."""
    monkeypatch.delenv(progress.MODE_ENV, raising=False)
    saved = dict(logsetup._state)
    root = logging.getLogger()
    before = list(root.handlers), root.level
    yield
    logsetup._state.update(saved)
    for h in list(root.handlers):
        if h not in before[0]:
            root.removeHandler(h)
    root.setLevel(before[1])


def test_lines_when_not_a_terminal(
    monkeypatch: pytest.MonkeyPatch, records: list[logging.LogRecord]
) -> None:
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert progress.mode() == "lines"
    # every=0: a line per moved count, so the test needs no clock.
    out = list(track(range(4), 4, "metadata scan", logger=logging.getLogger("t.progress"), every=0))
    assert out == [0, 1, 2, 3]
    lines = [r.getMessage() for r in records]
    # No line for the last item: the step's own summary says it finished.
    assert [x.split(",")[0] for x in lines] == [f"metadata scan: {n}/4 ledgers" for n in (1, 2, 3)]
    assert all("ETA" in x and "elapsed" in x for x in lines)
    assert "\r" not in "".join(lines)


def test_a_count_that_does_not_move_is_not_repeated(
    monkeypatch: pytest.MonkeyPatch, records: list[logging.LogRecord]
) -> None:
    monkeypatch.setattr("sys.stderr", io.StringIO())
    p = Progress("copy", 10, logger=logging.getLogger("t.progress"), every=0)
    p.update_to(3)
    p.update_to(3)
    p.update_to(3)
    p.update_to(5)
    assert [r.getMessage().split(",")[0] for r in records] == [
        "copy: 3/10 ledgers",
        "copy: 5/10 ledgers",
    ]


def test_bar_on_a_terminal_with_log_lines_around_it(
    monkeypatch: pytest.MonkeyPatch, records: list[logging.LogRecord]
) -> None:
    tty = _Tty()
    monkeypatch.setattr("sys.stderr", tty)
    logsetup.setup_logging("INFO", stream=tty)
    assert progress.mode() == "bar"
    with Progress("replicas", 50, logger=logging.getLogger("t.progress"), every=0) as p:
        assert progress.bars_active()
        p.advance(20)
        logging.getLogger("t.other").info("a record while the bar is drawn")
        p.advance(10)
    assert not progress.bars_active()
    text = tty.getvalue()
    assert "replicas" in text and "/50" in text  # tqdm's bar: count, total...
    assert "<" in text  # ...and its "elapsed<remaining" ETA
    # The record got a line of its own, not glued to the bar.
    line = next(x for x in text.replace("\r", "\n").splitlines() if "a record while" in x)
    assert line.endswith("INFO t.other: a record while the bar is drawn")
    assert "replicas" not in line
    assert records == []  # a bar, not periodic lines


def test_progress_env_forces_lines_and_json_logs_never_get_a_bar(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sys.stderr", _Tty())
    monkeypatch.setenv(progress.MODE_ENV, "lines")
    assert progress.mode() == "lines"
    monkeypatch.setenv(progress.MODE_ENV, "bar")
    logsetup.setup_logging("INFO", fmt="json", stream=io.StringIO())
    assert progress.mode() == "lines"  # a bar would break one-object-per-line output
    monkeypatch.delenv(progress.MODE_ENV)
    assert progress.mode() == "lines"


def test_json_logs_are_one_object_per_line() -> None:
    stream = io.StringIO()
    logsetup.setup_logging("INFO", fmt="json", stream=stream)
    log = logging.getLogger("jobs.commands.audit")
    log.info("metadata: %d ledgers", 200)
    log.debug("not at INFO")
    try:
        raise ValueError("broken\nacross lines")
    except ValueError:
        log.exception("load failed")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = map(json.loads, lines)
    assert first["msg"] == "metadata: 200 ledgers" and first["level"] == "INFO"
    assert first["logger"] == "jobs.commands.audit" and first["ts"].endswith("+00:00")
    assert second["level"] == "ERROR" and "ValueError: broken" in second["exc"]


def test_verbose_is_debug_but_keeps_py4j_call_traces_out() -> None:
    stream = io.StringIO()
    logsetup.setup_logging("INFO", verbose=True, stream=stream)
    logging.getLogger("kazoo.client").debug("zk request")
    logging.getLogger("bklib.client.reader").debug("ledger 7 read")
    logging.getLogger("py4j.clientserver").debug("Command to send: c o123 count")
    logging.getLogger("py4j.clientserver").info("Closing down clientserver connection")
    text = stream.getvalue()
    assert "zk request" in text and "ledger 7 read" in text
    assert "Command to send" not in text and "Closing down" in text
    stream = io.StringIO()
    logsetup.setup_logging("INFO", stream=stream)
    logging.getLogger("py4j.clientserver").info("Closing down clientserver connection")
    logging.getLogger("kazoo.client").info("Connecting")
    assert stream.getvalue() == ""


def test_configure_logging_takes_the_format_from_flag_env_or_file(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("logging:\n  log-format: json\n")
    configure_logging(config_path=cfg, env={})
    assert logsetup.log_format() == "json"
    configure_logging(config_path=cfg, env={"BKAUDIT_LOG_FORMAT": "text"})
    assert logsetup.log_format() == "text"
    configure_logging(config_path=cfg, env={"BKAUDIT_LOG_FORMAT": "text"}, log_format="json")
    assert logsetup.log_format() == "json"
    # One handler of ours however often it is configured: no line printed twice.
    ours = [h for h in logging.getLogger().handlers if isinstance(h, logsetup.BarAwareHandler)]
    assert len(ours) == 1


def test_pop_log_format_takes_the_flag_out_of_a_command_line() -> None:
    argv = ["--zk", "z", "--log-format", "json", "--dry-run", "--log-format=text"]
    assert pop_log_format(argv) == "text"
    assert argv == ["--zk", "z", "--dry-run"]
    assert pop_log_format(["--zk", "z"]) is None


def test_a_missing_spark_module_is_one_line_naming_the_extra() -> None:
    for name in ("pyspark", "pyspark.sql", "delta", "py4j.java_gateway"):
        exc = ModuleNotFoundError(f"No module named {name!r}", name=name)
        assert spark_missing(exc)
        line = one_line(exc)
        assert SPARK_EXTRA in line and name.partition(".")[0] in line and "\n" not in line
    other = ModuleNotFoundError("No module named 'yaml'", name="yaml")
    assert not spark_missing(other)
    assert one_line(other) == "ModuleNotFoundError: No module named 'yaml'"
