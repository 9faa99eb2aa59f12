"""The run: host API, seeds, ending, failures, stop with a stuck node, bad input."""

from __future__ import annotations

import logging
import signal
import threading
import time

import pytest
import torch

import mujou_actors as mujou
from mujou_actors.supervisor import derive_seed
from tests.conftest import Collector, Counter, Source


class Lifecycle(mujou.Node):
    """Records its hooks; optionally raises in one of them."""

    def __init__(self, fail_in: str | None = None, period: float | None = 0.01) -> None:
        super().__init__(period=period)
        self.calls: list[str] = []
        self.fail_in = fail_in

    def _hook(self, name: str) -> None:
        self.calls.append(name)
        if self.fail_in == name:
            raise RuntimeError(f"boom in {name}")

    def on_start(self) -> None:
        self._hook("on_start")

    def on_update(self, dt: float) -> None:
        self._hook("on_update")

    def on_stop(self) -> None:
        self._hook("on_stop")


class Pipe(mujou.Node):
    """A source, a triggered relay and a collector."""

    def __init__(self) -> None:
        super().__init__(period=None)
        self.src = Source(period=0.01)
        self.sink = Collector()
        mujou.connect(self.src.out, self.sink.inp)


def test_a_failing_update_stops_the_run_and_join_raises_node_error(workers: int) -> None:
    ok, bad = Lifecycle(), Lifecycle(fail_in="on_update")

    run = mujou.run({"ok": ok, "bad": bad}, workers=workers, timer="simulated")

    with pytest.raises(mujou.NodeError, match="'bad' raised in on_update: RuntimeError") as info:
        run.join(timeout=10)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert info.value.path == "bad" and info.value.hook == "on_update"
    assert bad.calls == ["on_start", "on_update", "on_stop"]
    assert ok.calls.count("on_stop") == 1 and ok.calls[-1] == "on_stop"


def test_a_failing_on_start_raises_from_run_and_stops_the_started_nodes() -> None:
    ok, bad = Lifecycle(), Lifecycle(fail_in="on_start")

    with pytest.raises(mujou.NodeError, match="'bad' raised in on_start"):
        mujou.run({"ok": ok, "bad": bad}, timer="simulated")

    assert ok.calls == ["on_start", "on_stop"]
    assert bad.calls == ["on_start"]        # its on_start did not return
    assert ok._mujou_run is None            # released: may run again


def test_a_failing_on_stop_is_reported_not_swallowed(caplog) -> None:
    node = Lifecycle(fail_in="on_stop")

    run = mujou.run(node, timer="simulated", duration=0.02)

    with pytest.raises(mujou.NodeError, match="on_stop"):
        run.join()
    assert "on_stop" in caplog.text


def test_on_stop_runs_exactly_once_per_started_node(workers: int) -> None:
    nodes = [Lifecycle() for _ in range(5)]

    run = mujou.run(nodes, workers=workers, timer="simulated", duration=0.05)
    run.join()
    run.stop()
    run.stop()

    for node in nodes:
        assert node.calls == ["on_start"] + ["on_update"] * 5 + ["on_stop"]


def test_leaving_the_with_block_stops_the_run() -> None:
    node = Lifecycle()

    with mujou.run(node) as run:
        assert run.running

    assert not run.running and node.calls[-1] == "on_stop"


def test_the_with_block_raises_a_node_failure() -> None:
    with pytest.raises(mujou.NodeError):
        with mujou.run(Lifecycle(fail_in="on_update"), timer="simulated") as run:
            time_limit = time.monotonic() + 10
            while run.running and time.monotonic() < time_limit:
                threading.Event().wait(0.01)


def test_stop_returns_and_names_a_stuck_dedicated_node() -> None:
    release = threading.Event()
    entered = threading.Event()

    class Stuck(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01, dedicated_thread=True)
            self.stopped = False

        def on_update(self, dt: float) -> None:
            entered.set()
            release.wait(30)

        def on_stop(self) -> None:
            self.stopped = True

    stuck, other = Stuck(), Lifecycle()
    run = mujou.run({"camera": stuck, "other": other}, stop_timeout=0.2)
    assert entered.wait(5)

    t0 = time.monotonic()
    run.stop()
    elapsed = time.monotonic() - t0

    assert elapsed < 3
    with pytest.raises(mujou.StopTimeoutError, match="'camera' in on_update") as info:
        run.join()
    assert info.value.stuck == {"camera": "on_update"}
    assert other.calls[-1] == "on_stop" and stuck.stopped is False
    release.set()


def test_stop_from_inside_a_hook_does_not_deadlock() -> None:
    holder: list[mujou.Run] = []

    class Quitter(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01)
            self.n = 0

        def on_update(self, dt: float) -> None:
            self.n += 1
            if self.n == 3:
                holder[0].stop()

    node = Quitter()
    run = mujou.run(node, timer="simulated")
    holder.append(run)

    run.join(timeout=10)

    assert 3 <= node.n


def test_join_with_a_timeout_raises_timeout_error() -> None:
    with mujou.run(Counter()) as run:
        with pytest.raises(TimeoutError, match="not ended"):
            run.join(timeout=0.01)


def test_write_read_and_a_triggered_update() -> None:
    class Echo(mujou.Node):
        inp = mujou.Input(float)
        out = mujou.Output(float)

        def __init__(self) -> None:
            super().__init__(period=None)

        def on_update(self, dt: float) -> None:
            self.out.send(self.inp.read() * 2)

    node = Echo()
    with mujou.run(node, timer="simulated") as run:
        run.write("inp", 3)

        assert run.wait_for("out", timeout=5) == 6.0
        assert run.read(node.out) == 6.0 and run.read("inp") == 3.0


def test_inputs_are_delivered_before_the_first_update() -> None:
    class Check(mujou.Node):
        gain = mujou.Input(float)

        def __init__(self) -> None:
            super().__init__(period=0.01)
            self.seen: list[float | None] = []

        def on_update(self, dt: float) -> None:
            self.seen.append(self.gain.read())

    node = Check()

    mujou.run(node, timer="simulated", duration=0.02, inputs={node.gain: 2.5}).join()

    assert node.seen == [2.5, 2.5]


def test_inputs_trigger_a_triggered_node_at_time_zero() -> None:
    sink = Collector()

    mujou.run(sink, timer="simulated", duration=1.0, inputs={"inp": "hello"}).join()

    assert sink.batches == [["hello"]]


def test_host_writes_to_one_input_arrive_in_order() -> None:
    sink = Collector()
    with mujou.run(sink) as run:
        for i in range(200):
            run.write(sink.inp, i)
        deadline = time.monotonic() + 5
        while len(sink.received) < 200 and time.monotonic() < deadline:
            threading.Event().wait(0.005)

    assert sink.received == list(range(200))


def test_subscribe_gets_every_message_in_order_off_the_workers() -> None:
    net = Pipe()
    seen: list[tuple[int, str]] = []
    done = threading.Event()

    def on_message(m: int) -> None:
        seen.append((m, threading.current_thread().name))
        if m == 50:
            done.set()

    run = mujou.run(net, timer="simulated", duration=0.5)
    # The subscription is made after the start; a simulated run may be past
    # its first messages, so check order and thread, not the first value.
    run.subscribe(net.src.out, on_message)
    run.join()

    values = [m for m, _ in seen]
    assert values == list(range(values[0], 51)) if values else True
    assert {name for _, name in seen} <= {"mujou-host"}


def test_subscribe_with_time_gives_each_message_its_sends_time(tmp_path) -> None:
    from mujou_actors.recording import mcapfile

    net = Pipe()
    outs: list[tuple[int, int]] = []
    ins: list[tuple[int, int]] = []
    enough = threading.Event()

    def on_out(t: int, m: int) -> None:
        outs.append((t, m))
        if len(outs) >= 20:
            enough.set()

    # Deep queues: the simulated net runs on while the host thread calls back (a loaded
    # machine lets it fall a thousand messages behind), and a drop would break the stretch.
    run = mujou.run(net, timer="simulated", record=tmp_path / "r.mcap")
    sub_in = run.subscribe(net.sink.inp, lambda t, m: ins.append((t, m)), with_time=True,
                           depth=1_000_000)
    sub_out = run.subscribe(net.src.out, on_out, with_time=True, depth=1_000_000)
    assert enough.wait(30)
    run.stop()
    run.join(timeout=30)
    assert sub_in.dropped == sub_out.dropped == 0

    # The recording stores each message at its send's time: the subscriptions, which
    # began after the start, see a stretch of the same pairs.
    recorded = [(r.t_ns, r.message) for r in mcapfile.read(tmp_path / "r.mcap")
                if r.topic == "src.out"]
    assert len(outs) >= 20 and ins[-len(outs):] == outs  # the Input's began first
    start = recorded.index(outs[0])
    assert recorded[start:start + len(outs)] == outs
    assert outs[1][0] - outs[0][0] == 10_000_000


def test_subscribe_with_time_gives_a_host_write_the_runs_time() -> None:
    sink = Collector()
    got: list[tuple[int, object]] = []
    run = mujou.run(sink, timer="simulated")
    done = threading.Event()

    def on_message(t: int, m: object) -> None:
        got.append((t, m))
        done.set()

    run.subscribe(sink.inp, on_message, with_time=True)
    run.write(sink.inp, 7)
    assert done.wait(10)
    run.stop()
    run.join(timeout=10)

    assert got == [(0, 7)]  # the simulated timer waits at 0 for the write


