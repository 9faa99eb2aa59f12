"""A strict fake of the CUDA runtime, for the CPU tests of the device paths.

The run reaches CUDA only through `mujou_actors.devices.CudaRuntime` and the
waiters of its CUDA nodes, both made through the kernel's seams
(`mujou_actors._runtime.build.Seams`). `FakeRuntime` stands for the first and
`FakeWaiter` for the second (`fakes` gives a ``mujou.run`` with both), so a
whole run with "CUDA" nodes executes on a CPU-only build of torch.

The fake is strict where real CUDA would fail, corrupt or read stale memory,
so a test can fail for the same mistakes a GPU would punish:

* **Tensors.** `FakeCudaTensor` reports ``device.type == "cuda"`` (``cuda:N``)
  and keeps its data in a CPU *shadow* tensor, so values can be compared
  (`shadow`, or `FakeRuntime.copy` to the CPU). Every torch operation on it
  runs on the shadow and gives fake CUDA results; an operation that mixes it
  with a CPU tensor of more than zero dimensions, or with a fake tensor of
  another device, raises ``RuntimeError`` as torch does. ``.to("cuda...")``
  and ``.cuda()`` do not work on a CPU build: device moves go through
  `FakeRuntime.copy` (as the code under test does) or `FakeRuntime.cuda`.
* **record_stream** refuses any tensor that is not on a CUDA device with
  ``NotImplementedError``, as torch does, and a stream that is not a
  `FakeStream` with ``TypeError``.
* **Streams.** `FakeRuntime.use` is a stream context: per thread and per
  device, as in torch, the innermost stream entered for a device is that
  device's current stream (`current_stream`), and the device's default stream
  otherwise. Every entry is logged, and `FakeRuntime.current_log` records, for
  each call of `note_current`, the thread's current streams (call it in a hook
  to see which stream the hook ran on).
* **Ordering.** The fake GPU is pessimistic: queued work is never done on its
  own. Each operation on a fake tensor is a unit of work queued on the current
  stream of its device; its results carry that stream and the work's number.
  A read (any operation taking the tensor, a copy to another device or to the
  host) is allowed only when it is ordered after that work: it runs on the
  same stream, or its stream waited (``wait_event``) for an event recorded
  after the work, or the host learnt the work is done. Otherwise the read
  raises `StaleRead` ("read before ready"). Work becomes done for the host
  through `FakeEvent.synchronize`, `FakeStream.synchronize`, a blocking copy
  to the host (it synchronizes the stream it runs on, as in CUDA),
  `FakeWaiter.wait`, or the test: `FakeEvent.finish` (the GPU reached that
  event) and `FakeRuntime.finish_all` (the GPU caught up). `FakeEvent.query`
  tells whether the event's work is done; events never recorded are done, as
  in CUDA. With ``FakeRuntime.done_after_polls = N`` an event's work is done
  at its N-th query after a record (the GPU progresses while a waiter polls).
* **Log.** `FakeRuntime.log` holds one tuple per runtime call, with streams
  and events by name (``"stream1@cuda:0"``, ``"event1"``), so tests can assert
  orders and counts.

* **Host waits.** `FakeRuntime.make_waiter` gives each thread a real
  `StreamWaiter` of the run's ``cuda_sync`` whose events (`WaiterEvent`) log
  how the thread waited; `FakeRuntime.host_waits` lists every host wait, those
  through a waiter and the spinning ones (a stream's or an event's
  ``synchronize``, a blocking copy to the CPU). `FakeRuntime.to_host`, the
  non-blocking copy into pinned memory, gives a CPU tensor of garbage (NaN)
  until the host has waited for the stream it was queued on.

Use `install` to put a fresh runtime and waiters behind the run's seams in a
test. Nodes "on CUDA" are made with ``node._mujou_device = torch.device(
"cuda", i)`` (``Node(device="cuda")`` checks for a real GPU); inside their
hooks, where a fake stream is current, ``torch.zeros(..., device="cuda:0")``,
``t.to("cuda:1")`` and ``t.cuda()`` make fake tensors.

Not modelled: the caching allocator's reuse of freed memory (a test checks
``record_stream`` in the log instead). Views are followed: a write through
``t[0]`` or ``t.view(...)`` counts as a write of ``t``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from mujou_actors import devices
from mujou_actors.cuda import StreamWaiter

CPU = torch.device("cpu")


class StaleRead(AssertionError):
    """A fake CUDA tensor was read before the work that wrote it was ordered before the read."""


class FakeStream:
    """A CUDA stream of the fake GPU: queued work, what it waited for, what is done.

    Attributes:
        name (str): ``"stream<N>@cuda:<i>"`` or ``"default@cuda:<i>"``.
        device (torch.device): the stream's device.
        queued (int): units of work queued on it so far.
        done (int): units known to the host as done.
        seen (dict[FakeStream, int]): for each other stream, the work this
            stream waited for (through events), transitively.
    """

    def __init__(self, rt: FakeRuntime, name: str, device: torch.device) -> None:
        self.rt = rt
        self.name = name
        self.device = device
        self.queued = 0
        self.done = 0
        self.seen: dict[FakeStream, int] = {}

    def __repr__(self) -> str:
        return self.name

    def horizon(self) -> dict[FakeStream, int]:
        """What this stream's next work is ordered after: its own work and what it waited."""
        h = dict(self.seen)
        h[self] = self.queued
        return h

    def enqueue(self) -> int:
        """Queue one unit of work; its number."""
        self.queued += 1
        return self.queued

    def orders(self, stream: FakeStream, seq: int) -> bool:
        """Whether work ``seq`` of ``stream`` is ordered before this stream's next work."""
        return stream is self or self.seen.get(stream, 0) >= seq or stream.done >= seq

    def wait_event(self, event: FakeEvent) -> None:
        """Order this stream's later work after ``event`` (a GPU-side wait)."""
        for stream, seq in (event.recorded or {}).items():
            if stream is not self and self.seen.get(stream, 0) < seq:
                self.seen[stream] = seq

    def synchronize(self) -> None:
        """The host waits for everything queued on this stream (and what it waited for)."""
        self.rt.log.append(("stream_synchronize", self.name))
        self.rt.complete(self.horizon())

    def query(self) -> bool:
        """Whether everything queued on this stream is done."""
        return self.done >= self.queued


