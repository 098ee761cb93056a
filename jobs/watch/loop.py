"""The ``bkaudit watch`` service: elect, watch the bookies, and on a loss (past
``lostBookieRecoveryDelay``) audit, mark, repair and re-audit in this process; audits on a
schedule besides. Every audit and repair is written to the Delta tables like a one-shot run.

:class:`WatchService` wires the parts together and runs the main loop; each part has a module
of its own:

- :mod:`jobs.watch.config`: the flags (:class:`~jobs.watch.config.WatchConfig`);
- :mod:`jobs.watch.election`: the election and this instance's term
  (:class:`~jobs.watch.election.Leadership`);
- :mod:`jobs.watch.cycle`: one cycle, the leader's decisions
  (:class:`~jobs.watch.cycle.Cycle`); its audits are :mod:`jobs.watch.audits`' and its
  repairs :mod:`jobs.watch.repair`'s;
- :mod:`jobs.watch.warehouse`: the tables through the spool;
- :mod:`jobs.watch.http_server`: ``/metrics``, ``/healthz`` and ``/readyz``.

Stale state: every step that changes the cluster (marks, each batch of repairs) first asks
ZooKeeper whether this instance still leads in its current session. A session loss ends the
term; after reconnecting the instance joins the election again and, if elected, starts from a
fresh reading of the cluster (:meth:`jobs.watch.cycle.Cycle._take_over`).

Unreachable warehouse: rows the tables do not take wait in :mod:`jobs.watch.spool` and are
written later, in order; the repair never waits for the warehouse. Past ``--spool-max-bytes``
the service stops (docs/watch.md, "Unreachable warehouse").
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from datetime import datetime, timezone
from typing import Any

from bklib.audit.engine import require_cluster
from bklib.meta.stores import MetadataStore, open_store
from jobs.runtime import interrupts
from jobs.watch.config import WatchConfig
from jobs.watch.cycle import Cycle
from jobs.watch.election import LeaderElection, Leadership
from jobs.watch.http_server import Health, MetricsServer
from jobs.watch.metrics import WatchMetrics
from jobs.watch.warehouse import WatchWarehouse
from jobs.watch.watcher import ClusterWatcher

__all__ = ["WatchService"]

log = logging.getLogger("jobs.watch")


class WatchService:
    """One ``bkaudit watch`` instance. :meth:`run` blocks until :meth:`stop` (SIGTERM,
    SIGINT)."""

    def __init__(self, config: WatchConfig, metrics: WatchMetrics | None = None) -> None:
        self.cfg = config
        self.metrics = metrics or WatchMetrics()
        self.health = Health(
            stale_after=max(60.0, 10 * config.poll_interval),
            max_failed_cycles=config.max_failed_cycles,
        )
        self.stopping = threading.Event()
        self.server: MetricsServer | None = None
        self.zk: MetadataStore | None = None
        self.watcher: ClusterWatcher | None = None
        self.leadership: Leadership | None = None
        self.cycle: Cycle | None = None
        self.warehouse = WatchWarehouse(
            config,
            self.metrics,
            self.health,
            leading=lambda: self.leadership is not None and self.leadership.leading,
        )

    # ---- lifecycle -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to stop after the step in progress (signal-safe)."""
        self.stopping.set()
        if self.watcher is not None:
            self.watcher.wake.set()

    def identity(self) -> dict[str, Any]:
        """What this instance's election member says about it (``bkaudit status``)."""
        return {
            "id": self.cfg.instance_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "warehouse": self.cfg.warehouse,
            "metrics_port": self.server.port if self.server else None,
            "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }

    def run(self) -> int:
        """Serve until stopped; 0 on a clean stop."""
        cfg = self.cfg
        if cfg.metrics_port is not None:
            self.server = MetricsServer(
                self.metrics, self.health, cfg.metrics_host, cfg.metrics_port, self._info
            ).start()
        # The process's one session: election, watches, every audit and repair hand it down.
        self.zk = open_store(cfg.zk, auth=cfg.zk_auth, timeout=cfg.zk_session_timeout)
        require_cluster(self.zk, cfg.ledgers_root)  # a wrong root fails the start, one line
        self.watcher = ClusterWatcher(self.zk, cfg.ledgers_root)
        election = LeaderElection(self.zk, cfg.ledgers_root, self.identity())
        self.leadership = Leadership(
            election,
            self.watcher,
            self.stopping,
            self.health,
            self.metrics,
            ready_reason=lambda: self.warehouse.ready_reason,
        )
        self.cycle = Cycle(
            cfg, self.metrics, self.health, self.watcher, self.leadership, self.warehouse
        )
        wh = self.warehouse
        wh.refresh()
        if wh.spooled:
            log.warning(
                "watch: spool %s holds %d rows from before; flushing them to %s first",
                wh.spool.dir,
                wh.spool.stats()[1],
                cfg.warehouse,
            )
        # SIGTERM and SIGINT stop the loop after its step (jobs.runtime.interrupts): no ledger
        # starts, those in flight finish within --stop-timeout (past it the process leaves;
        # their locks are ephemeral and go with the session), an audit stops at once and is
        # recorded INTERRUPTED.
        try:
            with interrupts.draining(cfg.stop_timeout, on_stop=self.stop):
                election.join()
                self.leadership.watch_members()
                while not self.stopping.is_set():
                    self.health.heartbeat()
                    wh.flush()
                    wait = self.cycle.run()
                    if self.stopping.is_set():
                        break
                    self.watcher.wake.wait(max(0.05, wait))
                    self.watcher.wake.clear()
        except interrupts.Interrupted as exc:
            if exc.signum != signal.SIGTERM:
                raise  # SIGINT: 130 and one line (jobs.cli.main)
        finally:
            self._shutdown()
        return 0  # SIGTERM is the watch's clean stop

    def _shutdown(self) -> None:
        if self.cycle is not None:
            self.cycle.index.close()
        if self.leadership is not None:
            self.leadership.leave()
        if self.zk is not None:
            if self.watcher is not None:  # our own close is not a session loss
                self.zk.remove_state_listener(self.watcher.on_state)
            self.zk.close()
        if self.server is not None:
            self.server.stop()
        log.info("watch: stopped")

    def _info(self) -> dict[str, Any]:
        return {"role": self.health.role, "instance": self.cfg.instance_id}
