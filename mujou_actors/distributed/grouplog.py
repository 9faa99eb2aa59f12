"""A placed run's log records made in its group processes, forwarded to the host's taps.

In one process, `recording.logview.LogTap` on the root logger sees every
record of the run: a recording's (``Recording(log=True)``) and the live
view's (``/mujou/log``). A group process logs to its own handlers (Thespian's
logger, which prints to the host's stderr), so the host's taps would see the
host's records alone. While the host has a tap (`logview.tapped_level`):

* each group process keeps a `GroupLog` on its root logger. It makes every
  record from the taps' lowest level up an entry where it was logged
  (`logview.entry`, on the thread that logged: named after the node whose
  hook runs, stamped with the hook's key on the group's timer, its message
  formatted and cut there), plain data (str and int), and keeps it pending,
  at most `MAX_PENDING` (the newest beyond are dropped and counted: a group
  never waits for the host to log);
* the host's driver (`Forwarding`) takes them with the control request
  `group.Logs`, every `POLL_S` of wall time while a tap is on, before the
  start phase's ``on_start`` (a restart's too) and at the end (after the
  groups' ``on_stop``, before the recording closes), and hands each group's
  entries, in its order, to every tap (`logview.forward`); a loss is one
  warning entry saying how many (`logview.forward_lost`, counted in the
  recording's log stats) and one warning on the host's logger per run.

Why the control plane: its requests reach a group whatever its timing (a
grant or a segment in flight, real time running free) through its control
thread, which is free then, and after its ``on_stop``; the data plane's
replies differ with each timing and none follows ``on_stop``. Why the same
request turns forwarding on and off: a group whose host has no tap has no
handler at all (it pays nothing), and a tap that comes or goes while the run
goes on (a live-view client of ``/mujou/log``) is seen at the next poll, a
restarted group's new process at its start phase, with no message of its own.

The group mirrors the levels of the host's root and ``mujou_actors`` loggers
while it forwards (`MIRRORED`: a group process has Thespian's default, warnings
and up), so that what passes is what the host's loggers let through, as in
one process (``logging.basicConfig(level=logging.INFO)``, ``mujou run
--record-log``); its own levels come back when forwarding stops.

Nothing here loops: a group's handler only appends (Thespian's own records,
the transport's, are never taken), and the host hands entries to the taps,
never to its loggers. A group that dies loses its pending entries alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import GroupDied, describe
from ..recording.foxlog import stamp
from ..recording.logview import entry, forward, forward_lost, tapped_level

__all__ = ["GroupLog", "Forwarding", "MAX_PENDING", "POLL_S", "MIRRORED"]

log = logging.getLogger("mujou_actors")

MAX_PENDING = 1024
"""The most entries a group keeps for the host between two polls (the newest beyond dropped)."""

POLL_S = 0.1
"""Wall seconds between two takes of the groups' entries while a tap is on.

