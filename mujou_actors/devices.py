"""Devices: validation, message routing between the CPU and CUDA devices, streams.

The routing *decisions* are plain functions of devices (``send_path``,
``receive_action``, ``write_path``, ``copy_stream_devices``), tested on any
machine. The CUDA work that carries them out goes through ``CudaRuntime``, a
thin facade over ``torch.cuda`` that tests replace with a fake. Nothing here
touches CUDA unless a CUDA device is named, so importing the package, and a
net of CPU nodes, never initialise CUDA.

The rules (see docs/devices.md):

* a CUDA sender whose port has a CUDA reader keeps the message on its device:
  ``send`` copies it on the sender's stream and records an event; a reader on
  that device waits on the event and uses the copy; a reader on another GPU
  copies device to device, a CPU reader device to host, each on a copy stream
  of its own on the sender's device;
* a port that only CPU nodes (or only the host) read goes through host
  memory at send;
* each tensor of a message is handled by its own device: on the device path
  a tensor of another GPU is copied onto the sender's device at send and a
  CPU tensor stays in host memory; every reader gets every tensor on its own
  device;
* a CPU message (or tensor) for a CUDA reader is copied to the reader's
  device on the reader's stream;
* the host (``run.read``, ``subscribe``, ``wait_for``, ``state_dict``) always
  gets CPU copies, made once the GPU work that produced them is done;
* no thread ever waits inside a copy: a copy to host memory goes into pinned
  memory without blocking and the thread then waits for its stream through
  its own waiter (``CudaRuntime.wait``, as ``cuda_sync`` says), and a copy to
  a device is queued from pinned memory with no host wait at all.
"""

from __future__ import annotations

import contextlib
import enum
import os
import platform
import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .cuda import StreamWaiter, check_cuda_sync, make_waiter
from .messages import map_tensors, tensors_in  # re-exported: mailbox.py and tests import them

# Nothing here is for users to import: a node names its device (Node(device=...)).
__all__: list[str] = []

CPU = torch.device("cpu")


def validate_device(device: Any, *, owner: str = "node") -> torch.device:
    """Turn a node's ``device`` argument into a fixed ``torch.device``.

    Args:
        device (str | torch.device): ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a
            ``torch.device`` of those types.
        owner (str): what the device is for, used in error messages.

    Returns:
        torch.device: ``cpu`` (without index) or ``cuda:N`` with an explicit
        index. ``"cuda"`` without an index is fixed to the host's current CUDA
        device at this moment, so a later ``torch.cuda.set_device`` does not
        move the node.

    Raises:
        TypeError: ``device`` is neither a string nor a ``torch.device``.
        ValueError: the string is not a device, the device type is neither CPU
            nor CUDA (``"mps"``, ``"meta"``, ...), CUDA is not available, or the
            CUDA index is out of range.
    """
    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"{owner}: device must be a str or torch.device, got {type(device).__name__}"
        )
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"{owner}: {device!r} is not a device: {exc}") from None
    if dev.type == "cpu":
        return CPU
    if dev.type != "cuda":
        raise ValueError(
            f"{owner}: device {str(dev)!r} is not supported; use 'cpu' or a CUDA device"
        )
    if not torch.cuda.is_available():
        raise ValueError(f"{owner}: device {str(dev)!r} asked for, but CUDA is not available")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise ValueError(
            f"{owner}: device {str(dev)!r} does not exist; this host has {count} CUDA device(s)"
        )
    return torch.device("cuda", index)


# ---------------------------------------------------------------------------
# Decisions (plain functions, tested on the CPU)


class CopyPath(enum.Enum):
    """How a message leaves its sender."""

    HOST = "host"      #: copied to host memory at send
    DEVICE = "device"  #: copied on the sender's device and stream, with an event


def send_path(sender_device: torch.device, reader_devices: Iterable[torch.device]) -> CopyPath:
    """The path of messages an Output sends (decided once per connection set).

    Args:
        sender_device: the sending node's device.
        reader_devices: the devices of the nodes that read the Output (the
            host is a CPU reader).

    Returns:
        ``CopyPath.DEVICE`` when the sender is on CUDA and at least one reader is
        on CUDA; ``CopyPath.HOST`` otherwise (only CPU readers: host memory is the
        cheaper way for them).
    """
    if sender_device.type != "cuda":
        return CopyPath.HOST
    on_cuda = any(device.type == "cuda" for device in reader_devices)
    return CopyPath.DEVICE if on_cuda else CopyPath.HOST


