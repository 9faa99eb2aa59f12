"""The time policies decide without threads: each rule of simulated and real time alone."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mujou_actors._runtime.dispatcher import Dispatcher
from mujou_actors._runtime.keys import CONTROL_KEY
from mujou_actors._runtime.policy import RealTime, SimulatedTime, Step, make_policy
from mujou_actors.timers import SimulatedTimer

MS = 1_000_000


def advance(key, frontier=(10 * MS, 0), *, stop=False, hold=False, end=None, cut=None,
            bound=None):
    return SimulatedTime().advance(key, frontier, stop_requested=stop, hold_requested=hold,
                                   end_ns=end, cut_ns=cut, bound=bound)


def test_simulated_time_finishes_an_instant_before_anything_else() -> None:
    # More work at the same instant: the next delta cycle, whatever else is asked.
    assert advance((10 * MS, 2), stop=True, hold=True, cut=10 * MS, end=10 * MS) == (
        Step.NEXT_DELTA, (10 * MS, 2))


@pytest.mark.parametrize("kwargs, expected", [
    ({}, (Step.NEXT_INSTANT, (20 * MS, 0))),
    ({"stop": True, "hold": True, "cut": 15 * MS}, (Step.STOP, None)),
    ({"hold": True, "cut": 15 * MS}, (Step.CUT, 15 * MS)),  # the scheduled cut first
    ({"cut": 20 * MS}, (Step.NEXT_INSTANT, (20 * MS, 0))),  # the cut comes after t = 20 ms
    ({"cut": 15 * MS, "end": 12 * MS}, (Step.END, None)),  # a cut after the end: never
    ({"hold": True}, (Step.HOLD, None)),
    ({"end": 20 * MS}, (Step.NEXT_INSTANT, (20 * MS, 0))),  # due at t <= end: it runs
    ({"end": 19 * MS}, (Step.END, None)),
], ids=["next", "stop", "cut", "cut-later", "cut-after-end", "hold", "end-inclusive", "end"])
def test_simulated_time_at_an_instants_boundary(kwargs, expected) -> None:
    assert advance((20 * MS, 0), **kwargs) == expected


def test_simulated_time_with_nothing_to_do_ends_or_idles() -> None:
    assert advance(None) == (Step.IDLE, None)
    assert advance(None, end=50 * MS) == (Step.END, None)
    assert advance(None, cut=30 * MS) == (Step.CUT, 30 * MS)


def test_a_driven_kernel_pauses_at_its_bound_before_any_other_rule() -> None:
    assert advance((10 * MS, 1), bound=(10 * MS, 0), stop=True) == (Step.PAUSE, None)
    assert advance((10 * MS, 1), bound=(10 * MS, 1)) == (Step.NEXT_DELTA, (10 * MS, 1))
    assert advance(None, bound=(10 * MS, 0)) == (Step.PAUSE, None)
    assert advance((20 * MS, 0), bound=CONTROL_KEY) == (Step.PAUSE, None)


def test_real_time_starts_due_work_and_waits_for_the_rest() -> None:
    rt = RealTime()
    assert rt.start((10 * MS, 0), 10 * MS, None, 0) == (Step.START, None)
    assert rt.start((12 * MS, 0), 10 * MS, None, 0) == (Step.WAIT, 0.002)
    # After the end (or past the grace) it is at_end's to decide.
    assert rt.start((30 * MS, 0), 25 * MS, 20 * MS, 5 * MS) == (Step.AT_END, None)
    assert rt.start((21 * MS, 0), 10 * MS, 20 * MS, 5 * MS) == (Step.AT_END, None)


def test_real_time_ends_once_the_work_due_by_the_end_is_done_or_the_grace_is_over() -> None:
    rt = RealTime()
    assert rt.at_end(15 * MS, 20 * MS, 5 * MS, 0, None) == (Step.WAIT, 0.005)
    assert rt.at_end(21 * MS, 20 * MS, 5 * MS, 0, (30 * MS, 0)) == (Step.END, None)
    # A hook in flight, or work due by the end: wait, but no longer than the grace.
    assert rt.at_end(21 * MS, 20 * MS, 5 * MS, 1, None) == (Step.WAIT, 0.004)
    assert rt.at_end(21 * MS, 20 * MS, 5 * MS, 0, (19 * MS, 0)) == (Step.WAIT, 0.004)
    assert rt.at_end(25 * MS, 20 * MS, 5 * MS, 1, (19 * MS, 0)) == (Step.END, None)


def test_the_policies_trigger_keys_batches_and_deferral() -> None:
    sim, rt = make_policy(True), make_policy(False)
    # A trigger at (t, d + delta_step); in real time d counts the chain (algebraic loops).
    assert (sim.delta_step, rt.delta_step) == (1, 1)
    assert sim.first_trigger(5) == (5, 1) and rt.first_trigger(5) == (5, 0)
    assert (sim.batch_max(1), sim.batch_max(4), rt.batch_max(1), rt.batch_max(4)) == (
        1024, 64, 1024, 1)
    assert sim.defers(4, True, True) is True
    assert rt.defers(1, False, False) is True
    assert rt.defers(2, False, False) is False and rt.defers(1, True, False) is False
    assert sim.simulated and not rt.simulated  # which deliveries a hook takes
    assert sim.host_trigger(CONTROL_KEY, 99) == CONTROL_KEY
    assert sim.host_trigger((7, 2), 99) == (7, 3) and rt.host_trigger((7, 0), 99) == (99, 0)
    assert rt.control_stamp(CONTROL_KEY, 99) == CONTROL_KEY
    assert rt.control_stamp((7, 0), 99) == (99, 0) and sim.control_stamp((7, 2), 99) == (7, 2)


class _Listener:
    """A `KernelListener` that no test here calls (the dispatcher runs no thread)."""

    def hook_failed(self, actor, hook, exc) -> None:
        raise AssertionError("not called")

    reached_end = held = crashed = hook_failed


@given(stop=st.booleans(), hold=st.integers(0, 2),
       end=st.one_of(st.none(), st.integers(0, 50)), cut=st.one_of(st.none(), st.integers(0, 50)),
       t_next=st.integers(1, 60))
@settings(max_examples=300, deadline=None)
def test_the_lone_loops_instant_test_agrees_with_simulated_time_advance(
        stop: bool, hold: int, end: int | None, cut: int | None, t_next: int) -> None:
    """`Dispatcher._plain_instant` is the policy's NEXT_INSTANT, inlined: they never differ."""
    dispatcher = Dispatcher([], SimulatedTimer(), 1, _Listener())
    dispatcher._stop_requested, dispatcher._hold_requested = stop, hold
    dispatcher._end_ns, dispatcher._cut_ns = end, cut
    step, _ = SimulatedTime().advance((t_next, 0), (0, 3), stop_requested=stop,
                                      hold_requested=bool(hold), end_ns=end, cut_ns=cut,
                                      bound=None)
    assert dispatcher._plain_instant(t_next) is (step is Step.NEXT_INSTANT)