class FakeEvent:
    """A CUDA event of the fake GPU; it is done only when the host waited or the test says so.

    Attributes:
        name (str): ``"event<N>"``.
        blocking (bool): what the code under test asked for (`FakeRuntime.make_event`'s
            ``blocking=``, as ``torch.cuda.Event(blocking=...)``).
        recorded (dict[FakeStream, int] | None): the work it marks, from its
            last ``record``; None before the first.
        records (int): how often it was recorded.
    """

    def __init__(self, rt: FakeRuntime, name: str, blocking: bool = False) -> None:
        self.rt = rt
        self.name = name
        self.blocking = blocking
        self.recorded: dict[FakeStream, int] | None = None
        self.records = 0
        self.polls = 0  # queries since the last record

    def __repr__(self) -> str:
        return self.name

    def record(self, stream: FakeStream | None = None) -> None:
        """Mark the work queued so far on ``stream`` (default: the current stream of device 0)."""
        if stream is None:
            stream = self.rt.current_stream(torch.device("cuda", 0))
        if not isinstance(stream, FakeStream):
            raise TypeError(f"{self.name}.record: expected a FakeStream, got {stream!r}")
        self.recorded = stream.horizon()
        self.records += 1
        self.polls = 0

    def query(self) -> bool:
        """Whether the work it marks is done (True for an event never recorded).

        With ``rt.done_after_polls = N``, the N-th query since the last record
        finds it done: the GPU got there while the host polled.
        """
        done = all(s.done >= n for s, n in (self.recorded or {}).items())
        if not done and self.rt.done_after_polls is not None:
            self.polls += 1
            if self.polls >= self.rt.done_after_polls:
                self.finish()
                done = True
        return done

    def synchronize(self) -> None:
        """The host waits until the work it marks is done."""
        self.rt.complete(self.recorded or {})

    def finish(self) -> None:
        """The test's hand: the GPU has reached this event (nothing is logged)."""
        self.rt.complete(self.recorded or {})