class Receive(enum.Enum):
    """What a reader does with a delivered message before its hook."""

    SHARE = "share"                    #: use it as it is (CPU message, CPU reader)
    WAIT = "wait"                      #: same CUDA device: wait on its event, share the copy
    COPY_TO_DEVICE = "copy_to_device"  #: another GPU: device-to-device copy on a copy stream
    COPY_TO_HOST = "copy_to_host"      #: CPU reader: device-to-host copy on a copy stream
    HOST_TO_DEVICE = "host_to_device"  #: CPU message, CUDA reader: copy on the reader's stream


def receive_action(message_device: torch.device, reader_device: torch.device) -> Receive:
    """What a reader on ``reader_device`` does with a message on ``message_device``."""
    if message_device.type != "cuda":
        return Receive.SHARE if reader_device.type != "cuda" else Receive.HOST_TO_DEVICE
    if reader_device == message_device:
        return Receive.WAIT
    if reader_device.type == "cuda":
        return Receive.COPY_TO_DEVICE
    return Receive.COPY_TO_HOST


def write_path(tensor_device: torch.device, node_device: torch.device) -> CopyPath:
    """How ``run.write``/``inputs=`` deliver a tensor to a node on ``node_device``.

    A CUDA tensor already on the node's device stays there (copied on the host's
    current stream of that device); any other tensor goes through host memory.
    """
    if tensor_device.type == "cuda" and tensor_device == node_device:
        return CopyPath.DEVICE
    return CopyPath.HOST


def copy_stream_devices(reader_device: torch.device,
                        source_devices: Iterable[torch.device]) -> set[torch.device]:
    """CUDA devices on which a reader needs a copy stream of its own.

    Args:
        reader_device: the reading node's device.
        source_devices: devices of the CUDA senders whose messages take the
            device path to this reader.
    """
    return {device for device in source_devices
            if device.type == "cuda" and device != reader_device}


# ---------------------------------------------------------------------------
# Carrying them out


class DeviceMessage:
    """A message kept on a CUDA device, with the event that marks it ready.

    Readers never see this wrapper: each gets the value on its own device.
    """

    __slots__ = ("value", "device", "event", "host")

    def __init__(self, value: Any, device: torch.device, event: Any) -> None:
        self.value = value
        self.device = device
        self.event = event
        self.host: Any = None  # the CPU copy, made once for all CPU readers


