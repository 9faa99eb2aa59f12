"""mujou.cuda: the CUDA scheduling flag (driver faked on the CPU) and the run's stream waiters.

The driver logic runs against `FakeDriver`, which simulates primary contexts,
their flags and CUresult codes; `_Driver` itself is checked against a fake
ctypes library. The tests marked ``cuda`` use a real GPU, in fresh processes
where CUDA is not yet initialised.
"""

from __future__ import annotations

import ctypes
import pathlib
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
import torch

from mujou_actors import cuda
from mujou_actors.errors import MujouError

ROOT = pathlib.Path(__file__).resolve().parent.parent

AUTO, SPIN, YIELD, BLOCK = 0x0, 0x1, 0x2, 0x4
MAP_HOST, LMEM_RESIZE_TO_MAX = 0x08, 0x10  # other context flags, to be kept
HANDLE = 100  # FakeDriver's CUdevice handle of ordinal i is HANDLE + i


# -- a fake driver -------------------------------------------------------------------------


class FakeDriver:
    """Primary contexts of `n` devices: flags, active, CUresult codes, a call log."""

    def __init__(self, n: int = 1, flags: list[int] | None = None,
                 active: list[bool] | None = None) -> None:
        self.n = n
        self.flags = list(flags) if flags is not None else [AUTO] * n
        self.active = list(active) if active is not None else [False] * n
        self.calls: list[tuple[Any, ...]] = []
        self.init_code = 0
        self.count_code = 0
        self.get_state_code = 0
        self.set_code = 0
        self.ignore_set = False  # the driver accepts the flags but keeps the old ones
        self.names = {1: "CUDA_ERROR_INVALID_VALUE", 100: "CUDA_ERROR_NO_DEVICE",
                      101: "CUDA_ERROR_INVALID_DEVICE"}

    def init(self) -> int:
        self.calls.append(("init",))
        return self.init_code

    def device_count(self) -> tuple[int, int]:
        self.calls.append(("device_count",))
        return self.count_code, self.n

    def device_get(self, ordinal: int) -> tuple[int, int]:
        self.calls.append(("device_get", ordinal))
        if not 0 <= ordinal < self.n:
            return 101, 0
        return 0, HANDLE + ordinal

    def primary_ctx_get_state(self, dev: int) -> tuple[int, int, bool]:
        self.calls.append(("get_state", dev))
        i = dev - HANDLE
        return self.get_state_code, self.flags[i], self.active[i]

    def primary_ctx_set_flags(self, dev: int, flags: int) -> int:
        self.calls.append(("set_flags", dev, flags))
        if self.set_code == 0 and not self.ignore_set:
            self.flags[dev - HANDLE] = flags
        return self.set_code

    def error_name(self, code: int) -> str | None:
        return self.names.get(code)

    @property
    def sets(self) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == "set_flags"]


@pytest.fixture
def use_driver(monkeypatch: pytest.MonkeyPatch):
    """Install a FakeDriver as the process's driver: ``use_driver(FakeDriver(...))``."""

    def install(fake: FakeDriver) -> FakeDriver:
        monkeypatch.setattr(cuda, "_driver", lambda: fake)
        return fake

    return install


def no_driver_call() -> Any:
    raise AssertionError("the driver was touched")


# -- arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sleep", "BLOCK", "", None, 4])
def test_an_unknown_mode_raises_value_error_before_any_driver_call(
        monkeypatch: pytest.MonkeyPatch, mode: Any) -> None:
    monkeypatch.setattr(cuda, "_driver", no_driver_call)

    with pytest.raises(ValueError, match="'auto', 'spin', 'yield', 'block'") as info:
        cuda.set_sync_mode(mode)

    assert repr(mode) in str(info.value)


@pytest.mark.parametrize("device, error", [(-1, ValueError), (True, TypeError),
                                           (1.0, TypeError), ("cpu", ValueError),
                                           (torch.device("cpu"), ValueError),
                                           ("nonsense", ValueError)])
def test_a_bad_device_is_refused_before_any_driver_call(
        monkeypatch: pytest.MonkeyPatch, device: Any, error: type) -> None:
    monkeypatch.setattr(cuda, "_driver", no_driver_call)

    with pytest.raises(error):
        cuda.set_sync_mode("block", device)
    with pytest.raises(error):
        cuda.get_sync_mode(device)


