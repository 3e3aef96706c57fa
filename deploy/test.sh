#!/usr/bin/env bash
# Set up a virtualenv with the development extras and run the whole test suite on every core (pytest-xdist,
# `-n auto`; add `-n 0` to run in one process). Tests of an xdist group (the clusters of real daemons) run one
# after the other on one worker, so two clusters never share the cores; the rest is spread over the workers.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
# TYPECHECK=1 (.ci/run sets it): the type checker first, in the same virtualenv; an error stops the run.
if [ "${TYPECHECK:-}" = 1 ]; then
    bash deploy/typecheck.sh
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n auto --dist loadgroup "$@"
