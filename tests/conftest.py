"""Shared fixtures: worker counts, small nodes used across the test files."""

from __future__ import annotations

import os
import pathlib
import signal
import sys
import threading
import warnings
from collections.abc import Iterator

import pytest
import torch

import mujou_actors as mujou


@pytest.fixture(params=[1, 2, 4], ids=lambda n: f"workers={n}")
def workers(request: pytest.FixtureRequest) -> int:
    """Run a test under each worker count."""
    return request.param


@pytest.fixture(autouse=True)
def _convention_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``MUJOU_SECRET`` for every test that does not set or remove one itself.

    Conventions (a leader, ``mujou worker`` members, the clients that list
    them) authenticate their control plane with it, even on one machine.
    """
    if "MUJOU_SECRET" not in os.environ and "MUJOU_SECRET_FILE" not in os.environ:
        monkeypatch.setenv("MUJOU_SECRET", "the tests' shared secret, 32+ bytes long")


@pytest.fixture(autouse=True)
def _signal_handlers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts with the process's SIGINT and SIGTERM handlers as they were.

    A test that leaves one changed (a command run in this process, a library
    that installs its own) would change what a later one gets from Ctrl-C:
    the handlers are put back, with a warning that names the test.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in before.items():
        if signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)
            warnings.warn(f"{request.node.nodeid} left the {signum.name} handler changed; "
                          f"put back", stacklevel=1)


@pytest.fixture
def unwritable_folder(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A folder that takes no new file: read-only mode bits, or /sys where root ignores them."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        try:
            (folder / "probe").touch()
        except PermissionError:
            yield folder
            return
        (folder / "probe").unlink()  # root: mode bits do not stop it; sysfs takes no files
        try:
            (pathlib.Path("/sys") / "mujou-probe").touch()
        except OSError:
            if sys.platform.startswith("linux"):
                yield pathlib.Path("/sys")
                return
        pytest.skip("no folder here refuses new files to this user")
    finally:
        folder.chmod(0o755)


# Test modules whose every test is slow (pytest.ini_options' `slow` marker): runs placed in
# processes of their own, several machines, process liveness (test_system), the examples,
# the benchmarks, random nets and fuzzing with many examples, and the architecture page's
# source checks. `python -m pytest -m "not slow"` (README, "Development") leaves them out;
# CI runs everything. A slow test in an otherwise quick module carries
# `@pytest.mark.slow` itself: one that takes about a second or more on a 2-core machine,
# most of them because they start processes (the `mujou` command, a fresh interpreter, a
# placed run's groups) or wait out a timeout on purpose.
SLOW_MODULES = frozenset({
    "test_architecture", "test_benchmarks", "test_examples", "test_machines",
    "test_peer_links", "test_processes", "test_realtime_peers", "test_recording_fuzz",
    "test_system",
})
SLOW_PREFIXES = ("test_placed",)  # test_placed.py, test_placed_parity.py, ...


def _is_slow_module(name: str) -> bool:
    return name in SLOW_MODULES or name.startswith(SLOW_PREFIXES)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _is_slow_module(item.path.stem):
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


class Counter(mujou.Node):
    """A periodic node that records every dt it gets."""

    def __init__(self, period: float | None = 0.01, **kw: object) -> None:
        super().__init__(period=period, **kw)  # type: ignore[arg-type]
        self.dts: list[float] = []

    def on_update(self, dt: float) -> None:
        self.dts.append(dt)


class Source(mujou.Node):
    """Sends its update count (an int) every period."""

    out = mujou.Output(int)

    def __init__(self, period: float | None = 0.01, **kw: object) -> None:
        super().__init__(period=period, **kw)  # type: ignore[arg-type]
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.out.send(self.n)


class Collector(mujou.Node):
    """Triggered by its Input; drains and records every message."""

    inp = mujou.Input(object, depth=None)

    def __init__(self, period: float | None = None, **kw: object) -> None:
        super().__init__(period=period, **kw)  # type: ignore[arg-type]
        self.batches: list[list[object]] = []

    def on_update(self, dt: float) -> None:
        self.batches.append(self.inp.drain())

    @property
    def received(self) -> list[object]:
        return [m for batch in self.batches for m in batch]


class Tick(mujou.Node):
    """Sends ``(its index, its update count)`` every millisecond."""

    out = mujou.Output(tuple)

    def __init__(self, i: int) -> None:
        super().__init__(period=0.001)
        self.i, self.n = i, 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.out.send((self.i, self.n))
