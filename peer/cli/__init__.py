"""The command lines: `peerd` runs a node, `peerctl` talks to running nodes (through the control API's client)
and runs the lab's experiment and demo when the lab is installed. The only place `trio.run` is called;
errors to a person are one line.
"""

from peer.cli.errors import CliError
from peer.cli.main import peerctl_main, peerd_main

__all__ = ["CliError", "peerctl_main", "peerd_main"]
