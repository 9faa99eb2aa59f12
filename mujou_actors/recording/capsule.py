"""Crash capsules: the last seconds of every Output and a snapshot, written when a node fails.

``mujou.run(net, record_on_failure="capsule.mcap")`` makes a `CapsuleKeeper`
for the run. It keeps, in memory and by reference (a message is read-only
once sent), every message of every Output since the older of the last two
snapshots of the run's state, with the key of the hook that sent it; the
snapshots come from the supervisor's schedule (``snapshot_every``, which the
capsule sets to its ``seconds`` when the supervisor has none). When a hook
raises for the first time in the run, a ``mujou-capsule`` thread writes the
older snapshot and every message since it to an MCAP file of the recording
profile (docs/recording.md), with the failure (node, hook, time, exception)
in its ``mujou.end`` record. `mujou.testing.reproduce_failure` reruns a net
from that snapshot, in simulated time, and checks that the same exception is
raised by the same node at the same time and delta cycle.

Memory is bounded twice: by the window (messages older than the older kept
snapshot are let go when a new snapshot comes) and by ``max_messages`` and
``max_bytes`` (past them the oldest messages are let go, counted as evicted;
the capsule then starts at the newest snapshot whose messages are all kept).
Nothing of this exists on a run without ``record_on_failure``.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .._checks import is_int, is_number
from ..errors import RecordingError, describe
from ..stats import CapsuleStats
from ..trace import check_writable
from . import mcapfile
from .recorder import message_size

if TYPE_CHECKING:
    from .._runtime.actor import Actor

__all__ = ["Capsule"]

log = logging.getLogger("mujou_actors")

DEFAULT_SECONDS = 5.0
"""Seconds of the run's timer between the capsule's snapshots (a `Capsule`'s ``seconds``)."""

DEFAULT_MAX_BYTES = 64 << 20
"""The most bytes of messages a capsule keeps (a `Capsule`'s ``max_bytes``)."""

DEFAULT_MAX_MESSAGES = 1 << 18
"""The most messages a capsule keeps (a `Capsule`'s ``max_messages``)."""

_Entry = tuple[int, int, tuple[int, int], Any, int]  # channel, sequence, key, message, bytes


class Capsule:
    """Where and how a run keeps its crash capsule (``mujou.run(record_on_failure=...)``).

    A path given as ``record_on_failure=`` is ``Capsule(path)``.

    Args:
        path (str | os.PathLike): the MCAP file written when a node fails;
            replaced if it exists, its folders made if missing. Nothing is
            written when no node fails.
        seconds (float): seconds of the run's timer between the snapshots the
            capsule starts from, when the run's supervisor has no
            ``snapshot_every`` of its own (then the supervisor's period is
            used). The capsule holds between one and two periods of messages
            before the failure. Default: `DEFAULT_SECONDS` (5).
        max_bytes (int): the most bytes of messages kept (tensor and text
            bytes plus 64 per message), >= 1. Default: 64 MiB.
        max_messages (int): the most messages kept, >= 1. Default: 262144.

    Raises:
        TypeError / ValueError: a bad argument, naming it.
    """

    def __init__(self, path: str | os.PathLike[str], *, seconds: float = DEFAULT_SECONDS,
                 max_bytes: int = DEFAULT_MAX_BYTES,
                 max_messages: int = DEFAULT_MAX_MESSAGES) -> None:
        if not isinstance(path, (str, os.PathLike)) or os.fspath(path) == "":
            raise TypeError(f"Capsule: path must be a non-empty str or os.PathLike, got {path!r}")
        if not is_number(seconds):
            raise TypeError(f"Capsule: seconds must be a number of seconds, got {seconds!r}")
        if not 0 < seconds < float("inf"):
            raise ValueError(f"Capsule: seconds must be a finite number > 0, got {seconds!r}")
        for name, value in (("max_bytes", max_bytes), ("max_messages", max_messages)):
            if not is_int(value):
                raise TypeError(f"Capsule: {name} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"Capsule: {name} must be an int >= 1, got {value!r}")
        self.path = os.fspath(path)
        self.seconds = float(seconds)
        self.max_bytes = max_bytes
        self.max_messages = max_messages

    def __repr__(self) -> str:
        return (f"Capsule({self.path!r}, seconds={self.seconds:g}, max_bytes={self.max_bytes}, "
                f"max_messages={self.max_messages})")


def as_capsule(value: Any) -> Capsule | None:
    """The `Capsule` for ``mujou.run(record_on_failure=...)``: None, a path, or a Capsule.

    Raises:
        TypeError: another type. ValueError: an empty path.
        OSError: the file could not be written there (``trace.check_writable``).
    """
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        if os.fspath(value) == "":
            raise ValueError("mujou.run: record_on_failure must not be an empty path")
        value = Capsule(value)
    if not isinstance(value, Capsule):
        raise TypeError("mujou.run: record_on_failure must be None, a path (str or "
                        f"os.PathLike) or a mujou.Capsule, got {type(value).__name__}")
    check_writable(value.path, "mujou.run: record_on_failure file", make_folders=True)
    return value


class CapsuleKeeper:
    """The crash capsule of one run: the Outputs' hooks, the window, the writer at a failure.

    Made by ``mujou.run`` before the threads start. `hook` makes the listener
    of one Output (on its host view, as a recording's); the coordinator hands
    it the supervisor's snapshots (`snapshot`), a one_for_all restart's
    rewind (`restored`), the first failure (`failed`), and closes it at the
    end (`close`), which waits for the file.

    Args:
        settings (Capsule): the file and the bounds.
        channels (list[mcapfile.ChannelSpec]): every Output, in the net's order
            (a channel's number is its index here).
        metadata (dict[str, str]): the ``mujou.run`` record.
        host_copy (Callable | None): a CPU copy of a message holding CUDA
            tensors once its GPU work is done (None without CUDA nodes).
    """

    def __init__(self, settings: Capsule, channels: list[mcapfile.ChannelSpec],
                 metadata: dict[str, str], *,
                 host_copy: Callable[[Any], Any] | None) -> None:
        self.settings = settings
        self.path = settings.path
        self._channels = channels
        self._metadata = metadata
        self._host_copy = host_copy
        n = len(channels)
        self._sent = [0] * n  # by each channel's sender only
        self._evicted = [0] * n  # all the run's evictions (stats)
        self._evicted_since = [0] * n  # those sent at or after the newest snapshot's time
        self._ring: deque[_Entry] = deque()
        self._bytes = [0]
        # The newest time (ns) of a message let go for the bounds: a snapshot
        # older than or at it lacks some of the messages that follow it.
        self._lost_ns = -1
        self._trees: deque[dict[str, Any]] = deque(maxlen=2)
        # The parameter sets made since the older snapshot kept, each with the count of
        # snapshots kept before it came (`param`): a capsule holds those after its tree.
        self._sets: deque[tuple[int, tuple[int, int], str, str, Any]] = deque()
        self._kept = 0  # snapshots kept so far
        self._lock = threading.Lock()  # a few statements at a time, never across a wait
        self._failure: dict[str, Any] | None = None
        self._taken = False  # the window is taken for the capsule (after the failure's instant)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._written = False

    # -- the senders' side ------------------------------------------------------------------
    def hook(self, ch: int, actor: Actor) -> Callable[[Any], None]:
        """The listener of channel ``ch``, sent by ``actor``: keep; evict past the bounds."""
        sent, ring, lock, total = self._sent, self._ring, self._lock, self._bytes
        max_n, max_b = self.settings.max_messages, self.settings.max_bytes
        flight = actor.flight  # [hook, stamp] in flight: a list read, as the sends read it

        def hook(message: Any) -> None:
            seq = sent[ch]
            sent[ch] = seq + 1
            size = message_size(message)
            key = flight[1]
            writer = None
            with lock:
                if self._failure is None or not self._taken and key[0] <= self._failure["t_ns"]:
                    ring.append((ch, seq, key, message, size))
                    total[0] += size
                    while ring and (len(ring) > max_n or total[0] > max_b):
                        self._evict()  # a message bigger than max_bytes is not kept either
                elif not self._taken:
                    writer = self._take()  # the failure's instant is over
                # else: the capsule is taken; what follows it is not in it
            if writer is not None:
                writer.start()  # outside the lock: no wait for a thread under it

        return hook

    def _evict(self) -> None:
        """Let the oldest message go (the lock is held)."""
        ch, _, key, _, size = self._ring.popleft()
        self._bytes[0] -= size
        self._evicted[ch] += 1
        if not self._trees or key[0] > self._trees[-1]["time_ns"]:
            self._evicted_since[ch] += 1
        self._lost_ns = max(self._lost_ns, key[0])

    # -- the coordinator's side -------------------------------------------------------------
    def snapshot(self, tree: dict[str, Any]) -> None:
        """A supervisor snapshot was taken: keep it; let go what precedes the older one kept."""
        with self._lock:
            if self._failure is not None:
                writer = (self._take() if not self._taken
                          and tree["time_ns"] > self._failure["t_ns"] else None)
            else:
                writer = None
                self._keep_tree(tree)
        if writer is not None:
            writer.start()

    def _keep_tree(self, tree: dict[str, Any]) -> None:
        """Keep a snapshot, letting go what precedes the older one kept (the lock is held)."""
        if self._trees and tree["time_ns"] < self._trees[-1]["time_ns"]:
            self._restart_window(tree)  # time went back: a rewind we were not told of
            return
        self._trees.append(tree)
        self._kept += 1
        self._evicted_since = [0] * len(self._evicted_since)
        while self._sets and self._sets[0][0] < self._kept - 1:  # before the older tree
            self._sets.popleft()
        start = self._trees[0]["time_ns"]
        ring = self._ring
        while ring and ring[0][2][0] <= start:  # held by the snapshot (see _take)
            self._bytes[0] -= ring.popleft()[4]

    def restored(self, tree: dict[str, Any]) -> None:
        """A one_for_all restart took the net back to ``tree``: the window starts there again."""
        with self._lock:
            if self._failure is None:
                self._restart_window(tree)

    def _restart_window(self, tree: dict[str, Any]) -> None:
        """Keep only ``tree``; what was sent before the rewind is another history (lock held)."""
        self._trees.clear()
        self._trees.append(tree)
        self._kept += 1
        self._sets.clear()  # (the rewound tree holds the values they set: restarts keep them)
        self._ring.clear()
        self._bytes[0] = 0
        self._lost_ns = -1
        self._evicted_since = [0] * len(self._evicted_since)

    def param(self, key: tuple[int, int], node: str, name: str, value: Any) -> None:
        """A parameter set made on the running net: kept until no kept snapshot precedes it.

        The capsule holds the sets made after its snapshot (a replay of it
        queues them at their keys); their number is bounded by the sets the
        host makes between two snapshots.
        """
        with self._lock:
            if self._failure is None:
                self._sets.append((self._kept, key, node, name, value))

    def failed(self, path: str, hook: str, exc: BaseException, key: tuple[int, int]) -> None:
        """The first failure of the run: note it; the capsule is taken when its instant ends.

        Called on the failing hook's thread, no lock of the kernel held. The
        other nodes' hooks of the failure's instant (its time, every delta
        cycle) may still send: their messages go in, whatever the threads'
        timing, so that the capsule's content is the same every time. The
        first message or snapshot after that time, or the run's end, takes
        the window (references, no copies) and leaves the writing to a
        ``mujou-capsule`` thread. Later failures are logged only.

        Args:
            path (str): the failing node's path (``""``: the root).
            hook (str): the hook that raised (``"on_update"``, ...).
            exc (BaseException): what it raised.
            key (tuple[int, int]): the hook's ``(t_ns, delta)``; ``t_ns`` is
                -1 for a hook before the timer started (``on_start``).
        """
        with self._lock:
            if self._failure is not None:
                log.info("capsule %s: node %r failed too; the capsule keeps the first failure",
                         self.path, path or "<root>")
                return
            self._failure = {
                "node": path, "hook": hook, "t_ns": key[0], "delta": key[1],
                "exception": f"{type(exc).__module__}.{type(exc).__qualname__}",
                "message": _text(exc), "snapshot_ns": -1,
            }

    def _take(self) -> threading.Thread:
        """Take the window; the writer thread, for the caller to start once the lock is let go.

        The lock is held; called once.
        """
        failure = self._failure
        assert failure is not None
        self._taken = True
        tree = self._start_tree()
        start = -1 if tree is None else tree["time_ns"]
        failure["snapshot_ns"] = start
        # A snapshot at t holds everything of the instant t (every delta cycle ran
        # before the cut): the capsule's messages are those sent after it.
        entries = [e for e in self._ring if e[2][0] > start] if tree is not None \
            else list(self._ring)
        self._ring.clear()
        self._bytes[0] = 0
        # The sets made after its tree was kept (the tree holds those before).
        index = self._kept - len(self._trees) + (list(self._trees).index(tree)
                                                 if tree is not None else 0)
        sets = [s[1:] for s in self._sets if tree is None or s[0] > index]
        self._sets.clear()
        # Messages the capsule lacks: none when it starts at a snapshot whose
        # messages are all kept; else (the newest, when even its window did not
        # fit the bounds) those let go since it.
        complete = tree is None and self._lost_ns < 0 or \
            tree is not None and tree["time_ns"] > self._lost_ns
        evicted = [0] * len(self._evicted) if complete else list(self._evicted_since)
        self._thread = threading.Thread(target=self._write, args=(tree, entries, evicted, sets),
                                        name="mujou-capsule", daemon=True)
        return self._thread

    def _start_tree(self) -> dict[str, Any] | None:
        """The snapshot the capsule starts from: the oldest whose messages are all kept."""
        for tree in self._trees:
            if tree["time_ns"] > self._lost_ns:
                return tree
        return self._trees[-1] if self._trees else None

    def _write(self, tree: dict[str, Any] | None, entries: list[_Entry],
               evicted: list[int], sets: list[tuple[tuple[int, int], str, str, Any]]) -> None:
        """The ``mujou-capsule`` thread: the file, complete or reported by `close`."""
        failure = self._failure
        assert failure is not None
        try:
            writer = mcapfile.Writer(self.path)
            try:
                writer.write_run({**self._metadata, "capsule": "1"})
                ids = [writer.add_channel(spec) for spec in self._channels]
                counts = [0] * len(ids)
                entries.sort(key=lambda e: (e[2], self._channels[e[0]].sender_order, e[1]))
                for ch, seq, (t_ns, delta), message, _ in entries:
                    if self._host_copy is not None:
                        message = self._host_copy(message)
                    writer.write_message(ids[ch], seq, t_ns, delta, message)
                    counts[ch] += 1
                if tree is not None:
                    writer.attach_snapshot(tree["time_ns"], tree)
                for (t_ns, delta), node, name, value in sets:
                    writer.attach_param(t_ns, delta, node, name, value)
                topics = [spec.topic for spec in self._channels]
                writer.close({
                    "time_ns": str(max(failure["t_ns"], 0)),
                    "recorded": json.dumps(dict(zip(topics, counts, strict=True))),
                    "drops": json.dumps({t: n for t, n in zip(topics, evicted, strict=True)
                                         if n}),
                    "failure": f"node {failure['node'] or '<root>'!r} failed in "
                               f"{failure['hook']}: {failure['message']}",
                    "capsule": json.dumps(failure),
                })
            except BaseException:
                writer.abandon()
                _remove(self.path)  # no capsule rather than one that reads as another run
                raise
            self._written = True
            log.info("node %r failed: its crash capsule is %s (replay it with `mujou "
                        "replay %s FILE:NET`)", failure["node"] or "<root>", self.path,
                        self.path)
        except BaseException as exc:  # noqa: BLE001 - close() returns it, join() raises it
            self._error = exc
            log.error("capsule %s could not be written: %s", self.path, describe(exc))

    def close(self, timeout: float) -> BaseException | None:
        """Wait (at most ``timeout`` wall seconds) for a capsule being written.

        Returns:
            BaseException | None: what made writing it fail (an ``OSError``, or
            a message the file cannot hold), None if it was written or no node
            failed.
        """
        with self._lock:  # the run ended in the failure's instant: take it now
            writer = self._take() if self._failure is not None and not self._taken else None
        if writer is not None:
            writer.start()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                return OSError(f"capsule {self.path}: not written within {timeout:g} s")
        with self._lock:  # no hook runs any more: let the window go
            self._ring.clear()
            self._trees.clear()
            self._bytes[0] = 0
        return self._error

    def stats(self) -> CapsuleStats:
        """The capsule's counts so far (`CapsuleStats`)."""
        with self._lock:
            failure = self._failure
            return CapsuleStats(
                file=self.path, kept=len(self._ring), kept_bytes=self._bytes[0],
                evicted=sum(self._evicted), snapshots=len(self._trees),
                failure=None if failure is None else (
                    f"{failure['node'] or '<root>'}.{failure['hook']} at "
                    f"{failure['t_ns']} ns: {failure['exception']}"),
                written=self._written,
                error=None if self._error is None else describe(self._error))


def _remove(path: str) -> None:
    """Remove a half-written capsule: a regular file only (a missing one is fine).

    A capsule written to a device, a pipe or through a link was not made by the
    writer: it is left where it is (``record_on_failure="/dev/full"`` must not
    delete the device).
    """
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            os.unlink(path)
    except OSError:
        pass


def _text(exc: BaseException) -> str:
    """``str(exc)``, whatever that does (a hook's exception may fail its own ``__str__``)."""
    try:
        return str(exc)
    except BaseException:  # noqa: BLE001 - a message of our own stands in
        return f"<{type(exc).__name__}: its str() raised>"


# The keys of a capsule's facts (its mujou.end record's ``capsule``) and their types.
_FACTS: dict[str, type] = {"node": str, "hook": str, "t_ns": int, "delta": int,
                           "exception": str, "message": str, "snapshot_ns": int}


def capsule_facts(end: Mapping[str, str] | None, path: str = "<recording>"
                  ) -> dict[str, Any] | None:
    """The failure a capsule's ``mujou.end`` record holds; None for a recording that is none.

    The facts come from a file: each key is checked (``node``, ``hook``,
    ``exception`` and ``message`` str; ``t_ns`` and ``snapshot_ns`` ints in
    ``[-1, 2**63)``, the snapshot not after the failure; ``delta`` an int in
    ``[0, 2**63)``), so that what reads them never meets a missing key or
    another type.

    Args:
        end (Mapping[str, str] | None): the recording's ``mujou.end`` metadata.
        path (str): the file, for errors.

    Returns:
        dict[str, Any] | None: the facts; None when ``end`` has no ``capsule``.

    Raises:
        RecordingError: ``capsule`` is not such a JSON object (names the key).
    """
    if not end or "capsule" not in end:
        return None
    try:
        facts: dict[str, Any] = mcapfile.parse_json(end["capsule"])
    except ValueError as e:
        raise RecordingError(path, f"bad 'capsule' in its mujou.end metadata ({e})") from None
    if not isinstance(facts, dict):
        raise RecordingError(path, "bad 'capsule' in its mujou.end metadata (a JSON "
                             f"{type(facts).__name__}, not an object)")
    for key, kind in _FACTS.items():
        value = facts.get(key)
        fits = type(value) is kind  # not a bool for an int
        if not fits:
            got = "missing" if key not in facts else f"a {type(value).__name__}"
            raise RecordingError(path, f"bad 'capsule' in its mujou.end metadata: {key!r} "
                                 f"is {got}, not {'an int' if kind is int else 'a str'}")
        low = 0 if key == "delta" else -1
        if isinstance(value, int) and not low <= value < mcapfile.TIME_END:
            raise RecordingError(path, f"bad 'capsule' in its mujou.end metadata: {key!r} "
                                 f"is {value}, not in [{low}, 2**63)")
    if facts["snapshot_ns"] > facts["t_ns"]:
        raise RecordingError(path, f"bad 'capsule' in its mujou.end metadata: its snapshot "
                             f"(t = {facts['snapshot_ns']} ns) is after its failure "
                             f"(t = {facts['t_ns']} ns)")
    return facts
