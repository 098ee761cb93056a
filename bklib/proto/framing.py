"""BookKeeper's TCP framing: ``[int32 N big-endian][N bytes]`` in both directions.

The same framing carries v3 (protobuf) and v2 (binary) messages; N excludes the 4 length
bytes. Like Netty's ``LengthFieldBasedFrameDecoder`` in the Java bookie, a frame whose total size
(N + 4) exceeds the maximum is refused.
"""

from __future__ import annotations

import struct

from bklib.errors import BKError

# nettyMaxFrameSizeBytes default in BookKeeper.
MAX_FRAME_SIZE = 5 * 1024 * 1024

_LEN = struct.Struct(">i")

# A v2 frame starts with its header int whose top byte is the protocol version (0..2); no
# protobuf message can start below 0x08 because a tag needs a field number >= 1.
_V2_FIRST_BYTE_LIMIT = 0x08


class FramingError(BKError):
    """The peer sent something that is not a valid frame; the connection must be closed."""


class FrameTooLarge(FramingError):
    """A length prefix announced a frame larger than the allowed maximum (or negative)."""


def encode_frame(message: bytes) -> bytes:
    """The framed bytes for one message: 4-byte big-endian length, then the message."""
    return _LEN.pack(len(message)) + message


def check_length(length: int, max_frame: int = MAX_FRAME_SIZE) -> None:
    """Raise FrameTooLarge if a frame with body ``length`` may not be accepted.

    Netty compares N + 4 against the maximum, so we do too; a negative N is equally fatal.
    """
    if length < 0 or length + 4 > max_frame:
        raise FrameTooLarge(f"frame length {length} outside 0..{max_frame - 4}")


def is_v2_frame(frame: bytes) -> bool:
    """True if the frame is a v2 ("PreV3") binary message rather than a v3 protobuf.

    An empty frame counts as v2: it cannot be a valid v3 Request (header is required), and the v2
    decoder rejects it as truncated.
    """
    return not frame or frame[0] < _V2_FIRST_BYTE_LIMIT


def split_frames(buf: bytearray, max_frame: int = MAX_FRAME_SIZE) -> list[bytes]:
    """Remove every complete frame from the front of ``buf`` and return their messages.

    For callers that read from a socket in large chunks (cheaper per message than one
    ``readexactly`` pair per frame). Incomplete trailing bytes stay in ``buf``. Raises
    FrameTooLarge on a refused length prefix.
    """
    out: list[bytes] = []
    pos = 0
    end = len(buf)
    unpack_from = _LEN.unpack_from
    while end - pos >= 4:
        (length,) = unpack_from(buf, pos)
        check_length(length, max_frame)
        if end - pos - 4 < length:
            break
        out.append(bytes(buf[pos + 4 : pos + 4 + length]))
        pos += 4 + length
    if pos:
        del buf[:pos]
    return out