A take is one control request per group (about 2.5 ms on a loaded 2-core machine):
about 2.5 % of the driver's wall time per group while a tap is on, and a group may
log up to `MAX_PENDING` records (about 10,000 a second) between two takes."""

ASK_S = 5.0
"""Wall seconds a group has to answer a take (a group that does not is asked no more
until its next start phase: the driver's loop never waits on it again)."""

MIRRORED = ("", "mujou_actors")
"""The loggers whose levels a forwarding group takes from the host (``""``: the root)."""

Entries = list[tuple[int, dict[str, Any]]]  # (the record's logging level, its entry)


def _text(value: Any) -> str:
    """A str as a plain str (a subclass of user code's would cross pickled as its class)."""
    return value if type(value) is str else str.__str__(value)


def _plain(made: dict[str, Any]) -> dict[str, Any]:
    """`logview.entry`'s object of plain str and int only (it crosses the control plane)."""
    when = made["timestamp"]
    return {"timestamp": {"sec": int(when["sec"]), "nsec": int(when["nsec"])},
            "level": int(made["level"]), "message": _text(made["message"]),
            "name": _text(made["name"]), "file": _text(made["file"]), "line": int(made["line"])}


class GroupLog(logging.Handler):
    """A group process's handler that keeps its records as entries for the host.

    Off (not on any logger) until `configure` gives it a level. Never raises
    into the code that logged: a record whose entry cannot be made is counted
    as dropped.

    Args:
        now_ns (Callable[[], int]): the group's time (ns of the run's timer),
            which a record logged outside any hook is stamped with.
        here (bool): the group runs in the host's process (the tests' control
            plane): the host's taps see its records already, so it never forwards.
    """

    def __init__(self, now_ns: Callable[[], int], here: bool = False) -> None:
        super().__init__(logging.NOTSET)
        self._now_ns = now_ns
        self._here = here
        self._pending: Entries = []
        self._dropped = 0
        self._lock = threading.Lock()  # held for a few statements, never while sending
        self.min_level: int | None = None  # None: off
        self._saved: dict[str, int] = {}  # the mirrored loggers' own levels, while on

    def configure(self, level: int | None, loggers: dict[str, int]) -> None:
        """Forward from ``level`` up, the ``loggers``' levels mirrored; None: stop.

        Called on the control thread (`group.Logs`); idempotent.
        """
        if self._here:
            return
        # Thespian's root logger refuses addHandler (its own forwarder is the process's
        # one handler): the plain Logger's method puts this one beside it.
        root = logging.getLogger()
        if level is None:
            if self.min_level is not None:
                self.min_level = None
                logging.Logger.removeHandler(root, self)
                for name, before in self._saved.items():
                    logging.getLogger(name).setLevel(before)
                self._saved = {}
            return
        for name, mirrored in loggers.items():
            if name not in MIRRORED:
                continue
            logger = logging.getLogger(name)
            self._saved.setdefault(name, logger.level)
            if logger.level != mirrored:
                logger.setLevel(mirrored)
        if self.min_level is None:
            logging.Logger.addHandler(root, self)
        self.min_level = level

    def emit(self, record: logging.LogRecord) -> None:
        """Keep one record as an entry (the `logging` machinery calls this)."""
        level = self.min_level
        if level is None or record.levelno < level or record.name.startswith("Thespian"):
            return
        try:
            item: tuple[int, dict[str, Any]] | None = (
                int(record.levelno), _plain(entry(record, self._now_ns)))
        except Exception:  # noqa: BLE001 - a view of the log never fails what logged
            item = None
        with self._lock:
            if item is not None and len(self._pending) < MAX_PENDING:
                self._pending.append(item)
            else:
                self._dropped += 1

    def take(self) -> tuple[Entries, int]:
        """The entries kept since the last take, oldest first, and how many were dropped."""
        with self._lock:
            taken, self._pending = self._pending, []
            dropped, self._dropped = self._dropped, 0
        return taken, dropped

    def answer(self, level: int | None, loggers: dict[str, int]) -> tuple[Entries, int]:
        """`group.Logs`: `configure`, then `take`."""
        self.configure(level, loggers)
        return self.take()


def wanted() -> tuple[int, dict[str, int]] | None:
    """What the groups forward now: the taps' lowest level and the host's levels of the
    `MIRRORED` loggers; None when no tap is attached."""
    level = tapped_level()
    if level is None:
        return None
    return level, {name: logging.getLogger(name).level for name in MIRRORED}


class Forwarding:
    """The host's side: turns the groups' forwarding on and off, takes their entries.

    Every method runs on the driver's thread (or the start's, before it runs)
    and never raises: a group that cannot answer is asked no more until the
    next start phase (its death is the driver's to find, as always).

    Args:
        driver (driver._Driver): the run's driver: its groups, the dead ones,
            its time (a loss's entry when the group sent none).
    """

    def __init__(self, driver: Any) -> None:
        self._driver = driver
        self._want: tuple[int, dict[str, int]] | None = None
        self._next = 0.0  # monotonic time of the next take while on
        self._on: set[str] = set()  # groups told to forward
        self._silent: set[str] = set()  # groups that did not answer: not asked again
        self._warned = False
        self.lost = 0  # entries the groups lost, all told

    def start(self) -> None:
        """Before the start phase's ``on_start`` (a restart's too): every group told."""
        self._silent.clear()
        self._take(self._set(wanted()))

    def poll(self) -> None:
        """Between two rounds (and in a wait): take the entries every `POLL_S` while a
        tap is on; tell the groups at once when the taps changed. Nothing without a tap."""
        want = wanted()
        if want is None and not self._on:
            return
        if want == self._want and time.monotonic() < self._next:
            return
        self._take(self._set(want))

    def finish(self) -> None:
        """At the end, after the groups' ``on_stop``: their last entries; forwarding off."""
        self._take(self._set(None))

    def _set(self, want: tuple[int, dict[str, int]] | None) -> tuple[int, dict[str, int]] | None:
        self._want = want
        self._next = time.monotonic() + POLL_S
        return want

    def _take(self, want: tuple[int, dict[str, int]] | None) -> None:
        """Tell every group that forwards, or is to, what ``want`` says; hand its entries on."""
        driver = self._driver
        level, loggers = (None, {}) if want is None else want
        for g in list(driver.groups.values()):
            name = g.name
            if not g.remote or name in driver.dead or name in self._silent \
                    or (want is None and name not in self._on):
                continue
            try:
                entries, dropped = g.control.logs(level, loggers, ASK_S)
            except Exception as exc:  # noqa: BLE001 - the log is no reason to stop a run
                self._silent.add(name)
                self._on.discard(name)
                (log.debug if isinstance(exc, GroupDied) else log.warning)(
                    "placed run: group %r gave no log records (%s); its later ones are not "
                    "forwarded", name, describe(exc))
                continue
            if want is None:
                self._on.discard(name)
            else:
                self._on.add(name)
            self._hand_on(name, entries, dropped)

    def _hand_on(self, name: str, entries: Entries, dropped: int) -> None:
        """A group's entries to the host's taps, in its order; then its loss, if any."""
        for levelno, made in entries:
            forward(levelno, made)
        if not dropped:
            return
        self.lost += dropped
        if entries:
            when = entries[-1][1]["timestamp"]
            t_ns = when["sec"] * 1_000_000_000 + when["nsec"]
        else:
            t_ns = self._driver.time_ns
        forward_lost(dropped, {
            "timestamp": stamp(t_ns), "level": 3, "name": "mujou_actors", "file": "", "line": 0,
            "message": f"group {name!r}: {dropped} log record(s) lost (more than "
                       f"{MAX_PENDING} waited for the host)"})
        if not self._warned:
            self._warned = True
            log.warning("placed run: group %r lost %d log record(s): more than %d waited for "
                        "the host; the log's channel says how many each time", name, dropped,
                        MAX_PENDING)
