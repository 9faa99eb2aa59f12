"""A log record as Foxglove's ``foxglove.Log``: its topic, schema and levels, and one read back.

The live view (`mujou_actors.recording.logview`) and a recording made with
``Recording(log=True)`` carry the run's log records on the channel `LOG_TOPIC`
(``/mujou/log``), each one a JSON object of Foxglove's well-known
``foxglove.Log`` schema (`LOG_SCHEMA`), which Foxglove's Log panel shows:
``timestamp`` (``{"sec", "nsec"}`` on the run's timer), ``level`` (1 debug
... 5 fatal), ``message``, ``name`` (the node's path, else the logger's name),
``file`` and ``line``.

`LogEntry` is such an object read back from a file, checked by `parse_entry`
(a file is untrusted: docs/recording.md, "Untrusted files"). This module
imports nothing of the package: the file format's module and the views share it.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

__all__ = ["LogEntry"]

LOG_TOPIC = "/mujou/log"
"""The topic of the run's log records (the live view's channel, a recording's)."""

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

MAX_ENTRY_BYTES = 64 << 10
"""The most bytes of one log entry's JSON a reader takes from a file (64 KiB).

What the writer makes is far below it: a message of at most `MAX_MESSAGE_CHARS`
characters (6 bytes each at most, escaped), a node's path and a file's."""

LEVEL_NAMES = ("UNKNOWN", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")
"""The name of each of Foxglove's levels, by its number (0 to 5)."""

_NS = 1_000_000_000
_TIME_END = 2**63  # a run's times are int64 nanoseconds (mcapfile.TIME_END)


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


def stamp(t_ns: int) -> dict[str, int]:
    """A time (ns of the run's timer; negative: 0) as Foxglove's ``{"sec", "nsec"}``."""
    t = max(t_ns, 0)
    return {"sec": t // _NS, "nsec": t % _NS}


class LogEntry(NamedTuple):
    """One log record of a recording's ``/mujou/log`` channel (`mcapfile.Reader.logs`).

    Attributes:
        t_ns (int): its time on the run's timer, ns: the key of the hook that
            logged it, else the run's time when it was logged (0 before the
            timer started).
        level (int): Foxglove's level: 1 debug, 2 info, 3 warning, 4 error,
            5 fatal (0 unknown).
        message (str): the record's message (cut at 4096 characters).
        name (str): the path of the node whose hook logged it, else the logger's name.
        file (str): the source file that logged it.
        line (int): its line there.
    """

    t_ns: int
    level: int
    message: str
    name: str
    file: str
    line: int

    @property
    def level_name(self) -> str:
        """str: the level's name, ``"DEBUG"`` to ``"FATAL"`` (``"UNKNOWN"`` for 0)."""
        return LEVEL_NAMES[self.level]

    def to_json(self) -> dict[str, Any]:
        """The entry as the ``foxglove.Log`` JSON object it was read from."""
        return {"timestamp": stamp(self.t_ns), "level": self.level, "message": self.message,
                "name": self.name, "file": self.file, "line": self.line}


def parse_entry(value: Any) -> LogEntry:
    """A ``foxglove.Log`` JSON object (parsed) as a `LogEntry`, checked.

    Keys besides the schema's are ignored, as Foxglove ignores them.

    Args:
        value (Any): the parsed JSON of one log message.

    Returns:
        LogEntry: the entry.

    Raises:
        ValueError: not an object of the schema's fields: ``timestamp`` an
            object of ``sec`` and ``nsec`` (ints, ``nsec`` below 10**9, the time
            below 2**63 ns), ``level`` an int 0 to 5, ``message``, ``name`` and
            ``file`` strs, ``line`` an int in ``[0, 2**32)``; names the field.
    """
    if not isinstance(value, dict):
        raise ValueError(f"a log entry is a JSON object, not a {type(value).__name__}")
    missing = [k for k in LOG_SCHEMA["required"] if k not in value]
    if missing:
        raise ValueError(f"a log entry without {', '.join(missing)}")
    when = value["timestamp"]
    if not (isinstance(when, dict) and type(when.get("sec")) is int
            and type(when.get("nsec")) is int and 0 <= when["nsec"] < _NS
            and 0 <= when["sec"] * _NS + when["nsec"] < _TIME_END):
        raise ValueError("its timestamp is not {sec, nsec} of a time in [0, 2**63) ns")
    level, line = value["level"], value["line"]
    if type(level) is not int or not 0 <= level < len(LEVEL_NAMES):
        raise ValueError(f"its level is not an int 0 to 5: {str(level)[:20]!r}")
    if type(line) is not int or not 0 <= line < 2**32:
        raise ValueError(f"its line is not an int in [0, 2**32): {str(line)[:20]!r}")
    for key in ("message", "name", "file"):
        if type(value[key]) is not str:
            raise ValueError(f"its {key} is not a str")
    return LogEntry(when["sec"] * _NS + when["nsec"], level, value["message"], value["name"],
                    value["file"], line)
