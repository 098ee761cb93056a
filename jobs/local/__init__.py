"""The local executor: the engine in this process (threads and forked workers), tables through
delta-rs; no JVM."""
