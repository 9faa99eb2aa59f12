"""The strict fake CUDA runtime (tests/fake_cuda.py) refuses what real CUDA would punish."""

from __future__ import annotations

import threading

import pytest
import torch

from mujou_actors import cuda, devices
from tests.fake_cuda import FakeCudaTensor, FakeRuntime, StaleRead, shadow

CPU = torch.device("cpu")
GPU0 = torch.device("cuda", 0)
GPU1 = torch.device("cuda", 1)


def test_a_fake_tensor_reports_its_cuda_device_and_keeps_its_values() -> None:
    rt = FakeRuntime()
    stream = rt.new_stream(GPU1)

    with rt.use(stream):
        x = torch.arange(3.0, device="cuda:1")
        y = (x * 2).to("cuda:1")
        z = y.sum()

    assert isinstance(x, FakeCudaTensor)
    assert (x.device, y.device, z.device) == (GPU1, GPU1, GPU1)
    assert torch.equal(shadow(y), torch.tensor([0.0, 2.0, 4.0]))
    assert float(shadow(z)) == 6.0


def test_record_stream_of_a_cpu_tensor_is_not_implemented_as_in_torch() -> None:
    rt = FakeRuntime()
    stream = rt.new_stream(GPU0)

    with pytest.raises(NotImplementedError, match="only implemented for CUDA tensors"):
        rt.record_stream(torch.ones(2), stream)
    with pytest.raises(TypeError, match="FakeStream"):
        rt.record_stream(rt.cuda(torch.ones(2)), "not a stream")
    rt.record_stream(rt.cuda(torch.ones(2)), stream)

    assert rt.log == [("new_stream", "stream1@cuda:0"),
                      ("record_stream", "stream1@cuda:0", "cuda:0")]


def test_mixing_devices_in_one_op_raises_as_in_torch_but_a_cpu_scalar_is_fine() -> None:
    rt = FakeRuntime()
    rt.finish_all()
    x = rt.cuda(torch.ones(2))
    rt.finish_all()

    with pytest.raises(RuntimeError, match="same device.*cuda:0 and cpu"):
        x + torch.ones(2)
    with pytest.raises(RuntimeError, match="same device.*cuda:0 and cuda:1"):
        x + rt.cuda(torch.ones(2), GPU1)
    assert torch.equal(shadow(x + torch.tensor(1.0)), torch.full((2,), 2.0))


def test_a_read_on_another_stream_before_its_event_is_waited_for_is_stale() -> None:
    rt = FakeRuntime()
    writer, reader = rt.new_stream(GPU0), rt.new_stream(GPU0)
    with rt.use(writer):
        x = torch.ones(2, device="cuda:0")
        ready = rt.new_event()
        rt.record(ready, writer)

    with rt.use(reader), pytest.raises(StaleRead, match="stream2@cuda:0"):
        x + 1
    with pytest.raises(StaleRead, match="default@cuda:0"):
        rt.copy(x, CPU, non_blocking=False)      # the host's stream: not ordered either
    assert ready.query() is False

    rt.wait_event(reader, ready)
    with rt.use(reader):
        assert torch.equal(shadow(x + 1), torch.full((2,), 2.0))
    with pytest.raises(StaleRead):
        rt.copy(x, CPU, non_blocking=False)      # a GPU-side wait orders the reader only

    ready.finish()                               # the test says: the GPU got there
    assert ready.query() is True
    assert torch.equal(rt.copy(x, CPU, non_blocking=False), torch.ones(2))


def test_a_host_wait_for_an_event_makes_the_work_before_it_readable_by_the_host() -> None:
    rt = FakeRuntime()
    writer = rt.new_stream(GPU0)
    with rt.use(writer):
        x = torch.ones(2, device="cuda:0")
    event = rt.new_event()
    rt.record(event, writer)
    with rt.use(writer):
        later = x * 3                            # queued after the event: not covered

    rt.wait_ready(event)  # through the thread's waiter

    assert torch.equal(rt.copy(x, CPU, non_blocking=False), torch.ones(2))
    with pytest.raises(StaleRead):
        rt.copy(later, CPU, non_blocking=False)