def test_subscribe_and_wait_for_in_real_time() -> None:
    net = Pipe()
    seen: list[int] = []
    with mujou.run(net) as run:
        run.subscribe("src.out", seen.append)

        match = run.wait_for(net.src.out, lambda m: m >= 5, timeout=5)
        first = run.wait_for(net.sink.inp, timeout=5)

    assert match == 5 or match > 5
    assert first > match
    assert seen == list(range(seen[0], seen[0] + len(seen)))


def test_wait_for_times_out() -> None:
    with mujou.run(Pipe()) as run:
        with pytest.raises(TimeoutError, match="no match"):
            run.wait_for("src.out", lambda m: m < 0, timeout=0.05)


def test_wait_for_raises_when_the_run_ends_without_a_match() -> None:
    run = mujou.run(Pipe(), timer="simulated", duration=0.05)
    run.join()

    with pytest.raises(mujou.NotRunningError, match="ended"):
        run.wait_for("src.out", timeout=5)


def test_a_raising_subscriber_stops_the_run() -> None:
    def bad(m: int) -> None:
        raise KeyError("nope")

    with mujou.run(Pipe()) as run:
        run.subscribe("src.out", bad)
        with pytest.raises(mujou.CallbackError, match="'src.out'.*KeyError"):
            run.join(timeout=5)


def test_host_gets_copies() -> None:
    class Tx(mujou.Node):
        out = mujou.Output(torch.Tensor)

        def __init__(self) -> None:
            super().__init__(period=0.01)

        def on_update(self, dt: float) -> None:
            self.out.send(torch.zeros(3))

    node = Tx()
    run = mujou.run(node, timer="simulated", duration=0.01)
    run.join()

    got = run.read("out")
    got += 1

    assert torch.equal(run.read("out"), torch.zeros(3))


def test_reads_and_stats_work_after_the_end() -> None:
    net = Pipe()

    run = mujou.run(net, timer="simulated", duration=0.1)
    run.join()

    assert run.read("src.out") == 10
    stats = run.stats()
    assert stats.nodes["src"].updates == 10 and stats.nodes["sink"].updates == 10
    assert stats.time == 0.1
    with pytest.raises(dataclasses_frozen_error()):
        stats.nodes["src"].updates = 3  # type: ignore[misc]


def dataclasses_frozen_error() -> type[Exception]:
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_stats_count_updates_dt_lateness_and_workers() -> None:
    node = Counter(period=0.01)

    run = mujou.run(node, workers=2, timer="simulated", duration=0.1)
    run.join()
    stats = run.stats()
    s = stats.nodes[""]

    assert (s.updates, s.overruns, s.dt_mean, s.dt_max) == (10, 0, pytest.approx(0.01), 0.01)
    assert s.lateness_p50 == 0.0 and s.lateness_p99 == 0.0
    assert set(stats.workers) == {"mujou-worker-0", "mujou-worker-1"}
    assert all(0.0 <= w.busy <= 1.0 for w in stats.workers.values())


def test_a_period_is_rounded_to_whole_nanoseconds_for_the_schedule_and_dt() -> None:
    sixty = Counter(period=1 / 60)  # 16,666,666.67 ns: ticks every 16,666,667 ns
    even = Counter(period=0.01)

    run = mujou.run({"sixty": sixty, "even": even}, timer="simulated", duration=1.0)
    run.join()

    assert len(sixty.dts) == 59  # the 60th is due at 1.00000002 s, after the end
    assert set(sixty.dts) == {0.016666667} and 0.016666667 != sixty.period
    assert len(even.dts) == 100 and set(even.dts) == {0.01} == {even.period}
    longer = Counter(period=1 / 60)
    mujou.run(longer, timer="simulated", duration=1.0 + 1e-6).join()
    assert len(longer.dts) == 60


def test_the_lateness_figures_cover_the_newest_256_updates_only() -> None:
    run = mujou.run({"n": Counter()}, timer="simulated", duration=0.0)
    run.join()
    actor = run._actors[0]  # ended: its updates are driven here, with chosen lateness
    period = actor.period_ns

    for k in range(1, 201):  # the first 44 start 1 ms late, the rest on time
        actor.run_update(k * period + (1_000_000 if k <= 44 else 0), k * period, True)
    assert run.stats().nodes["n"].lateness_p99 == 0.001
    for k in range(201, 301):
        actor.run_update(k * period, k * period, True)

    stats = run.stats().nodes["n"]
    assert (stats.updates, stats.lateness_p99, stats.lateness_p50) == (300, 0.0, 0.0)


def test_run_seed_derives_stable_per_node_seeds() -> None:
    a, b = Counter(), Counter(seed=5)

    run = mujou.run({"a": a, "b": b}, timer="simulated", duration=0.0, seed=11)
    run.join()

    assert run.seeds == {"a": derive_seed(11, "a"), "b": 5}
    assert derive_seed(11, "a") == 2649756073461864040  # stable across processes
    assert derive_seed(11, "a") != derive_seed(11, "b") != derive_seed(12, "a")


def test_node_seed_is_its_own_seed_or_the_one_the_run_gave_it() -> None:
    a, b = Counter(), Counter(seed=5)
    assert (a.seed, b.seed) == (None, 5)

    run = mujou.run({"a": a, "b": b}, timer="simulated", duration=0.0, seed=11)
    run.join()

    assert (a.seed, b.seed) == (derive_seed(11, "a"), 5) == (run.seeds["a"], run.seeds["b"])
    tree = run.state_dict()
    again = mujou.run({"a": a, "b": b}, timer="simulated", duration=0.0)  # a fresh random one
    again.join()
    assert a.seed == again.seeds["a"] != derive_seed(11, "a") and b.seed == 5
    restored, other = Counter(), Counter(seed=9)
    mujou.run({"a": restored, "b": other}, timer="simulated", duration=0.0, state=tree).join()
    assert (restored.seed, other.seed) == (derive_seed(11, "a"), 5)  # the tree's
    with pytest.raises(AttributeError):
        a.seed = 3  # type: ignore[misc]


def test_run_seed_node_seed_and_derive_seed_share_one_check() -> None:
    for bad, error in [(-1, ValueError), (2**64, ValueError), (1.0, TypeError),
                       (True, TypeError), ("1", TypeError)]:
        with pytest.raises(error, match="seed") as node_error:
            Counter(seed=bad)
        with pytest.raises(error, match="seed") as run_error:
            mujou.run(Counter(), timer="simulated", duration=0.0, seed=bad)
        with pytest.raises(error, match="seed") as derive_error:
            derive_seed(bad, "a")
        words = {str(e.value).split(": ", 1)[1] for e in (node_error, run_error, derive_error)}
        assert len(words) == 1, words
    top = 2**64 - 1
    run = mujou.run({"a": Counter(seed=top), "b": Counter()}, timer="simulated",
                    duration=0.0, seed=top)
    run.join()
    assert run.seeds == {"a": top, "b": derive_seed(top, "b")}


class Drawer(mujou.Node):
    """Draws from its generator in __init__ (or in on_start), records it."""

    def __init__(self, *, seed: int | None = None, draw_in_init: bool = True) -> None:
        super().__init__(period=0.01, seed=seed)
        self.draw_in_init = draw_in_init
        self.w = torch.rand(2, generator=self.generator) if draw_in_init else None

    def on_start(self) -> None:
        if self.w is None:
            self.w = torch.rand(2, generator=self.generator)


def test_drawing_in_init_without_a_seed_of_its_own_is_warned_about(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="mujou_actors")

    mujou.run({"d": Drawer()}, timer="simulated", duration=0.0, seed=0).join()

    warnings = [m for m in caplog.messages if "drew from self.generator" in m]
    assert len(warnings) == 1 and warnings[0].startswith("node 'd' (Drawer) drew")
    assert "give the node a seed of its own" in warnings[0] and "on_start" in warnings[0]


def test_draws_with_a_seed_of_its_own_or_in_on_start_are_reproducible_and_not_warned(
        caplog) -> None:
    caplog.set_level(logging.WARNING, logger="mujou_actors")
    weights = []
    for _ in range(2):
        own, late, touched = Drawer(seed=3), Drawer(draw_in_init=False), Counter()
        assert touched.generator is not None  # made, never drawn from: the run seeds it afresh
        mujou.run({"own": own, "late": late, "touched": touched}, timer="simulated",
                  duration=0.0, seed=0).join()
        weights.append((own.w, late.w, torch.rand(1, generator=touched.generator)))
    (own0, late0, touched0), (own1, late1, touched1) = weights

    assert torch.equal(own0, own1) and torch.equal(late0, late1)
    assert torch.equal(touched0, touched1)
    again = Drawer(draw_in_init=False)
    mujou.run({"d": again}, timer="simulated", duration=0.0).join()
    torch.rand(1, generator=again.generator)  # drawn from after its first run
    mujou.run({"d": again}, timer="simulated", duration=0.0, seed=0).join()
    assert not [r for r in caplog.records if "drew from self.generator" in r.getMessage()]


def test_without_any_seed_runs_differ() -> None:
    node = Counter()

    first = mujou.run(node, timer="simulated", duration=0.0)
    first.join()
    second = mujou.run(node, timer="simulated", duration=0.0)
    second.join()

    assert first.seeds[""] != second.seeds[""]


