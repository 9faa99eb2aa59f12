"""Seeds, the snapshot schedule, snapshot files and restart strategies.

The supervisor's decisions live here (`failure_verdict` returns a `Verdict`
for each node failure); the run's coordinator carries them out through the
dispatcher's envelopes (Stop, Start, Restore) and consistent cuts.

Restart strategies follow Erlang/OTP's supervisors: ``one_for_one`` restarts
only the failed node, ``one_for_all`` restores the whole net, and more than
``max_restarts`` restarts within ``within`` seconds escalate (the run stops).
Per-node seeds are derived with BLAKE2b from the run's seed and the node's
path, so they are the same in every process and on every Python version
(unlike ``hash()``, which is salted per process).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ._checks import is_int, is_number
from .errors import describe
from .node import check_seed

# Only the names users import (docs/reference.md); the package's own helpers stay importable.
__all__ = ["Supervisor", "latest_snapshot"]

log = logging.getLogger("mujou_actors")

RESTART_STRATEGIES = ("none", "one_for_one", "one_for_all")
SNAPSHOT_PREFIX = "snapshot-"
SNAPSHOT_SUFFIX = ".mujou"
LATEST = "latest"


def derive_seed(run_seed: int, path: str) -> int:
    """The seed of the node at ``path`` in a run seeded with ``run_seed``.

    Args:
        run_seed (int): ``mujou.run(seed=...)``, in ``[0, 2**64)``.
        path (str): the node's dotted path (``""`` for the root).

    Returns:
        int: a seed in ``[0, 2**63)``; different paths give unrelated seeds.

    Raises:
        TypeError: ``run_seed`` is not an int (a bool or None included).
        ValueError: ``run_seed`` is outside ``[0, 2**64)`` (the check of
            ``Node(seed=)``: a run seed is a seed like any other).
    """
    if check_seed(run_seed, "derive_seed") is None:
        raise TypeError("derive_seed: run_seed must be an int, got None")
    digest = hashlib.blake2b(
        f"{run_seed}\x00{path}".encode(), digest_size=8, person=b"mujou-seed"
    ).digest()
    return int.from_bytes(digest, "little") >> 1


def _seconds(name: str, value: Any, *, allow_none: bool) -> float | None:
    if value is None and allow_none:
        return None
    if not is_number(value):
        raise TypeError(f"Supervisor: {name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"Supervisor: {name} must be a finite number > 0, got {value!r}")
    if round(value * 1e9) < 1:
        raise ValueError(f"Supervisor: {name} must be at least 1 ns, got {value!r}")
    return float(value)


class Supervisor:
    """Snapshots the net's state on a schedule and restarts failed nodes from it.

    Pass it to ``mujou.run(net, supervisor=Supervisor(...))``. It takes the
    first snapshot right after the start (after a restore, if any), then one at
    every multiple of ``snapshot_every`` seconds of the run's timer. Each
    snapshot is a consistent cut: the run pauses only while the state is
    copied in memory; files are written by a background thread (see
    `SnapshotWriter` for its bound), each complete or absent, and ``join``
    returns once they are written (within ``stop_timeout``).

    Args:
        restart (str): what a hook that raises does. ``"none"``: the run
            stops and ``join`` raises ``NodeError``. ``"one_for_one"``: the
            failed node gets ``on_stop``, ``on_start`` and its state from the
            latest snapshot; its schedule goes on (its next update is its next
            regular tick) and the other nodes are untouched. ``"one_for_all"``:
            every node gets ``on_stop``, ``on_start`` and the whole net is
            restored from the latest snapshot, kept and undelivered messages
            included; a simulated timer rewinds to the snapshot's time.
            Default: ``"none"``.
        max_restarts (int): restarts allowed within ``within`` seconds; one
            more escalates: the run stops and ``join`` raises ``NodeError``.
            Default: 3.
        within (float): seconds of the run's timer of that window. Default: 60.
        snapshot_every (float, optional): seconds of the run's timer between
            snapshots; None takes only the first one. In real time a snapshot
            waits at most ``min(snapshot_every, stop_timeout)`` wall seconds
            for the hooks in flight; one that does not return by then makes
            it missed (logged, counted in ``stats().snapshots.missed``) and
            the net goes on. Default: None.
        snapshot_dir (str | os.PathLike, optional): where snapshot files go
            (created if missing); None keeps snapshots in memory only.
        keep (int): snapshot files kept in ``snapshot_dir``: the ones written
            last (an earlier run's files go first, whatever their times); a
            file ``latest`` names the one written last and is replaced
            atomically. Default: 3.

    Raises:
        ValueError: an unknown strategy, ``max_restarts`` < 0, ``keep`` < 1, or
            a time that is not a finite number > 0.
        TypeError: an argument of the wrong type.
    """

    def __init__(
        self,
        restart: str = "none",
        *,
        max_restarts: int = 3,
        within: float = 60.0,
        snapshot_every: float | None = None,
        snapshot_dir: str | os.PathLike[str] | None = None,
        keep: int = 3,
    ) -> None:
        if not isinstance(restart, str):
            raise TypeError(f"Supervisor: restart must be a str, got {restart!r}")
        if restart not in RESTART_STRATEGIES:
            raise ValueError(f"Supervisor: restart must be one of {RESTART_STRATEGIES}, "
                             f"got {restart!r}")
        if not is_int(max_restarts):
            raise TypeError(f"Supervisor: max_restarts must be an int, got {max_restarts!r}")
        if max_restarts < 0:
            raise ValueError(f"Supervisor: max_restarts must be >= 0, got {max_restarts}")
        if not is_int(keep):
            raise TypeError(f"Supervisor: keep must be an int, got {keep!r}")
        if keep < 1:
            raise ValueError(f"Supervisor: keep must be >= 1, got {keep!r}")
        if snapshot_dir is not None and not isinstance(snapshot_dir, (str, os.PathLike)):
            raise TypeError(f"Supervisor: snapshot_dir must be a folder path, got {snapshot_dir!r}")
        if snapshot_dir is not None and os.path.exists(snapshot_dir) and not os.path.isdir(
                snapshot_dir):
            raise ValueError(f"Supervisor: snapshot_dir {os.fspath(snapshot_dir)!r} is a file, "
                             "not a folder")
        self.restart = restart
        self.max_restarts = max_restarts
        self.within = _seconds("within", within, allow_none=False)
        self.snapshot_every = _seconds("snapshot_every", snapshot_every, allow_none=True)
        self.snapshot_dir = None if snapshot_dir is None else os.fspath(snapshot_dir)
        self.keep = keep

    def __repr__(self) -> str:
        return (f"Supervisor(restart={self.restart!r}, max_restarts={self.max_restarts}, "
                f"within={self.within}, snapshot_every={self.snapshot_every}, "
                f"snapshot_dir={self.snapshot_dir!r}, keep={self.keep})")


class RestartIntensity:
    """Counts restarts in a sliding window of the run's time (OTP's intensity)."""

    def __init__(self, max_restarts: int, within_ns: int) -> None:
        self.max_restarts = max_restarts
        self.within_ns = within_ns
        self._times: deque[int] = deque()

    def allow(self, now_ns: int) -> bool:
        """Record a restart at ``now_ns``; False when it would exceed the limit."""
        times = self._times
        while times and times[0] <= now_ns - self.within_ns:
            times.popleft()
        if len(times) >= self.max_restarts:
            return False
        times.append(now_ns)
        return True


class Action(enum.Enum):
    """What the supervisor decides about a node's failure (see `failure_verdict`)."""

    STOP = "stop"  # the run stops with the failure
    RESTART_ONE = "restart_one"  # the failed node restarts from the latest snapshot
    RESTART_ALL = "restart_all"  # the whole net is restored from the latest snapshot


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The supervisor's decision about one failure; the run's coordinator carries it out.

    Attributes:
        action (Action): stop the run, or restart one node or the whole net.
        note (str): with `Action.STOP`, why the supervisor gave up on
            restarting, appended to the failure's message in parentheses;
            ``""`` when there was nothing to give up (no strategy, the run
            ending or not started).
    """

    action: Action
    note: str = ""


def failure_verdict(supervisor: Supervisor, intensity: RestartIntensity, now_ns: int, *,
                    restartable: bool) -> Verdict:
    """Decide what a node's failure does to the run.

    Args:
        supervisor (Supervisor): the run's settings (its ``restart`` strategy).
        intensity (RestartIntensity): the run's restart count; a restart that
            is allowed is recorded in it.
        now_ns (int): the run's time, ns of its timer.
        restartable (bool): False while the run is ending or has not started
            yet (its timer): a failure then always stops it.

    Returns:
        Verdict: `Action.STOP` (with a note when more than ``max_restarts``
        restarts fell within ``within`` seconds), else the strategy's restart.
    """
    strategy = supervisor.restart
    if strategy == "none" or not restartable:
        return Verdict(Action.STOP)
    if not intensity.allow(now_ns):
        return Verdict(Action.STOP, f"the supervisor gave up: more than "
                       f"{supervisor.max_restarts} restarts within {supervisor.within} s")
    if strategy == "one_for_one":
        return Verdict(Action.RESTART_ONE)
    return Verdict(Action.RESTART_ALL)


def snapshot_name(time_ns: int) -> str:
    """File name of the snapshot taken at ``time_ns`` (sorts by time)."""
    return f"{SNAPSHOT_PREFIX}{time_ns:020d}{SNAPSHOT_SUFFIX}"


class SnapshotWriter:
    """Writes snapshot trees to files on a background thread, keeping the newest.

    At most two trees are held: the one being written and one waiting. With
    ``block`` (simulated time) `submit` waits until the previous file is
    written, so every snapshot gets its file and a failed write is known before
    the next snapshot is taken. Without it (real time, where waiting would stall
    the net) a tree that arrives while another one is still waiting replaces it:
    the replaced snapshot gets no file and is counted in `skipped`.

    Pruning keeps the ``keep`` files written last: this writer's files in the
    order it wrote them, after the files it found in the folder (oldest
    modification first), so files of an earlier run never push out a new one,
    whatever their times.

    Args:
        folder (str): the snapshot folder (created if missing).
        keep (int): how many snapshot files to keep.
        save (Callable): writes one tree atomically (``mujou.save``); may raise.
        on_error (Callable): called once, on the writer thread, with the first
            exception a write raises; no file is written after it.
        check (Callable, optional): called by `submit` with each tree; raises
            (``TypeError``) for a tree that a file would not restore as it is.
        block (bool): `submit` waits for the previous write (see above).
        cancelled (Callable, optional): True once the run is ending; ends
            `submit`'s wait (the tree then waits as without ``block``).
    """

    def __init__(self, folder: str, keep: int, save: Callable[[Any, str], None],
                 on_error: Callable[[BaseException], None], *,
                 check: Callable[[dict[str, Any]], None] | None = None, block: bool = False,
                 cancelled: Callable[[], bool] | None = None) -> None:
        os.makedirs(folder, exist_ok=True)
        for name in os.listdir(folder):
            # A writer killed mid-write leaves its temporary file behind; only
            # snapshot writers write here, and none of them is running yet.
            if name.startswith(".") and name.endswith(".tmp"):
                os.remove(os.path.join(folder, name))
        self.folder = folder
        self.keep = keep
        self._save = save
        self._on_error = on_error
        self._check = check
        self._block = block
        self._cancelled = cancelled or (lambda: False)
        self._cond = threading.Condition()
        self._waiting: dict[str, Any] | None = None  # the tree next in line
        self._writing: str | None = None  # the file being written
        self._closing = False
        self._failed = False
        self._written: dict[str, None] = {}  # this writer's files, in write order
        self.skipped = 0
        self.write_seconds: list[float] = []
        self._thread = threading.Thread(target=self._loop, name="mujou-snapshots", daemon=True)
        self._thread.start()

    def submit(self, tree: dict[str, Any]) -> None:
        """Queue a tree (already a private copy) for writing.

        Args:
            tree (dict): the snapshot's tree.

        Raises:
            TypeError: ``check`` refused the tree; the message names the file.
        """
        if self._check is not None:
            try:
                self._check(tree)
            except TypeError as exc:
                raise TypeError(f"cannot write the snapshot file "
                                f"{self._path(tree)}: {exc}") from exc
        with self._cond:
            while self._block and (self._waiting is not None or self._writing is not None) \
                    and not self._failed and not self._cancelled():
                self._cond.wait(0.05)  # polls cancelled(): the run's end needs no notify here
            if self._failed:
                return  # reported already; no file is written after a failure
            if self._waiting is not None:
                self.skipped += 1
                if self.skipped & (self.skipped - 1) == 0:  # 1, 2, 4, 8...: no log flood
                    log.warning("snapshot at t=%.6f s skipped: the writer is still busy with "
                                "earlier ones (%d skipped so far)",
                                self._waiting["time_ns"] / 1e9, self.skipped)
            self._waiting = tree
            self._cond.notify_all()

    def close(self, timeout: float | None = None) -> None:
        """Write the tree still waiting, if any, then stop the thread.

        Args:
            timeout (float, optional): seconds to wait for the writes; None waits
                as long as they take. When they take longer, ``on_error`` gets
                a ``TimeoutError`` naming the file (which is then written or not
                at all, never half: ``latest`` still names a complete file).
        """
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._cond:
                late = self._writing or "?"
                self._failed = True
            err = TimeoutError(f"the snapshot file {os.path.join(self.folder, late)} was still "
                               f"being written {timeout} s after the run stopped")
            log.error("%s", err, extra={"mujou_failure": True})
            self._on_error(err)

    def _path(self, tree: dict[str, Any]) -> str:
        return os.path.join(self.folder, snapshot_name(tree["time_ns"]))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._waiting is None and not self._closing:
                    self._cond.wait()
                tree, self._waiting = self._waiting, None
                if tree is None:
                    return
                self._writing = snapshot_name(tree["time_ns"])
            try:
                self._write(tree)
            except BaseException as exc:  # noqa: BLE001 - reported to the run, once
                # One line: join() raises the error itself (marked for front ends).
                log.error("writing a snapshot to %s failed: %s", self.folder, describe(exc),
                          extra={"mujou_failure": True})
                try:
                    self._on_error(exc)  # first: a submit waiting for this file then finds
                finally:                 # the run stopping when it lets the net go on
                    with self._cond:
                        self._failed = True
                        self._waiting = None
                        self._writing = None
                        self._cond.notify_all()
                return
            with self._cond:
                self._writing = None
                self._cond.notify_all()

    def _write(self, tree: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        name = snapshot_name(tree["time_ns"])
        self._save(tree, os.path.join(self.folder, name))
        self._written.pop(name, None)  # a rewound run writes a time again: now the newest
        self._written[name] = None
        write_pointer(self.folder, name)
        self._prune()
        took = time.perf_counter() - t0
        self.write_seconds.append(took)
        log.info("snapshot at t=%.6f s written to %s in %.3f s",
                 tree["time_ns"] / 1e9, name, took)

    def _prune(self) -> None:
        """Delete all but the ``keep`` files written last (see the class docstring)."""
        found = [n for n in os.listdir(self.folder)
                 if n.startswith(SNAPSHOT_PREFIX) and n.endswith(SNAPSHOT_SUFFIX)]
        others = sorted((n for n in found if n not in self._written),
                        key=lambda n: (_mtime_ns(os.path.join(self.folder, n)), n))
        present = set(found)
        mine = [n for n in self._written if n in present]
        for name in (others + mine)[:-self.keep]:
            try:
                os.remove(os.path.join(self.folder, name))
            except FileNotFoundError:
                pass  # removed meanwhile by someone else: the goal is met
            self._written.pop(name, None)


def _mtime_ns(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return 0


def write_pointer(folder: str, name: str) -> None:
    """Replace the ``latest`` file atomically with the newest snapshot's name."""
    tmp = os.path.join(folder, f".{LATEST}.tmp")
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(folder, LATEST))
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def latest_snapshot(folder: str | os.PathLike[str]) -> str:
    """The path of the newest snapshot in a supervisor's ``snapshot_dir``.

    Raises:
        FileNotFoundError: the folder holds no ``latest`` pointer, or it names
            a file that is not a snapshot of this folder or does not exist.
    """
    folder = os.fspath(folder)
    with open(os.path.join(folder, LATEST)) as f:
        name = f.read().strip()
    if os.path.basename(name) != name or not name.startswith(SNAPSHOT_PREFIX):
        raise FileNotFoundError(f"{folder}/{LATEST} names {name!r}, not a snapshot of this folder")
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{folder}/{LATEST} names {name}, which does not exist")
    return path