class WaiterEvent(FakeEvent):
    """The event of a real `StreamWaiter` made by `FakeRuntime.make_waiter`; its waits are logged.

    ``synchronize`` logs ``("waiter", "blocking" | "polling", what)``: a
    blocking event sleeps, a plain one spins inside ``synchronize`` (under
    CUDA's default flag). ``query`` (the spin and yield waiters) logs
    ``("waiter", "polling", what)`` the first time after each record.
    """

    def __init__(self, rt: FakeRuntime, name: str, blocking: bool) -> None:
        super().__init__(rt, name, blocking)
        self.what = ""
        self.polled = False

    def record(self, stream: FakeStream | None = None) -> None:
        super().record(stream)
        self.what = getattr(stream, "name", str(stream))
        self.polled = False

    def synchronize(self) -> None:
        self.rt.log.append(("waiter", "blocking" if self.blocking else "polling", self.what))
        super().synchronize()

    def query(self) -> bool:
        if not self.polled:
            self.rt.log.append(("waiter", "polling", self.what))
            self.polled = True
        self.rt.complete(self.recorded or {})  # the fake GPU is done once polled
        return True


class FakeWaiter:
    """Stands in for `mujou_actors.cuda.StreamWaiter`: the host waits for a stream's work."""

    def __init__(self, sync: str = "block") -> None:
        self.sync = sync
        self.waits: list[FakeStream] = []

    def wait(self, stream: FakeStream) -> None:
        """Record the wait, and mark everything queued on ``stream`` done."""
        self.waits.append(stream)
        stream.rt.complete(stream.horizon())


