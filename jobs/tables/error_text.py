"""delta-rs's errors as one line.

delta-rs chains an error's causes on lines of their own, each behind a coloured ``↳``; the
first line says what failed ("Generic S3 error"), the innermost why ("Connection refused
(os error 111)", "IMDS is disabled"). :func:`delta_rs_cause` keeps those two, which is what an
operator acts on, and says first when credentials were the problem.
"""

from __future__ import annotations

import re

__all__ = ["delta_rs_cause"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def delta_rs_cause(exc: BaseException) -> str:
    """``exc``'s first line and its innermost cause, on one line."""
    lines = [_ANSI.sub("", x).strip().lstrip("↳").strip() for x in str(exc).splitlines()]
    lines = [x for x in lines if x] or [type(exc).__name__]
    first, last = lines[0], lines[-1]
    text = first if first == last else f"{first}: {last}"
    if any("credentials" in x for x in lines):
        text = f"no credentials ({text})"
    return text
