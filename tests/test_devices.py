"""Device routing: the decisions on the CPU, and the CUDA work with a fake runtime."""

from __future__ import annotations

import collections
import dataclasses
import importlib
import threading
from typing import Any, NamedTuple

import pytest
import torch

import mujou_actors as mujou
from mujou_actors import devices
from mujou_actors._runtime.build import Seams
from mujou_actors.devices import CopyPath, Receive
from tests import fake_cuda
from tests.fake_cuda import FakeRuntime, FakeStream, StaleRead, shadow

# The submodule, not the function mujou_actors.run that shadows it.
run_module = importlib.import_module("mujou_actors.run")

CPU = torch.device("cpu")
GPU0 = torch.device("cuda", 0)
GPU1 = torch.device("cuda", 1)


@pytest.mark.parametrize(
    "sender, readers, path",
    [
        (GPU0, [GPU0], CopyPath.DEVICE),
        (GPU0, [CPU, GPU1], CopyPath.DEVICE),   # one CUDA reader keeps it on the device
        (GPU0, [CPU, CPU], CopyPath.HOST),      # only CPU readers: through host memory
        (GPU0, [], CopyPath.HOST),              # only the host reads it
        (CPU, [GPU0], CopyPath.HOST),           # a CPU sender's messages live on the host
    ],
)
def test_send_path(sender, readers, path) -> None:
    assert devices.send_path(sender, readers) is path


@pytest.mark.parametrize(
    "message, reader, action",
    [
        (CPU, CPU, Receive.SHARE),
        (CPU, GPU0, Receive.HOST_TO_DEVICE),
        (GPU0, GPU0, Receive.WAIT),
        (GPU0, GPU1, Receive.COPY_TO_DEVICE),
        (GPU1, CPU, Receive.COPY_TO_HOST),
    ],
)
def test_receive_action(message, reader, action) -> None:
    assert devices.receive_action(message, reader) is action


@pytest.mark.parametrize(
    "tensor, node, path",
    [(GPU0, GPU0, CopyPath.DEVICE), (GPU1, GPU0, CopyPath.HOST), (CPU, GPU0, CopyPath.HOST),
     (GPU0, CPU, CopyPath.HOST), (CPU, CPU, CopyPath.HOST)],
)
def test_write_path(tensor, node, path) -> None:
    assert devices.write_path(tensor, node) is path


def test_copy_streams_only_for_other_devices() -> None:
    assert devices.copy_stream_devices(CPU, [GPU0, GPU1]) == {GPU0, GPU1}
    assert devices.copy_stream_devices(GPU0, [GPU0, GPU1]) == {GPU1}
    assert devices.copy_stream_devices(GPU0, [CPU]) == set()


@dataclasses.dataclass
class Pose:
    xyz: torch.Tensor
    frame: str


class Pair(NamedTuple):
    a: torch.Tensor
    b: int


def test_map_tensors_rebuilds_containers() -> None:
    msg = {"pose": Pose(torch.ones(2), "map"), "pair": Pair(torch.zeros(1), 3),
           "list": [torch.ones(1), "x"]}

    out = devices.map_tensors(msg, lambda t: t + 1)

    assert torch.equal(out["pose"].xyz, torch.full((2,), 2.0)) and out["pose"].frame == "map"
    assert type(out["pair"]) is Pair and out["pair"].b == 3
    assert torch.equal(out["list"][0], torch.full((1,), 2.0)) and out["list"][1] == "x"
    assert len(devices.tensors_in(msg)) == 3


@dataclasses.dataclass
class Stamped:
    """A dataclass whose ``__post_init__`` counts calls and whose stamp is set after init."""

    img: torch.Tensor
    inits: int = 0
    stamp: Any = dataclasses.field(init=False, default=None)

    def __post_init__(self) -> None:
        self.inits += 1


def test_map_tensors_keeps_init_false_fields_and_does_not_rerun_post_init() -> None:
    msg = Stamped(torch.ones(2))
    msg.stamp = torch.tensor(0.5)

    out = devices.map_tensors(msg, lambda t: t + 1)

    assert type(out) is Stamped and out.inits == 1  # rebuilt, not constructed again
    assert torch.equal(out.img, torch.full((2,), 2.0))
    assert out.stamp is not None and torch.equal(out.stamp, torch.tensor(1.5))
    assert [t.tolist() for t in devices.tensors_in(msg)] == [[1.0, 1.0], 0.5]


