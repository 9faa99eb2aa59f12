"""The supervisor's snapshots of one run: when they are due, what was missed, what was kept.

`Snapshots` is the coordinator's record of its periodic snapshots: the grid
of ``snapshot_every`` (in simulated time a cut the dispatcher holds at,
`Dispatcher.hold_at`; in real time a time the coordinator wakes up for, then
a deadline for the net to reach a cut), the snapshots missed (a hook did not
return within the bound) and their logging, the latest tree (what a restart
restores), the pauses, and the background writer of the files. The
coordinator takes the trees (at a cut) and calls it; it holds no lock and
starts no thread but the writer's, and every method is the coordinator
thread's alone, but `stats`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..stats import SnapshotStats
from ..supervisor import SnapshotWriter, Supervisor
from ..timers import Timer
from .actor import Actor
from .cuts import why_no_cut

__all__ = ["Snapshots"]

log = logging.getLogger("mujou_actors")


class Snapshots:
    """The periodic snapshots of one run, their misses, the latest tree and the files.

    Args:
        supervisor: the run's snapshot settings (``snapshot_every``,
            ``snapshot_dir``, ``keep``, ``restart``).
        actors: every actor of the run (a miss remembers the busy ones' hooks).
        timer: the run's timer (the grid is in its nanoseconds).
        stop_timeout: wall seconds; a periodic snapshot waits at most this for a cut.
        hold_at: the dispatcher's `hold_at`, how a simulated run schedules a cut.
        simulated: the run's timer is simulated (cuts are the dispatcher's),
            else real time (the coordinator wakes at the grid's times).
        wake: makes the coordinator recompute its timeout (a new time to wake at).
    """

    def __init__(self, supervisor: Supervisor, actors: list[Actor], timer: Timer, *,
                 stop_timeout: float, hold_at: Callable[[int], None], simulated: bool,
                 wake: Callable[[], None]) -> None:
        self._supervisor = supervisor
        self._by_path = {a.path: a for a in actors}
        self._timer = timer
        self._stop_timeout = stop_timeout
        self._hold_at = hold_at
        self._simulated = simulated
        self._wake = wake
        self.latest: dict[str, Any] | None = None  # the last tree kept (a restart's)
        self._writer: SnapshotWriter | None = None
        self._pauses: list[float] = []
        # Real time: the next time of the grid (timer ns), and once it has come,
        # the monotonic deadline for the net to reach a cut.
        self._next_ns: int | None = None
        self._deadline: float | None = None
        # Periodic snapshots that could not be taken (a hook did not return
        # within the bound), and the hooks of the last miss: while the same
        # hook invocations are still running, later ones are missed at once
        # rather than holding the net again.
        self._missed = 0
        self._missing: dict[Actor, tuple[int, str | None]] = {}
        # A miss was logged: the next snapshot taken logs that they resume.
        # Not _missing, which is emptied as soon as those hooks return, before
        # the next snapshot is even tried.
        self._resume_due = False

    @property
    def wanted(self) -> bool:
        """bool: the run takes snapshots at all (for restarts, on a grid, or to files)."""
        sup = self._supervisor
        return sup.restart != "none" or sup.snapshot_every is not None or bool(sup.snapshot_dir)

    def open_writer(self, save: Callable[[Any, str], None],
                    check: Callable[[dict[str, Any]], None],
                    on_error: Callable[[BaseException], None],
                    cancelled: Callable[[], bool]) -> None:
        """Start the writer of ``snapshot_dir``'s files, if the supervisor has one.

        Simulated time waits for each file (every snapshot gets one, a failure
        stops the run before the next); real time skips a snapshot rather than
        stall the net.

        Args:
            save: writes one tree to a file (``mujou.save``).
            check: raises for a tree that a file would not restore as it is.
            on_error: called once with the first failed write (the run fails).
            cancelled: True once the run is ending (ends a blocked submit).
        """
        sup = self._supervisor
        if sup.snapshot_dir is not None:
            self._writer = SnapshotWriter(sup.snapshot_dir, sup.keep, save, on_error=on_error,
                                          check=check, block=self._simulated,
                                          cancelled=cancelled)

    def keep(self, tree: dict[str, Any], pause: float) -> None:
        """Keep a snapshot just taken (the net held for ``pause`` wall seconds); file it."""
        self._pauses.append(pause)
        self.latest = tree
        if self._writer is not None:
            self._writer.submit(tree)

    def bound(self) -> float:
        """Wall seconds a periodic snapshot waits for the net to reach a cut."""
        every = self._supervisor.snapshot_every
        return self._stop_timeout if every is None else min(every, self._stop_timeout)

    def schedule(self, now_ns: int) -> int | None:
        """Schedule the next periodic snapshot after ``now_ns``, on its grid.

        Returns:
            int | None: its time (ns of the timer); None without ``snapshot_every``.
        """
        every = self._supervisor.snapshot_every
        if every is None:
            return None
        every_ns = round(every * 1e9)
        nxt = (now_ns // every_ns + 1) * every_ns
        if self._simulated:
            self._hold_at(nxt)
        else:
            self._next_ns = nxt
            self._wake()  # the coordinator recomputes its timeout
        return nxt

    # -- real time: the grid's times and the deadline ----------------------------------
    @property
    def next_ns(self) -> int | None:
        """int | None: real time: the next time of the grid not come yet (timer ns)."""
        return self._next_ns

    @property
    def deadline(self) -> float | None:
        """float | None: real time: until when (``time.monotonic()``) a due one waits."""
        return self._deadline

    def come(self, now_ns: int) -> None:
        """Real time: act on the grid's time if it has come at ``now_ns``.

        A snapshot then waits for a cut until its deadline, unless the hooks of
        the last miss are still running: then it is missed at once, without
        holding the net again.
        """
        if self._next_ns is None or now_ns < self._next_ns:
            return
        self._next_ns = None
        still = {a.path: str(h) for a, (n, h) in self._missing.items()
                 if a.busy and a.updates == n and a.hook == h}
        if still:  # the hooks of the last miss are still running: no hold
            self.miss(still, 0.0)
        else:
            self._missing = {}
            self._deadline = time.monotonic() + self.bound()

    def late(self, now: float) -> bool:
        """Whether the due snapshot's deadline has passed at ``now`` (``time.monotonic()``)."""
        return self._deadline is not None and now >= self._deadline

    def give_up(self, busy: Mapping[str, str]) -> None:
        """The due snapshot found no cut by its deadline: it is missed."""
        self._deadline = None
        self.miss(busy, self.bound())

    # -- at a cut -------------------------------------------------------------------------
    def due_at_cut(self, scheduled: bool) -> bool:
        """Whether a periodic snapshot is due at this cut (its wish is then taken).

        Args:
            scheduled: the hold is the cut the dispatcher was told to hold at.
        """
        due = scheduled or self._deadline is not None
        self._deadline = None
        return due

    def restarted(self) -> None:
        """A restore reschedules the snapshots from its time: the due one goes."""
        self._deadline = None

    def taken(self) -> None:
        """A periodic snapshot was kept: log that they resume after misses; the next one."""
        self._missing = {}
        if self._resume_due:
            self._resume_due = False
            log.info("snapshots resume at t=%.6f s", self._timer.now_ns() / 1e9)
        self.schedule(self._timer.now_ns())

    def miss(self, busy: Mapping[str, str], bound: float) -> None:
        """Count a periodic snapshot that could not be taken; the next multiple tries again.

        Args:
            busy: the hooks in the way, by node path.
            bound: the wall seconds it waited for a cut (0: it did not wait).
        """
        self._missed += 1
        self._resume_due = True
        first = not self._missing
        self._missing = {a: (a.updates, a.hook) for a in
                         (self._by_path[p] for p in busy if p in self._by_path)}
        at = self._timer.now_ns()
        nxt = self.schedule(at)
        level = logging.WARNING if first else logging.DEBUG
        log.log(level, "snapshot missed at t=%.6f s: %s; the net goes on%s",
                at / 1e9,
                why_no_cut(busy) if bound == 0.0 else
                f"no consistent cut within {bound:g} s; {why_no_cut(busy)}",
                "" if nxt is None else f", next try at t={nxt / 1e9:.6f} s")

    # -- the end and the stats ------------------------------------------------------------
    def close(self, timeout: float) -> None:
        """Let the writer finish, within ``timeout`` wall seconds: each file complete or absent."""
        if self._writer is not None:
            self._writer.close(timeout)

    def stats(self) -> SnapshotStats:
        """The snapshots so far: pauses, files, skipped and missed ones."""
        pauses = list(self._pauses)
        writer = self._writer
        writes = list(writer.write_seconds) if writer is not None else []
        return SnapshotStats(
            count=len(pauses), pause_mean=sum(pauses) / len(pauses) if pauses else 0.0,
            pause_max=max(pauses, default=0.0),
            write_mean=sum(writes) / len(writes) if writes else 0.0, files=len(writes),
            skipped=writer.skipped if writer is not None else 0,
            missed=self._missed)
