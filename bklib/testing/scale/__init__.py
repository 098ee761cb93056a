"""The scale harness: a production-size cluster on one machine (docs/scale.md).

``plan`` computes a million Pulsar-like ledgers from a seed, ``seeder`` writes their metadata
to ZooKeeper, and ``farm`` serves a hundred bookie identities whose entries are computed from
the same plan (``storage``).
"""
