"""The ready queue alone: earliest key first, buckets in queue order, the liveness rule."""

from __future__ import annotations

from mujou_actors._runtime.actor import Actor
from mujou_actors._runtime.calendar import Calendar
from tests.conftest import Counter


def _actors(n: int) -> list[Actor]:
    actors = [Actor(Counter(period=None), f"n{i}", i) for i in range(n)]
    return actors


def _queue(calendar: Calendar, actor: Actor, key: tuple[int, int]) -> None:
    actor.trigger_key = key
    calendar.schedule(actor)


def test_actors_come_out_earliest_key_first_and_a_bucket_whole_in_queue_order() -> None:
    cal = Calendar([])
    cal.timed_open = True
    a, b, c, d = _actors(4)
    _queue(cal, a, (20, 0))
    _queue(cal, b, (10, 1))
    _queue(cal, c, (10, 1))
    _queue(cal, d, (10, 0))

    assert cal.earliest() == (10, 0) and cal.queued == 4
    groups = cal.take(most=64, budget=None, limit_t=None)
    assert [(k, [x.path for x in g]) for k, g in groups] == [((10, 0), ["n3"])]
    groups = cal.take(most=64, budget=None, limit_t=None)
    assert [(k, [x.path for x in g]) for k, g in groups] == [((10, 1), ["n1", "n2"])]
    # Real time: later keys due by limit_t come along in the same batch.
    d.queued_key = None  # as its claim would have left it
    _queue(cal, d, (15, 0))
    groups = cal.take(most=64, budget=None, limit_t=20)
    assert [(k, [x.path for x in g]) for k, g in groups] == [((15, 0), ["n3"]),
                                                              ((20, 0), ["n0"])]
    assert cal.top() is None and cal.queued == 0


def test_an_entry_is_live_only_while_its_actor_is_queued_at_that_key_and_not_busy() -> None:
    cal = Calendar([])
    cal.timed_open = True
    a, b = _actors(2)
    _queue(cal, a, (20, 0))
    key = a.queued_key
    assert Calendar.live(a, key)
    _queue(cal, a, (10, 0))  # queued again, earlier: the (20, 0) entry is stale now
    assert not Calendar.live(a, key) and Calendar.live(a, a.queued_key)
    _queue(cal, b, (10, 0))
    b.busy = True  # claimed elsewhere meanwhile: stale too
    assert cal.top() is a
    cal.take_top()
    assert cal.top() is None  # b (busy) and a's old entry were dropped, not returned
    assert cal.queued == 0


def test_nothing_timed_is_queued_while_closed_but_control_envelopes_are() -> None:
    from mujou_actors._runtime.keys import CONTROL_KEY
    from mujou_actors._runtime.mailbox import Start

    cal = Calendar([])
    (a,) = _actors(1)
    _queue(cal, a, (10, 0))
    assert a.queued_key is None and cal.top() is None  # closed: a hold, a stop
    a.mailbox.control.append(Start())
    cal.control_pending = 1
    cal.schedule(a)
    assert a.queued_key == CONTROL_KEY and cal.top_is_control()