def test_a_run_never_touches_the_global_generator() -> None:
    class Draw(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01)

        def on_update(self, dt: float) -> None:
            torch.rand(1, generator=self.generator)

    torch.manual_seed(0)
    state = torch.get_rng_state()

    mujou.run(Draw(), timer="simulated", duration=0.1, seed=1).join()

    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        ({"timer": "wall"}, ValueError, "timer"),
        ({"timer": 1}, ValueError, "timer"),
        ({"workers": 0}, ValueError, "workers"),
        ({"workers": 1.5}, TypeError, "workers"),
        ({"workers": True}, TypeError, "workers"),
        ({"duration": -1}, ValueError, "duration"),
        ({"duration": "1"}, TypeError, "duration"),
        ({"duration": float("nan")}, ValueError, "duration"),
        ({"stop_timeout": 0}, ValueError, "stop_timeout"),
        ({"stop_timeout": "1"}, TypeError, "stop_timeout"),
        ({"start_timeout": 0}, ValueError, "start_timeout"),
        ({"start_timeout": float("inf")}, ValueError, "start_timeout"),
        ({"start_timeout": "1"}, TypeError, "start_timeout"),
        ({"seed": "x"}, TypeError, "seed"),
        ({"seed": -1}, ValueError, r"seed must be in \[0, 2\*\*64\)"),
        ({"seed": 2**64}, ValueError, r"seed must be in \[0, 2\*\*64\)"),
        ({"seed": True}, TypeError, "seed"),
        ({"inputs": {"nope": 1}}, ValueError, "'nope'"),
        ({"inputs": {"sink.inp": 1, "src.out": 2}}, ValueError, "'src.out'"),
        ({"inputs": [1]}, TypeError, "mapping"),
        ({"stats": 1}, TypeError, "stats must be True or False"),
        ({"stats": None}, TypeError, "stats must be True or False"),
        ({"supervisor": "one_for_one"}, TypeError, "supervisor"),
        ({"cuda_sync": "fast"}, ValueError, "cuda_sync"),
        ({"trace": 3}, TypeError, "trace"),
        ({"trace": ""}, ValueError, "trace"),
        ({"trace": "/dev/null/trace.json"}, NotADirectoryError, "trace file"),
        ({"supervisor": mujou.Supervisor(snapshot_dir="/dev/null/snapshots")},
         NotADirectoryError, "snapshot_dir"),
        ({"state": 42}, TypeError, "state must be"),
        ({"state": {"format": 1}}, mujou.SnapshotError, "lacks"),
    ],
)
def test_a_bad_run_argument_is_named_and_leaves_the_net_free_to_run(kwargs, error, text) -> None:
    net = Pipe()

    with pytest.raises(error, match=text):
        mujou.run(net, **kwargs)

    assert [n._mujou_run for n in (net, net.src, net.sink)] == [None, None, None]
    assert [n.path for n in (net, net.src, net.sink)] == [None, None, None]  # never in a run
    run = mujou.run(net, timer="simulated", duration=0.03)  # the same nodes, at once
    run.join(timeout=10)
    assert net.sink.received == [1, 2, 3]


def test_a_failure_while_the_run_is_built_releases_the_nodes() -> None:
    import importlib

    from mujou_actors._runtime.build import Seams, Wiring

    run_module = importlib.import_module("mujou_actors.run")  # mujou_actors.run is the function
    net = Pipe()

    def broken_wire(*args: object) -> Wiring:
        raise MemoryError("no memory for the sinks")

    with pytest.raises(MemoryError, match="no memory for the sinks"):
        run_module._start(net, seams=Seams(wire=broken_wire), timer="simulated", duration=0.03)

    assert [n._mujou_run for n in (net, net.src, net.sink)] == [None, None, None]
    assert [n.path for n in (net, net.src, net.sink)] == [None, None, None]
    run = mujou.run(net, timer="simulated", duration=0.03)
    run.join(timeout=10)
    assert net.sink.received == [1, 2, 3]


@pytest.mark.timeout(30)
def test_a_thread_that_cannot_start_releases_the_nodes_and_ends_the_started_ones(
        monkeypatch) -> None:
    net = Pipe()
    start = threading.Thread.start
    spawned: list[str] = []

    def start_one(self: threading.Thread) -> None:
        # What the OS says when it has no thread left, for the second worker only.
        if self.name.startswith("mujou-worker-"):
            if spawned:
                raise RuntimeError("can't start new thread")
            spawned.append(self.name)
        start(self)

    before = {t.name for t in threading.enumerate()}
    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", start_one)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            mujou.run(net, workers=2, timer="simulated", duration=0.03)

    assert spawned == ["mujou-worker-0"]
    assert {t.name for t in threading.enumerate()} - before == set()  # the one started ended
    assert [n._mujou_run for n in (net, net.src, net.sink)] == [None, None, None]
    run = mujou.run(net, timer="simulated", duration=0.03)
    run.join(timeout=10)
    assert net.sink.received == [1, 2, 3]


def test_a_mistyped_input_value_is_a_port_type_error_before_anything_starts() -> None:
    node = Lifecycle()
    node.gain = mujou.Input(float)

    with pytest.raises(mujou.PortTypeError, match="'gain': expected float, got str"):
        mujou.run(node, inputs={"gain": "fast"})

    assert node.calls == []


def test_bad_host_calls_are_named() -> None:
    net, other = Pipe(), Pipe()
    net.sink.gain = mujou.Input(float)
    with mujou.run(net) as run:
        with pytest.raises(ValueError, match="no port 'src.nope'"):
            run.read("src.nope")
        with pytest.raises(TypeError, match="is an Output; expected an Input"):
            run.write("src.out", 1)
        with pytest.raises(ValueError, match="not part of this run"):
            run.read(other.src.out)
        with pytest.raises(mujou.PortTypeError, match="'sink.gain': expected float, got str"):
            run.write(net.sink.gain, "high")
        with pytest.raises(TypeError, match="callable"):
            run.subscribe("src.out", 3)  # type: ignore[arg-type]
    with pytest.raises(mujou.NotRunningError, match="ended"):
        run.write("sink.inp", 1)


def test_a_port_connected_outside_the_net_is_refused() -> None:
    inside, outside = Source(), Collector()
    mujou.connect(inside.out, outside.inp)

    with pytest.raises(mujou.NetError, match="not part of the net"):
        mujou.run(inside, timer="simulated")


def test_a_failure_is_logged_on_the_library_logger(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="mujou_actors")

    run = mujou.run(Lifecycle(fail_in="on_update"), timer="simulated")
    with pytest.raises(mujou.NodeError):
        run.join(timeout=10)

    assert any(r.name == "mujou_actors" and "'<root>' raised in on_update" in r.message
               for r in caplog.records)


def test_realtime_runs_the_triggered_work_of_the_last_tick() -> None:
    net = Pipe()

    run = mujou.run(net, duration=0.1)
    run.join()
    src = run.stats().nodes["src"]

    # The last tick due (t = 0.1 s) ran, late or not, and so did the update it
    # triggered. (A loaded machine may skip earlier ticks as overruns: they send nothing.)
    assert src.updates + src.overruns == 10 and net.src.n == src.updates
    assert net.sink.received == list(range(1, net.src.n + 1))


def test_connect_while_running_is_refused() -> None:
    net = Pipe()
    extra = Collector()
    with mujou.run(net):
        with pytest.raises(ValueError, match="'src.out' while its node is running"):
            mujou.connect(net.src.out, extra.inp)


def test_a_realtime_duration_ends_the_run_even_with_a_stuck_hook() -> None:
    release = threading.Event()

    class Stuck(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01)

        def on_update(self, dt: float) -> None:
            release.wait(30)

    run = mujou.run(Stuck(), workers=1, duration=0.05, stop_timeout=0.2)

    with pytest.raises(mujou.StopTimeoutError, match="'<root>' in on_update"):
        run.join(timeout=10)
    release.set()


def test_newcomer_mistakes_get_specific_messages(caplog) -> None:
    class NoSuper(mujou.Node):
        def __init__(self) -> None:
            self.generator.seed()

    class Typo(Counter):
        def on_updte(self, dt: float) -> None:
            pass

    with pytest.raises(AttributeError, match=r"call super\(\).__init__"):
        NoSuper()
    with pytest.raises(TypeError, match=r"shape must be a tuple such as \(3,\)"):
        mujou.Input(torch.Tensor, shape=3)
    with pytest.raises(mujou.NetError, match=r"net\[1\] must be a Node, got int"):
        mujou.run([Counter(), 2])
    with pytest.raises(mujou.NetError, match="net key 'a.b'"):
        mujou.run({"a.b": Counter()})
    with pytest.raises(TypeError, match="did you forget the"):
        mujou.run(Counter)
    out = mujou.Output(torch.Tensor, shape=(3,))
    inp = mujou.Input(torch.Tensor, shape=(4,))
    out._bind(Counter(), "out")
    inp._bind(Counter(), "inp")
    with pytest.raises(mujou.PortTypeError, match="the shapes differ"):
        mujou.connect(out, inp)
    mujou.run(Typo(), timer="simulated", duration=0.0).join()
    assert "Typo.on_updte is not a hook" in caplog.text


