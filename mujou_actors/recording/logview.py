"""The process's log records as Foxglove's ``foxglove.Log``, each with the node that logged it.

The live view's channel ``/mujou/log`` (`foxlog.LOG_TOPIC`) and a recording
made with ``Recording(log=True)`` carry the records that reach the root
logger: the framework's own (``mujou_actors``) and the nodes' code's,
whatever logger they use. A record logged inside a node's hook is named after
the node (its path, as ``run.nodes`` has it) and stamped with the hook's key
(its time on the run's timer); any other is named after its logger and
stamped with the run's time then. What passes is what the loggers let
through (``logging.basicConfig(level=logging.INFO)`` lets a node's ``info``
lines through; the default lets warnings and above through), at or above the
tap's own level.

`LogTap` is the handler: put on the root logger while someone takes its
entries (a live view's watcher, a recording), so a run nobody watches this
way pays nothing. Each record becomes one JSON object of Foxglove's
well-known ``foxglove.Log`` schema (`foxlog.LOG_SCHEMA`), which the Log panel
shows.

A handler on the root logger would stop Python's last resort (the handler
that prints warnings to stderr when no handler is configured anywhere): the
first tap on the root logger prints such a record itself, so that a run's
warnings still reach stderr while it is watched or recorded.

A placed run's group processes log to their own handlers: while a tap is
attached here (`tapped_level` says from which level), they make their
records entries where they were logged (`entry`, in the group: named after
the node, stamped on the group's timer) and the host's driver hands them to
every tap (`forward`; `distributed/grouplog.py`), with how many a group lost
(`forward_lost`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .._runtime.actor import CURRENT
from .foxlog import MAX_MESSAGE_CHARS, level_of, stamp

__all__: list[str] = []  # nothing public: the live view and the recorder use it


def entry(record: logging.LogRecord, now_ns: Callable[[], int]) -> dict[str, Any]:
    """A record as a ``foxglove.Log`` object, named and stamped where it was logged.

    Called on the thread that logged: inside a node's hook, the node's
    context is the current one, and the entry is named after the node and
    stamped with the hook's key (``t_ns``; ``on_start``'s, before the timer: 0).

    Args:
        record (logging.LogRecord): the record.
        now_ns (Callable[[], int]): the run's time (ns), for a record logged
            outside any hook.

    Raises:
        Exception: whatever the record's message formatting raises (`LogTap`
            counts it and drops the record).
    """
    actor = CURRENT.get(None)
    if actor is not None and actor.flight[0] is not None:  # in a hook: its key (Actor.stamp)
        name, t_ns = actor.path, actor.flight[1][0]
    else:
        name, t_ns = (actor.path if actor is not None else record.name), now_ns()
    message = record.getMessage()
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + f"... ({len(message)} characters)"
    return {"timestamp": stamp(t_ns), "level": level_of(record.levelno), "message": message,
            "name": name or "<root>", "file": record.pathname or "", "line": record.lineno or 0}


# The taps attached now, oldest first: replaced as a whole under the lock (never changed
# in place), so `forward` and `tapped_level` read it without one.
_taps: tuple[LogTap, ...] = ()
_taps_lock = threading.Lock()


def tapped_level() -> int | None:
    """The lowest level any tap attached now takes (0: every level); None: no tap."""
    taps = _taps
    return min(t.min_level for t in taps) if taps else None


def forward(levelno: int, entry: dict[str, Any]) -> None:
    """Hand an entry made elsewhere (a group process's: `entry`) to every tap attached.

    Args:
        levelno (int): the record's `logging` level (each tap takes it from its own up).
        entry (dict): the ``foxglove.Log`` object, made where it was logged.
    """
    for tap in _taps:
        tap.take(levelno, entry)


def forward_lost(lost: int, entry: dict[str, Any]) -> None:
    """Tell every tap attached that ``lost`` records made elsewhere were lost on their way,
    with ``entry`` (a warning) saying so."""
    for tap in _taps:
        tap.lose(lost)
        tap.take(logging.WARNING, entry)


def _only_taps(record: logging.LogRecord) -> bool:
    """Whether no handler but taps is on the record's way up (Python's last resort's case)."""
    # The manager's table, not getLogger: that takes logging's module lock, which
    # logging.config takes before a handler's own (held here): the other order.
    found = logging.Logger.manager.loggerDict.get(record.name)
    logger: logging.Logger | None = (found if isinstance(found, logging.Logger)
                                     else logging.getLogger())
    while logger is not None:
        if any(not isinstance(h, LogTap) for h in logger.handlers):
            return False
        logger = logger.parent if logger.propagate else None
    return True


class LogTap(logging.Handler):
    """A handler on the root logger that hands each record to ``deliver`` as a log entry.

    It never raises into the code that logged: a record whose message cannot
    be made, or a ``deliver`` that raises, is dropped and counted (`failed`).

    Args:
        deliver (Callable[[dict], None]): gets each entry (`entry`), on the
            thread that logged; it must not block.
        now_ns (Callable[[], int]): the run's time (ns), which a record logged
            outside a hook is stamped with.
        level (int): the lowest `logging` level taken (what the loggers let
            through below it is left out). Default: every level.
        lost (Callable[[int], None] | None): told how many records made
            elsewhere were lost on their way (`forward_lost`). Default: None.
    """

    def __init__(self, deliver: Callable[[dict[str, Any]], None],
                 now_ns: Callable[[], int], level: int = logging.NOTSET,
                 lost: Callable[[int], None] | None = None) -> None:
        # The handler's own level stays NOTSET: it sees every record, so that the first
        # tap can stand in for the last resort (see the module's docstring).
        super().__init__(logging.NOTSET)
        self._deliver = deliver
        self._now_ns = now_ns
        self._lost = lost
        self.min_level = level
        self._attached = False
        self._guard = threading.Lock()
        self.failed = 0

    def emit(self, record: logging.LogRecord) -> None:
        """Hand one record on (the `logging` machinery calls this)."""
        resort = logging.lastResort
        if resort is not None and record.levelno >= resort.level and self._first() \
                and _only_taps(record):
            resort.handle(record)
        if record.levelno < self.min_level:
            return
        try:
            self._deliver(entry(record, self._now_ns))
        except Exception:  # noqa: BLE001 - a view of the log never fails what logged
            self.failed += 1

    def take(self, levelno: int, entry: dict[str, Any]) -> None:
        """Hand on an entry made elsewhere (`forward`), from the tap's level up; never raises."""
        if levelno < self.min_level:
            return
        try:
            self._deliver(entry)
        except Exception:  # noqa: BLE001 - a view of the log never fails what forwarded
            self.failed += 1

    def lose(self, lost: int) -> None:
        """Count ``lost`` records made elsewhere and lost on their way (`forward_lost`)."""
        if self._lost is not None:
            try:
                self._lost(lost)
            except Exception:  # noqa: BLE001 - as take
                self.failed += 1

    def _first(self) -> bool:
        """Whether this is the first tap on the root logger (the one that stands in)."""
        for handler in logging.getLogger().handlers:
            if isinstance(handler, LogTap):
                return handler is self
        return False

    def attach(self) -> None:
        """Put the handler on the root logger (once); `forward` hands it entries from now."""
        global _taps
        with self._guard:
            if not self._attached:
                logging.getLogger().addHandler(self)
                self._attached = True
                with _taps_lock:
                    _taps = (*_taps, self)

    def cancel(self) -> None:
        """Take the handler off the root logger; idempotent (as a subscription's cancel)."""
        global _taps
        with self._guard:
            if self._attached:
                with _taps_lock:
                    _taps = tuple(t for t in _taps if t is not self)
                logging.getLogger().removeHandler(self)
                self._attached = False
