"""The deadline monitor: a real-time update still running at its deadline is caught then.

A `actor.DeadlineGuard` measures an update as it returns, so a hook that
blocks would show no miss until it returns, however late. In real time the
guard of a node with a deadline therefore publishes each update's deadline
as the update starts (`DeadlineGuard.until_ns`), and one monitor per run (its
dispatcher's, `Dispatcher.deadlines`) watches those deadlines on a thread of
its own (``mujou-deadlines``). The thread sleeps until the earliest deadline
it knows of; a guard whose update is due by an earlier time wakes it as the
update starts (`DeadlineGuard.__call__`). Awake, it asks each guard to catch
its update if it is still running past its deadline (`DeadlineGuard.overdue`):
the miss is counted, traced and logged then, within the thread's wakeup
latency of the deadline, and ``on_miss="stop"`` stops the run while the hook
still runs. The rest of a policy waits for the hook to return.

Cost: the thread starts only when some node declares a deadline in a
real-time run (`start`); a run without one, and every simulated run, has
none, and a node without a deadline pays nothing. With one, the thread wakes
about once per update of such a node (at its deadline, whether or not the
update returned by then: nodes of one period share the wakeups), and once
more for an update due earlier than the monitor expected (a triggered one).
It holds no lock while it waits, and each wait is bounded (`IDLE_S`); it
ends with the run (`stop`, from `Dispatcher.shutdown`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .actor import NEVER

if TYPE_CHECKING:
    from ..timers import Timer
    from .actor import Actor, DeadlineGuard

__all__ = ["DeadlineMonitor", "IDLE_S"]

log = logging.getLogger("mujou_actors")

IDLE_S = 1.0
"""The longest wait of the monitor's thread, in wall seconds: with no deadline ahead
it looks again this often (an update that starts wakes it anyway)."""


class DeadlineMonitor:
    """Catches the watched updates still running at their deadline (see the module).

    Args:
        timer (Timer): the run's timer (real time: ns of the monotonic clock).
        fail (Callable[[Actor, str, BaseException], None]): fails a node as a
            hook's exception does (`Dispatcher._fail`): ``on_miss="stop"``.
    """

    def __init__(self, timer: Timer, fail: Callable[[Actor, str, BaseException], None]) -> None:
        self._timer = timer
        self._fail = fail
        self._guards: list[DeadlineGuard] = []
        self._poked = threading.Event()
        # The time (ns of the timer) the thread waits until; NEVER while it looks
        # (so that an update starting meanwhile wakes it). One list, shared with
        # every guard: a guard reads it as its update starts.
        self._wake = [NEVER]
        self._ended = False
        self._thread: threading.Thread | None = None

    @property
    def watching(self) -> bool:
        """bool: the monitor's thread was started (some guard is watched)."""
        return self._thread is not None

    def add(self, guard: DeadlineGuard) -> None:
        """Watch ``guard``'s updates (`actor.guard_deadlines`, before `start`)."""
        self._guards.append(guard)
        guard.watched(self._wake, self._poked.set, self._fail)

    def start(self) -> None:
        """Start the thread, if there is any guard to watch (`Dispatcher.start_threads`)."""
        if self._guards and self._thread is None and not self._ended:
            self._thread = threading.Thread(target=self._watch, name="mujou-deadlines",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """End the thread at once (`Dispatcher.shutdown`): a hook still running is not caught."""
        self._ended = True
        self._poked.set()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` wall seconds for the thread to end (after `stop`)."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def look(self, now_ns: int) -> int:
        """Catch every watched update running past its deadline at ``now_ns``.

        Returns:
            int: the time (ns of the timer) to look again: the earliest
            deadline ahead (`DeadlineGuard.overdue`), `NEVER` for none.
        """
        soonest = NEVER
        for guard in self._guards:
            try:
                at = guard.overdue(now_ns)
            except Exception as exc:  # noqa: BLE001 - a trace or a log that failed: go on
                log.error("the deadline monitor could not handle node %r's miss",
                          guard.actor.path or "<root>", exc_info=exc)
                continue
            soonest = min(soonest, at)
        return soonest

    def _watch(self) -> None:
        """The thread: look, then sleep until the earliest deadline, until `stop`."""
        timer, poked, wake = self._timer, self._poked, self._wake
        while not self._ended:
            poked.clear()
            wake[0] = NEVER  # an update that starts while we look wakes the wait below
            soonest = self.look(timer.now_ns())
            wake[0] = soonest
            poked.wait(min(IDLE_S, max(0.0, (soonest - timer.now_ns()) / 1e9)))
