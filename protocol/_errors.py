"""Errors that say whose fault it is.

`LocalProtocolError` means this side misused the protocol (sent a message in the wrong state, or one that breaks
a limit); `RemoteProtocolError` means the peer sent something we cannot accept. Lower-layer errors (msgpack,
json, zlib, unicode) are translated into these at the boundary, so a caller needs to catch only these two.
"""

from __future__ import annotations

__all__ = ["LocalProtocolError", "ProtocolError", "RemoteProtocolError"]


class ProtocolError(Exception):
    """Base of the protocol's errors; never raised itself."""


class LocalProtocolError(ProtocolError):
    """This side tried to do something the protocol forbids; the connection is unchanged."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol; the connection is unusable and should be closed."""
