"""Deadlines and budgets: ``Node(budget=, deadline=, on_miss=)``.

A hook's CPU time comes from a scripted clock put where the actor reads it
(`actor._cpu_clock`): a hook "spends" a known time, so every miss is certain.
Real time runs on a scripted timer that the hooks move, as tests/test_timers.py
does; nothing sleeps. A hook caught running past its deadline by the run's
deadline monitor blocks on an Event that the test sets once it has seen the
catch (the monitor's log line, `Seen`), after moving the scripted timer past
the deadline; only the placed run's test, whose groups run on the real clock,
sleeps, ten times its deadline.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest

import mujou_actors as mujou
from mujou_actors import DeadlineMiss
from mujou_actors._runtime import actor as actor_module
from mujou_actors._runtime.actor import Actor, DeadlineGuard, guard_deadlines
from mujou_actors._runtime.build import Seams
from mujou_actors._runtime.kernel import Kernel
from mujou_actors._runtime.overdue import DeadlineMonitor
from mujou_actors.errors import DeadlineMissError, NodeError
from tests.conftest import Collector

pytestmark = pytest.mark.timeout(60)

MS = 1_000_000  # ns


class CpuClock:
    """The CPU clock the actor reads: it moves only when a hook spends time."""

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


class RunClock:
    """A real-time run's timer that only the hooks move (see tests/test_timers.py)."""

    simulated = False

    def __init__(self, t_ns: int = 0) -> None:
        self.t_ns = t_ns

    def start(self, at_ns: int = 0) -> None:
        pass

    def now_ns(self) -> int:
        return self.t_ns


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch) -> CpuClock:
    clock = CpuClock()
    monkeypatch.setattr(actor_module, "_cpu_clock", clock)
    return clock


class Arm(mujou.Node):
    """Counts its updates and sends them; update n spends ``costs[n]`` (else 1 ms) of CPU.

    ``run_clock``: a real-time run's timer, moved by the same amount (the
    real-time tests run the actor alone: nothing is sent then).
    """

    out = mujou.Output(int)

    def __init__(self, cpu: CpuClock, costs: dict[int, float], run_clock: RunClock | None = None,
                 **kw: object) -> None:
        super().__init__(period=0.01, **kw)  # type: ignore[arg-type]
        self.cpu, self.costs, self.run_clock = cpu, costs, run_clock
        self.n = 0
        self.misses: list[DeadlineMiss] = []

    def on_update(self, dt: float) -> None:
        self.n += 1
        spent = round(self.costs.get(self.n, 0.001) * 1e9)
        self.cpu.ns += spent
        if self.run_clock is not None:
            self.run_clock.t_ns += spent
        else:
            self.out.send(self.n)

    def on_deadline_miss(self, miss: DeadlineMiss) -> None:
        self.misses.append(miss)


def _actor(node: mujou.Node, clock: RunClock) -> Actor:
    """A real-time actor of ``node``, guarded as a run guards it."""
    actor = Actor(node, "arm", 0)
    actor.schedule_first_tick(0)
    guard_deadlines(actor, clock, simulated=False)
    return actor


def _tick(actor: Actor, clock: RunClock, due_ns: int) -> None:
    """Run ``actor``'s tick due at ``due_ns``, started when due (as the dispatcher would)."""
    clock.t_ns = due_ns
    actor.stamp = (due_ns, 0)
    actor.run_update(now_ns=due_ns, due_ns=due_ns, is_tick=True)


