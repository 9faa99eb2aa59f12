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
    """

    def __init__(self, deliver: Callable[[dict[str, Any]], None],
                 now_ns: Callable[[], int], level: int = logging.NOTSET) -> None:
        # The handler's own level stays NOTSET: it sees every record, so that the first
        # tap can stand in for the last resort (see the module's docstring).
        super().__init__(logging.NOTSET)
        self._deliver = deliver
        self._now_ns = now_ns
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

    def _first(self) -> bool:
        """Whether this is the first tap on the root logger (the one that stands in)."""
        for handler in logging.getLogger().handlers:
            if isinstance(handler, LogTap):
                return handler is self
        return False

    def attach(self) -> None:
        """Put the handler on the root logger (once)."""
        with self._guard:
            if not self._attached:
                logging.getLogger().addHandler(self)
                self._attached = True

    def cancel(self) -> None:
        """Take the handler off the root logger; idempotent (as a subscription's cancel)."""
        with self._guard:
            if self._attached:
                logging.getLogger().removeHandler(self)
                self._attached = False
