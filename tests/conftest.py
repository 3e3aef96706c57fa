"""Suite-wide collection rule: the `search` tests (random fault schedules by the hundred, hours of wall time) run
only when asked for by name, `pytest -m search`; any other selection, including `-m 'not slow'`, leaves them out."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "search" in (config.getoption("markexpr") or ""):
        return
    kept = [item for item in items if item.get_closest_marker("search") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("search")])
        items[:] = kept
