"""The lab (peerlab) is an extra: the crawler installs without plotting or WARC-reading libraries, and the two lab
commands say how to install it when it is missing."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # pip installs and fresh interpreters

ROOT = Path(__file__).resolve().parent.parent


def test_the_crawler_itself_depends_on_no_lab_library() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {dep.split(">")[0].split("=")[0].split("[")[0].strip().lower() for dep in project["dependencies"]}
    assert names.isdisjoint({"matplotlib", "warcio"})
    lab = {dep.split(">")[0].strip().lower() for dep in project["optional-dependencies"]["lab"]}
    assert {"matplotlib", "warcio"} <= lab


def run_without_lab(*argv: str) -> subprocess.CompletedProcess[str]:
    """peerctl in a process where importing the lab fails, as it does where the extra is not installed."""
    code = ("import sys; sys.modules['peerlab'] = None; from peer.cli.main import peerctl_main; "
            "sys.exit(peerctl_main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, check=False)


def test_lab_commands_say_how_to_install_the_lab_when_it_is_missing() -> None:
    for argv in (["experiment", "--plan", "design"], ["demo"], ["demo", "--single"]):
        out = run_without_lab(*argv)
        assert out.returncode == 2, out.stderr
        assert f"peerctl {argv[0]} needs the lab" in out.stderr
        assert "pip install 'peercrawl[lab]'" in out.stderr
        assert "Traceback" not in out.stderr


def test_the_other_commands_work_without_the_lab() -> None:
    out = run_without_lab("ring", "--node", "A=1", "--node", "B=1", "--hosts", "1000")
    assert out.returncode == 0, out.stderr
    assert "A" in out.stdout and "B" in out.stdout