def test_a_device_out_of_range_is_a_value_error_naming_the_count(use_driver) -> None:
    fake = use_driver(FakeDriver(n=2))

    with pytest.raises(ValueError, match="device 2 does not exist.*2 device"):
        cuda.set_sync_mode("block", 2)
    with pytest.raises(ValueError, match="device 5"):
        cuda.get_sync_mode(5)

    assert fake.sets == []


@pytest.mark.parametrize("device, ordinal", [(1, 1), (torch.device("cuda", 1), 1),
                                             ("cuda:1", 1), ("cuda", 0)])
def test_devices_are_taken_as_ordinals_torch_devices_or_strings(
        use_driver, device: Any, ordinal: int) -> None:
    fake = use_driver(FakeDriver(n=2))

    assert cuda.set_sync_mode("block", device) == "block"

    assert fake.sets == [("set_flags", HANDLE + ordinal, BLOCK)]
    assert cuda.get_sync_mode(device) == "block"


# -- no driver, no device, driver errors ---------------------------------------------------


def test_without_a_driver_library_set_and_get_raise_sync_mode_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> Any:
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(cuda, "_open_library", fail)
    monkeypatch.setattr(cuda, "_DRIVER", None)

    with pytest.raises(cuda.SyncModeError, match="no CUDA driver.*libcuda.so.1") as info:
        cuda.set_sync_mode("block")
    with pytest.raises(cuda.SyncModeError, match="no CUDA driver"):
        cuda.get_sync_mode()

    assert isinstance(info.value, RuntimeError)
    assert isinstance(info.value, MujouError)
    assert cuda._DRIVER is None  # a failed load is not cached


