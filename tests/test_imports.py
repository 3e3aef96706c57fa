"""The dependency direction, read from the source with ``ast``: pure cores import no I/O, no clock, no global
randomness and nothing from the shell; storage never imports the daemon."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PURE_FORBIDDEN = {"trio", "httpx", "socket", "time", "random", "asyncio", "threading", "peer", "storage"}


def imported_modules(path: Path, root: Path, package: str) -> set[str]:
    """Every module ``path`` imports, absolute and dotted (relative imports resolved against ``package``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    parts = [package, *path.relative_to(root / package).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    else:
        parts.pop()  # the module itself: relative imports start from its package
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = parts[: max(0, len(parts) - node.level + 1)]
                if node.module:
                    found.add(".".join([*base, node.module]))
                else:
                    found.update(".".join([*base, alias.name]) for alias in node.names)
            else:
                found.add(node.module or "")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__" and node.args:
            if isinstance(node.args[0], ast.Constant):
                found.add(str(node.args[0].value))
    return found


def violations(package: str, forbidden: set[str], root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted((root / package).rglob("*.py")):
        for module in imported_modules(path, root, package):
            if module.split(".")[0] in forbidden:
                bad.append(f"{path.relative_to(root).as_posix()} imports {module}")
    return bad


@pytest.mark.parametrize("package", ["ring", "protocol"])
def test_pure_packages_import_no_io_clock_randomness_or_shell(package: str) -> None:
    assert (ROOT / package / "__init__.py").exists()
    assert violations(package, PURE_FORBIDDEN) == []


def test_storage_does_not_import_peer() -> None:
    assert violations("storage", {"peer"}) == []


def test_the_checker_catches_what_it_should(tmp_path: Path) -> None:
    """The check itself: a module with forbidden imports in every form is reported, a clean one is not."""
    package = tmp_path / "fake"
    package.mkdir()
    (package / "__init__.py").write_text("from . import ok\n")
    (package / "ok.py").write_text("import hashlib\nfrom .sibling import x\nfrom collections import abc\n")
    (package / "bad.py").write_text(
        "import time\nfrom socket import socket\nimport random as r\nfrom peer.cli import main\n"
        "from .. import storage\nimport trio.lowlevel\nx = __import__('threading')\n"
    )
    found = violations("fake", PURE_FORBIDDEN, root=tmp_path)
    assert sorted(line.split(" imports ")[1] for line in found) == [
        "peer.cli", "random", "socket", "storage", "threading", "time", "trio.lowlevel",
    ]
    assert all(line.startswith("fake/bad.py") for line in found)
