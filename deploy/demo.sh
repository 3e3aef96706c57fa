#!/usr/bin/env bash
# Set up a virtualenv and run the demo: a local web and DNS server, and peercrawl crawling it.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e .
exec .venv/bin/peerctl demo "$@"
