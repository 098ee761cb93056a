"""A BookKeeper 4.17-compatible bookie in Python (tests, sandbox, fault injection).

Modules: ``journal`` (append-only log, group commit), ``storage`` (ledger state and entry
index, offline test helpers), ``server`` / ``v2`` (wire protocol), ``registration``
(ZooKeeper cookie and registration), ``faults`` (fault injection, admin port) and ``main``
(:class:`~bklib.bookie.main.Bookie`, :func:`~bklib.bookie.main.run_bookie`, the CLI).
"""