def test_several_failures_are_all_reported() -> None:
    bad = [Lifecycle(fail_in="on_update"), Lifecycle(fail_in="on_stop")]

    run = mujou.run(bad, timer="simulated")

    with pytest.raises(mujou.NodeError, match=r"and 1 more failure\(s\)") as info:
        run.join(timeout=10)
    assert [(f.path, f.hook) for f in info.value.failures] == [("0", "on_update"),
                                                               ("1", "on_stop")]


EXIT_WITHOUT_JOIN = r"""
import sys, torch, mujou_actors as mujou

class Busy(mujou.Node):
    def __init__(self):
        super().__init__(period=0.001)

    def on_update(self, dt):
        torch.ones(64, 64) @ torch.ones(64, 64)

    def on_stop(self):
        open(sys.argv[1], "w").write("stopped")

run = mujou.run({"a": Busy(), "b": Busy()}, workers=2, timer="simulated")
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_interpreter_exit_stops_a_run_that_was_never_joined(tmp_path) -> None:
    import subprocess
    import sys

    for i in range(3):
        marker = tmp_path / f"stopped{i}"
        result = subprocess.run([sys.executable, "-c", EXIT_WITHOUT_JOIN, str(marker)],
                                capture_output=True, text=True, timeout=60)

        assert result.returncode == 0, result.stderr
        assert marker.read_text() == "stopped"


class _Sparse(mujou.Node):
    """Ticks every 10 ms and sends only at the ticks listed (1-based)."""

    out = mujou.Output(int)

    def __init__(self, at: set[int]) -> None:
        super().__init__(period=0.01)
        self.at, self.n = at, 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n in self.at:
            self.out.send(self.n)


class _DtLog(mujou.Node):
    """Triggered: records every ``dt`` it is given."""

    inp = mujou.Input(int, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.dts: list[float] = []

    def on_update(self, dt: float) -> None:
        self.inp.drain()
        self.dts.append(dt)


def test_dt_mean_and_max_are_those_of_the_dts_the_hook_was_given() -> None:
    src, log = _Sparse({1, 2, 5, 9}), _DtLog()
    mujou.connect(src.out, log.inp)
    run = mujou.run([src, log], timer="simulated", duration=0.1)
    run.join()
    s = run.stats().nodes[log._mujou_path]

    # Triggered at 10, 20, 50 and 90 ms (one delta cycle after each send).
    assert log.dts == [0.01, 0.01, 0.03, 0.04]
    assert s.updates == 4
    assert s.dt_max == 0.04
    assert s.dt_mean == pytest.approx(sum(log.dts) / 4, abs=1e-15)
    periodic = run.stats().nodes[src._mujou_path]
    assert (periodic.updates, periodic.dt_max, periodic.dt_mean) == (10, 0.01, pytest.approx(0.01))


def test_dt_sum_adds_up_spans_across_restores() -> None:
    from mujou_actors._runtime.actor import Actor

    node = Counter(period=0.01)
    actor = Actor(node, "", 0)
    actor.schedule_first_tick(0)
    given: list[int] = []
    # Updates at 10, 20 ms; a restore puts the last update back at 5 ms;
    # updates at 15, 40 ms; a restart at 100 ms; an update at 130 ms.
    for step in (10, 20, "r5", 15, 40, "r100", 130):
        if isinstance(step, str):
            actor.set_last_update(int(step[1:]) * 1_000_000)
            continue
        given.append(step * 1_000_000 - actor.last_update_ns)  # type: ignore[operator]
        actor.run_update(step * 1_000_000, step * 1_000_000, False)

    assert given == [10_000_000, 10_000_000, 10_000_000, 25_000_000, 30_000_000]
    assert actor.updates == 5
    assert actor.dt_sum == sum(given) / 1e9
    assert actor.dt_max == 0.03


class _Echo(mujou.Node):
    """Triggered: sends back every int it reads."""

    inp = mujou.Input(int, depth=None)
    out = mujou.Output(int)

    def __init__(self) -> None:
        super().__init__(period=None)

    def on_update(self, dt: float) -> None:
        for m in self.inp.drain():
            self.out.send(m)


class _WritesAtCut(mujou.Node):
    """Ticks; the first time its state is taken, the host writes to ``e.inp``."""

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.run: mujou.Run | None = None

    def on_update(self, dt: float) -> None:
        pass

    def state_dict(self) -> dict:
        if self.run is not None:  # runs at the cut (on the coordinator thread)
            run, self.run = self.run, None
            run.write("e.inp", 7)
        return super().state_dict()


@pytest.mark.parametrize("timer", ["simulated", "realtime"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_host_write_while_the_net_is_held_triggers_its_reader_after_the_cut(
        timer: str, workers: int) -> None:
    echo, writer = _Echo(), _WritesAtCut()
    run = mujou.run({"e": echo, "w": writer}, timer=timer, workers=workers)
    got: list[int] = []
    arrived = threading.Event()
    run.subscribe("e.out", lambda m: (got.append(m), arrived.set()))
    writer.run = run
    run.state_dict()  # holds the running net; the write happens at the cut

    assert arrived.wait(10), "the reader was never triggered"
    run.stop()
    run.join(timeout=10)
    assert got == [7]
    assert run.stats().nodes["e"].updates == 1


def test_stats_false_reports_no_dt_statistics() -> None:
    run = mujou.run(Counter(period=0.01), timer="simulated", duration=0.1, stats=False)
    run.join()
    s = run.stats().nodes[""]

    assert s.updates == 10
    assert (s.dt_mean, s.dt_max, s.hook_time) == (0.0, 0.0, 0.0)


class _Swaps(mujou.Node):
    """Replaces its own on_update in on_start: the run keeps the one it found."""

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.calls: list[str] = []

    def on_start(self) -> None:
        self.on_update = lambda dt: self.calls.append("replacement")  # type: ignore[method-assign]

    def on_update(self, dt: float) -> None:
        self.calls.append("method")


@pytest.mark.parametrize("traced", [False, True])
def test_on_update_is_the_one_found_as_the_run_starts_with_or_without_a_trace(
        tmp_path, traced: bool) -> None:
    node = _Swaps()
    trace = tmp_path / "t.json" if traced else None
    mujou.run(node, timer="simulated", duration=0.03, trace=trace).join()

    assert node.calls == ["method"] * 3


# ---------------------------------------------------------------------------
# Bounded start and stop, and failures never lost (issue 12, items 4, 6, 7, 8)


class _Starts(mujou.Node):
    """Appends its path to ``log`` in on_start, after waiting for ``wait`` if given."""

    def __init__(self, log: list[str], wait: threading.Event | None = None,
                 sets: threading.Event | None = None) -> None:
        super().__init__(period=None)
        self.log, self.wait, self.sets = log, wait, sets
        self.stopped = 0
        self.done = threading.Event()  # set as on_start returns

    def on_start(self) -> None:
        if self.wait is not None:
            assert self.wait.wait(5), "the on_start it waits for never ran"
        if self.sets is not None:
            self.sets.set()
        self.log.append(self._mujou_path)
        self.done.set()

    def on_stop(self) -> None:
        self.stopped += 1


@pytest.mark.timeout(20)
def test_on_start_hooks_begin_in_the_nets_order_on_one_worker() -> None:
    log: list[str] = []
    a_started = threading.Event()
    # b waits for a, which comes first in the net: one worker must run a first.
    net = {"a": _Starts(log, sets=a_started), "b": _Starts(log, wait=a_started)}
    net["a"].child = _Starts(log)
    net["z"] = _Starts(log)

    mujou.run(net, workers=1, timer="simulated", duration=0.0).join()

    assert log == ["a", "a.child", "b", "z"]


@pytest.mark.timeout(20)
def test_an_on_start_stuck_past_start_timeout_names_it_stops_the_run_and_frees_the_net(
        caplog) -> None:
    log: list[str] = []
    release = threading.Event()
    # b waits for a later node's on_start: with one worker it never comes.
    net = {"c": _Starts(log), "b": _Starts(log, wait=release), "a": _Starts(log)}

    t0 = time.monotonic()
    with pytest.raises(mujou.StartTimeoutError, match="'b' in on_start") as info:
        mujou.run(net, workers=1, timer="simulated", start_timeout=0.3, stop_timeout=0.2)
    took = time.monotonic() - t0
    release.set()

    assert info.value.stuck == {"b": "on_start"}
    assert info.value.not_started == ["a"]
    assert isinstance(info.value, TimeoutError)
    assert log == ["c"]
    assert [n.stopped for n in net.values()] == [1, 0, 0]  # on_stop of the started one only
    assert 0.3 <= took < 0.3 + 2 * 0.2 + 2.0  # start_timeout, then the stop's bound
    assert "'b' in on_start" in caplog.text

    # The net was released: the same nodes run again, and start completely.
    assert net["b"].done.wait(5)  # the stuck on_start, left behind, has returned
    log.clear()
    mujou.run(net, workers=2, timer="simulated", duration=0.0).join()
    assert sorted(log) == ["a", "b", "c"]


class _SlowRestore(mujou.Node):
    """load_state_dict waits for ``release``."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__(period=0.01)
        self.release = release

    def state_dict(self) -> dict:
        return {"x": 1}

    def load_state_dict(self, state: dict) -> None:
        self.release.wait(30)


