"""Benchmark: what the test suite's real Pulsar broker costs on this machine.

ZooKeeper, ``PulsarClusterMetadataSetup``, three Java bookies on Pulsar's metadata driver and
one ``PulsarBrokerStarter`` (tests/pulsar/harness.py); then 50 unbatched messages to each of
two topics with PyPI's pulsar-client, read back. Prints the wall time of each step, the
broker's resident memory and CPU-seconds, and checks every message came back.

    .venv/bin/python bench/pulsar_broker.py [--driver pulsar|zk] [--messages 50]

Needs Pulsar's jars (``scripts/install_pulsar.sh``, run here if missing).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

import pulsar  # noqa: E402

from bklib.testing.zkserver import ZooKeeperServer  # noqa: E402
from tests.pulsar import harness  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--driver", choices=["pulsar", "zk"], default="pulsar")
    ap.add_argument("--messages", type=int, default=50)
    args = ap.parse_args()
    classpath = harness.install()
    topics = [f"persistent://public/default/bench-{i}" for i in range(2)]
    t_all = time.monotonic()
    with (
        tempfile.TemporaryDirectory() as tmp,
        ZooKeeperServer(Path(tmp) / "zk") as zks,
        zks.private_chroot("pulsar") as connect,
        harness.pulsar_cluster(classpath, connect, Path(tmp), driver=args.driver) as cluster,
    ):
        broker = cluster.broker
        assert broker is not None
        report: dict[str, object] = {
            "timings_s": {k: round(v, 1) for k, v in cluster.timings.items()},
            "broker_rss_mb_after_start": round(broker.rss_bytes() / 2**20, 1),
            "broker_cpu_s_to_start": round(broker.cpu_seconds(), 1),
        }
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
        try:
            t0 = time.monotonic()
            consumers = {
                t: client.subscribe(t, "b", initial_position=pulsar.InitialPosition.Earliest)
                for t in topics
            }
            for t in topics:
                producer = client.create_producer(t, batching_enabled=False)
                for i in range(args.messages):
                    producer.send(f"{t}#{i}".encode())
                producer.close()
            t1 = time.monotonic()
            for t, consumer in consumers.items():
                got = {consumer.receive(timeout_millis=30000).data() for _ in range(args.messages)}
                assert got == {f"{t}#{i}".encode() for i in range(args.messages)}, t
            t2 = time.monotonic()
        finally:
            client.close()
        report["produce_s"] = round(t1 - t0, 2)
        report["consume_s"] = round(t2 - t1, 2)
        report["broker_rss_mb_end"] = round(broker.rss_bytes() / 2**20, 1)
        report["broker_cpu_s_end"] = round(broker.cpu_seconds(), 1)
    report["total_s"] = round(time.monotonic() - t_all, 1)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
