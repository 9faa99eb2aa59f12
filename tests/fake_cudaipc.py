"""A strict fake of CUDA IPC, on `fake_cuda.FakeRuntime`, for the CPU tests of `cudaipc`.

`FakeIpc` is a `mujou_actors.distributed.cudaipc.IpcRuntime`: both "processes"
of a test (the producer's `Exporter` and the consumer's `Importer`) use one
`FakeIpc`, which stands for the driver they share. It is strict where CUDA
would fail or read stale memory:

* **Handles.** `share` gives a handle to a fake CUDA tensor's memory; `open`
  gives a fake tensor that shares the producer's shadow (as an IPC mapping
  does), written by the producer's work. Opening a handle whose producer let
  go of the tensor (collected: the caching allocator could have reused it)
  raises ``RuntimeError``, as a stale handle would read garbage.
* **Events.** `ipc_event` records an event on the stream it is given;
  `event_from_handle` gives that very event, so a consumer stream that waits
  on it is ordered after the producer's work, and one that does not raises
  `fake_cuda.StaleRead` at its copy.
* **Devices** have UUIDs (``b"GPU-fake-<i>"``); `visible` lists the ordinals
  this "process" sees.

Every call is logged in ``rt.log`` as ``("ipc", what, ...)``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from mujou_actors.distributed.cudaipc import IpcRuntime
from tests.fake_cuda import FakeCudaTensor, FakeEvent, FakeRuntime, FakeStream


class FakeIpc(IpcRuntime):
    """CUDA IPC between the "processes" of one test, on a `FakeRuntime`.

    Args:
        rt (FakeRuntime): the fake GPU.
        available (bool): what `available` says. Default True.
        visible (Sequence[int]): the device ordinals this side sees. Default (0, 1).
    """

    def __init__(self, rt: FakeRuntime, *, available: bool = True,
                 visible: Sequence[int] = (0, 1)) -> None:
        self.rt = rt
        self._available = available
        self.visible = list(visible)
        self._memory: dict[bytes, weakref.ref[FakeCudaTensor]] = {}
        self._events: dict[bytes, FakeEvent] = {}
        self.opened: list[FakeCudaTensor] = []  # what `open` gave, in order
        self.refuse_share = False  # True: `share` raises, as for memory torch did not make

    def _log(self, *entry: Any) -> None:
        self.rt.log.append(("ipc", *entry))

    def available(self) -> bool:
        return self._available

    def device_uuid(self, index: int) -> bytes:
        return f"GPU-fake-{index}".encode()

    def local_index(self, uuid: bytes) -> int | None:
        for i in self.visible:
            if self.device_uuid(i) == uuid:
                return i
        return None

    def current_stream(self, device: torch.device) -> Any:
        return self.rt.current_stream(device)

    def wait_event(self, stream: Any, event: Any) -> None:
        self.rt.wait_event(stream, event)

    def ipc_event(self, stream: Any) -> tuple[Any, bytes]:
        if not isinstance(stream, FakeStream):
            raise TypeError(f"ipc_event: expected a FakeStream, got {stream!r}")
        event = self.rt.make_event(blocking=False)
        self.rt.record(event, stream)
        handle = f"ipc-{event.name}".encode()
        self._events[handle] = event
        self._log("ipc_event", event.name, stream.name)
        return event, handle

    def share(self, tensor: torch.Tensor, stream: Any) -> list[Any]:
        if not isinstance(tensor, FakeCudaTensor):
            raise TypeError(f"share: not a fake CUDA tensor: {type(tensor).__name__}")
        if self.refuse_share:
            raise RuntimeError("fake: this memory was not allocated by torch's allocator")
        root = tensor.root if tensor.root is not None else tensor
        handle = f"mem-{len(self._memory) + 1}".encode()
        self._memory[handle] = weakref.ref(tensor)
        self._log("share", handle, stream.name)
        nbytes = root.shadow.untyped_storage().nbytes()
        return [handle, nbytes, 0, b"/fake_counter", 0, None, False]

    def open(self, index: int, fields: list[Any], dtype: torch.dtype, shape: Sequence[int],
             offset: int, strides: Sequence[int]) -> torch.Tensor:
        handle = fields[0]
        ref = self._memory.get(handle)
        tensor = None if ref is None else ref()
        if tensor is None:
            raise RuntimeError(f"fake: invalid IPC handle {handle!r} (its memory was freed)")
        if index not in self.visible or tensor.device.index != index:
            raise RuntimeError(f"fake: handle {handle!r} opened on cuda:{index}, it is on "
                               f"{tensor.device}")
        if tensor.dtype != dtype or list(tensor.shape) != list(shape) \
                or list(tensor.stride()) != list(strides):
            raise RuntimeError("fake: the descriptor does not describe the shared tensor")
        # The same memory (the shadow), written by the producer's work.
        out = FakeCudaTensor(tensor.shadow, tensor.device, self.rt, tensor.writer)
        out.root = tensor.root
        self.opened.append(out)
        self._log("open", handle, index)
        return out

    def event_from_handle(self, index: int, handle: bytes) -> Any:
        event = self._events.get(handle)
        if event is None:
            raise RuntimeError(f"fake: invalid event handle {handle!r}")
        self._log("event_from_handle", event.name)
        return event

    def copy_on(self, stream: Any, tensor: torch.Tensor) -> torch.Tensor:
        self._log("copy_on", stream.name)
        with self.rt.use(stream):
            return tensor.clone(memory_format=torch.contiguous_format)

    def done_event(self, stream: Any) -> Any:
        event = self.rt.make_event(blocking=False)
        self.rt.record(event, stream)
        self._log("done_event", event.name, stream.name)
        return event

    def to_cpu(self, stream: Any, tensor: torch.Tensor) -> torch.Tensor:
        self._log("to_cpu", stream.name)
        with self.rt.use(stream):
            return tensor.cpu()

    def query(self, event: Any) -> bool:
        return bool(event.query())

    def synchronize(self, event: Any) -> None:
        self._log("synchronize", event.name)
        event.synchronize()
