"""Pieces the benchmark scripts share: the no-op node, the heap-loop floor, summaries,
and the processes of the peers' rows (Thespian's), on loopback and gone with their starter.

The scripts put their own folder on ``sys.path`` (as ``python benchmarks/X.py``
does), so they import this module as ``common``.

Peer processes (`peer_processes`, `thespian_peer`): a peer row that starts
processes of its own (stock Thespian's admin, its logger and its actors, a
child benchmark script) runs them inside ``with peer_processes():``. Every
process started meanwhile, by fork or by spawn, at any depth, is *adopted* as
it starts: by ``os.register_at_fork`` (a fork) or by importing this module (a
spawned process imports its parent's main script, which imports this one; so
does a child benchmark script), through the variable `PEER_ENV`, which names
the processes to outlive none of (each context's opener, the outermost first)
and a folder where each adopted process registers its pid. An adopted process

- binds Thespian's sockets to 127.0.0.1: stock Thespian binds every socket to
  every interface (``('', port)``) and advertises the machine's outward
  address; here both are 127.0.0.1, and nothing else of Thespian changes (its
  protocol is the one the rows compare against);
- runs a watchdog thread that, once one of those processes is gone (even
  SIGKILLed: polled every `WATCH_PERIOD_S`, by pid and start time), sends
  SIGTERM to its own main thread (Thespian's graceful end) and ends the
  process `EXIT_GRACE_S` later if it is still there. Thespian's admin leaves
  its starter's session (``setsid``, then a fork), so no process group or
  parent-death signal reaches it: only this does.

The context itself, on the way out (``finally``), waits up to `REAP_S` for
the processes registered under it to end and SIGKILLs those left.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import heapq
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

import mujou_actors as mujou


class NoOp(mujou.Node):
    """A periodic node whose update does nothing: what dispatch costs alone."""

    def on_update(self, dt: float) -> None:
        pass


class Plain:
    """A plain object with the very same no-op method (the floor's node)."""

    on_update = NoOp.on_update


def cpu_s() -> float:
    """CPU seconds this process has used so far, every thread, user and system.

    ``resource.getrusage(RUSAGE_SELF)``: read before and after a measured part,
    the difference is what that part cost the machine, which, unlike its wall
    time, other load on the machine does not stretch (a thread that waits for a
    CPU is not charged for it).
    """
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def heap_floor(periods: list[int], end_ns: int,
               on_ready: Callable[[], None] | None = None) -> dict:
    """The floor: pop due times from a heap and call the same no-op method.

    Args:
        periods: one period per node, integer nanoseconds.
        end_ns: the last due time to run, nanoseconds.
        on_ready: called once the objects and the heap are built, before the
            timed loop (to read the build time and memory).

    Returns:
        dict: ``updates`` (calls made), ``rate`` (calls per wall second) and
        ``cpu_s`` (the process's CPU seconds over the same loop, `cpu_s`).
    """
    objs = [Plain() for _ in periods]
    last = [0] * len(periods)
    heap = [(p, i) for i, p in enumerate(periods)]
    heapq.heapify(heap)
    replace = heapq.heapreplace
    updates = 0
    if on_ready is not None:
        on_ready()
    gc.collect()
    c0 = cpu_s()
    t0 = time.perf_counter()
    while heap[0][0] <= end_ns:
        due, i = heap[0]
        dt = (due - last[i]) / 1e9
        last[i] = due
        objs[i].on_update(dt)
        updates += 1
        replace(heap, (due + periods[i], i))
    t1 = time.perf_counter()
    c1 = cpu_s()
    return {"updates": updates, "rate": updates / (t1 - t0), "cpu_s": c1 - c0}


def summary(values: list[float]) -> dict:
    """Median, min, max and the samples of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "samples": values}


def pct(values: list[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (nearest rank).

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("pct: no values")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))]


def machine() -> str:
    """The machine in words: its architecture, CPUs and Python."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def repeat_and_only(ap: argparse.ArgumentParser, args: argparse.Namespace,
                    workloads: tuple[str, ...]) -> tuple[int, list[str] | tuple[str, ...]]:
    """The repetitions and workloads that ``--repeat``, ``--quick`` and ``--only`` ask for.

    Default 5 repetitions, 2 with ``--quick``. Calls ``ap.error`` (exit status
    2) for fewer than one repetition, an unknown workload or an empty ``--only``.
    """
    repeat = args.repeat if args.repeat is not None else (2 if args.quick else 5)
    if repeat < 1:
        ap.error("--repeat must be >= 1")
    only = workloads if args.only is None else args.only
    unknown = [name for name in only if name not in workloads]
    if unknown or not only:
        what = f"no workload {', '.join(unknown)}" if unknown else "name at least one workload"
        ap.error(f"--only: {what}; choose from {', '.join(workloads)}")
    return repeat, only