@pytest.mark.timeout(20)
def test_a_restore_stuck_in_load_state_dict_is_bounded_by_start_timeout(caplog) -> None:
    release = threading.Event()
    net = {"a": _SlowRestore(release), "b": _SlowRestore(release)}
    first = mujou.run(net, timer="simulated", duration=0.02)
    first.join()
    tree = first.state_dict()

    with pytest.raises(mujou.StartTimeoutError) as info:
        mujou.run(net, timer="simulated", state=tree, start_timeout=0.3, stop_timeout=0.2)
    release.set()

    assert info.value.stuck == {"a": "load_state_dict"}
    assert info.value.not_started == ["b"]
    # The stop that followed names the hook too (it is not run through actor.call).
    assert "still running: 'a' in load_state_dict" in caplog.text
    assert net["a"]._mujou_run is None and net["b"]._mujou_run is None


class _StuckUpdate(mujou.Node):
    """Blocks in its second update until ``release``; sets ``entered`` as it blocks."""

    def __init__(self, entered: threading.Event, release: threading.Event) -> None:
        super().__init__(period=0.01)
        self.entered, self.release, self.n = entered, release, 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == 2:
            self.entered.set()
            self.release.wait(30)


@pytest.mark.slow
@pytest.mark.timeout(20)
def test_stop_behind_a_stuck_simulated_hook_waits_stop_timeout_once() -> None:
    entered, release = threading.Event(), threading.Event()
    other = Lifecycle()
    run = mujou.run({"s": _StuckUpdate(entered, release), "o": other}, workers=1,
                    timer="simulated", stop_timeout=1.0)
    assert entered.wait(5)

    t0 = time.monotonic()
    run.stop()
    took = time.monotonic() - t0
    release.set()

    with pytest.raises(mujou.StopTimeoutError, match=r"after 1\.0 s: .*'s' in on_update") as info:
        run.join()
    assert info.value.stuck == {"s": "on_update"}
    assert other.calls[-1] == "on_stop"
    # One stop_timeout for the hooks in flight (the instant's end included),
    # not one for the instant and another for the idle wait.
    assert 1.0 <= took < 1.8


@pytest.mark.timeout(20)
def test_a_real_time_run_reaching_its_duration_behind_a_stuck_hook_waits_stop_timeout_once(
        ) -> None:
    # Issue 28, item 5: the hooks in flight at the end got stop_timeout of grace,
    # then the stop waited for them a second stop_timeout.
    entered, release = threading.Event(), threading.Event()
    other = Lifecycle()
    t0 = time.monotonic()
    run = mujou.run({"s": _StuckUpdate(entered, release), "o": other}, duration=0.1,
                    stop_timeout=0.5)
    try:
        assert entered.wait(5)
        with pytest.raises(mujou.StopTimeoutError) as info:
            run.join(timeout=10)
        took = time.monotonic() - t0
    finally:
        release.set()

    assert str(info.value) == "stop timed out after 0.5 s: still running: 's' in on_update"
    assert other.calls[-1] == "on_stop"
    assert 0.1 + 0.5 <= took < 0.1 + 1.5 * 0.5


class _BlockingStop(mujou.Node):
    """on_stop blocks until ``release``."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__(period=0.01)
        self.release = release

    def on_stop(self) -> None:
        self.release.wait(30)


@pytest.mark.timeout(20)
def test_stop_returns_after_stop_timeout_when_on_stop_blocks_on_a_worker(workers) -> None:
    release = threading.Event()
    other = Lifecycle()
    run = mujou.run({"s": _BlockingStop(release), "o": other}, workers=workers,
                    timer="simulated", stop_timeout=0.3)
    try:
        t0 = time.monotonic()
        run.stop()
        took = time.monotonic() - t0
        with pytest.raises(mujou.StopTimeoutError, match="'s' in on_stop") as info:
            run.join(timeout=5)
    finally:
        release.set()

    assert info.value.stuck == {"s": "on_stop"}
    assert other.calls[-1] == "on_stop" and other.calls.count("on_stop") == 1
    assert 0.3 <= took < 0.3 + 2.0


@pytest.mark.slow
@pytest.mark.timeout(20)
def test_a_stuck_update_and_a_stuck_on_stop_take_at_most_twice_stop_timeout() -> None:
    entered, release = threading.Event(), threading.Event()
    nodes = {"s": _StuckUpdate(entered, release), "t": _BlockingStop(release)}
    run = mujou.run(nodes, workers=1, timer="simulated", stop_timeout=0.5)
    assert entered.wait(5)
    try:
        t0 = time.monotonic()
        run.stop()
        took = time.monotonic() - t0
        with pytest.raises(mujou.StopTimeoutError) as info:
            run.join(timeout=5)
    finally:
        release.set()

    assert info.value.stuck == {"s": "on_update", "t": "on_stop"}
    assert 2 * 0.5 <= took < 2 * 0.5 + 1.5  # the two waits docs/run.md describes


EXIT_WITH_A_BLOCKED_ON_STOP = r"""
import threading, mujou_actors as mujou

class Blocks(mujou.Node):
    def on_stop(self):
        threading.Event().wait()  # forever: exit must not wait for it

