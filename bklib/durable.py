"""Durable file-system steps shared by the bookie's journal and the watch's spool."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "write_atomically"]


def fsync_dir(directory: Path) -> None:
    """Make a file creation, rename or removal in ``directory`` durable (POSIX keeps directory
    entries apart from file data: an fsync of the file alone does not persist its name)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes, tmp: Path | None = None) -> None:
    """Write ``path`` so that a crash leaves either the old file or the whole new one: write
    and fsync a temporary file beside it (``tmp``, default ``path`` + ``.tmp``), rename it
    over ``path``, and fsync the directory."""
    tmp = tmp if tmp is not None else path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
