"""``bkaudit watch``: a long-running service that reacts to lost bookies (and audits on a
schedule) with the same engine as the one-shot commands, and ``bkaudit status``.

- :mod:`jobs.watch.decide`: pure decisions (lost-bookie delay, schedule, metric summaries);
- :mod:`jobs.watch.election`: leader election on a znode of our own;
- :mod:`jobs.watch.watcher`: the cluster state the service reads and watches;
- :mod:`jobs.watch.metrics`: Prometheus metrics, ``/healthz`` and ``/readyz``;
- :mod:`jobs.watch.loop`: the service itself;
- :mod:`jobs.commands.watch`: ``bkaudit watch`` and ``bkaudit status``.

See docs/watch.md.
"""
