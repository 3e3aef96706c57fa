"""The control API's client: how `peerctl` finds a node and asks it something."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import httpx

from peer.cli.errors import CliError

__all__ = ["control_address", "control_request"]


def control_address(args: argparse.Namespace) -> str:
    if getattr(args, "control", None):
        return args.control
    data_dir = getattr(args, "data_dir", None)
    if data_dir:
        path = Path(data_dir) / "control.addr"
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise CliError(f"no running node found in {data_dir} ({path}: {exc.strerror})") from exc
    return os.environ.get("PEERCRAWL_CONTROL", "127.0.0.1:7410")


def control_request(address: str, method: str, path: str, timeout: float = 10.0, body: Any = None) -> Any:
    url = f"http://{address}{path}"
    try:
        resp = httpx.request(method, url, timeout=timeout, json=body)
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach node at {address}: {exc}") from exc
    if resp.status_code >= 400:
        try:
            reason = resp.json()["error"]
        except Exception:  # noqa: BLE001 - any non-JSON answer is shown as text
            reason = resp.text.strip()[:200]
        raise CliError(f"node at {address} answered {resp.status_code}: {reason}")
    if resp.headers.get("content-type", "").startswith("application/json"):
        return resp.json()
    return resp.text
