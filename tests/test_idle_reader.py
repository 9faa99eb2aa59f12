"""An idle worker reads the links of a real-time group (distributed/idleread.py and
`Dispatcher.set_reader`: the Leader/Followers pattern).

What must hold: one idle worker at a time waits in the reader; what it writes into the
kernel runs on its own thread (no other thread woken between a message and its hook);
every notify that would wake a waiting worker makes the reader return; a reader taken
away is left by the worker waiting in it; timed waits (a period's next tick) still end
on time; and the wait itself (``ppoll``) sees the descriptors and its wake, reports what
the group's delivery raises instead of raising, and keeps no stale descriptor.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import mujou_actors as mujou
from mujou_actors._runtime.kernel import Kernel
from mujou_actors.distributed import idleread
from mujou_actors.distributed.unixstream import UnixStream

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not idleread.available, reason="no ppoll in this C library")]
BOUND_S = 10.0
WAKE = object()


class Echo(mujou.Node):
    """Records each message with the thread its hook ran on."""

    inp = mujou.Input(int, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.seen: list[tuple[int, int]] = []
        self.ran = threading.Semaphore(0)

    def on_update(self, dt: float) -> None:
        for v in self.inp.drain():
            self.seen.append((v, threading.get_ident()))
            self.ran.release()


class Ticker(mujou.Node):
    """Counts its ticks (a period of 10 ms)."""

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.ticks = threading.Semaphore(0)

    def on_update(self, dt: float) -> None:
        self.ticks.release()


class FakeReader:
    """A reader that waits on a queue: a value put there is a message from a link (written
    into the kernel by the waiting worker), `WAKE` the reader's wake."""

    def __init__(self) -> None:
        self.kernel: Kernel | None = None
        self.box: queue.Queue[object] = queue.Queue()
        self.threads: list[int] = []
        self.timeouts: list[float | None] = []
        self.wakes = 0
        self.inside = 0
        self.most_inside = 0
        self._lock = threading.Lock()

    def wake(self) -> None:
        self.wakes += 1
        self.box.put(WAKE)

    def read(self, timeout: float | None) -> None:
        with self._lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        self.threads.append(threading.get_ident())
        self.timeouts.append(timeout)
        try:
            got = self.box.get(timeout=BOUND_S if timeout is None else min(BOUND_S, timeout))
        except queue.Empty:
            got = WAKE
        finally:
            with self._lock:
                self.inside -= 1
        if got is not WAKE:
            assert self.kernel is not None
            self.kernel.write("echo.inp", got)


@pytest.fixture
def echo() -> Iterator[tuple[Kernel, Echo, FakeReader]]:
    """A free-running real-time kernel of one Echo node, three workers, a FakeReader set."""
    net = {"echo": Echo()}
    k = Kernel(net, ["echo"], workers=3, seed=0, timer="realtime")
    reader = FakeReader()
    reader.kernel = k
    k.set_reader(reader.read, reader.wake)
    k.start()
    k.run_free()
    yield k, net["echo"], reader
    k.stop(5)


def _ran(node: Echo, n: int) -> None:
    for _ in range(n):
        assert node.ran.acquire(timeout=BOUND_S), "a hook did not run within the bound"


def test_what_the_waiting_worker_reads_runs_on_its_own_thread_one_reader_at_a_time(
        echo: tuple[Kernel, Echo, FakeReader]) -> None:
    k, node, reader = echo
    for v in range(20):
        reader.box.put(v)
        _ran(node, 1)
    assert [v for v, _ in node.seen] == list(range(20))
    # Each message's hook ran on the thread that read it: no worker was woken for it.
    readers = set(reader.threads)
    assert {thread for _, thread in node.seen} <= readers
    assert reader.most_inside == 1  # three workers, one of them in the reader at a time
    assert all(t is None for t in reader.timeouts)  # nothing timed: waits until woken


def test_a_write_from_another_thread_wakes_the_worker_waiting_in_the_reader(
        echo: tuple[Kernel, Echo, FakeReader]) -> None:
    k, node, reader = echo
    deadline = time.monotonic() + BOUND_S
    while reader.inside == 0:  # a worker waits in the reader (bounded)
        assert time.monotonic() < deadline
        time.sleep(0.001)
    wakes = reader.wakes
    k.write("echo.inp", 5)  # the host's write, as the data-plane thread's delivery
    _ran(node, 1)
    assert node.seen[0][0] == 5
    assert reader.wakes > wakes  # the notify reached the reader through its wake


