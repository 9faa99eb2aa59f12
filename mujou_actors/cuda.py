"""How threads wait for the GPU: the CUDA scheduling flag and the run's stream waits.

Two separate settings decide whether a CPU thread that waits for CUDA work
burns a core:

* **The scheduling flag of a device's CUDA context** (`set_sync_mode`,
  `get_sync_mode`). It governs every wait that CUDA performs on its own:
  ``tensor.item()``, ``.cpu()``, ``stream.synchronize()``,
  ``torch.cuda.synchronize()``. PyTorch has no call for it (the feature request
  is pytorch/pytorch#28224, still open), so this module sets it through the CUDA
  driver API (``cuDevicePrimaryCtxSetFlags``) with ``ctypes``.
* **How the run's workers wait for a node's stream** (`StreamWaiter`,
  `make_waiter`, `check_cuda_sync`), chosen by ``mujou.run(cuda_sync=...)``.
  It does not depend on the flag above.

When the flag takes effect:
    PyTorch uses each device's *primary context*, and the driver reads the
    flag only when it creates that context. Torch creates it at the first CUDA
    use on the device: the first CUDA tensor, ``torch.cuda.init()``, and, with
    CUDA 12 and later, ``torch.cuda.set_device`` already. So the flag must be
    set first thing in the process. Afterwards, `set_sync_mode` refuses to
    change it (`SyncModeError`) rather than pretend: whether a running context
    honours new flags is not something the driver documents. Setting it
    through ``libcudart``'s ``cudaSetDeviceFlags`` instead, as the PyTorch issue
    tried, depends on the runtime library being the very one torch loaded; the
    driver's primary context is shared by every runtime in the process.

Why it matters:
    The default flag, ``"auto"``, makes a waiting thread spin on a core as long
    as the process has no more active CUDA contexts than the machine has
    logical CPUs, which is nearly always the case. Every thread waiting for the
    GPU then keeps one core at 100% for the whole wait, taking it from the
    other nodes' workers and hiding how busy the CPU really is. ``"block"``
    makes the thread sleep until the GPU signals completion, at the price of a
    slightly later wake-up.

Importing this module touches neither CUDA nor the driver library: the driver
is loaded on the first call of `set_sync_mode` or `get_sync_mode`, and the
waiters create their event on their first wait.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

# SyncModeError lives with the other errors; it is also mujou.cuda.SyncModeError.
from ._checks import is_int
from .errors import SyncModeError

if TYPE_CHECKING:  # torch is imported where it is used, so that importing this module is cheap
    import torch

# The members docs/reference.md documents; SyncModeError is errors.py's, re-exported.
__all__ = [
    "SyncModeError",
    "set_sync_mode",
    "get_sync_mode",
    "StreamWaiter",
    "make_waiter",
    "check_cuda_sync",
]

# Scheduling flags of a CUDA context (cuda.h: CUctx_flags).
_CU_CTX_SCHED_AUTO = 0x00
_CU_CTX_SCHED_SPIN = 0x01
_CU_CTX_SCHED_YIELD = 0x02
_CU_CTX_SCHED_BLOCKING_SYNC = 0x04
_CU_CTX_SCHED_MASK = 0x07

#: The modes of `set_sync_mode`, with the driver flag each one stands for.
SYNC_MODES: Mapping[str, int] = MappingProxyType({
    "auto": _CU_CTX_SCHED_AUTO,
    "spin": _CU_CTX_SCHED_SPIN,
    "yield": _CU_CTX_SCHED_YIELD,
    "block": _CU_CTX_SCHED_BLOCKING_SYNC,
})
_MODE_OF_FLAG = {flag: mode for mode, flag in SYNC_MODES.items()}

#: The values of ``mujou.run(cuda_sync=...)``.
CUDA_SYNC_VALUES: tuple[str, ...] = ("block", "spin", "yield")

# CUresult codes named when cuGetErrorName is missing or does not know the code.
_CUDA_SUCCESS = 0
_CUDA_ERROR_NO_DEVICE = 100
_KNOWN_ERRORS = {
    1: "CUDA_ERROR_INVALID_VALUE",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    708: "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
    999: "CUDA_ERROR_UNKNOWN",
}


# -- the driver ---------------------------------------------------------------------------


class _Driver:
    """The few CUDA driver API entry points used here, bound with ctypes.

    Every method returns the raw ``CUresult`` first (0 is success), then its
    outputs; the checks live in the callers, so a fake driver with the same
    methods can simulate any outcome in the tests.
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        c_int, c_uint = ctypes.c_int, ctypes.c_uint
        self._cu_init = lib.cuInit
        self._cu_init.argtypes = [c_uint]
        self._cu_init.restype = c_int
        self._cu_device_get_count = lib.cuDeviceGetCount
        self._cu_device_get_count.argtypes = [ctypes.POINTER(c_int)]
        self._cu_device_get_count.restype = c_int
        self._cu_device_get = lib.cuDeviceGet
        self._cu_device_get.argtypes = [ctypes.POINTER(c_int), c_int]
        self._cu_device_get.restype = c_int
        self._cu_get_state = lib.cuDevicePrimaryCtxGetState
        self._cu_get_state.argtypes = [c_int, ctypes.POINTER(c_uint), ctypes.POINTER(c_int)]
        self._cu_get_state.restype = c_int
        # cuda.h maps cuDevicePrimaryCtxSetFlags to the _v2 entry point since CUDA 11.
        set_flags = getattr(lib, "cuDevicePrimaryCtxSetFlags_v2", None)
        if set_flags is None:
            set_flags = lib.cuDevicePrimaryCtxSetFlags
        self._cu_set_flags = set_flags
        self._cu_set_flags.argtypes = [c_int, c_uint]
        self._cu_set_flags.restype = c_int
        self._cu_get_error_name = getattr(lib, "cuGetErrorName", None)
        if self._cu_get_error_name is not None:
            self._cu_get_error_name.argtypes = [c_int, ctypes.POINTER(ctypes.c_char_p)]
            self._cu_get_error_name.restype = c_int

    def init(self) -> int:
        """``cuInit(0)``."""
        return int(self._cu_init(0))

    def device_count(self) -> tuple[int, int]:
        """``cuDeviceGetCount``: (code, count)."""
        count = ctypes.c_int(0)
        code = self._cu_device_get_count(ctypes.byref(count))
        return int(code), count.value

    def device_get(self, ordinal: int) -> tuple[int, int]:
        """``cuDeviceGet``: (code, CUdevice handle)."""
        dev = ctypes.c_int(0)
        code = self._cu_device_get(ctypes.byref(dev), ordinal)
        return int(code), dev.value

    def primary_ctx_get_state(self, dev: int) -> tuple[int, int, bool]:
        """``cuDevicePrimaryCtxGetState``: (code, flags, active)."""
        flags, active = ctypes.c_uint(0), ctypes.c_int(0)
        code = self._cu_get_state(dev, ctypes.byref(flags), ctypes.byref(active))
        return int(code), flags.value, bool(active.value)

    def primary_ctx_set_flags(self, dev: int, flags: int) -> int:
        """``cuDevicePrimaryCtxSetFlags``: code."""
        return int(self._cu_set_flags(dev, flags))

    def error_name(self, code: int) -> str | None:
        """``cuGetErrorName``, or None when the driver has no name for ``code``."""
        if self._cu_get_error_name is None:
            return None
        name = ctypes.c_char_p()
        if self._cu_get_error_name(code, ctypes.byref(name)) != _CUDA_SUCCESS or not name.value:
            return None
        return name.value.decode("ascii", "replace")


