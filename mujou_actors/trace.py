"""Trace files: a run's timeline in the Chrome trace event format.

``mujou.run(net, trace="run.json")`` records every hook while the run goes
on and writes the file when it ends; open it in Perfetto
(https://ui.perfetto.dev) or ``chrome://tracing``. The file shows:

* one track per thread: each worker (``mujou-worker-N``), each dedicated
  thread (``mujou-node-PATH``) and the run's coordinator (``mujou-run``),
  which runs the ``on_stop`` hooks at the end;
* a slice per hook, named ``PATH.HOOK`` (``<root>.on_update`` for the root
  node), with the run time ``t_ns``, the delta cycle and ``dt`` of each
  ``on_update`` in its arguments;
* an arrow from each send to the update that read the message;
* the counters ``dispatcher``: entries in the ready heap and hooks in
  flight, sampled as each hook starts;
* a marker where a hook raised.

Recording packs each hook (with the queue depths sampled as it started),
each send to one Input and each message read into a ``bytes`` record
appended to a bounded ``collections.deque``; the JSON is formatted only once
the run has ended. A run without a trace checks one attribute per hook and
per send.

A placed run (``mujou.run(factory, placement=..., trace=...)``) records in
every process that runs nodes, each into a buffer of its own; the host
writes one file with a process per group (`format_processes`), and arrows
for the messages between processes (distributed/tracing.py).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import struct
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ._checks import is_int
from ._runtime.keys import unstamp
from .errors import describe

if TYPE_CHECKING:
    from ._runtime.actor import Actor
    from .deadlines import DeadlineMiss
    from .ports import Input, Output, Port

# Only the names users import (docs/reference.md); the package's own helpers stay importable.
__all__ = ["Tracer"]

DEFAULT_CAPACITY = 1_000_000

PID = 1  # one process per file

# Kinds of record. A record unpacks to (kind, perf_counter_ns, thread number, ...);
# sorted by (time, kind), a hook's slice comes before the flow ends bound to its start.
# OUT and IN are a kernel's (a placed run's group): a send to an Input of another
# process, and a delivery from one (an IN is no event: it names its delivery's flow).
# MISS: an update that missed its node's budget or deadline (kept as a tuple, as FAIL).
SLICE, SEND, RECV, FAIL, OUT, IN, MISS = range(7)

_FORMATS = {
    # t0, thread, node (actor order), hook, took, dt (NaN: none), t_ns (-1: none), delta,
    # entries in the ready heap and hooks in flight as the hook started
    SLICE: "<BqHiBqdqqii",
    # ts, thread, sender's order, sender's send count, Input's id, Output's id
    SEND: "<BqHiqQQ",
    # t0 (+ 1 ns) of the reading hook, thread, sender's order, sender's send count, Input's id
    RECV: "<BqHiqQ",
    # ts, thread, sender's order, sender's send count, the outside Input's id, Output's id,
    # the sending hook's t_ns and delta cycle
    OUT: "<BqHiqQQqI",
    # ts, 0, the sender's order in the delivery's stamp (HOST_ORDER for a real-time
    # delivery, made as a host write), the delivery's number, Input's id, and the send's
    # sender order, t_ns and delta cycle (in its own process)
    IN: "<BqHiqQiqI",
}
_SLICE = struct.Struct(_FORMATS[SLICE]).pack
_SEND = struct.Struct(_FORMATS[SEND]).pack
_RECV = struct.Struct(_FORMATS[RECV]).pack
_OUT = struct.Struct(_FORMATS[OUT]).pack
_IN = struct.Struct(_FORMATS[IN]).pack
_UNPACK = {kind: struct.Struct(fmt).unpack for kind, fmt in _FORMATS.items()}
_SIZES = {kind: struct.Struct(fmt).size for kind, fmt in _FORMATS.items()}
_NAN = math.nan
_by_time = itemgetter(1, 0)


class Tracer:
    """Records a run's timeline into a Chrome trace event file.

    Pass it as ``mujou.run(net, trace=mujou.Tracer("run.json", capacity=N))``;
    a plain path (``trace="run.json"``) uses the default capacity. While the
    run goes on, events go into a ring buffer that keeps the newest ones;
    when the run ends (whatever ends it, a failure included) the file is
    written, before `Run.join` returns. Open it in Perfetto or
    ``chrome://tracing``.

    The file (the JSON object form of the Trace Event Format) holds one
    track per worker and per dedicated thread, a slice per hook named
    ``PATH.HOOK`` (``<root>`` for the root node) with ``t_ns``, ``delta``
    and ``dt`` of each update, an arrow from each send to the update that
    read the message, the counters ``dispatcher`` (``ready``: entries in
    the ready heap, ``in_flight``: hooks running, sampled as each hook
    starts) and a marker where a hook raised. Timestamps are microseconds
    of the wall clock (``time.perf_counter_ns``) since the run started,
    under the simulated timer too.

    One object may serve several runs, one after the other or at once:
    each run records into a buffer of its own and writes the file when it
    ends.

    A placed run (``placement=``) writes one file too, with a process per
    group (named ``group NAME``, with its pid; ``host`` for the host's
    group), each with its workers' tracks, and arrows from a send in one
    process to the hook that read it in another. Every process that runs
    nodes records ``capacity`` divided by their number, its newest kept.

    Args:
        path (str | os.PathLike): the JSON file to write (replaced
            atomically; missing parent folders are created). ``mujou.run``
            checks that it can be written before the run starts.
        capacity (int, optional): the most events the file holds: the newest
            are kept (a hook's slice and its counter sample are two events;
            the metadata naming the process and threads comes on top). The
            buffer keeps ``capacity`` records of about 100 bytes each (about
            100 MB at the default). Default: 1_000_000.

    Raises:
        TypeError: ``path`` is not a str or os.PathLike, or ``capacity`` is
            not an int.
        ValueError: ``path`` is empty, or ``capacity`` < 1.

    Example:
        ```python
        tracer = mujou.Tracer("run.json", capacity=100_000)
        mujou.run(net, timer="simulated", duration=1.0, trace=tracer).join()
        # run.json is complete here
        ```
    """

    def __init__(self, path: str | os.PathLike[str], capacity: int = DEFAULT_CAPACITY) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"Tracer: path must be a str or os.PathLike, got {path!r}")
        if os.fspath(path) == "":
            raise ValueError("Tracer: path must not be empty")
        if not is_int(capacity):
            raise TypeError(f"Tracer: capacity must be an int, got {capacity!r}")
        if capacity < 1:
            raise ValueError(f"Tracer: capacity must be >= 1, got {capacity}")
        self._path = Path(os.fspath(path))
        self._capacity = capacity

    @property
    def path(self) -> Path:
        """pathlib.Path: the file written when a run ends."""
        return self._path

    @property
    def capacity(self) -> int:
        """int: the most events the file holds."""
        return self._capacity

    def __repr__(self) -> str:
        return f"Tracer({str(self._path)!r}, capacity={self._capacity})"

    def _recorder(self, paths: list[str], ports: dict[str, Port]) -> Recorder:
        """A fresh, empty recorder for one run (runs never share one).

        Args:
            paths: the path of every node, in the actors' order.
            ports: every port of the run, by dotted path.
        """
        return Recorder(self._capacity, paths, ports)

    def _write(self, recorder: Recorder, threads: list[str], other: dict[str, Any]) -> None:
        """Write what ``recorder`` kept to the file, atomically.

        Args:
            threads: the run's worker and dedicated thread names, in order:
                each gets a track, even one without events.
            other: extra facts for ``otherData`` (JSON values).
        """
        records = recorder.records()
        count = [0, 0]  # events, metadata events
        lines = format_events(records, recorder, threads, self._capacity, count)
        self._write_events(lines, count, other, full=len(records) >= self._capacity,
                           clock="time.perf_counter_ns, microseconds since the run started",
                           start_unix=recorder.start_unix, tag=f"{id(recorder):x}")

    def _write_processes(self, processes: list[ProcessTrace], budget: int,
                         other: dict[str, Any]) -> None:
        """Write a placed run's file, atomically: a process per group (`format_processes`).

        Args:
            processes: every process of the run with the parts it recorded.
            budget: the most events of one process (its share of the capacity).
            other: extra facts for ``otherData`` (JSON values).

        Raises:
            OSError: the file could not be written.
        """
        count = [0, 0]
        lines, dropped = format_processes(processes, budget, count)
        starts = [part["start_unix"] for p in processes for part in p.parts]
        self._write_events(lines, count, other, full=dropped,
                           clock="time.perf_counter_ns of each process (CLOCK_MONOTONIC, "
                                 "which the processes of one machine share; another "
                                 "machine's shifted onto the host's by the offset its "
                                 "label gives), microseconds since the run started",
                           start_unix=min(starts, default=time.time()),
                           tag=f"placed-{id(processes):x}")

    def _write_events(self, lines: Iterable[str], count: list[int], other: dict[str, Any], *,
                      full: bool, clock: str, start_unix: float, tag: str) -> None:
        """Write the file from its events' JSON lines, atomically (a temporary file, renamed).

        Args:
            lines: the events (metadata included), formatted; consumed here.
            count: ``count[0]`` is the number of events once ``lines`` is
                consumed (`format_events` and `format_processes` count them).
            other: facts for ``otherData`` (JSON values); the capacity, the
                number of events, whether older ones were dropped, the clock
                and the start's Unix time are added.
            full: a buffer was full (older events were dropped).
            clock: what the timestamps are, for ``otherData``.
            start_unix: the Unix time the run started at.
            tag: makes the temporary file's name unique among runs that share the Tracer.

        Raises:
            OSError: the file could not be written (no temporary file is left).
        """
        path = self._path
        path.parent.mkdir(parents=True, exist_ok=True)
        # A name of its own: two runs may share a Tracer, and so the file's path.
        tmp = path.with_name(f".{path.name}.{os.getpid()}-{tag}.tmp")
        try:
            with open(tmp, "x", encoding="utf-8") as f:
                f.write('{"traceEvents":[\n')
                sep = ""
                chunk: list[str] = []
                for line in lines:
                    chunk.append(line)
                    if len(chunk) >= 10_000:
                        f.write(sep + ",\n".join(chunk))
                        sep = ",\n"
                        chunk = []
                if chunk:
                    f.write(sep + ",\n".join(chunk))
                other = {**other, "capacity": self._capacity, "events": count[0],
                         "oldest_dropped": full or count[0] >= self._capacity,
                         "clock": clock, "start_time_unix": start_unix}
                f.write('\n],\n"displayTimeUnit":"ms",\n"otherData":')
                f.write(json.dumps(other))
                f.write("}\n")
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def as_tracer(trace: Any) -> Tracer | None:
    """The `Tracer` for ``mujou.run(trace=...)``: None, a path, or a Tracer.

    The file is written only when the run ends, so whether it can be written
    is checked here, before anything starts (see `check_writable`): a long run
    must not find out at its end that its trace is lost.

    Args:
        trace (None | str | os.PathLike | Tracer): ``mujou.run``'s argument.

    Returns:
        Tracer | None: the tracer to record with; None for no trace.

    Raises:
        TypeError: any other type (names the argument).
        ValueError: an empty path.
        OSError: the trace file could not be written (see `check_writable`).
    """
    if trace is None:
        return None
    if isinstance(trace, (str, os.PathLike)):
        if os.fspath(trace) == "":
            raise ValueError("mujou.run: trace must not be an empty path")
        trace = Tracer(trace)
    if not isinstance(trace, Tracer):
        raise TypeError("mujou.run: trace must be None, a path (str or os.PathLike) or a "
                        f"mujou.Tracer, got {type(trace).__name__}")
    check_writable(trace.path, "mujou.run: trace file", make_folders=True)
    return trace


def check_writable(path: str | os.PathLike[str], what: str, *, make_folders: bool,
                   folder: bool = False) -> None:
    """Raise now, naming ``path``, if the file could not be written there later.

    For files written atomically at the end of a run (a temporary file in the
    same folder, then renamed): ``path`` must not be a folder, and its folder
    must take a new file. That is tried, not read from permission bits (which
    say yes to root, and nothing of a read-only mount): a probe file is made
    and removed at once. With ``make_folders`` the folders missing on the way
    are left to be made when the file is written; the nearest one that exists
    is probed instead.

    Args:
        path (str | os.PathLike): the file that will be written.
        what (str): what names the file in the message, such as
            ``"mujou.run: trace file"`` or ``"--stats-json"``.
        make_folders (bool): missing folders will be made when the file is
            written (else a missing folder is an error).
        folder (bool): ``path`` is itself a folder that files will be
            written into (created if missing, with ``make_folders``).

    Raises:
        IsADirectoryError: ``path`` is a folder (and ``folder`` is False).
        NotADirectoryError: ``path`` (with ``folder``) or a folder on its way
            is a file.
        FileNotFoundError: its folder does not exist and ``make_folders`` is
            False.
        PermissionError: the folder does not take a new file (or another
            ``OSError`` its probe raised, with the reason).
    """
    target = Path(os.fspath(path))
    shown = repr(str(target))
    if target.is_dir() and not folder:
        raise IsADirectoryError(f"{what} {shown} is a folder, not a file")
    if target.exists() and not target.is_dir() and folder:
        raise NotADirectoryError(f"{what} {shown} is a file, not a folder")
    where = target if folder else target.parent
    while not where.exists():
        if not make_folders:
            raise FileNotFoundError(f"{what} {shown} cannot be written: its folder "
                                    f"{str(where)!r} does not exist")
        where = where.parent  # ends at the file system's root or at ".", which exist
    if not where.is_dir():
        raise NotADirectoryError(f"{what} {shown} cannot be written: {str(where)!r} is a "
                                 "file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".probe", dir=where)
    except OSError as exc:
        kind = type(exc) if type(exc) is not OSError else PermissionError
        raise kind(f"{what} {shown} cannot be written: the folder {str(where)!r} does not "
                   f"take a new file ({exc.strerror or exc})") from exc
    os.close(fd)
    os.unlink(probe)


class Recorder:
    """The records of one run, newest ``capacity`` kept (not a public class).

    Workers, dedicated threads and the coordinator append concurrently;
    ``deque.append`` is atomic, so no lock is taken. Each record is packed
    into a ``bytes`` object (a thread, node, hook or port by a number): bytes
    are invisible to the garbage collector, whereas a buffer of tuples would
    make it run every few hundred hooks.
    """

    __slots__ = ("events", "paths", "ports", "threads", "hooks", "start_ns", "start_unix",
                 "outside", "_append", "_lock")

    def __init__(self, capacity: int, paths: list[str], ports: dict[str, Port]) -> None:
        self.events: deque[Any] = deque(maxlen=capacity)
        self._append = self.events.append
        self.paths = paths
        self.ports = {id(port): path for path, port in ports.items()}  # alive all run long
        self.threads: dict[str, int] = {}  # thread name -> number
        self.hooks: dict[str, int] = {"on_start": 0, "on_update": 1, "on_stop": 2}
        self._lock = threading.Lock()
        self.start_ns = time.perf_counter_ns()
        self.start_unix = time.time()
        # A kernel's Outputs read outside it (a placed run's other processes): the id
        # of each such Output -> the ids of those Inputs (`add_outside`).
        self.outside: dict[int, list[int]] = {}

    def _code(self, table: dict[str, int], name: str) -> int:
        with self._lock:  # a name seen for the first time
            return table.setdefault(name, len(table))

    def hook(self, actor: Actor, hook: str, t0: int, took: int, args: tuple[Any, ...]) -> None:
        """A hook of ``actor`` ran from ``t0`` for ``took`` ns; close the flows it read.

        ``actor.depths`` holds the queue depths the dispatcher saw as it
        started the hook.
        """
        append = self._append
        name = actor.thread_name
        assert name is not None  # the dispatcher names the thread before it runs a hook
        thread = self.threads.get(name)
        if thread is None:
            thread = self._code(self.threads, name)
        code = self.hooks.get(hook)
        if code is None:
            code = self._code(self.hooks, hook)
        applied = actor.applied
        if applied is not None:
            actor.applied = None
            # 1 ns into the slice: a viewer binds the arrow to the slice enclosing
            # its end, whichever of the two it reads first.
            at = t0 + 1 if took > 1 else t0
            inputs = actor.inputs
            for delivery in applied:  # mailbox.Delivery fields; the flow is named by the Input
                sender = unstamp(delivery[0])[2]
                append(_RECV(RECV, at, thread, sender, delivery[3], id(inputs[delivery[1]])))
        t_ns = actor.last_update_ns
        ready, inflight = actor.depths
        # The slice last: a flow end that is kept has its slice kept too.
        append(_SLICE(SLICE, t0, thread, actor.order, code, took, args[0] if args else _NAN,
                      -1 if t_ns is None else t_ns, actor.stamp[1], ready, inflight))

    def send(self, sender: Actor, output: Output, seq: int,
             routes: Iterable[tuple[Input, Actor, bool]]) -> None:
        """``sender`` sent its message ``seq`` on ``output``: a flow start per reader."""
        ts = time.perf_counter_ns()
        append = self._append
        name = sender.thread_name
        assert name is not None  # the dispatcher names the thread before it runs a hook
        thread = self.threads.get(name)
        if thread is None:
            thread = self._code(self.threads, name)
        order = sender.order
        out = id(output)
        for port, _, _ in routes:
            append(_SEND(SEND, ts, thread, order, seq, id(port), out))
        far = self.outside.get(out)
        if far is not None:  # a kernel's send to other processes: each end is named there
            t_ns, delta = sender.stamp
            for reader in far:
                append(_OUT(OUT, ts, thread, order, seq, reader, out, t_ns, delta))

    def add_outside(self, output: Output, readers: Iterable[Input]) -> None:
        """``output`` (of a kernel's node) is read by ``readers``, Inputs outside the kernel.

        Each later send on it then records a flow start per such reader,
        named by the send's ``(t_ns, delta, sender)`` and the reader: the
        process that delivers it records the other end (`arrival`), and the
        placed run's host pairs them (distributed/tracing.py).
        """
        self.outside[id(output)] = [id(r) for r in readers]

    def arrival(self, stamped_by: int, seq: int, port: Input, sender: int, t_ns: int,
                delta: int) -> None:
        """A kernel delivered a message sent in another process to ``port``.

        Args:
            stamped_by (int): the sender order in the delivery's stamp (the
                sender's, or HOST_ORDER for a delivery made as a host write).
            seq (int): the delivery's number (its ``seq``, which the reading
                hook's flow end carries).
            port (Input): the Input delivered to.
            sender (int), t_ns (int), delta (int): the send's sender order and
                key, in the process that sent it.
        """
        self._append(_IN(IN, time.perf_counter_ns(), 0, stamped_by, seq, id(port), sender,
                         t_ns, delta))

    def failure(self, actor: Actor, hook: str, exc: BaseException) -> None:
        """A hook of ``actor`` raised ``exc`` (rare: kept as a tuple)."""
        thread = self._code(self.threads, actor.thread_name or "?")
        name, _, text = describe(exc).partition(": ")  # never raises, whatever exc does
        self._append((FAIL, time.perf_counter_ns(), thread, actor.order, hook, name, text))

    def miss(self, actor: Actor, miss: DeadlineMiss, what: str | None = None) -> None:
        """An update of ``actor`` missed its budget or deadline (rare: kept as a tuple).

        Recorded as its hook returns, or in real time as the run's deadline
        monitor catches it still running (``miss.running``), inside the
        hook's slice either way (on the hook's thread's track): an instant
        event named by what was missed, the figures (seconds) as its args
        (``running: true`` added for a catch).

        Args:
            actor (Actor): the node's actor.
            miss (DeadlineMiss): the miss.
            what (str | None): what was missed, as the event names it
                (``"budget"``, ``"deadline"``, ``"budget and deadline"``).
                None: what ``miss`` says was missed. Default: None.
        """
        thread = self._code(self.threads, actor.thread_name or "?")
        if what is None:
            what = " and ".join(name for name, hit in (("budget", miss.budget_missed),
                                                       ("deadline", miss.deadline_missed))
                                if hit)
        figures: dict[str, Any] = {"due": miss.due, "run_time": miss.run_time,
                                   "finished": miss.finished, "budget": miss.budget,
                                   "deadline": miss.deadline}
        if miss.running:
            figures["running"] = True
        self._append((MISS, time.perf_counter_ns(), thread, actor.order, "on_update", what,
                      json.dumps(figures)))

    def names(self, table: dict[str, int]) -> list[str]:
        """The names of ``threads`` or ``hooks``, by number."""
        with self._lock:
            return sorted(table, key=table.__getitem__)

    def _raw(self) -> list[Any]:
        """A copy of the kept records as they are (a hook stuck past the end may append)."""
        while True:
            try:
                return list(self.events)
            except RuntimeError:  # mutated during the copy: try again
                continue

    def records(self) -> list[tuple[Any, ...]]:
        """The kept records, unpacked (a hook stuck past the end may still append)."""
        unpack = _UNPACK
        return [unpack[r[0]](r) if type(r) is bytes else r for r in self._raw()]

    def export(self, tracks: list[str]) -> dict[str, Any]:
        """The kept records and their names as plain data (a placed run's group sends it).

        Only bytes, ints, floats, strings, lists and dicts: it crosses the
        control plane's pickling. `unpack_records` reads ``records`` back.

        Args:
            tracks: the thread names that get a track even without events.

        Returns:
            dict: ``records`` (the packed records, one bytes object), ``fails``
            (the failure and miss records), ``threads`` and ``hooks`` (names by
            number), ``paths`` (node paths by order), ``ports`` (port paths by
            id), ``tracks``, ``start_ns``, ``start_unix``, ``full`` (the
            buffer dropped older records) and ``pid``.
        """
        raw = self._raw()
        return {"records": b"".join(r for r in raw if type(r) is bytes),
                "fails": [list(r) for r in raw if type(r) is not bytes],
                "threads": self.names(self.threads), "hooks": self.names(self.hooks),
                "paths": list(self.paths), "ports": dict(self.ports), "tracks": list(tracks),
                "start_ns": self.start_ns, "start_unix": self.start_unix,
                "full": len(raw) >= (self.events.maxlen or 0), "pid": os.getpid()}


def unpack_records(packed: bytes) -> list[tuple[Any, ...]]:
    """The records of `Recorder.export`'s ``records``, unpacked (as `Recorder.records`)."""
    out = []
    sizes, unpack = _SIZES, _UNPACK
    at, end = 0, len(packed)
    while at < end:
        kind = packed[at]
        size = sizes[kind]
        out.append(unpack[kind](packed[at:at + size]))
        at += size
    return out


# ---------------------------------------------------------------------------
# JSON


def _us(ns: int) -> str:
    """Nanoseconds as microseconds, exactly (``1234567`` -> ``"1234.567"``)."""
    if ns < 0:
        return "-" + _us(-ns)
    q, r = divmod(ns, 1000)
    return f"{q}.{r:03d}"


def _newest(records: list[tuple[Any, ...]], budget: int) -> list[tuple[Any, ...]]:
    """The newest records that make at most ``budget`` events, none left without its slice.

    ``records`` are sorted by time. A slice makes two events (with its
    counter sample). A send or read earlier than the first kept slice of its
    thread lost its slice: it is dropped too. (An IN record makes no event of
    its own; it is counted as one all the same, which only keeps fewer.)
    """
    total = sum(2 if r[0] == SLICE else 1 for r in records)
    start = 0
    while total > budget:
        total -= 2 if records[start][0] == SLICE else 1
        start += 1
    kept = records[start:]
    first: dict[int, int] = {}
    for r in kept:
        if r[0] == SLICE and r[2] not in first:
            first[r[2]] = r[1]
    return [r for r in kept
            if not ((r[0] == SEND or r[0] == RECV or r[0] == OUT)
                    and r[1] < first.get(r[2], math.inf))]


def _flows(records: list[tuple[Any, ...]], ports: Mapping[Any, str],
           ids: Iterator[int]) -> dict[tuple[Any, ...], tuple[int, str]]:
    """Flow id and name (the Output's path) for every delivery whose send and read are kept.

    Keyed by ``(sender, seq, Input)``, as the SEND and RECV records name a
    delivery; ids are taken from ``ids``.
    """
    read = {(r[3], r[4], r[5]) for r in records if r[0] == RECV}
    flows: dict[tuple[Any, ...], tuple[int, str]] = {}
    for r in records:
        if r[0] == SEND:
            key = (r[3], r[4], r[5])
            if key in read:
                flows[key] = (next(ids), json.dumps(ports[r[6]]))
    return flows


def _node(paths: Sequence[str], order: int) -> str:
    return paths[order] or "<root>"


class Names(NamedTuple):
    """What the numbers in one process's records stand for (see `process_events`).

    Attributes:
        threads (Sequence[str]): thread names, by the records' thread number.
        hooks (Sequence[str]): hook names, by the slices' hook number.
        paths (Sequence[str]): node paths, by order in the net.
        ports (Mapping): port paths, by the records' port field.
    """

    threads: Sequence[str]
    hooks: Sequence[str]
    paths: Sequence[str]
    ports: Mapping[Any, str]


def format_events(records: list[tuple[Any, ...]], recorder: Recorder, threads: list[str],
                  budget: int, count: list[int] | None = None) -> Iterator[str]:
    """The trace events of ``records`` as JSON strings: metadata, then by time.

    Args:
        records: what ``recorder`` kept, unpacked (sorted here, in place).
        recorder: names the threads, nodes, hooks and ports of the records.
        threads: the run's threads, each given a track even without events.
        budget: the most events (metadata aside); the newest are kept.
        count: when given, the number of events is added to ``count[0]`` and
            that of metadata events to ``count[1]``.
    """
    records.sort(key=_by_time)
    records = _newest(records, budget)
    names = Names(recorder.names(recorder.threads), recorder.names(recorder.hooks),
                  recorder.paths, recorder.ports)
    flows = _flows(records, recorder.ports, itertools.count(1))
    yield from process_events(records, names, threads, flows, pid=PID, process="mujou",
                              start_ns=recorder.start_ns, count=count)


def process_events(records: list[tuple[Any, ...]], names: Names, threads: Iterable[str],
                   flows: Mapping[tuple[Any, ...], tuple[int, str]], *, pid: int, process: str,
                   start_ns: int, count: list[int] | None = None,
                   meta: Iterable[tuple[str, dict[str, Any]]] = ()) -> Iterator[str]:
    """The events of one process of the file as JSON strings: its metadata, then by time.

    Args:
        records: the records to show, sorted by time, trimmed to the budget.
        names: what their numbers stand for.
        threads: thread names that get a track even without events, in order.
        flows: ``(sender, seq, Input)`` -> ``(flow id, JSON name)`` of the
            arrows whose both ends are shown (`_flows`, and a placed run's
            arrows across processes); a send or read without one is left out.
        pid (int): the process's ``pid`` in the file.
        process (str): its name.
        start_ns (int): ``perf_counter_ns`` at the file's time 0.
        count: when given, the number of events is added to ``count[0]`` and
            that of metadata events to ``count[1]``.
        meta: further process metadata events, ``(name, args)``.
    """
    thread_names = names.threads
    order = list(threads)
    for r in records:
        if r[0] != IN and thread_names[r[2]] not in order:
            order.append(thread_names[r[2]])
    tid_of = {name: tid for tid, name in enumerate(order, 1)}
    tids = {code: tid_of.get(name, 0) for code, name in enumerate(thread_names)}
    hooks, paths, ports = names.hooks, names.paths, names.ports
    events = 0
    n_meta = 1

    yield (f'{{"ph":"M","pid":{pid},"tid":0,"ts":0,"name":"process_name",'
           f'"args":{{"name":{json.dumps(process)}}}}}')
    for name, args in meta:
        yield f'{{"ph":"M","pid":{pid},"tid":0,"ts":0,"name":"{name}","args":{json.dumps(args)}}}'
        n_meta += 1
    for tid, name in enumerate(order, 1):
        quoted = json.dumps(name)
        yield (f'{{"ph":"M","pid":{pid},"tid":{tid},"ts":0,"name":"thread_name",'
               f'"args":{{"name":{quoted}}}}}')
        yield (f'{{"ph":"M","pid":{pid},"tid":{tid},"ts":0,"name":"thread_sort_index",'
               f'"args":{{"sort_index":{tid}}}}}')
    slice_names: dict[tuple[int, int], str] = {}
    for rec in records:
        kind = rec[0]
        if kind == IN:  # no event: it names the flow of the read that follows
            continue
        head = f'"pid":{pid},"tid":{tids[rec[2]]},"ts":{_us(rec[1] - start_ns)}'
        if kind == SLICE:
            _, _, _, node, hook, took, dt, t_ns, delta, ready, inflight = rec
            key = (node, hook)
            cached = slice_names.get(key)
            if cached is None:
                cached = slice_names[key] = json.dumps(f"{_node(paths, node)}.{hooks[hook]}")
            name = cached
            if math.isnan(dt):
                extra = "{}"
            else:
                extra = f'{{"t_ns":{t_ns},"delta":{delta},"dt":{dt!r}}}'
            yield (f'{{"ph":"X",{head},"dur":{_us(took)},"name":{name},"cat":"hook",'
                   f'"args":{extra}}}')
            yield (f'{{"ph":"C",{head},"name":"dispatcher",'
                   f'"args":{{"ready":{ready},"in_flight":{inflight}}}}}')
            events += 2
        elif kind == SEND or kind == RECV or kind == OUT:
            flow = flows.get((rec[3], rec[4], rec[5]))
            if flow is None:  # its other end is not kept (or a write from the host)
                continue
            fid, name = flow
            if kind != RECV:
                to = json.dumps(ports[rec[5]])
                yield (f'{{"ph":"s",{head},"id":{fid},"name":{name},"cat":"message",'
                       f'"args":{{"to":{to}}}}}')
            else:
                yield f'{{"ph":"f","bp":"e",{head},"id":{fid},"name":{name},"cat":"message"}}'
            events += 1
        elif kind == MISS:
            _, _, _, node, hook, what, figures = rec
            name = json.dumps(f"{_node(paths, node)}.{hook} missed its {what}")
            yield f'{{"ph":"i","s":"t",{head},"name":{name},"cat":"deadline","args":{figures}}}'
            events += 1
        else:  # FAIL
            _, _, _, node, hook, exc_type, message = rec
            name = json.dumps(f"{_node(paths, node)}.{hook} raised {exc_type}")
            yield (f'{{"ph":"i","s":"t",{head},"name":{name},"cat":"failure",'
                   f'"args":{{"error":{json.dumps(message)}}}}}')
            events += 1
    if count is not None:
        count[0] += events
        count[1] += n_meta + 2 * len(order)


# ---------------------------------------------------------------------------
# A placed run's file: one process per group, arrows across processes


class ProcessTrace(NamedTuple):
    """One process of a placed run, as its trace file shows it.

    Attributes:
        name (str): the process's name in the file (``"group physics"``, ``"host"``).
        pid (int): its pid (the file gives another, unused one to a second
            process of the same pid: groups served in one process, as in tests).
        parts (list[dict]): `Recorder.export` of each kernel it ran, oldest
            first (a group rebuilt for a restart runs a new kernel).
        machine (str): the machine it ran on, for its label (``""``: the
            file's own, the host's).
        offset_ns (int | None): on another machine, its monotonic clock minus
            the host's, ns (the heartbeat's estimate): subtracted from each of
            its stamps, so its timeline lines up with the host's. None: not
            known (no heartbeat answer yet), or 0 on the host's machine.
        uncertainty_ns (int | None): the bound on that estimate, ns: each of
            its events is within ± this of where the file shows it.
    """

    name: str
    pid: int
    parts: list[dict[str, Any]]
    machine: str = ""
    offset_ns: int | None = None
    uncertainty_ns: int | None = None


class _Decoded(NamedTuple):
    """A process's records, numbered for `process_events` (see `_decode`)."""

    records: list[tuple[Any, ...]]
    names: Names
    tracks: list[str]
    start_ns: int
    full: bool


def _decode(parts: list[dict[str, Any]], port_code: dict[str, int],
            offset_ns: int = 0) -> _Decoded:
    """One process's parts as one list of records, in numbers shared by all its parts.

    Threads and hooks get the process's numbers; ports the file's
    (``port_code``: path -> number, extended here); a send's or delivery's
    ``seq`` becomes ``(part, seq)``, since each kernel counts from 0. Every
    stamp has ``offset_ns`` taken off (another machine's clock put on the
    host's).
    """
    threads: dict[str, int] = {}
    hooks: dict[str, int] = {}
    records: list[tuple[Any, ...]] = []
    tracks: list[str] = []
    for epoch, part in enumerate(parts):
        tmap = [threads.setdefault(n, len(threads)) for n in part["threads"]]
        hmap = [hooks.setdefault(n, len(hooks)) for n in part["hooks"]]
        pmap = {key: port_code.setdefault(path, len(port_code))
                for key, path in part["ports"].items()}
        tracks += [t for t in part["tracks"] if t not in tracks]
        add = records.append
        for r in unpack_records(part["records"]):
            kind = r[0]
            ts = r[1] - offset_ns
            if kind == SLICE:
                add((kind, ts, tmap[r[2]], r[3], hmap[r[4]], *r[5:]))
            elif kind == SEND:
                add((kind, ts, tmap[r[2]], r[3], (epoch, r[4]), pmap[r[5]], pmap[r[6]]))
            elif kind == RECV:
                add((kind, ts, tmap[r[2]], r[3], (epoch, r[4]), pmap[r[5]]))
            elif kind == OUT:
                add((kind, ts, tmap[r[2]], r[3], (epoch, r[4]), pmap[r[5]], pmap[r[6]],
                     r[7], r[8]))
            else:  # IN
                add((kind, ts, -1, r[3], (epoch, r[4]), pmap[r[5]], r[6], r[7], r[8]))
        for f in part["fails"]:
            add((f[0], f[1] - offset_ns, tmap[f[2]], *f[3:]))  # FAIL or MISS
    names = Names(sorted(threads, key=threads.__getitem__), sorted(hooks, key=hooks.__getitem__),
                  parts[0]["paths"] if parts else [], {})
    return _Decoded(records, names, tracks,
                    min((p["start_ns"] - offset_ns for p in parts), default=0),
                    any(p["full"] for p in parts))


def _cross_flows(decoded: list[_Decoded], flows: list[dict[tuple[Any, ...], tuple[int, str]]],
                 ports: Mapping[int, str], ids: Iterator[int]) -> None:
    """Add the arrows of messages between processes to ``flows`` (one dict per process).

    Both ends name a message by what every process knows alike: the send's
    ``(sender, t_ns, delta)`` and the reading Input. The k-th such send of
    one name is the k-th delivery of it (one sender's sends of one hook go in
    order); counted from the newest, since a ring buffer keeps the newest of
    each. An arrow is drawn only when the delivery was read (its flow end
    kept): one that a QoS depth dropped, or that came too late to be read
    before the end, has none.
    """
    sends: dict[tuple[int, int, int, int], list[tuple[int, tuple[Any, ...], int]]] = {}
    reads: dict[tuple[int, int, int, int], list[tuple[int, tuple[Any, ...], bool]]] = {}
    for i, proc in enumerate(decoded):
        read = {(r[3], r[4], r[5]) for r in proc.records if r[0] == RECV}
        for r in proc.records:
            if r[0] == OUT:
                sends.setdefault((r[3], r[7], r[8], r[5]), []).append((i, r[3:6], r[6]))
            elif r[0] == IN:
                key = r[3:6]
                reads.setdefault((r[6], r[7], r[8], r[5]), []).append((i, key, key in read))
    for name, ends in reads.items():
        starts = sends.get(name)
        if not starts:
            continue
        for (si, skey, out), (ri, rkey, was_read) in zip(reversed(starts), reversed(ends),
                                                         strict=False):
            if was_read:
                flow = (next(ids), json.dumps(ports[out]))
                flows[si][skey] = flow
                flows[ri][rkey] = flow


def _unique_pids(pids: list[int]) -> list[int]:
    """``pids``, a repeated one replaced by an unused number above every real pid."""
    spare = max([*pids, 1 << 22]) + 1  # Linux pids stay below 2**22
    seen: set[int] = set()
    out = []
    for pid in pids:
        if pid in seen:
            pid, spare = spare, spare + 1
        seen.add(pid)
        out.append(pid)
    return out


def _label(p: ProcessTrace) -> str:
    """A process's label in the file: its pid, and its machine and clock's shift if any."""
    if not p.machine:
        return f"pid {p.pid}"
    if p.offset_ns is None:
        return f"pid {p.pid}, machine {p.machine}, clock offset unknown (not shifted)"
    unc = p.uncertainty_ns or 0
    return (f"pid {p.pid}, machine {p.machine}, clock shifted by {-p.offset_ns / 1e3:+.1f} "
            f"\u00b1 {unc / 1e3:.1f} us onto the host's")


def format_processes(processes: list[ProcessTrace], budget: int,
                     count: list[int]) -> tuple[Iterator[str], bool]:
    """The events of a placed run's file: one process per group, arrows across them.

    Each process keeps its newest records that make at most ``budget``
    events. Timestamps are microseconds since the earliest part started:
    every process read ``time.perf_counter_ns``, a clock that the processes
    of one machine share (CLOCK_MONOTONIC on Linux), so they line up; a
    process on another machine has its clock's offset from the host's
    (`ProcessTrace.offset_ns`) taken off each stamp, and its label says by
    how much and within what bound. Flow
    ids are unique in the file, and both ends of an arrow across processes
    carry the same id, category and name, which binds them in Perfetto and
    ``chrome://tracing`` whatever their pids.

    Args:
        processes: every process of the run, in the order the file lists them.
        budget: the most events of one process.
        count: ``[events, metadata events]``, added to as the lines are made.

    Returns:
        tuple: the JSON lines (made as they are consumed) and whether older
        events were dropped (a buffer full, or trimmed to ``budget``).
    """
    port_code: dict[str, int] = {}
    decoded = [_decode(p.parts, port_code, p.offset_ns or 0) for p in processes]
    ports = {code: path for path, code in port_code.items()}
    dropped = any(proc.full for proc in decoded)
    ids = itertools.count(1)
    kept = []
    flows = []
    for proc in decoded:
        proc.records.sort(key=_by_time)
        newest = _newest(proc.records, budget)
        dropped = dropped or len(newest) < len(proc.records)
        kept.append(newest)
        flows.append(_flows(newest, ports, ids))
    decoded = [proc._replace(records=r, names=proc.names._replace(ports=ports))
               for proc, r in zip(decoded, kept, strict=True)]
    _cross_flows(decoded, flows, ports, ids)
    start_ns = min((proc.start_ns for proc, p in zip(decoded, processes, strict=True) if p.parts),
                   default=0)
    pids = _unique_pids([p.pid for p in processes])

    def lines() -> Iterator[str]:
        for i, (p, proc) in enumerate(zip(processes, decoded, strict=True)):
            meta: list[tuple[str, dict[str, Any]]] = [
                ("process_sort_index", {"sort_index": i}),
                ("process_labels", {"labels": _label(p)})]
            yield from process_events(proc.records, proc.names, proc.tracks, flows[i], pid=pids[i],
                                      process=p.name, start_ns=start_ns, count=count,
                                      meta=meta)

    return lines(), dropped
