"""Timers: drift-free schedules, dt, overruns, delta cycles, simulated determinism."""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mujou_actors as mujou
from mujou_actors import timers as mujou_actors_timers
from mujou_actors._runtime.actor import Actor
from mujou_actors._runtime.build import Seams
from tests.conftest import Collector, Counter, Source

PR_GET_TIMERSLACK = 30  # linux/prctl.h


def test_simulated_schedule_is_exact_and_includes_the_end(workers: int) -> None:
    fast, slow = Counter(period=0.003), Counter(period=0.01)

    run = mujou.run({"fast": fast, "slow": slow}, workers=workers, timer="simulated",
                    duration=1.0)
    run.join()

    assert len(slow.dts) == 100          # t = 0.01 ... 1.0, the end included
    assert len(fast.dts) == 333          # t = 0.003 ... 0.999
    assert set(fast.dts) == {0.003} and set(slow.dts) == {0.01}
    assert run.time_ns == 1_000_000_000


def test_a_period_that_is_not_a_whole_number_of_ns_does_not_drift() -> None:
    node = Counter(period=1 / 3)

    run = mujou.run(node, timer="simulated", duration=100.0)
    run.join()

    # period_ns = 333333333: tick k is due at exactly k * period_ns.
    assert len(node.dts) == 300
    assert run.stats().nodes[""].overruns == 0


def test_simulated_time_jumps_to_the_end_when_nothing_is_due() -> None:
    idle = Collector()

    run = mujou.run(idle, timer="simulated", duration=3600.0)
    run.join(timeout=10)

    assert run.time == 3600.0 and idle.batches == []


def test_overrun_skips_missed_ticks_and_counts_them() -> None:
    node = Counter(period=0.01)
    actor = Actor(node, "", 0)
    actor.schedule_first_tick(0)

    # Due at 10 ms, starts at 47 ms: ticks 20, 30 and 40 ms are missed.
    actor.run_update(now_ns=47_000_000, due_ns=10_000_000, is_tick=True)

    assert actor.overruns == 3
    assert actor.next_tick_ns == 50_000_000   # one tick later, no burst
    assert node.dts == [0.047]
    assert actor.lateness_samples() == [7_000_000]  # measured from the tick it stands for


def test_a_late_tick_within_one_period_is_not_an_overrun() -> None:
    actor = Actor(Counter(period=0.01), "", 0)
    actor.schedule_first_tick(0)

    actor.run_update(now_ns=19_999_999, due_ns=10_000_000, is_tick=True)

    assert actor.overruns == 0 and actor.next_tick_ns == 20_000_000


def test_realtime_overrun_never_runs_a_burst() -> None:
    class Stall(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.005)
            self.dts: list[float] = []

        def on_update(self, dt: float) -> None:
            self.dts.append(dt)
            if len(self.dts) == 2:
                import threading
                threading.Event().wait(0.05)  # stall for ten periods

    node = Stall()

    run = mujou.run(node, duration=0.15)
    run.join()
    stats = run.stats().nodes[""]
    ticks = _assert_on_the_grid(node.dts, 5_000_000, 150_000_000, stats)

    # The stall made the third update stand for the latest tick due by its start and
    # skip the ten before it, counted: no burst of back-to-back updates for them.
    assert ticks[2] - ticks[1] - 1 >= 9