def show_table(title: str, first: str, results: dict[str, dict[str, float]],
               columns: tuple[tuple[str, str, str], ...]) -> None:
    """Print a table of figures: rich if installed, plain text otherwise.

    Args:
        title: the table's title.
        first: the heading of the first column, which names each row.
        results: row name -> figures by key.
        columns: ``(key, heading, format)`` per column; a missing figure shows as a dash.
    """
    heads = [first] + [h for _, h, _ in columns]
    rows = [[name] + [fmt.format(r[k]) if k in r else "—" for k, _, fmt in columns]
            for name, r in results.items()]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        print("  ".join(f"{h:>16s}" for h in heads))
        for row in rows:
            print("  ".join(f"{cell:>16s}" for cell in row))
        return
    table = Table(title=title)
    for h in heads:
        table.add_column(h, justify="left" if h == first else "right")
    for row in rows:
        table.add_row(*row)
    Console().print(table)


class TimedSender(mujou.Node):
    """A sender that times its sends: ``n`` per update, each update's CPU ns per send in ``ns``.

    The sender of benchmarks/recording.py and view.py: ``case`` ``"float"`` sends
    floats on an ``Output(float)``, ``"tensor"`` a 1 KiB tensor on an
    ``Output(torch.Tensor)``; a subclass decides when an update sends
    (`timed_sends`).
    """

    def __init__(self, case: str, n: int, ticks: int) -> None:
        super().__init__(period=0.001)
        self.case, self.n, self.ticks = case, n, ticks
        self.out = mujou.Output(float) if case == "float" else mujou.Output(torch.Tensor)
        self.t = torch.rand(256)
        self.ns: list[float] = []

    def timed_sends(self) -> Callable[[], None]:
        """Make this update's ``n`` sends, timed (thread CPU ns); returns the send loop."""
        sends = send_loop(self.out, self.case, self.n, self.t)
        t0 = time.thread_time_ns()
        sends()
        self.ns.append((time.thread_time_ns() - t0) / self.n)
        return sends


class PeriodicReader(mujou.Node):
    """The one reader of a `TimedSender`: periodic, so that no send triggers it."""

    def __init__(self, case: str) -> None:
        super().__init__(period=0.001)
        self.inp = mujou.Input(float) if case == "float" else mujou.Input(torch.Tensor)

    def on_update(self, dt: float) -> None:
        self.inp.read()


def send_loop(out: mujou.Output, case: str, n: int, tensor: object) -> Callable[[], None]:
    """``n`` sends on ``out`` in one call: floats (``case == "float"``) or ``tensor``.

    The loop a sender node times in its update (benchmarks/recording.py, view.py): a
    function made once per update, so that the timed part is the sends alone.
    """
    if case == "float":
        def sends() -> None:
            for k in range(n):
                out.send(k * 0.5)
    else:
        def sends() -> None:
            for _ in range(n):
                out.send(tensor)
    return sends


# --------------------------------------------------------------------------- peer processes

PEER_ENV = "MUJOU_BENCH_PEER"
"""The variable that makes a process a peer row's: ``{"watch": [[pid, start], ...],
"folder": path}`` (JSON): the processes it must not outlive, and where it registers."""

WATCH_PERIOD_S = 0.25  # seconds between two looks of a watchdog at the processes it watches
EXIT_GRACE_S = 2.0  # seconds from a watchdog's SIGTERM to its os._exit
REAP_S = 10.0  # seconds a closing context waits for its processes before SIGKILLing them
LOOPBACK = "127.0.0.1"

_adopted = threading.Lock()  # taken for good by the first adoption of this process


