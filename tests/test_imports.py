"""The dependency direction, read from the source with ``ast``: pure cores import no I/O, no clock, no global
randomness and nothing from the shell; storage never imports the daemon."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PURE_FORBIDDEN = {"trio", "httpx", "socket", "time", "random", "asyncio", "threading", "peer", "storage"}


@functools.lru_cache(maxsize=None)
def _tree(text: str, filename: str) -> ast.Module:
    """A source's syntax tree, parsed once per worker for every test that reads the same file."""
    return ast.parse(text, filename=filename)


def imported_modules(path: Path, root: Path, package: str) -> set[str]:
    """Every module ``path`` imports, absolute and dotted (relative imports resolved against ``package``)."""
    tree = _tree(path.read_text(encoding="utf-8"), str(path))
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
        "import time\nfrom socket import socket\nimport random as r\nfrom peer.cli.main import main\n"
        "from .. import storage\nimport trio.lowlevel\nx = __import__('threading')\n"
    )
    found = violations("fake", PURE_FORBIDDEN, root=tmp_path)
    assert sorted(line.split(" imports ")[1] for line in found) == [
        "peer.cli.main", "random", "socket", "storage", "threading", "time", "trio.lowlevel",
    ]
    assert all(line.startswith("fake/bad.py") for line in found)


# The rooms of the daemon, from the top floor down. A room may import the rooms below it, never one above it
# (nor its own floor's other rooms, except the base modules every room shares). The lab is outside the product.
FLOORS: list[set[str]] = [
    {"peer.__main__"},
    {"peer.cli"},
    {"peer.node"},
    {"peer.noderoutes"},
    {"peer.outputs"},
    {"peer.cluster"},
    {"peer.plugins"},
    {"peer.crawl"},
    {"peer.render"},
    {"peer.fetch"},
    {"peer.control", "peer.dashboard", "peer.config", "peer.stats", "peer.log", "peer.diskguard", "peer.lazy"},
]


def room_of(module: str) -> str | None:
    """The room a dotted ``peer`` module belongs to (``peer.crawl.urls`` -> ``peer.crawl``)."""
    parts = module.split(".")
    if parts[0] != "peer" or len(parts) < 2:
        return None
    return ".".join(parts[:2])


def floor_of(room: str) -> int:
    for number, rooms in enumerate(FLOORS):
        if room in rooms:
            return number
    raise AssertionError(f"{room} is on no floor: add it to FLOORS in tests/test_imports.py")


