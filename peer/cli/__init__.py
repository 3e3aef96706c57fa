"""The command lines: `peerd` runs a node, `peerctl` talks to running nodes (through the control API's client)
and runs the lab's experiment and demo when the lab is installed. The only place `trio.run` is called;
errors to a person are one line.

`peerd_main` and `peerctl_main` are loaded on first use, so a module of the client (`peer.cli.client`, the
formatters) does not import the node.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from peer.cli.errors import CliError

if TYPE_CHECKING:
    from peer.cli.main import peerctl_main, peerd_main

__all__ = ["CliError", "peerctl_main", "peerd_main"]


def __getattr__(name: str) -> Any:
    if name in ("peerctl_main", "peerd_main"):
        return getattr(importlib.import_module("peer.cli.main"), name)
    raise AttributeError(f"module 'peer.cli' has no attribute {name!r}")
