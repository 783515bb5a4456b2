"""The scheduling queue, stepped with a fake clock."""

from __future__ import annotations

import pytest

from gpufrac.scheduler.queue import SchedulingQueue

from ..kubeapi.fakeapi import FakeClock


def make(clock: FakeClock, **settings: float) -> SchedulingQueue:
    return SchedulingQueue(clock=clock, initial_backoff=1.0, max_backoff=8.0, max_park=60.0, **settings)


def drain(queue: SchedulingQueue) -> list[str]:
    popped = []
    while (key := queue.pop()) is not None:
        popped.append(key)
    return popped


def test_highest_priority_first_then_oldest_then_first_added() -> None:
    queue = make(FakeClock())
    queue.add("young", priority=0, created=20.0)
    queue.add("old", priority=0, created=10.0)
    queue.add("urgent", priority=100, created=30.0)
    queue.add("tie-1", priority=0, created=15.0)
    queue.add("tie-2", priority=0, created=15.0)
    queue.add("low", priority=-5, created=0.0)
    assert len(queue) == 6 and "old" in queue
    assert drain(queue) == ["urgent", "old", "tie-1", "tie-2", "young", "low"]
    assert len(queue) == 0 and queue.pop() is None


def test_a_pod_queued_again_keeps_its_place_among_pods_of_its_age() -> None:
    """Gang members created in one second: the first, parked and queued again after its siblings arrived,
    is still tried first (the gang integration test held its members in a toss-up order)."""
    clock = FakeClock()
    queue = make(clock)
    queue.add("w0", priority=0, created=7.0)
    assert queue.pop() == "w0"
    queue.park("w0", priority=0, created=7.0)
    queue.add("w1", priority=0, created=7.0)
    queue.add("w0", priority=0, created=7.0)
    queue.add("w2", priority=0, created=7.0)
    assert drain(queue) == ["w0", "w1", "w2"]
    queue.forget("w0")  # bound or deleted: seen again, it is a new arrival
    queue.add("w3", priority=0, created=7.0)
    queue.add("w0", priority=0, created=7.0)
    assert drain(queue) == ["w3", "w0"]


def test_adding_a_queued_pod_again_keeps_one_entry() -> None:
    queue = make(FakeClock())
    queue.add("p", priority=0, created=1.0)
    queue.add("p", priority=0, created=1.0)
    assert drain(queue) == ["p"]


def test_a_parked_pod_waits_for_a_change_and_its_backoff() -> None:
    clock = FakeClock()
    queue = make(clock)
    queue.add("p", priority=0, created=1.0)
    assert queue.pop() == "p"
    queue.park("p", priority=0, created=1.0)
    assert "p" in queue and len(queue) == 1
    clock.advance(5.0)  # the backoff (1 s) has passed, but nothing changed
    assert queue.pop() is None
    queue.cluster_changed()
    assert queue.pop() == "p"


def test_a_change_before_the_backoff_has_passed_waits_for_the_backoff() -> None:
    clock = FakeClock()
    queue = make(clock)
    queue.park("p", priority=0, created=1.0)
    queue.cluster_changed()
    clock.advance(0.5)
    assert queue.pop() is None
    clock.advance(0.5)
    assert queue.pop() == "p"


def test_a_parked_pod_comes_back_after_max_park_without_any_change() -> None:
    clock = FakeClock()
    queue = make(clock)
    queue.park("p", priority=0, created=1.0)
    clock.advance(59.0)
    assert queue.pop() is None
    clock.advance(2.0)  # past the backoff plus max_park
    assert queue.pop() == "p"


def test_backoff_needs_no_change() -> None:
    clock = FakeClock()
    queue = make(clock)
    queue.backoff("p", priority=0, created=1.0)
    assert queue.pop() is None
    clock.advance(1.0)
    assert queue.pop() == "p"


