"""The audit engine, with no Spark: BookKeeper's LedgerChecker done right.

* :mod:`bklib.audit.model`: a ledger as the checker sees it, what a bookie answered, findings;
* :mod:`bklib.audit.classify`: the pure verdict (stripes, gaps, fewest replicas, severity);
* :mod:`bklib.audit.checker`: asking the bookies (list-entries, probe reads, digests, LACs);
* :mod:`bklib.audit.engine`: one run over a set of ledgers, for either executor.
"""
