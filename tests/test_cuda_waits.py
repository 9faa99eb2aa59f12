"""How the run waits for the GPU, on the strict fake runtime (tests/fake_cuda.py).

Every wait the run makes on the GPU goes through the calling thread's waiter
(``cuda_sync``): under ``"block"`` the fake log shows each as a blocking event
wait, and never one of the waits that spin under CUDA's default flag (a
stream's or an event's ``synchronize``, a blocking copy to the CPU). Also:
``run.write`` of a CUDA tensor, and the waits after ``on_start`` and
``on_stop``.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

import mujou_actors as mujou
from mujou_actors import devices
from tests import fake_cuda
from tests.fake_cuda import FakeCudaTensor, FakeRuntime, shadow

CPU = torch.device("cpu")
GPU0 = torch.device("cuda", 0)


def _on(node: mujou.Node, device: torch.device) -> mujou.Node:
    node._mujou_device = device  # what Node(device=...) gives on a machine with GPUs
    return node


class Source(mujou.Node):
    """Sends arange(3) + its update count, on its device."""

    out = mujou.Output(torch.Tensor)

    def __init__(self, rt: FakeRuntime) -> None:
        super().__init__(period=0.01)
        self.rt = rt
        self.n = 0

    def on_start(self) -> None:
        self.sent = torch.zeros(())  # how many it sent: state on its device
        if self.device.type == "cuda":
            self.sent = self.rt.cuda(self.sent, self.device)

    def on_update(self, dt: float) -> None:
        value = torch.arange(3.0) + self.n
        self.n += 1
        if self.device.type == "cuda":
            value = self.rt.cuda(value, self.device)
        self.out.send(value)
        self.sent = self.sent + 1


class Sink(mujou.Node):
    """Keeps the CPU data of what it reads (read on its own stream, as a hook would)."""

    inp = mujou.Input(torch.Tensor, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.got: list[torch.Tensor] = []

    def on_update(self, dt: float) -> None:
        for t in self.inp.drain():
            assert t.device == self.device, f"{t.device} on a {self.device} reader"
            self.got.append(shadow(t * 1))


def _spinning(rt: FakeRuntime) -> list[tuple[Any, ...]]:
    return [w for w in rt.host_waits() if w[0] != "waiter" or w[1] != "blocking"]


# -- each wait, one at a time ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(20)
def test_a_cuda_send_to_cpu_readers_only_copies_to_pinned_memory_and_sleeps_on_its_stream(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rt, _, start = fake_cuda.fakes()
    src, cpu = _on(Source(rt), GPU0), Sink()
    mujou.connect(src.out, cpu.inp)

    start({"s": src, "c": cpu}, timer="simulated", duration=0.02).join()

    sends = [i for i, e in enumerate(rt.log) if e == ("to_host", "cuda:0", "stream1@cuda:0")]
    assert len(sends) == 2  # updates at 0 and 0.01 s
    assert all(rt.log[i + 1] == ("waiter", "blocking", "stream1@cuda:0") for i in sends)
    assert _spinning(rt) == []
    assert [t.tolist() for t in cpu.got] == [[0, 1, 2], [1, 2, 3]]


@pytest.mark.timeout(20)
def test_a_cpu_reader_of_a_device_path_message_sleeps_on_its_copy_stream(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rt, _, start = fake_cuda.fakes()
    src, gpu, cpu = _on(Source(rt), GPU0), _on(Sink(), GPU0), Sink()
    mujou.connect(src.out, gpu.inp)
    mujou.connect(src.out, cpu.inp)

    start({"s": src, "g": gpu, "c": cpu}, timer="simulated", duration=0.02).join()

    copy = "stream3@cuda:0"  # the CPU reader's copy stream on the sender's device
    at = rt.log.index(("to_host", "cuda:0", copy))
    assert rt.log[at + 1] == ("waiter", "blocking", copy)
    assert _spinning(rt) == []
    assert [t.tolist() for t in cpu.got] == [t.tolist() for t in gpu.got] == [[0, 1, 2],
                                                                              [1, 2, 3]]


@pytest.mark.timeout(20)
def test_a_cpu_message_for_a_cuda_reader_is_queued_on_its_stream_without_any_host_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rt, _, start = fake_cuda.fakes()
    src, gpu = Source(rt), _on(Sink(), GPU0)
    mujou.connect(src.out, gpu.inp)

    start({"s": src, "g": gpu}, timer="simulated", duration=0.02).join()

    assert rt.log.count(("to_device", "cuda:0", "stream1@cuda:0")) == 2
    # Only the run's start waits on the host: for the host's stream.
    assert rt.host_waits() == [("waiter", "blocking", "default@cuda:0")]
    assert [t.tolist() for t in gpu.got] == [[0, 1, 2], [1, 2, 3]]


@pytest.mark.timeout(20)
def test_host_reads_waits_subscriptions_and_cuts_of_cuda_outputs_sleep(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rt, _, start = fake_cuda.fakes()
    src, gpu = _on(Source(rt), GPU0), _on(Sink(), GPU0)
    mujou.connect(src.out, gpu.inp)
    got: list[list[float]] = []

    run = start({"s": src, "g": gpu}, timer="simulated")  # no end: stopped below
    seen = threading.Event()
    run.subscribe("s.out", lambda m: got.append(m.tolist()) or seen.set())
    first = run.wait_for("s.out", timeout=10)
    tree = run.state_dict()  # a cut: the messages in flight, copied for the host
    assert seen.wait(10)
    run.stop()
    last = run.read("s.out")

    assert first.device == CPU and last.device == CPU
    n = first[0]
    assert first.tolist() == [n, n + 1, n + 2]
    assert last.tolist() == [src.n - 1, src.n, src.n + 1]
    assert got[0] == [got[0][0] + i for i in range(3)]
    # The state's CUDA tensor, copied without blocking: landed before the tree was handed out.
    sent = tree["nodes"]["s"]["sent"]
    assert sent.device == CPU and 1 <= float(sent) <= src.n
    assert rt.host_waits() and _spinning(rt) == []
    host = [w for w in rt.host_waits() if w[2] == "default@cuda:0"]
    assert len(host) >= 2  # the start, then the host's copies of the sent messages


@pytest.mark.parametrize("sync, kind", [("spin", "polling"), ("yield", "polling")])
@pytest.mark.timeout(20)
def test_under_spin_and_yield_the_same_waits_poll_through_the_waiter(
        monkeypatch: pytest.MonkeyPatch, sync: str, kind: str) -> None:
    rt, _, start = fake_cuda.fakes()
    src, gpu, cpu = _on(Source(rt), GPU0), _on(Sink(), GPU0), Sink()
    mujou.connect(src.out, gpu.inp)
    mujou.connect(src.out, cpu.inp)

    run = start({"s": src, "g": gpu, "c": cpu}, timer="simulated", duration=0.02,
                    cuda_sync=sync)
    run.join()
    run.read("s.out")

    waits = rt.host_waits()
    assert waits and all(w[:2] == ("waiter", kind) for w in waits)
    assert not any(e.blocking for e in rt.events)  # ready events block only under "block"
    assert [t.tolist() for t in cpu.got] == [[0, 1, 2], [1, 2, 3]]


class Keeper(mujou.Node):
    """A CUDA reader whose Input keeps its newest value."""

    inp = mujou.Input(torch.Tensor)

    def __init__(self) -> None:
        super().__init__(period=None)

    def on_update(self, dt: float) -> None:
        self.inp.read()


@pytest.mark.timeout(20)
def test_a_host_read_of_a_cuda_nodes_input_waits_on_a_blocking_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rt, _, start = fake_cuda.fakes()
    src, gpu = _on(Source(rt), GPU0), _on(Keeper(), GPU0)
    mujou.connect(src.out, gpu.inp)

    run = start({"s": src, "g": gpu}, timer="simulated", duration=0.02)
    run.join()
    kept = run.read("g.inp")

    assert kept.device == CPU and kept.tolist() == [1, 2, 3]
    assert rt.events and all(e.blocking for e in rt.events)  # ready and kept-value events
    assert _spinning(rt) == []


@pytest.mark.parametrize("sync", ["block", "spin"])
@pytest.mark.timeout(20)
def test_ready_events_are_blocking_under_block(monkeypatch: pytest.MonkeyPatch,
                                               sync: str) -> None:
    rt, _, start = fake_cuda.fakes()
    src, gpu = _on(Source(rt), GPU0), _on(Keeper(), GPU0)
    mujou.connect(src.out, gpu.inp)

    start({"s": src, "g": gpu}, timer="simulated", duration=0.02, cuda_sync=sync).join()

    # The fake decides nothing: each event's ``blocking`` is what the run asked for.
    recorded_on = {e[1]: e[2] for e in rt.log if e[0] == "record"}
    ready = [e for e in rt.events if recorded_on.get(e.name) == "stream1@cuda:0"]
    kept = [e for e in rt.events if recorded_on.get(e.name) == "stream2@cuda:0"]
    assert len(ready) == 1 and len(kept) == 1  # the Output's reused event, the reader's
    assert [e.blocking for e in ready + kept] == [sync == "block"] * 2
    assert [e.records for e in ready] == [2]  # one record per send (updates at 0 and 0.01 s)


@pytest.mark.timeout(20)
def test_each_thread_waits_with_its_own_waiter() -> None:
    rt = devices.CudaRuntime("spin")  # making waiters touches no CUDA
    mine = rt.waiter()
    theirs: list[Any] = []
    t = threading.Thread(target=lambda: theirs.append(rt.waiter()))
    t.start()
    t.join()

    assert rt.waiter() is mine
    assert theirs[0] is not mine
    assert (mine.sync, theirs[0].sync) == ("spin", "spin")
    rt.set_sync("block")
    assert rt.waiter() is not mine and rt.waiter().sync == "block"


# -- run.write and inputs= of a CUDA tensor (the caching allocator) ---------------------------


class Model(mujou.Node):
    """A CUDA node that reads its Input on its own stream."""

    inp = mujou.Input(torch.Tensor, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.got: list[torch.Tensor] = []

    out = mujou.Output(torch.Tensor)

    def on_update(self, dt: float) -> None:
        for t in self.inp.drain():
            doubled = t * 2
            self.got.append(shadow(doubled))
            self.out.send(doubled)


@pytest.mark.timeout(20)
def test_run_write_of_a_cuda_tensor_gives_the_node_a_clone_its_stream_is_recorded_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rt, _, start = fake_cuda.fakes()
    node = _on(Model(), GPU0)
    x = rt.cuda(torch.tensor([1.0, 2.0]))
    done = threading.Event()

    run = start({"m": node}, timer="simulated")  # no end: stopped below
    run.subscribe("m.out", lambda m: done.set())
    run.write("m.inp", x)
    assert done.wait(10)  # the node read it
    run.stop()

    # The clone is on the host's stream's memory, used on the node's: without
    # record_stream its block could go to the host's next write while the node
    # still reads it. The host waits for the clone (asleep), then delivers.
    at = rt.log.index(("record_stream", "stream1@cuda:0", "cuda:0"))
    assert rt.log[at + 1] == ("waiter", "blocking", "default@cuda:0")
    assert _spinning(rt) == []
    assert [t.tolist() for t in node.got] == [[2.0, 4.0]]


@pytest.mark.slow
@pytest.mark.timeout(20)
def test_inputs_of_a_cuda_tensor_are_recorded_on_the_node_stream_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rt, _, start = fake_cuda.fakes()
    node = _on(Model(), GPU0)

    done = threading.Event()

    run = start({"m": node}, timer="simulated", inputs={"m.inp": rt.cuda(torch.ones(2))})
    run.subscribe("m.out", lambda m: done.set())
    assert done.wait(10) or node.got  # it may have run before the subscription
    run.stop()

    assert ("record_stream", "stream1@cuda:0", "cuda:0") in rt.log
    assert _spinning(rt) == []
    assert [t.tolist() for t in node.got] == [[2.0, 2.0]]


@pytest.mark.timeout(20)
def test_a_write_copier_records_every_clone_on_the_node_stream_and_waits_once() -> None:
    rt = FakeRuntime()
    node_stream = rt.new_stream(GPU0)
    a, b = rt.cuda(torch.ones(1)), rt.cuda(torch.zeros(2))
    copier = devices.WriteCopier(GPU0, node_stream, rt)

    out = [copier(a), copier(b), copier(torch.ones(3))]
    copier.wait()

    assert [type(t) for t in out] == [FakeCudaTensor, FakeCudaTensor, torch.Tensor]
    assert rt.log[-3:] == [("record_stream", "stream1@cuda:0", "cuda:0"),
                           ("record_stream", "stream1@cuda:0", "cuda:0"),
                           ("waiter", "blocking", "default@cuda:0")]


@pytest.mark.timeout(20)
def test_a_host_copy_is_garbage_until_the_host_has_waited() -> None:
    rt = FakeRuntime()
    copier = devices.HostCopier(rt)
    out = copier(rt.cuda(torch.tensor([1.0, 2.0])))

    assert torch.isnan(out).all()  # the non-blocking copy has not landed
    copier.wait()
    assert out.tolist() == [1.0, 2.0]


# -- on_start and on_stop ---------------------------------------------------------------------


class Busy(mujou.Node):
    """Queues GPU work in every hook and logs each hook."""

    def __init__(self, rt: FakeRuntime, log: list[str]) -> None:
        super().__init__(period=0.01)
        self.rt = rt
        self.log = log

    def _work(self, hook: str) -> None:
        self.log.append(hook)
        self.w = self.rt.cuda(torch.ones(2)) * 3

    def on_start(self) -> None:
        self._work("on_start")

    def on_update(self, dt: float) -> None:
        self._work("on_update")

    def on_stop(self) -> None:
        self._work("on_stop")


@pytest.mark.timeout(20)
def test_the_node_stream_is_waited_for_after_on_start_and_on_stop_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rt, waiters, start = fake_cuda.fakes()
    log: list[str] = []
    original = fake_cuda.FakeWaiter.wait

    def logged(self: Any, stream: Any) -> None:
        log.append("wait")
        original(self, stream)

    monkeypatch.setattr(fake_cuda.FakeWaiter, "wait", logged)
    node = _on(Busy(rt, log), GPU0)

    start({"b": node}, timer="simulated", duration=0.01).join()

    assert log == ["on_start", "wait", "on_update", "wait", "on_stop", "wait"]
    assert all(s.query() for s in rt.streams)  # join() left no GPU work queued
