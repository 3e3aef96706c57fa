from peer.crawl.scheduler import HostScheduler, HostTurn


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


# -- the window (max_active): Mercator's bounded back queues, the rest of the hosts on disk --


def test_the_window_holds_and_a_refused_host_marks_the_scheduler_spilled():
    s = HostScheduler(max_active=2)
    assert s.wake("a", 0.0) and s.wake("b", 0.0)
    assert s.room() == 0 and not s.spilled
    assert s.wake("c", 0.0) is False  # no room: c stays on disk
    assert s.spilled and s.spills == 1 and set(s.turns) == {"a", "b"} and len(s) == 2


def test_idle_hosts_make_way_oldest_first_and_busy_ones_never_do():
    s = HostScheduler(max_active=2)
    s.wake("a", 0.0)
    s.wake("b", 0.0)
    a = s.pop_ready(0.0)
    s.release(a, 0.0, more_work=False)  # a is idle: kept as a cache, first to go
    assert s.room() == 1 and s.active() == 1
    assert s.wake("c", 0.0) is True
    assert set(s.turns) == {"b", "c"} and s.evicted == 1 and not s.spilled
    b = s.pop_ready(0.0)
    assert b.host == "b" and s.wake("d", 0.0) is False  # b busy, c waiting: nobody makes way
    assert set(s.turns) == {"b", "c"} and s.spilled


def test_a_host_coming_back_gets_its_saved_politeness_from_recall():
    saved = {}

    def recall(host):
        t = HostTurn(host)
        if host in saved:
            t.next_allowed, t.crawl_delay = saved[host]
        return t

    s = HostScheduler(max_active=1, recall=recall)
    s.wake("a", 0.0)
    a = s.pop_ready(0.0)
    a.crawl_delay, a.next_allowed = 30.0, 30.0
    saved["a"] = (a.next_allowed, a.crawl_delay)  # what the crawler saves after every request
    s.release(a, 0.0, more_work=False)
    s.wake("b", 1.0)  # a was idle: evicted for b
    assert "a" not in s.turns
    b = s.pop_ready(1.0)
    s.release(b, 1.0, more_work=False)
    assert s.wake("a", 2.0)  # back in: its timer and Crawl-delay as saved, not a fresh turn's
    assert s.turns["a"].crawl_delay == 30.0
    assert s.pop_ready(29.9) is None and s.pop_ready(30.0).host == "a"


def test_with_hosts_waiting_on_disk_a_host_leaves_after_its_quantum_of_turns():
    s = HostScheduler(max_active=1, quantum=2)
    s.wake("a", 0.0)
    assert s.wake("b", 0.0) is False and s.spilled
    a = s.pop_ready(0.0)
    assert s.release(a, 0.0, more_work=True, may_leave=True) is False  # 1 turn: stays
    a = s.pop_ready(0.0)
    assert s.release(a, 0.0, more_work=True, may_leave=False) is False  # something parked: stays
    assert s.release(s.pop_ready(0.0), 0.0, more_work=True, may_leave=True) is True  # its quantum: leaves
    assert s.turns == {} and s.room() == 1 and s.spills == 2
    assert s.wake("b", 0.0) and s.turns["b"].rounds == 0


def test_without_hosts_on_disk_or_without_a_quantum_a_host_keeps_its_place():
    s = HostScheduler(max_active=1, quantum=1)
    s.wake("a", 0.0)
    for _ in range(5):  # nothing waits on disk: no reason to leave
        assert s.release(s.pop_ready(0.0), 0.0, more_work=True, may_leave=True) is False
    s = HostScheduler(max_active=1, quantum=0)
    s.wake("a", 0.0)
    s.wake("b", 0.0)
    for _ in range(5):  # Mercator's rule: a back queue keeps its host until it is empty
        assert s.release(s.pop_ready(0.0), 0.0, more_work=True, may_leave=True) is False
    assert set(s.turns) == {"a"}


def test_unbounded_by_default():
    s = HostScheduler()
    for i in range(1000):
        assert s.wake(f"h{i}", 0.0)
    assert len(s) == 1000 and not s.spilled and s.room() > 10**9
