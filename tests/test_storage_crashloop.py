"""A URL that is in flight every time the process stops is dropped after `max_crashes` stops in a row, so no
page can make a node crash-loop; a fetch that finishes forgets the count. Real on-disk LMDB, reopened."""

from __future__ import annotations

from pathlib import Path

from storage import FrontierStore, MemoryFrontierStore, NodeStore, QueuedUrl


def item(n: int, host: str = "h.example") -> QueuedUrl:
    return QueuedUrl(url=f"http://{host}/{n}", host=host, depth=1)


def stop_with_in_flight(path: Path, host: str = "h.example") -> QueuedUrl | None:
    """Start, take the host's next URL, and stop without finishing it (as a crash does)."""
    store = FrontierStore.open(path)
    try:
        return store.pop(host)
    finally:
        store.close()


def restart(path: Path, max_crashes: int = 3) -> tuple[int, list[QueuedUrl], int]:
    store = FrontierStore.open(path)
    try:
        back, dropped = store.recover_in_flight(max_crashes=max_crashes)
        return back, dropped, len(store)
    finally:
        store.close()


def test_a_url_in_flight_at_three_stops_in_a_row_is_dropped(tmp_path: Path) -> None:
    store = FrontierStore.open(tmp_path)
    store.push([item(1), item(2)])
    store.close()
    assert stop_with_in_flight(tmp_path) == item(1)
    assert restart(tmp_path) == (1, [], 2)
    assert stop_with_in_flight(tmp_path) == item(1)  # back at its place: first again
    assert restart(tmp_path) == (1, [], 2)
    assert stop_with_in_flight(tmp_path) == item(1)
    assert restart(tmp_path) == (0, [item(1)], 1)
    # The other URL is untouched and next.
    assert stop_with_in_flight(tmp_path) == item(2)


def test_a_finished_fetch_forgets_the_count(tmp_path: Path) -> None:
    store = FrontierStore.open(tmp_path)
    store.push([item(1)])
    store.close()
    for _ in range(2):
        stop_with_in_flight(tmp_path)
        assert restart(tmp_path)[:2] == (1, [])
    store = FrontierStore.open(tmp_path)
    taken = store.pop("h.example")
    store.done(taken)
    store.push([item(1)])  # queued again later (a re-crawl): a fresh count
    store.close()
    for _ in range(2):
        stop_with_in_flight(tmp_path)
        assert restart(tmp_path)[:2] == (1, [])


def test_zero_never_drops_and_recover_keeps_its_meaning(tmp_path: Path) -> None:
    store = FrontierStore.open(tmp_path)
    store.push([item(1)])
    store.close()
    for _ in range(5):
        stop_with_in_flight(tmp_path)
        assert restart(tmp_path, max_crashes=0) == (1, [], 1)
    stop_with_in_flight(tmp_path)
    store = FrontierStore.open(tmp_path)
    assert store.recover() == 1 and len(store) == 1
    assert store.pop("h.example") == item(1)
    store.close()


def test_node_store_and_memory_frontier_have_it_too(tmp_path: Path) -> None:
    node = NodeStore.open(tmp_path)
    node.admit([item(1)])
    node.frontier.pop("h.example")
    assert node.frontier.recover_in_flight(max_crashes=1) == (0, [item(1)])
    node.close()
    memory = MemoryFrontierStore()
    memory.push([item(1)])
    memory.pop("h.example")
    assert memory.recover_in_flight(max_crashes=1) == (1, [])
