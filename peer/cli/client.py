"""The control API's client: how `peerctl` finds a node, and its token, and asks it something.

Every request but `/healthz` carries `Authorization: Bearer <token>`. The token is, in order: the file named by
`--token-file`, `PEERCRAWL_CONTROL_TOKEN`, or `control.token` in the node's data dir (`--data-dir`, else
`PEERCRAWL_DATA_DIR`, else `./peercrawl-data`), which the node writes at start with mode 0600.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import httpx

from peer.cli.errors import CliError

__all__ = ["control_address", "control_request", "find_token"]

#: The token to send to each control address, found by `control_address`.
_TOKENS: dict[str, str] = {}


def find_token(args: argparse.Namespace) -> str | None:
    """The control token for the node `args` names, or None when none is to be found."""
    named = getattr(args, "token_file", None)
    if named:
        try:
            return Path(named).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read the control token {named}: {exc}") from exc
    if os.environ.get("PEERCRAWL_CONTROL_TOKEN"):
        return os.environ["PEERCRAWL_CONTROL_TOKEN"].strip()
    data_dir = getattr(args, "data_dir", None) or os.environ.get("PEERCRAWL_DATA_DIR") or "./peercrawl-data"
    try:
        return (Path(data_dir) / "control.token").read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read the control token in {data_dir}: {exc}") from exc


def control_address(args: argparse.Namespace) -> str:
    address = _control_address(args)
    token = find_token(args)
    if token:
        _TOKENS[address] = token
    return address


def _control_address(args: argparse.Namespace) -> str:
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
    headers = {"authorization": f"Bearer {_TOKENS[address]}"} if address in _TOKENS else {}
    if method == "POST" and body is None:
        body = {}  # a POST is always JSON: the node refuses any other type (no form can forge one)
    try:
        resp = httpx.request(method, url, timeout=timeout, json=body, headers=headers)
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach node at {address}: {exc}") from exc
    if resp.status_code >= 400:
        try:
            reason = resp.json()["error"]
        except Exception:  # noqa: BLE001 - any non-JSON answer is shown as text
            reason = resp.text.strip()[:200]
        if resp.status_code == 401:
            reason += " (peerctl sends the token from --token-file, PEERCRAWL_CONTROL_TOKEN or DIR/control.token)"
        raise CliError(f"node at {address} answered {resp.status_code}: {reason}")
    if resp.headers.get("content-type", "").startswith("application/json"):
        return resp.json()
    return resp.text
