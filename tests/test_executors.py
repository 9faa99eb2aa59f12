"""Property tests: the lone worker's loop and the worker pool give bit-identical runs.

A simulated run with one worker and no dedicated node runs on the dispatcher's
lean loop (`Dispatcher._lone_loop`: a delta cycle's bucket taken whole, the
next delta cycle of an instant entered straight from the finished one, and,
untraced, the tick plan: each period's nodes one cohort of the calendar);
with several workers, on the general loop (`_worker_loop`). Both must end
with the same state tree, update counts, drops and restarts, for random nets
(tests/random_nets.py: periodic and triggered nodes, fan-in, fan-out, cycles
through triggered nodes, small QoS depths with drops, several messages per
hook, on_start sends), host writes, a cut in the middle, and a node that
fails once under a restarting supervisor.

``MUJOU_RANDOM_EXAMPLES`` scales the number of examples.
"""

from __future__ import annotations

import os
import tempfile
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mujou_actors as mujou
from tests import random_nets
from tests.random_nets import make_random_net
from tests.test_placed import assert_same_tree
from tests.test_placed_random import (
    SCALE,
    SETTINGS,
    _assert_same_counts,
    _examples,
    _failing_nets,
    _placed_nets,
    _single,
    _values,
)


@pytest.mark.slow
@pytest.mark.timeout(120 * max(1.0, SCALE))
@settings(max_examples=_examples(40), **SETTINGS)
@given(net=_placed_nets(), workers=st.integers(2, 4), duration_ms=st.integers(1, 30),
       seed=st.integers(0, 2**32))
def test_the_lone_loop_ends_a_random_net_as_the_worker_pool_does(
        net: tuple[dict, dict, dict], workers: int, duration_ms: int, seed: int) -> None:
    desc, _, inputs = net
    duration = duration_ms / 1000
    lone, lone_stats = _single(desc, duration, seed=seed, workers=1, inputs=inputs)
    pool, pool_stats = _single(desc, duration, seed=seed, workers=workers, inputs=inputs)
    assert_same_tree(lone, pool)
    _assert_same_counts(lone_stats, pool_stats)


@pytest.mark.slow
@pytest.mark.timeout(120 * max(1.0, SCALE))
@settings(max_examples=_examples(25), **SETTINGS)
@given(net=_placed_nets(), duration_ms=st.integers(1, 30), seed=st.integers(0, 2**32))
def test_the_tick_plan_ends_a_random_net_as_the_unplanned_lone_loop_does(
        net: tuple[dict, dict, dict], duration_ms: int, seed: int) -> None:
    """The lone loop on the tick plan (`Calendar.plan`: each period's nodes one cohort)
    and without it (a traced run keeps plain buckets) end alike; the plan is engaged
    whenever two nodes share a period and none has a thread of its own."""
    desc, _, inputs = net
    duration = duration_ms / 1000
    with mujou.run(make_random_net(**desc), timer="simulated", duration=duration, seed=seed,
                   workers=1, inputs=_values(inputs)) as run:
        dispatcher = run._coordinator.dispatcher
        periods = [a.period_ns for a in dispatcher.actors if a.period_ns is not None]
        shared = {p for p in periods if periods.count(p) >= 2}
        # A node on a dedicated thread takes the run off the lone loop, and off the plan.
        planned = not any(a.dedicated for a in dispatcher.actors)
        assert dispatcher.planned is planned
        assert {a.cohort.period for a in dispatcher.actors if a.cohort is not None} == (
            shared if planned else set())
        run.join(60)
    planned, planned_stats = run.state_dict(), run.stats()
    with tempfile.TemporaryDirectory() as tmp:
        with mujou.run(make_random_net(**desc), timer="simulated", duration=duration,
                       seed=seed, workers=1, inputs=_values(inputs),
                       trace=os.path.join(tmp, "trace.json")) as run:
            assert not run._coordinator.dispatcher.planned
            run.join(60)
    assert_same_tree(planned, run.state_dict())
    _assert_same_counts(planned_stats, run.stats())


@pytest.mark.timeout(120 * max(1.0, SCALE))
@settings(max_examples=_examples(15), **SETTINGS)
@given(net=_placed_nets(nested=False), workers=st.integers(2, 3), seed=st.integers(0, 2**32))
def test_a_cut_of_a_running_net_goes_on_alike_on_the_lone_loop_and_the_pool(
        net: tuple[dict, dict, dict], workers: int, seed: int) -> None:
    """A cut taken while the net runs (at an instant the host's timing picks, so only its
    continuation is compared), restored on each loop, ends the same."""
    desc, _, _ = net
    with mujou.run(make_random_net(**desc), timer="simulated", seed=seed, workers=1,
                   duration=0.02) as run:
        cut = run.state_dict(timeout=30)
        run.join(60)
    again = [_single(desc, 0.01, seed=seed, workers=n, state=cut) for n in (1, workers)]
    assert_same_tree(again[0][0], again[1][0])
    _assert_same_counts(again[0][1], again[1][1])