def test_the_stream_waiter_of_mujou_makes_a_streams_work_readable() -> None:
    rt = FakeRuntime()
    stream = rt.new_stream(GPU0)
    with rt.use(stream):
        x = torch.full((2,), 5.0, device="cuda:0")
    waiter = cuda.StreamWaiter("block",
                               event_factory=lambda blocking: rt.make_event(blocking=blocking))

    with pytest.raises(StaleRead):
        rt.copy(x, CPU, non_blocking=False)
    waiter.wait(stream)

    assert rt.events[0].blocking is True
    assert torch.equal(rt.copy(x, CPU, non_blocking=False), torch.full((2,), 5.0))


@pytest.mark.timeout(10)
@pytest.mark.parametrize("sync, polls", [("block", 0), ("spin", 3), ("yield", 3)])
def test_each_waiter_mode_waits_until_the_streams_work_is_done(sync: str, polls: int) -> None:
    rt = FakeRuntime()
    rt.done_after_polls = 3                      # the GPU gets there at the third poll
    stream = rt.new_stream(GPU0)
    with rt.use(stream):
        x = torch.full((2,), 5.0, device="cuda:0")
    waiter = cuda.make_waiter(sync, event_factory=lambda blocking: rt.make_event(blocking=blocking),
                              yield_fn=lambda: None)

    waiter.wait(stream)

    assert rt.events[0].polls == polls
    assert rt.events[0].blocking is (sync == "block")
    assert torch.equal(rt.copy(x, CPU, non_blocking=False), torch.full((2,), 5.0))


def test_current_streams_are_per_thread_and_per_device() -> None:
    rt = FakeRuntime()
    s0, s1 = rt.new_stream(GPU0), rt.new_stream(GPU1)
    seen: dict[str, str] = {}
    entered, checked = threading.Event(), threading.Event()

    def other() -> None:
        entered.wait(5)
        seen["other"] = rt.current_stream(GPU0).name
        checked.set()

    thread = threading.Thread(target=other)
    thread.start()
    with rt.use(s1), rt.use(s0):
        rt.note_current("inner")
        assert rt.current_stream(GPU1) is s1 and rt.current_stream(GPU0) is s0
        entered.set()
        assert checked.wait(5)
    thread.join(5)
    rt.note_current("after")

    assert seen == {"other": "default@cuda:0"}
    assert rt.current_log == [("inner", {"cuda:1": "stream2@cuda:1", "cuda:0": "stream1@cuda:0"}),
                              ("after", {})]
    assert rt.current_stream(GPU0).name == "default@cuda:0"


def test_a_write_through_a_view_makes_the_whole_tensor_unready_elsewhere() -> None:
    rt = FakeRuntime()
    writer, reader = rt.new_stream(GPU0), rt.new_stream(GPU0)
    with rt.use(writer):
        x = torch.zeros(4, device="cuda:0")
    done = rt.new_event()
    rt.record(done, writer)
    rt.wait_event(reader, done)
    with rt.use(writer):
        x[1:3] = 5.0                             # after the event the reader waited for
        x.view(2, 2)[0].add_(1)

    with rt.use(reader), pytest.raises(StaleRead):
        x + 1
    with rt.use(reader), pytest.raises(StaleRead):
        x[0] + 1                                 # a fresh view reads the root's writes too
    rt.finish_all()
    assert torch.equal(rt.copy(x, CPU, non_blocking=False), torch.tensor([1.0, 6.0, 5.0, 0.0]))


TEST_ONLY = {"cuda", "note_current", "finish_all", "check_read", "complete", "host_waits"}


def test_the_fake_implements_only_the_facades_methods_besides_its_test_hands() -> None:
    # A method the code calls on the fake but the real facade lacks would pass
    # every CPU test and fail on the first GPU.
    fake = {n for n, v in vars(FakeRuntime).items() if callable(v) and not n.startswith("_")}

    assert fake - TEST_ONLY <= {n for n in dir(devices.CudaRuntime) if not n.startswith("_")}
    assert not TEST_ONLY & set(dir(devices.CudaRuntime))
