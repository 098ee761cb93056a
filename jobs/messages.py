"""How an error reaches an operator: one line, naming what failed; the traceback only at DEBUG
(``bkaudit -v``)."""

from __future__ import annotations

from bklib.errors import BKError

__all__ = ["one_line"]


def one_line(exc: BaseException) -> str:
    """``exc`` as one line. bkaudit's own errors already name the ledger, bookie or znode;
    anything else gets its type name, since a bare message may not say what broke."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text if isinstance(exc, BKError) and text else f"{type(exc).__name__}: {text}"