# -- declarations ------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "error", "rule"), [
    ({"budget": -0.001}, ValueError, r"Arm: budget must be a finite number of seconds > 0"),
    ({"budget": 0}, ValueError, r"budget must be a finite number of seconds > 0"),
    ({"deadline": float("inf")}, ValueError, r"deadline must be a finite number"),
    ({"budget": "1ms"}, TypeError, r"Arm: budget must be a number of seconds or None"),
    ({"budget": True}, TypeError, r"budget must be a number of seconds"),
    ({"deadline": 0.005, "period": None}, ValueError, r"Arm: deadline needs a period"),
    ({"budget": 0.001, "on_miss": "panic"}, ValueError,
     r"Arm: on_miss must be one of 'warn', 'skip', 'safe', 'stop', got 'panic'"),
    ({"budget": 0.001, "on_miss": None}, TypeError, r"on_miss must be one of"),
    ({"on_miss": "stop"}, ValueError, r"on_miss='stop' without a budget or a deadline"),
    ({"budget": 0.001, "on_miss": "skip", "period": None}, ValueError,
     r"on_miss='skip' skips the next tick and needs a period"),
    ({"budget": 0.006, "deadline": 0.005}, ValueError,
     r"Arm: budget \(6.000 ms\) must not exceed deadline \(5.000 ms\): an update over that "
     r"budget has run past its deadline already"),
])
def test_a_bad_declaration_is_refused_naming_the_node_and_the_rule(
        kwargs: dict, error: type, rule: str) -> None:
    class Arm(mujou.Node):
        def __init__(self) -> None:
            super().__init__(**{"period": 0.01, **kwargs})

    with pytest.raises(error, match=rule):
        Arm()


def test_safe_without_an_on_deadline_miss_of_the_nodes_own_is_refused() -> None:
    class Bare(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01, budget=0.001, on_miss="safe")

    with pytest.raises(ValueError, match=r"Bare: on_miss='safe' calls the node's "
                                         r"on_deadline_miss\(self, miss\), which the class"):
        Bare()


def test_a_declaration_is_read_back_in_seconds(cpu: CpuClock) -> None:
    node = Arm(cpu, {}, budget=0.002, deadline=0.005, on_miss="skip")

    assert (node.budget, node.deadline, node.on_miss) == (0.002, 0.005, "skip")
    assert (Arm(cpu, {}).budget, Arm(cpu, {}).deadline, Arm(cpu, {}).on_miss) == (
        None, None, "warn")


