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
"""

from __future__ import annotations

import json
import math
import os
import struct
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._checks import is_int
from ._runtime.keys import unstamp
from .errors import describe

if TYPE_CHECKING:
    from ._runtime.actor import Actor
    from .ports import Input, Output, Port

# Only the names users import (docs/reference.md); the package's own helpers stay importable.
__all__ = ["Tracer"]

DEFAULT_CAPACITY = 1_000_000

PID = 1  # one process per file

# Kinds of record. A record unpacks to (kind, perf_counter_ns, thread number, ...);
# sorted by (time, kind), a hook's slice comes before the flow ends bound to its start.
SLICE, SEND, RECV, FAIL = range(4)

_FORMATS = {
    # t0, thread, node (actor order), hook, took, dt (NaN: none), t_ns (-1: none), delta,
    # entries in the ready heap and hooks in flight as the hook started
    SLICE: "<BqHiBqdqqii",
    # ts, thread, sender's order, sender's send count, Input's id, Output's id
    SEND: "<BqHiqQQ",
    # t0 (+ 1 ns) of the reading hook, thread, sender's order, sender's send count, Input's id
    RECV: "<BqHiqQ",
}
_SLICE = struct.Struct(_FORMATS[SLICE]).pack
_SEND = struct.Struct(_FORMATS[SEND]).pack
_RECV = struct.Struct(_FORMATS[RECV]).pack
_UNPACK = {kind: struct.Struct(fmt).unpack for kind, fmt in _FORMATS.items()}
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
        full = len(records) >= self._capacity
        path = self._path
        path.parent.mkdir(parents=True, exist_ok=True)
        # A name of its own: two runs may share a Tracer, and so the file's path.
        tmp = path.with_name(f".{path.name}.{os.getpid()}-{id(recorder):x}.tmp")
        count = [0, 0]  # events, metadata events
        try:
            with open(tmp, "x", encoding="utf-8") as f:
                f.write('{"traceEvents":[\n')
                sep = ""
                chunk: list[str] = []
                for line in format_events(records, recorder, threads, self._capacity, count):
                    chunk.append(line)
                    if len(chunk) >= 10_000:
                        f.write(sep + ",\n".join(chunk))
                        sep = ",\n"
                        chunk = []
                if chunk:
                    f.write(sep + ",\n".join(chunk))
                other = {**other, "capacity": self._capacity, "events": count[0],
                         "oldest_dropped": full or count[0] >= self._capacity,
                         "clock": "time.perf_counter_ns, microseconds since the run started",
                         "start_time_unix": recorder.start_unix}
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
                 "_append", "_lock")

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

    def failure(self, actor: Actor, hook: str, exc: BaseException) -> None:
        """A hook of ``actor`` raised ``exc`` (rare: kept as a tuple)."""
        thread = self._code(self.threads, actor.thread_name or "?")
        name, _, text = describe(exc).partition(": ")  # never raises, whatever exc does
        self._append((FAIL, time.perf_counter_ns(), thread, actor.order, hook, name, text))

    def names(self, table: dict[str, int]) -> list[str]:
        """The names of ``threads`` or ``hooks``, by number."""
        with self._lock:
            return sorted(table, key=table.__getitem__)

    def records(self) -> list[tuple[Any, ...]]:
        """The kept records, unpacked (a hook stuck past the end may still append)."""
        while True:
            try:
                raw = list(self.events)
                break
            except RuntimeError:  # mutated during the copy: try again
                continue
        unpack = _UNPACK
        return [unpack[r[0]](r) if type(r) is bytes else r for r in raw]


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
    thread lost its slice: it is dropped too.
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
            if not ((r[0] == SEND or r[0] == RECV) and r[1] < first.get(r[2], math.inf))]


def _flows(records: list[tuple[Any, ...]],
           ports: dict[int, str]) -> dict[tuple[Any, ...], tuple[int, str]]:
    """Flow id and name (the Output's path) for every delivery whose send and read are kept."""
    read = {(r[3], r[4], r[5]) for r in records if r[0] == RECV}
    flows: dict[tuple[Any, ...], tuple[int, str]] = {}
    for r in records:
        if r[0] == SEND:
            key = (r[3], r[4], r[5])
            if key in read:
                flows[key] = (len(flows) + 1, json.dumps(ports[r[6]]))
    return flows


def _node(paths: list[str], order: int) -> str:
    return paths[order] or "<root>"


def format_events(records: list[tuple[Any, ...]], recorder: Recorder, threads: list[str],
                  budget: int, count: list[int] | None = None) -> Iterator[str]:
    """The trace events of ``records`` as JSON strings: metadata, then by time.

    Args:
        records: what ``recorder`` kept, unpacked (sorted here, in place).
        recorder: names the threads, nodes, hooks and ports of the records.
        threads: the run's threads, each given a track even without events.
        budget: the most events (metadata aside); the newest are kept.
        count: when given, ``count[0]`` is set to the number of events and
            ``count[1]`` to that of metadata events.
    """
    records.sort(key=_by_time)
    records = _newest(records, budget)
    names = recorder.names(recorder.threads)
    order = list(threads)
    for r in records:
        if names[r[2]] not in order:
            order.append(names[r[2]])
    tid_of = {name: tid for tid, name in enumerate(order, 1)}
    tids = {code: tid_of.get(name, 0) for code, name in enumerate(names)}
    hooks = recorder.names(recorder.hooks)
    paths, ports = recorder.paths, recorder.ports
    flows = _flows(records, ports)
    start_ns = recorder.start_ns
    events = 0

    yield f'{{"ph":"M","pid":{PID},"tid":0,"ts":0,"name":"process_name","args":{{"name":"mujou"}}}}'
    for tid, name in enumerate(order, 1):
        quoted = json.dumps(name)
        yield (f'{{"ph":"M","pid":{PID},"tid":{tid},"ts":0,"name":"thread_name",'
               f'"args":{{"name":{quoted}}}}}')
        yield (f'{{"ph":"M","pid":{PID},"tid":{tid},"ts":0,"name":"thread_sort_index",'
               f'"args":{{"sort_index":{tid}}}}}')
    slice_names: dict[tuple[int, int], str] = {}
    for rec in records:
        kind = rec[0]
        head = f'"pid":{PID},"tid":{tids[rec[2]]},"ts":{_us(rec[1] - start_ns)}'
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
        elif kind == SEND or kind == RECV:
            flow = flows.get((rec[3], rec[4], rec[5]))
            if flow is None:  # its other end is not kept (or a write from the host)
                continue
            fid, name = flow
            if kind == SEND:
                to = json.dumps(ports[rec[5]])
                yield (f'{{"ph":"s",{head},"id":{fid},"name":{name},"cat":"message",'
                       f'"args":{{"to":{to}}}}}')
            else:
                yield f'{{"ph":"f","bp":"e",{head},"id":{fid},"name":{name},"cat":"message"}}'
            events += 1
        else:  # FAIL
            _, _, _, node, hook, exc_type, message = rec
            name = json.dumps(f"{_node(paths, node)}.{hook} raised {exc_type}")
            yield (f'{{"ph":"i","s":"t",{head},"name":{name},"cat":"failure",'
                   f'"args":{{"error":{json.dumps(message)}}}}}')
            events += 1
    if count is not None:
        count[0] = events
        count[1] = 1 + 2 * len(order)
