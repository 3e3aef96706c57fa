"""The asking side of payload digests, sans-I/O (`protocol.DigestAsks`), and the owner's answer (`answer_ask`):
asks batched per owner, one ask per digest in flight, answers matched to their ask and its peer, unanswered
asks given up after the timeout, bounds kept. No clock, no socket: time comes in as `now`. The messages' wire
forms are tested with every other message's (tests/test_protocol_codec.py)."""

from __future__ import annotations

import pytest

from protocol import DigestAnswer, DigestAsk, DigestAsks, LocalProtocolError, PayloadOriginal, answer_ask


def _original(digest: str, uri: str = "http://a.test/x", date: float = 1.0) -> PayloadOriginal:
    return PayloadOriginal(digest=digest, uri=uri, date=date, record_id=f"<urn:uuid:{digest}>")


def test_asks_are_batched_per_owner_and_a_digest_is_asked_once_while_out() -> None:
    asks = DigestAsks(max_batch=2, timeout=2.0)
    assert asks.idle()
    assert asks.ask("B", "d1") and asks.ask("B", "d2") and asks.ask("C", "d3")
    assert not asks.idle()
    assert asks.ask("B", "d1")  # already waiting: settled by the same answer
    asks.note("C", _original("d9"))
    assert asks.full()  # B's batch holds max_batch digests
    sent = asks.take(now=10.0)
    assert [(peer, m.digests, [o.digest for o in m.stored]) for peer, m in sent] == [
        ("B", ("d1", "d2"), []), ("C", ("d3",), ["d9"])]
    assert asks.take(now=10.0) == [] and asks.outstanding() == 3
    b_seq = sent[0][1].seq
    # an answer from another peer than asked, or to no ask, settles nothing
    assert asks.answered("C", DigestAnswer(seq=b_seq, found=())) == []
    assert asks.answered("B", DigestAnswer(seq=999, found=())) == []
    settled = asks.answered("B", DigestAnswer(seq=b_seq, found=(_original("d2"),)))
    assert settled == [("d1", None), ("d2", _original("d2"))]
    assert asks.answered("B", DigestAnswer(seq=b_seq, found=())) == []  # a repeat settles nothing again
    assert not asks.waiting("d1") and asks.waiting("d3")
    assert not asks.idle()  # C's ask is out
    asks.answered("C", DigestAnswer(seq=sent[1][1].seq, found=()))
    assert asks.idle()


def test_a_batch_larger_than_max_batch_goes_in_several_messages() -> None:
    asks = DigestAsks(max_batch=3, timeout=2.0)
    for i in range(7):
        asks.ask("B", f"d{i}")
    sent = asks.take(now=0.0)
    assert [m.digests for _peer, m in sent] == [("d0", "d1", "d2"), ("d3", "d4", "d5"), ("d6",)]
    assert len({m.seq for _peer, m in sent}) == 3


def test_unanswered_asks_expire_after_the_timeout_and_a_departed_peer_settles_its_own() -> None:
    asks = DigestAsks(timeout=2.0)
    asks.ask("B", "late")
    asks.ask("C", "gone")
    asks.take(now=5.0)
    assert asks.expire(now=6.9) == []
    assert asks.forget_peer("C") == ["gone"]
    assert asks.expire(now=7.0) == ["late"]
    assert asks.outstanding() == 0


def test_the_bound_on_waiting_digests_refuses_more_and_drops_notes_counted() -> None:
    asks = DigestAsks(timeout=1.0, max_waiting=2)
    assert asks.ask("B", "a") and asks.ask("B", "b") and not asks.ask("B", "c")
    for i in range(3):
        asks.note("B", _original(f"n{i}"))
    assert asks.notes_dropped == 1
    with pytest.raises(LocalProtocolError):
        DigestAsks(max_batch=0)


def test_the_owner_answers_what_it_knows_once_per_digest() -> None:
    known = {"x": _original("x")}
    ask = DigestAsk(seq=7, digests=("x", "y", "x"), stored=())
    answer = answer_ask(ask, lambda digests: {d: known[d] for d in digests if d in known})
    assert answer == DigestAnswer(seq=7, found=(_original("x"),))


def test_notes_alone_go_in_an_ask_of_no_digests_that_waits_for_no_answer() -> None:
    asks = DigestAsks(timeout=1.0)
    asks.note("B", _original("n1"))
    ((peer, message),) = asks.take(now=0.0)
    assert peer == "B" and message.digests == () and [o.digest for o in message.stored] == ["n1"]
    assert asks.outstanding() == 0 and asks.expire(now=10.0) == []
    assert asks.answered("B", DigestAnswer(seq=message.seq, found=())) == []