run = mujou.run({"a": Blocks(), "b": mujou.Node()}, workers=1, stop_timeout=0.2)
"""


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_interpreter_exit_is_not_held_by_an_on_stop_blocked_on_a_worker() -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", EXIT_WITH_A_BLOCKED_ON_STOP],
                            capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stderr
    assert "'a' in on_stop" in result.stderr  # logged as stuck


class _BadStr(Exception):
    def __str__(self) -> str:
        raise ValueError("str of the exception")


class _BadStrAndRepr(Exception):
    def __str__(self) -> str:
        raise ValueError("str of the exception")

    def __repr__(self) -> str:
        raise ValueError("repr of the exception")


class _Base(BaseException):
    pass


_RAISED = {
    "str raises": _BadStr,
    "str and repr raise": _BadStrAndRepr,
    "BaseException": lambda: _Base("base"),
    "SystemExit": lambda: SystemExit(3),
    "KeyboardInterrupt": KeyboardInterrupt,
}


class _Raises(mujou.Node):
    """Raises ``make()`` in ``hook``."""

    def __init__(self, hook: str, make) -> None:
        super().__init__(period=0.01)
        self.hook, self.make = hook, make

    def _maybe(self, hook: str) -> None:
        if hook == self.hook:
            raise self.make()

    def on_start(self) -> None:
        self._maybe("on_start")

    def on_update(self, dt: float) -> None:
        self._maybe("on_update")

    def on_stop(self) -> None:
        self._maybe("on_stop")

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        self._maybe("load_state_dict")


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", list(_RAISED))
@pytest.mark.parametrize("workers_", [1, 2], ids=lambda n: f"workers={n}")
def test_a_failing_update_is_reported_whatever_the_exception_object_does(
        kind, workers_, caplog) -> None:
    node = _Raises("on_update", _RAISED[kind])
    run = mujou.run({"bad": node, "ok": Lifecycle()}, workers=workers_, timer="simulated",
                    duration=1.0)

    with pytest.raises(mujou.NodeError, match="'bad' raised in on_update") as info:
        run.join(timeout=10)

    assert type(info.value.__cause__).__name__ in (kind, "_BadStr", "_BadStrAndRepr", "_Base")
    assert info.value.path == "bad" and info.value.hook == "on_update"
    assert run.time < 1.0  # the failure stopped the run
    assert "'bad' raised in on_update" in caplog.text


@pytest.mark.timeout(20)
@pytest.mark.parametrize("hook", ["on_start", "on_stop", "load_state_dict"])
def test_a_failing_control_hook_is_reported_even_when_its_exception_cannot_be_printed(
        hook) -> None:
    node = _Raises(hook, _BadStrAndRepr)
    state = None
    if hook == "load_state_dict":
        state = mujou.run({"bad": _Raises("", _BadStr)}, timer="simulated",
                          duration=0.01).state_dict()

    with pytest.raises(mujou.NodeError, match=f"'bad' raised in {hook}: _BadStrAndRepr") as info:
        run = mujou.run({"bad": node}, workers=1, timer="simulated", duration=0.05, state=state)
        run.join(timeout=10)

    assert isinstance(info.value.__cause__, _BadStrAndRepr)
    assert node._mujou_run is None  # released


@pytest.mark.timeout(20)
def test_a_traced_failure_with_an_unprintable_exception_reaches_join_and_the_trace(
        tmp_path) -> None:
    import json

    path = tmp_path / "trace.json"
    run = mujou.run({"bad": _Raises("on_update", _BadStr)}, workers=1, timer="simulated",
                    duration=1.0, trace=path)

    with pytest.raises(mujou.NodeError, match="_BadStr: <_BadStr.__str__ raised>"):
        run.join(timeout=10)

    failures = [e for e in json.loads(path.read_text())["traceEvents"]
                if e.get("cat") == "failure"]
    assert [f["name"] for f in failures] == ["bad.on_update raised _BadStr"]
    assert failures[0]["args"]["error"] == "<_BadStr.__str__ raised>"


@pytest.mark.timeout(20)
def test_a_subscriber_raising_an_unprintable_exception_stops_the_run() -> None:
    src = Source()
    run = mujou.run({"src": src}, workers=1)

    def callback(message) -> None:
        raise _BadStrAndRepr()

    run.subscribe("src.out", callback)
    with pytest.raises(mujou.CallbackError, match="_BadStrAndRepr") as info:
        run.join(timeout=10)
    assert isinstance(info.value.__cause__, _BadStrAndRepr)


def test_describe_formats_any_exception_without_raising() -> None:
    from mujou_actors.errors import describe

    class NotStr(Exception):
        def __str__(self):
            return 42

    class StrSub(str):
        def __str__(self):
            raise ValueError("never called")

    class Sub(Exception):
        def __str__(self):
            return StrSub("sub")

    assert describe(ValueError("bad")) == "ValueError: bad"
    assert describe(ValueError()) == "ValueError"
    assert describe(_BadStr()) == "_BadStr: <_BadStr.__str__ raised>"
    assert describe(_BadStrAndRepr()) == "_BadStrAndRepr: <_BadStrAndRepr.__str__ raised>"
    assert describe(NotStr()) == "NotStr: <NotStr.__str__ raised>"
    assert describe(Sub()) == "Sub: sub" and type(describe(Sub())) is str


# -- the host's subscribers and waiters ----------------------------------------------


def test_join_wait_and_wait_for_from_a_subscriber_callback_raise_runtime_error() -> None:
    errors: list[tuple[str, BaseException | None]] = []
    done = threading.Event()
    holder: list[mujou.Run] = []

    def callback(m: int) -> None:
        if done.is_set():
            return
        run_ = holder[0]
        for name, call in [("join", lambda: run_.join(timeout=0.2)),
                           ("wait", lambda: run_.wait(timeout=0.2)),
                           ("wait_for", lambda: run_.wait_for("src.out", timeout=0.2))]:
            try:
                call()
            except BaseException as exc:  # noqa: BLE001 - recorded for the asserts
                errors.append((name, exc))
            else:
                errors.append((name, None))
        done.set()

    run = mujou.run(Pipe(), timer="simulated")
    holder.append(run)
    run.subscribe("src.out", callback)
    assert done.wait(10)
    run.stop()
    run.join(timeout=10)

    assert [name for name, _ in errors] == ["join", "wait", "wait_for"]
    for name, exc in errors:
        assert isinstance(exc, RuntimeError), (name, exc)
        assert str(exc).startswith(f"{name}() from a subscriber callback would block")
        assert "use run.stop()" in str(exc)


def test_wait_from_inside_a_hook_raises_runtime_error() -> None:
    holder: list[mujou.Run] = []
    got: list[BaseException | bool] = []

    class Waits(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01)

        def on_update(self, dt: float) -> None:
            if not got:
                try:
                    got.append(holder[0].wait(timeout=0.05))
                except RuntimeError as exc:
                    got.append(exc)

    run = mujou.run(Waits(), timer="simulated", duration=0.02)
    holder.append(run)
    run.join(timeout=10)

    assert len(got) == 1 and isinstance(got[0], RuntimeError)
    assert str(got[0]).startswith("wait() from inside a hook would block its thread")


def test_subscribe_after_the_end_is_refused_and_starts_no_thread() -> None:
    def host_threads() -> int:
        return sum(t.name == "mujou-host" for t in threading.enumerate())

    before = host_threads()
    run = mujou.run(Pipe(), timer="simulated", duration=0.05)
    run.join()

    for _ in range(3):
        with pytest.raises(mujou.NotRunningError, match=r"subscribe\('src.out'\): .*ended"):
            run.subscribe("src.out", print)

    assert host_threads() == before


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), BrokenStr()],
                         ids=["SystemExit", "KeyboardInterrupt", "broken __str__"])
def test_a_callback_raising_any_exception_is_reported_and_the_others_still_get_every_message(
        exc: BaseException) -> None:
    net = Pipe()
    seen: list[int] = []
    raised: list[int] = []

    def bad(m: int) -> None:
        raised.append(m)
        raise exc

    run = mujou.run(net, timer="simulated")  # runs until the failure ends it
    good = run.subscribe("src.out", seen.append, depth=100_000)
    run.subscribe("src.out", bad)
    with pytest.raises(mujou.CallbackError) as info:
        run.join(timeout=10)

    assert info.value.__cause__ is exc
    assert str(info.value) == {
        SystemExit: "subscriber of 'src.out' raised SystemExit: 3",
        KeyboardInterrupt: "subscriber of 'src.out' raised KeyboardInterrupt",
        BrokenStr: "subscriber of 'src.out' raised BrokenStr: <BrokenStr.__str__ raised>",
    }[type(exc)]
    # Every message sent until the end reached the other subscriber, in order.
    assert seen == list(range(seen[0], run.read("src.out") + 1))
    assert good.delivered == len(seen) and good.dropped == 0 and good.undelivered == 0
    assert len(raised) == 1 and not good.active  # a callback that raised is called no more


class Sink(mujou.Node):
    """A triggered node with one Input the host writes to."""

    inp = mujou.Input(int, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)

    def on_update(self, dt: float) -> None:
        self.inp.drain()


def test_a_slow_subscriber_keeps_its_newest_messages_up_to_its_depth_and_counts_the_drops(
        caplog) -> None:
    entered, release, last = threading.Event(), threading.Event(), threading.Event()
    seen: list[int] = []

    def slow(m: int) -> None:
        seen.append(m)
        if m == 0:
            entered.set()
            assert release.wait(10)
        if m == 10:
            last.set()

    caplog.set_level(logging.WARNING, logger="mujou_actors")
    with mujou.run({"sink": Sink()}, timer="simulated") as run:
        sub = run.subscribe("sink.inp", slow, depth=4)
        run.write("sink.inp", 0)
        assert entered.wait(10)
        for i in range(1, 11):  # the callback is busy with 0: these queue up
            run.write("sink.inp", i)
        assert sub.dropped == 6
        release.set()
        assert last.wait(10)

    assert seen == [0, 7, 8, 9, 10]  # the oldest were dropped
    assert (sub.delivered, sub.dropped, sub.undelivered) == (5, 6, 0)
    drops = [r for r in caplog.records if "falls behind" in r.getMessage()]
    assert len(drops) == 1 and "'sink.inp'" in drops[0].getMessage()
    assert "depth=4" in drops[0].getMessage()


@pytest.mark.timeout(20)
def test_stop_waits_at_most_stop_timeout_for_a_stuck_callback_and_counts_what_is_left(
        caplog) -> None:
    entered, release = threading.Event(), threading.Event()
    seen: list[int] = []

    def stuck(m: int) -> None:
        seen.append(m)
        entered.set()
        release.wait(30)

    run = mujou.run({"sink": Sink()}, timer="simulated", stop_timeout=0.3)
    sub = run.subscribe("sink.inp", stuck, depth=8)
    run.write("sink.inp", 0)
    assert entered.wait(10)
    for i in range(1, 5):
        run.write("sink.inp", i)
    t0 = time.monotonic()
    run.stop()
    elapsed = time.monotonic() - t0
    release.set()
    host = run._host.thread
    assert host is not None
    host.join(10)

    assert 0.3 <= elapsed < 5  # the callback's share of the stop is stop_timeout
    assert (sub.delivered, sub.dropped, sub.undelivered) == (1, 0, 4)
    assert seen == [0] and not host.is_alive()  # nothing is delivered past the bound
    text = caplog.text
    assert "4 message(s) were not delivered" in text and "still running when stop_timeout" in text
    run.join()  # a stuck callback is logged, not a failure of the run


def test_the_queue_of_a_slow_wait_for_is_bounded_and_its_drops_are_reported() -> None:
    entered, written = threading.Event(), threading.Event()
    tried: list[int] = []
    run = mujou.run({"sink": Sink()}, timer="simulated")

    def writer() -> None:
        run.write("sink.inp", 0)
        assert entered.wait(10)
        for i in range(1, 11):  # the predicate is busy with 0: these queue up
            run.write("sink.inp", i)
        written.set()
        run.stop()

    def never(m: int) -> bool:
        tried.append(m)
        if m == 0:
            entered.set()
            assert written.wait(10)
        return False

    def start_writer_once_waiting() -> None:
        deadline = time.monotonic() + 10
        while not run._host._waiters and time.monotonic() < deadline:
            time.sleep(0.001)  # registered once it listens: the first write is seen
        writer()

    thread = threading.Thread(target=start_writer_once_waiting)
    thread.start()
    with pytest.raises(mujou.NotRunningError,
                       match=r"6 message\(s\) were dropped unseen.*depth=4"):
        run.wait_for("sink.inp", never, depth=4)
    thread.join(10)

    assert tried[0] == 0 and tried[1:] == [7, 8, 9, 10]


@pytest.mark.timeout(20)
def test_stats_count_each_ports_deliveries_drops_and_undelivered_messages_cancelled_included(
        ) -> None:
    entered, release, again, stuck = (threading.Event() for _ in range(4))

    def slow(m: int) -> None:
        if m == 0:
            entered.set()
            assert release.wait(10)
        if m == 11:
            again.set()
            stuck.wait(30)

    run = mujou.run({"sink": Sink(), "other": Sink()}, timer="simulated", stop_timeout=0.3)
    assert dict(run.stats().subscriptions) == {}  # nothing observed yet
    slow_sub = run.subscribe("sink.inp", slow, depth=4)
    seen: list[int] = []
    caught_up = threading.Event()

    def fast_callback(m: int) -> None:  # called after slow's call for the same write
        seen.append(m)
        if m == 10:
            caught_up.set()

    fast = run.subscribe("sink.inp", fast_callback)
    run.write("sink.inp", 0)
    assert entered.wait(10)
    for i in range(1, 11):  # slow is busy with 0: it keeps 7..10 and drops 1..6
        run.write("sink.inp", i)
    release.set()
    assert caught_up.wait(10)
    live = run.stats().subscriptions["sink.inp"]
    assert (live.subscriptions, live.delivered, live.dropped, live.undelivered) == (2, 16, 6, 0)

    fast.cancel()  # its counts stay in the stats
    for i in (11, 12, 13):  # slow is stuck in 11: 12 and 13 are left at the end
        run.write("sink.inp", i)
    assert again.wait(10)
    run.stop()
    stuck.set()
    run.join()

    assert seen == list(range(11))
    assert (slow_sub.delivered, slow_sub.dropped, slow_sub.undelivered) == (6, 6, 2)
    stats = run.stats()
    assert dict(stats.subscriptions) == {"sink.inp": mujou.SubscriptionStats(
        port="sink.inp", subscriptions=2, delivered=17, dropped=6, undelivered=2)}
    with pytest.raises(TypeError):
        stats.subscriptions["other.inp"] = mujou.SubscriptionStats("other.inp")  # type: ignore


def test_stats_count_the_messages_a_slow_wait_for_dropped_unseen() -> None:
    entered, written = threading.Event(), threading.Event()
    run = mujou.run({"sink": Sink()}, timer="simulated")

    def writer() -> None:
        deadline = time.monotonic() + 10
        while not run._host._waiters and time.monotonic() < deadline:
            time.sleep(0.001)  # registered once it listens: the first write is seen
        run.write("sink.inp", 0)
        assert entered.wait(10)
        for i in range(1, 11):  # the predicate is busy with 0: 1..6 are dropped
            run.write("sink.inp", i)
        written.set()

    def is_ten(m: int) -> bool:
        if m == 0:
            entered.set()
            assert written.wait(10)
        return m == 10

    thread = threading.Thread(target=writer)
    thread.start()
    assert run.wait_for("sink.inp", is_ten, depth=4) == 10
    thread.join(10)
    with pytest.raises(TimeoutError):
        run.wait_for("sink.inp", timeout=0.01)  # a second call, nothing dropped
    run.stop()

    assert run.stats().subscriptions["sink.inp"] == mujou.SubscriptionStats(
        port="sink.inp", waits=2, wait_dropped=6)


@pytest.mark.timeout(20)
def test_a_keyboard_interrupt_while_mujou_run_waits_for_on_start_stops_the_run() -> None:
    import _thread

    release = threading.Event()
    log: list[str] = []

    class Interrupts(_Starts):
        def on_start(self) -> None:
            _thread.interrupt_main()  # as Ctrl-C would, while the host waits
            release.wait(30)
            super().on_start()

    net = {"c": _Starts(log), "i": Interrupts(log), "later": _Starts(log)}
    # interrupt_main does nothing unless SIGINT has Python's own handler: make sure it has.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            mujou.run(net, workers=1, timer="simulated", stop_timeout=0.2)
    finally:
        release.set()
        signal.signal(signal.SIGINT, previous)

    assert net["i"].done.wait(5)  # left behind, it has returned now
    assert log == ["c", "i"]  # 'later' never started, not even once the worker was free
    assert [n.stopped for n in net.values()] == [1, 0, 0]
    assert all(n._mujou_run is None for n in net.values())  # released


@pytest.mark.timeout(20)
def test_state_dict_from_a_subscriber_callback_works_while_running_and_is_refused_at_the_end(
        ) -> None:
    got: list[object] = []
    holder: list[mujou.Run] = []
    first, done = threading.Event(), threading.Event()

    def callback(m: int) -> None:
        run_ = holder[0]
        if m == 0:
            got.append(sorted(run_.state_dict()["nodes"]))
            first.set()
            return
        assert run_._coordinator._end_requested.wait(10)  # the host's stop() below has begun
        try:
            run_.state_dict()
        except RuntimeError as exc:
            got.append(exc)
        done.set()

    run = mujou.run({"sink": Sink()}, timer="simulated")
    holder.append(run)
    run.subscribe("sink.inp", callback)
    run.write("sink.inp", 0)
    assert first.wait(10)
    run.write("sink.inp", 1)
    run.stop()
    run.join(timeout=10)

    assert done.is_set() and got[0] == ["sink"]
    assert isinstance(got[1], RuntimeError)
    assert str(got[1]).startswith("state_dict() from a subscriber callback while the run ends")


# -- state_dict() and the end of the run ---------------------------------------------


def _spy_on_holds(run: mujou.Run, asked: threading.Event | None = None) -> threading.Event:
    """An Event (``asked``, or a new one) set once a cut has been asked of the run's dispatcher."""
    asked = asked or threading.Event()
    coordinator = run._coordinator
    assert coordinator is not None
    coordinator.dispatcher = _HoldSpy(coordinator.dispatcher, asked)  # type: ignore[assignment]
    return asked