def test_an_on_deadline_miss_that_its_policy_never_calls_is_warned_of(
        cpu: CpuClock, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        mujou.run({"arm": Arm(cpu, {}, budget=0.002)}, timer="simulated", duration=0.01).join(30)

    assert ("node 'arm' (Arm) defines on_deadline_miss but has on_miss='warn': it is never "
            "called") in caplog.text


def test_a_budget_equal_to_the_deadline_and_the_period_is_accepted(cpu: CpuClock) -> None:
    node = Arm(cpu, {}, budget=0.01, deadline=0.01)

    assert (node.budget, node.deadline) == (0.01, 0.01)


def test_a_deadline_or_budget_longer_than_the_period_is_warned_of_as_the_run_starts(
        cpu: CpuClock, caplog: pytest.LogCaptureFixture) -> None:
    net = {"late": Arm(cpu, {}, deadline=0.02), "heavy": Arm(cpu, {}, budget=0.015),
           "fine": Arm(cpu, {}, budget=0.01, deadline=0.01)}

    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        mujou.run(net, timer="simulated", duration=0.05).join(30)

    lines = [r.getMessage() for r in caplog.records if "longer than its period" in r.getMessage()]
    assert [line.split(":")[0] for line in lines] == ["node 'late' (Arm)", "node 'heavy' (Arm)"]
    assert lines[0].startswith("node 'late' (Arm): its deadline (20.000 ms) is longer than its "
                               "period (10.000 ms): an update may end after the next tick is due")
    assert lines[1].startswith("node 'heavy' (Arm): its budget (15.000 ms) is longer than its "
                               "period (10.000 ms)")


# -- what a node without them pays --------------------------------------------------------

def test_a_node_without_budget_or_deadline_keeps_its_plain_update(cpu: CpuClock) -> None:
    plain, guarded = Arm(cpu, {}), Arm(cpu, {}, budget=0.002)

    kernel = Kernel({"plain": plain, "guarded": guarded}, timer="simulated")

    updates = {a.path: a.update for a in kernel.actors}
    assert updates["plain"] is Arm.on_update  # the function run_due calls, as without the feature
    assert isinstance(updates["guarded"], DeadlineGuard)


# -- simulated time: counted and logged, never applied --------------------------------------

def test_misses_are_counted_in_stats_in_simulated_time(cpu: CpuClock) -> None:
    arm = Arm(cpu, {3: 0.003, 5: 0.007, 8: 0.004}, budget=0.002, deadline=0.005)

    run = mujou.run({"arm": arm}, timer="simulated", duration=0.1)
    run.join(30)

    stats = run.stats().nodes["arm"]
    assert (stats.updates, stats.budget_misses, stats.deadline_misses) == (10, 3, 1)


def test_warn_logs_the_first_miss_and_then_at_most_a_line_every_ten_seconds(
        cpu: CpuClock, caplog: pytest.LogCaptureFixture) -> None:
    arm = Arm(cpu, {2: 0.003, 4: 0.003, 6: 0.003}, budget=0.002)

    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        mujou.run({"arm": arm}, timer="simulated", duration=0.1).join(30)

    lines = [r.getMessage() for r in caplog.records if "on_update due at" in r.getMessage()]
    assert lines == ["node 'arm': on_update due at t=0.020000 s ran 3.000 ms of CPU time, "
                     "over its budget of 2.000 ms"]


@pytest.mark.parametrize("policy", ["skip", "safe", "stop"])
def test_simulated_time_counts_and_logs_a_miss_but_applies_no_policy(
        cpu: CpuClock, policy: str, caplog: pytest.LogCaptureFixture) -> None:
    arm = Arm(cpu, {3: 0.009}, deadline=0.005, on_miss=policy)
    sink = Collector()
    mujou.connect(arm.out, sink.inp)

    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        run = mujou.run({"arm": arm, "sink": sink}, timer="simulated", duration=0.1)
        run.join(30)

    assert sink.received == list(range(1, 11))  # no tick skipped, the run not stopped
    assert arm.misses == []  # on_deadline_miss is a real-time policy
    assert run.stats().nodes["arm"].deadline_misses == 1
    assert f"on_miss={policy!r} applies in real time only" in caplog.text


class Pipeline(mujou.Node):
    """Four sources of different periods feeding one collector, all with budgets."""

    def __init__(self, **limits: object) -> None:
        super().__init__(period=None)
        self.sources = [Source(period=0.001 * (i + 1), **limits) for i in range(4)]
        self.sink = Collector()
        for source in self.sources:
            mujou.connect(source.out, self.sink.inp)


class Source(mujou.Node):
    out = mujou.Output(tuple)

    def __init__(self, period: float, **limits: object) -> None:
        super().__init__(period=period, **limits)  # type: ignore[arg-type]
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.out.send((self.path, self.n, sum(range(200))))


def test_results_are_identical_for_every_worker_count_with_budgets_that_always_miss(
        workers: int) -> None:
    # 1 ns budgets and deadlines on the real CPU clock: nearly every update misses,
    # how many depends on the machine; what the net computes must not.
    plain, limited = Pipeline(), Pipeline(budget=1e-9, deadline=1e-9, on_miss="stop")

    mujou.run(plain, timer="simulated", duration=0.05, workers=1).join(30)
    run = mujou.run(limited, timer="simulated", duration=0.05, workers=workers)
    run.join(30)

    assert limited.sink.batches == plain.sink.batches
    assert len(plain.sink.received) == sum(50 // (i + 1) for i in range(4))
    assert sum(n.budget_misses for n in run.stats().nodes.values()) > 0


# -- real time: the policies --------------------------------------------------------------

def test_skip_skips_the_next_tick_after_a_missed_deadline(cpu: CpuClock) -> None:
    clock = RunClock()
    arm = Arm(cpu, {1: 0.007}, run_clock=clock, deadline=0.005, on_miss="skip")
    actor = _actor(arm, clock)

    _tick(actor, clock, 10 * MS)  # finishes 7 ms after it was due

    assert actor.next_tick_ns == 30 * MS  # the tick of 20 ms is skipped
    assert (actor.deadline_misses, actor.budget_misses) == (1, 0)
    _tick(actor, clock, 30 * MS)  # 1 ms: in time
    assert actor.next_tick_ns == 40 * MS and actor.deadline_misses == 1


def test_safe_calls_on_deadline_miss_with_what_was_missed(cpu: CpuClock) -> None:
    clock = RunClock()
    arm = Arm(cpu, {2: 0.003}, run_clock=clock, budget=0.002, deadline=0.005,
              on_miss="safe")
    actor = _actor(arm, clock)

    _tick(actor, clock, 10 * MS)
    _tick(actor, clock, 20 * MS)

    assert arm.misses == [DeadlineMiss(path="arm", due=0.02, run_time=0.003, finished=0.003,
                                       budget=0.002, deadline=0.005)]
    assert arm.misses[0].budget_missed and not arm.misses[0].deadline_missed
    assert actor.next_tick_ns == 30 * MS  # nothing skipped
    assert (actor.budget_misses, actor.deadline_misses) == (1, 0)


def test_a_deadline_counts_from_when_the_update_was_due_not_when_it_started(
        cpu: CpuClock) -> None:
    clock = RunClock()
    arm = Arm(cpu, {}, run_clock=clock, deadline=0.005, on_miss="safe")
    actor = _actor(arm, clock)
    actor.stamp = (10 * MS, 0)
    clock.t_ns = 14_500_000  # started 4.5 ms late, runs 1 ms

    actor.run_update(now_ns=clock.t_ns, due_ns=10 * MS, is_tick=True)

    assert [m.finished for m in arm.misses] == [pytest.approx(0.0055)]


def test_stop_raises_a_deadline_miss_error_naming_the_node_the_deadline_and_the_time(
        cpu: CpuClock) -> None:
    clock = RunClock()
    actor = _actor(Arm(cpu, {1: 0.0075}, run_clock=clock, deadline=0.005, on_miss="stop"),
                   clock)

    with pytest.raises(DeadlineMissError) as info:
        _tick(actor, clock, 10 * MS)

    assert str(info.value) == ("node 'arm': on_update due at t=0.010000 s finished 7.500 ms "
                               "after it was due, past its deadline of 5.000 ms "
                               "(on_miss='stop')")
    assert info.value.miss.deadline == 0.005 and actor.deadline_misses == 1


def test_stop_ends_a_real_time_run_that_join_reports_even_under_a_restarting_supervisor(
        cpu: CpuClock) -> None:
    clock = RunClock(t_ns=10 * MS)  # the first tick is due at once

    class Steady(Arm):
        def on_update(self, dt: float) -> None:
            super().on_update(dt)
            # In time, the next tick is due as this one ends; the 3rd runs 12 ms.
            clock.t_ns = max(clock.t_ns, (self.n + 1) * 10 * MS)

    arm = Steady(cpu, {3: 0.012}, run_clock=clock, budget=0.004, on_miss="stop")
    from mujou_actors.run import _start

    run = _start(
        {"arm": arm}, seams=Seams(make_timer=lambda kind: clock), duration=1.0, workers=1,
        supervisor=mujou.Supervisor("one_for_one"))

    with pytest.raises(NodeError) as info:
        run.join(30)

    assert info.value.path == "arm"
    assert isinstance(info.value.__cause__, DeadlineMissError)
    assert "ran 12.000 ms of CPU time, over its budget of 4.000 ms" in str(info.value)
    stats = run.stats().nodes["arm"]
    assert (stats.updates, stats.budget_misses, stats.restarts) == (3, 1, 0)


# -- real time: a hook still running at its deadline --------------------------------------

class Blocker(mujou.Node):
    """Its first update blocks until the test sets ``release`` (bounded: 30 s)."""

    def __init__(self, **kw: object) -> None:
        super().__init__(period=0.01, **kw)  # type: ignore[arg-type]
        self.entered, self.release = threading.Event(), threading.Event()
        self.returned = False
        self.misses: list[tuple[DeadlineMiss, bool]] = []

    def on_update(self, dt: float) -> None:
        if not self.entered.is_set():
            self.entered.set()
            self.release.wait(30)
            self.returned = True

    def on_deadline_miss(self, miss: DeadlineMiss) -> None:
        self.misses.append((miss, self.returned))


class Seen(logging.Handler):
    """Keeps the ``mujou_actors`` records that contain ``text``; ``seen`` is set at the first."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.DEBUG)
        self.text = text
        self.records: list[logging.LogRecord] = []
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.records.append(record)
            self.seen.set()


@pytest.fixture
def still_running() -> Iterator[Seen]:
    """The monitor's lines about hooks caught past their deadline (any level)."""
    handler = Seen("is still running")
    logger = logging.getLogger("mujou_actors")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@contextlib.contextmanager
def _watching(node: Blocker, clock: RunClock,
              ) -> Iterator[tuple[Actor, DeadlineMonitor, list]]:
    """A real-time actor of ``node`` guarded and watched by a started monitor of its own;
    on leaving, ``node``'s hook is released and the monitor's thread ended."""
    failed: list[tuple[Actor, str, BaseException]] = []
    monitor = DeadlineMonitor(clock, lambda *report: failed.append(report))
    actor = Actor(node, "arm", 0)
    actor.schedule_first_tick(0)
    guard_deadlines(actor, clock, simulated=False, watch=monitor.add)
    monitor.start()
    try:
        yield actor, monitor, failed
    finally:
        node.release.set()
        monitor.stop()
        monitor.join(30)


def _blocked_tick(actor: Actor, clock: RunClock, node: Blocker) -> threading.Thread:
    """Start the tick due at 10 ms on a thread of its own; return once its hook blocks."""
    thread = threading.Thread(target=_tick, args=(actor, clock, 10 * MS), daemon=True)
    thread.start()
    assert node.entered.wait(30)
    return thread


def test_a_miss_is_counted_and_logged_while_the_hook_still_runs_and_only_once(
        still_running: Seen) -> None:
    clock = RunClock()
    node = Blocker(deadline=0.005)
    with _watching(node, clock) as (actor, monitor, failed):
        hook = _blocked_tick(actor, clock, node)

        clock.t_ns = 17 * MS  # 2 ms past the deadline, the hook still blocked
        assert still_running.seen.wait(30)

        assert not node.returned and hook.is_alive()
        assert (actor.deadline_misses, actor.budget_misses) == (1, 0)
        assert [(r.levelno, r.getMessage()) for r in still_running.records] == [
            (logging.WARNING, "node 'arm': on_update due at t=0.010000 s is still running "
                              "7.000 ms after it was due, past its deadline of 5.000 ms")]
        node.release.set()
        hook.join(30)
        assert node.returned and actor.deadline_misses == 1  # not counted again as it returns
        assert len(still_running.records) == 1 and failed == []


def test_one_stall_is_one_miss_the_tick_that_catches_up_counting_from_the_tick_it_stands_for(
        still_running: Seen) -> None:
    # The tick due at 10 ms blocks until 301 ms: caught as it runs. The next tick, due at
    # 20 ms, starts at 302 ms and stands for the one due at 300 ms (28 overruns); it ends
    # at 302 ms, 2 ms after the tick it stands for: in time, not a second miss 282 ms late.
    clock = RunClock()
    node = Blocker(deadline=0.005, on_miss="safe")
    with _watching(node, clock) as (actor, monitor, _):
        hook = _blocked_tick(actor, clock, node)
        clock.t_ns = 20 * MS
        assert still_running.seen.wait(30)
        clock.t_ns = 301 * MS
        node.release.set()
        hook.join(30)
        assert actor.next_tick_ns == 20 * MS

        clock.t_ns = 302 * MS  # the late tick starts a period and more after it was due
        actor.stamp = (20 * MS, 0)
        actor.run_update(now_ns=302 * MS, due_ns=20 * MS, is_tick=True)

        assert (actor.updates, actor.overruns, actor.next_tick_ns) == (2, 28, 310 * MS)
        assert actor.deadline_misses == 1  # the stall's, caught while it ran; not the catch-up
        assert [m.due for m, _ in node.misses] == [0.01]  # `safe` called once, for the stall
        assert len(still_running.records) == 1


def test_safe_calls_on_deadline_miss_once_the_caught_hook_has_returned(
        still_running: Seen) -> None:
    clock = RunClock()
    node = Blocker(deadline=0.005, on_miss="safe")
    with _watching(node, clock) as (actor, monitor, _):
        hook = _blocked_tick(actor, clock, node)
        clock.t_ns = 16 * MS

        assert still_running.seen.wait(30)
        assert node.misses == []  # never beside the node's own hook
        assert still_running.records[0].getMessage().endswith(
            "; on_miss='safe' is applied as the hook returns (a running hook is not "
            "interrupted)")
        clock.t_ns = 19 * MS
        node.release.set()
        hook.join(30)

        (miss, after_the_hook), = node.misses
        assert after_the_hook  # the hook had returned when it was called
        assert (miss.due, miss.finished, miss.deadline, miss.running) == (0.01, 0.009, 0.005,
                                                                          False)
        assert actor.deadline_misses == 1


def test_skip_is_applied_as_the_caught_hook_returns(still_running: Seen) -> None:
    clock = RunClock()
    node = Blocker(deadline=0.005, on_miss="skip")
    with _watching(node, clock) as (actor, monitor, _):
        hook = _blocked_tick(actor, clock, node)
        clock.t_ns = 16 * MS

        assert still_running.seen.wait(30)
        assert actor.next_tick_ns == 20 * MS  # the hook runs: nothing skipped yet
        node.release.set()
        hook.join(30)

        assert actor.next_tick_ns == 30 * MS and actor.deadline_misses == 1


def test_stop_ends_a_real_time_run_while_the_hook_still_blocks(tmp_path) -> None:
    from mujou_actors.run import _start

    clock = RunClock(t_ns=10 * MS)  # the first tick is due at once
    node = Blocker(deadline=0.005, on_miss="stop")
    failed = Seen("past its deadline")
    logging.getLogger("mujou_actors").addHandler(failed)
    path = tmp_path / "trace.json"
    try:
        run = _start(
            {"arm": node}, seams=Seams(make_timer=lambda kind: clock), duration=1.0, workers=1,
            supervisor=mujou.Supervisor("one_for_one"), trace=path)
        assert node.entered.wait(30)

        clock.t_ns = 18 * MS
        assert failed.seen.wait(30)  # the run's error line: the run stops

        assert not node.returned
        assert [r.levelno for r in failed.records] == [logging.ERROR]  # no warning besides
        assert run.stats().nodes["arm"].deadline_misses == 1
        node.release.set()
        with pytest.raises(NodeError) as info:
            run.join(30)
    finally:
        node.release.set()
        logging.getLogger("mujou_actors").removeHandler(failed)

    cause = info.value.__cause__
    assert isinstance(cause, DeadlineMissError) and cause.miss.running
    assert str(cause) == ("node 'arm': on_update due at t=0.010000 s is still running 8.000 ms "
                          "after it was due, past its deadline of 5.000 ms (on_miss='stop')")
    stats = run.stats().nodes["arm"]
    assert (stats.updates, stats.deadline_misses, stats.restarts) == (1, 1, 0)
    events = json.loads(path.read_text())["traceEvents"]
    (miss,) = [e for e in events if e.get("cat") == "deadline"]
    (hook,) = [e for e in events if e.get("cat") == "hook" and e["name"] == "arm.on_update"]
    assert miss["name"] == "arm.on_update missed its deadline"
    assert miss["args"] == {"due": 0.01, "run_time": 0.0, "finished": 0.008, "budget": None,
                            "deadline": 0.005, "running": True}
    assert hook["ts"] <= miss["ts"] <= hook["ts"] + hook["dur"]  # inside the hook's slice


class Budgeted(mujou.Node):
    def __init__(self) -> None:
        super().__init__(period=0.01, budget=0.005)


@pytest.mark.parametrize(("make", "timer", "watching"), [
    (mujou.Node, "realtime", False),  # neither budget nor deadline
    (Budgeted, "realtime", False),  # a budget alone: checked as the hook returns
    (lambda: Blocker(deadline=0.005), "simulated", False),  # measured as the hook returns
    (lambda: Blocker(deadline=0.005), "realtime", True),
], ids=["plain", "budget", "simulated", "deadline"])
def test_only_a_real_time_node_with_a_deadline_starts_the_monitors_thread(
        make: Callable[[], mujou.Node], timer: str, watching: bool) -> None:
    kernel = Kernel({"n": make()}, timer=timer)

    kernel.start()
    try:
        assert kernel.dispatcher.deadlines.watching is watching
        assert ("mujou-deadlines" in {t.name for t in threading.enumerate()}) or not watching
    finally:
        kernel.stop(10)  # no update ran: the kernel's timer never started


# -- the trace ----------------------------------------------------------------------------

def test_a_miss_is_an_instant_event_of_the_trace(cpu: CpuClock, tmp_path) -> None:
    arm = Arm(cpu, {4: 0.003}, budget=0.002)
    path = tmp_path / "trace.json"

    mujou.run({"arm": arm}, timer="simulated", duration=0.05, trace=path).join(30)

    events = json.loads(path.read_text())["traceEvents"]
    misses = [e for e in events if e.get("cat") == "deadline"]
    assert [(e["ph"], e["name"]) for e in misses] == [("i", "arm.on_update missed its budget")]
    assert misses[0]["args"] == {"due": 0.04, "run_time": 0.003, "finished": 0.003,
                                 "budget": 0.002, "deadline": None}


# -- the command line's live view ----------------------------------------------------------

def test_the_live_view_names_the_nodes_that_missed_under_its_table() -> None:
    import io

    from rich.console import Console

    from mujou_actors import cli
    from mujou_actors.stats import NodeStats, RunStats

    nodes = {path: NodeStats(path, 10, 0, 0.01, 0.01, 0.0, 0.0, 0.1, budget_misses=misses,
                             deadline_misses=misses // 3)
             for path, misses in (("arm", 3), ("base", 0))}
    stats = RunStats(1.0, 1.0, nodes, {})
    console = Console(width=80, record=True, file=io.StringIO())

    console.print(cli._live_table(stats, {"arm": (10.0, 0.1), "base": (10.0, 0.1)},
                                  {"arm": 0.01, "base": 0.01}))

    assert "missed: arm budget 3 deadline 1" in console.export_text()
    assert cli._status_line(stats, {"arm": (10.0, 0.1), "base": (10.0, 0.1)}).endswith(
        "restarts=0 missed: arm budget 3 deadline 1")


# -- a placed run: the declaration travels with the node ----------------------------------

def make_placed_net() -> dict[str, mujou.Node]:
    """Built in every process of the run (here, the groups are served in this one)."""
    return {"arm": Arm(actor_module._cpu_clock, {3: 0.003, 7: 0.003}, budget=0.002),
            "base": Arm(actor_module._cpu_clock, {})}


def test_a_placed_run_counts_the_misses_of_a_node_in_its_group(cpu: CpuClock) -> None:
    from mujou_actors.distributed import placed
    from mujou_actors.run import _check_arguments
    from tests.placed_support import InProcessSystem

    args = _check_arguments(Seams(), workers=1, timer="simulated", duration=0.1, seed=7,
                            state=None, supervisor=None, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=10.0, start_timeout=60.0)
    run = placed.start(make_placed_net, placement=mujou.Placement({"arm": "a", "base": "b"}),
                       args=args, inputs=None, state=None, make_system=InProcessSystem)
    run.join(30)

    nodes = run.stats().nodes
    assert (nodes["arm"].updates, nodes["arm"].budget_misses) == (10, 2)
    assert (nodes["base"].budget_misses, nodes["base"].deadline_misses) == (0, 0)


class Sleeper(mujou.Node):
    """Its third update sleeps 50 ms, ten times its deadline (real time: a certain miss)."""

    def __init__(self) -> None:
        super().__init__(period=0.01, deadline=0.005, on_miss="stop")
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == 3:
            time.sleep(0.05)

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


def make_stopping_net() -> dict[str, mujou.Node]:
    """Built in every process of the run (here, the groups are served in this one)."""
    return {"arm": Sleeper(), "base": mujou.Node()}


def test_stop_stops_a_placed_run_under_a_supervisor_that_restarts_as_in_one_process() -> None:
    # A restarted node that is too slow would only miss again: no strategy restarts it.
    from mujou_actors.distributed import placed
    from mujou_actors.run import _check_arguments
    from tests.placed_support import InProcessSystem

    supervisor = mujou.Supervisor("one_for_one", snapshot_every=0.02)
    args = _check_arguments(Seams(), workers=1, timer="realtime", duration=2.0, seed=7,
                            state=None, supervisor=supervisor, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=10.0, start_timeout=60.0)
    run = placed.start(make_stopping_net, placement=mujou.Placement({"arm": "a", "base": "b"}),
                       args=args, inputs=None, state=None, make_system=InProcessSystem)

    with pytest.raises(NodeError, match=r"past its deadline of 5.000 ms \(on_miss='stop'\) "
                                        r"\(in group 'a'\)") as info:
        run.join(30)

    assert info.value.path == "arm"
    assert isinstance(info.value.__cause__, placed.RemoteTraceback)
    assert info.value.__cause__.type_name == "DeadlineMissError"
    stats = run.stats().nodes["arm"]
    assert stats.restarts == 0 and stats.deadline_misses >= 1