def test_a_dataclass_message_reaches_cuda_and_cpu_readers_with_its_init_false_tensor(
        monkeypatch) -> None:
    rt, _, start = fake_cuda.fakes()

    class StampSender(mujou.Node):
        out = mujou.Output(Stamped)

        def __init__(self) -> None:
            super().__init__(period=0.01)

        def on_update(self, dt: float) -> None:
            msg = Stamped(torch.ones(2, device=self.device))
            msg.stamp = torch.tensor(0.5)  # a CPU stamp, set after construction
            self.out.send(msg)

    class StampReader(mujou.Node):
        inp = mujou.Input(Stamped, depth=None)

        def __init__(self) -> None:
            super().__init__(period=None)
            self.got: list[tuple[int, Any, Any]] = []

        def on_update(self, dt: float) -> None:
            for m in self.inp.drain():
                stamp = None if m.stamp is None else (m.stamp.device, float(shadow(m.stamp * 1)))
                self.got.append((m.inits, m.img.device, stamp))

    sender = _on(StampSender(), GPU0)
    gpu, cpu = _on(StampReader(), GPU0), StampReader()
    mujou.connect(sender.out, gpu.inp)
    mujou.connect(sender.out, cpu.inp)

    run = start({"s": sender, "g": gpu, "c": cpu}, timer="simulated", duration=0.01)
    run.join()

    assert gpu.got == [(1, GPU0, (GPU0, 0.5))]
    assert cpu.got == [(1, CPU, (CPU, 0.5))]
    last = run.read("s.out")
    assert (last.inits, last.stamp.device, float(last.stamp)) == (1, CPU, 0.5)


def _gpu() -> tuple[FakeRuntime, FakeStream, FakeStream]:
    """A fake runtime with a sender's and a reader's stream on cuda:0."""
    rt = FakeRuntime()
    return rt, rt.new_stream(GPU0), rt.new_stream(GPU0)


def _sent(rt: FakeRuntime, stream: FakeStream, value: Any) -> devices.DeviceMessage:
    """What a CUDA sender on ``stream`` hands its readers: its copy and a ready event."""
    with rt.use(stream):
        copied = devices.map_tensors(rt.cuda(value, stream.device), lambda t: t.clone())
        return devices.mark_ready(copied, stream.device, rt)


def test_a_reader_on_the_same_device_waits_and_shares_the_copy() -> None:
    rt, sender, reader = _gpu()
    msg = _sent(rt, sender, [torch.ones(3), torch.zeros(2)])
    rt.log.clear()

    out = devices.receive(msg, GPU0, reader, {}, rt)

    assert out is msg.value
    assert rt.log == [("wait_event", "stream2@cuda:0", "event1"),
                      ("record_stream", "stream2@cuda:0", "cuda:0"),
                      ("record_stream", "stream2@cuda:0", "cuda:0")]
    with rt.use(reader):  # the reader's stream may read it: it waited for the event
        assert torch.equal(shadow(out[0] + 1), torch.full((3,), 2.0))


def test_a_reader_that_skips_the_wait_reads_before_ready() -> None:
    rt, sender, reader = _gpu()
    msg = _sent(rt, sender, torch.ones(3))

    with rt.use(reader), pytest.raises(StaleRead, match="stream2@cuda:0"):
        msg.value + 1


def test_a_reader_on_another_gpu_copies_on_its_copy_stream() -> None:
    rt, sender, _ = _gpu()
    reader, copy0 = rt.new_stream(GPU1), rt.new_stream(GPU0)
    msg = _sent(rt, sender, torch.ones(3))

    with rt.use(reader):
        rt.log.clear()
        out = devices.receive(msg, GPU1, reader, {GPU0: copy0}, rt)
        assert torch.equal(shadow(out * 1), torch.ones(3))

    assert out.device == GPU1
    assert rt.log == [
        ("wait_event", "stream4@cuda:0", "event1"),  # the copy waits for the sender's copy
        ("use", "stream4@cuda:0"),
        ("record_stream", "stream4@cuda:0", "cuda:0"),  # the source is read on the copy stream
        ("copy", "cuda:0", "cuda:1"),
        ("new_event", "event2"),
        ("record", "event2", "stream4@cuda:0"),
        ("wait_event", "stream3@cuda:1", "event2"),  # the reader waits for the copy
        ("record_stream", "stream3@cuda:1", "cuda:1"),
    ]


