"""Building frozen dataclasses a million times: a scan's hot path.

A frozen dataclass's generated ``__init__`` stores each field through ``object.__setattr__``
(its own ``__setattr__`` refuses), one call per field. A scan made nine such records per
ledger, and building them cost more CPU than parsing the znode (docs/benchmarks.md, "The
scan's records"). :func:`frozen_record` makes the same instance in one store of its
``__dict__``, for callers whose values are already in the normal form ``__init__`` and
``__post_init__`` would give them.

It suits records that live briefly (a read, its stat, a decoded ledger on its way to a view):
the dict it stores is not shared with the class's other instances, so it costs more memory
than ``__init__``'s. Records a run keeps by the million (the audit's views) are slotted
instead.
"""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["frozen_record"]

T = TypeVar("T")

_new = object.__new__
_set = object.__setattr__


def frozen_record(cls: type[T], values: dict[str, Any]) -> T:
    """An instance of the frozen dataclass ``cls`` holding ``values``, without ``__init__``.

    ``values`` must name every field of ``cls`` (``tests/unit/test_records.py`` checks each
    caller against the class), each already in its normal form: nothing is converted or
    checked here. Equality, hashing, ``repr`` and pickling see what ``__init__`` would have
    stored. ``values`` becomes the instance's ``__dict__``: the caller must not keep it.
    """
    obj = _new(cls)
    _set(obj, "__dict__", values)
    return obj