def test_a_reader_taken_away_is_left_and_not_called_again(
        echo: tuple[Kernel, Echo, FakeReader]) -> None:
    k, node, reader = echo
    deadline = time.monotonic() + BOUND_S
    while reader.inside == 0:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    wakes = reader.wakes
    k.set_reader(None)
    assert reader.wakes == wakes + 1  # the worker in it was told to look again
    while reader.inside:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    calls = len(reader.threads)
    for v in range(3):
        k.write("echo.inp", v)
    _ran(node, 3)
    assert len(reader.threads) == calls


def test_a_reader_needs_its_wake() -> None:
    k = Kernel({"echo": Echo()}, ["echo"], seed=0, timer="realtime")
    with pytest.raises(ValueError, match="needs its wake"):
        k.set_reader(lambda timeout: None)


def test_a_worker_waiting_in_the_reader_for_the_next_tick_wakes_for_it() -> None:
    net = {"tick": Ticker()}
    k = Kernel(net, ["tick"], seed=0, timer="realtime")
    reader = FakeReader()
    k.set_reader(reader.read, reader.wake)
    k.start()
    k.run_free()
    try:
        for _ in range(5):
            assert net["tick"].ticks.acquire(timeout=BOUND_S)
    finally:
        k.stop(5)
    timed = [t for t in reader.timeouts if t is not None]
    assert timed and all(0 <= t <= 0.0101 for t in timed)  # never past the next tick


# -- idleread: the wait and the reader ------------------------------------------------------

@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)


def test_wait_returns_the_readable_positions_or_nothing_once_the_time_passed(
        pipe: tuple[int, int]) -> None:
    r, w = pipe
    r2, w2 = os.pipe()
    try:
        fds = idleread._Fds([r, r2])
        start = time.monotonic()
        assert idleread.wait(fds, 0.02) == []
        assert time.monotonic() - start >= 0.019  # nanoseconds, not rounded down to 0 ms
        os.write(w2, b"x")
        assert idleread.wait(fds, None) == [1]
        os.write(w, b"x")
        assert idleread.wait(fds, 0) == [0, 1]
    finally:
        os.close(r2)
        os.close(w2)


def test_the_idle_reader_delivers_what_comes_and_returns_on_its_wake(
        pipe: tuple[int, int]) -> None:
    r, w = pipe
    token = object()
    delivered: list[object] = []
    failures: list[BaseException] = []

    def deliver(got: object) -> bool:
        delivered.append(got)
        return True

    reader = idleread.IdleReader(lambda: (token, [r]), deliver, failures.append)
    try:
        os.write(w, b"x")
        reader.read(BOUND_S)
        assert delivered == [token] and reader.reads == 1
        os.read(r, 1)
        reader.wake.set()
        reader.read(BOUND_S)  # the wake alone: nothing delivered
        assert delivered == [token]
        reader.read(0.001)  # the wake was cleared: the time passes
        assert delivered == [token] and failures == []
    finally:
        reader.close()


def test_the_idle_reader_reports_what_delivery_raises_and_never_raises(
        pipe: tuple[int, int]) -> None:
    r, w = pipe
    failures: list[BaseException] = []

    def deliver(token: object) -> None:
        raise ValueError("a frame that does not decode")

    reader = idleread.IdleReader(lambda: ("rt", [r]), deliver, failures.append)
    try:
        os.write(w, b"x")
        reader.read(BOUND_S)
        assert [str(e) for e in failures] == ["a frame that does not decode"]
    finally:
        reader.close()


def test_the_idle_reader_waits_on_the_links_of_the_current_token_only(
        pipe: tuple[int, int]) -> None:
    r, w = pipe
    current: list[tuple[object, list[int]] | None] = [None]
    delivered: list[object] = []

    def deliver(got: object) -> bool:
        delivered.append(got)
        return True

    reader = idleread.IdleReader(lambda: current[0], deliver, pytest.fail)
    try:
        os.write(w, b"x")  # readable, but no links are open: the wake alone is waited on
        reader.read(0.005)
        assert delivered == []
        current[0] = ("first", [r])
        reader.read(BOUND_S)
        assert delivered == ["first"]
        current[0] = None  # given up: not waited on again
        reader.read(0.005)
        assert delivered == ["first"]
    finally:
        reader.close()


