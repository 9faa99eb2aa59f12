"""The worker pool: counts, names, serial hooks, contexts, dedicated threads."""

from __future__ import annotations

import contextvars
import itertools
import threading
import time
from typing import Any

import pytest
import torch

import mujou_actors as mujou
from mujou_actors._runtime import dispatcher, workers
from mujou_actors._runtime.mailbox import Snapshot
from tests.conftest import Counter, Tick

TAG: contextvars.ContextVar[str] = contextvars.ContextVar("TAG", default="unset")


@pytest.mark.parametrize(
    "cpus, gil, pool, expected",
    [
        (8, True, 100, 4),    # half the CPUs while the GIL is enabled
        (8, False, 100, 8),   # all of them without it
        (8, True, 3, 3),      # never more than the nodes on the workers
        (1, True, 10, 1),     # at least one
        (3, True, 10, 1),
        (16, False, 0, 1),    # only dedicated nodes: still one worker
    ],
)
def test_default_worker_count_rules(cpus: int, gil: bool, pool: int, expected: int) -> None:
    assert workers.default_workers(pool, cpus=cpus, gil=gil) == expected


def test_usable_cpus_follows_affinity() -> None:
    import os

    assert 1 <= workers.usable_cpus() <= len(os.sched_getaffinity(0))


