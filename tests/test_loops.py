"""Algebraic loops: nodes that trigger one another with no delay (issue 28, item 1).

A ring of triggering Inputs is warned of when the run starts; an instant past
``max_delta_cycles`` stops the run with `AlgebraicLoopError`, naming the nodes
and the instant, in simulated and real time, in one process and placed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import mujou_actors as mujou
from mujou_actors._runtime.build import Seams
from mujou_actors._runtime.loops import DEFAULT_MAX_DELTA_CYCLES, find_loops
from mujou_actors.distributed import placed
from mujou_actors.net import walk
from mujou_actors.run import _check_arguments
from tests.loops_support import Controller, Plant, make_fed_loop, make_loop
from tests.placed_support import InProcessSystem

pytestmark = pytest.mark.timeout(60)


def _placed(timer: str, max_delta_cycles: int, make: Callable[..., Any] = make_loop,
            placement: dict[str, str] | None = None) -> placed.PlacedRun:
    args = _check_arguments(Seams(), workers=1, timer=timer, duration=5.0, seed=7, state=None,
                            supervisor=None, trace=None, cuda_sync="block", stats=True,
                            stop_timeout=5.0, start_timeout=60.0,
                            max_delta_cycles=max_delta_cycles)
    return placed.start(make, placement=mujou.Placement(placement or {"plant": "p", "ctrl": "c"}),
                        args=args, inputs=None, state=None, make_system=InProcessSystem)


def test_a_loop_of_two_triggered_nodes_stops_a_simulated_run_naming_both_and_the_instant(
        workers: int) -> None:
    start = time.monotonic()

    run = mujou.run(make_loop(), timer="simulated", workers=workers, duration=1.0,
                    max_delta_cycles=100)
    with pytest.raises(mujou.AlgebraicLoopError) as info:
        run.join(timeout=30)

    err = info.value
    assert sorted(err.nodes) == ["ctrl", "plant"]
    assert (err.time_ns, err.delta) == (0, 101)
    assert "'plant'.state -> 'ctrl'.state, 'ctrl'.command -> 'plant'.command" in err.loop
    assert "t = 0 ns (0 s of the run's timer)" in str(err)
    assert isinstance(err, mujou.NodeError) and isinstance(err, RuntimeError)
    assert not run.running and time.monotonic() - start < 10


def test_a_loop_entered_later_stops_the_run_at_that_instant_in_ns_and_seconds() -> None:
    class Quiet(Plant):
        def on_start(self) -> None:
            pass  # no state until the kick: the ring starts at 30 ms

    class Kicker(mujou.Node):
        kick = mujou.Output(float)

        def on_update(self, dt: float) -> None:
            self.kick.send(1.0)

    plant, ctrl, kicker = Quiet(), Controller(), Kicker(period=0.03)
    mujou.connect(plant.state, ctrl.state)
    mujou.connect(ctrl.command, plant.command)
    mujou.connect(kicker.kick, plant.command)

    run = mujou.run({"plant": plant, "ctrl": ctrl, "kicker": kicker}, timer="simulated",
                    duration=1.0, max_delta_cycles=50)
    with pytest.raises(mujou.AlgebraicLoopError) as info:
        run.join(timeout=30)

    assert info.value.time_ns == 30_000_000
    assert "t = 30000000 ns (0.03 s of the run's timer)" in str(info.value)
    assert sorted(info.value.nodes) == ["ctrl", "plant"]
    assert run.time == pytest.approx(0.03)


def test_the_with_block_raises_the_loop_like_a_node_failure() -> None:
    with pytest.raises(mujou.AlgebraicLoopError, match="algebraic loop: nodes"):
        with mujou.run(make_loop(), timer="simulated", max_delta_cycles=20) as run:
            run.join(timeout=30)


def test_a_loop_of_two_triggered_nodes_stops_a_real_time_run_naming_both() -> None:
    start = time.monotonic()

    run = mujou.run(make_loop(), timer="realtime", duration=30.0, max_delta_cycles=200)
    with pytest.raises(mujou.AlgebraicLoopError) as info:
        run.join(timeout=30)

    assert sorted(info.value.nodes) == ["ctrl", "plant"]
    assert info.value.delta == 201 and info.value.time_ns == 0
    assert time.monotonic() - start < 10


class _Burst(mujou.Node):
    """Sends 20,000 messages in each update."""

    out = mujou.Output(float)

    def on_update(self, dt: float) -> None:
        for i in range(20_000):
            self.out.send(float(i))


class _Drain(mujou.Node):
    """Triggered: drains what came."""

    inp = mujou.Input(float, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.seen = 0

    def on_update(self, dt: float) -> None:
        self.seen += len(self.inp.drain())


class _Tick(mujou.Node):
    """Periodic: sends its tick count."""

    out = mujou.Output(float)

    def __init__(self, period: float) -> None:
        super().__init__(period=period)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.out.send(float(self.n))


class _Relay(mujou.Node):
    """Triggered: passes on what came, and counts its updates."""

    inp = mujou.Input(float)
    out = mujou.Output(float)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.updates = 0

    def on_update(self, dt: float) -> None:
        self.updates += 1
        self.out.send(self.inp.read())


def test_a_burst_of_sends_to_a_triggered_reader_in_real_time_is_no_loop() -> None:
    # The reader runs again and again at the burst's instant, on another worker,
    # while the sender is still in its update: that is not a ring.
    burst, drain = _Burst(period=0.05), _Drain()
    mujou.connect(burst.out, drain.inp)

    with mujou.run({"burst": burst, "drain": drain}, timer="realtime", workers=2,
                   duration=0.12, max_delta_cycles=2) as run:
        run.join(timeout=30)

    assert drain.seen == 40_000


@pytest.mark.parametrize("workers", [1, 3])
def test_a_real_time_loop_that_a_periodic_node_keeps_feeding_is_stopped_all_the_same(
        workers: int) -> None:
    # Each tick of the kick starts a new chain in the ring while the first one
    # goes on: an update of a may continue either, so a count of the updates
    # at one instant in a row never grew. The chain's depth grows whatever
    # the interleaving: the first one is stopped after max_delta_cycles hops.
    net = make_fed_loop(kick_period=0.001)

    run = mujou.run(net, timer="realtime", duration=30.0, stop_timeout=2, workers=workers,
                    max_delta_cycles=1000)
    with pytest.raises(mujou.AlgebraicLoopError) as info:
        run.join(timeout=30)

    err = info.value
    assert sorted(err.nodes) == ["a", "b"] and err.delta == 1001
    assert err.time_ns == 1_000_000  # the kick's first tick, which started the chain
    assert "'a'.y -> 'b'.x, 'b'.y -> 'a'.x" in err.loop
    # The chain's 1001 hops, and beside each a few updates of the later chains
    # (one at most with one worker): never the old count's tens of thousands.
    assert 1001 <= net["a"].updates + net["b"].updates <= 3 * 1001  # type: ignore


def test_a_real_time_chain_still_going_stop_timeout_after_the_end_is_cut_and_named(
        caplog) -> None:
    # A limit too high to catch the loop: its updates, due by the end, start
    # after it until stop_timeout is over, and then the run says what it cut.
    caplog.set_level(logging.WARNING, logger="mujou_actors")
    net = make_fed_loop(kick_period=0.01)

    with mujou.run(net, timer="realtime", workers=1, duration=0.05, stop_timeout=0.3,
                   max_delta_cycles=10**9) as run:
        run.join(timeout=30)

    cut = [r.getMessage() for r in caplog.records if r.getMessage().startswith("the run's end")]
    assert len(cut) == 1
    assert "triggered updates of 'a'" in cut[0] or "triggered updates of 'b'" in cut[0]
    assert "'kick'" not in cut[0] and "stop_timeout = 0.3 s" in cut[0]
    assert not run.running


@pytest.mark.parametrize("workers", [1, 2])
def test_a_fast_periodic_chain_in_real_time_is_no_loop(workers: int) -> None:
    # sensor -> filter -> controller at 1 kHz: each tick's chain is two hops deep.
    sensor, filt, ctrl = _Tick(period=0.001), _Relay(), _Relay()
    mujou.connect(sensor.out, filt.inp)
    mujou.connect(filt.out, ctrl.inp)

    with mujou.run({"sensor": sensor, "filter": filt, "ctrl": ctrl}, timer="realtime",
                   workers=workers, duration=0.2, max_delta_cycles=2) as run:
        run.join(timeout=30)

    assert ctrl.updates > 0


@pytest.mark.parametrize("timer", ["simulated", "realtime"])
def test_a_loop_across_two_groups_of_a_placed_run_raises_the_same_error(timer: str) -> None:
    run = _placed(timer, max_delta_cycles=100)

    with pytest.raises(mujou.AlgebraicLoopError) as info:
        run.join(30)

    err = info.value
    # In real time both groups find the loop, 'p' at the 101st delta cycle and 'c' one
    # crossing later, and either report may reach the host first.
    deltas = (101,) if timer == "simulated" else (101, 102)
    assert sorted(err.nodes) == ["ctrl", "plant"] and err.delta in deltas, err
    assert err.time_ns == 0 if timer == "simulated" else err.time_ns > 0  # the last crossing
    assert "'plant'.state -> 'ctrl'.state" in err.loop and "in group" in str(err)
    assert not run.running


def test_a_loop_across_groups_that_a_periodic_node_keeps_feeding_stops_a_placed_run() -> None:
    # Each crossing triggers its reader at its arrival, later than the kick's
    # tick: the update that takes both continues the deeper chain.
    run = _placed("realtime", max_delta_cycles=300, make=make_fed_loop,
                  placement={"kick": "p", "a": "p", "b": "c"})

    with pytest.raises(mujou.AlgebraicLoopError) as info:
        run.join(30)

    err = info.value
    # Both groups find the loop: 'p' at the 301st delta cycle, 'c' one crossing later (its
    # reader's update is the 302nd). In real time either report may reach the host first.
    assert sorted(err.nodes) == ["a", "b"] and err.delta in (301, 302), err
    assert f"in group '{'p' if err.delta == 301 else 'c'}'" in str(err)
    assert "'a'.y -> 'b'.x, 'b'.y -> 'a'.x" in err.loop
    assert not run.running


def test_a_loop_broken_by_a_periodic_node_is_neither_warned_of_nor_stopped(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="mujou_actors")

    with mujou.run(make_loop(plant_period=0.01), timer="simulated", duration=0.5,
                   max_delta_cycles=5) as run:
        run.join(timeout=30)

    assert run.stats().nodes["plant"].updates == 50
    assert run.stats().nodes["ctrl"].updates == 51  # on_start's state, then one per tick
    assert [r for r in caplog.records if "algebraic loop" in r.getMessage()] == []
    assert find_loops(walk(make_loop(plant_period=0.01))) == []


def test_the_start_warns_of_the_loop_naming_its_nodes_and_ports_in_order(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="mujou_actors")

    run = mujou.run(make_loop(), timer="simulated", max_delta_cycles=10)
    with pytest.raises(mujou.AlgebraicLoopError):
        run.join(timeout=30)

    warned = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING and "algebraic loop" in r.getMessage()]
    assert len(warned) == 1
    assert warned[0].startswith("algebraic loop: 'plant'.state -> 'ctrl'.state, "
                                "'ctrl'.command -> 'plant'.command trigger one another")
    assert "max_delta_cycles=10" in warned[0]


def test_a_periodic_node_with_a_triggering_input_closes_a_loop_too() -> None:
    plant, ctrl = Plant(period=0.01), Controller()
    plant.command = mujou.Input(float, trigger=True)
    mujou.connect(plant.state, ctrl.state)
    mujou.connect(ctrl.command, plant.command)

    loops = find_loops(walk({"plant": plant, "ctrl": ctrl}))

    assert loops == [(("plant", "state", "ctrl", "state"),
                      ("ctrl", "command", "plant", "command"))]


def test_a_node_that_triggers_itself_is_a_loop_and_a_chain_is_not() -> None:
    alone = Controller()
    mujou.connect(alone.command, alone.state)
    a, b, c = Controller(), Controller(), Controller()
    mujou.connect(a.command, b.state)
    mujou.connect(b.command, c.state)

    assert find_loops(walk({"alone": alone})) == [(("alone", "command", "alone", "state"),)]
    assert find_loops(walk({"a": a, "b": b, "c": c})) == []


def test_a_loop_that_settles_within_the_limit_runs_on() -> None:
    class Settling(Controller):
        """Answers the first few states only: the ring ends by itself."""

        def on_update(self, dt: float) -> None:
            if self.state.read() < 5:
                self.command.send(1.0)

    plant, ctrl = Plant(), Settling()
    mujou.connect(plant.state, ctrl.state)
    mujou.connect(ctrl.command, plant.command)

    with mujou.run({"plant": plant, "ctrl": ctrl}, timer="simulated", duration=0.1,
                   max_delta_cycles=100) as run:
        run.join(timeout=30)

    assert run.stats().nodes["plant"].updates == 5


def test_max_delta_cycles_is_checked_and_defaults_to_ten_thousand() -> None:
    with pytest.raises(ValueError, match="max_delta_cycles must be an int >= 1, got 0"):
        mujou.run(make_loop(), timer="simulated", max_delta_cycles=0)
    with pytest.raises(TypeError, match="max_delta_cycles"):
        mujou.run(make_loop(), timer="simulated", max_delta_cycles=1.5)

    assert DEFAULT_MAX_DELTA_CYCLES == 10_000


class _Stuck(mujou.Node):
    """Blocks in its first update until the test sets ``release``."""

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.release = threading.Event()

    def on_update(self, dt: float) -> None:
        self.release.wait(30)


class _Count(logging.Handler):
    """Counts the watchdog's warnings; sets ``second`` at the second one."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.times: list[float] = []
        self.messages: list[str] = []
        self.second = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "has not returned" in record.getMessage():
            self.times.append(time.monotonic())
            self.messages.append(record.getMessage())
            if len(self.messages) == 2:
                self.second.set()


