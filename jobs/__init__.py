"""bkaudit's commands and executors around the engine in :mod:`bklib`.

* ``cli/``: the ``bkaudit`` command line: the command registry, the config file;
* ``commands/``: one module per command, its flags and its run function;
* ``options/``: flag groups several commands share (ZooKeeper, TLS, placement, Pulsar, units);
* ``runtime/``: messages, logging, progress, pandas-free processes;
* ``runs/``: what both executors share: executor choice, audit and repair runs, placement pass;
* ``local/``: the engine in this process, tables through delta-rs;
* ``spark/``: the engine in Spark tasks, tables through delta-spark;
* ``tables/``: the Delta tables' schemas and the delta-rs reader and writer;
* ``reports/``: what the reports show (no JVM);
* ``watch/``: the continuous service's loop, election, spool and metrics;
* ``audit.py``, ``rereplicate.py``: the ``spark-submit`` entry points.
"""