def test_cpu_readers_share_one_host_copy_made_on_a_copy_stream() -> None:
    rt, sender, copy0 = _gpu()
    msg = _sent(rt, sender, torch.ones(2))
    rt.log.clear()

    first = devices.receive(msg, CPU, None, {GPU0: copy0}, rt)
    second = devices.receive(msg, CPU, None, {GPU0: copy0}, rt)

    assert first is second
    assert first.device == CPU and torch.equal(first, torch.ones(2))
    # A non-blocking copy into pinned memory on the copy stream, then a blocking wait.
    assert rt.log == [("wait_event", "stream2@cuda:0", "event1"), ("use", "stream2@cuda:0"),
                      ("to_host", "cuda:0", "stream2@cuda:0"),
                      ("waiter", "blocking", "stream2@cuda:0")]


def test_the_host_orders_its_copy_after_the_ready_event_and_sleeps_until_it_is_done() -> None:
    rt, sender, _ = _gpu()
    msg = _sent(rt, sender, {"x": torch.ones(1)})
    rt.log.clear()

    out = devices.to_host(msg, rt)

    assert rt.log == [("wait_event", "default@cuda:0", "event1"),
                      ("to_host", "cuda:0", "default@cuda:0"),
                      ("waiter", "blocking", "default@cuda:0")]
    assert out["x"].device == CPU and torch.equal(out["x"], torch.ones(1))
    assert devices.to_host(5, rt) == 5


def test_a_cpu_message_for_a_cuda_reader_is_copied_to_its_device() -> None:
    rt, _, reader = _gpu()

    with rt.use(reader):
        out = devices.receive([torch.ones(1), 2], GPU0, reader, {}, rt)

    assert out[0].device == GPU0 and out[1] == 2
    assert rt.log[-1] == ("to_device", "cuda:0", "stream2@cuda:0")  # on its stream, no wait
    assert rt.host_waits() == []


def test_a_cpu_reader_of_a_cpu_message_touches_no_cuda() -> None:
    rt = FakeRuntime()
    msg = torch.ones(1)

    assert devices.receive(msg, CPU, None, {}, rt) is msg
    assert rt.log == []


# -- a whole run with fake CUDA nodes: the wiring of streams, waits and copies ------


class Sender(mujou.Node):
    out = mujou.Output(torch.Tensor)

    def __init__(self, rt: FakeRuntime | None = None) -> None:
        super().__init__(period=0.01)
        self.rt = rt

    def on_update(self, dt: float) -> None:
        value = torch.arange(3.0)
        if self.device.type == "cuda":
            assert self.rt is not None
            self.rt.note_current("on_update")
            value = self.rt.cuda(value, self.device)
        self.out.send(value)


class Reader(mujou.Node):
    inp = mujou.Input(torch.Tensor, depth=None)

    def __init__(self, rt: FakeRuntime | None = None) -> None:
        super().__init__(period=None)
        self.rt = rt
        self.got: list[torch.Tensor] = []

    def on_update(self, dt: float) -> None:
        for t in self.inp.drain():
            assert t.device == self.device, f"{t.device} on a {self.device} reader"
            # Use it on the reader's stream, as a hook would: a stale read raises here.
            self.got.append(shadow(t * 1))


def _on(node: mujou.Node, device: torch.device) -> mujou.Node:
    node._mujou_device = device  # what Node(device=...) gives on a machine with GPUs
    return node


def test_a_run_with_cuda_nodes_gives_streams_waits_and_copies(monkeypatch) -> None:
    rt, waiters, start = fake_cuda.fakes()
    sender = _on(Sender(rt), GPU0)
    same, other, cpu = _on(Reader(rt), GPU0), _on(Reader(rt), GPU1), Reader()
    for reader in (same, other, cpu):
        mujou.connect(sender.out, reader.inp)

    run = start({"s": sender, "same": same, "other": other, "cpu": cpu},
                    timer="simulated", duration=0.02)
    run.join()
    last = run.read("s.out")

    names = [e[1] for e in rt.log if e[0] == "new_stream"]
    assert names == ["stream1@cuda:0", "stream2@cuda:0", "stream3@cuda:1",
                     "stream4@cuda:0", "stream5@cuda:0"]  # 3 own streams, 2 copy streams
    assert ("waiter", "blocking", "default@cuda:0") in rt.log  # the host's streams, at start
    assert ("waiter", "blocking", "default@cuda:1") in rt.log
    assert len(waiters) == 3
    # after on_start, each of the 2 updates, and on_stop
    assert [s.name for s in waiters[0].waits] == ["stream1@cuda:0"] * 4
    assert rt.current_log == [("on_update", {"cuda:0": "stream1@cuda:0"})] * 2
    assert [len(r.got) for r in (same, other, cpu)] == [2, 2, 2]
    assert all(torch.equal(t, torch.arange(3.0)) for r in (same, other, cpu) for t in r.got)
    assert last.device == CPU and torch.equal(last, torch.arange(3.0))
    sends = [e for e in rt.log if e[0] == "record" and e[2] == "stream1@cuda:0"]
    assert len(sends) == 2            # one ready event per send, on the sender's stream


