"""``bkaudit watch``: a long-running service that reacts to lost bookies (and audits on a
schedule) with the same engine as the one-shot commands, and ``bkaudit status``.

- :mod:`jobs.watch.decide`: pure decisions (lost-bookie delay, schedule, metric summaries);
- :mod:`jobs.watch.election`: leader election on a znode of our own;
- :mod:`jobs.watch.watcher`: the cluster state the service reads and watches;
- :mod:`jobs.watch.metrics`: Prometheus metrics;
- :mod:`jobs.watch.http_server`: ``/metrics``, ``/healthz`` and ``/readyz``;
- :mod:`jobs.watch.config`: the service's configuration, and its audits' and repairs';
- :mod:`jobs.watch.warehouse`: the Delta tables through the spool (:mod:`jobs.watch.spool`);
- :mod:`jobs.watch.cycle`: one cycle of the main loop, the leader's decisions;
- :mod:`jobs.watch.audits`: the leader's audits, and whether each completed;
- :mod:`jobs.watch.repair`: the leader's marks and repairs;
- :mod:`jobs.watch.loop`: the service itself, which wires them together;
- :mod:`jobs.commands.watch`: ``bkaudit watch`` and ``bkaudit status``.

See docs/watch.md.
"""
