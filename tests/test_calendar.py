"""The ready queue alone: earliest key first, buckets in queue order, the liveness rule."""

from __future__ import annotations

import pytest
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def _periodic(n: int, period_ns: int) -> list[Actor]:
    return [Actor(Counter(period=period_ns / 1e9), f"p{period_ns}_{i}", i) for i in range(n)]


def _tick(cal: Calendar, actors: list[Actor], t: int) -> None:
    """What the lone loop does with a planned instant's members: claim, run, requeue."""
    for actor in actors:
        actor.queued_key = None
        actor.next_tick_ns = t + actor.period_ns  # run_due's tick
        cal.requeue(actor)


def test_the_tick_plan_queues_each_period_as_one_cohort_and_moves_it_whole() -> None:
    cal = Calendar([])
    cal.timed_open = True
    fast, slow, alone = _periodic(3, 10), _periodic(2, 20), _periodic(1, 30)
    cohorts = cal.plan(fast + slow + alone)
    # One cohort per period with two actors or more; the lone 30 ns actor keeps a bucket.
    assert sorted((c.period, [a.path for a in c.actors]) for c in cohorts) == [
        (10, ["p10_0", "p10_1", "p10_2"]), (20, ["p20_0", "p20_1"])]
    assert alone[0].cohort is None
    for actor in fast + slow + alone:
        actor.next_tick_ns = actor.period_ns
        cal.schedule(actor)
    # The members share their cohort's key object; no bucket entry is counted for them.
    assert len({id(a.queued_key) for a in fast}) == 1 and cal.queued == 1
    seen: list[tuple[int, list[str]]] = []
    for _ in range(6):
        top = cal.top()
        assert top is not None
        key = top.queued_key
        groups = cal.take_bucket(1024)
        members = [a for k, g in groups for a in g if a.queued_key is k and not a.busy]
        assert all(k is key for k, _ in groups)
        seen.append((key[0], sorted(a.path for a in members)))
        _tick(cal, members, key[0])
    assert seen == [
        (10, ["p10_0", "p10_1", "p10_2"]),
        (20, ["p10_0", "p10_1", "p10_2", "p20_0", "p20_1"]),
        (30, ["p10_0", "p10_1", "p10_2", "p30_0"]),
        (40, ["p10_0", "p10_1", "p10_2", "p20_0", "p20_1"]),
        (50, ["p10_0", "p10_1", "p10_2"]),
        (60, ["p10_0", "p10_1", "p10_2", "p20_0", "p20_1", "p30_0"]),
    ]


def test_a_member_queued_elsewhere_is_stale_in_its_cohort_until_it_rejoins() -> None:
    cal = Calendar([])
    cal.timed_open = True
    a, b = _periodic(2, 10)
    cal.plan([a, b])
    for actor in (a, b):
        actor.next_tick_ns = 10
        cal.schedule(actor)
    cohort_key = a.queued_key
    _queue(cal, b, (5, 1))  # triggered before its tick: b leaves the cohort's entry
    assert b.queued_key == (5, 1) and b.queued_key is not cohort_key
    assert cal.take_bucket(1024) == [((5, 1), [b])]
    b.queued_key = None  # claimed; its trigger consumed; it runs and finishes
    b.trigger_key = None
    cal.requeue(b)  # back on its grid at 10: it rejoins the cohort with one write
    assert b.queued_key is cohort_key and cal.queued == 0
    groups = cal.take_bucket(1024)
    assert [[x.path for x in g if x.queued_key is k] for k, g in groups] == [["p10_0", "p10_1"]]
    assert cal.top() is None


def test_a_cohort_with_every_member_stale_leaves_and_comes_back_with_its_first_member() -> None:
    cal = Calendar([])
    cal.timed_open = True
    a, b = _periodic(2, 10)
    (cohort,) = cal.plan([a, b])
    for actor in (a, b):
        actor.next_tick_ns = 10
        cal.schedule(actor)
    a.failed = b.failed = True  # e.g. both failed: neither is queued anywhere
    a.queued_key = b.queued_key = None
    assert cal.top() is None and cohort.t == -1 and cohort.key is None
    # A restart brings b back on its grid (at 30): the cohort is queued there again.
    b.failed = False
    b.next_tick_ns = 30
    cal.schedule(b)
    assert cohort.t == 30 and b.queued_key is cohort.key and cal.earliest() == (30, 0)
    # The whole calendar forgotten (a restore): the cohort is no longer queued.
    cal.clear()
    assert cohort.t == -1 and cal.top() is None