class MixedSender(mujou.Node):
    """Sends a tensor of its device, a CPU stamp and a tensor of another GPU in one message."""

    out = mujou.Output(dict)

    def __init__(self) -> None:
        super().__init__(period=0.01)

    def on_update(self, dt: float) -> None:
        self.out.send({"img": torch.ones(2, device=self.device), "stamp": torch.tensor(0.5),
                       "other": torch.full((2,), 3.0, device="cuda:1")})


class MixedReader(mujou.Node):
    inp = mujou.Input(dict, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.devices: list[dict[str, torch.device]] = []
        self.got: list[dict[str, torch.Tensor]] = []

    def on_update(self, dt: float) -> None:
        for m in self.inp.drain():
            self.devices.append({k: t.device for k, t in m.items()})
            # Used on the reader's stream: a tensor not ordered there raises StaleRead.
            self.got.append({k: shadow(t * 1) for k, t in m.items()})


MIXED = {"img": torch.ones(2), "stamp": torch.tensor(0.5), "other": torch.full((2,), 3.0)}


def test_a_mixed_message_reaches_every_reader_with_each_tensor_on_the_readers_device(
        monkeypatch) -> None:
    rt, _, start = fake_cuda.fakes()
    sender = _on(MixedSender(), GPU0)
    readers = {"same": _on(MixedReader(), GPU0), "gpu1": _on(MixedReader(), GPU1),
               "cpu": MixedReader()}
    for reader in readers.values():
        mujou.connect(sender.out, reader.inp)

    run = start({"s": sender, **readers}, timer="simulated", duration=0.01)
    run.join()

    for name, want in (("same", GPU0), ("gpu1", GPU1), ("cpu", CPU)):
        reader = readers[name]
        assert reader.devices == [dict.fromkeys(MIXED, want)], name
        assert len(reader.got) == 1 and all(
            torch.equal(reader.got[0][k], MIXED[k]) for k in MIXED), name
    recorded = {(e[1], e[2]) for e in rt.log if e[0] == "record_stream"}
    assert recorded <= {(s.name, str(s.device)) for s in rt.streams}
    # The tensor of the third GPU went device to device, never through host memory.
    assert ("copy", "cuda:1", "cuda:0") in rt.log
    assert ("copy", "cuda:1", "cpu") not in rt.log
    last = run.read("s.out")
    assert {k: t.device for k, t in last.items()} == dict.fromkeys(MIXED, CPU)


class OrderedSender(mujou.Node):
    """Sends an OrderedDict (a dict subclass) of a tensor on its device and a CPU stamp."""

    out = mujou.Output(dict)

    def __init__(self) -> None:
        super().__init__(period=0.01)

    def on_update(self, dt: float) -> None:
        self.out.send(collections.OrderedDict(
            img=torch.ones(2, device=self.device), stamp=torch.tensor(0.5)))


def test_a_dict_subclass_message_reaches_every_reader_and_the_host_on_their_devices(
        monkeypatch) -> None:
    rt, _, start = fake_cuda.fakes()
    sender, only_cpu = _on(OrderedSender(), GPU0), _on(OrderedSender(), GPU0)
    readers = {"gpu": _on(MixedReader(), GPU0), "cpu": MixedReader(), "host_path": MixedReader()}
    mujou.connect(sender.out, readers["gpu"].inp)
    mujou.connect(sender.out, readers["cpu"].inp)
    mujou.connect(only_cpu.out, readers["host_path"].inp)  # only a CPU reader: host path

    run = start({"s": sender, "o": only_cpu, **readers}, timer="simulated", duration=0.01)
    run.join()

    want = {"img": torch.ones(2), "stamp": torch.tensor(0.5)}
    for name, device in (("gpu", GPU0), ("cpu", CPU), ("host_path", CPU)):
        reader = readers[name]
        assert reader.devices == [dict.fromkeys(want, device)], name
        assert all(torch.equal(reader.got[0][k], want[k]) for k in want), name
    for port in ("s.out", "o.out"):
        last = run.read(port)
        assert type(last) is collections.OrderedDict and list(last) == ["img", "stamp"]
        assert {k: t.device for k, t in last.items()} == dict.fromkeys(want, CPU), port


def test_a_reader_on_the_senders_device_moves_the_cpu_tensors_of_a_message_to_it() -> None:
    rt, sender, reader = _gpu()
    with rt.use(sender):
        copied = [torch.ones(2, device="cuda:0"), torch.tensor(7.0)]
        msg = devices.mark_ready(copied, GPU0, rt)

    with rt.use(reader):
        rt.log.clear()
        out = devices.receive(msg, GPU0, reader, {}, rt)
        values = [shadow(t * 1) for t in out]

    assert [t.device for t in out] == [GPU0, GPU0]
    assert out[0] is copied[0]                  # the sender's copy, shared
    assert torch.equal(values[1], torch.tensor(7.0))
    assert rt.log == [("wait_event", "stream2@cuda:0", "event1"),
                      ("record_stream", "stream2@cuda:0", "cuda:0"),
                      ("to_device", "cuda:0", "stream2@cuda:0")]  # on its stream, no wait


def test_a_reader_on_another_gpu_gets_the_cpu_tensors_of_a_message_on_its_device() -> None:
    rt, sender, _ = _gpu()
    reader, copy0 = rt.new_stream(GPU1), rt.new_stream(GPU0)
    with rt.use(sender):
        msg = devices.mark_ready((torch.ones(2, device="cuda:0"), torch.tensor(7.0)), GPU0, rt)

    with rt.use(copy0), rt.use(reader):         # as the reader's hooks have them
        out = devices.receive(msg, GPU1, reader, {GPU0: copy0}, rt)
        values = [shadow(t * 1) for t in out]

    assert type(out) is tuple and [t.device for t in out] == [GPU1, GPU1]
    assert torch.equal(values[0], torch.ones(2)) and torch.equal(values[1], torch.tensor(7.0))
    assert not any(e[0] == "record_stream" and e[2] == "cpu" for e in rt.log)


def test_cpu_readers_of_a_mixed_message_share_its_cpu_tensors() -> None:
    rt, sender, copy0 = _gpu()
    stamp = torch.tensor(7.0)
    with rt.use(sender):
        msg = devices.mark_ready([torch.ones(2, device="cuda:0"), stamp], GPU0, rt)

    out = devices.receive(msg, CPU, None, {GPU0: copy0}, rt)

    assert [t.device for t in out] == [CPU, CPU]
    assert out[1] is stamp
    assert torch.equal(out[0], torch.ones(2))


def test_a_sender_moves_a_tensor_of_another_gpu_to_its_device_and_keeps_cpu_ones() -> None:
    rt = FakeRuntime()
    own = rt.new_stream(GPU0)
    with rt.use(own):
        other = torch.full((2,), 3.0, device="cuda:1")
        place = devices.device_copier(GPU0, rt)
        moved, stamp = place(other), place(torch.tensor(1.0))

    assert (moved.device, stamp.device) == (GPU0, CPU)
    assert torch.equal(shadow(moved), torch.full((2,), 3.0))
    assert ("copy", "cuda:1", "cuda:0") in rt.log


@pytest.mark.parametrize("duration", [0.01, 0.04])
def test_an_output_and_a_cross_gpu_reader_each_reuse_one_event_whatever_the_sends(
        monkeypatch, duration: float) -> None:
    rt, _, start = fake_cuda.fakes()
    sender = _on(Sender(rt), GPU0)
    same, other, cpu = _on(Reader(rt), GPU0), _on(Reader(rt), GPU1), Reader()
    for reader in (same, other, cpu):
        mujou.connect(sender.out, reader.inp)

    start({"s": sender, "same": same, "other": other, "cpu": cpu},
              timer="simulated", duration=duration).join()

    sends = round(duration / 0.01)  # updates at 0, 0.01, ... before the end
    records: dict[str, list[str]] = {}
    for e in rt.log:
        if e[0] == "record":
            records.setdefault(e[2], []).append(e[1])
    assert len(set(records["stream1@cuda:0"])) == 1          # the Output's event, reused
    assert len(records["stream1@cuda:0"]) == sends
    assert len(set(records["stream4@cuda:0"])) == 1          # the copy to cuda:1, reused
    assert len(records["stream4@cuda:0"]) == sends
    # 1 for the Output, 3 for what the CUDA nodes keep, 1 for the cross-GPU copies.
    assert len(rt.events) == 5
    assert [len(r.got) for r in (same, other, cpu)] == [sends] * 3
    assert all(torch.equal(t, torch.arange(3.0)) for r in (same, other, cpu) for t in r.got)


def test_a_cuda_sender_read_only_by_cpu_nodes_goes_through_host_memory(monkeypatch) -> None:
    rt, _, start = fake_cuda.fakes()
    sender, cpu = _on(Sender(rt), GPU0), Reader()
    mujou.connect(sender.out, cpu.inp)

    start({"s": sender, "cpu": cpu}, timer="simulated", duration=0.01).join()

    assert not any(e[0] == "record" for e in rt.log)         # no device-path event
    assert not any(e[0] == "use" and e[1] != "stream1@cuda:0" for e in rt.log)
    at = rt.log.index(("to_host", "cuda:0", "stream1@cuda:0"))  # on the sender's stream
    assert rt.log[at + 1] == ("waiter", "blocking", "stream1@cuda:0")
    assert len(cpu.got) == 1 and torch.equal(cpu.got[0], torch.arange(3.0))


def test_a_net_without_cuda_nodes_never_builds_a_runtime() -> None:
    def fail() -> devices.CudaRuntime:
        raise AssertionError("CUDA touched")

    seams = Seams(cuda_runtime=fail)
    sender, cpu = Sender(), Reader()
    mujou.connect(sender.out, cpu.inp)

    run_module._start({"s": sender, "cpu": cpu}, seams=seams, timer="simulated",
                      duration=0.01).join()

    assert len(cpu.got) == 1


def test_bad_cuda_sync_is_named() -> None:
    with pytest.raises(ValueError, match="cuda_sync"):
        mujou.run(Sender(), cuda_sync="sleep")


@pytest.mark.cuda
def test_a_cuda_port_hand_off_keeps_the_tensor_on_the_device() -> None:
    class OnDevice(Sender):
        def __init__(self) -> None:
            mujou.Node.__init__(self, period=0.01, device="cuda:0")

        def on_update(self, dt: float) -> None:
            self.out.send(torch.arange(3.0, device=self.device))

    class GpuReader(Reader):
        def __init__(self) -> None:
            mujou.Node.__init__(self, period=None, device="cuda:0")
            self.got = []

    src, dst, cpu = OnDevice(), GpuReader(), Reader()
    mujou.connect(src.out, dst.inp)
    mujou.connect(src.out, cpu.inp)

    run = mujou.run({"s": src, "r": dst, "c": cpu}, timer="simulated", duration=0.03)
    run.join()

    assert [t.device for t in dst.got] == [GPU0] * 3
    assert [t.device for t in cpu.got] == [CPU] * 3
    assert all(torch.equal(t.cpu(), torch.arange(3.0)) for t in dst.got + cpu.got)
    assert run.read("s.out").device == CPU


def test_a_cuda_node_is_waited_for_around_state_dict_and_after_a_restore(monkeypatch) -> None:
    rt, waiters, start = fake_cuda.fakes()

    class Model(Sender):
        def __init__(self) -> None:
            super().__init__(rt)
            self.w = rt.cuda(torch.zeros(2))

    node = _on(Model(), GPU0)
    run = start({"m": node}, timer="simulated", duration=0.0)
    run.join()
    updates_waits = len(waiters[0].waits)

    tree = run.state_dict()

    assert len(waiters[0].waits) == updates_waits + 2        # before and after state_dict
    assert tree["nodes"]["m"]["w"].device == CPU
    again = _on(Model(), GPU0)
    start({"m": again}, timer="simulated", duration=0.0, state=tree).join()
    assert len(waiters[1].waits) == 3                 # after on_start, the restore, on_stop


# -- host reads of a CUDA node's Input (its kept values) ----------------------------


class Blocking(mujou.Node):
    """Reads its Input on the node's stream and stays in on_update until released."""

    inp = mujou.Input(torch.Tensor)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.inside, self.release = threading.Event(), threading.Event()
        self.got: list[torch.Tensor] = []

    def on_update(self, dt: float) -> None:
        self.inside.set()
        assert self.release.wait(10), "never released"
        self.got.append(shadow(self.inp.read() * 1))


class HeldSender(Sender):
    """Sends once, then stays in on_update (its stream not yet waited for) until released."""

    def __init__(self, rt: FakeRuntime) -> None:
        super().__init__(rt)
        self.release = threading.Event()

    def on_update(self, dt: float) -> None:
        if self.rt.current_log:  # only the first update sends
            return
        super().on_update(dt)
        assert self.release.wait(10), "never released"


@pytest.mark.timeout(20)
def test_a_host_read_of_a_cuda_nodes_input_waits_for_a_copy_made_on_its_stream(
        monkeypatch) -> None:
    rt, _, start = fake_cuda.fakes()
    sender, reader = Sender(), _on(Blocking(), GPU0)       # a CPU message, copied on the GPU
    mujou.connect(sender.out, reader.inp)
    run = start({"s": sender, "r": reader}, timer="simulated", duration=0.01)
    try:
        assert reader.inside.wait(10)
        # The reader's stream holds the host-to-device copy, not yet waited for.
        kept = run.read("r.inp")
    finally:
        reader.release.set()
        run.join()

    assert kept.device == CPU and torch.equal(kept, torch.arange(3.0))
    assert [torch.equal(t, torch.arange(3.0)) for t in reader.got] == [True]


@pytest.mark.timeout(20)
def test_a_host_read_of_a_cuda_nodes_input_waits_for_a_sender_still_in_its_update(
        monkeypatch) -> None:
    rt, waiters, start = fake_cuda.fakes()
    sender, reader = _on(HeldSender(rt), GPU0), _on(Blocking(), GPU0)
    mujou.connect(sender.out, reader.inp)
    run = start({"s": sender, "r": reader}, timer="realtime", duration=None, workers=2)
    try:
        assert reader.inside.wait(10)
        assert len(waiters[0].waits) == 1  # the sender's stream: waited for after on_start only
        assert [e.query() for e in rt.events if e.recorded] == [False, False]  # send, receive
        kept = run.read("r.inp")
    finally:
        sender.release.set()
        reader.release.set()
        run.stop()
        run.join()

    assert kept.device == CPU and torch.equal(kept, torch.arange(3.0))
    assert [torch.equal(t, torch.arange(3.0)) for t in reader.got] == [True]


class Noting(mujou.Node):
    """Notes the thread's current streams in each of its hooks."""

    inp = mujou.Input(torch.Tensor)

    def __init__(self, rt: FakeRuntime, label: str) -> None:
        super().__init__(period=0.01)
        self.rt, self.label = rt, label

    def on_start(self) -> None:
        self.rt.note_current(f"{self.label}.on_start")

    def on_update(self, dt: float) -> None:
        self.rt.note_current(f"{self.label}.on_update")

    def on_stop(self) -> None:
        self.rt.note_current(f"{self.label}.on_stop")

    def state_dict(self) -> dict[str, Any]:
        self.rt.note_current(f"{self.label}.state_dict")
        return super().state_dict()


def test_every_hook_of_a_cuda_node_runs_on_its_streams_and_a_cpu_node_after_it_on_none(
        monkeypatch) -> None:
    rt, _, start = fake_cuda.fakes()
    source, cpu_source = _on(Sender(rt), GPU0), Sender()
    gpu, cpu = _on(Noting(rt, "gpu"), GPU1), Noting(rt, "cpu")
    mujou.connect(source.out, gpu.inp)
    mujou.connect(cpu_source.out, cpu.inp)   # a CPU node that reads no CUDA node

    run = start({"s": source, "c": cpu_source, "gpu": gpu, "cpu": cpu}, timer="simulated",
                    duration=0.01, workers=1)  # one worker: both nodes run on one thread
    run.join()
    run.state_dict()  # after the end: on the host's thread

    seen = {label: current for label, current in rt.current_log if "." in label}
    own = {"cuda:0": "stream3@cuda:0", "cuda:1": "stream2@cuda:1"}  # its copy stream, its own
    assert seen == {**{f"gpu.{h}": own for h in ("on_start", "on_update", "on_stop",
                                                 "state_dict")},
                    **{f"cpu.{h}": {} for h in ("on_start", "on_update", "on_stop",
                                                "state_dict")}}
    assert [label for label, _ in rt.current_log if label.startswith("gpu.")] == [
        "gpu.on_start", "gpu.on_update", "gpu.on_stop", "gpu.state_dict"]


# -- Run.watch of a CUDA node's Output: nothing on the sender, the copy at the take ----


class GoSender(Sender):
    """Sends once when told (``go``), then stays in that update until released."""

    def __init__(self, rt: FakeRuntime) -> None:
        super().__init__(rt)
        self.go, self.sent, self.release = (threading.Event(), threading.Event(),
                                            threading.Event())

    def on_update(self, dt: float) -> None:
        if self.sent.is_set():
            return
        assert self.go.wait(10), "never told to send"
        super().on_update(dt)
        self.sent.set()
        # Held: the sender's stream is not waited for, so its work is not done.
        assert self.release.wait(10), "never released"


@pytest.mark.timeout(30)
def test_a_watch_of_a_cuda_port_queues_the_device_message_and_copies_it_once_it_is_ready(
        monkeypatch) -> None:
    rt, _, start = fake_cuda.fakes()
    # The device path: a reader on the sender's GPU, held in its update (its stream, which
    # waits for the send's ready event, not waited for either).
    sender, reader = _on(GoSender(rt), GPU0), _on(Blocking(), GPU0)
    mujou.connect(sender.out, reader.inp)
    run = start({"s": sender, "r": reader}, timer="realtime", duration=None, workers=2)
    try:
        own, shared = run.watch("s.out", with_time=True), run.watch("s.out")
        sender.go.set()
        assert sender.sent.wait(10) and reader.inside.wait(10)
        # The send queued a reference to the device message: no copy, no wait, for either.
        assert own.pending == shared.pending == 1
        assert not any(e[0] == "to_host" for e in rt.log)
        [(_, ready, _)] = [e for e in rt.log if e[0] == "record" and e[2] == "stream1@cuda:0"]
        assert not next(e for e in rt.events if e.name == ready).query()  # the GPU is behind
        at = len(rt.log)
        [(t_ns, copy)] = own.take()
        [view] = shared.take(copy=False)
        took = [e for e in rt.log[at:] if "default@cuda:0" in e]  # the host's, not the reader's
    finally:
        sender.release.set()
        reader.release.set()
        run.stop()
    run.join()

    # The host's stream waits for the ready event, copies on it, and the host waits for it;
    # the shared view is that same CPU copy (one copy to the host for both watches).
    assert took == [("wait_event", "default@cuda:0", ready),
                    ("to_host", "cuda:0", "default@cuda:0"),
                    ("waiter", "blocking", "default@cuda:0")]
    assert copy.device == CPU and torch.equal(copy, torch.arange(3.0)) and t_ns >= 0
    assert view.device == CPU and torch.equal(view, torch.arange(3.0)) and view is not copy
    assert [torch.equal(t, torch.arange(3.0)) for t in reader.got] == [True]


@pytest.mark.timeout(30)
def test_a_watch_of_a_cuda_port_read_through_host_memory_adds_no_cuda_work(
        monkeypatch) -> None:
    rt, _, start = fake_cuda.fakes()
    sender, cpu = _on(GoSender(rt), GPU0), Reader()  # only CPU readers: the host path
    mujou.connect(sender.out, cpu.inp)
    run = start({"s": sender, "cpu": cpu}, timer="realtime", duration=None)
    try:
        own, shared = run.watch("s.out"), run.watch("s.out")
        sender.go.set()
        assert sender.sent.wait(10)
        at = len(rt.log)
        [copy], [view] = own.take(), shared.take(copy=False)
        took = rt.log[at:]
    finally:
        sender.release.set()
        run.stop()
    run.join()

    # The send made its one host copy (for the CPU reader) and waited for it; the watches
    # take that CPU message: a clone for one, the message itself for the other.
    assert [e for e in rt.log if e[0] == "to_host"] == [("to_host", "cuda:0", "stream1@cuda:0")]
    assert took == []
    assert copy.device == view.device == CPU and copy is not view
    assert torch.equal(copy, torch.arange(3.0)) and torch.equal(view, torch.arange(3.0))


def test_torch_settings_round_trip_and_leave_threads_out_for_another_machine() -> None:
    from mujou_actors.devices import apply_torch_settings, torch_settings
    before = torch_settings()
    assert "num_threads" in before and "num_threads" not in torch_settings(threads=False)
    assert set(torch_settings(threads=False)) == set(before) - {"num_threads"}
    try:
        torch.set_default_dtype(torch.float64)
        torch.use_deterministic_algorithms(True, warn_only=True)
        changed = torch_settings()
        apply_torch_settings(before, owner="test")
        assert torch_settings() == before and torch.get_default_dtype() == torch.float32
        # As a codec hands it over: the pair as a list.
        apply_torch_settings({**changed, "deterministic": [True, True]}, owner="test")
        assert torch_settings() == changed
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        apply_torch_settings(before, owner="test")
    assert torch_settings() == before
    apply_torch_settings(None, owner="test")
    assert torch_settings() == before


@pytest.mark.parametrize("settings, match", [
    ({"num_threadz": 1}, r"placed group 'a': unknown torch setting 'num_threadz'"),
    ({"default_dtype": "int64"}, r"placed group 'a': cannot set torch's default_dtype to "
                                 r"the host's 'int64'"),
    ({"float32_matmul_precision": "fastest"}, r"cannot set torch's float32_matmul_precision"),
])
def test_a_torch_setting_this_process_cannot_take_is_a_clear_error(settings: dict,
                                                                   match: str) -> None:
    from mujou_actors.devices import apply_torch_settings, torch_settings
    before = torch_settings()
    with pytest.raises(ValueError, match=match):
        apply_torch_settings(settings, owner="placed group 'a'")
    assert torch_settings() == before
