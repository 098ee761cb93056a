"""The ``ledgers`` table's rows of one run, built column by column from the audit's views.

A local audit of a million ledgers commits a million rows. Made as a dict per ledger and then
converted by pyarrow, they took about 17 s of a 130 s run (docs/benchmarks.md); built as
columns, with the segments flattened into offsets, they take a fraction of that. The table is
the one :func:`jobs.tables.delta.rows_to_arrow` makes of ``{"run_id": ..., **view.as_row()}``
(``tests/unit/test_ledgers_arrow.py`` holds them equal).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

import pyarrow as pa

from bklib.audit.model import LedgerView
from jobs.tables.schema import LEDGERS, RUN_DATE, TABLE_SCHEMAS

__all__ = ["ledgers_table"]

_SCALARS = (
    "ledger_id", "znode_path", "znode_version", "state", "ensemble_size", "write_quorum",
    "ack_quorum", "last_entry_id", "length", "digest_type", "ctime", "error", "topic",
    "component",
)  # fmt: skip
"""The view attributes that are plain columns of the same name."""


def _segments(views: Sequence[LedgerView], type_: pa.ListType) -> pa.Array:
    """The ``segments`` column: a list of (first, last, ensemble) structs per ledger, null for
    an unreadable one, from flat arrays and their offsets."""
    seg_offsets: list[int] = [0]
    ens_offsets: list[int] = [0]
    firsts: list[int] = []
    lasts: list[int | None] = []
    members: list[str] = []
    missing: list[bool] = []
    for v in views:
        segs = v.segments
        missing.append(segs is None)
        for s in segs or ():
            firsts.append(s.first_entry_id)
            lasts.append(s.last_entry_id)
            members.extend(s.ensemble)
            ens_offsets.append(len(members))
        seg_offsets.append(len(firsts))
    struct_type: pa.StructType = type_.value_type
    ensemble_type = struct_type.field("ensemble").type
    ensembles = pa.ListArray.from_arrays(
        pa.array(ens_offsets, pa.int32()), pa.array(members, pa.string()), type=ensemble_type
    )
    structs = pa.StructArray.from_arrays(
        [pa.array(firsts, pa.int64()), pa.array(lasts, pa.int64()), ensembles],
        fields=list(struct_type),
    )
    return pa.ListArray.from_arrays(
        pa.array(seg_offsets, pa.int32()),
        structs,
        type=type_,
        mask=pa.array(missing, pa.bool_()) if any(missing) else None,
    )


def ledgers_table(run_id: str, views: Sequence[LedgerView]) -> pa.Table:
    """One run's ``ledgers`` rows in the table's schema, ``run_date`` left null for
    :func:`jobs.tables.delta.append_arrow` to fill."""
    schema = TABLE_SCHEMAS[LEDGERS]
    columns: list[pa.Array] = []
    for field in schema:
        if field.name == "run_id":
            columns.append(pa.array([run_id] * len(views), field.type))
        elif field.name == RUN_DATE:
            columns.append(pa.nulls(len(views), field.type))
        elif field.name == "segments":
            columns.append(_segments(views, field.type))
        elif field.name in _SCALARS:
            columns.append(pa.array(list(map(attrgetter(field.name), views)), field.type))
        else:  # a column added to the schema must be added here too
            raise KeyError(f"ledgers column {field.name!r} has no source in LedgerView")
    return pa.Table.from_arrays(columns, schema=schema)
