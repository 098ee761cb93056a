"""A real Apache Pulsar 4.0 broker (Maven Central's jars) over real bookies, for the tests."""