class CudaRuntime:
    """The CUDA operations routing needs; a facade so tests can use a fake.

    Every method maps to one ``torch.cuda`` call, except the waits (`wait`,
    `wait_ready`), which go through the calling thread's own `StreamWaiter`,
    so that every wait of the run on the GPU follows ``mujou.run(cuda_sync=)``.
    A waiter reuses its event, so two threads never share one.

    Args:
        sync (str): how the run's threads wait for the GPU: ``"block"``
            (default), ``"spin"`` or ``"yield"`` (see `mujou_actors.cuda`).

    Raises:
        ValueError: ``sync`` is not one of the three.
    """

    sync = "block"  # the default; replaced by __init__ and set_sync

    def __init__(self, sync: str = "block") -> None:
        self.set_sync(sync)

    def set_sync(self, sync: str) -> None:
        """Choose how the threads wait from now on (the run does, before its first wait).

        Args:
            sync (str): ``"block"``, ``"spin"`` or ``"yield"``.

        Raises:
            ValueError: ``sync`` is not one of the three.
        """
        self.sync = check_cuda_sync(sync)
        self._waiters = threading.local()  # the waiters made so far waited the old way

    def make_waiter(self) -> StreamWaiter:
        """A new waiter for one thread (a seam: the fakes give theirs fake events)."""
        return make_waiter(self.sync)

    def waiter(self) -> StreamWaiter:
        """The calling thread's waiter, made on its first wait."""
        local = self.__dict__.get("_waiters")
        if local is None:  # a subclass (a test's fake) that skipped __init__
            local = self.__dict__.setdefault("_waiters", threading.local())
        waiter = getattr(local, "waiter", None)
        if waiter is None:
            waiter = local.waiter = self.make_waiter()
        return waiter

    def wait(self, stream: Any) -> None:
        """Block the calling thread until the work queued on ``stream`` so far is done."""
        self.waiter().wait(stream)

    def wait_ready(self, event: Any) -> None:
        """Block the calling thread until ``event`` (one of `new_event`'s) completed."""
        self.waiter().wait_event(event)

    def new_stream(self, device: torch.device) -> Any:
        """A stream from PyTorch's per-device pool (32 per device, then shared)."""
        return torch.cuda.Stream(device=device)

    def use(self, stream: Any) -> Any:
        """Context manager making ``stream`` (and its device) current."""
        return torch.cuda.stream(stream)

    def new_event(self) -> Any:
        """An event to mark a message ready.

        Under ``sync="block"`` it is a blocking-sync event, so that a thread
        waiting for it (`wait_ready`) sleeps instead of spinning.
        """
        return self.make_event(blocking=self.sync == "block")

    def make_event(self, *, blocking: bool) -> Any:
        """A new CUDA event, blocking-sync or not (a seam: the fakes record the request).

        Args:
            blocking (bool): whether a host thread that synchronizes on the
                event sleeps (``cudaEventBlockingSync``) instead of spinning.

        Returns:
            torch.cuda.Event: the event, not yet recorded.
        """
        return torch.cuda.Event(blocking=blocking)

    def record(self, event: Any, stream: Any = None) -> None:
        """Record ``event`` on ``stream`` (default: the current stream)."""
        event.record(stream)

    def wait_event(self, stream: Any, event: Any) -> None:
        """Make ``stream`` wait (on the GPU) until ``event`` completed."""
        stream.wait_event(event)

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        """Tell the caching allocator ``stream`` uses ``tensor``'s memory."""
        tensor.record_stream(stream)

    def copy(self, tensor: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
        """A copy of ``tensor`` on ``device`` (on the current stream)."""
        return tensor.to(device, non_blocking=non_blocking, copy=True)

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """A copy of CUDA ``tensor`` in pinned host memory, queued on the current stream.

        The copy does not block: it is complete only once the thread has
        waited for that stream (`wait`). Pinned memory is what makes a
        device-to-host copy asynchronous; from pageable memory the copy itself
        would wait for the stream, spinning under CUDA's default flag.
        """
        out = torch.empty(tensor.size(), dtype=tensor.dtype, pin_memory=True)
        out.copy_(tensor, non_blocking=True)
        return out

    def to_device(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A copy of CPU ``tensor`` on ``device``, queued on the current stream; no wait.

        The tensor is first copied into pinned memory on the CPU, so the
        transfer is asynchronous; torch's pinned-memory cache keeps that
        buffer until the transfer is done.
        """
        if tensor.device.type != "cpu":
            return tensor.to(device, copy=True)
        return tensor.pin_memory().to(device, non_blocking=True)

    def current_stream(self, device: torch.device) -> Any:
        """The calling thread's current stream on ``device``."""
        return torch.cuda.current_stream(device)


def device_copier(sender_device: torch.device,
                  rt: CudaRuntime) -> Callable[[torch.Tensor], torch.Tensor]:
    """How a sender on the device path copies each tensor of a message.

    Each tensor by its own device: one on the sender's device is cloned there
    (on the current stream, the sender's); one on another GPU is copied device
    to device onto the sender's device (torch orders that copy after the
    source device's current stream and before the sender's stream, so the
    ready event covers it); a CPU tensor is cloned in host memory, and each
    CUDA reader moves it to its own device.
    """
    def place(t: torch.Tensor) -> torch.Tensor:
        if t.device == sender_device or t.device.type != "cuda":
            return t.detach().clone()
        return rt.copy(t.detach(), sender_device, non_blocking=True)

    return place


class HostCopier:
    """Copies the tensors of one message into host memory, then waits for them once.

    Used by the host path's ``send``, by ``run.write`` for a tensor that does
    not stay on its device, and for the host's own copies. A CPU tensor is
    cloned. A CUDA tensor is copied without blocking into pinned memory, on
    the current stream of its device (the sender's own stream inside a hook);
    `wait` then waits once for each such stream through the calling thread's
    waiter, so the wait follows ``cuda_sync`` (a plain ``.cpu()`` would wait
    inside the copy, spinning under CUDA's default flag).

    Call it on each tensor (as ``copy_message``'s ``tensor_copy``), then `wait`
    before the copies are used.

    Args:
        rt (CudaRuntime | None): the CUDA runtime; None for a run without CUDA.
    """

    __slots__ = ("rt", "streams")

    def __init__(self, rt: CudaRuntime | None) -> None:
        self.rt = rt
        self.streams: dict[torch.device, Any] = {}  # device -> the stream the copies are on

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        rt = self.rt
        if t.device.type != "cuda" or rt is None:
            return t.detach().clone()
        if t.device not in self.streams:
            self.streams[t.device] = rt.current_stream(t.device)
        return rt.to_host(t.detach())

    def wait(self) -> None:
        """Wait (through the thread's waiter) until every copy made so far is done."""
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            self.rt.wait(stream)  # type: ignore[union-attr]  # streams only with a runtime


def mark_ready(value: Any, sender_device: torch.device, rt: CudaRuntime,
               event: Any = None) -> DeviceMessage:
    """Wrap a device-path message with an event recorded on the sender's stream.

    The stream is named explicitly: a hook may have made another device
    current (``torch.cuda.device(1)``), and the copy ran on the sender's device.

    Args:
        value: the message, as copied by `device_copier`.
        sender_device (torch.device): the sender's CUDA device.
        rt (CudaRuntime): the CUDA runtime.
        event: the Output's own event, recorded again at each send (a new one
            when None). Reusing it is safe: every record is on the sender's
            stream, so a wait that finds a later send's record waits for the
            earlier copy too (and at most for the sender's work in between).

    Returns:
        DeviceMessage: the message with its ready event.
    """
    if event is None:
        event = rt.new_event()
    rt.record(event, rt.current_stream(sender_device))
    return DeviceMessage(value, sender_device, event)


class WriteCopier(HostCopier):
    """How ``run.write``/``inputs=`` copy the tensors of one message for a node.

    A tensor on the node's CUDA device stays there: it is cloned on the host's
    current stream of that device, and `wait` waits for that stream (through
    the calling thread's waiter) before the message is delivered, so the
    source may be reused by the host at once and the node's stream needs no
    ordering of its own. The clone belongs to the host stream's memory pool,
    while the node drops it after queueing work on *its* stream: without
    ``record_stream`` on the node's stream, the caching allocator would hand
    the block back to the host's next allocation of that size while the
    node's kernels may still read it. Any other tensor goes through host
    memory, as `HostCopier` copies it.

    Args:
        node_device (torch.device): the device of the node written to.
        node_stream: the node's own stream (None for a CPU node).
        rt (CudaRuntime): the CUDA runtime.
    """

    __slots__ = ("node_device", "node_stream")

    def __init__(self, node_device: torch.device, node_stream: Any, rt: CudaRuntime) -> None:
        super().__init__(rt)
        self.node_device = node_device
        self.node_stream = node_stream

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        if write_path(t.device, self.node_device) is CopyPath.HOST:
            return HostCopier.__call__(self, t)
        rt: CudaRuntime = self.rt  # type: ignore[assignment]
        if t.device not in self.streams:
            self.streams[t.device] = rt.current_stream(t.device)
        out = t.detach().clone()
        rt.record_stream(out, self.node_stream)
        return out


def to_host(message: Any, rt: CudaRuntime | None) -> Any:
    """The host's CPU view of a delivered or sent message (not yet a private copy)."""
    if type(message) is not DeviceMessage:
        return message
    assert rt is not None
    if message.host is None:
        # The host's current stream waits for the ready event on the GPU, the
        # copies go on it, and this thread waits for them through its waiter.
        rt.wait_event(rt.current_stream(message.device), message.event)
        message.host = _host_view(message.value, rt)
    return message.host


def _host_view(value: Any, rt: CudaRuntime) -> Any:
    """``value`` with its CUDA tensors copied to host memory (waited for); CPU ones shared."""
    copier = HostCopier(rt)
    view = map_tensors(value, lambda t: t if t.device.type != "cuda" else copier(t))
    copier.wait()
    return view


def enter_streams(rt: CudaRuntime | None, stream: Any,
                  copy_streams: dict[torch.device, Any]) -> Any:
    """A context making a node's streams current: its copy streams, then its own.

    The copy streams (on the devices of the CUDA nodes the node reads) are
    entered first, so that the node's own device ends up the current one.
    A no-op for a node that uses no CUDA. `Actor.on_stream` calls it; it is a
    function of this (Python) module so that ``benchmarks/gpu_check.py``'s
    control can replace it in the compiled kernel as it replaces `receive`.

    Args:
        rt (CudaRuntime | None): the run's CUDA runtime (None: no CUDA in the run).
        stream: the node's own stream, or None (a CPU node).
        copy_streams (dict[torch.device, Any]): the node's copy streams by source device.

    Returns:
        A context manager (``contextlib.nullcontext`` when there is nothing to enter).
    """
    if stream is None and not copy_streams:
        return contextlib.nullcontext()
    assert rt is not None  # a node with streams has the run's CUDA runtime
    stack = contextlib.ExitStack()
    for copy_stream in copy_streams.values():
        stack.enter_context(rt.use(copy_stream))
    if stream is not None:
        stack.enter_context(rt.use(stream))
    return stack


def receive(message: Any, reader_device: torch.device, reader_stream: Any,
            copy_streams: dict[torch.device, Any], rt: CudaRuntime | None,
            copy_done: dict[torch.device, Any] | None = None) -> Any:
    """The value a reader gets for ``message``, on its device (see ``Receive``).

    Args:
        message: a delivered message (a ``DeviceMessage`` or a plain value).
        reader_device: the reader's device.
        reader_stream: the reader's own stream (None for a CPU reader).
        copy_streams: the reader's copy streams, by source device.
        rt: the CUDA runtime (None when the run uses no CUDA at all).
        copy_done: the reader's events that mark a device-to-device copy
            done, by source device, made on first use and then recorded again
            for each copy (None: a new event per copy). The reader's stream
            waits for it right after it is recorded, on the same thread.
    """
    if type(message) is not DeviceMessage:
        if reader_device.type != "cuda":
            return message
        assert rt is not None
        # On the reader's (current) stream, from pinned memory: nothing waits.
        return map_tensors(message, lambda t: t if t.device == reader_device
                           else rt.to_device(t, reader_device))
    assert rt is not None
    # A device-path message holds tensors of the sender's device and CPU
    # tensors (see device_copier): each is handled by its own device, and
    # record_stream (CUDA tensors only) only ever sees the former.
    source = message.device
    action = receive_action(source, reader_device)
    if action is Receive.WAIT:
        rt.wait_event(reader_stream, message.event)
        mixed = False
        for t in tensors_in(message.value):
            if t.device == source:
                rt.record_stream(t, reader_stream)  # no reuse while this stream reads it
            else:
                mixed = True
        if not mixed:
            return message.value
        return map_tensors(message.value, lambda t: t if t.device == source
                           else rt.to_device(t, reader_device))  # a CPU tensor: no wait
    stream = copy_streams[source]
    if action is Receive.COPY_TO_HOST:
        if message.host is None:  # one CPU copy serves every CPU reader
            rt.wait_event(stream, message.event)
            with rt.use(stream):
                message.host = _host_view(message.value, rt)
        return message.host
    rt.wait_event(stream, message.event)
    with rt.use(stream):
        def copy(t: torch.Tensor) -> torch.Tensor:
            if t.device != source:
                return t  # a CPU tensor: moved below, on the reader's stream
            rt.record_stream(t, stream)
            return rt.copy(t, reader_device, non_blocking=True)

        moved = map_tensors(message.value, copy)
        done = None if copy_done is None else copy_done.get(source)
        if done is None:
            done = rt.new_event()
            if copy_done is not None:
                copy_done[source] = done
        rt.record(done, stream)
    rt.wait_event(reader_stream, done)

    def settle(t: torch.Tensor) -> torch.Tensor:
        if t.device == reader_device:
            rt.record_stream(t, reader_stream)
            return t
        return rt.to_device(t, reader_device)  # a CPU tensor, on the reader's stream: no wait

    return map_tensors(moved, settle)


def numerics() -> dict[str, str]:
    """What, beside the code and the seeds, decides this process's floating-point results.

    torch's CPU kernels are chosen by the processor's vector width
    (``torch.backends.cpu.get_cpu_capability()``, or ``ATEN_CPU_CAPABILITY``),
    and MKL's matrix kernels by the processor and its vendor unless
    ``MKL_CBWR`` pins one code path (Intel's "conditional numerical
    reproducibility"); kernels of another width round sums differently, in the
    last bit. A recording keeps these facts (``numerics`` in ``mujou.run``) so
    that a golden file that differs on another machine can say why.

    Returns:
        dict[str, str]: ``machine`` (``platform.machine()``), ``cpu`` (the
        processor's model name, ``""`` if the system does not say),
        ``cpu_capability`` (torch's), ``mkl_cbwr`` and ``aten_cpu_capability``
        (the environment's, ``""`` when unset).
    """
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.partition(":")[2].strip()
                    break
    except OSError:  # not Linux: the platform's own word, if any
        cpu = platform.processor()
    return {"machine": platform.machine(), "cpu": cpu,
            "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
            "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
            "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY", "")}


# The process-wide torch settings that a group's process takes from the host
# (`torch_settings`): each a getter and a setter of one value.
_SETTINGS: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
    "num_threads": (torch.get_num_threads, torch.set_num_threads),
    "default_dtype": (lambda: str(torch.get_default_dtype()).removeprefix("torch."),
                      lambda name: torch.set_default_dtype(getattr(torch, name))),
    "deterministic": (
        lambda: (torch.are_deterministic_algorithms_enabled(),
                 torch.is_deterministic_algorithms_warn_only_enabled()),
        lambda both: torch.use_deterministic_algorithms(both[0], warn_only=both[1])),
    "float32_matmul_precision": (torch.get_float32_matmul_precision,
                                 torch.set_float32_matmul_precision),
    "fp16_reduced_precision_reduction": (
        lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        lambda on: setattr(torch.backends.cuda.matmul,
                           "allow_fp16_reduced_precision_reduction", on)),
    "bf16_reduced_precision_reduction": (
        lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        lambda on: setattr(torch.backends.cuda.matmul,
                           "allow_bf16_reduced_precision_reduction", on)),
    "cudnn_deterministic": (lambda: torch.backends.cudnn.deterministic,
                            lambda on: setattr(torch.backends.cudnn, "deterministic", on)),
    "cudnn_benchmark": (lambda: torch.backends.cudnn.benchmark,
                        lambda on: setattr(torch.backends.cudnn, "benchmark", on)),
    "cudnn_allow_tf32": (lambda: torch.backends.cudnn.allow_tf32,
                         lambda on: setattr(torch.backends.cudnn, "allow_tf32", on)),
    "mkldnn_enabled": (lambda: torch.backends.mkldnn.enabled,
                       lambda on: setattr(torch.backends.mkldnn, "enabled", on)),
}


