"""Recording a run to an MCAP file: the senders' hook, the bounded queue, the writer thread.

``mujou.run(net, record=Recording("run.mcap", ports=[...]))`` makes a `Recorder`
for the run. Each recorded Output gets a listener on its host view (the same
mechanism as ``Run.subscribe``): on the sending thread, after the readers got
the message, it only appends ``(channel, sequence, key, message)`` to one
bounded queue, the sender's key being the sending hook's ``(t_ns, delta)``.
The ``mujou-recorder`` thread takes the messages in batches, encodes them
(`mcapfile.encode_message`: the snapshot codec) and writes them
(`mcapfile.Writer`). Messages are never copied for the recording: a message
is read-only once sent, as its readers and subscribers see it.

The queue holds at most ``max_messages`` messages and ``max_bytes`` bytes
(tensor bytes, plus a fixed 64 per message; a container's tensors are
counted). When it is full, the *newest* message (the one being sent) is not
queued and is counted as dropped for its channel (``run.stats().recording``);
the sender never waits (``when_full="drop"``, the default in real time). In
simulated time the default is ``when_full="wait"``: the sender waits, in
slices, until the writer has made room. A simulated run has no deadline to
miss, and a recording that dropped messages cannot be replayed; waiting only
slows the run down to the writer's pace.

``Recording(log=True)`` also records the run's log records (`logview.LogTap`
on the root logger, from `start` to `close`) to the channel ``/mujou/log``:
each entry goes through the same queue, but a full queue drops it, whatever
``when_full`` says, so that logging never waits (it may happen anywhere, the
writer thread included). A placed run's driver hands the tap its group
processes' records too (`logview.forward`; distributed/grouplog.py).

Nothing of this exists on a run that does not record: no listener, no thread,
no queue.
"""

from __future__ import annotations

import dataclasses
import datetime
import fnmatch
import json
import logging
import os
import platform
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import msgpack
import torch

from .._checks import is_int, settings_repr
from ..devices import numerics
from ..errors import describe
from ..params import iter_params
from ..stats import RecordingChannelStats, RecordingStats
from . import mcapfile
from .foxlog import LOG_TOPIC
from .logview import LogTap
from .view import Projection

if TYPE_CHECKING:
    from .._runtime.actor import Actor
    from ..node import Node
    from ..ports import Port

# What users import (mujou.Recording); the rest is the run's.
__all__ = ["Recording"]

log = logging.getLogger("mujou_actors")

DEFAULT_MAX_MESSAGES = 65536
"""The most messages waiting for the writer (a `Recording`'s ``max_messages``)."""

DEFAULT_MAX_BYTES = 256 << 20
"""The most bytes of messages waiting for the writer (a `Recording`'s ``max_bytes``)."""

FLUSH_EVERY = 1.0
"""Wall seconds after which the writer closes a chunk that is not full (what a crash loses)."""

_WHEN_FULL = ("drop", "wait")
_BASE = 64  # bytes charged per queued message besides its tensors and text
_SMALL = frozenset((float, int, bool, type(None)))  # charged _BASE alone
_POLL = 0.005  # wall seconds the writer sleeps when the queue is empty
_WAIT_SLICE = 0.05  # wall seconds a waiting sender sleeps before it looks again
_BATCH = 1024  # messages the writer takes per turn
_LOG = -1  # the queue's channel number of a log entry (the Outputs' are 0, 1, ...)
# Written messages handed back to the senders to free (see Recorder._dead): at most this
# many, each of at most _RETURN_MAX bytes (what message_size charges): 4 MiB in all.
_RETURNED = 256
_RETURN_MAX = 16 << 10