def _assert_on_the_grid(dts: list[float], period_ns: int, end_ns: int,
                        stats: mujou.NodeStats) -> list[int]:
    """What the real-time timer promises a periodic node, whatever the machine's load.

    Update j started at the sum of the first j ``dt``s (ns of the run's timer:
    ``dt`` is ``gap / 1e9``, so rounding gives the gap back exactly). A tick
    starts in ``[k * period, (k + 1) * period)`` of the tick k it stands for
    (never before it is due; a period or more late, it stands for a later
    one), so k is its start in whole periods, but after the end, where it
    stands for the last tick due (docs/run.md, "Statistics").

    Returns:
        list[int]: the tick each update stood for.
    """
    starts = list(itertools.accumulate(round(dt * 1e9) for dt in dts))
    ticks = [min(start // period_ns, end_ns // period_ns) for start in starts]
    due = end_ns // period_ns
    assert ticks[0] >= 1  # the first tick is due a full period after the start
    assert all(b > a for a, b in itertools.pairwise(ticks))  # one update per tick, no burst
    # Every tick due ran or was counted as skipped: due times stay on the grid k * period
    # (a schedule drifting by each update's lateness would lose ticks)...
    assert ticks[-1] == due and stats.updates + stats.overruns == due
    # ...and the skipped ones are the ticks between two updates, no others.
    assert stats.overruns == sum(b - a - 1 for a, b in itertools.pairwise([0, *ticks]))
    assert stats.updates == len(ticks)
    # So the mean dt is the period or more: the last start is at its tick or later. How
    # close to the period it stays depends on the machine's load: that figure is
    # benchmarks/run.py's "timer" (lateness, period error, missed ticks).
    assert stats.dt_mean >= period_ns / 1e9 - 1e-12
    return ticks


def test_realtime_ticks_stay_on_the_grid_of_the_period() -> None:
    node = Counter(period=0.002)

    run = mujou.run(node, duration=0.5)
    run.join()

    _assert_on_the_grid(node.dts, 2_000_000, 500_000_000, run.stats().nodes[""])


class Chain(mujou.Node):
    """A periodic source feeding a triggered relay, feeding a triggered sink,
    plus a periodic reader of the source at the same rate."""

    def __init__(self) -> None:
        super().__init__(period=None)
        self.src = Source(period=0.01)
        self.relay = Relay()
        self.sink = Collector()
        self.polled = Poller()
        mujou.connect(self.src.out, self.relay.inp)
        mujou.connect(self.relay.out, self.sink.inp)
        mujou.connect(self.src.out, self.polled.inp)


class Relay(mujou.Node):
    inp = mujou.Input(int, depth=None)
    out = mujou.Output(int)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.dts: list[float] = []

    def on_update(self, dt: float) -> None:
        self.dts.append(dt)
        for m in self.inp.drain():
            self.out.send(m * 10)


class Poller(mujou.Node):
    inp = mujou.Input(int)

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.seen: list[int | None] = []

    def on_update(self, dt: float) -> None:
        self.seen.append(self.inp.read())


def test_delta_cycles_run_triggered_readers_at_the_same_time(workers: int) -> None:
    net = Chain()

    mujou.run(net, workers=workers, timer="simulated", duration=0.05).join()

    # The triggered chain runs within the same instant as the source ...
    assert net.sink.batches == [[10], [20], [30], [40], [50]]
    assert net.relay.dts == [0.01] * 5
    # ... while a periodic reader at the same time sees the previous tick's message.
    assert net.polled.seen == [None, 1, 2, 3, 4]


def test_several_messages_before_a_triggered_update_give_one_update(workers: int) -> None:
    class FanIn(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.sources = [Source(period=0.01) for _ in range(3)]
            self.sink = Collector()
            for s in self.sources:
                mujou.connect(s.out, self.sink.inp)

    net = FanIn()

    mujou.run(net, workers=workers, timer="simulated", duration=0.03).join()

    # One update per instant, draining the three messages in sender order.
    assert net.sink.batches == [[1, 1, 1], [2, 2, 2], [3, 3, 3]]


class Noisy(mujou.Node):
    out = mujou.Output(torch.Tensor, shape=(4,))

    def __init__(self, period: float) -> None:
        super().__init__(period=period)

    def on_update(self, dt: float) -> None:
        self.out.send(torch.randn(4, generator=self.generator) * dt)


class Mixer(mujou.Node):
    inp = mujou.Input(torch.Tensor, depth=3)
    out = mujou.Output(torch.Tensor, shape=(4,))

    def __init__(self, period: float | None) -> None:
        super().__init__(period=period)
        self.acc = torch.zeros(4)

    def on_update(self, dt: float) -> None:
        for m in self.inp.drain():
            self.acc = self.acc * 0.5 + m + torch.rand(4, generator=self.generator)
        self.out.send(self.acc)


class Log(mujou.Node):
    inp = mujou.Input(torch.Tensor, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.digest = hashlib.sha256()
        self.count = 0

    def on_update(self, dt: float) -> None:
        for m in self.inp.drain():
            self.digest.update(m.numpy().tobytes())
            self.count += 1


def _random_net(periods: list[float], mixer_periods: list[float | None],
                edges: list[tuple[int, int]]) -> tuple[dict[str, mujou.Node], Log]:
    nodes: dict[str, mujou.Node] = {}
    sources = [Noisy(p) for p in periods]
    mixers = [Mixer(p) for p in mixer_periods]
    log = Log()
    for i, s in enumerate(sources):
        nodes[f"s{i}"] = s
    for j, m in enumerate(mixers):
        nodes[f"m{j}"] = m
        mujou.connect(m.out, log.inp)
    for i, j in sorted({(i % len(sources), j % len(mixers)) for i, j in edges}):
        mujou.connect(sources[i].out, mixers[j].inp)
    nodes["log"] = log
    return nodes, log


def _fingerprint(periods, mixer_periods, edges, workers: int, seed: int) -> tuple[str, int]:
    nodes, log = _random_net(periods, mixer_periods, edges)
    run = mujou.run(nodes, workers=workers, timer="simulated", duration=0.05, seed=seed)
    run.join()
    return log.digest.hexdigest(), log.count


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    periods=st.lists(st.sampled_from([0.001, 0.002, 0.003, 0.005]), min_size=1, max_size=4),
    mixer_periods=st.lists(st.sampled_from([None, 0.002, 0.004]), min_size=1, max_size=3),
    edges=st.sets(st.tuples(st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=6),
    seed=st.integers(0, 2**32),
)
def test_simulated_runs_are_bit_identical_for_any_worker_count(
        periods, mixer_periods, edges, seed) -> None:
    edges = sorted(edges)

    one = _fingerprint(periods, mixer_periods, edges, workers=1, seed=seed)
    three = _fingerprint(periods, mixer_periods, edges, workers=3, seed=seed)
    again = _fingerprint(periods, mixer_periods, edges, workers=1, seed=seed)

    assert one == three == again
    assert one[1] > 0


def test_a_different_run_seed_gives_different_messages() -> None:
    args = ([0.001, 0.002], [None], [(0, 0), (1, 0)])

    assert _fingerprint(*args, workers=1, seed=1) != _fingerprint(*args, workers=1, seed=2)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl timer slack is Linux's")
@pytest.mark.parametrize("timer, dedicated, expected", [
    ("realtime", False, 1), ("realtime", True, 1), ("simulated", False, None)])
def test_realtime_threads_ask_for_tight_timer_slack(timer: str, dedicated: bool,
                                                    expected: int | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    default = libc.prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)
    seen: list[int] = []

    class Probe(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01, dedicated_thread=dedicated)

        def on_update(self, dt: float) -> None:
            seen.append(libc.prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0))

    mujou.run(Probe(), timer=timer, duration=0.02).join()

    assert seen and set(seen) == {default if expected is None else expected}
    assert libc.prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == default  # the host's is untouched


def test_lateness_samples_keep_the_newest_in_order_when_the_ring_wraps() -> None:
    from mujou_actors._runtime.actor import LATENESS_SAMPLES

    actor = Actor(Counter(period=0.01), "", 0)
    actor.schedule_first_tick(0)
    n = LATENESS_SAMPLES + 10
    for k in range(1, n + 1):  # tick k is due at k * 10 ms and starts k us late
        actor.run_update(now_ns=k * 10_000_000 + k * 1_000, due_ns=k * 10_000_000, is_tick=True)

    samples = actor.lateness_samples()

    assert samples == [float(k * 1_000) for k in range(n - LATENESS_SAMPLES + 1, n + 1)]


class _ScriptedClock(mujou_actors_timers.Timer):
    """A real-time timer whose time moves only when a hook moves it (deterministic)."""

    simulated = False

    def __init__(self, first_ns: int) -> None:
        self.t_ns = first_ns

    def start(self, at_ns: int = 0) -> None:
        pass

    def now_ns(self) -> int:
        return self.t_ns


def test_a_tick_starting_after_the_realtime_end_stands_for_the_last_tick_due(
        monkeypatch) -> None:
    period = 10_000_000
    clock = _ScriptedClock(first_ns=period)  # the first tick is due at once

    class Late(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=period / 1e9)
            self.n = 0

        def on_update(self, dt: float) -> None:
            self.n += 1
            # Each tick starts when due, but the 10th (due at the end, 100 ms)
            # only 12 ms after it, past the tick of 110 ms that is not due.
            late = 12_000_000 if self.n == 9 else 0
            clock.t_ns = max(clock.t_ns, (self.n + 1) * period + late)

    seams = Seams(make_timer=lambda kind: clock)
    node = Late()

    run = sys.modules["mujou_actors.run"]._start(node, seams=seams, duration=0.1, workers=1)
    run.join(timeout=30)
    stats = run.stats().nodes[""]

    assert (stats.updates, stats.overruns) == (10, 0)  # the 10 ticks due by the end
    assert stats.lateness_p99 == pytest.approx(0.012)  # from the 100 ms tick it ran for


def test_a_late_tick_is_never_counted_past_the_end_of_the_run() -> None:
    actor = Actor(Counter(period=0.01), "", 0)
    actor.schedule_first_tick(0)

    # Due at 100 ms (the end), starts at 127 ms: the ticks of 110 and 120 ms are not due.
    actor.run_update(now_ns=127_000_000, due_ns=100_000_000, is_tick=True,
                     end_ns=100_000_000)

    assert actor.overruns == 0 and actor.updates == 1
    assert actor.lateness_samples() == [27_000_000]
    # Another, due at 80 ms, starts at 127 ms: it stands for the 100 ms tick,
    # those of 80 and 90 ms are skipped.
    other = Actor(Counter(period=0.01), "", 0)
    other.schedule_first_tick(0)
    other.run_update(now_ns=127_000_000, due_ns=80_000_000, is_tick=True,
                     end_ns=100_000_000)

    assert other.overruns == 2 and other.lateness_samples() == [27_000_000]
    assert other.next_tick_ns == 110_000_000


class _Quiet:
    """A dispatcher's listener that expects nothing to happen (see KernelListener)."""

    def hook_failed(self, actor: object, hook: str, exc: BaseException) -> None:
        raise AssertionError(f"{hook} failed: {exc!r}")

    def reached_end(self) -> None:
        pass

    def held(self) -> None:
        pass

    def crashed(self, exc: BaseException) -> None:
        raise AssertionError(f"crashed: {exc!r}")


def test_a_trigger_claimed_after_the_realtime_end_takes_no_tick_that_is_not_due() -> None:
    from mujou_actors._runtime.dispatcher import Dispatcher

    actor = Actor(Counter(period=0.01), "", 0)
    dispatcher = Dispatcher([actor], _ScriptedClock(0), 1, _Quiet())
    dispatcher.set_end(100_000_000, 10_000_000_000)
    key = (95_000_000, 0)  # a message sent at 95 ms triggers it
    actor.next_tick_ns, actor.trigger_key, actor.queued_key = 110_000_000, key, key

    claims = dispatcher._claim([(key, [actor])], 112_000_000, "w")

    # A triggered update due at 95 ms; the 110 ms tick (after the end) is not consumed.
    assert claims == [(actor, 112_000_000, 95_000_000, False, key)]
    assert actor.next_tick_ns == 110_000_000
