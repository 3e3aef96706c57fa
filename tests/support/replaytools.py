"""The replay tools some tests run: pywb's `wayback` and `wb-manager`, and the `wacz` validator. They live in a
virtualenv of their own (`.ci/replay-tools.sh` builds it once and caches it; `.ci/run` does so and names the
tools in `PYWB_WAYBACK` and `WACZ_VALIDATOR`). `replay_tool` finds one: named by its variable, else in the
cached virtualenv, else on the PATH; None when there is none."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

__all__ = ["replay_tool", "tools_venv"]

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / ".ci" / "replay-tools.txt"
_VARIABLES = {"wayback": "PYWB_WAYBACK", "wacz": "WACZ_VALIDATOR"}


def tools_venv() -> Path:
    """Where `.ci/replay-tools.sh` builds the virtualenv (the same name the script computes)."""
    key = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]
    cache = os.environ.get("REPLAY_TOOLS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "peercrawl")
    return Path(cache) / f"replay-{key}"


def replay_tool(name: str) -> Path | None:
    """`wayback`, `wb-manager` (beside `wayback`) or `wacz`."""
    variable = _VARIABLES.get("wayback" if name == "wb-manager" else name)
    named = os.environ.get(variable) if variable else None
    if named:
        path = Path(named)
        return path if name != "wb-manager" else path.parent / "wb-manager"
    venv = tools_venv()
    if (venv / ".complete").exists() and (venv / "bin" / name).exists():
        return venv / "bin" / name
    found = shutil.which(name)
    return Path(found) if found else None
