#!/usr/bin/env bash
# Build, once, the virtualenv of the replay tools the tests run (pywb, the wacz validator; pinned in
# .ci/replay-tools.txt), apart from the project's: they pin their own versions of shared libraries. Cached
# under $REPLAY_TOOLS_CACHE (default ~/.cache/peercrawl; not a PEERCRAWL_ name: peerd takes every one of those
# for a setting), named by the hash of the pinned list, so a new pin
# builds a new one. Prints the virtualenv's bin directory.
set -euo pipefail
cd "$(dirname "$0")/.."
req=.ci/replay-tools.txt
key=$(sha256sum "$req" | cut -c1-16)
root="${REPLAY_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/peercrawl}"
venv="$root/replay-$key"
if [ ! -f "$venv/.complete" ]; then
    # a build cut short leaves no .complete: start over
    rm -rf "$venv"
    mkdir -p "$root"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req" >&2
    touch "$venv/.complete"
fi
echo "$venv/bin"