class _HoldSpy:
    """The dispatcher as the run's coordinator sees it, setting ``asked`` at each cut asked for.

    A proxy: the methods of a compiled `Dispatcher` cannot be replaced on the instance.
    """

    def __init__(self, dispatcher: object, asked: threading.Event) -> None:
        self._dispatcher, self._asked = dispatcher, asked

    def __getattr__(self, name: str) -> object:
        return getattr(self._dispatcher, name)

    def request_hold(self) -> None:
        self._dispatcher.request_hold()
        self._asked.set()


def _outcome(call: object) -> object:
    try:
        return call()  # type: ignore[operator]
    except BaseException as exc:  # noqa: BLE001 - the test asserts on it
        return exc


@pytest.mark.timeout(30)
@pytest.mark.parametrize("timer, runs", [("simulated", 20), ("realtime", 5)])
def test_state_dict_called_in_a_loop_while_short_runs_end_never_hangs(
        timer: str, runs: int) -> None:
    for _ in range(runs):
        run = mujou.run(Counter(), timer=timer, duration=0.05)
        times: list[int] = []

        def loop(run: mujou.Run = run, times: list[int] = times) -> None:
            while True:
                ended = not run.running
                times.append(run.state_dict()["time_ns"])
                if ended:  # that call began after the end
                    return

        caller = threading.Thread(target=loop, daemon=True)
        caller.start()
        run.join(timeout=5)
        caller.join(5)

        assert not caller.is_alive(), "state_dict() never returned"
        assert times[-1] == run.time_ns >= 50_000_000  # the last one is the final state
        assert times == sorted(times)


@pytest.mark.timeout(20)
def test_a_state_dict_in_flight_as_the_run_stops_returns_the_final_state() -> None:
    holder: list[mujou.Run] = []
    asked, entered = threading.Event(), threading.Event()

    class StopsOnceAsked(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01)
            self.n = 0

        def on_update(self, dt: float) -> None:
            self.n += 1
            if self.n == 3:  # the instant cannot finish: the cut waits for it
                entered.set()
                assert asked.wait(10)
                holder[0].stop()  # from a hook: only asks for the end

    node = StopsOnceAsked()
    run = mujou.run(node, timer="simulated")
    holder.append(run)
    _spy_on_holds(run, asked)
    assert entered.wait(5)
    got: list[object] = []
    caller = threading.Thread(target=lambda: got.append(_outcome(run.state_dict)), daemon=True)
    caller.start()

    run.join(timeout=5)
    caller.join(5)

    assert not caller.is_alive(), "state_dict() never returned"
    tree = got[0]
    assert isinstance(tree, dict), tree
    assert tree["time_ns"] == 30_000_000 == run.time_ns  # the final state, at the stop
    assert node.n == 3 and run.state_dict()["time_ns"] == 30_000_000


@pytest.mark.timeout(20)
@pytest.mark.parametrize("timer", ["simulated", "realtime"])
def test_stop_returns_within_its_bound_while_a_state_dict_waits_behind_a_stuck_hook(
        timer: str) -> None:
    entered, release = threading.Event(), threading.Event()

    class Stuck(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01)

        def on_update(self, dt: float) -> None:
            entered.set()
            release.wait(30)

    other = Lifecycle()
    run = mujou.run({"stuck": Stuck(), "other": other}, workers=2, timer=timer,
                    stop_timeout=0.5)
    asked = _spy_on_holds(run)
    assert entered.wait(5)
    got: list[object] = []
    caller = threading.Thread(target=lambda: got.append(_outcome(run.state_dict)), daemon=True)
    caller.start()
    assert asked.wait(5)

    stopper = threading.Thread(target=run.stop, daemon=True)
    t0 = time.monotonic()
    stopper.start()
    stopper.join(8)
    elapsed = time.monotonic() - t0
    caller.join(5)
    release.set()

    assert not stopper.is_alive(), "stop() never returned"
    assert elapsed < 4  # a few stop_timeouts at most, however loaded the machine
    assert not caller.is_alive(), "state_dict() never returned"
    err = got[0]  # as after the end: no final state for a node still in its hook
    assert isinstance(err, mujou.NodeError), err
    assert err.path == "stuck" and "'stuck' is still in on_update" in str(err)
    assert other.calls[-1] == "on_stop"
    with pytest.raises(mujou.StopTimeoutError, match="'stuck' in on_update"):
        run.join()


