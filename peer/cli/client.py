"""The control API's client: how `peerctl` finds a node, and its control token, and asks it something."""

from __future__ import annotations

import argparse
import os
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from peer.cli.errors import CliError
from peer.control import TOKEN_FILE

__all__ = ["control", "control_address", "control_request", "control_token"]


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


def control_token(args: argparse.Namespace) -> str | None:
    """The control token: --token-file, else $PEERCRAWL_CONTROL_TOKEN, else the one in --data-dir."""
    token_file = getattr(args, "token_file", None)
    if token_file:
        try:
            return Path(token_file).read_text().strip()
        except OSError as exc:
            raise CliError(f"cannot read the control token {token_file}: {exc.strerror}") from exc
    if os.environ.get("PEERCRAWL_CONTROL_TOKEN"):
        return os.environ["PEERCRAWL_CONTROL_TOKEN"].strip()
    data_dir = getattr(args, "data_dir", None)
    if data_dir:
        path = Path(data_dir) / TOKEN_FILE
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise CliError(f"cannot read the control token {path}: {exc.strerror} (is the node running, and "
                           "may this user read its data dir?)") from exc
    return None


def control(args: argparse.Namespace) -> tuple[str, Any]:
    """The node's control address and a `control_request` that carries its token."""
    return control_address(args), partial(control_request, token=control_token(args))


def control_request(address: str, method: str, path: str, timeout: float = 10.0, body: Any = None,
                    token: str | None = None) -> Any:
    url = f"http://{address}{path}"
    headers = {"authorization": f"Bearer {token}"} if token else {}
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
            reason = ("the node wants its control token: give --data-dir DIR (the token is read from "
                      f"DIR/{TOKEN_FILE}), --token-file FILE or $PEERCRAWL_CONTROL_TOKEN" if not token else
                      "the node refused the token (it makes a new one at every start: read it again)")
        raise CliError(f"node at {address} answered {resp.status_code}: {reason}")
    if resp.headers.get("content-type", "").startswith("application/json"):
        return resp.json()
    return resp.text
