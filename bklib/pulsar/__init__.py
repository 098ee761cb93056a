"""Apache Pulsar's side of a BookKeeper cluster: topic names, the broker's admin API, and the
metadata Pulsar keeps about its ledgers (managed ledgers, cursors, schemas)."""