def _library_names() -> tuple[str, ...]:
    if sys.platform == "win32":
        return ("nvcuda.dll",)
    return ("libcuda.so.1", "libcuda.so")


def _open_library() -> ctypes.CDLL:
    """Load the CUDA driver library (a seam: the tests make it fail)."""
    errors = []
    for name in _library_names():
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    raise OSError("; ".join(errors))


_DRIVER: _Driver | None = None
_LOCK = threading.RLock()  # one flag change at a time in this process


def _driver() -> _Driver:
    """The process's `_Driver`, loaded on first use.

    A seam: the tests replace this function with one returning a fake driver.

    Raises:
        SyncModeError: the driver library cannot be loaded.
    """
    global _DRIVER
    with _LOCK:
        if _DRIVER is None:
            try:
                _DRIVER = _Driver(_open_library())
            except (OSError, AttributeError) as exc:
                raise SyncModeError(
                    f"no CUDA driver: cannot use the CUDA driver library ({exc}); "
                    "the CUDA sync mode needs an NVIDIA GPU and its driver"
                ) from None
        return _DRIVER


def _error_name(drv: _Driver, code: int) -> str:
    try:
        name = drv.error_name(code)
    except Exception:  # a broken name lookup must not hide the real error
        name = None
    return name or _KNOWN_ERRORS.get(code, "unknown CUresult")


