"""Decoding a bookie's v3 reply frames, and :class:`BadFrame`, the error of a frame that is not
a usable reply (it closes the connection). Every connection's START_TLS reply is v3, whatever
the protocol after it."""

from __future__ import annotations

from bklib.proto import protocol_pb2 as pb

__all__ = ["BadFrame", "parse_response"]


class BadFrame(Exception):
    """A reply frame that is not a usable response (v3 here, v2 in
    :mod:`bklib.client.connection_v2`). Raised by
    :meth:`~bklib.client.transport.PipelinedConnection._on_frame`, it closes the connection:
    outstanding requests fail with :class:`~bklib.client.transport.BadResponseError`."""


def parse_response(frame: bytes) -> pb.Response:
    """Decode one v3 ``Response`` frame (without its length prefix); BadFrame if it is not one."""
    try:
        resp: pb.Response = pb.Response.FromString(frame)
    except Exception as exc:  # DecodeError; any parse failure is equally fatal
        raise BadFrame(f"undecodable response frame of {len(frame)} bytes: {exc}") from exc
    # upb does not enforce proto2 required fields (Java does, and drops the connection); an
    # unknown StatusCode also lands here, as a missing status.
    if not resp.IsInitialized():
        missing = ", ".join(resp.FindInitializationErrors())
        raise BadFrame(f"response missing required fields: {missing}")
    return resp
