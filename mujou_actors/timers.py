"""The run's timers: real time (monotonic clock) and simulated time.

Both count integer nanoseconds since the run's time origin, so schedules are
exact (``k * period_ns``) and never drift. The dispatcher asks a timer two
things: what time it is, and how long to sleep until a due time.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import time

# Nothing here is for users to import: a run picks its timer by name (timer="realtime").
__all__: list[str] = []

log = logging.getLogger("mujou_actors")

PR_SET_TIMERSLACK = 29  # linux/prctl.h


def tight_timer_slack() -> bool:
    """Ask Linux to wake the calling thread on time: 1 ns of timer slack.

    By default the kernel may delay a sleeping thread's wake-up by up to
    50 µs (the thread's *timer slack*, ``prctl(PR_SET_TIMERSLACK)``, see
    prctl(2)) so as to batch wake-ups. The real-time timer's worker and
    dedicated threads ask for 1 ns instead, which takes that 50 µs off the
    lateness of every tick without any busy waiting. The setting belongs to
    the calling thread only.

    Returns:
        bool: True if the kernel accepted it; False elsewhere than Linux or
        when the call fails (the thread then keeps the default slack).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0) == 0
    except (OSError, AttributeError) as exc:  # no libc symbol: keep the default
        log.debug("timer slack unchanged: %s", exc)
        return False


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

    def seconds_until(self, due_ns: int) -> float:
        """Seconds to sleep until ``due_ns`` (<= 0 when due)."""
        return (due_ns - self.now_ns()) / 1e9


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
    raise ValueError(f"timer must be 'realtime' or 'simulated', got {kind!r}")