def _check(drv: _Driver, code: int, call: str, device: int | None = None) -> None:
    if code == _CUDA_SUCCESS:
        return
    name = _error_name(drv, code)
    where = "" if device is None else f" for CUDA device {device}"
    if code == _CUDA_ERROR_NO_DEVICE:
        raise SyncModeError(f"no CUDA device: {call} failed with {name} ({code})",
                            device=device)
    raise SyncModeError(f"{call}{where} failed with {name} ({code})", device=device)


def _mode_name(flags: int) -> str:
    bits = flags & _CU_CTX_SCHED_MASK
    return _MODE_OF_FLAG.get(bits, f"unknown scheduling flag 0x{bits:x}")


# -- arguments -----------------------------------------------------------------------------


def _check_mode(mode: Any) -> int:
    if not isinstance(mode, str) or mode not in SYNC_MODES:
        allowed = ", ".join(repr(m) for m in SYNC_MODES)
        raise ValueError(f"mujou.cuda: sync mode must be one of {allowed}, got {mode!r}")
    return SYNC_MODES[mode]


def _check_device(device: Any) -> int:
    """A device ordinal from an int, a ``torch.device`` or a ``"cuda:N"`` string.

    ``"cuda"`` without an index means torch's current device: 0 until torch has
    initialised CUDA (this never initialises it).
    """
    if is_int(device):  # a bool is no device index: it goes on to the TypeError below
        index = device
    else:
        import torch  # already imported by the package; cheap

        if not isinstance(device, (str, torch.device)):
            raise TypeError(f"mujou.cuda: device must be an int or a CUDA torch.device, "
                            f"got {type(device).__name__}")
        try:
            dev = torch.device(device)
        except RuntimeError as exc:
            raise ValueError(f"mujou.cuda: {device!r} is not a device: {exc}") from None
        if dev.type != "cuda":
            raise ValueError(f"mujou.cuda: device {str(dev)!r} is not a CUDA device")
        if dev.index is not None:
            index = dev.index
        else:
            index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    if index < 0:
        raise ValueError(f"mujou.cuda: device index must be >= 0, got {index}")
    return index


def _device_count(drv: _Driver) -> int:
    _check(drv, drv.init(), "cuInit")
    code, count = drv.device_count()
    _check(drv, code, "cuDeviceGetCount")
    if count <= 0:
        raise SyncModeError("no CUDA device: the CUDA driver sees no GPU "
                            "(check CUDA_VISIBLE_DEVICES)")
    return count


def _in_range(ordinal: int, count: int) -> None:
    if ordinal >= count:
        raise ValueError(f"mujou.cuda: CUDA device {ordinal} does not exist; "
                         f"the driver sees {count} device(s)")


def _state(drv: _Driver, ordinal: int) -> tuple[int, int, bool]:
    """(CUdevice handle, primary context flags, active) of one device ordinal."""
    code, dev = drv.device_get(ordinal)
    _check(drv, code, "cuDeviceGet", ordinal)
    code, flags, active = drv.primary_ctx_get_state(dev)
    _check(drv, code, "cuDevicePrimaryCtxGetState", ordinal)
    return dev, flags, bool(active)


# -- the scheduling flag -------------------------------------------------------------------


