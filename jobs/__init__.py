"""bkaudit's commands and executors around the engine in :mod:`bklib`.

* ``audit.py``, ``rereplicate.py``: the commands, also ``spark-submit`` entry points;
* ``executor.py``: ``--executor spark|local|auto``;
* ``local/``: the engine in this process, tables through delta-rs;
* ``spark/``: the engine in Spark tasks, tables through delta-spark;
* ``tables/``: the Delta tables' schemas and the delta-rs reader and writer;
* ``reports/``: ``listunderreplicated`` and the HTML report (no JVM);
* ``cli/``: the ``bkaudit`` command line, its config file and the demo.
"""
