"""The files a running node publishes in its data dir for scripts and `peerctl` (control.addr, peer.addr) appear
whole: a reader that waits for one to exist and reads it at once never sees it empty or half written (a joiner
that read an empty peer.addr started a cluster of its own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from peer.node import _publish


def test_a_published_file_is_written_beside_and_renamed_into_place(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "peer.addr"
    written: list[tuple[Path, str | None]] = []
    write_text = Path.write_text

    def watched(self: Path, data: str, *args: object, **kwargs: object) -> int:
        # where the bytes go, and what a reader polling for the target finds meanwhile
        written.append((self, target.read_text() if target.exists() else None))
        return write_text(self, data, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", watched)
    _publish(target, "127.0.0.1:7000\n")
    _publish(target, "127.0.0.1:7001\n")
    assert [where for where, _ in written] and all(where != target for where, _ in written)
    assert [found for _, found in written] == [None, "127.0.0.1:7000\n"]
    assert target.read_text() == "127.0.0.1:7001\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["peer.addr"]
