"""The bkaudit images for the tests: built by ``scripts/build_images.sh`` (what ``make image``
runs), run with podman under the project's settings (``scripts/podman/env.sh``), and a network
namespace that has nothing but loopback for them to run in."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]
VERSION: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGES = ("bkaudit", "bkaudit-spark")
ARCHIVES = REPO / "dist" / "images"
ARCHIVED = ("bkaudit",)
"""The images the tests have ``scripts/build_images.sh`` save as archives: the save is one
loop for every image, and the Spark image's would cost 40 CPU-seconds per commit."""

_CLONE_NEWNET = 0x40000000


class ImagesUnavailable(RuntimeError):
    """podman or the image build is not available here; says why."""


def image(name: str) -> str:
    """The local reference of one of :data:`IMAGES` at this checkout's version."""
    return f"localhost/{name}:{VERSION}"


def podman(
    *args: str, timeout: float = 600.0, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``podman ARGS`` with the project's podman settings; output captured as text."""
    cmd = ["bash", "-c", 'source scripts/podman/env.sh && exec podman "$@"', "podman", *args]
    out = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and out.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {out.returncode}\n{out.stderr}")
    return out


def build_images() -> None:
    """Bring both images up to date with this checkout (layers cached: seconds when warm)."""
    if shutil.which("podman") is None and shutil.which("apt-get") is None:
        raise ImagesUnavailable("podman is not installed and apt-get is not here to install it")
    out = subprocess.run(
        [str(REPO / "scripts" / "build_images.sh")], cwd=REPO, capture_output=True, text=True,
        timeout=1800, check=False, env={**os.environ, "BKAUDIT_IMAGE_ARCHIVES": " ".join(ARCHIVED)},
    )  # fmt: skip
    if out.returncode != 0:
        raise ImagesUnavailable(f"scripts/build_images.sh failed:\n{out.stderr[-4000:]}")


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def loopback_only_network() -> Iterator[str]:
    """Move this thread into a new network namespace whose only interface is loopback (up),
    and yield its name. Threads and processes started meanwhile, containers run with
    ``--network=host`` included, live there: they can reach each other on 127.0.0.1 and
    nothing else. The thread moves back on exit and the namespace is deleted."""
    name = f"bkaudit-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        there = os.open(f"/run/netns/{name}", os.O_RDONLY)
        try:
            _setns(there)
            try:
                yield name
            finally:
                _setns(home)
        finally:
            os.close(there)
            os.close(home)
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False, capture_output=True)
