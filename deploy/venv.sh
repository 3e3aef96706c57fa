#!/usr/bin/env bash
# Make .venv and install the project into it, editable, with the extras named ("dev", "lab"): sourced by
# deploy/test.sh and deploy/demo.sh. The install goes through uv (a Rust resolver and installer from PyPI: about
# 2 s where pip takes 25-30 s of CPU for the development extras); when uv cannot be had or fails, through pip.
# Nothing is byte-compiled here: the caller's compileall does it on every core.
venv_install() {
    local spec=".[$1]"
    python3 -m venv .venv
    if .venv/bin/python -m pip install -q --disable-pip-version-check uv >/dev/null 2>&1 \
        && .venv/bin/uv pip install -q --python .venv/bin/python -e "$spec"; then
        return 0
    fi
    echo "deploy: installing with pip (uv was not available)" >&2
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-compile -e "$spec"
}
