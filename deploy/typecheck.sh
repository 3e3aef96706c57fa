#!/usr/bin/env bash
# The type checker: mypy as pyproject.toml's [tool.mypy] sets it (strict on ring/, protocol/, storage/ and the
# modules of peer/'s seams; mypy's default level elsewhere). Exits non-zero on any error. It runs in .venv,
# which `bash deploy/test.sh` makes; arguments are passed to mypy.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    echo "deploy/typecheck.sh: no .venv here; bash deploy/test.sh makes it" >&2
    exit 2
fi
exec .venv/bin/python -m mypy "$@"
