"""``--warehouse``: the forms it takes, said once, and a typo refused in one line.

delta-rs takes an unknown scheme (``s3b://``) without a word and a scheme with one slash
(``s3a:/ops``) as a local directory named ``s3a:``: either would be a run written where
nobody looks. :func:`check_warehouse_uri` refuses both before anything is read, naming the
accepted forms (:data:`WAREHOUSE_FORMS`, the flag's help text too). Whether the warehouse can
be reached and written is :func:`jobs.tables.delta.check_writable`'s question.
"""

from __future__ import annotations

import re

__all__ = [
    "WAREHOUSE_FORMS",
    "WAREHOUSE_HELP",
    "WAREHOUSE_SCHEMES",
    "WarehouseUriError",
    "check_warehouse_uri",
]

WAREHOUSE_SCHEMES = (
    "file", "s3", "s3a", "gs", "abfss", "abfs", "az", "azure", "adl", "hdfs", "viewfs",
)  # fmt: skip
"""The object stores delta-rs (and Spark's Hadoop file systems) write Delta tables to."""

WAREHOUSE_FORMS = (
    "a directory (/var/lib/bkaudit, file:///var/lib/bkaudit) or an object-store URI "
    "(s3://BUCKET/PATH, or s3a:// for the same place; also "
    + ", ".join(f"{s}://" for s in WAREHOUSE_SCHEMES[3:])
    + ")"
)
"""What ``--warehouse`` accepts, for its help text and its errors."""

WAREHOUSE_HELP = f"where the Delta tables are: {WAREHOUSE_FORMS}"

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")


class WarehouseUriError(ValueError):
    """A ``--warehouse`` that is no directory nor URI we write to (one line)."""


def check_warehouse_uri(warehouse: str) -> str:
    """``warehouse`` as given, when it is one of :data:`WAREHOUSE_FORMS`; raises
    :class:`WarehouseUriError` naming them otherwise."""
    text = warehouse.strip()
    why = None
    match = _SCHEME.match(text)
    if not text:
        why = "is empty"
    elif match is not None:
        scheme = match.group(1).lower()
        if not text[match.end() :].startswith("//"):
            why = f"has a scheme {scheme + ':'!r} without '//'"
        elif scheme not in WAREHOUSE_SCHEMES:
            why = f"has an unknown scheme {scheme + '://'!r}"
        elif scheme != "file" and not text[match.end() + 2 :].strip("/"):
            why = "names no bucket or container"
    if why is not None:
        raise WarehouseUriError(f"--warehouse {warehouse!r} {why}: give {WAREHOUSE_FORMS}")
    return warehouse
