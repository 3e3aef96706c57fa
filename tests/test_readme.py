"""The README's two commands are the ones CI and newcomers run; keep them and the scripts in step."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```\n(.+?)\n```", section)


def test_readme_names_two_commands_and_ci_runs_the_test_one():
    demo, test = _commands()
    assert demo == "bash deploy/demo.sh"
    assert test == "bash deploy/test.sh"
    assert test in (ROOT / ".ci" / "run").read_text().split("# The README's test command:", 1)[1]
    # each sets itself up: it installs the project into .venv (deploy/venv.sh, through uv or pip) before it runs
    install = (ROOT / "deploy" / "venv.sh").read_text()
    assert "uv pip install" in install and "python -m pip install" in install
    for cmd in (demo, test):
        script = ROOT / cmd.split()[1]
        assert script.exists() and "source deploy/venv.sh\nvenv_install " in script.read_text()


def test_console_scripts_exist():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'peerd = "peer.cli.main:peerd_main"' in text and 'peerctl = "peer.cli.main:peerctl_main"' in text
    from peer.cli.main import peerctl_main, peerd_main

    assert callable(peerd_main) and callable(peerctl_main)
