"""The ready queue alone: earliest key first, buckets in queue order, the liveness rule."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

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


def _state(cal: Calendar, actors: list[Actor]) -> tuple[object, ...]:
    """Everything a scheduling call can change: the buckets in order, the actors' fields."""
    buckets = [(code, key, [a.path for a in bucket]) for code, (key, bucket)
               in sorted(cal._due.items())]
    fields = [(a.queued_key, a.next_tick_ns, a.trigger_key) for a in actors]
    # The bucket's shared key object (see the module's docstring), by identity.
    shared = [a.queued_key is None or any(a.queued_key is key for key, _ in cal._due.values())
              for a in actors]
    return sorted(cal._heap), buckets, fields, cal.queued, shared


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, 10, 20, 30]),      # next tick
                          st.sampled_from([None, (10, 0), (10, 1), (20, 0), (25, 2)]),  # trigger
                          st.booleans(),                                # failed
                          st.booleans()),                               # queued before at (20, 0)
                min_size=1, max_size=6),
       st.booleans(), st.booleans())
def test_requeue_leaves_the_calendar_as_schedule_does(
        setups: list[tuple[int | None, tuple[int, int] | None, bool, bool]],
        control: bool, open_: bool) -> None:
    """`Calendar.requeue` is `schedule`'s lean path: for any actor state, the same result."""
    results = []
    for method in ("schedule", "requeue"):
        cal = Calendar([])
        cal.timed_open = True
        actors = _actors(len(setups))
        for a, (_, _, _, queued) in zip(actors, setups, strict=True):
            if queued:
                _queue(cal, a, (20, 0))
                a.trigger_key = None
        cal.timed_open = open_
        cal.control_pending = int(control)
        for a, (tick, trig, failed, _) in zip(actors, setups, strict=True):
            a.next_tick_ns, a.trigger_key, a.failed = tick, trig, failed
            getattr(cal, method)(a)
        results.append(_state(cal, actors))
    assert results[0] == results[1]


_OPS = st.lists(st.one_of(
    st.tuples(st.just("finish"), st.integers(0, 3), st.sampled_from([10, 20, 30, 40])),
    st.tuples(st.just("take"), st.integers(1, 4)),
    st.tuples(st.just("stale"), st.integers(0, 3)),
    st.tuples(st.just("top"), st.just(0)),
    st.tuples(st.just("clear"), st.just(0))), max_size=40)


@settings(max_examples=300, deadline=None)
@given(_OPS)
def test_requeue_matches_schedule_whatever_leaves_the_calendar_between_calls(
        ops: list[tuple[str, int] | tuple[str, int, int]]) -> None:
    """`requeue`'s memory of its last bucket never outlives that bucket.

    The same operations on two calendars, an actor that finishes queued by
    `requeue` on one and by `schedule` on the other; in between, buckets are
    taken whole or in part (`take_bucket`, with the claim's liveness rule),
    entries go stale (an actor taken elsewhere) and are dropped (`top`), and
    the calendar is cleared (a restore): every state and every claim match.
    """
    results: list[list[object]] = []
    for method in ("schedule", "requeue"):
        cal = Calendar([])
        cal.timed_open = True
        actors = _actors(4)
        claimed: list[tuple[str, tuple[int, int]]] = []
        states: list[object] = []
        results.append(states)
        for op in ops:
            kind, arg = op[0], op[1]
            if kind == "finish":
                actor = actors[arg]
                if actor.queued_key is None:  # only an actor not queued finishes a hook
                    actor.next_tick_ns = op[2]  # type: ignore[misc]
                    getattr(cal, method)(actor)
            elif kind == "take":
                if cal.top() is not None:
                    for key, group in cal.take_bucket(arg):
                        for actor in group:
                            if Calendar.live(actor, key):  # as the claim does
                                actor.queued_key = None
                                claimed.append((actor.path, key))
            elif kind == "stale":
                actors[arg].queued_key = None
            elif kind == "top":
                cal.top()
            else:
                cal.clear()
                for actor in actors:
                    actor.queued_key = None
            states.append((_state(cal, actors), list(claimed)))
    assert results[0] == results[1]
