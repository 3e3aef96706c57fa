"""Suite-wide rules.

- Collection: the `search` tests (random fault schedules by the hundred, hours of wall time) run only when asked
  for by name, `pytest -m search`; any other selection, including `-m 'not slow'`, leaves them out.
- Scheduling over pytest-xdist workers (`deploy/test.sh` runs `-n auto --dist loadgroup`): the files that start
  a cluster of real daemons run one after the other on one worker, since two such clusters on a two-core machine
  starve each other's daemons; every other test goes to whichever worker is free. (xdist's own `xdist_group`
  mark renames test ids, which pytest 9 no longer allows, so the group is named here by file.)
"""

from __future__ import annotations

from typing import Any

import pytest

#: Test files whose tests each run a cluster of real peerd daemons (and the dashboard's, daemons and a browser).
DAEMON_CLUSTERS = frozenset({
    "test_address_cluster.py",
    "test_cluster_daemons.py",
    "test_cluster_daemons_replicas.py",
    "test_dashboard.py",
    "test_plugin_daemons.py",
    "test_render_cluster.py",
    "test_demo.py",
    "test_payload_revisits_daemons.py",
    "test_outputs_cluster.py",
    "test_revisit_daemons.py",
    "test_steering_daemons.py",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "search" in (config.getoption("markexpr") or ""):
        return
    kept = [item for item in items if item.get_closest_marker("search") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("search")])
        items[:] = kept


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class OneClusterAtATime(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "daemon clusters" if path.rsplit("/", 1)[-1] in DAEMON_CLUSTERS else nodeid

    return OneClusterAtATime(config, log)
