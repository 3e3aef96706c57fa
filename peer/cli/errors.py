"""The error a command line shows a person as one line."""

from __future__ import annotations

__all__ = ["CliError"]


class CliError(Exception):
    """A one-line error for a person."""