def torch_settings(*, threads: bool = True) -> dict[str, Any]:
    """This process's torch settings that decide a computation's results or its threads.

    torch keeps these per process: a group's process of a placed run starts
    with torch's defaults, not with what the host's script set
    (``torch.set_num_threads``, ``torch.use_deterministic_algorithms``,
    ``torch.set_default_dtype``, ``torch.set_float32_matmul_precision``, the
    ``torch.backends.cudnn``/``cuda.matmul``/``mkldnn`` flags). The host
    takes them here and each group applies them (`apply_torch_settings`)
    before it imports the net's factory, so that its nodes compute as they
    would in the host's process.

    Args:
        threads (bool): include ``num_threads`` (torch's intra-op threads).
            False for a group on another machine, whose processor count is
            its own.

    Returns:
        dict[str, Any]: plain values (bools, ints, strings, a pair of bools for
        ``deterministic``), by setting name.
    """
    return {name: get() for name, (get, _) in _SETTINGS.items()
            if threads or name != "num_threads"}


def apply_torch_settings(settings: dict[str, Any] | None, *, owner: str) -> None:
    """Set this process's torch settings to the host's (`torch_settings`).

    A setting this process already has is not set again (``torch.set_num_threads``
    rebuilds the thread pool). A name this version of torch does not know, or a
    value it refuses or ignores (``set_float32_matmul_precision`` only warns), is
    an error rather than silently a different computation. The settings before
    the one that fails stay set: a group process whose settings fail does not
    start (`group.GroupServer`), so none of its nodes computes with a mix.

    Args:
        settings (dict, optional): `torch_settings` of the host; None: leave
            everything as it is.
        owner (str): who applies them, for error messages (``"placed group 'a'"``).

    Raises:
        ValueError: an unknown setting, or a value torch refuses (its error is
            kept as the cause) or does not keep; names ``owner`` and the setting.
    """
    for name, value in (settings or {}).items():
        if name not in _SETTINGS:
            raise ValueError(f"{owner}: unknown torch setting {name!r} from the host "
                             f"(known: {sorted(_SETTINGS)})")
        get, put = _SETTINGS[name]
        if isinstance(value, list):  # a pair that crossed a codec as a list
            value = tuple(value)
        if get() == value:
            continue
        try:
            with warnings.catch_warnings():  # torch warns, not raises, on some values
                warnings.simplefilter("ignore")
                put(value)
        except (RuntimeError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"{owner}: cannot set torch's {name} to the host's {value!r}: "
                             f"{e}") from e
        if get() != value:
            raise ValueError(f"{owner}: cannot set torch's {name} to the host's {value!r}: "
                             f"torch kept {get()!r}")
