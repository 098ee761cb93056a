"""delta-rs's Rust panic reports kept off the terminal (docs/exit-status.md).

A write that fails mid-way (a full disk, a store that went away) makes delta-rs's runtime
panic on its way out (``thread 'tokio-rt-worker' panicked at …object_store…: Already shut
down``) before the Python call raises its :class:`deltalake.exceptions.DeltaError`. Rust's
panic hook writes to file descriptor 2 itself, past Python's ``sys.stderr``, and deltalake
offers no way to replace it. The error that follows is what the operator needs; bkaudit turns
it into one line naming the table (:func:`jobs.tables.delta.table_error`).

So while delta-rs writes, :func:`quiet_rust_panics` points descriptor 2 at a temporary file,
then writes back everything else that came (log records of other threads, a progress bar) and
logs the panic reports at DEBUG: with ``-v`` they are shown, as other libraries' chatter is.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator

from jobs.runtime.interrupts import at_exit_now

__all__ = ["quiet_rust_panics", "split_panics"]

log = logging.getLogger(__name__)

_PANIC = re.compile(r"^thread '[^']*'( \(\d+\))? panicked at ")
_LOG_RECORD = re.compile(r"^(\d{4}-|\{)")
"""A line of ours: a text log record (timestamp first) or a JSON one."""


def split_panics(text: str) -> tuple[str, list[str]]:
    """(``text`` without its Rust panic reports, the reports). A report runs from its
    ``thread '…' panicked at`` line through the ``note:`` line Rust ends it with, or up to
    the next log record or the end where a backtrace left that line out."""
    kept: list[str] = []
    panics: list[str] = []
    current: list[str] | None = None
    for line in text.splitlines(keepends=True):
        if _PANIC.match(line):
            if current:
                panics.append("".join(current))
            current = [line]
            if kept and not kept[-1].strip():
                kept.pop()  # the blank line Rust writes before a report
            continue
        if current is not None:
            if _LOG_RECORD.match(line):
                panics.append("".join(current))
                current = None
            else:
                current.append(line)
                if line.startswith("note: "):
                    panics.append("".join(current))
                    current = None
                continue
        kept.append(line)
    if current:
        panics.append("".join(current))
    return "".join(kept), panics


class _Redirect:
    """Descriptor 2 pointed at a temporary file while any caller is inside (threads of one
    process share it, so the first in redirects and the last out restores)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.saved: int | None = None
        self.capture: tempfile._TemporaryFileWrapper[bytes] | None = None
        self.unregister: object = None

    def enter(self) -> None:
        with self.lock:
            self.depth += 1
            if self.depth > 1:
                return
            sys.stderr.flush()
            self.capture = tempfile.NamedTemporaryFile(prefix="bkaudit-stderr-")  # noqa: SIM115
            self.saved = os.dup(2)
            os.dup2(self.capture.fileno(), 2)
            # A signal's deadline leaves with os._exit: its one line must reach the terminal.
            self.unregister = at_exit_now(self.restore)

    def leave(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                self._restore_locked()

    def restore(self) -> None:
        with self.lock:
            self.depth = 0
            self._restore_locked()

    def _restore_locked(self) -> None:
        if self.saved is None or self.capture is None:
            return
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.saved = None
        capture, self.capture = self.capture, None
        if callable(self.unregister):
            self.unregister()
        capture.seek(0)
        text = capture.read().decode("utf-8", "replace")
        capture.close()
        kept, panics = split_panics(text)
        if kept:
            sys.stderr.write(kept)
            sys.stderr.flush()
        for report in panics:
            log.debug("delta-rs panicked (its error follows as an exception): %s", report.strip())


_redirect = _Redirect()


@contextlib.contextmanager
def quiet_rust_panics() -> Iterator[None]:
    """Around a delta-rs call that writes: its Rust panic reports go to the DEBUG log instead
    of the terminal. With ``-v`` (DEBUG on) nothing is redirected."""
    if log.isEnabledFor(logging.DEBUG):
        yield
        return
    _redirect.enter()
    try:
        yield
    finally:
        _redirect.leave()
