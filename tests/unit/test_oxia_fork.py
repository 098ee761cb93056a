"""A process that reads Oxia forks safely: gRPC's fork handlers stay off once bklib loads the
Oxia client, so a child forked while the client's calls are in flight (the Spark driver's JVM,
which pyspark launches with a ``preexec_fn``) is a plain fork and reaches its exec."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import oxia  # noqa: F401 - the client under test: missing, this test fails, never skips

CHILD = textwrap.dedent(
    """
    import subprocess, sys, threading, time
    from bklib.meta.stores.oxia import _import_oxia
    _import_oxia()
    import grpc
    channel = grpc.insecure_channel("127.0.0.1:1")  # nothing listens: calls wait for it

    def call() -> None:
        try:
            channel.unary_unary("/x.Y/Z")(b"", timeout=4, wait_for_ready=True)
        except grpc.RpcError:
            pass

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # the calls are inside gRPC now
    failed = sum(
        subprocess.run(["true"], preexec_fn=lambda: None).returncode != 0 for _ in range(30)
    )
    print("children failed:", failed, file=sys.stderr)
    """
)


def test_a_fork_while_oxia_calls_are_in_flight_runs_no_grpc_fork_handler() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "children failed: 0" in proc.stderr, proc.stderr[-3000:]
    # With the core's handlers on, every such fork logs that it skipped them (and some
    # children die before their exec): the message is the deterministic sign.
    assert "fork() handlers" not in proc.stderr, proc.stderr[-3000:]
    assert "Bad file descriptor" not in proc.stderr, proc.stderr[-3000:]
