"""Python logging for every bkaudit command: text or one JSON object per line, and a handler
that keeps log lines and :mod:`jobs.runtime.progress` bars from overwriting each other.

Nothing here imports Spark: ``bkaudit bookie`` and ``sandbox`` use it too. The chosen
settings stay readable (:func:`is_verbose`, :func:`log_format`) so the Spark session can hide
the JVM's console progress and Ivy's report unless ``--verbose``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from datetime import datetime, timezone
from typing import Any, TextIO

__all__ = [
    "LIBRARY_LOGGERS",
    "LOG_FORMATS",
    "RUST_LOG_DEFAULT",
    "JsonFormatter",
    "is_verbose",
    "log_format",
    "logging_settings",
    "setup_logging",
]

LOG_FORMATS = ("text", "json")
DEFAULT_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

LIBRARY_LOGGERS = (
    "kazoo", "oxia", "grpc", "py4j", "urllib3", "py.warnings", "botocore", "boto3",
)  # fmt: skip
"""Other projects' loggers: at ERROR unless ``-v``. Their warnings (kazoo's "Connection
dropped" per retry, the Oxia client's retries) repeat what bkaudit says in one line."""

RUST_LOG_DEFAULT = "error"
"""``RUST_LOG`` unless ``-v`` (or the operator's own): delta-rs logs through env_logger, whose
warnings (a multi-kilobyte ``aws_config::imds`` line per credential provider tried) would
otherwise reach the terminal."""

_state: dict[str, Any] = {"verbose": False, "format": "text"}
# Progress bars drawn now on stderr (jobs.runtime.progress opens and closes them).
_bars = 0
_bars_lock = threading.Lock()


def bars_active() -> bool:
    """True while a progress bar is drawn (the log handler then writes around it)."""
    return _bars > 0


def bar_opened() -> None:
    """A progress bar is now drawn on stderr."""
    global _bars
    with _bars_lock:
        _bars += 1


def bar_closed() -> None:
    """A progress bar drawn on stderr was removed."""
    global _bars
    with _bars_lock:
        _bars -= 1


def is_verbose() -> bool:
    """True when the command runs with ``-v`` / ``--verbose`` (DEBUG, JVM chatter shown)."""
    return bool(_state["verbose"])


def log_format() -> str:
    """``text`` or ``json``: what :func:`setup_logging` installed last."""
    return str(_state["format"])


def logging_settings() -> tuple[str, bool, str]:
    """This process's logging (level, verbose, format): what a child process it starts passes
    to :func:`setup_logging` to log as it does."""
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    return str(level), is_verbose(), log_format()


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for schedulers and log shippers: ``ts`` (UTC, ISO 8601),
    ``level``, ``logger``, ``msg``, ``thread``, and ``exc`` when there is a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "thread": record.threadName,
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class BarAwareHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that, while a progress bar is drawn on the same stream, clears the
    bar, writes the record and redraws the bar (else both would share one terminal line)."""

    def emit(self, record: logging.LogRecord) -> None:
        if not bars_active():
            super().emit(record)
            return
        from tqdm import tqdm

        with tqdm.external_write_mode(file=self.stream):
            super().emit(record)


def setup_logging(
    level: str = "INFO",
    *,
    verbose: bool = False,
    fmt: str = "text",
    text_format: str = DEFAULT_TEXT_FORMAT,
    quiet: tuple[str, ...] | list[str] = ("kazoo", "py4j"),
    stream: TextIO | None = None,
) -> None:
    """Install bkaudit's handler on the root logger, replacing one an earlier call installed
    (so a second call does not print every line twice; other handlers, pytest's for one, stay).

    ``verbose`` forces DEBUG and leaves the ``quiet`` loggers alone (py4j stays at INFO: its
    DEBUG is one line per Python-to-JVM call, which slows a Spark job several times over and
    tells an operator nothing); otherwise those are raised to WARNING, the
    :data:`LIBRARY_LOGGERS` to ERROR, and delta-rs's Rust log to errors
    (:data:`RUST_LOG_DEFAULT`). ``fmt`` is ``text`` (``text_format``) or ``json``.
    """
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r}: use one of {', '.join(LOG_FORMATS)}")
    _state["verbose"], _state["format"] = verbose, fmt
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, BarAwareHandler):
            root.removeHandler(h)
    handler = BarAwareHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(text_format))
    root.addHandler(handler)
    root.setLevel("DEBUG" if verbose else level.upper())
    for name in quiet:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)
    # Python warnings (a library's DeprecationWarning, kazoo's "No chroot path exists") go
    # through logging, so that they follow -v as the libraries' log lines do.
    logging.captureWarnings(True)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.ERROR)
    if verbose:
        logging.getLogger("py4j").setLevel(logging.INFO)
    _set_rust_log(verbose)


_RUST_LOG_MARK = "BKAUDIT_RUST_LOG_SET"
"""Set beside our ``RUST_LOG``, so that a child with ``-v`` tells ours from the operator's."""


def _set_rust_log(verbose: bool) -> None:
    """``RUST_LOG=error`` for this process and its children unless ``-v`` or the operator set
    one; read by delta-rs's logger when it is first loaded, so set before any table is."""
    ours = os.environ.get(_RUST_LOG_MARK)
    if verbose:
        if ours is not None and os.environ.get("RUST_LOG") == ours:
            del os.environ["RUST_LOG"]
        os.environ.pop(_RUST_LOG_MARK, None)
    elif "RUST_LOG" not in os.environ:
        os.environ["RUST_LOG"] = os.environ[_RUST_LOG_MARK] = RUST_LOG_DEFAULT
