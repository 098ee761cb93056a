"""Flag groups that several commands share: where ZooKeeper is and how to reach it, bookie TLS,
the placement rule, Pulsar's admin API, and the units operators type."""