def set_sync_mode(mode: str, device: int | str | torch.device | None = None) -> str:
    """Choose how CUDA's own waits behave on a device: spin, yield or sleep.

    Sets the scheduling flag of the device's primary context, the context
    PyTorch uses, through the CUDA driver API: ``cuInit``,
    ``cuDevicePrimaryCtxGetState``, then ``cuDevicePrimaryCtxSetFlags`` with
    only the scheduling bits (``CU_CTX_SCHED_MASK``) replaced and every other
    flag kept, then ``cuDevicePrimaryCtxGetState`` again to check that the
    driver holds the new mode. This is the call that PyTorch feature request
    pytorch/pytorch#28224 asks for (``torch.cuda.set_sync_mode``), which
    PyTorch does not have.

    The modes, as the driver applies them when a thread waits for the GPU:

    * ``"auto"`` (``CU_CTX_SCHED_AUTO``, the default): the driver picks; on
      ordinary machines it spins, since it yields only when the process has
      more active contexts than logical CPUs.
    * ``"spin"`` (``CU_CTX_SCHED_SPIN``): poll in a tight loop; the fastest
      wake-up, one core fully busy per waiting thread.
    * ``"yield"`` (``CU_CTX_SCHED_YIELD``): poll, but give the core to other
      threads between polls.
    * ``"block"`` (``CU_CTX_SCHED_BLOCKING_SYNC``): sleep until the GPU
      signals completion; no CPU used while waiting, a slightly later wake-up.

    The driver reads the flag when it creates the primary context, which torch
    does at the first CUDA use on the device (a CUDA tensor,
    ``torch.cuda.init()``, ``torch.cuda.set_device`` with CUDA 12 and later).
    Call this first thing in the process. It initialises the CUDA driver, so
    like any CUDA use it should come after any ``fork``: start subprocesses
    that use CUDA with ``spawn``.

    Args:
        mode (str): ``"auto"``, ``"spin"``, ``"yield"`` or ``"block"``.
        device (int | torch.device | str, optional): a device ordinal as
            torch numbers them (``CUDA_VISIBLE_DEVICES`` applies), a CUDA
            ``torch.device`` or ``"cuda:N"``. ``None`` (the default): every
            visible device, all or nothing: every device is checked before
            any is changed, and if setting one fails (a driver error, a mode
            that does not read back) the devices already set get their
            previous flags back before the error is raised.

    Returns:
        str: the mode in effect, as read back from the driver.

    Raises:
        ValueError: ``mode`` is not one of the four (checked before the driver
            is touched), or ``device`` is not a CUDA device of this machine.
        TypeError: ``device`` is neither an int nor a device.
        SyncModeError: no CUDA driver or no device; the device's primary
            context is already active with another mode (the message names the
            device and its current mode: set the mode before the first CUDA
            use in the process); the mode read back differs; or a driver call
            failed (named with its ``CUresult`` name). The message also names
            any device that could not be set back. Asking for the mode that is
            already in effect, active context or not, is not an error.
    """
    want = _check_mode(mode)
    ordinal = None if device is None else _check_device(device)
    with _LOCK:
        drv = _driver()
        count = _device_count(drv)
        if ordinal is not None:
            _in_range(ordinal, count)
        ordinals = range(count) if ordinal is None else [ordinal]
        # Check every device first, so that a refusal changes nothing.
        todo = []
        for i in ordinals:
            dev, flags, active = _state(drv, i)
            if flags & _CU_CTX_SCHED_MASK == want:
                continue
            if active:
                current = _mode_name(flags)
                raise SyncModeError(
                    f"cannot set the CUDA sync mode of device {i} to {mode!r}: its primary "
                    f"context is already active, with mode {current!r}. The mode must be set "
                    f"before the first CUDA use in the process (a CUDA tensor, "
                    f"torch.cuda.init(), torch.cuda.set_device, ...): call "
                    f"mujou.cuda.set_sync_mode({mode!r}) first thing in the program",
                    device=i, current=current)
            todo.append((i, dev, flags))
        done: list[tuple[int, int, int]] = []
        try:
            for i, dev, flags in todo:
                new = (flags & ~_CU_CTX_SCHED_MASK) | want
                _check(drv, drv.primary_ctx_set_flags(dev, new), "cuDevicePrimaryCtxSetFlags", i)
                done.append((i, dev, flags))
                _, back, _ = _state(drv, i)
                if back & _CU_CTX_SCHED_MASK != want:
                    current = _mode_name(back)
                    raise SyncModeError(
                        f"the CUDA sync mode of device {i} did not take effect: set to {mode!r}, "
                        f"read back {current!r} (flags 0x{back:x})", device=i, current=current)
        except SyncModeError as exc:
            # All or nothing: the devices already set get their old flags back.
            left = _restore_flags(drv, done)
            if left:
                exc.args = (f"{exc.args[0]}; devices {left} could not be set back to their "
                            f"previous mode and keep {mode!r}",)
            raise
    return mode


