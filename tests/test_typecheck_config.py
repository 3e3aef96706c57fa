"""The type checker's configuration (pyproject.toml's [tool.mypy]) keeps its promises: every module of the daemon
that defines a Protocol (a seam) is checked strictly, and the strict override turns on every per-module flag of
`mypy --strict`. `bash deploy/typecheck.sh` runs the checker itself (CI: `TYPECHECK=1 bash deploy/test.sh`)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _mypy() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]


def _strict_override() -> dict:
    (override,) = [o for o in _mypy()["overrides"] if o.get("disallow_untyped_defs")]
    return override


def matches(pattern: str, module: str) -> bool:
    """mypy's module pattern: a `*` component stands for zero or more components (`a.*.b` is a.b, a.x.b, ...)."""
    def walk(p: list[str], m: list[str]) -> bool:
        if not p:
            return not m
        if p[0] == "*":
            return any(walk(p[1:], m[i:]) for i in range(len(m) + 1))
        return bool(m) and p[0] == m[0] and walk(p[1:], m[1:])

    return walk(pattern.split("."), module.split("."))


def _defines_protocol(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
                if name == "Protocol":
                    return True
    return False


def test_pattern_matching_reads_as_mypy_does() -> None:
    assert matches("ring.*", "ring") and matches("ring.*", "ring._ring") and not matches("ring.*", "rings")
    assert matches("peer.cluster.*.dispatch", "peer.cluster.dispatch")
    assert matches("peer.cluster.*.dispatch", "peer.cluster.core.dispatch")
    assert not matches("peer.cluster.*.dispatch", "peer.cluster.dispatcher")


def test_every_module_with_a_protocol_is_strict() -> None:
    patterns = _strict_override()["module"]
    seams = []
    for package in ("peer", "peerlab"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if _defines_protocol(path):
                parts = path.relative_to(ROOT).with_suffix("").parts
                seams.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    assert "peer.crawl.seams" in seams  # the walk finds the seams it is about
    assert [m for m in seams if not any(matches(p, m) for p in patterns)] == []


@pytest.mark.parametrize("package", ["ring", "protocol", "storage"])
def test_the_pure_cores_and_storage_are_strict(package: str) -> None:
    assert f"{package}.*" in _strict_override()["module"]


def test_the_override_is_mypy_strict() -> None:
    """`strict = true` in an override would turn strictness on everywhere, so the override lists the flags;
    this keeps the list equal to what `mypy --strict` sets per module, whatever mypy's version."""
    mypy_main = pytest.importorskip("mypy.main")
    from mypy.options import PER_MODULE_OPTIONS

    _parser, _names, assignments = mypy_main.define_options()
    wanted = {dest: value for dest, value in assignments if dest in PER_MODULE_OPTIONS}
    override, top = _strict_override(), _mypy()
    assert "strict" not in override and "strict" not in top
    assert {dest: override.get(dest, top.get(dest)) for dest in wanted} == wanted
