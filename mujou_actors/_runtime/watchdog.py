"""The watchdog: a hook that runs too long is logged, never waited for in silence.

A hook that never returns holds its node, and in simulated time the whole
run (no later instant may start): ``join()`` would wait without a word. The
coordinator's thread looks at the hooks in flight every half ``limit``
(`Watchdog.next_look`, `Watchdog.look`): one still running ``limit`` wall
seconds after it was first seen is logged (a warning naming the node, the
hook and the instant), and again after 2, 4, 8... times ``limit``. A look
takes the dispatcher's lock once; between looks it costs nothing.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .dispatcher import Dispatcher

__all__ = ["Watchdog"]

log = logging.getLogger("mujou_actors")


class _Seen:
    """A hook in flight as the watchdog first saw it, and when it warns next."""

    __slots__ = ("hook", "since", "warn_at", "warned")

    def __init__(self, hook: tuple[str, tuple[int, int], int], since: float,
                 limit: float) -> None:
        self.hook = hook  # (hook name, its key, the node's update count): one call
        self.since = since
        self.warn_at = since + limit
        self.warned = 0


class Watchdog:
    """Logs every hook that runs longer than ``limit`` wall seconds, with back-off.

    Args:
        dispatcher (Dispatcher): the run's dispatcher (`Dispatcher.hooks_in_flight`).
        limit (float): wall seconds, > 0 (the run's ``stop_timeout``).
        where (str): said after the node's path in each warning (a placed run's
            group processes: ``" (in group 'a')"``, `distributed.group.Watcher`).
            Default: ``""``.
    """

    def __init__(self, dispatcher: Dispatcher, limit: float, where: str = "") -> None:
        self._dispatcher = dispatcher
        self._limit = limit
        self._where = where
        self._seen: dict[str, _Seen] = {}
        self._next = time.monotonic() + limit / 2

    def next_look(self) -> float:
        """Wall seconds until the next `look` is due (0: now)."""
        return max(0.0, self._next - time.monotonic())

    def look(self) -> None:
        """Warn of the hooks in flight past their time; forget those that returned."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self._limit / 2
        seen, limit = self._seen, self._limit
        flight = self._dispatcher.hooks_in_flight()
        for path in [p for p in seen if p not in flight or flight[p] != seen[p].hook]:
            del seen[path]  # it returned (another call of it is another hook)
        for path, hook in flight.items():
            entry = seen.get(path)
            if entry is None:
                seen[path] = _Seen(hook, now, limit)
                continue
            if now < entry.warn_at:
                continue
            entry.warned += 1
            entry.warn_at = entry.since + limit * 2 ** entry.warned  # 1, 2, 4, 8... limits
            name, (t, d), _ = hook
            log.warning("node %r%s has been in %s for %.3g s or more (wall), at t = %d ns "
                        "(%g s of the run's timer, delta cycle %d), and has not returned; the "
                        "run waits for it (next report after %.3g s in all)", path or "<root>",
                        self._where, name,
                        now - entry.since, t, t / 1e9, d, entry.warn_at - entry.since)
            self._next = min(self._next, entry.warn_at)
        for entry in seen.values():
            self._next = min(self._next, max(entry.warn_at, now))