def _restore_flags(drv: _Driver, done: list[tuple[int, int, int]]) -> list[int]:
    """Set each ``(ordinal, handle, flags)`` back to ``flags``; the ordinals that failed."""
    failed = []
    for i, dev, flags in reversed(done):
        try:
            code = drv.primary_ctx_set_flags(dev, flags)
        except Exception:  # noqa: BLE001 - the error being reported is the first one
            code = -1
        if code != _CUDA_SUCCESS:
            failed.append(i)
    return sorted(failed)


def get_sync_mode(device: int | str | torch.device = 0) -> str:
    """Read back the scheduling flag of a device's primary context.

    Uses ``cuDevicePrimaryCtxGetState`` of the CUDA driver API. Before the
    context exists it gives the mode the context will be created with; after,
    the mode it runs with. Like `set_sync_mode`, it initialises the driver
    (``cuInit``) but creates no context.

    Args:
        device (int | torch.device | str): the device ordinal, a CUDA
            ``torch.device`` or ``"cuda:N"``. Default: 0.

    Returns:
        str: ``"auto"``, ``"spin"``, ``"yield"`` or ``"block"``.

    Raises:
        ValueError: ``device`` is not a CUDA device of this machine.
        TypeError: ``device`` is neither an int nor a device.
        SyncModeError: no CUDA driver or device, a driver call failed, or the
            driver reports a scheduling flag that is none of the four.
    """
    ordinal = _check_device(device)
    with _LOCK:
        drv = _driver()
        _in_range(ordinal, _device_count(drv))
        _, flags, _ = _state(drv, ordinal)
    bits = flags & _CU_CTX_SCHED_MASK
    if bits not in _MODE_OF_FLAG:
        raise SyncModeError(f"CUDA device {ordinal} has {_mode_name(flags)} (flags 0x{flags:x})",
                            device=ordinal)
    return _MODE_OF_FLAG[bits]


# -- the run's waits -----------------------------------------------------------------------


def check_cuda_sync(value: Any) -> str:
    """Validate the ``cuda_sync`` setting of ``mujou.run``.

    Args:
        value: the value given as ``cuda_sync``.

    Returns:
        str: ``value``, one of ``"block"``, ``"spin"`` and ``"yield"``.

    Raises:
        ValueError: any other value; the message names ``cuda_sync`` and the
            allowed values.
    """
    if not isinstance(value, str) or value not in CUDA_SYNC_VALUES:
        allowed = ", ".join(repr(v) for v in CUDA_SYNC_VALUES)
        raise ValueError(f"mujou.run: cuda_sync must be one of {allowed}, got {value!r}")
    return value


def _torch_event(blocking: bool) -> torch.cuda.Event:
    import torch

    return torch.cuda.Event(blocking=blocking)


def _yield_cpu() -> None:
    # Both release the GIL; sched_yield also hands the core to another thread.
    if hasattr(os, "sched_yield"):
        os.sched_yield()
    else:  # pragma: no cover - platforms without sched_yield
        time.sleep(0)


