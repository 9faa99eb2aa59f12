"""The process's log records as Foxglove's ``foxglove.Log``, each with the node that logged it.

The live view's channel `LOG_TOPIC` (``/mujou/log``) carries the records that
reach the root logger while a client watches it: the framework's own
(``mujou_actors``) and the nodes' code's, whatever logger they use. A record
logged inside a node's hook is named after the node (its path, as
``run.nodes`` has it), any other after its logger. What passes is what the
loggers let through (``logging.basicConfig(level=logging.INFO)`` lets a node's
``info`` lines through; the default lets warnings and above through).

`LogTap` is the handler: put on the root logger with the first watcher, taken
off with the last, so a run nobody watches this way pays nothing. Each record
becomes one JSON object of Foxglove's well-known ``foxglove.Log`` schema
(`LOG_SCHEMA`), which the Log panel shows.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .._runtime.actor import CURRENT

__all__: list[str] = []  # nothing public: the live view serves it

LOG_TOPIC = "/mujou/log"
"""The topic of the run's log records in the live view."""

LOG_SCHEMA_NAME = "foxglove.Log"

LOG_SCHEMA: dict[str, Any] = {
    "title": LOG_SCHEMA_NAME,
    "description": "A log message (Foxglove's well-known schema)",
    "type": "object",
    "properties": {
        "timestamp": {"type": "object", "properties": {
            "sec": {"type": "integer", "minimum": 0},
            "nsec": {"type": "integer", "minimum": 0}}},
        "level": {"type": "integer", "description": "0 unknown, 1 debug, 2 info, 3 warning, "
                                                   "4 error, 5 fatal"},
        "message": {"type": "string"},
        "name": {"type": "string", "description": "the node's path, else the logger's name"},
        "file": {"type": "string"},
        "line": {"type": "integer", "minimum": 0},
    },
    "required": ["timestamp", "level", "message", "name", "file", "line"],
}
"""The JSON Schema of ``foxglove.Log`` (Foxglove's own fields and level numbers)."""

MAX_MESSAGE_CHARS = 4096
"""The most characters of a record's message a log entry holds (the rest cut, marked)."""


def level_of(levelno: int) -> int:
    """Foxglove's level (1 debug ... 5 fatal) of a `logging` level number."""
    if levelno >= logging.CRITICAL:
        return 5
    if levelno >= logging.ERROR:
        return 4
    if levelno >= logging.WARNING:
        return 3
    if levelno >= logging.INFO:
        return 2
    return 1


def entry(record: logging.LogRecord, t_ns: int) -> dict[str, Any]:
    """A record as a ``foxglove.Log`` object, stamped ``t_ns`` (ns of the run's timer).

    Called where the record is logged: inside a node's hook, the node's
    context is the current one, and the entry is named after the node.

    Raises:
        Exception: whatever the record's message formatting raises (`LogTap`
            counts it and drops the record).
    """
    actor = CURRENT.get(None)
    name = actor.path if actor is not None else record.name
    message = record.getMessage()
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + f"... ({len(message)} characters)"
    t = max(t_ns, 0)
    return {"timestamp": {"sec": t // 1_000_000_000, "nsec": t % 1_000_000_000},
            "level": level_of(record.levelno), "message": message,
            "name": name or "<root>", "file": record.pathname or "", "line": record.lineno or 0}


class LogTap(logging.Handler):
    """A handler on the root logger that hands each record to ``deliver`` as a log entry.

    It never raises into the code that logged: a record whose message cannot
    be made, or a ``deliver`` that raises, is dropped and counted (`failed`).

    Args:
        deliver (Callable[[dict], None]): gets each entry (`entry`), on the
            thread that logged; it must not block.
        now_ns (Callable[[], int]): the run's time (ns) each entry is stamped with.
    """

    def __init__(self, deliver: Callable[[dict[str, Any]], None],
                 now_ns: Callable[[], int]) -> None:
        super().__init__(logging.NOTSET)
        self._deliver = deliver
        self._now_ns = now_ns
        self._attached = False
        self._guard = threading.Lock()
        self.failed = 0

    def emit(self, record: logging.LogRecord) -> None:
        """Hand one record on (the `logging` machinery calls this)."""
        try:
            self._deliver(entry(record, self._now_ns()))
        except Exception:  # noqa: BLE001 - a view of the log never fails what logged
            self.failed += 1

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
