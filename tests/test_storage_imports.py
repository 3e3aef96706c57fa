"""storage/ is synchronous and sits below peer/: it never imports peer, trio or anything async."""

from __future__ import annotations

import ast
from pathlib import Path

FORBIDDEN = {"peer", "trio", "asyncio", "httpx", "anyio"}


def test_storage_imports_stay_below_peer():
    root = Path(__file__).resolve().parent.parent / "storage"
    files = sorted(root.glob("*.py"))
    assert files
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"
