"""Framed messages over asyncio streams, for test clients that talk to a bookie byte by byte
(the bookie and the client frame through their protocols, :mod:`bklib.proto.framing`)."""

from __future__ import annotations

import asyncio
import struct

from bklib.proto.framing import MAX_FRAME_SIZE, check_length, encode_frame

__all__ = ["read_frame", "write_frame"]

_LEN = struct.Struct(">i")


async def read_frame(reader: asyncio.StreamReader, max_frame: int = MAX_FRAME_SIZE) -> bytes:
    """Read one frame's message bytes.

    Raises ``asyncio.IncompleteReadError`` on EOF (``partial`` empty means a clean close between
    frames) and FrameTooLarge for a refused length prefix, before reading the body, so a huge
    prefix never makes us buffer gigabytes.
    """
    head = await reader.readexactly(4)
    (length,) = _LEN.unpack(head)
    check_length(length, max_frame)
    if length == 0:
        return b""
    return await reader.readexactly(length)


def write_frame(writer: asyncio.StreamWriter, message: bytes) -> None:
    """Queue one framed message on ``writer`` (call ``await writer.drain()`` for back-pressure)."""
    writer.write(encode_frame(message))
