"""The configuration of ``bkaudit watch`` (:class:`WatchConfig`, built by
:mod:`jobs.commands.watch` from the flags), and what it gives the one-shot engines the watch
runs: each audit's :class:`~jobs.runs.audit_run.AuditConfig` and each repair's
:class:`~jobs.runs.repair_run.RepairConfig`."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from bklib.audit.index_keeper import DEFAULT_BARRIER_TIMEOUT
from bklib.client.pool import DEFAULT_BOOKIE_PROTOCOL, WireProtocol
from bklib.meta.model import DigestType
from bklib.meta.stores.zookeeper.security import ZkAuth
from bklib.pulsar.admin import AdminSettings
from bklib.repair.worker import RepairSettings
from bklib.states import DEFAULT_LEDGERS_ROOT, RepairMode
from bklib.tls import TlsSettings
from jobs.runs.audit_run import DEFAULT_READ_RATE, AuditConfig
from jobs.runs.repair_run import RepairConfig
from jobs.watch.first_ledgers import FIRST_LEDGERS
from jobs.watch.spool import DEFAULT_SPOOL_MAX_BYTES

__all__ = ["WatchConfig", "audit_config", "repair_config"]


@dataclass
class WatchConfig:
    """Everything the service needs (built by :mod:`jobs.commands.watch` from the flags)."""

    zk: str
    warehouse: str
    ledgers_root: str = DEFAULT_LEDGERS_ROOT
    zk_auth: ZkAuth = None
    zk_session_timeout: float = 10.0
    delay_override: float | None = None
    """``--lost-bookie-recovery-delay``; None: the znode, else BookKeeper's default 0."""
    every: Mapping[str, float] = field(default_factory=dict)
    grace_period: float = 30.0
    rate: float | None = 50e6
    window: int = 64
    ledgers_in_flight: int = 8
    first_ledgers: int = FIRST_LEDGERS
    """``--first-ledgers``: a new loss's closed ledgers repaired while its audit reads
    (:mod:`jobs.watch.first_ledgers`; 0: none)."""
    repair_processes: int = 0
    """``--repair-processes``: processes a repair runs in, the watch's own included (0: one
    per core for a large repair, :func:`jobs.watch.repair_workers.repair_processes`)."""
    bookie_protocol: WireProtocol = DEFAULT_BOOKIE_PROTOCOL
    """``--bookie-protocol``: the scheduled audits' entry reads and the repairs' copies."""
    read_timeout: float = 10.0
    connect_timeout: float = 5.0
    verify_percentage: float = 0.0
    read_rate: float | None = DEFAULT_READ_RATE
    """Bytes/s the scheduled audits read from one bookie (None: unlimited)."""
    password: bytes | None = None
    digest_type: DigestType | None = None
    retry_interval: float = 5.0
    index_barrier_timeout: float = DEFAULT_BARRIER_TIMEOUT
    """``--index-barrier-timeout``: past it the bookie index is stale (docs/watch.md)."""
    poll_interval: float = 2.0
    max_failed_cycles: int = 5
    """``/healthz`` fails after this many leader cycles in a row raised (0: never)."""
    stop_timeout: float = 30.0
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = None
    instance_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    tls: TlsSettings | None = None
    """Bookie TLS (``--tls-*`` flags) of the audits' and repairs' bookie connections."""
    spool_dir: str | None = None
    """``--spool-dir``: rows the warehouse did not take wait here; None: the default
    (:func:`jobs.watch.spool.default_spool_dir`)."""
    spool_max_bytes: int = DEFAULT_SPOOL_MAX_BYTES
    """``--spool-max-bytes``: above it the service stops (exit 2) rather than grow."""
    pulsar_admin: AdminSettings | None = None
    """``--pulsar-admin-url`` and its credentials: after a repair the topics whose ledgers
    changed are unloaded (docs/pulsar.md); None: they are recorded and named in the log."""
    unload_rate: float = 2.0
    """``--unload-rate``: topic unloads per second at most."""


def audit_config(cfg: WatchConfig, check: str) -> AuditConfig:
    """The configuration of one of the watch's audits of ``check``."""
    config = AuditConfig(
        zk=cfg.zk,
        warehouse=cfg.warehouse,
        check=check,
        ledgers_root=cfg.ledgers_root,
        zk_auth=cfg.zk_auth,
        tls=cfg.tls,
    )
    config.fetch = dataclasses.replace(
        config.fetch,
        read_timeout=cfg.read_timeout,
        connect_timeout=cfg.connect_timeout,
        verify_percentage=cfg.verify_percentage,
        read_rate=cfg.read_rate,
        bookie_protocol=cfg.bookie_protocol,
    )
    return config


def repair_config(cfg: WatchConfig, audit_run_id: str | None, processes: int = 1) -> RepairConfig:
    """The configuration of the watch's repair of the findings of ``audit_run_id``: each
    process's share repaired there (``local_processes`` 1; the watch splits the shares
    itself, :mod:`jobs.watch.repair_workers`), so a stop or a lost leadership waits only for
    the ledgers in flight. ``--rate`` bounds the whole repair: each of ``processes`` copies
    at its share."""
    return RepairConfig(
        zk=cfg.zk,
        warehouse=cfg.warehouse,
        mode=RepairMode.REREPLICATE,
        audit_run_id=audit_run_id,
        ledgers_root=cfg.ledgers_root,
        zk_auth=cfg.zk_auth,
        zk_session_timeout=cfg.zk_session_timeout,
        settings=RepairSettings(
            grace_period=cfg.grace_period,
            rate=cfg.rate / processes if cfg.rate else cfg.rate,
            window=cfg.window,
            bookie_protocol=cfg.bookie_protocol,
            password=cfg.password,
            digest_type=cfg.digest_type,
            marked_before=True,  # the watch marks its findings first (WatchRepair.mark)
        ),
        ledgers_in_flight=cfg.ledgers_in_flight,
        local_processes=1,
        read_timeout=cfg.read_timeout,
        tls=cfg.tls,
    )
