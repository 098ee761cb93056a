"""Scaffolding for tests, benchmarks and the demo: a real ZooKeeper server process, a sandbox
cluster of Python bookies, a ledger workload, and data-dir fault helpers. The engine never
imports this package."""
