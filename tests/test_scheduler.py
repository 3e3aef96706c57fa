from peer.crawl.scheduler import HostScheduler


def test_hosts_come_out_in_time_order_and_only_when_due():
    s = HostScheduler()
    s.turn("b").next_allowed = 5.0
    s.wake("a", now=0.0)
    s.wake("b", now=0.0)
    s.turn("c").next_allowed = 2.0
    s.wake("c", now=0.0)
    assert s.next_time() == 0.0
    assert s.pop_ready(0.0).host == "a"
    assert s.pop_ready(1.0) is None
    assert s.next_time() == 2.0
    assert s.pop_ready(2.0).host == "c"
    assert s.pop_ready(4.9) is None
    assert s.pop_ready(5.0).host == "b"
    assert len(s) == 0


def test_a_busy_host_is_never_handed_out_twice():
    s = HostScheduler()
    s.wake("a", 0.0)
    t = s.pop_ready(0.0)
    assert t.busy
    assert s.wake("a", 0.0) is False  # work arriving while busy does not queue a second turn
    assert s.pop_ready(100.0) is None
    t.next_allowed = 3.0
    s.release(t, 1.0, more_work=True)
    assert not t.busy and t.waiting
    assert s.pop_ready(2.9) is None
    assert s.pop_ready(3.0) is t


def test_double_wake_queues_once_and_release_without_work_idles():
    s = HostScheduler()
    assert s.wake("a", 0.0) is True
    assert s.wake("a", 0.0) is False
    assert len(s) == 1
    t = s.pop_ready(0.0)
    s.release(t, 0.0, more_work=False)
    assert len(s) == 0 and not t.waiting and not t.busy
    assert s.busy_count() == 0
