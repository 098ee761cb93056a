"""JVM options for the suite's short-lived Spark JVMs (drivers, executors, standalone daemons).

They run many small jobs on a 2-core machine: C2's compilations and G1's threads cost more CPU
than they save there (docs/benchmarks.md, "The suite's CPU"). Java bookies and Pulsar get the
same quick-start options in their own harnesses; production JVMs keep the defaults.
tests/conftest.py hands them to every Spark driver through ``SPARK_SUBMIT_OPTS``; the standalone
cluster's daemons and executors take them too (tests/deploy/standalone.py).
"""

TEST_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
