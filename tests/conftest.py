"""Suite-wide rules.

- Collection: the `search` tests (random fault schedules by the hundred, hours of wall time) run only when asked
  for by name, `pytest -m search`; any other selection, including `-m 'not slow'`, leaves them out. The tests
  marked slow come first, so that over xdist workers the long ones start early and the short ones fill the end.
- Scheduling over pytest-xdist workers (`deploy/test.sh` runs `--dist loadgroup` with four workers more than the
  machine has cores, since most slow tests wait on daemons and servers more than they compute): the files that
  start a cluster of real daemons are split into two lanes; the files of one lane run one after the other on
  one worker, so at most two clusters share the cores at a time; every other test goes to whichever worker is
  free. (xdist's own `xdist_group` mark renames test ids, which pytest 9 no longer allows, so the lanes are named
  here by file.)
"""

from __future__ import annotations

from typing import Any

import pytest

#: Test files whose tests each run a cluster of real peerd daemons (and the dashboard's, daemons and a browser),
#: each with its lane: the lanes are about equally long (test durations summed, 2026-11-29).
DAEMON_CLUSTERS: dict[str, str] = {
    "test_cluster_daemons_replicas.py": "daemon lane 1",
    "test_dashboard.py": "daemon lane 1",
    "test_address_cluster.py": "daemon lane 1",
    "test_render_cluster.py": "daemon lane 1",
    "test_payload_revisits_daemons.py": "daemon lane 1",
    "test_plugin_daemons.py": "daemon lane 2",
    "test_outputs_cluster.py": "daemon lane 2",
    "test_demo.py": "daemon lane 2",
    "test_cluster_daemons.py": "daemon lane 2",
    "test_revisit_daemons.py": "daemon lane 2",
    "test_steering_daemons.py": "daemon lane 2",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "search" in (config.getoption("markexpr") or ""):
        return
    kept = [item for item in items if item.get_closest_marker("search") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("search")])
        items[:] = kept
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ClusterLanes(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return DAEMON_CLUSTERS.get(path.rsplit("/", 1)[-1], nodeid)

    return ClusterLanes(config, log)
