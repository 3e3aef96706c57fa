#!/usr/bin/env bash
# Set up a virtualenv with the development extras and run the whole test suite over pytest-xdist workers, four
# more than the machine has cores (most slow tests wait on daemons, servers and crawl delays more than they compute;
# PYTEST_WORKERS=N sets the count, `-n 0` runs in one process). The files that start clusters of real
# daemons run in two lanes, each lane's files one after the other on one worker (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=deploy/venv.sh
source deploy/venv.sh
venv_install dev
# the installed packages' bytecode, compiled on every core
.venv/bin/python -m compileall -q -j 0 .venv/lib >/dev/null 2>&1 || true
workers=${PYTEST_WORKERS:-$(( $(nproc) + 4 ))}
# TYPECHECK=1 (.ci/run sets it): the type checker runs beside the bytecode pass and the tests, in the same
# virtualenv; an error in either fails the run.
typecheck=""
if [ "${TYPECHECK:-}" = 1 ]; then
    typecheck_log=$(mktemp)
    trap 'rm -f "$typecheck_log"' EXIT
    bash deploy/typecheck.sh >"$typecheck_log" 2>&1 &
    typecheck=$!
fi
# Every worker imports every test module, and the tests start daemons that import the product: a collection
# pass first writes the bytecode (pytest's assertion-rewritten test modules included) into the git-ignored
# __pycache__ folders, even where PYTHONDONTWRITEBYTECODE is set, so that the workers and the daemons read it
# instead of each compiling the same files again (from a fresh clone, 8 s of CPU per worker and 0.5 s per daemon).
# The whole suite's pass runs in two halves at once; a run of named test files collects just those.
collect() {
    env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m pytest -q -p no:cacheprovider --collect-only -n 0 "$@" \
        >/dev/null 2>&1 || true
}
named=0
for arg in "$@"; do
    if [ -e "${arg%%::*}" ]; then
        named=1
    fi
done
if [ "$named" = 1 ]; then
    collect "$@"
else
    files=(tests/test_*.py)
    half=$(( ${#files[@]} / 2 ))
    collect "${files[@]:0:half}" &
    first=$!
    collect "${files[@]:half}"
    wait "$first" || true
fi
if [ -z "$typecheck" ]; then
    exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "$workers" --dist loadgroup "$@"
fi
status=0
.venv/bin/python -m pytest -q -p no:cacheprovider -n "$workers" --dist loadgroup "$@" || status=$?
echo "type checker:"
if ! wait "$typecheck"; then
    status=1
fi
cat "$typecheck_log"
exit "$status"