def test_an_unknown_mode_is_reported_as_such_even_without_a_driver(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> Any:
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(cuda, "_open_library", fail)
    monkeypatch.setattr(cuda, "_DRIVER", None)

    with pytest.raises(ValueError, match="sync mode"):
        cuda.set_sync_mode("fast")


def test_no_device_from_cuinit_or_a_zero_count_is_a_sync_mode_error(use_driver) -> None:
    fake = use_driver(FakeDriver())
    fake.init_code = 100

    with pytest.raises(cuda.SyncModeError,
                       match=r"no CUDA device: cuInit failed with CUDA_ERROR_NO_DEVICE \(100\)"):
        cuda.set_sync_mode("block")

    use_driver(FakeDriver(n=0))
    with pytest.raises(cuda.SyncModeError, match="no CUDA device"):
        cuda.set_sync_mode("block")
    with pytest.raises(cuda.SyncModeError, match="no CUDA device"):
        cuda.get_sync_mode()


def test_driver_error_codes_are_named_with_the_call_and_device(use_driver) -> None:
    fake = use_driver(FakeDriver(n=2))
    fake.set_code = 1

    with pytest.raises(cuda.SyncModeError) as info:
        cuda.set_sync_mode("yield", 1)

    message = str(info.value)
    assert "cuDevicePrimaryCtxSetFlags" in message
    assert "device 1" in message
    assert "CUDA_ERROR_INVALID_VALUE (1)" in message
    assert info.value.device == 1


def test_error_codes_without_a_driver_name_fall_back_to_known_names(use_driver) -> None:
    fake = use_driver(FakeDriver())
    fake.names = {}
    fake.get_state_code = 708

    with pytest.raises(cuda.SyncModeError, match=r"CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE \(708\)"):
        cuda.get_sync_mode()

    fake.get_state_code = 12345
    with pytest.raises(cuda.SyncModeError,
                       match=r"cuDevicePrimaryCtxGetState.*unknown CUresult \(12345\)"):
        cuda.get_sync_mode()


def test_a_failing_error_name_lookup_does_not_hide_the_error(use_driver) -> None:
    fake = use_driver(FakeDriver())
    fake.count_code = 3

    def broken(code: int) -> str:
        raise RuntimeError("lookup broke")

    fake.error_name = broken  # type: ignore[method-assign]

    with pytest.raises(cuda.SyncModeError,
                       match=r"cuDeviceGetCount failed with CUDA_ERROR_NOT_INITIALIZED \(3\)"):
        cuda.set_sync_mode("block")


# -- setting and reading the flag ----------------------------------------------------------


@pytest.mark.parametrize("before, mode, after", [
    (AUTO, "block", BLOCK),
    (MAP_HOST | LMEM_RESIZE_TO_MAX, "block", MAP_HOST | LMEM_RESIZE_TO_MAX | BLOCK),
    (LMEM_RESIZE_TO_MAX | SPIN, "yield", LMEM_RESIZE_TO_MAX | YIELD),
    (MAP_HOST | BLOCK, "auto", MAP_HOST | AUTO),
    (BLOCK, "spin", SPIN),
])
def test_on_an_inactive_context_only_the_scheduling_bits_are_replaced(
        use_driver, before: int, mode: str, after: int) -> None:
    fake = use_driver(FakeDriver(flags=[before]))

    assert cuda.set_sync_mode(mode, 0) == mode

    assert fake.sets == [("set_flags", HANDLE, after)]
    assert fake.flags == [after]
    assert cuda.get_sync_mode(0) == mode


def test_the_flags_are_read_back_after_being_set(use_driver) -> None:
    fake = use_driver(FakeDriver())

    cuda.set_sync_mode("block", 0)

    i = fake.calls.index(("set_flags", HANDLE, BLOCK))
    assert fake.calls[:2] == [("init",), ("device_count",)]
    assert fake.calls[i + 1:] == [("device_get", 0), ("get_state", HANDLE)]


def test_a_different_mode_on_an_active_context_is_refused_naming_device_and_mode(
        use_driver) -> None:
    fake = use_driver(FakeDriver(n=2, flags=[AUTO, MAP_HOST | SPIN], active=[False, True]))

    with pytest.raises(cuda.SyncModeError) as info:
        cuda.set_sync_mode("block", 1)

    message = str(info.value)
    assert "device 1" in message
    assert "'spin'" in message and "'block'" in message
    assert "already active" in message
    assert "before the first CUDA use" in message
    assert (info.value.device, info.value.current) == (1, "spin")
    assert isinstance(info.value, RuntimeError)
    assert fake.sets == []
    assert fake.flags == [AUTO, MAP_HOST | SPIN]


def test_the_same_mode_on_an_active_context_is_a_no_op_success(use_driver) -> None:
    fake = use_driver(FakeDriver(flags=[MAP_HOST | BLOCK], active=[True]))

    assert cuda.set_sync_mode("block") == "block"
    assert cuda.set_sync_mode("block", 0) == "block"

    assert fake.sets == []


def test_the_same_mode_on_an_inactive_context_sets_nothing(use_driver) -> None:
    fake = use_driver(FakeDriver(flags=[YIELD]))

    assert cuda.set_sync_mode("yield") == "yield"

    assert fake.sets == []


def test_a_read_back_that_differs_is_an_error(use_driver) -> None:
    fake = use_driver(FakeDriver(flags=[MAP_HOST]))
    fake.ignore_set = True

    with pytest.raises(cuda.SyncModeError,
                       match="device 0 did not take effect.*'block'.*read back 'auto'") as info:
        cuda.set_sync_mode("block")

    assert (info.value.device, info.value.current) == (0, "auto")


def test_device_none_applies_the_mode_to_every_device(use_driver) -> None:
    fake = use_driver(FakeDriver(n=3, flags=[AUTO, MAP_HOST | SPIN, BLOCK],
                                 active=[False, False, True]))

    assert cuda.set_sync_mode("block") == "block"

    assert fake.sets == [("set_flags", HANDLE, BLOCK), ("set_flags", HANDLE + 1, MAP_HOST | BLOCK)]
    assert [cuda.get_sync_mode(i) for i in range(3)] == ["block"] * 3


def test_device_none_changes_nothing_when_one_device_refuses(use_driver) -> None:
    fake = use_driver(FakeDriver(n=3, flags=[AUTO, AUTO, AUTO], active=[False, False, True]))

    with pytest.raises(cuda.SyncModeError, match="device 2"):
        cuda.set_sync_mode("block")

    assert fake.sets == []
    assert fake.flags == [AUTO, AUTO, AUTO]


class FailingOn(FakeDriver):
    """A FakeDriver whose set_flags fails (or is ignored) on one device only."""

    def __init__(self, *args: Any, fail: int, ignore: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fail = HANDLE + fail
        self.ignore = ignore
        self.restore_code = 0  # what set_flags answers when it puts old flags back

    def primary_ctx_set_flags(self, dev: int, flags: int) -> int:
        if dev == self.fail and not self.ignore:
            self.calls.append(("set_flags", dev, flags))
            return 1
        if dev == self.fail:  # accepted, but the old flags stay
            self.calls.append(("set_flags", dev, flags))
            return 0
        if flags & 0x7 != BLOCK and self.restore_code:
            self.calls.append(("set_flags", dev, flags))
            return self.restore_code
        return super().primary_ctx_set_flags(dev, flags)


def test_device_none_sets_the_changed_devices_back_when_a_later_set_fails(use_driver) -> None:
    fake = use_driver(FailingOn(n=3, flags=[AUTO, MAP_HOST | SPIN, AUTO], fail=2))

    with pytest.raises(cuda.SyncModeError, match="cuDevicePrimaryCtxSetFlags for CUDA device 2"):
        cuda.set_sync_mode("block")

    assert fake.flags == [AUTO, MAP_HOST | SPIN, AUTO]
    assert fake.sets == [("set_flags", HANDLE, BLOCK), ("set_flags", HANDLE + 1, MAP_HOST | BLOCK),
                         ("set_flags", HANDLE + 2, BLOCK),
                         ("set_flags", HANDLE + 1, MAP_HOST | SPIN), ("set_flags", HANDLE, AUTO)]


def test_device_none_sets_the_changed_devices_back_when_a_read_back_differs(use_driver) -> None:
    fake = use_driver(FailingOn(n=3, fail=1, ignore=True))

    with pytest.raises(cuda.SyncModeError, match="device 1 did not take effect") as info:
        cuda.set_sync_mode("yield")

    assert info.value.device == 1
    assert fake.flags == [AUTO, AUTO, AUTO]
    assert fake.sets[-1] == ("set_flags", HANDLE, AUTO)  # device 0, already set, is set back
    assert ("set_flags", HANDLE + 2, YIELD) not in fake.sets  # device 2 never touched


def test_a_device_that_cannot_be_set_back_is_named_in_the_error(use_driver) -> None:
    fake = use_driver(FailingOn(n=2, fail=1))
    fake.restore_code = 1

    with pytest.raises(cuda.SyncModeError, match=r"devices \[0\] could not be set back.*'block'"):
        cuda.set_sync_mode("block")

    assert fake.flags == [BLOCK, AUTO]


def test_get_sync_mode_reads_the_scheduling_bits_only(use_driver) -> None:
    use_driver(FakeDriver(n=4, flags=[AUTO, MAP_HOST | SPIN, LMEM_RESIZE_TO_MAX | YIELD,
                                      MAP_HOST | BLOCK], active=[True, False, True, False]))

    assert [cuda.get_sync_mode(i) for i in range(4)] == ["auto", "spin", "yield", "block"]
    assert cuda.get_sync_mode() == "auto"


def test_get_sync_mode_refuses_a_scheduling_flag_that_is_none_of_the_four(use_driver) -> None:
    use_driver(FakeDriver(flags=[MAP_HOST | 0x3]))

    with pytest.raises(cuda.SyncModeError, match="unknown scheduling flag 0x3"):
        cuda.get_sync_mode()


def test_the_modes_map_to_the_driver_flags() -> None:
    assert cuda.SYNC_MODES == {"auto": 0, "spin": 1, "yield": 2, "block": 4}


# -- _Driver against a fake ctypes library -------------------------------------------------


class FakeLib:
    """Stands in for ctypes.CDLL('libcuda.so.1'): plain functions writing through byref."""

    def __init__(self, with_v2: bool = True, with_error_name: bool = True) -> None:
        self.flags = {7: MAP_HOST | SPIN}
        self.log: list[tuple[Any, ...]] = []

        def cuInit(flags: int) -> int:
            self.log.append(("cuInit", flags))
            return 0

        def cuDeviceGetCount(count: Any) -> int:
            count._obj.value = 1
            return 0

        def cuDeviceGet(dev: Any, ordinal: int) -> int:
            dev._obj.value = 7
            return 0 if ordinal == 0 else 101

        def cuDevicePrimaryCtxGetState(dev: int, flags: Any, active: Any) -> int:
            flags._obj.value = self.flags[dev]
            active._obj.value = 1
            return 0

        def set_flags(name: str) -> Any:
            def cuDevicePrimaryCtxSetFlags(dev: int, flags: int) -> int:
                self.log.append((name, dev, flags))
                self.flags[dev] = flags
                return 0

            return cuDevicePrimaryCtxSetFlags

        def cuGetErrorName(code: int, name: Any) -> int:
            if code != 101:
                return 1
            name._obj.value = b"CUDA_ERROR_INVALID_DEVICE"
            return 0

        self.cuInit = cuInit
        self.cuDeviceGetCount = cuDeviceGetCount
        self.cuDeviceGet = cuDeviceGet
        self.cuDevicePrimaryCtxGetState = cuDevicePrimaryCtxGetState
        self.cuDevicePrimaryCtxSetFlags = set_flags("v1")
        if with_v2:
            self.cuDevicePrimaryCtxSetFlags_v2 = set_flags("v2")
        if with_error_name:
            self.cuGetErrorName = cuGetErrorName


def test_the_ctypes_driver_passes_arguments_and_reads_outputs() -> None:
    lib = FakeLib()
    drv = cuda._Driver(lib)

    assert drv.init() == 0
    assert drv.device_count() == (0, 1)
    assert drv.device_get(0) == (0, 7)
    assert drv.device_get(3) == (101, 7)
    assert drv.primary_ctx_get_state(7) == (0, MAP_HOST | SPIN, True)
    assert drv.primary_ctx_set_flags(7, MAP_HOST | BLOCK) == 0
    assert drv.primary_ctx_get_state(7) == (0, MAP_HOST | BLOCK, True)
    assert drv.error_name(101) == "CUDA_ERROR_INVALID_DEVICE"
    assert drv.error_name(5) is None

    assert lib.log == [("cuInit", 0), ("v2", 7, MAP_HOST | BLOCK)]
    assert lib.cuInit.argtypes == [ctypes.c_uint]
    assert lib.cuDevicePrimaryCtxGetState.restype is ctypes.c_int


def test_the_ctypes_driver_falls_back_to_the_first_set_flags_and_no_error_names() -> None:
    lib = FakeLib(with_v2=False, with_error_name=False)
    drv = cuda._Driver(lib)

    drv.primary_ctx_set_flags(7, YIELD)

    assert lib.log == [("v1", 7, YIELD)]
    assert drv.error_name(101) is None


def test_the_driver_is_loaded_once_and_a_library_without_the_calls_is_no_driver(
        monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[int] = []
    monkeypatch.setattr(cuda, "_DRIVER", None)
    monkeypatch.setattr(cuda, "_open_library", lambda: loads.append(1) or FakeLib())

    assert cuda._driver() is cuda._driver()
    assert loads == [1]

    monkeypatch.setattr(cuda, "_DRIVER", None)
    monkeypatch.setattr(cuda, "_open_library", lambda: object())
    with pytest.raises(cuda.SyncModeError, match="no CUDA driver"):
        cuda._driver()


@pytest.mark.slow
def test_importing_the_module_loads_no_driver_and_initialises_no_cuda() -> None:
    code = textwrap.dedent("""
        import os, torch
        def libcuda():
            if not os.path.exists('/proc/self/maps'):
                return False
            return 'libcuda.so' in open('/proc/self/maps').read()
        before = libcuda()
        import mujou_actors.cuda as c
        print(torch.cuda.is_initialized(), libcuda() and not before, c._DRIVER is None)
    """)

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120, cwd=ROOT).stdout.split()

    assert out == ["False", "False", "True"]


# -- the run's stream waiters --------------------------------------------------------------


class FakeEvent:
    """Logs record/synchronize/query; query() turns True on its `ready_after`-th call."""

    def __init__(self, blocking: bool, log: list[tuple[Any, ...]], ready_after: int) -> None:
        self.blocking = blocking
        self.log = log
        self.ready_after = ready_after
        self.polls = 0

    def record(self, stream: Any) -> None:
        self.log.append(("record", self, stream))
        self.polls = 0

    def synchronize(self) -> None:
        self.log.append(("synchronize", self))

    def query(self) -> bool:
        self.log.append(("query", self))
        self.polls += 1
        return self.polls >= self.ready_after


class FakeStream:
    def __init__(self, name: str, device: str = "cuda:0") -> None:
        self.name = name
        self.device = torch.device(device)


class Events:
    """An event factory for StreamWaiter that keeps what it made and one shared log."""

    def __init__(self, ready_after: int = 1) -> None:
        self.made: list[FakeEvent] = []
        self.log: list[tuple[Any, ...]] = []
        self.ready_after = ready_after

    def __call__(self, blocking: bool) -> FakeEvent:
        event = FakeEvent(blocking, self.log, self.ready_after)
        self.made.append(event)
        return event

    def kinds(self) -> list[str]:
        return [entry[0] for entry in self.log]


def test_block_records_then_synchronizes_a_blocking_event_once_per_wait() -> None:
    events = Events()
    waiter = cuda.StreamWaiter("block", event_factory=events, yield_fn=no_driver_call)
    s = FakeStream("s")

    waiter.wait(s)
    waiter.wait(s)

    assert len(events.made) == 1 and events.made[0].blocking is True
    e = events.made[0]
    assert events.log == [("record", e, s), ("synchronize", e), ("record", e, s),
                          ("synchronize", e)]


def test_spin_polls_a_plain_event_until_it_is_done_without_yielding() -> None:
    events = Events(ready_after=5)
    yields: list[int] = []
    waiter = cuda.StreamWaiter("spin", event_factory=events, yield_fn=lambda: yields.append(1))

    waiter.wait(FakeStream("s"))

    assert len(events.made) == 1 and events.made[0].blocking is False
    assert events.kinds() == ["record"] + ["query"] * 5
    assert yields == []


def test_yield_polls_a_plain_event_yielding_between_polls() -> None:
    events = Events(ready_after=4)
    waiter = cuda.StreamWaiter("yield", event_factory=events,
                               yield_fn=lambda: events.log.append(("yield",)))

    waiter.wait(FakeStream("s"))

    assert events.made[0].blocking is False
    assert events.kinds() == ["record", "query", "yield", "query", "yield", "query", "yield",
                              "query"]


def test_a_finished_stream_is_queried_once_and_never_yields() -> None:
    events = Events(ready_after=1)
    waiter = cuda.StreamWaiter("yield", event_factory=events, yield_fn=no_driver_call)

    waiter.wait(FakeStream("s"))

    assert events.kinds() == ["record", "query"]


@pytest.mark.parametrize("sync", ["block", "spin", "yield"])
def test_one_event_is_reused_across_waits_and_streams_of_a_device(sync: str) -> None:
    events = Events(ready_after=2)
    waiter = cuda.make_waiter(sync, event_factory=events, yield_fn=lambda: None)
    a, b = FakeStream("a"), FakeStream("b")

    for stream in (a, b, a, a):
        waiter.wait(stream)

    assert len(events.made) == 1
    records = [entry[2] for entry in events.log if entry[0] == "record"]
    assert records == [a, b, a, a]


def test_a_waiter_keeps_one_event_per_device() -> None:
    events = Events()
    waiter = cuda.StreamWaiter("block", event_factory=events)
    s0, s1 = FakeStream("s0", "cuda:0"), FakeStream("s1", "cuda:1")

    for stream in (s0, s1, s0, s1):
        waiter.wait(stream)

    assert len(events.made) == 2
    assert [(entry[1], entry[2]) for entry in events.log if entry[0] == "record"] == [
        (events.made[0], s0), (events.made[1], s1), (events.made[0], s0), (events.made[1], s1)]


def test_creating_a_waiter_touches_no_cuda() -> None:
    events = Events()

    waiter = cuda.make_waiter("spin", event_factory=events)
    default = cuda.make_waiter("block")

    assert events.made == []
    assert isinstance(default, cuda.StreamWaiter)
    assert (waiter.sync, default.sync) == ("spin", "block")
    assert repr(default) == "StreamWaiter('block')"


def test_the_default_waiter_is_block() -> None:
    assert cuda.StreamWaiter().sync == "block"


@pytest.mark.parametrize("value", ["block", "spin", "yield"])
def test_check_cuda_sync_accepts_the_three_values(value: str) -> None:
    assert cuda.check_cuda_sync(value) == value


@pytest.mark.parametrize("value", ["sleep", "auto", "BLOCK", "", None, 1])
def test_check_cuda_sync_names_the_setting_and_the_allowed_values(value: Any) -> None:
    with pytest.raises(ValueError, match="cuda_sync must be one of 'block', 'spin', 'yield'"):
        cuda.check_cuda_sync(value)
    with pytest.raises(ValueError, match="cuda_sync"):
        cuda.make_waiter(value)
    with pytest.raises(ValueError, match="cuda_sync"):
        cuda.StreamWaiter(value)


# -- on a real GPU -------------------------------------------------------------------------


def run_fresh(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter (CUDA not initialised); its stdout lines."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.cuda
def test_gpu_block_set_before_first_use_holds_and_a_later_change_is_refused() -> None:
    out = run_fresh("""
        import torch
        from mujou_actors import cuda
        print(cuda.set_sync_mode("block"))
        x = torch.ones(4, device="cuda") * 2
        print(float(x.sum()), torch.cuda.is_initialized())
        print(cuda.get_sync_mode())
        try:
            cuda.set_sync_mode("spin")
        except cuda.SyncModeError as exc:
            print("refused", exc.device, exc.current)
        print(cuda.set_sync_mode("block", 0))
        print(cuda.get_sync_mode(torch.device("cuda", 0)))
    """)

    assert out == ["block", "8.0 True", "block", "refused 0 block", "block", "block"]


@pytest.mark.cuda
def test_gpu_after_set_device_and_a_tensor_another_mode_is_refused() -> None:
    out = run_fresh("""
        import torch
        from mujou_actors import cuda
        torch.cuda.set_device(0)
        x = torch.ones(1, device="cuda")
        current = cuda.get_sync_mode()
        other = "block" if current != "block" else "spin"
        try:
            cuda.set_sync_mode(other, 0)
            print("accepted")
        except cuda.SyncModeError as exc:
            print("refused", exc.device, exc.current == current)
        print(cuda.set_sync_mode(current, 0) == current)
    """)

    assert out == ["refused 0 True", "True"]


SYNC_CPU = """
    import time, torch
    from mujou_actors import cuda
    cuda.set_sync_mode({mode!r})
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(50_000_000)
    torch.cuda.synchronize()
    per_cycle = (time.perf_counter() - t0) / 50_000_000
    torch.cuda._sleep(int(0.4 / per_cycle))
    w0, c0 = time.perf_counter(), time.thread_time()
    torch.cuda.synchronize()
    print(time.perf_counter() - w0, time.thread_time() - c0)
"""


@pytest.mark.cuda
def test_gpu_block_mode_makes_torch_synchronize_sleep_and_spin_keeps_the_core_busy() -> None:
    block_wall, block_cpu = map(float, run_fresh(SYNC_CPU.format(mode="block"))[-1].split())
    spin_wall, spin_cpu = map(float, run_fresh(SYNC_CPU.format(mode="spin"))[-1].split())

    assert block_wall > 0.2 and spin_wall > 0.2
    assert block_cpu < 0.5 * block_wall
    assert spin_cpu > 0.5 * spin_wall


def _gpu_wait_cpu(sync: str) -> tuple[float, float, bool]:
    stream = torch.cuda.Stream()
    waiter = cuda.make_waiter(sync)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(1000)
    waiter.wait(stream)
    t0 = time.perf_counter()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)
    waiter.wait(stream)
    per_cycle = (time.perf_counter() - t0) / 50_000_000
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(0.3 / per_cycle))
    w0, c0 = time.perf_counter(), time.thread_time()
    waiter.wait(stream)
    return time.perf_counter() - w0, time.thread_time() - c0, stream.query()


@pytest.mark.cuda
@pytest.mark.parametrize("sync", ["block", "spin", "yield"])
def test_gpu_waiter_returns_once_the_stream_is_done(sync: str) -> None:
    stream = torch.cuda.Stream()
    waiter = cuda.make_waiter(sync)
    x = torch.ones(1 << 20, device="cuda")

    # Ordered after the default stream, where x was made: outside the context,
    # since inside it the current stream is `stream` itself.
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(20_000_000)
        y = x * 3
    waiter.wait(stream)

    assert stream.query()
    assert float(y[0]) == 3.0


@pytest.mark.cuda
def test_gpu_block_waiter_sleeps_and_spin_waiter_polls() -> None:
    block_wall, block_cpu, block_done = _gpu_wait_cpu("block")
    spin_wall, spin_cpu, spin_done = _gpu_wait_cpu("spin")

    assert block_done and spin_done
    assert block_wall > 0.15 and spin_wall > 0.15
    assert block_cpu < 0.5 * block_wall
    assert spin_cpu > 0.5 * spin_wall
