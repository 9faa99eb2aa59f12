"""The run's timers: real time (monotonic clock) and simulated time.

Both count integer nanoseconds since the run's time origin, so schedules are
exact (``k * period_ns``) and never drift. The dispatcher asks a timer two
things: what time it is, and how long to sleep until a due time.
"""

from __future__ import annotations

import logging
import time

# Nothing here is for users to import: a run picks its timer by name (timer="realtime").
__all__: list[str] = []

log = logging.getLogger("mujou_actors")

class Timer:
    """Base class: a clock in integer nanoseconds of the run's time."""

    simulated: bool = False

    def start(self, at_ns: int = 0) -> None:
        """Start counting at ``at_ns`` nanoseconds (a restored run starts later than 0)."""
        raise NotImplementedError

    def now_ns(self) -> int:
        """The current time of the run in nanoseconds."""
        raise NotImplementedError


class RealtimeTimer(Timer):
    """Wall-clock time from ``time.monotonic_ns``, immune to system clock changes."""

    simulated = False

    def __init__(self) -> None:
        self._origin: int | None = None

    def start(self, at_ns: int = 0) -> None:
        self._origin = time.monotonic_ns() - at_ns

    def now_ns(self) -> int:
        origin = self._origin
        return 0 if origin is None else time.monotonic_ns() - origin


class SimulatedTimer(Timer):
    """Simulated time: it stands still while work is due and jumps to the next due time.

    Only the dispatcher moves it (``advance_to``), once all work due earlier has
    finished, which is what makes a simulated run deterministic.
    """

    simulated = True

    def __init__(self) -> None:
        self._now = 0

    def start(self, at_ns: int = 0) -> None:
        self._now = at_ns

    def now_ns(self) -> int:
        return self._now

    def advance_to(self, t_ns: int) -> None:
        """Move time forward to ``t_ns`` (never backward)."""
        if t_ns > self._now:
            self._now = t_ns

    def rewind_to(self, t_ns: int) -> None:
        """Set time back to ``t_ns``: only for restoring the whole net from a snapshot."""
        self._now = t_ns


def make_timer(kind: str) -> Timer:
    """Build the timer named by ``mujou.run(timer=...)``.

    Raises:
        ValueError: ``kind`` is neither ``"realtime"`` nor ``"simulated"``.
    """
    if kind == "realtime":
        return RealtimeTimer()
    if kind == "simulated":
        return SimulatedTimer()
    raise ValueError(f"mujou.run: timer must be 'realtime' or 'simulated', got {kind!r}")