@pytest.mark.parametrize("timer", ["simulated", "realtime"])
def test_a_hook_that_does_not_return_is_logged_after_stop_timeout_and_again_after_twice(
        timer: str) -> None:
    node, counter = _Stuck(), _Count()
    logger = logging.getLogger("mujou_actors")
    logger.addHandler(counter)
    try:
        start = time.monotonic()
        run = mujou.run({"stuck": node}, timer=timer, stop_timeout=0.2)

        assert counter.second.wait(20)
        node.release.set()
        run.stop()
    finally:
        node.release.set()
        logger.removeHandler(counter)

    first, second = counter.messages[:2]
    assert first.startswith("node 'stuck' has been in on_update for ")
    assert "at t = 10000000 ns (0.01 s of the run's timer, delta cycle 0)" in first
    assert "next report after 0.4 s in all" in first
    assert "next report after 0.8 s in all" in second
    assert counter.times[0] - start >= 0.2
    assert counter.times[1] - counter.times[0] >= 0.2 - 0.01


def test_a_hook_that_returns_in_time_is_never_logged(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="mujou_actors")

    with mujou.run(make_loop(plant_period=0.01), timer="realtime", duration=0.3,
                   stop_timeout=0.1) as run:
        run.join(timeout=30)

    assert [r for r in caplog.records if "has not returned" in r.getMessage()] == []