def test_cgroup_v2_quota_is_read(tmp_path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    (tmp_path / "unlimited").mkdir()
    (tmp_path / "unlimited" / "cpu.max").write_text("max 100000\n")

    assert workers._read_cpu_max(str(tmp_path / "cpu.max")) == 1.5
    assert workers._read_cpu_max(str(tmp_path / "unlimited" / "cpu.max")) is None
    assert workers._read_cpu_max(str(tmp_path / "missing")) is None


def test_cgroup_v1_quota_is_read(tmp_path) -> None:
    (tmp_path / "cpu.cfs_quota_us").write_text("250000\n")
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")

    assert workers._read_cfs(str(tmp_path)) == 2.5


def test_explicit_workers_start_exactly_that_many_named_threads() -> None:
    seen: set[str] = set()
    barrier = threading.Barrier(3)

    class Meet(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01)

        def on_update(self, dt: float) -> None:
            # Three nodes due at once on three workers meet here: proof they
            # run in parallel on distinct threads.
            barrier.wait(timeout=5)
            seen.add(threading.current_thread().name)

    nodes = [Meet(), Meet(), Meet()]

    run = mujou.run(nodes, workers=3, timer="simulated", duration=0.01)
    names = {t.name for t in threading.enumerate() if t.name.startswith("mujou-worker-")}
    run.join()

    assert names == {"mujou-worker-0", "mujou-worker-1", "mujou-worker-2"}
    assert seen == names


def test_hooks_of_one_node_never_overlap_and_see_previous_writes(workers: int) -> None:
    class Shared(mujou.Node):
        inp = mujou.Input(int, depth=None)

        def __init__(self) -> None:
            super().__init__(period=None)
            self.inside = False
            self.overlaps = 0
            self.count = 0

        def on_update(self, dt: float) -> None:
            if self.inside:
                self.overlaps += 1
            self.inside = True
            torch.ones(64, 64) @ torch.ones(64, 64)  # releases the GIL
            self.count += len(self.inp.drain())
            self.inside = False

    class Sender(mujou.Node):
        out = mujou.Output(int)

        def __init__(self, period: float) -> None:
            super().__init__(period=period)

        def on_update(self, dt: float) -> None:
            self.out.send(1)

    class Net(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.target = Shared()
            self.senders = [Sender(0.001 * (1 + i % 3)) for i in range(8)]
            for s in self.senders:
                mujou.connect(s.out, self.target.inp)

    net = Net()

    run = mujou.run(net, workers=workers, timer="realtime", duration=0.2)
    run.join()
    sent = sum(run.stats().nodes[f"senders.{i}"].updates for i in range(8))

    assert net.target.overlaps == 0
    # Every message sent before the end was counted by a hook; the ones sent
    # in the last instant may still be in the mailbox.
    assert sent - 8 <= net.target.count <= sent


def test_each_node_has_its_own_empty_context() -> None:
    TAG.set("host")

    class Tagger(mujou.Node):
        def __init__(self, tag: str) -> None:
            super().__init__(period=0.01)
            self.tag = tag
            self.seen: list[str] = []

        def on_start(self) -> None:
            self.seen.append(TAG.get())
            TAG.set(self.tag)

        def on_update(self, dt: float) -> None:
            self.seen.append(TAG.get())

    a, b = Tagger("a"), Tagger("b")

    mujou.run([a, b], workers=1, timer="simulated", duration=0.03).join()

    assert a.seen == ["unset", "a", "a", "a"]
    assert b.seen == ["unset", "b", "b", "b"]
    assert TAG.get() == "host"


def test_dedicated_node_runs_every_hook_on_its_own_named_thread() -> None:
    class Camera(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01, dedicated_thread=True)
            self.threads: list[tuple[str, str]] = []

        def on_start(self) -> None:
            self.threads.append(("on_start", threading.current_thread().name))

        def on_update(self, dt: float) -> None:
            self.threads.append(("on_update", threading.current_thread().name))

        def on_stop(self) -> None:
            self.threads.append(("on_stop", threading.current_thread().name))

    class Rig(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.camera = Camera()
            self.tick = Counter()

    rig = Rig()

    mujou.run(rig, workers=1, timer="simulated", duration=0.02).join()

    assert rig.camera.threads == [
        ("on_start", "mujou-node-camera"),
        ("on_update", "mujou-node-camera"),
        ("on_update", "mujou-node-camera"),
        ("on_stop", "mujou-node-camera"),
    ]
    assert len(rig.tick.dts) == 2


def test_a_blocking_dedicated_node_does_not_hold_the_workers() -> None:
    release = threading.Event()
    ticks_while_blocked = []

    class Blocker(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.005, dedicated_thread=True)

        def on_update(self, dt: float) -> None:
            release.wait(timeout=5)

    class Watch(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.002)
            self.n = 0

        def on_update(self, dt: float) -> None:
            self.n += 1
            if self.n == 20:
                ticks_while_blocked.append(self.n)
                release.set()

    watch = Watch()

    run = mujou.run({"blocker": Blocker(), "watch": watch}, workers=1, duration=0.2)
    run.join()

    # The worker kept ticking (20 updates = 40 ms) while the dedicated thread waited.
    assert ticks_while_blocked == [20]
    assert run.stats().nodes["watch"].updates >= 20


# ---------------------------------------------------------------------------
# Batches: a worker claims every node that may start with the first


@pytest.mark.parametrize("blocker", ["a", "c", "d"])  # first, middle, last of the batch
def test_a_stuck_hook_does_not_hold_the_rest_of_its_batch_from_stopping(blocker: str) -> None:
    entered, release = threading.Event(), threading.Event()

    class Peer(mujou.Node):
        """Nodes due together on one worker: one blocks in its third update."""

        def __init__(self, name: str) -> None:
            super().__init__(period=0.01)
            self.name, self.updates, self.stopped = name, 0, False

        def on_update(self, dt: float) -> None:
            self.updates += 1
            if self.name == blocker and self.updates == 3:
                entered.set()
                release.wait(30)

        def on_stop(self) -> None:
            self.stopped = True

    peers = {name: Peer(name) for name in ("a", "b", "c", "d")}
    run = mujou.run(peers, workers=1, stop_timeout=0.3)
    try:
        assert entered.wait(5)
        run.stop()
        with pytest.raises(mujou.StopTimeoutError) as info:
            run.join()
    finally:
        release.set()

    # Batch-mates that had run were finished, those not started were handed
    # back: only the stuck node is reported, every other on_stop ran.
    assert info.value.stuck == {blocker: "on_update"}
    assert {n for n, p in peers.items() if p.stopped} == set(peers) - {blocker}
    assert all(p.updates in (2, 3) for p in peers.values())


def test_in_real_time_a_blocked_hook_holds_only_its_own_worker() -> None:
    blocked, release, progressed = threading.Event(), threading.Event(), threading.Event()
    after: dict[int, int] = {}  # fast node -> updates since the slow one blocked

    class Sometimes(mujou.Node):
        def __init__(self, i: int, blocks: bool) -> None:
            super().__init__(period=0.005)
            self.i, self.blocks, self.updates = i, blocks, 0

        def on_update(self, dt: float) -> None:
            self.updates += 1
            if self.blocks and self.updates == 3:  # fast so far, then stuck
                blocked.set()
                release.wait(30)
            elif not self.blocks and blocked.is_set():
                after[self.i] = after.get(self.i, 0) + 1
                if len(after) == 5 and min(after.values()) >= 20:
                    progressed.set()

    slow, fast = Sometimes(-1, True), [Sometimes(i, False) for i in range(5)]
    run = mujou.run([slow, *fast], workers=2)
    try:
        assert blocked.wait(5)
        # The other worker keeps every other node on its schedule meanwhile.
        assert progressed.wait(5), f"updates since the block: {after}"
    finally:
        release.set()
        run.stop()
        run.join()


def test_slow_hooks_due_together_spread_over_the_workers() -> None:
    barrier = threading.Barrier(2)
    met: list[int] = []

    class Slow(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01)
            self.n = 0

        def on_update(self, dt: float) -> None:
            self.n += 1
            if self.n < 3:
                time.sleep(0.002)  # known to take ~2 ms: over a batch's budget
            else:
                barrier.wait(timeout=5)  # only passes if both run at once
                met.append(self.n)

    run = mujou.run([Slow(), Slow()], workers=2, timer="simulated", duration=0.03)
    run.join()

    assert met == [3, 3]


def test_fast_hooks_due_together_run_as_one_batch_in_net_order() -> None:
    order: list[int] = []

    class Fast(mujou.Node):
        def __init__(self, i: int) -> None:
            super().__init__(period=0.01)
            self.i = i

        def on_update(self, dt: float) -> None:
            order.append(self.i)

    run = mujou.run([Fast(i) for i in range(10)], workers=1, timer="simulated",
                    duration=0.03)
    run.join()

    assert order == list(range(10)) * 3


class TwoOut(mujou.Node):
    """Each update sends its count on ``a``, ``b``, ``a``: three messages of one stamp."""

    a = mujou.Output(int)
    b = mujou.Output(int)

    def __init__(self, base: int) -> None:
        super().__init__(period=0.01)
        self.base, self.n = base, 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        k = self.base + 10 * self.n
        self.a.send(k)
        self.b.send(k + 1)
        self.a.send(k + 2)


def test_messages_of_one_hook_arrive_in_send_order_whatever_the_workers(workers) -> None:
    # A delivery carries no sequence number: within one stamp (one hook of one
    # sender), send order is arrival order, and the sort by stamp is stable.
    class Both(mujou.Node):
        inp = mujou.Input(int, depth=None)

        def __init__(self) -> None:
            super().__init__(period=0.02)
            self.seen: list[list[int]] = []

        def on_update(self, dt: float) -> None:
            self.seen.append(self.inp.drain())

    first, second, rx = TwoOut(1000), TwoOut(2000), Both()
    for src in (second, first):  # connected out of net order on purpose
        mujou.connect(src.a, rx.inp)
        mujou.connect(src.b, rx.inp)

    mujou.run([first, second, rx], timer="simulated", duration=0.04, workers=workers).join()

    # Sent at t = 0.01 and 0.02 (delivered at 0.02), 0.03 (at 0.04); 0.04's sends
    # come after rx's update at 0.04. Sender order, then each hook's send order.
    assert rx.seen == [
        [1010, 1011, 1012, 2010, 2011, 2012],
        [1020, 1021, 1022, 2020, 2021, 2022, 1030, 1031, 1032, 2030, 2031, 2032],
    ]


class _Hop(mujou.Node):
    """Triggered: logs ``(dt, messages, side)`` and passes each message one hop on."""

    inp = mujou.Input(tuple, depth=None)
    side = mujou.Input(tuple, depth=1, trigger=False)
    out = mujou.Output(tuple)

    def __init__(self, period: float | None = None, dedicated: bool = False) -> None:
        super().__init__(period=period, dedicated_thread=dedicated)
        self.seen: list[tuple[float, list[tuple], tuple | None]] = []

    def on_update(self, dt: float) -> None:
        got = self.inp.drain()
        self.seen.append((dt, got, self.side.read()))
        for i, n in got:
            self.out.send((i + 1, n))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers, dedicated, traced", [
    (1, False, False), (1, False, True), (1, True, False), (2, False, False), (3, True, True)],
    ids=["1", "1+trace", "1+dedicated", "2", "3+dedicated+trace"])
def test_crowded_instants_and_deep_delta_chains_give_exact_results_for_any_workers(
        workers: int, dedicated: bool, traced: bool, tmp_path) -> None:
    # More ticks due together than one worker's batch holds (1024; 64 with
    # several), a chain of triggered hops six delta cycles deep (a dedicated
    # one in it), a periodic reader of a tick of its own instant (the
    # delivery may be in its mailbox already, sent at its own key: kept for
    # the next instant) and a fan-in of every tick: the messages, dt and
    # the statistics are exact (lateness 0), whatever the workers, threads
    # and tracing.
    n = 1030
    ticks = [Tick(i) for i in range(n)]
    hops = [_Hop(dedicated=dedicated and j == 2) for j in range(6)]
    late, fan = _Hop(period=0.001), _Hop()
    mujou.connect(ticks[0].out, hops[0].inp)
    for a, b in itertools.pairwise(hops):
        mujou.connect(a.out, b.inp)
    for hop in hops:
        mujou.connect(ticks[-1].out, hop.side)  # sent at (t, 0): seen at every hop of t
    mujou.connect(ticks[5].out, late.side)
    for tick in ticks:
        mujou.connect(tick.out, fan.inp)

    run = mujou.run([*ticks, *hops, late, fan], workers=workers, timer="simulated",
                    duration=0.003, trace=tmp_path / "trace.json" if traced else None)
    run.join(timeout=30)

    instants = (1, 2, 3)
    for j, hop in enumerate(hops):  # at (t, j + 1)
        assert hop.seen == [(0.001, [(j, k)], (n - 1, k)) for k in instants]
    assert late.seen == [(0.001, [], None), (0.001, [], (5, 1)), (0.001, [], (5, 2))]
    assert fan.seen == [(0.001, [(i, k) for i in range(n)], None) for k in instants]
    assert all(tick.n == 3 for tick in ticks)
    stats = run.stats()
    assert len(stats.nodes) == n + 8
    for s in stats.nodes.values():
        assert (s.updates, s.overruns, s.dt_mean, s.dt_max, s.lateness_p50,
                s.lateness_p99) == (3, 0, 0.001, 0.001, 0.0, 0.0), s.path
        assert not any(s.drops.values()), s.path


class _FailsAt(mujou.Node):
    """Raises in its ``n``-th update."""

    def __init__(self, n: int) -> None:
        super().__init__(period=0.01)
        self.n, self.k = n, 0

    def on_update(self, dt: float) -> None:
        self.k += 1
        if self.k == self.n:
            raise RuntimeError("boom")


# Outside the nodes, so that a restore does not reset them: updates so far,
# failures still to raise.
_FAILURES = {"n": 0, "left": 0}


class _FailsSome(mujou.Node):
    """Raises in every 5th update while ``_FAILURES["left"]`` allows."""

    def __init__(self) -> None:
        super().__init__(period=0.01)

    def on_update(self, dt: float) -> None:
        _FAILURES["n"] += 1
        if _FAILURES["n"] % 5 == 0 and _FAILURES["left"] > 0:
            _FAILURES["left"] -= 1
            raise RuntimeError("boom")


def _hook_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every update take exactly 1 µs and every other hook exactly 1 ms.

    The hooks themselves move the time that the actor's clock reads: asking
    the clock's caller (a frame named ``call``) would not work in the
    compiled build, whose functions have no Python frames.
    """
    from mujou_actors._runtime import actor as actor_module

    now = [0]

    def spending(fn: Any, ns: int) -> Any:
        def hook(*args: Any) -> Any:
            now[0] += ns
            return fn(*args)
        return hook

    for cls in (Counter, _FailsAt, _FailsSome):
        monkeypatch.setattr(cls, "on_update", spending(cls.on_update, 1000))
    for name in ("on_start", "on_stop"):
        monkeypatch.setattr(mujou.Node, name, spending(getattr(mujou.Node, name), 1_000_000))
    monkeypatch.setattr(actor_module, "_clock", lambda: now[0])


@pytest.mark.parametrize("failing", [False, True])
def test_a_workers_busy_time_is_the_sum_of_the_hook_times_it_ran(
        monkeypatch: pytest.MonkeyPatch, failing: bool) -> None:
    _hook_clock(monkeypatch)
    nodes = [Counter(period=0.01) for _ in range(3)]
    if failing:
        nodes.append(_FailsAt(4))
    run = mujou.run(nodes, timer="simulated", duration=0.1, workers=1)
    if failing:
        with pytest.raises(mujou.NodeError):
            run.join()
    else:
        run.join()
    stats = run.stats()
    updates = sum(s.updates for s in stats.nodes.values())
    hooks_ns = round(sum(s.hook_time for s in stats.nodes.values()) * 1e9)
    busy_ns = run._dispatcher._busy_ns["mujou-worker-0"]

    assert updates == (3 * 10 if not failing else 3 * 4 + 4)
    # Every update ran on the worker, the failed one included (1 µs each);
    # the start and stop hooks (1 ms each) ran on the worker or on the host
    # that helped.
    assert busy_ns % 1_000_000 == updates * 1000
    assert busy_ns <= hooks_ns


def test_restarts_count_each_hook_once_in_the_workers_busy_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _hook_clock(monkeypatch)
    monkeypatch.setitem(_FAILURES, "left", 5)
    monkeypatch.setitem(_FAILURES, "n", 0)
    node = _FailsSome()
    run = mujou.run({"f": node, "c": Counter(period=0.01)}, timer="simulated", duration=0.5,
                    workers=1, supervisor=mujou.Supervisor("one_for_one", max_restarts=10))
    run.join()
    stats = run.stats()
    hooks_ns = round(sum(s.hook_time for s in stats.nodes.values()) * 1e9)
    busy_ns = run._dispatcher._busy_ns["mujou-worker-0"]
    other_hooks = hooks_ns // 1_000_000  # on_start and on_stop, each 1 ms

    assert stats.nodes["f"].restarts == 5
    # 2 starts, 2 stops and a stop and a start per restart. A restart's
    # Restore runs no hook: it must add nothing (it once added the start's
    # time again, five times over here, more than the host could have run).
    assert other_hooks == 2 + 2 + 2 * 5
    assert busy_ns // 1_000_000 <= other_hooks


@pytest.mark.timeout(20)
def test_an_on_stop_stuck_on_a_helper_holds_up_only_its_own_node() -> None:
    entered, release = threading.Event(), threading.Event()
    stopped: list[str] = []

    class Stuck(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01)

        def on_update(self, dt: float) -> None:  # holds the only worker
            entered.set()
            release.wait(30)

    class Stops(mujou.Node):
        def __init__(self, blocks: bool) -> None:
            super().__init__(period=None)
            self.blocks = blocks

        def on_stop(self) -> None:
            if self.blocks:
                release.wait(30)
            stopped.append(self._mujou_path)

    net = {"s": Stuck(), "a": Stops(True), "b": Stops(False), "c": Stops(False)}
    run = mujou.run(net, workers=1, stop_timeout=0.3)
    try:
        assert entered.wait(5)
        run.stop()
        with pytest.raises(mujou.StopTimeoutError) as info:
            run.join(timeout=5)
        done = list(stopped)
    finally:
        release.set()

    # The worker is stuck, a helper is stuck in a's on_stop (the first in the
    # net's order): another helper still runs b's and c's.
    assert info.value.stuck == {"s": "on_update", "a": "on_stop"}
    assert done == ["b", "c"]


@pytest.mark.timeout(20)
def test_an_error_escaping_a_worker_loop_ends_the_run_and_join_raises_it(
        monkeypatch, caplog) -> None:
    # One worker in simulated time moves its timer (timers.py: Python in both builds,
    # so patchable) at each next instant: the third move fails.
    from mujou_actors.timers import SimulatedTimer

    real = SimulatedTimer.advance_to
    calls: list[int] = []

    def breaks_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # a defect of the dispatcher itself, not a hook's failure
            raise RuntimeError("defect in the loop")
        return real(*args, **kwargs)

    monkeypatch.setattr(SimulatedTimer, "advance_to", breaks_once)
    node = Counter()
    run = mujou.run(node, workers=1, timer="simulated", duration=1.0, stop_timeout=0.2)

    # The only worker died: the run still ends and reports it.
    with pytest.raises(RuntimeError, match="defect in the loop"):
        run.join(timeout=10)
    assert len(node.dts) == 2
    assert "thread mujou-worker-0 of the run died" in caplog.text


@pytest.mark.timeout(20)
def test_a_cut_gives_up_on_an_actor_busy_past_its_timeout_and_withdraws_its_request() -> None:
    entered, release = threading.Event(), threading.Event()

    class Stuck(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01)

        def on_update(self, dt: float) -> None:
            entered.set()
            release.wait(30)

    healthy = Counter()
    run = mujou.run({"stuck": Stuck(), "ok": healthy}, workers=2)
    d = run._dispatcher
    stuck = next(a for a in d.actors if a.path == "stuck")
    try:
        assert entered.wait(5)
        t0 = time.monotonic()
        into: dict[str, Any] = {}
        late = d.run_here([stuck], Snapshot(into, {}), timeout=0.2)
        seen = list(into)
        took = time.monotonic() - t0

        d.request_hold()  # cannot be met while the hook runs
        busy = d.withdraw_hold()
        n0 = len(healthy.dts)
        deadline = time.monotonic() + 3
        while len(healthy.dts) < n0 + 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        release.set()
    run.stop()
    run.join(timeout=10)

    assert late == [stuck] and seen == [] and 0.2 <= took < 2
    assert busy is not None and busy["stuck"] == "on_update" and not d.held
    assert len(healthy.dts) >= n0 + 5  # the withdrawn request holds nothing back


class _Recorder:
    """A `KernelListener` that records each call, whether the lock was held, the thread."""

    def __init__(self) -> None:
        self.d: dispatcher.Dispatcher | None = None
        self.calls: list[tuple[str, bool, str]] = []
        self.ended = threading.Event()

    def _note(self, name: str) -> None:
        assert self.d is not None
        free = self.d._cond.acquire(blocking=False)  # the lock is not reentrant
        if free:
            self.d._cond.release()
        self.calls.append((name, not free, threading.current_thread().name))

    def hook_failed(self, actor, hook: str, exc: BaseException) -> None:
        self._note("hook_failed")

    def reached_end(self) -> None:
        self._note("reached_end")
        self.ended.set()

    def held(self) -> None:
        self._note("held")

    def crashed(self, exc: BaseException) -> None:
        self._note("crashed")


def _kernel(actors: list, listener: _Recorder) -> dispatcher.Dispatcher:
    from mujou_actors.timers import SimulatedTimer

    d = dispatcher.Dispatcher(actors, SimulatedTimer(), 1, listener)
    listener.d = d
    return d


@pytest.mark.timeout(20)
def test_the_end_is_told_to_the_listener_on_the_worker_with_the_lock_held() -> None:
    from mujou_actors._runtime.actor import Actor

    node = Counter(period=0.01)
    listener = _Recorder()
    d = _kernel([Actor(node, "", 0)], listener)
    d.set_end(30_000_000, 10_000_000_000)
    before = set(threading.enumerate())  # objects: a thread of an earlier test may share a name

    d.start_threads()
    d.start_running(0)
    assert listener.ended.wait(10)
    after = {t.name for t in set(threading.enumerate()) - before}
    d.shutdown()
    d.join_threads(timeout=5)

    # No thread started to call back: the worker tells the listener, under the lock.
    assert listener.calls == [("reached_end", True, "mujou-worker-0")]
    assert after == {"mujou-worker-0"}
    assert len(node.dts) == 3 and d.end_ns == 30_000_000  # t = 10, 20, 30 ms
    assert d.wait_stopping(0.0)


def test_a_stop_asked_in_a_control_phase_outlasts_the_phase_the_release_and_the_start() -> None:
    from mujou_actors._runtime.mailbox import Stop

    d = _kernel([], _Recorder())

    d.stop_at_boundary()  # not running yet: the stop comes at once
    assert d.run_control([], Stop(), 1.0) == []  # a control phase (mode CONTROL again)
    d.release()
    d.start_running(0)

    # A stop is for good: no timed work runs after it, whatever the phases did.
    assert d.wait_stopping(0.0)


def test_a_cut_asked_with_hold_at_is_taken_once_and_cleared() -> None:
    d = _kernel([], _Recorder())

    d.hold_at(50_000_000)

    assert d.next_cut_ns == 50_000_000
    assert d.take_cut_due() is False  # not held there yet
    d.hold_at(None)
    assert d.next_cut_ns is None