@dataclasses.dataclass(frozen=True, init=False, repr=False)
class Recording:
    """Where and how a run records (``mujou.run(record=Recording(...))``).

    A path given as ``record=`` is ``Recording(path)``. A frozen value: two
    recordings with the same settings are equal.

    Args:
        path (str | os.PathLike): the MCAP file; replaced if it exists, its
            folders made if missing.
        ports (Sequence[str], optional): which Outputs to record: glob
            patterns (fnmatch) over their paths, ``["sim.*", "ctrl.command"]``;
            each must match an Output of the net. Kept as a tuple. Default:
            None (every Output).
        snapshots (bool): attach the supervisor's snapshots to the file (the
            run needs a ``Supervisor(snapshot_every=...)``). Default: False.
        view (bool): also write each recorded Output's JSON view (the
            projection of docs/recording.md, "Viewing a run in Foxglove") to a
            channel ``/view/<path>`` beside its lossless one, so that Foxglove
            plots the file. Made by the writer thread, never the sender's.
            Default: False.
        max_messages (int): the most messages waiting for the writer, >= 1.
            Default: `DEFAULT_MAX_MESSAGES` (65536).
        max_bytes (int): the most bytes waiting for the writer (tensor and
            text bytes plus 64 per message), >= 1. Default:
            `DEFAULT_MAX_BYTES` (256 MiB).
        when_full (str | None): what a send does when the queue is full:
            ``"drop"`` (the message is not recorded and counted as dropped;
            the sender never waits) or ``"wait"`` (the sender waits until
            the writer has made room). Default: None, which is ``"wait"`` with
            the simulated timer and ``"drop"`` in real time.
        compression (str): ``"none"``, ``"lz4"`` or ``"zstd"`` (per chunk).
            Default: ``"none"``.
        chunk_size (int): bytes of messages per chunk. Default: 1 MiB.
        log (bool | int): also record the run's log records to the channel
            ``/mujou/log`` (Foxglove's ``foxglove.Log``), each named after the
            node whose hook logged it and stamped with the hook's key: True
            takes ``logging.INFO`` and above, an int (``logging.DEBUG``) that
            level and above, False none. Only what the loggers let through
            reaches it (Python's default lets warnings and above through:
            ``logging.basicConfig(level=logging.INFO)`` lets ``info`` lines
            through). Kept as the level (True is 20), or False. A record
            never waits for room in the queue: a full queue drops it (counted
            in ``stats().recording.log``). Default: False.

    Raises:
        TypeError: an argument of the wrong type (``max_messages=1.5``,
            ``compression=None``, ``ports="sim.*"`` for ``["sim.*"]``), naming it
            (as `Capsule` does).
        ValueError: an argument of the right type and a wrong value
            (``max_messages=0``, ``when_full="block"``, an empty pattern), naming it.
    """

    path: str
    ports: tuple[str, ...] | None
    snapshots: bool
    view: bool
    max_messages: int
    max_bytes: int
    when_full: str | None
    compression: str
    chunk_size: int
    log: int  # the lowest level recorded, or False (0): no log

    def __init__(self, path: str | os.PathLike[str], *, ports: Iterable[str] | None = None,
                 snapshots: bool = False, view: bool = False,
                 max_messages: int = DEFAULT_MAX_MESSAGES,
                 max_bytes: int = DEFAULT_MAX_BYTES, when_full: str | None = None,
                 compression: str = "none", chunk_size: int = mcapfile.CHUNK_SIZE,
                 log: bool | int = False) -> None:
        if not isinstance(path, (str, os.PathLike)) or os.fspath(path) == "":
            raise TypeError(f"Recording: path must be a non-empty str or os.PathLike, "
                            f"got {path!r}")
        # Capsule's rule: a value of the wrong type is a TypeError, a wrong value a ValueError.
        for name, value in (("max_messages", max_messages), ("max_bytes", max_bytes),
                            ("chunk_size", chunk_size)):
            if not is_int(value):
                raise TypeError(f"Recording: {name} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"Recording: {name} must be an int >= 1, got {value!r}")
        if when_full is not None and not isinstance(when_full, str):
            raise TypeError(f"Recording: when_full must be None, 'drop' or 'wait', "
                            f"got {when_full!r}")
        if when_full is not None and when_full not in _WHEN_FULL:
            raise ValueError(f"Recording: when_full must be None, 'drop' or 'wait', "
                             f"got {when_full!r}")
        for name, flag in (("snapshots", snapshots), ("view", view)):
            if type(flag) is not bool:
                raise TypeError(f"Recording: {name} must be a bool, got {flag!r}")
        if not isinstance(compression, str):
            raise TypeError(f"Recording: compression must be 'none', 'lz4' or 'zstd', "
                            f"got {compression!r}")
        if compression not in ("none", "lz4", "zstd"):
            raise ValueError(f"Recording: compression must be 'none', 'lz4' or 'zstd', "
                             f"got {compression!r}")
        settings: dict[str, Any] = {
            "path": os.fspath(path), "ports": _patterns(ports), "snapshots": snapshots,
            "view": view, "max_messages": max_messages, "max_bytes": max_bytes,
            "when_full": when_full, "compression": compression, "chunk_size": chunk_size,
            "log": _log_level(log)}
        for name, setting in settings.items():  # frozen: set once, as a dataclass's __init__
            object.__setattr__(self, name, setting)

    def __repr__(self) -> str:
        return settings_repr(self)


def _log_level(log: Any) -> int:
    """``Recording(log=)`` as the lowest level recorded (False: no log).

    Raises:
        TypeError: neither a bool nor an int.
        ValueError: an int below 1 (``logging.NOTSET``, 0, would read as "off":
            ``logging.DEBUG`` records every level).
    """
    if log is False:
        return False
    if log is True:
        return logging.INFO
    if not is_int(log):
        raise TypeError(f"Recording: log must be a bool or a logging level (an int such as "
                        f"logging.DEBUG), got {log!r}")
    if log < 1:
        raise ValueError(f"Recording: log must be a logging level >= 1 (logging.DEBUG records "
                         f"every level; False none), got {log!r}")
    return int(log)


def _patterns(ports: Any) -> tuple[str, ...] | None:
    """``Recording(ports=)`` as a tuple of glob patterns (None: every Output).

    Raises:
        TypeError: not None, nor an iterable of str (a lone str is refused:
            ``["sim.*"]``, not ``"sim.*"``).
        ValueError: an empty pattern.
    """
    if ports is None:
        return None
    if isinstance(ports, str) or not isinstance(ports, Iterable):
        raise TypeError(f"Recording: ports must be a list of glob patterns such as "
                        f"['sim.*'], got {ports!r}")
    patterns = tuple(ports)
    for p in patterns:
        if not isinstance(p, str):
            raise TypeError(f"Recording: ports holds {p!r}, not a str pattern")
        if not p:
            raise ValueError("Recording: ports holds an empty pattern")
    return patterns


def as_recording(record: Any) -> Recording | None:
    """The `Recording` for ``mujou.run(record=...)``: None, a path, or a Recording.

    Args:
        record (None | str | os.PathLike | Recording): ``mujou.run``'s argument.

    Returns:
        Recording | None: None for no recording.

    Raises:
        TypeError: another type; ValueError: an empty path.
    """
    if record is None or isinstance(record, Recording):
        return record
    if not isinstance(record, (str, os.PathLike)):
        raise TypeError("mujou.run: record must be None, a path (str or os.PathLike) or a "
                        f"mujou.Recording, got {type(record).__name__}")
    if os.fspath(record) == "":
        raise ValueError("mujou.run: record must not be an empty path")
    return Recording(record)


def select_outputs(ports: Mapping[str, Port], patterns: tuple[str, ...] | None) -> list[str]:
    """The paths of the Outputs that ``patterns`` (fnmatch globs) match, in the net's order.

    Args:
        ports: every port of the net, by path.
        patterns: the globs; None matches every Output.

    Returns:
        list[str]: the recorded Outputs' paths.

    Raises:
        ValueError: a pattern matches no Output; names it and lists the Outputs.
    """
    from ..ports import Output

    outputs = [path for path, port in ports.items() if isinstance(port, Output)]
    if patterns is None:
        return outputs
    unmatched = [p for p in patterns if not fnmatch.filter(outputs, p)]
    if unmatched:
        which = ", ".join(repr(p) for p in unmatched)
        many = len(unmatched) > 1
        raise ValueError(f"mujou.run: Recording(ports=) pattern{'s' if many else ''} {which} "
                         f"match{'' if many else 'es'} no Output "
                         f"(Outputs: {', '.join(outputs) or 'none'})")
    return [path for path in outputs if any(fnmatch.fnmatchcase(path, p) for p in patterns)]


def describe_net(found: list[tuple[str, Node]], ports: Mapping[str, Port]) -> dict[str, Any]:
    """The net as a recording's ``net`` metadata holds it: nodes, their ports, connections.

    Args:
        found (list): the net's ``(path, node)`` pairs, in its order (`net.walk`).
        ports (Mapping[str, Port]): its ports by dotted path.

    Returns:
        dict: ``{"nodes": [{"path", "class", "order", "ports": [{"name", "kind",
        "type"}]}], "connections": [[output path, input path], ...]}``.
    """
    from ..ports import Input, Output

    nodes = []
    connections: list[list[str]] = []
    for order, (path, node) in enumerate(found):
        own = [(name, port) for name, port in node._mujou_ports().items()]
        nodes.append({"path": path, "class": mcapfile.type_name(type(node)), "order": order,
                      "ports": [{"name": name,
                                 "kind": "output" if isinstance(port, Output) else "input",
                                 "type": mcapfile.type_name(port.type)}
                                for name, port in own]})
    for path, port in ports.items():
        if isinstance(port, Output):
            connections.extend([path, reader.path] for reader in port._readers
                               if isinstance(reader, Input))
    return {"nodes": nodes, "connections": connections}


def values_of_net(found: list[tuple[str, Node]]) -> dict[str, Any]:
    """Every parameter of the net and its value as the run starts, by dotted path."""
    return {path: getattr(node, param.name) for path, node, param in iter_params(found)}


def run_metadata(found: list[tuple[str, Node]], ports: Mapping[str, Port], *,
                 seeds: Mapping[str, int], seed: int | None, timer: str, workers: int | None,
                 placement: Mapping[str, str] | None,
                 patterns: tuple[str, ...] | None, log: int = False) -> dict[str, str]:
    """The ``mujou.run`` metadata of a recording (see docs/recording.md for the keys)."""
    return {
        "format": mcapfile.FORMAT,
        "mujou_actors": mcapfile.package_version(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "msgpack": ".".join(map(str, msgpack.version)),
        "timer": timer,
        "seed": "" if seed is None else str(seed),
        "seeds": json.dumps(dict(seeds)),
        "workers": "" if workers is None else str(workers),  # "": a placed run's defaults
        "placement": "" if placement is None else json.dumps(dict(placement)),
        "net": json.dumps(describe_net(found, ports)),
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(),
        "record_ports": json.dumps(["*"] if patterns is None else list(patterns)),
        "numerics": json.dumps(numerics()),
        "params": json.dumps(values_of_net(found)),
        "record_log": str(log) if log else "",  # the lowest level recorded; "": no log
    }


def message_size(message: Any) -> int:
    """The bytes a queued message is charged: 64, plus its tensors' and texts' bytes.

    Containers (lists, tuples, dicts, dataclasses) are looked into without
    recursion; what is neither counts 64.
    """
    mt = type(message)
    if mt is torch.Tensor:
        return _BASE + message.nbytes
    if mt is float or mt is int or mt is bool or message is None:
        return _BASE
    if mt is str or mt is bytes:
        return _BASE + len(message)
    try:
        return _walk_size(message)
    except Exception:  # noqa: BLE001 - a container of the user's that cannot be walked
        return _BASE  # a recording must never fail a send: charged as a scalar


def _walk_size(message: Any) -> int:
    """`message_size` of a container: its tensors' and texts' bytes, without recursion."""
    total = _BASE
    stack = [message]
    while stack:
        value = stack.pop()
        vt = type(value)
        if vt is torch.Tensor:
            total += value.nbytes
        elif vt is str or vt is bytes:
            total += len(value)
        elif vt is dict:
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            stack.extend(getattr(value, f.name) for f in dataclasses.fields(value))
    return total


class Recorder:
    """The recording of one run: the channels' hooks, the queue and the writer thread.

    Made by ``mujou.run`` before the threads start (the file is created, its
    header, ``mujou.run`` metadata and channels written); `hook` makes the
    listener of a recorded Output that reads the key from its sender's actor
    (a run in one process attaches it to the Output's host view), `item_hook`
    the one that takes a placed run's published items ``(t_ns, delta, order,
    index, message)`` (the driver calls it); `start` starts ``mujou-recorder``;
    `close` (the run's end) drains the queue within a bound, writes
    ``mujou.end`` and the summary.

    Args:
        settings (Recording): the file, the queue's bounds, whether to write
            the views and attach the snapshots.
        channels (list[mcapfile.ChannelSpec]): the recorded Outputs, in the
            net's order (a channel's number is its index here).
        metadata (dict[str, str]): the ``mujou.run`` record.
        simulated (bool): the run's timer is simulated (``when_full``'s default).
        host_copy (Callable | None): makes a CPU copy of a message holding CUDA
            tensors once its GPU work is done (None without CUDA nodes).
        now_ns (Callable[[], int] | None): the run's time (ns), which a log
            record made outside any hook is stamped with (``Recording(log=)``).
            Default: None (such records at 0).

    Raises:
        OSError: the file cannot be created.
    """

    def __init__(self, settings: Recording, channels: list[mcapfile.ChannelSpec],
                 metadata: dict[str, str], *, simulated: bool,
                 host_copy: Callable[[Any], Any] | None,
                 now_ns: Callable[[], int] | None = None) -> None:
        self.settings = settings
        self.path = settings.path
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        self._writer = mcapfile.Writer(self.path, chunk_size=settings.chunk_size,
                                       compression=settings.compression)
        self._writer.write_run(metadata)
        self._topics = [spec.topic for spec in channels]
        self._ids = [self._writer.add_channel(spec) for spec in channels]
        # Recording(view=True): each channel's projection and view channel (written beside it).
        self._views: list[tuple[Projection, int]] | None = None
        if settings.view:
            self._views = []
            for spec in channels:
                projection = Projection(spec.topic, spec.type, spec.shape,
                                        None if spec.dtype is None
                                        else getattr(torch, spec.dtype), spec.foxglove)
                self._views.append((projection, self._writer.add_view_channel(
                    spec.topic, projection.schema_name, projection.schema)))
        # Recording(log=...): the log channel, its tap (attached by start) and its counts,
        # each changed under the lock (records come from any thread).
        self._tap: LogTap | None = None
        self._log_id = -1
        self._log_counts = dict.fromkeys(("sent", "recorded", "dropped", "bytes", "lost"), 0)
        if settings.log:
            self._log_id = self._writer.add_log_channel()
            self._tap = LogTap(self._take_log, now_ns or (lambda: 0), settings.log,
                               self._lose_log)
        self._host_copy = host_copy
        self._snapshots = settings.snapshots
        self._wait = (settings.when_full or ("wait" if simulated else "drop")) == "wait"
        n = len(channels)
        # Written by each channel's sender only (one node's hooks never overlap).
        self._sent = [0] * n
        self._dropped = [0] * n
        # Written by the writer thread only.
        self._recorded = [0] * n
        self._bytes = [0] * n
        self._lost = [0] * n  # written, then lost with the chunk a failed write left open
        self._unrecordable = [0] * n
        self._skipped = 0  # queued messages left unwritten when the end's bound ran out
        self._queue: deque[tuple[int, int, tuple[int, int], Any, int]] = deque()
        # Written messages whose last reference a sender's hook drops (two per send), so
        # that their memory is freed, and reused, on a sending thread: freed by the writer
        # on the other core, a sender's next tensors came from memory that core had
        # touched last, 0.7 us of the sender's CPU a 1 KiB tensor (benchmarks/recording.py).
        # Only messages of more than 64 and at most _RETURN_MAX bytes, at most _RETURNED of
        # them; the writer empties it itself when it has nothing to write.
        self._dead: deque[Any] = deque()
        # The queued bytes, and a sender's wait for room: a few statements under the lock.
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._pending = [0]  # bytes queued
        self._waiting = 0  # senders waiting for room
        self._trees: deque[dict[str, Any]] = deque()  # snapshots to attach, never dropped
        self._params: deque[tuple[int, int, str, str, Any]] = deque()  # sets, never dropped
        self._wake = threading.Event()  # close() and snapshots wake the writer
        self._closing = False
        self._deadline: float | None = None  # monotonic: the end's drain stops here
        self._end: dict[str, str] | None = None
        self._error: BaseException | None = None
        self._done = False  # the writer has stopped (closed, failed, or given up)
        self._thread = threading.Thread(target=self._serve, name="mujou-recorder", daemon=True)
        self._warned: set[int] = set()

    # -- the senders' side ------------------------------------------------------------------
    def hook(self, ch: int, actor: Actor) -> Callable[[Any], None]:
        """The listener of channel ``ch``, sent by ``actor``: on the sending thread, queue or drop.

        The message is queued with ``actor.stamp``, the key of the hook that
        sends it (read from ``actor.flight``, a list, as the sends read it: one
        property call fewer per message on the pure-Python build).
        """
        flight = actor.flight  # [hook, stamp] in flight
        sent, dropped = self._sent, self._dropped
        queue, lock, pending = self._queue, self._lock, self._pending
        append = queue.append
        max_n, max_b = self.settings.max_messages, self.settings.max_bytes
        size_of = message_size
        wait = self._wait_for_room if self._wait else None
        tensor, small = torch.Tensor, _SMALL
        dead = self._dead

        def hook(message: Any) -> None:
            if dead:  # free two written messages here (see Recorder.__init__)
                try:
                    dead.popleft()
                    dead.popleft()
                except IndexError:  # another sender or the writer took the last
                    pass
            seq = sent[ch]
            sent[ch] = seq + 1
            mt = type(message)  # message_size, inlined for the common types
            if mt is tensor:
                size = _BASE + message.nbytes
            elif mt in small:
                size = _BASE
            else:
                size = size_of(message)
            with lock:
                if len(queue) < max_n and pending[0] + size <= max_b:
                    pending[0] += size
                    append((ch, seq, flight[1], message, size))
                    return
            if wait is None or not wait(ch, seq, flight[1], message, size):
                dropped[ch] += 1

        return hook

    def item_hook(self, ch: int) -> Callable[[tuple[int, int, int, int, Any]], None]:
        """The listener of channel ``ch`` for a placed run's published items (the driver's).

        An item is ``(t_ns, delta, sender order, output index, message)``, the
        message a copy made in the sender's process.
        """
        sent, dropped = self._sent, self._dropped
        queue, lock, pending = self._queue, self._lock, self._pending
        max_n, max_b = self.settings.max_messages, self.settings.max_bytes
        wait = self._wait_for_room if self._wait else None

        def hook(item: tuple[int, int, int, int, Any]) -> None:
            seq = sent[ch]
            sent[ch] = seq + 1
            t, delta, _, _, message = item
            size = message_size(message)
            with lock:
                if len(queue) < max_n and pending[0] + size <= max_b:
                    pending[0] += size
                    queue.append((ch, seq, (t, delta), message, size))
                    return
            if wait is None or not wait(ch, seq, (t, delta), message, size):
                dropped[ch] += 1

        return hook

    def _take_log(self, entry: dict[str, Any]) -> None:
        """The log tap's delivery (on the thread that logged): queue the entry, or drop it.

        Never waits for room: a record may be logged anywhere, by the writer
        thread itself too.
        """
        size = _BASE + len(entry["message"]) + len(entry["name"]) + len(entry["file"])
        when = entry["timestamp"]
        key = (when["sec"] * 1_000_000_000 + when["nsec"], 0)
        counts = self._log_counts
        with self._lock:
            if self._closing or self._done:
                return  # the end: the tap is being taken off
            counts["sent"] += 1
            if len(self._queue) < self.settings.max_messages \
                    and self._pending[0] + size <= self.settings.max_bytes:
                self._pending[0] += size
                self._queue.append((_LOG, counts["sent"] - 1, key, entry, size))
                return
            counts["dropped"] += 1

    def _lose_log(self, lost: int) -> None:
        """Count records lost on their way here (a placed run's group kept too many waiting
        for the host: `logview.forward_lost`) as sent and dropped."""
        with self._lock:
            if not (self._closing or self._done):
                self._log_counts["sent"] += lost
                self._log_counts["dropped"] += lost

    def _wait_for_room(self, ch: int, seq: int, key: tuple[int, int], message: Any,
                       size: int) -> bool:
        """``when_full="wait"``: queue the message once the writer made room; False if it stopped.

        Waits in slices of `_WAIT_SLICE`, looking each time whether the writer
        still runs: a writer that failed or was closed takes nothing more.
        """
        max_n, max_b = self.settings.max_messages, self.settings.max_bytes
        queue, pending = self._queue, self._pending
        with self._room:
            self._waiting += 1
            try:
                while not self._done and not self._closing:
                    # A message bigger than max_bytes waits for an empty queue only.
                    if len(queue) < max_n and (pending[0] + size <= max_b or not queue):
                        pending[0] += size
                        queue.append((ch, seq, key, message, size))
                        return True
                    self._room.wait(_WAIT_SLICE)
            finally:
                self._waiting -= 1
        return False

    def snapshot(self, tree: dict[str, Any]) -> None:
        """Attach a supervisor snapshot (its tree, taken at a cut), if the run asked for it."""
        if self._snapshots and not self._done:
            self._trees.append(tree)
            self._wake.set()

    def param(self, key: tuple[int, int], node: str, name: str, value: Any) -> None:
        """Attach a parameter set made on the running net: the key it applies from, its value.

        Never dropped (a replay needs every one); the host makes them, one call each.
        """
        if not self._done:
            self._params.append((key[0], key[1], node, name, value))
            self._wake.set()

    # -- the writer thread ------------------------------------------------------------------
    def start(self) -> None:
        """Start the ``mujou-recorder`` thread, and take the log's records (``log=``)."""
        self._thread.start()
        if self._tap is not None:
            self._tap.attach()

    def _serve(self) -> None:
        """The writer thread: write what is queued until `close`, then the end of the file."""
        try:
            flushed = time.monotonic()
            dirty = False
            while True:
                wrote = self._write_batch()
                dirty = dirty or wrote
                now = time.monotonic()
                if self._closing and (not self._queue or (self._deadline is not None
                                                          and now >= self._deadline)):
                    break
                if not wrote:
                    self._dead.clear()  # no sender is busy: free them here
                    if dirty and now - flushed >= FLUSH_EVERY:
                        self._writer.flush()  # what a crash would lose: at most a second
                        flushed, dirty = now, False
                    self._wake.wait(_POLL)
                    self._wake.clear()
            self._finish()
        except BaseException as exc:  # noqa: BLE001 - reported by close(); the run goes on
            self._error = exc
            log.error("recording %s failed: %s; later messages are not recorded",
                      self.path, describe(exc))
            self._writer.abandon()
            self._failed()
        finally:
            self._dead.clear()
            with self._room:
                self._done = True
                self._room.notify_all()

    def _write_batch(self) -> bool:
        """Write up to `_BATCH` queued messages and the snapshots waiting; True if any."""
        queue, writer, ids = self._queue, self._writer, self._ids
        self._write_attachments()
        if not queue:
            return False
        freed = 0
        host_copy = self._host_copy
        dead = self._dead if host_copy is None else None
        for _ in range(min(len(queue), _BATCH)):
            ch, seq, (t_ns, delta), message, size = queue.popleft()
            freed += size
            if ch == _LOG:
                self._write_log(t_ns, message)
                continue
            if host_copy is not None:
                message = host_copy(message)
            try:
                n = writer.write_message(ids[ch], seq, t_ns, delta, message)
            except OSError:
                self._lost[ch] += 1  # not in the file: counted as dropped (see _failed)
                raise
            except (TypeError, ValueError) as exc:
                self._unrecordable[ch] += 1
                if ch not in self._warned:
                    self._warned.add(ch)
                    log.warning("recording %s: a message of %s cannot be recorded (%s); such "
                                "messages are counted in stats().recording", self.path,
                                self._topics[ch], exc)
                continue
            self._recorded[ch] += 1
            self._bytes[ch] += n
            if dead is not None and _BASE < size <= _RETURN_MAX and len(dead) < _RETURNED:
                dead.append(message)
            if self._views is not None:
                self._write_view(ch, t_ns, message)
        with self._room:
            self._pending[0] -= freed
            if self._waiting:
                self._room.notify_all()
        return True

    def _write_attachments(self) -> None:
        """Attach the snapshots and parameter sets waiting, in the order they came."""
        trees, params, writer = self._trees, self._params, self._writer
        while trees:
            tree = trees.popleft()
            writer.attach_snapshot(tree["time_ns"], tree)
        while params:
            writer.attach_param(*params.popleft())

    def _write_log(self, t_ns: int, entry: dict[str, Any]) -> None:
        """Write one log entry (a ``foxglove.Log`` object) at its time."""
        data = json.dumps(entry, separators=(",", ":")).encode()
        try:
            self._writer.write(self._log_id, t_ns, data)
        except OSError:
            with self._lock:
                self._log_counts["lost"] += 1  # not in the file (see _failed)
            raise
        with self._lock:
            self._log_counts["recorded"] += 1
            self._log_counts["bytes"] += len(data)

    def _write_view(self, ch: int, t_ns: int, message: Any) -> None:
        """Write the view of a message just written (same time); never fails it."""
        assert self._views is not None
        projection, view_id = self._views[ch]
        t = max(t_ns, 0)
        try:
            data = projection.encode(message, t)
        except Exception as exc:  # noqa: BLE001 - a view never costs the lossless message
            if -1 - ch not in self._warned:
                self._warned.add(-1 - ch)
                log.warning("recording %s: the view of a message of %s cannot be made (%s); "
                            "its lossless message is recorded", self.path, self._topics[ch],
                            describe(exc))
            return
        self._writer.write(view_id, t, data)

    def _failed(self) -> None:
        """After a failed write: what was written but not in a closed chunk is lost, dropped.

        The file keeps what its closed chunks hold (`mcapfile.Writer.durable`);
        the counts say so, so that sent = recorded + dropped (+ unrecordable).
        """
        for ch, channel_id in enumerate(self._ids):
            kept, kept_bytes = self._writer.durable(channel_id)
            if self._recorded[ch] > kept:
                self._lost[ch] += self._recorded[ch] - kept
                self._recorded[ch], self._bytes[ch] = kept, kept_bytes
        if self._tap is not None:
            kept, kept_bytes = self._writer.durable(self._log_id)
            with self._lock:
                counts = self._log_counts
                if counts["recorded"] > kept:
                    counts["lost"] += counts["recorded"] - kept
                    counts["recorded"], counts["bytes"] = kept, kept_bytes

    def _count_left(self, left: list[tuple[int, int, tuple[int, int], Any, int]]) -> None:
        """Count the queued messages and log entries left unwritten as dropped."""
        for ch, *_ in left:
            if ch == _LOG:
                self._log_counts["dropped"] += 1
            else:
                self._dropped[ch] += 1

    def _finish(self) -> None:
        """The end of the file: what is left unwritten counted, ``mujou.end``, the summary."""
        self._dead.clear()
        with self._room:
            left = list(self._queue)
            self._queue.clear()
            self._count_left(left)
        self._skipped += len(left)
        self._write_attachments()
        end = self._end or {}
        log = {} if self._tap is None else {"log": json.dumps({
            "recorded": self._log_counts["recorded"], "dropped": self._log_counts["dropped"]})}
        self._writer.close({
            "time_ns": end.get("time_ns", ""),
            "recorded": json.dumps(dict(zip(self._topics, self._recorded, strict=True))),
            "drops": json.dumps({t: n for t, n in zip(self._topics, self._dropped, strict=True)
                                 if n}),
            "unrecordable": json.dumps({t: n for t, n in zip(self._topics, self._unrecordable,
                                                             strict=True) if n}),
            "failure": end.get("failure", ""),
            **log,
        })

    # -- the end ------------------------------------------------------------------------------
    def close(self, end_ns: int | None, failure: str, timeout: float) -> BaseException | None:
        """Write what is queued (for at most ``timeout`` wall seconds), ``mujou.end``; close.

        Called once no hook runs any more. What is still queued when the bound
        runs out is counted as dropped. Idempotent.

        Args:
            end_ns (int | None): the run's end time, ns of its timer (None: unknown).
            failure (str): what made the run fail (``""`` if nothing).
            timeout (float): wall seconds for the writer to finish.

        Returns:
            BaseException | None: what made the writer fail (an ``OSError``
            writing the file), None if the file is complete.
        """
        if self._tap is not None:
            self._tap.cancel()  # first: what is logged from here on is not the run's
        if not self._closing:
            self._end = {"time_ns": "" if end_ns is None else str(end_ns), "failure": failure}
            self._deadline = time.monotonic() + timeout
            with self._room:
                self._closing = True
                self._room.notify_all()  # a sender waiting for room records nothing more
            self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout + 1.0)  # the drain's bound, then the summary
        elif not self._thread.ident:  # never started (a run refused while built)
            self._done = True
            try:
                self._finish()
            except Exception as exc:  # noqa: BLE001 - returned, as the thread's would be
                self._error = exc
                self._failed()
        if self._thread.is_alive() and self._error is None:
            return OSError(f"recording {self.path}: the writer did not finish within "
                           f"{timeout + 1.0:g} s (the file may lack its end)")
        if self._error is not None:  # the writer stopped early: what it left is lost
            with self._room:
                left = list(self._queue)
                self._queue.clear()
                self._count_left(left)
        return self._error

    def stats(self) -> RecordingStats:
        """The recording's counts so far (`RecordingStats`)."""
        channels = {topic: RecordingChannelStats(
            port=topic, sent=self._sent[ch], recorded=self._recorded[ch],
            dropped=self._dropped[ch] + self._lost[ch], unrecordable=self._unrecordable[ch],
            bytes=self._bytes[ch]) for ch, topic in enumerate(self._topics)}
        log = None
        if self._tap is not None:
            with self._lock:
                counts = dict(self._log_counts)
            log = RecordingChannelStats(
                port=LOG_TOPIC, sent=counts["sent"], recorded=counts["recorded"],
                dropped=counts["dropped"] + counts["lost"], unrecordable=self._tap.failed,
                bytes=counts["bytes"])
        return RecordingStats(
            file=self.path, recorded=sum(self._recorded),
            dropped=sum(self._dropped) + sum(self._lost),
            unrecordable=sum(self._unrecordable), bytes=sum(self._bytes),
            queued=len(self._queue), when_full="wait" if self._wait else "drop",
            error=None if self._error is None else describe(self._error), channels=channels,
            log=log)