def test_backoff_doubles_up_to_its_cap_and_forget_resets_it() -> None:
    clock = FakeClock()
    queue = make(clock)
    delays = []
    for _ in range(6):
        queue.backoff("p", priority=0, created=1.0)
        delays.append(queue.next_ready_in())
        clock.advance(100.0)
        assert queue.pop() == "p"
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    queue.forget("p")
    queue.backoff("p", priority=0, created=1.0)
    assert queue.next_ready_in() == 1.0


def test_a_pod_that_waits_for_days_stays_in_the_queue() -> None:
    """A pod parked over a thousand times (a day of waiting for room, retried every minute) still gets its
    capped backoff: doubling without a bound overflowed a float, and the pod, popped but never parked
    again, was never tried again."""
    clock = FakeClock()
    queue = make(clock)
    for _ in range(1100):
        queue.park("p", priority=0, created=1.0)
        clock.advance(100.0)
        assert queue.pop() == "p"
    queue.park("p", priority=0, created=1.0)
    assert "p" in queue and queue.next_ready_in() == 68.0


def test_forget_drops_a_pod_wherever_it_waits() -> None:
    queue = make(FakeClock())
    queue.add("active", priority=0, created=1.0)
    queue.park("parked", priority=0, created=1.0)
    queue.backoff("backing-off", priority=0, created=1.0)
    for key in ("active", "parked", "backing-off"):
        queue.forget(key)
        assert key not in queue
    queue.cluster_changed()
    assert len(queue) == 0 and queue.pop() is None


def test_adding_a_waiting_pod_makes_it_ready_at_once() -> None:
    """A pod whose spec changed may fit now: it does not sit out its backoff."""
    queue = make(FakeClock())
    queue.park("p", priority=0, created=1.0)
    queue.add("p", priority=0, created=1.0)
    assert queue.next_ready_in() == 0.0
    assert queue.pop() == "p"


def test_promoted_pods_keep_their_priority_order() -> None:
    clock = FakeClock()
    queue = make(clock)
    queue.backoff("low", priority=0, created=1.0)
    queue.backoff("high", priority=10, created=2.0)
    queue.add("ready", priority=5, created=0.0)
    clock.advance(1.0)
    assert drain(queue) == ["high", "ready", "low"]


def test_next_ready_in() -> None:
    clock = FakeClock()
    queue = make(clock)
    assert queue.next_ready_in() is None
    queue.park("parked", priority=0, created=1.0)
    assert queue.next_ready_in() == 61.0  # no change yet: backoff plus max_park
    queue.backoff("backing-off", priority=0, created=1.0)
    assert queue.next_ready_in() == 1.0
    queue.cluster_changed()
    clock.advance(0.25)
    assert queue.next_ready_in() == 0.75
    clock.advance(10.0)
    assert queue.next_ready_in() == 0.0  # overdue, never negative
    queue.add("new", priority=0, created=1.0)
    assert queue.next_ready_in() == 0.0


def test_taking_a_pod_reads_only_the_waiting_pods_that_are_due(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of parked pods (a tenant's that fit nowhere) were all read on every pop: a round over them
    was quadratic (16,000 pods, 8.9 s)."""
    clock = FakeClock()
    queue = SchedulingQueue(clock=clock)
    for i in range(10_000):
        queue.park(f"p{i}", priority=0, created=float(i))
    queue.add("new", priority=0, created=0.0)
    read: list[object] = []
    current = queue._current

    def counted(entry: tuple[float, int, str]) -> bool:
        read.append(entry)
        return current(entry)

    monkeypatch.setattr(queue, "_current", counted)
    assert queue.pop() == "new" and queue.pop() is None
    assert len(read) < 10
    clock.advance(2.0)
    queue.cluster_changed()  # all 10,000 due now: each read once as it is taken
    taken = [queue.pop() for _ in range(10_001)]
    assert taken[-1] is None and len(set(taken[:-1])) == 10_000
    assert len(read) < 2 * 10_000 + 10