def test_host_writes_into_an_idle_triggered_net_cascade_alike_on_both_loops() -> None:
    """Writes from the host into a net of triggered nodes that is idle between them: each
    write starts a cascade of delta cycles (the lone loop enters them directly), the
    writes queued meanwhile wait their turn; the result is the same on the pool."""

    class Add(mujou.Node):
        inp = mujou.Input(int, depth=None)
        out = mujou.Output(int)

        def __init__(self) -> None:
            super().__init__(period=None)
            self.seen: list[int] = []

        def on_update(self, dt: float) -> None:
            for v in self.inp.drain():
                self.seen.append(v)
                if v < 40:
                    self.out.send(v + 10)

        def state_dict(self) -> dict:
            return {"seen": list(self.seen)}

        def load_state_dict(self, state: dict) -> None:
            self.seen = list(state["seen"])

    def net() -> mujou.Node:
        root = mujou.Node(period=None)
        root.a, root.b, root.c = Add(), Add(), Add()
        mujou.connect(root.a.out, root.b.inp)
        mujou.connect(root.b.out, root.c.inp)
        mujou.connect(root.c.out, root.a.inp)
        return root

    trees = []
    for workers in (1, 3):
        ended = threading.Semaphore(0)  # released as each cascade's last message (>= 40) comes
        with mujou.run(net(), timer="simulated", workers=workers, seed=1) as run:
            run.subscribe("b.inp", lambda v, ended=ended: ended.release() if v >= 40 else None)
            for v in (0, 1, 2):
                run.write("a.inp", v)
                assert ended.acquire(timeout=30), (workers, v)
            run.stop()
        trees.append(run.state_dict())
    assert_same_tree(trees[0], trees[1])
    seen = {p: trees[0]["nodes"][p]["seen"] for p in ("a", "b", "c")}
    assert seen == {"a": [0, 30, 1, 31, 2, 32], "b": [10, 40, 11, 41, 12, 42],
                    "c": [20, 21, 22]}


@pytest.mark.slow
@pytest.mark.timeout(120 * max(1.0, SCALE))
@settings(max_examples=_examples(15), **SETTINGS)
@given(net=_failing_nets(), strategy=st.sampled_from(["one_for_all", "one_for_one"]),
       every_us=st.sampled_from([1000, 2000, 2500]), workers=st.integers(2, 3),
       duration_ms=st.integers(5, 25), seed=st.integers(0, 2**32))
def test_a_node_that_fails_once_restarts_alike_on_the_lone_loop_and_the_pool(
        net: tuple[dict, dict], strategy: str, every_us: int, workers: int, duration_ms: int,
        seed: int) -> None:
    desc, _ = net
    duration = duration_ms / 1000
    results = []
    for n in (1, workers):
        random_nets.reset_failures()
        supervisor = mujou.Supervisor(strategy, snapshot_every=every_us / 1e6,
                                      max_restarts=10, within=1.0)
        results.append(_single(desc, duration, seed=seed, workers=n, supervisor=supervisor))
    assert_same_tree(results[0][0], results[1][0])
    _assert_same_counts(results[0][1], results[1][1])


def test_a_triggered_chain_of_one_instant_runs_its_delta_cycles_in_order() -> None:
    """The lone loop's direct path: a -> b -> c triggered within one instant, each delta
    cycle after the one before, the same on the pool."""
    seen: list[tuple[str, int]] = []

    class Hop(mujou.Node):
        inp = mujou.Input(int)
        out = mujou.Output(int)

        def __init__(self, period: float | None) -> None:
            super().__init__(period=period)

        def on_update(self, dt: float) -> None:
            got = self.inp.drain()
            seen.append((self.path, sum(got)))
            self.out.send(len(seen))

    def net() -> mujou.Node:
        root = mujou.Node(period=None)
        root.a, root.b, root.c = Hop(0.01), Hop(None), Hop(None)
        mujou.connect(root.a.out, root.b.inp)
        mujou.connect(root.b.out, root.c.inp)
        return root

    for workers in (1, 2):
        seen.clear()
        with mujou.run(net(), timer="simulated", workers=workers, duration=0.03) as run:
            run.join(30)
        assert seen == [("a", 0), ("b", 1), ("c", 2), ("a", 0), ("b", 4), ("c", 5),
                        ("a", 0), ("b", 7), ("c", 8)], workers
        assert run.stats().nodes["c"].updates == 3