# -- unixstream: any thread may receive -----------------------------------------------------

def test_two_threads_receiving_one_stream_get_each_message_once_whole_and_in_order(
        tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    listening = UnixStream.listen(path)
    connected = UnixStream.connect(path, timeout=5)
    n = 2000
    got: dict[int, list[int]] = {0: [], 1: []}
    done = threading.Event()

    def receive(which: int) -> None:
        deadline = time.monotonic() + BOUND_S
        while not done.is_set() and time.monotonic() < deadline:
            frames = listening.receive()
            if frames is None:
                continue
            head, body = frames
            assert body == head * 50  # whole: both frames of one message
            got[which].append(int(head))

    threads = [threading.Thread(target=receive, args=(i,)) for i in (0, 1)]
    try:
        for t in threads:
            t.start()
        for i in range(n):
            head = str(i).encode()
            connected.send([head, head * 50])
        deadline = time.monotonic() + BOUND_S
        while len(got[0]) + len(got[1]) < n and time.monotonic() < deadline:
            time.sleep(0.001)
        done.set()
        for t in threads:
            t.join(BOUND_S)
    finally:
        done.set()
        listening.close()
        connected.close()
    assert sorted(got[0] + got[1]) == list(range(n))  # once each, none lost
    for which in (0, 1):  # each thread's in the order sent
        assert got[which] == sorted(got[which])


def test_a_stream_whose_number_names_another_file_says_so(tmp_path: Path) -> None:
    """Linux's poll looks a descriptor's number up as it starts and registers on that file
    only then: a thread waiting on a listening end sleeps on the listening socket after
    the connection took its number (`UnixStream._accept`'s dup2), and never sees what the
    connection reads. So the stream calls ``on_replaced`` as its number changes file (the
    accept, the quiet descriptor at the peer's end), and the group wakes its reader."""
    path = str(tmp_path / "s")
    listening = UnixStream.listen(path)
    calls: list[bool] = []
    listening.on_replaced = lambda: calls.append(listening.eof)
    connected = UnixStream.connect(path, timeout=5)
    try:
        assert listening.receive() is None and calls == [False]  # accepted: a new file
        connected.send([b"x"])
        connected.close()
        deadline = time.monotonic() + BOUND_S
        got = []
        while not listening.eof and time.monotonic() < deadline:
            if (frames := listening.receive()) is not None:
                got.append(frames)
        assert got == [[b"x"]] and calls == [False, True]  # then the quiet one at the end
    finally:
        listening.close()
        connected.close()


class _Poll:
    def __init__(self, readable: list[bool]) -> None:
        self.readable = readable

    def poll(self, timeout: int) -> list[tuple[int, int]]:
        return [(3, 1)] if self.readable.pop(0) else []


def test_the_sweep_reads_what_a_waiting_worker_left_a_sweep_long_and_wakes_it() -> None:
    """The data-plane thread's sweep (`RealTimeGroupServer._uncovered`): bytes on the links while no
    worker waits are its own to read at once; while one waits, they are the worker's, but
    bytes still there at the next sweep were missed: the worker is woken and the sweep
    reads them."""
    from types import SimpleNamespace

    from mujou_actors.distributed.grouprt import RealTimeGroupServer
    woken: list[int] = []
    reader = SimpleNamespace(waiting=True, wake=SimpleNamespace(set=lambda: woken.append(1)))
    server = SimpleNamespace(_reader=reader, _seen_readable=False)
    sweep = [True, True, False, True, False, True, True, True]
    covered = _Poll(list(sweep))
    got = [RealTimeGroupServer._uncovered(server, covered) for _ in sweep]  # type: ignore[arg-type]
    assert got == [False, True, False, False, False, False, True, False]
    assert len(woken) == 2
    reader.waiting = False
    assert RealTimeGroupServer._uncovered(server, _Poll([True])) is True  # type: ignore[arg-type]
    assert RealTimeGroupServer._uncovered(server, _Poll([False])) is False  # type: ignore[arg-type]
    server._reader = None
    assert RealTimeGroupServer._uncovered(server, _Poll([True])) is True  # type: ignore[arg-type]
    assert len(woken) == 2