def upward_imports(root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted((root / "peer").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        here = room_of(".".join(parts if parts[-1] != "__init__" else parts[:-1]))
        if here is None:  # peer/__init__.py: the lazy face of the whole package
            continue
        for module in imported_modules(path, root, "peer"):
            there = room_of(module)
            if there is None or there == here:
                continue
            if floor_of(there) <= floor_of(here):
                bad.append(f"{path.relative_to(root).as_posix()} ({here}) imports {module} ({there})")
    return bad


def test_every_room_of_peer_is_on_a_floor() -> None:
    rooms = {p.stem if p.is_file() else p.name for p in (ROOT / "peer").iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    for room in rooms:
        floor_of(f"peer.{room}")


def test_rooms_import_only_downward() -> None:
    assert upward_imports() == []


def test_the_daemon_never_imports_the_lab() -> None:
    assert violations("peer", {"peerlab"}) == []
    assert violations("storage", {"peerlab"}) == []


def test_no_import_inside_a_function_in_the_daemon() -> None:
    """Imports live at the top of a module, where the import graph can be read; known exceptions: the slow
    charset detector (imported on first use), the S3 client library (only a node with --upload loads it), the
    Redis client (only a node with --crawl-log loads it), the websocket client (only a node that renders loads
    it), the node and its stores in the CLI (only `peerd` and the `peerctl` commands that read a data dir load
    them: a `peerctl` call that talks to a node starts in a third of the time) and the CLI's look-up of the
    optional lab by name."""
    allowed = {("peer/crawl/charset.py", "charset_normalizer"), ("peer/outputs/s3.py", "boto3"),
               ("peer/outputs/crawllog.py", "redis"),
               ("peer/outputs/s3.py", "botocore.config"), ("peer/outputs/s3.py", "botocore.exceptions"),
               ("peer/render/browser.py", "trio_websocket"),
               ("peer/cli/main.py", "peer.node"), ("peer/cli/main.py", "peer.crawl.pageworkers"),
               ("peer/cli/main.py", "storage")}
    found = []
    for path in sorted((ROOT / "peer").rglob("*.py")):
        tree = _tree(path.read_text(encoding="utf-8"), str(path))
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    name = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                    key = (path.relative_to(ROOT).as_posix(), name)
                    if key not in allowed:
                        found.append(f"{key[0]} imports {name} inside {func.name}()")
    assert found == []


def test_the_floor_check_catches_an_upward_import(tmp_path: Path) -> None:
    (tmp_path / "peer" / "fetch").mkdir(parents=True)
    (tmp_path / "peer" / "__init__.py").write_text("")
    (tmp_path / "peer" / "fetch" / "__init__.py").write_text("")
    (tmp_path / "peer" / "fetch" / "http.py").write_text("from peer.crawl.urls import normalize\nimport peer.config\n")
    (tmp_path / "peer" / "config.py").write_text("from .fetch import http\n")
    assert upward_imports(tmp_path) == [
        "peer/config.py (peer.config) imports peer.fetch (peer.fetch)",
        "peer/fetch/http.py (peer.fetch) imports peer.crawl.urls (peer.crawl)",
    ]


# The rooms of the cluster (peer/cluster/), from the top floor down, as FLOORS above: the core composes the hand-off,
# the replicas and membership, which use the network; none of them imports the core or a room beside it.
CLUSTER_FLOORS: list[set[str]] = [
    {"peer.cluster.core"},
    {"peer.cluster.handoff", "peer.cluster.replicas"},
    {"peer.cluster.membership"},
    {"peer.cluster.net"},
]


def cluster_room_of(module: str) -> str | None:
    """The room of peer/cluster/ a dotted module belongs to (``peer.cluster.net.transport`` -> ``peer.cluster.net``);
    None outside them, and for the package's face (``peer.cluster``)."""
    parts = module.split(".")
    if parts[:2] != ["peer", "cluster"] or len(parts) < 3:
        return None
    return ".".join(parts[:3])


def upward_cluster_imports(root: Path = ROOT) -> list[str]:
    floors = {room: number for number, rooms in enumerate(CLUSTER_FLOORS) for room in rooms}
    bad = []
    for path in sorted((root / "peer" / "cluster").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        here = cluster_room_of(".".join(parts if parts[-1] != "__init__" else parts[:-1]))
        if here is None:  # peer/cluster/__init__.py: the face of every room
            continue
        for module in imported_modules(path, root, "peer"):
            if module == "peer.cluster":
                bad.append(f"{path.relative_to(root).as_posix()} ({here}) imports the package's face {module}")
                continue
            there = cluster_room_of(module)
            if there is None or there == here:
                continue
            if floors[there] <= floors[here]:
                bad.append(f"{path.relative_to(root).as_posix()} ({here}) imports {module} ({there})")
    return bad


def test_every_room_of_the_cluster_is_on_a_floor() -> None:
    rooms = {f"peer.cluster.{p.name}" for p in (ROOT / "peer" / "cluster").iterdir() if (p / "__init__.py").exists()}
    assert rooms == set().union(*CLUSTER_FLOORS)
    assert [p.name for p in (ROOT / "peer" / "cluster").glob("*.py")] == ["__init__.py"]


def test_the_cluster_rooms_import_only_downward() -> None:
    assert upward_cluster_imports() == []


def test_the_cluster_floor_check_catches_an_upward_import(tmp_path: Path) -> None:
    for room in ("core", "net", "handoff", "replicas", "membership"):
        (tmp_path / "peer" / "cluster" / room).mkdir(parents=True)
        (tmp_path / "peer" / "cluster" / room / "__init__.py").write_text("")
    (tmp_path / "peer" / "cluster" / "net" / "transport.py").write_text("from peer.cluster.core.cluster import Cluster\n")
    (tmp_path / "peer" / "cluster" / "handoff" / "send.py").write_text(
        "from peer.cluster.replicas.seenreplicas import SeenReplicas\nfrom peer.cluster.net.transport import Handler\n")
    (tmp_path / "peer" / "cluster" / "replicas" / "x.py").write_text("from peer.cluster import Handoff\n")
    assert upward_cluster_imports(tmp_path) == [
        "peer/cluster/handoff/send.py (peer.cluster.handoff) imports peer.cluster.replicas.seenreplicas "
        "(peer.cluster.replicas)",
        "peer/cluster/net/transport.py (peer.cluster.net) imports peer.cluster.core.cluster (peer.cluster.core)",
        "peer/cluster/replicas/x.py (peer.cluster.replicas) imports the package's face peer.cluster",
    ]