def start_time(pid: int) -> int | None:
    """A process's start time (clock ticks since boot, ``/proc/PID/stat``), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return int(raw[raw.rfind(")") + 2:].split()[19])


def alive(pid: int, started: int | None) -> bool:
    """Whether ``pid`` runs (no zombie) and is the process that started at ``started``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return False
    fields = raw[raw.rfind(")") + 2:].split()
    return fields[0] not in ("Z", "X") and (started is None or int(fields[19]) == started)


def _on_loopback(plain: Callable[..., None]) -> Callable[..., None]:
    """``IPActorAddress.__init__`` (``plain``) with 127.0.0.1 for "any" and "find out"."""
    if getattr(plain, "on_loopback", False):
        return plain

    def on_loopback(self: Any, af: Any, socktype: Any, proto: Any, baseaddr: Any, port: Any,
                    external: Any = False) -> None:
        if baseaddr in (None, "", "0.0.0.0"):
            baseaddr = LOOPBACK  # advertised: not the machine's outward address
        plain(self, af, socktype, proto, baseaddr, port, external)
        if self.bindname[0] in ("", "0.0.0.0"):
            self.bindname = (LOOPBACK, *self.bindname[1:])  # bound: not every interface

    on_loopback.on_loopback = True  # type: ignore[attr-defined]
    return on_loopback


@contextlib.contextmanager
def loopback_thespian() -> Iterator[None]:
    """Within it, every Thespian IP address made in this process is on 127.0.0.1.

    Thespian makes its addresses (the one it binds, the one it advertises) in
    ``IPActorAddress.__init__``, with no way to pass a host: the method is
    swapped for the length of the block. Without Thespian, it does nothing.
    """
    try:
        from thespian.system.transport.IPBase import IPActorAddress
    except ImportError:
        yield
        return
    plain = IPActorAddress.__init__
    IPActorAddress.__init__ = _on_loopback(plain)
    try:
        yield
    finally:
        IPActorAddress.__init__ = plain


def _peer() -> dict[str, Any] | None:
    """This process's `PEER_ENV`, None if it is no peer row's."""
    raw = os.environ.get(PEER_ENV)
    try:
        return None if not raw else dict(json.loads(raw))
    except ValueError:
        return None


def _adopt() -> None:
    """Make this process a peer row's, if `PEER_ENV` says so (once): see the module."""
    peer = _peer()
    if peer is None or any(pid == os.getpid() for pid, _ in peer["watch"]):
        return
    if not _adopted.acquire(blocking=False):
        return
    # Thespian's finalizers fail as the interpreter tears down (its module's names gone):
    # not worth a traceback on the benchmark's stderr, as the process ends anyway.
    previous = sys.unraisablehook
    sys.unraisablehook = lambda u: None if sys.is_finalizing() else previous(u)
    try:  # for the rest of this process's life
        from thespian.system.transport.IPBase import IPActorAddress
    except ImportError:
        pass
    else:
        IPActorAddress.__init__ = _on_loopback(IPActorAddress.__init__)
    mine = os.path.join(peer["folder"], str(os.getpid()))
    try:
        with open(mine, "w") as f:
            f.write(str(start_time(os.getpid())))
    except OSError:
        pass  # its context has ended already: the watchdog still ends it
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:  # signals go to the main thread (Thespian's loop), not the watchdog
        threading.Thread(target=_watch, args=(peer["watch"], mine), daemon=True,
                         name="bench-peer-watchdog").start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _after_fork() -> None:
    """In a forked child: adopted afresh (a fork keeps neither the thread nor the pid)."""
    global _adopted
    _adopted = threading.Lock()
    _adopt()


def _watch(watched: list[list[int]], mine: str) -> None:
    """A watchdog's loop: end this process once one of ``watched`` is gone."""
    while all(alive(pid, started) for pid, started in watched):
        time.sleep(WATCH_PERIOD_S)
    try:
        _unregister(mine)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
        time.sleep(EXIT_GRACE_S)
    finally:
        os._exit(70)


def _unregister(mine: str) -> None:
    """Remove this process's file, and the dead's; the folder once no live process is left."""
    folder = os.path.dirname(mine)
    with contextlib.suppress(OSError):
        os.unlink(mine)
    for pid in _registered(folder, live=False):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, str(pid)))
    if not _registered(folder, live=True):
        shutil.rmtree(folder, ignore_errors=True)