class StreamWaiter:
    """Makes a worker thread wait until a CUDA stream has done its queued work.

    The run gives one to each CUDA node and calls `wait` with the node's stream
    after each hook and around the state; every other wait of the run (a
    send to CPU readers, a CPU reader's copy, the host's copies,
    ``run.write``) goes through a waiter of the waiting thread's own
    (`mujou_actors.devices.CudaRuntime.waiter`). Each `wait` records an event
    on the stream, then waits for that event as ``sync`` says:

    * ``"block"``: the event is created with blocking sync
      (``torch.cuda.Event(blocking=True)``, ``cudaEventBlockingSync``) and the
      thread calls ``event.synchronize()``, which sleeps, with the GIL
      released, until the GPU signals the event. It sleeps whatever the
      context's scheduling flag (`set_sync_mode`) is.
    * ``"spin"``: a plain event, polled with ``event.query()`` in a tight loop;
      the quickest reaction, one busy core, and the GIL is held most of the
      time (other Python threads get it only at the interpreter's switch
      interval).
    * ``"yield"``: a plain event, polled with ``event.query()``, yielding the
      core (``os.sched_yield``, which also releases the GIL) between polls.

    The waiter creates its event on the first wait and reuses it afterwards
    (one per device it has waited on), because creating CUDA events from many
    threads is slow. So a waiter is not for concurrent use by several threads:
    a second thread re-recording the event would make the first wait for the
    wrong work. The run's workers never run one node twice at once, so one
    waiter per node is safe.

    Args:
        sync (str): ``"block"`` (default), ``"spin"`` or ``"yield"``.
        event_factory (Callable[[bool], torch.cuda.Event], optional): makes an event given
            ``blocking``; the event needs ``record(stream)``, ``synchronize()``
            and ``query()``. Default: ``torch.cuda.Event(blocking=blocking)``.
            A seam for tests with fake streams and events.
        yield_fn (Callable[[], None], optional): called between polls in
            ``"yield"`` mode. Default: ``os.sched_yield``.

    Raises:
        ValueError: ``sync`` is not one of the three (see `check_cuda_sync`).
    """

    __slots__ = ("_sync", "_factory", "_yield", "_events")

    def __init__(self, sync: str = "block", *,
                 event_factory: Callable[[bool], torch.cuda.Event] | None = None,
                 yield_fn: Callable[[], None] | None = None) -> None:
        self._sync = check_cuda_sync(sync)
        self._factory = _torch_event if event_factory is None else event_factory
        self._yield = _yield_cpu if yield_fn is None else yield_fn
        # One event per device waited on (None: a stream without a device, a fake's).
        self._events: dict[torch.device | None, torch.cuda.Event] = {}

    @property
    def sync(self) -> str:
        """str: how this waiter waits: ``"block"``, ``"spin"`` or ``"yield"``."""
        return self._sync

    def wait(self, stream: torch.cuda.Stream) -> None:
        """Return once the GPU has done all work queued on ``stream`` so far.

        Args:
            stream (torch.cuda.Stream): the stream to wait for; it may belong
                to any device, whatever the calling thread's current device.
        """
        key = getattr(stream, "device", None)
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = self._factory(self._sync == "block")
        event.record(stream)
        self._await(event)

    def wait_event(self, event: torch.cuda.Event) -> None:
        """Return once the GPU has reached ``event``, an event recorded elsewhere.

        Under ``"block"`` the thread sleeps in ``event.synchronize()`` only if
        the event was created with blocking sync (the run's ready events are,
        see `mujou_actors.devices.CudaRuntime.new_event`); under ``"spin"``
        and ``"yield"`` it polls ``event.query()`` as `wait` does.

        Args:
            event (torch.cuda.Event): a recorded event, of any device.
        """
        self._await(event)

    def _await(self, event: torch.cuda.Event) -> None:
        """Wait for ``event`` as ``sync`` says: sleep, spin or yield."""
        if self._sync == "block":
            event.synchronize()
        elif self._sync == "spin":
            while not event.query():
                pass
        else:
            while not event.query():
                self._yield()

    def __repr__(self) -> str:
        return f"StreamWaiter({self._sync!r})"


def make_waiter(sync: str, *, event_factory: Callable[[bool], torch.cuda.Event] | None = None,
                yield_fn: Callable[[], None] | None = None) -> StreamWaiter:
    """The waiter for ``mujou.run(cuda_sync=sync)``: a `StreamWaiter`.

    Creating it touches no CUDA; its event is made on its first wait.

    Args:
        sync (str): ``"block"``, ``"spin"`` or ``"yield"``.
        event_factory (Callable[[bool], torch.cuda.Event], optional): see `StreamWaiter`.
        yield_fn (Callable[[], None], optional): see `StreamWaiter`.

    Returns:
        StreamWaiter: a new waiter, to be used by one node.

    Raises:
        ValueError: ``sync`` is not one of the three.
    """
    return StreamWaiter(sync, event_factory=event_factory, yield_fn=yield_fn)