@pytest.mark.timeout(20)
@pytest.mark.parametrize("timer", ["simulated", "realtime"])
def test_state_dict_with_a_timeout_behind_a_stuck_hook_raises_naming_the_node(
        timer: str) -> None:
    entered, release = threading.Event(), threading.Event()

    class StuckOnce(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01)
            self.n = 0

        def on_update(self, dt: float) -> None:
            self.n += 1
            if self.n == 3:
                entered.set()
                release.wait(30)

    stuck = StuckOnce()
    run = mujou.run({"cam": stuck, "other": Counter()}, workers=2, timer=timer)
    assert entered.wait(5)

    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"within 0\.2 s.*'cam' in on_update"):
        run.state_dict(timeout=0.2)
    elapsed = time.monotonic() - t0
    release.set()
    after = run.state_dict(timeout=5)  # the net goes on once the hook returns
    run.stop()
    run.join(timeout=5)

    assert 0.2 <= elapsed < 3
    assert after["nodes"]["cam"] is not None and stuck.n >= 3
    with pytest.raises(ValueError, match="timeout must be a finite number >= 0"):
        run.state_dict(timeout=-1)


@pytest.mark.timeout(20)
def test_run_calls_that_wait_are_refused_from_a_nodes_state_dict_at_a_cut() -> None:
    holder: list[mujou.Run] = []
    got: dict[str, BaseException | None] = {}

    class Asks(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01)

        def on_update(self, dt: float) -> None:
            pass

        def state_dict(self) -> dict:
            if holder and not got:  # runs at the cut, on the run's thread
                for name, call in [("state_dict", holder[0].state_dict),
                                   ("join", holder[0].join), ("wait", holder[0].wait)]:
                    got[name] = _outcome(call)  # type: ignore[assignment]
            return super().state_dict()

    run = mujou.run(Asks(), timer="simulated")
    holder.append(run)
    tree = run.state_dict(timeout=5)
    run.stop()
    run.join(timeout=5)

    assert tree["nodes"][""] is not None and sorted(got) == ["join", "state_dict", "wait"]
    for name, err in got.items():
        assert isinstance(err, RuntimeError), (name, err)
        assert "would block the run's thread (mujou-run)" in str(err)


# -- the end of a run: decided once -------------------------------------------------


class _FailsAt(mujou.Node):
    """A periodic node whose ``n``-th update raises."""

    def __init__(self, n: int) -> None:
        super().__init__(period=0.01)
        self.n, self.updates = n, 0

    def on_update(self, dt: float) -> None:
        self.updates += 1
        if self.updates == self.n:
            raise RuntimeError(f"boom at update {self.n}")


def _count_stops(monkeypatch) -> list[str]:
    """Record each stop the run asks of its dispatcher: "boundary" or "now"."""
    from mujou_actors._runtime.dispatcher import Dispatcher

    asked: list[str] = []
    at_boundary, now = Dispatcher.stop_at_boundary, Dispatcher.stop_now

    def spy_boundary(self) -> None:
        asked.append("boundary")
        at_boundary(self)

    def spy_now(self) -> None:
        asked.append("now")
        now(self)

    monkeypatch.setattr(Dispatcher, "stop_at_boundary", spy_boundary)
    monkeypatch.setattr(Dispatcher, "stop_now", spy_now)
    return asked


def _end_reason(run: mujou.Run) -> str:
    return run._coordinator.end_reason.value  # type: ignore[union-attr]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers_", [1, 2], ids=lambda n: f"workers={n}")
def test_two_failures_in_one_instant_end_the_run_once_at_that_instant(
        monkeypatch, workers_: int) -> None:
    asked = _count_stops(monkeypatch)
    net = {"a": _FailsAt(3), "b": _FailsAt(3), "c": Counter()}

    run = mujou.run(net, timer="simulated", workers=workers_)
    with pytest.raises(mujou.NodeError):
        run.join(timeout=20)

    assert asked == ["boundary"]  # asked once, by the first failing thread
    assert _end_reason(run) == "failed"
    assert run.time_ns == 30_000_000  # the instant of the failures, finished
    assert len(net["c"].dts) == 3


@pytest.mark.timeout(30)
def test_stop_and_the_duration_each_end_the_run_once(monkeypatch) -> None:
    asked = _count_stops(monkeypatch)

    with mujou.run(Counter(), timer="simulated", duration=0.05) as run:
        run.join(timeout=20)
        run.stop()
    assert (asked, _end_reason(run)) == (["boundary"], "duration")

    asked.clear()
    with mujou.run(Counter(), workers=1) as run:
        run.stop()
        run.stop()
    assert (asked, _end_reason(run)) == (["boundary"], "stopped")


def test_the_seamed_start_takes_the_arguments_and_defaults_of_run_but_the_deprecated() -> None:
    import importlib
    import inspect

    run_module = importlib.import_module("mujou_actors.run")  # mujou_actors.run is the function
    public = inspect.signature(mujou.run).parameters
    seamed = dict(inspect.signature(run_module._start).parameters)

    assert seamed.pop("seams").default is inspect.Parameter.empty
    assert list(seamed.values()) == [p for name, p in public.items()
                                     if name not in run_module.DEPRECATED]
    assert all(public[name].default is None for name in run_module.DEPRECATED)


# -- Run.watch: a queue the host takes, that wakes nothing ----------------------------


class Doubler(mujou.Node):
    """Triggered by the host's tensors: sends each doubled (a fresh tensor, handed over)."""

    inp = mujou.Input(torch.Tensor, depth=None)
    out = mujou.Output(torch.Tensor)

    def __init__(self, last: int = 3) -> None:
        super().__init__(period=None)
        self.n, self.last = 0, last
        self.done = threading.Event()
        self.run: mujou.Run | None = None
        self.watches: list[object] = []

    def on_update(self, dt: float) -> None:
        for x in self.inp.drain():
            self.n += 1
            if self.run is not None and self.n == 1:
                # In one process a watch never waits: a hook may make one.
                self.watches.append(self.run.watch(self.out))
            self.out.send(x * 2)
        if self.n >= self.last:
            self.done.set()


def test_a_watch_wakes_nothing_and_copies_only_what_it_is_asked_to() -> None:
    doubler, sink = Doubler(), Collector()
    mujou.connect(doubler.out, sink.inp)
    run = mujou.run({"d": doubler, "sink": sink}, timer="simulated")
    try:
        shared, own = run.watch("d.out"), run.watch("d.out", with_time=True)
        doubler.run = run
        for k in range(3):
            run.write("d.inp", torch.full((2,), float(k)))
        assert doubler.done.wait(20)
        as_sent = shared.take(copy=False)
        copies = own.take()
        from_hook = doubler.watches[0].take()  # type: ignore[attr-defined]
        # No subscription, so no mujou-host thread: no send woke anything.
        assert run._host.thread is None  # type: ignore[attr-defined]
    finally:
        run.stop()
    run.join()
    got = sink.received
    assert [t.tolist() for t in as_sent] == [[0.0, 0.0], [2.0, 2.0], [4.0, 4.0]]
    # copy=False: the very messages the reader got; copies: the host's own.
    assert all(a is b for a, b in zip(as_sent, got, strict=True))
    assert all(torch.equal(c, b) and c is not b for (_, c), b in zip(copies, got, strict=True))
    copies[0][1].add_(100)
    assert got[0].tolist() == [0.0, 0.0]
    assert [t for t, _ in copies] == [0, 0, 0]  # the simulated timer waits at 0 for writes
    assert [t.tolist() for t in from_hook] == [[0.0, 0.0], [2.0, 2.0], [4.0, 4.0]]


class Ticker(mujou.Node):
    """Sends ``(index, count)`` every millisecond once ``go`` is set."""

    out = mujou.Output(tuple)

    def __init__(self, index: int, go: threading.Event) -> None:
        super().__init__(period=0.001)
        self.index, self.go, self.n = index, go, 0

    def on_update(self, dt: float) -> None:
        assert self.go.wait(20), "never started"
        self.n += 1
        self.out.send((self.index, self.n))


@pytest.mark.timeout(120)
def test_a_watch_of_several_sending_threads_counts_each_message_taken_or_dropped() -> None:
    go = threading.Event()
    tickers = {f"t{i}": Ticker(i, go) for i in range(3)}
    sink = Collector()
    for t in tickers.values():
        mujou.connect(t.out, sink.inp)
    run = mujou.run({**tickers, "sink": sink}, timer="simulated", duration=0.5, workers=3)
    watch = run.watch("sink.inp", depth=4)
    taken: list[tuple[int, int]] = []
    drops: list[int] = []
    go.set()
    while run.running:  # the taker races the three workers' appends
        taken += watch.take()
        drops.append(watch.dropped)
    run.join()
    taken += watch.take()
    drops.append(watch.dropped)

    sent = sink.received  # every message, all sent after the watch was made
    assert len(sent) == sum(t.n for t in tickers.values()) > 1000
    assert len(taken) + watch.dropped == len(sent) and watch.pending == 0
    assert drops == sorted(drops)  # the count never goes back
    assert watch.taken == len(taken)
    for i in range(3):  # each sender's messages in its order, none twice
        counts = [n for j, n in taken if j == i]
        assert counts == sorted(set(counts))
    stats = run.stats().subscriptions["sink.inp"]
    assert stats.watch_taken + stats.watch_dropped == len(sent)