def _registered(folder: str, live: bool) -> list[int]:
    """The processes registered in ``folder`` that are alive (``live``) or gone, sorted."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in filter(str.isdigit, names):
        try:
            with open(os.path.join(folder, name)) as f:
                started = f.read()
        except OSError:
            continue  # unregistered meanwhile
        if alive(int(name), int(started) if started else None) == live:
            found.append(int(name))
    return sorted(found)


def peer_pids() -> list[int]:
    """The live processes adopted under the innermost open `peer_processes` of this process.

    Returns:
        list[int]: their pids, sorted; empty outside a context.
    """
    peer = _peer()
    return [] if peer is None else _registered(peer["folder"], live=True)


_PREFIX = "mujou-bench-peer-"


def _sweep() -> None:
    """Remove the folders of contexts whose opener is gone (SIGKILLed: it removed none)
    and that no live process is registered in (one killed by another, unregistered)."""
    for entry in os.scandir(tempfile.gettempdir()):
        if not entry.name.startswith(_PREFIX):
            continue
        try:
            with open(os.path.join(entry.path, "opener")) as f:
                pid, started = json.load(f)
        except (OSError, ValueError):
            continue
        if not alive(pid, started) and not _registered(entry.path, live=True):
            shutil.rmtree(entry.path, ignore_errors=True)


@contextlib.contextmanager
def peer_processes() -> Iterator[None]:
    """Within it, every process started is a peer row's: on loopback, gone with this one.

    See the module. Nested (in this process, or in a process adopted by
    another's), the processes started inside also end with every outer
    context's opener. On the way out, the processes registered under it that
    are still there after `REAP_S` seconds are SIGKILLed, and its folder removed.
    """
    outer = _peer()
    me = [os.getpid(), start_time(os.getpid())]
    _sweep()
    folder = tempfile.mkdtemp(prefix=_PREFIX)
    with open(os.path.join(folder, "opener"), "w") as f:
        json.dump(me, f)
    watch = ([] if outer is None else outer["watch"]) + [me]
    os.environ[PEER_ENV] = json.dumps({"watch": watch, "folder": folder})
    try:
        with loopback_thespian():
            yield
    finally:
        try:
            deadline = time.monotonic() + REAP_S
            while (left := [p for p in peer_pids() if p != os.getpid()]) and (
                    time.monotonic() < deadline):
                time.sleep(0.05)
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            if outer is None:
                del os.environ[PEER_ENV]
            else:
                os.environ[PEER_ENV] = json.dumps(outer)


@contextlib.contextmanager
def thespian_peer(base: str, capabilities: dict[str, Any] | None = None, start_s: float = 60.0,
                  **kwargs: Any) -> Iterator[Any]:
    """A stock Thespian actor system for a peer row: on 127.0.0.1, gone with this process.

    Args:
        base: Thespian's system base (``"multiprocTCPBase"``, ...).
        capabilities: its capabilities (``{"Admin Port": ...}``).
        start_s: seconds to wait for a new admin to answer. Thespian waits 5 s for
            its admin and the admin's logger to be up, and each of them imports the
            starter's main script (the ``spawn`` start method does): on a loaded
            machine that takes longer. The admin it gave up on is ours, on its
            port, and the next try joins it once it is up.
        **kwargs: more of ``ActorSystem``'s arguments (``logDefs``, ``transientUnique``).

    Yields:
        thespian.actors.ActorSystem: the system; shut down on the way out, whatever
        happens (a start that failed included: its processes are ended).

    Raises:
        thespian.actors.InvalidActorAddress: no admin answered within ``start_s``.
    """
    from thespian.actors import ActorSystem, InvalidActorAddress

    deadline = time.monotonic() + start_s
    with peer_processes():
        while True:
            try:
                system = ActorSystem(base, capabilities, **kwargs)
                break
            except InvalidActorAddress:
                if time.monotonic() >= deadline:
                    raise
        try:
            yield system
        finally:
            system.shutdown()


if sys.platform.startswith("linux"):  # /proc: the watchdog's way of seeing a process
    os.register_at_fork(after_in_child=_after_fork)
    _adopt()  # a process spawned under a context (it imports its parent's main script)
