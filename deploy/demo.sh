#!/usr/bin/env bash
# Set up a virtualenv and run the demo: a local web and DNS server, a 4-node peercrawl cluster crawling it (C leaves
# and E joins midway), then the tables, the verdict, the WARC files and the plots, all in ./demo-data/.
# Arguments go to `peerctl demo` (e.g. --single for the one-node demo, --dir DIR for another run folder).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=deploy/venv.sh
source deploy/venv.sh
venv_install lab
exec .venv/bin/peerctl demo "$@"