class FakeCudaTensor(torch.Tensor):
    """A tensor that says it is on ``cuda:N``, holding its data in a CPU shadow.

    Attributes:
        shadow (torch.Tensor): the data, on the CPU.
        rt (FakeRuntime): the runtime whose streams order its reads.
        writer (tuple[FakeStream, int]): the stream and work that wrote it.
        root (FakeCudaTensor | None): for a view, the tensor whose memory it
            shares: a write through the view re-dates the root too, and a read
            of the view must be ordered after the root's last write as well.
    """

    shadow: torch.Tensor
    rt: FakeRuntime
    writer: tuple[FakeStream, int]
    root: FakeCudaTensor | None

    @staticmethod
    def __new__(cls, shadow: torch.Tensor, device: torch.device, rt: FakeRuntime,
                writer: tuple[FakeStream, int]) -> FakeCudaTensor:
        out = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, shadow.shape, strides=shadow.stride(), dtype=shadow.dtype, device=device,
            requires_grad=shadow.requires_grad)
        out.shadow = shadow
        out.rt = rt
        out.writer = writer
        out.root = None
        return out

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        # A few Python bindings set a CUDA device guard before dispatching,
        # which a CPU build refuses: they go to the ops themselves.
        kwargs = kwargs or {}
        if func is torch.Tensor.copy_:
            return torch.ops.aten.copy_.default(*args, **kwargs)
        if func is torch.Tensor.__getitem__:
            return _indexed(args[0], args[1])
        if func is torch.Tensor.__setitem__:
            target, index, value = args
            _indexed(target, index).copy_(value) if isinstance(value, torch.Tensor) else (
                _indexed(target, index).fill_(value))
            return None
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    def __repr__(self) -> str:  # printing must not read (nor check) anything
        return f"FakeCudaTensor({self.shadow!r}, device='{self.device}')"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        fakes = [a for a in flat if isinstance(a, FakeCudaTensor)]
        rt, device = fakes[0].rt, fakes[0].device
        for a in flat:
            if isinstance(a, torch.Tensor) and a.device != device and (
                    isinstance(a, FakeCudaTensor) or a.dim() > 0):
                raise RuntimeError("Expected all tensors to be on the same device, but found "
                                   f"at least two devices, {device} and {a.device}! ({func})")
        stream = rt.current_stream(device)
        for a in fakes:
            rt.check_read(a, stream, str(func))
        if func is torch.ops.aten._to_copy.default and torch.device(
                kwargs.get("device") or device).type == "cpu":
            # tensor.cpu() / .to("cpu"): a blocking copy, which synchronizes the stream.
            rest = {k: v for k, v in kwargs.items() if k != "device"}
            out = func(*tree_map(lambda x: x.shadow if isinstance(x, FakeCudaTensor) else x,
                                 args), **rest)
            rt.log.append(("copy", str(device), "cpu"))
            rt.complete(stream.horizon())
            return out
        seq = stream.enqueue()
        by_shadow = {id(a.shadow): a for a in fakes}

        def unwrap(x: Any) -> Any:
            return x.shadow if isinstance(x, FakeCudaTensor) else x

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))

        def wrap(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            same = by_shadow.get(id(x))
            if same is not None:  # an in-place op returns its argument: now written again
                same.writer = (stream, seq)
                if same.root is not None:
                    same.root.writer = (stream, seq)
                return same
            return _viewing(FakeCudaTensor(x, device, rt, (stream, seq)), fakes)

        return tree_map(wrap, out)


def _indexed(t: FakeCudaTensor, index: Any) -> FakeCudaTensor:
    """``t[index]``: a view, read and written like any other op's result."""
    stream = t.rt.current_stream(t.device)
    t.rt.check_read(t, stream, "indexing")
    index = tree_map(lambda x: x.shadow if isinstance(x, FakeCudaTensor) else x, index)
    return _viewing(FakeCudaTensor(t.shadow[index], t.device, t.rt, (stream, stream.enqueue())),
                    [t])


def _viewing(out: FakeCudaTensor, sources: list[FakeCudaTensor]) -> FakeCudaTensor:
    """Link ``out`` to the root of the source whose memory it shares, if any (a view)."""
    if out.shadow.numel():
        ptr = out.shadow.untyped_storage().data_ptr()
        for a in sources:
            if a.shadow.numel() and a.shadow.untyped_storage().data_ptr() == ptr:
                out.root = a.root if a.root is not None else a
                break
    return out


def _cuda_target(func: Any, args: Any, kwargs: dict[str, Any]) -> torch.device | None:
    """The CUDA device a torch call asks for, if any."""
    if func is torch.Tensor.cuda:
        target = args[1] if len(args) > 1 else kwargs.get("device", 0)
        return torch.device("cuda", target) if isinstance(target, int) else torch.device(target)
    target = kwargs.get("device")
    if target is None and func is torch.Tensor.to:
        target = next((a for a in args[1:] if isinstance(a, (str, torch.device))), None)
        if target is None:
            other = next((a for a in args[1:] if isinstance(a, torch.Tensor)), None)
            target = None if other is None else other.device
    if target is None:
        return None
    target = torch.device(target)
    return target if target.type == "cuda" else None


class _CudaCalls(TorchFunctionMode):
    """While a fake stream is current: torch calls that name a CUDA device make fake tensors."""

    def __init__(self, rt: FakeRuntime) -> None:
        super().__init__()
        self.rt = rt

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        target = _cuda_target(func, args, kwargs)
        if target is None:
            return func(*args, **kwargs)
        if func in (torch.Tensor.to, torch.Tensor.cuda):
            source = args[0]
            if source.device == target and not kwargs.get("copy", False):
                return source
            return self.rt.copy(source, target, non_blocking=bool(kwargs.get("non_blocking")))
        made = func(*args, **{**kwargs, "device": CPU})  # a factory: torch.zeros(..., device=)
        return self.rt.cuda(made, target)


def shadow(value: Any) -> Any:
    """The data of a message with every fake CUDA tensor replaced by its CPU shadow.

    A test oracle: it checks no ordering (use it to compare values only).
    """
    return devices.map_tensors(
        value, lambda t: t.shadow if isinstance(t, FakeCudaTensor) else t)


class FakeRuntime(devices.CudaRuntime):
    """A strict stand-in for ``torch.cuda`` on a CPU build (see the module docstring).

    Attributes:
        log (list[tuple]): one entry per runtime call, streams and events by name.
        streams (list[FakeStream]): the streams made by ``new_stream``.
        events (list[FakeEvent]): the events made (``new_event`` -> ``make_event``).
        current_log (list[tuple[str, dict[str, str]]]): what `note_current` saw.
    """

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.streams: list[FakeStream] = []
        self.events: list[FakeEvent] = []
        self.current_log: list[tuple[str, dict[str, str]]] = []
        self.done_after_polls: int | None = None  # see FakeEvent.query
        self._defaults: dict[torch.device, FakeStream] = {}
        self._local = threading.local()
        self._lock = threading.Lock()  # streams and events are made from several workers
        self.waiter_events: list[WaiterEvent] = []  # the events of the threads' waiters
        # to_host copies not yet known done: (stream, work, out, data)
        self._host_copies: list[tuple[FakeStream, int, torch.Tensor, torch.Tensor]] = []

    # -- the CudaRuntime facade ----------------------------------------------------------
    def new_stream(self, device: torch.device) -> FakeStream:
        with self._lock:
            stream = FakeStream(self, f"stream{len(self.streams) + 1}@{device}", device)
            self.streams.append(stream)
        self.log.append(("new_stream", stream.name))
        return stream

    def use(self, stream: Any) -> Any:
        if not isinstance(stream, FakeStream):
            raise TypeError(f"use: expected a FakeStream, got {stream!r}")
        self.log.append(("use", stream.name))
        return self._entered(stream)

    @contextlib.contextmanager
    def _entered(self, stream: FakeStream) -> Iterator[FakeStream]:
        stack = self._stack()
        outermost = not stack
        stack.append(stream)
        try:
            if outermost:  # a CUDA node's hook: ``device="cuda"`` and ``.to("cuda")`` work
                with _CudaCalls(self):
                    yield stream
            else:
                yield stream
        finally:
            popped = stack.pop()
            assert popped is stream, "stream contexts left out of order"

    # new_event is the library's own: whether an event blocks is what the code under
    # test asks for (its ``blocking=``), kept in FakeEvent.blocking, never decided here.
    def make_event(self, *, blocking: bool) -> FakeEvent:
        if not isinstance(blocking, bool):
            raise TypeError(f"make_event: blocking must be a bool, got {blocking!r}")
        with self._lock:
            event = FakeEvent(self, f"event{len(self.events) + 1}", blocking)
            self.events.append(event)
        self.log.append(("new_event", event.name))
        return event

    def record(self, event: Any, stream: Any = None) -> None:
        event.record(stream)
        self.log.append(("record", event.name, getattr(stream, "name", None)))

    def wait_event(self, stream: Any, event: Any) -> None:
        if not isinstance(stream, FakeStream):
            raise TypeError(f"wait_event: expected a FakeStream, got {stream!r}")
        self.log.append(("wait_event", stream.name, event.name))
        stream.wait_event(event)

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        if tensor.device.type != "cuda":
            # What torch says for a CPU tensor's record_stream.
            raise NotImplementedError(
                f"record_stream is only implemented for CUDA tensors, got one on {tensor.device}")
        if not isinstance(stream, FakeStream):
            raise TypeError(f"record_stream: expected a FakeStream, got {stream!r}")
        self.log.append(("record_stream", stream.name, str(tensor.device)))

    def copy(self, tensor: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
        device = torch.device(device)
        self.log.append(("copy", str(tensor.device), str(device)))
        if isinstance(tensor, FakeCudaTensor):
            # A copy from a GPU runs on the source device's current stream.
            stream = self.current_stream(tensor.device)
            self.check_read(tensor, stream, f"copy to {device}")
            data = tensor.shadow.detach().clone()
            if device.type == "cuda" and device != tensor.device:
                # Between GPUs torch puts a barrier in both directions: the
                # destination's current stream waits for the copy.
                target = self.current_stream(device)
                for s, n in stream.horizon().items():
                    if s is not target and target.seen.get(s, 0) < n:
                        target.seen[s] = n
                stream.enqueue()
                return FakeCudaTensor(data, device, self, (target, target.enqueue()))
        else:
            if tensor.device.type != "cpu":
                raise RuntimeError(f"fake copy: a {tensor.device} tensor that is not fake")
            stream = self.current_stream(device) if device.type == "cuda" else None
            data = tensor.detach().clone()
        if device.type == "cpu":
            if stream is not None:  # a blocking device-to-host copy synchronizes its stream
                self.complete(stream.horizon())
            return data
        assert stream is not None
        return FakeCudaTensor(data, device, self, (stream, stream.enqueue()))

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """A non-blocking copy into "pinned" host memory, on the current stream of its device.

        The CPU tensor returned holds garbage (NaN, or the dtype's largest
        value) until the host has waited for that work (a waiter's wait, a
        synchronize, `finish_all`), as a real copy into pinned memory would.
        """
        if not isinstance(tensor, FakeCudaTensor):
            raise RuntimeError(f"fake to_host: expected a fake CUDA tensor, got one on "
                               f"{tensor.device}")
        stream = self.current_stream(tensor.device)
        self.check_read(tensor, stream, "copy to the host")
        self.log.append(("to_host", str(tensor.device), stream.name))
        data = tensor.shadow.detach().clone()
        out = torch.empty_like(data)
        out.fill_(True if data.dtype == torch.bool else
                  float("nan") if data.is_floating_point() or data.is_complex()
                  else torch.iinfo(data.dtype).max)
        with self._lock:
            self._host_copies.append((stream, stream.enqueue(), out, data))
        self._land_host_copies()  # nothing lands unless the stream is known done
        return out

    def to_device(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A copy of a CPU tensor onto ``device``, on its current stream; nothing waits."""
        device = torch.device(device)
        if tensor.device.type != "cpu" or isinstance(tensor, FakeCudaTensor):
            raise RuntimeError(f"fake to_device: expected a CPU tensor, got one on {tensor.device}")
        stream = self.current_stream(device)
        self.log.append(("to_device", str(device), stream.name))
        return FakeCudaTensor(tensor.detach().clone(), device, self, (stream, stream.enqueue()))

    def make_waiter(self) -> Any:
        """A real `StreamWaiter` of the run's ``sync``, on `WaiterEvent`s that log."""
        def event(blocking: bool) -> WaiterEvent:
            with self._lock:
                made = WaiterEvent(self, f"waiter_event{len(self.waiter_events) + 1}", blocking)
                self.waiter_events.append(made)
            return made

        return StreamWaiter(self.sync, event_factory=event, yield_fn=lambda: None)

    def host_waits(self) -> list[tuple[Any, ...]]:
        """Every way the host waited for the GPU, in order, from the log.

        ``("waiter", "blocking" | "polling", what)`` for a wait through a
        waiter (what: a stream, or an event waited for with ``wait_ready``),
        and the spinning ones as they are logged: ``stream_synchronize``,
        ``synchronize`` (an event), and a blocking ``copy`` to the CPU.
        """
        spinning = {"stream_synchronize", "synchronize"}
        return [e for e in self.log if e[0] in spinning or e[0] == "waiter"
                or (e[0] == "copy" and e[2] == "cpu" and e[1] != "cpu")]

    def current_stream(self, device: torch.device) -> FakeStream:
        device = torch.device(device)
        for stream in reversed(self._stack()):
            if stream.device == device:
                return stream
        with self._lock:
            default = self._defaults.get(device)
            if default is None:
                default = self._defaults[device] = FakeStream(self, f"default@{device}", device)
        return default

    # -- for the tests ---------------------------------------------------------------------
    def cuda(self, value: Any, device: torch.device | str = "cuda:0") -> Any:
        """``value`` with each CPU tensor made a fake tensor on ``device``, on its current stream.

        What ``tensor.to(device)`` does on a GPU; nothing is logged.
        """
        device = torch.device(device)

        def move(t: torch.Tensor) -> torch.Tensor:
            if isinstance(t, FakeCudaTensor):
                return t
            stream = self.current_stream(device)
            return FakeCudaTensor(t.detach().clone(), device, self, (stream, stream.enqueue()))

        return devices.map_tensors(value, move)

    def note_current(self, label: str) -> None:
        """Record the calling thread's current streams, by device, under ``label``."""
        current: dict[str, str] = {}
        for stream in self._stack():
            current[str(stream.device)] = stream.name
        self.current_log.append((label, current))

    def finish_all(self) -> None:
        """The test's hand: the GPU has done all the work queued so far."""
        for stream in [*self.streams, *self._defaults.values()]:
            stream.done = stream.queued
        self._land_host_copies()

    def check_read(self, tensor: FakeCudaTensor, stream: FakeStream, what: str) -> None:
        """Raise `StaleRead` unless ``stream`` may read ``tensor`` now."""
        if tensor.root is not None:
            self.check_read(tensor.root, stream, what)
        writer, seq = tensor.writer
        if not stream.orders(writer, seq):
            raise StaleRead(
                f"{what}: a {tensor.device} tensor written by work {seq} of {writer.name} is "
                f"read on {stream.name}, which is not ordered after it (done: {writer.done}, "
                f"waited for: {stream.seen.get(writer, 0)})")

    def complete(self, horizon: dict[FakeStream, int]) -> None:
        """Mark the work in ``horizon`` done (the host waited for it)."""
        for stream, seq in horizon.items():
            if stream.done < seq:
                stream.done = seq
        self._land_host_copies()

    def _land_host_copies(self) -> None:
        """Fill each pending `to_host` copy whose work the host knows done."""
        with self._lock:
            pending = self._host_copies
            landed = [c for c in pending if c[0].done >= c[1]]
            self._host_copies = [c for c in pending if c[0].done < c[1]]
        for _, _, out, data in landed:
            out.copy_(data)

    def _stack(self) -> list[FakeStream]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack


class Fakes(NamedTuple):
    """A fake CUDA for one run or more: the runtime, the waiters, and the run to start with it.

    ``start`` is ``mujou.run`` with the fakes behind the kernel's seams
    (`mujou_actors._runtime.build.Seams`): the same arguments.
    """

    rt: FakeRuntime
    waiters: list[FakeWaiter]
    start: Callable[..., Any]


def fakes(rt: FakeRuntime | None = None) -> Fakes:
    """A `FakeRuntime` and `FakeWaiter`s behind the seams of the runs that ``start`` makes.

    Args:
        rt (FakeRuntime, optional): the runtime to use; a new one by default.

    Returns:
        Fakes: the runtime, the list that receives each waiter a run makes
        (one per CUDA node, in order), and the ``mujou.run`` that uses them.
    """
    import functools
    import importlib

    from mujou_actors._runtime.build import Seams

    run_module = importlib.import_module("mujou_actors.run")  # mujou_actors.run is the function
    rt = rt if rt is not None else FakeRuntime()
    waiters: list[FakeWaiter] = []

    def make_waiter(sync: str) -> FakeWaiter:
        waiters.append(FakeWaiter(sync))
        return waiters[-1]

    seams = Seams(cuda_runtime=lambda: rt, make_waiter=make_waiter)  # type: ignore[arg-type]
    return Fakes(rt, waiters, functools.partial(run_module._start, seams=seams))


def install(monkeypatch: Any, rt: FakeRuntime | None = None) -> tuple[FakeRuntime,
                                                                      list[FakeWaiter]]:
    """Make ``mujou.run`` start its runs on `fakes` for one test.

    For code under test that calls ``mujou.run`` itself (benchmarks/gpu_check.py);
    a test that starts its runs calls ``fakes().start`` instead.

    Args:
        monkeypatch (pytest.MonkeyPatch): the test's monkeypatch fixture.
        rt (FakeRuntime, optional): the runtime to use; a new one by default.

    Returns:
        tuple[FakeRuntime, list[FakeWaiter]]: the runtime, and the list that
        receives each waiter the run makes (one per CUDA node, in order).
    """
    import mujou_actors

    fake = fakes(rt)
    monkeypatch.setattr(mujou_actors, "run", fake.start)
    return fake.rt, fake.waiters
