"""What authenticating every frame costs: the tag's share of sending and receiving URL batches and pings.

Run: python -m tests.bench.bench_frame_mac [--batches N]

Each frame after the handshake carries a keyed BLAKE2b-128 tag, made by the sender and checked by the receiver
(docs/protocol.md, section 2a). The reference, measured in the same run, is the whole protocol path that the
tag is part of: `send` + `receive_data` + `next_event` for the same messages through an established pair. The
tag's own cost is the two tag computations over the same frames (the sender's and the receiver's check), timed
alone. Both are per URL for batches of 1,000 realistic URLs (the batch shape of bench_protocol), and per frame
for pings, the smallest frame.
"""

from __future__ import annotations

import argparse
import hmac

from protocol import TAG_SIZE, Ping
from protocol._handshake import frame_tag
from tests.bench.bench_protocol import best_of, make_batches, pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--size", type=int, default=1000)
    args = parser.parse_args()
    batches = make_batches(7, args.batches, args.size)
    urls = sum(len(batch.urls) for batch in batches)
    key = bytes(32)

    for codec in ("msgpack", "json"):
        a, b = pair(codec, "none", 1)
        frames = [a.send(batch) for batch in batches]
        a, b = pair(codec, "none", 1)

        def whole() -> int:
            total = 0
            for batch in batches:
                frame = a.send(batch)
                total += len(frame)
                b.receive_data(frame)
                if b.next_event() != batch:
                    raise AssertionError("round trip changed the batch")
            return total

        def tags_alone() -> int:
            for seq, frame in enumerate(frames):
                body = frame[6:-TAG_SIZE]
                sent = frame_tag(key, seq, frame[4], frame[5], body)
                if not hmac.compare_digest(frame_tag(key, seq, frame[4], frame[5], body), sent):
                    raise AssertionError("tag mismatch")
            return 0

        whole_s, size = best_of(5, whole)
        tag_s, _ = best_of(5, tags_alone)
        print(
            f"{codec:8} batches of {args.size}: protocol {whole_s / urls * 1e6:6.3f} us/URL, tags (make + check) "
            f"{tag_s / urls * 1e6:6.3f} us/URL = {tag_s / whole_s:6.1%} of it; tag bytes "
            f"{TAG_SIZE * len(batches) / urls:.3f}/URL of {size / urls:.1f} ({TAG_SIZE * len(batches) / size:.2%})"
        )

    pings = [Ping(seq=i, epoch=3) for i in range(20_000)]
    a, b = pair("msgpack", "none", 1)
    ping_frames = [a.send(ping) for ping in pings]
    a, b = pair("msgpack", "none", 1)

    def ping_whole() -> int:
        for ping in pings:
            b.receive_data(a.send(ping))
            b.next_event()
        return 0

    def ping_tags() -> int:
        for seq, frame in enumerate(ping_frames):
            body = frame[6:-TAG_SIZE]
            hmac.compare_digest(frame_tag(key, seq, frame[4], frame[5], body), frame_tag(key, seq, 0x21, 0, body))
        return 0

    whole_s, _ = best_of(5, ping_whole)
    tag_s, _ = best_of(5, ping_tags)
    n = len(pings)
    print(
        f"pings: protocol {whole_s / n * 1e6:6.3f} us/frame, tags {tag_s / n * 1e6:6.3f} us/frame = "
        f"{tag_s / whole_s:6.1%} of it; tag bytes {TAG_SIZE} of {len(ping_frames[0])}"
    )


if __name__ == "__main__":
    main()
