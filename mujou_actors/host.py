"""The host's side of a run's messages: subscriptions, waiters and the ``mujou-host`` thread.

A hook's ``send`` (and the host's ``write``) hands each message to the
listeners of its port on the sending thread. For the host, a listener only
puts the message into a bounded queue, so a slow callback or predicate can
neither slow the net down nor make memory grow without bound:

* each subscription has its own queue of at most ``depth`` messages; its
  callback runs on the run's one ``mujou-host`` thread, which takes the
  oldest message of all subscriptions first (so callbacks see the messages in
  the order they were sent);
* each `Run.wait_for` has its own queue of at most ``depth`` messages, read by
  the waiting thread.

A full queue drops its oldest message, counts it, and logs once per queue.
When the run ends, the thread delivers what is queued for at most
``stop_timeout`` seconds; what is left then is counted as undelivered and
logged. The counts are kept per port for the run's statistics
(`Host.stats`), those of cancelled subscriptions and returned waiters
included. Nothing here knows about nodes or the dispatcher.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ._checks import is_int
from .errors import NotRunningError
from .stats import SubscriptionStats

# Only the names users import (docs/reference.md); the package's own helpers stay importable.
__all__ = ["Subscription"]

log = logging.getLogger("mujou_actors")

# The default bound of each subscription's and each waiter's queue, in
# messages: a second of slack for a 1 kHz port, 40 MiB for 40 KiB messages.
HOST_QUEUE_DEPTH = 1024

LINGER = 0.001
"""Wall seconds the host thread lets messages gather after a wakeup, before it delivers.

While it lingers, senders queue without waking it, so that a sender that floods a
watched port pays one wakeup (a system call and a GIL hand-off, 10 us or more of its
CPU) per millisecond, not one per message: a callback runs up to 1 ms later than its
message was sent when the thread was idle (benchmarks/view.py: a watched tensor port
cost its sender 14 us a send without it)."""


def check_depth(what: str, depth: Any) -> int:
    """``depth`` as a queue bound, or a TypeError / ValueError naming ``what``."""
    if not is_int(depth):
        raise TypeError(f"{what}: depth must be an int >= 1, got {depth!r}")
    if depth < 1:
        raise ValueError(f"{what}: depth must be an int >= 1, got {depth!r}")
    return depth


class Subscription:
    """A subscription made by `Run.subscribe`; calling it cancels it.

    Its callback gets the port's messages in the order they were sent, from a
    queue of at most `depth` messages: when the callback falls that far
    behind, the oldest waiting message is dropped (and counted in `dropped`).
    A callback that raises is cancelled: it is not called again. The counts
    are also summed per port in ``run.stats().subscriptions``
    (`SubscriptionStats`), where they stay after a cancel.

    Attributes:
        port (str): the dotted path of the port subscribed to.
        depth (int): the most messages waiting for the callback.
    """

    __slots__ = ("port", "depth", "callback", "_items", "_dropped", "_delivered",
                 "_undelivered", "_active", "_host", "detach")

    def __init__(self, host: Host, port: str, callback: Callable[[Any], None],
                 depth: int) -> None:
        self.port = port
        self.depth = depth
        self.callback = callback
        self._host = host
        self._items: deque[tuple[int, Any]] = deque()  # (send order, message)
        self._dropped = 0
        self._delivered = 0
        self._undelivered = 0
        self._active = True
        self.detach: Callable[[], None] | None = None  # from the run's _listen

    @property
    def dropped(self) -> int:
        """int: messages dropped because `depth` messages were already waiting."""
        return self._dropped

    @property
    def delivered(self) -> int:
        """int: calls of the callback so far (those that raised included)."""
        return self._delivered

    @property
    def undelivered(self) -> int:
        """int: messages still waiting when the run ended and ``stop_timeout`` ran out."""
        return self._undelivered

    @property
    def active(self) -> bool:
        """bool: True until cancelled, or until the run has delivered its last message."""
        return self._active

    def cancel(self) -> None:
        """End the subscription: no later call of the callback; idempotent.

        Messages still waiting for the callback are discarded (not counted as
        drops). A callback in progress is not interrupted.
        """
        detach, self.detach = self.detach, None
        if detach is not None:
            detach()
        self._host.remove(self)

    def __call__(self) -> None:
        """Cancel the subscription (see `cancel`)."""
        self.cancel()

    def put(self, message: Any) -> None:
        """Queue a message for the callback (called on the sending thread)."""
        host = self._host
        with host.lock:  # the plain lock: entered in C, as a send's cost
            if not self._active:
                return
            items = self._items
            first = False
            if len(items) >= self.depth:
                items.popleft()
                self._dropped += 1
                first = self._dropped == 1
            items.append((next(host.order), message))
            if host.idle:  # a notify only when the thread waits
                host.cond.notify()
        if first:
            log.warning("the subscriber of %r falls behind its messages: dropping the oldest "
                        "beyond depth=%d (counted in Subscription.dropped)", self.port, self.depth)

    def __repr__(self) -> str:
        state = "active" if self._active else "ended"
        return (f"<Subscription {self.port!r} {state} delivered={self._delivered} "
                f"dropped={self._dropped}>")


class Waiter:
    """The bounded queue of one `Run.wait_for` on ``port``, read by the waiting thread."""

    __slots__ = ("port", "what", "depth", "cond", "items", "dropped", "closed")

    def __init__(self, port: str, what: str, depth: int) -> None:
        self.port = port
        self.what = what
        self.depth = depth
        self.cond = threading.Condition(threading.Lock())
        self.items: deque[Any] = deque()
        self.dropped = 0
        self.closed = False

    def put(self, message: Any) -> None:
        """Queue a message for the waiter (called on the sending thread)."""
        with self.cond:
            items = self.items
            first = False
            if len(items) >= self.depth:
                items.popleft()
                self.dropped += 1
                first = self.dropped == 1
            items.append(message)
            self.cond.notify()
        if first:
            log.warning("%s falls behind its messages: dropping the oldest beyond depth=%d",
                        self.what, self.depth)

    def close(self) -> None:
        """The run has ended: wake the waiter once the queue is empty."""
        with self.cond:
            self.closed = True
            self.cond.notify()

    def get(self, deadline: float | None) -> tuple[bool, Any]:
        """The oldest message, waiting until ``deadline`` (monotonic seconds).

        Returns:
            ``(True, message)``, or ``(False, None)`` when the deadline passed.

        Raises:
            NotRunningError: the run has ended and nothing is left.
        """
        with self.cond:
            while not self.items:
                if self.closed:
                    raise NotRunningError(f"{self.what}: the run ended without a match"
                                          + self.drops_note())
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False, None
                self.cond.wait(left)
            return True, self.items.popleft()

    def drops_note(self) -> str:
        """A note for an error message: how many messages were dropped unseen."""
        if not self.dropped:
            return ""
        return (f" ({self.dropped} message(s) were dropped unseen: the predicate fell "
                f"behind by more than depth={self.depth})")


class _Totals:
    """A port's counts of the subscriptions and waiters that have left the host."""

    __slots__ = ("subscriptions", "delivered", "dropped", "undelivered", "waits",
                 "wait_dropped")

    def __init__(self) -> None:
        self.subscriptions = self.delivered = self.dropped = self.undelivered = 0
        self.waits = self.wait_dropped = 0


class Host:
    """The subscriptions and waiters of one run, and its ``mujou-host`` thread.

    Args:
        copy: makes the host's private copy of a message (before each call).
        on_error: called on the host thread with the subscription and the
            exception when a callback raised (any ``BaseException``).
    """

    def __init__(self, copy: Callable[[Any], Any],
                 on_error: Callable[[Subscription, BaseException], None]) -> None:
        self._copy = copy
        self._on_error = on_error
        self.lock = threading.Lock()  # guards everything below and the subscriptions' queues
        self.cond = threading.Condition(self.lock)
        self.idle = False  # the thread waits on cond for a message
        self.order = itertools.count()  # send order across subscriptions (under the lock)
        self._subs: list[Subscription] = []
        self._waiters: list[Waiter] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self._deadline: float | None = None  # set at the end: deliver until then
        # Per port: the counts of the subscriptions and waiters no longer in
        # the lists above (folded in as they leave, so memory stays bounded
        # by the ports, whatever the number of subscribe/cancel calls).
        self._totals: dict[str, _Totals] = {}

    @property
    def thread(self) -> threading.Thread | None:
        """threading.Thread | None: the ``mujou-host`` thread, once one was started."""
        return self._thread

    def on_thread(self) -> bool:
        """True on the ``mujou-host`` thread (inside a subscriber callback)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def subscribe(self, port: str, callback: Callable[[Any], None], depth: int) -> Subscription:
        """A new subscription; starts the thread with the first.

        Raises:
            NotRunningError: the run has ended (no message will ever come).
        """
        with self.lock:
            if self._closed:
                raise NotRunningError(f"subscribe({port!r}): the run has ended")
            sub = Subscription(self, port, callback, depth)
            self._subs.append(sub)
            self._total(port).subscriptions += 1
            if self._thread is None:
                # Started under the lock, so that close() either sees it or
                # refuses it: no thread is ever started after the end.
                thread = threading.Thread(target=self._loop, name="mujou-host", daemon=True)
                thread.start()
                self._thread = thread
        return sub

    def add_waiter(self, waiter: Waiter) -> None:
        """Register a waiter, closed at the end.

        Raises:
            NotRunningError: the run has ended.
        """
        with self.lock:
            if self._closed:
                raise NotRunningError(f"{waiter.what}: the run ended without a match")
            self._waiters.append(waiter)
            self._total(waiter.port).waits += 1

    def remove_waiter(self, waiter: Waiter) -> None:
        """Forget a waiter that has returned (its drops stay in `stats`)."""
        with self.lock:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
                # Detached already, so no later message is queued here (a send
                # racing with the detach may still count a drop, of no one's).
                self._total(waiter.port).wait_dropped += waiter.dropped

    def remove(self, sub: Subscription) -> None:
        """Forget a cancelled subscription and what waits for it (its counts stay in `stats`)."""
        with self.lock:
            sub._active = False
            sub._items.clear()
            if sub in self._subs:
                self._subs.remove(sub)
                self._fold(sub)

    def _total(self, port: str) -> _Totals:
        """The counts of ``port`` (lock held)."""
        total = self._totals.get(port)
        if total is None:
            total = self._totals[port] = _Totals()
        return total

    def _fold(self, sub: Subscription) -> None:
        """Add the counts of a subscription that leaves ``_subs`` to its port's (lock held)."""
        total = self._total(sub.port)
        total.delivered += sub._delivered
        total.dropped += sub._dropped
        total.undelivered += sub._undelivered

    def stats(self) -> dict[str, SubscriptionStats]:
        """The counts of every port subscribed to or waited on, by port path.

        Returns:
            dict[str, SubscriptionStats]: for each port, the sums over its
            subscriptions and waiters so far, live and gone.
        """
        with self.lock:
            sums = {port: [t.delivered, t.dropped, t.undelivered, t.wait_dropped]
                    for port, t in self._totals.items()}
            for sub in self._subs:
                row = sums[sub.port]
                row[0] += sub._delivered
                row[1] += sub._dropped
                row[2] += sub._undelivered
            waiters = list(self._waiters)
            made = {port: (t.subscriptions, t.waits) for port, t in self._totals.items()}
        for waiter in waiters:  # read without the host's lock: a put takes only the waiter's
            sums[waiter.port][3] += waiter.dropped
        return {port: SubscriptionStats(
                    port=port, subscriptions=made[port][0], delivered=row[0], dropped=row[1],
                    undelivered=row[2], waits=made[port][1], wait_dropped=row[3])
                for port, row in sums.items()}

    def close(self, timeout: float) -> None:
        """The run has ended: deliver what is queued for at most ``timeout`` s.

        Refuses later subscriptions and waiters, wakes the waiters, then waits
        for the thread. Messages still queued after ``timeout`` are discarded
        and counted in each subscription's `Subscription.undelivered`; a
        callback still running then is left behind on its daemon thread.
        Both are logged. Idempotent: a second call does nothing.
        """
        with self.lock:
            if self._closed:
                return
            self._closed = True
            self._deadline = time.monotonic() + timeout
            thread = self._thread
            waiters = list(self._waiters)
            self.cond.notify_all()
        for waiter in waiters:
            waiter.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self.lock:
            self._deadline = time.monotonic()  # a callback in progress is the last
            left = self._discard_undelivered()
            self.cond.notify_all()
        if thread is not None and thread.is_alive():
            log.error("a subscriber callback was still running when stop_timeout (%s s) ran "
                      "out; the stop does not wait for it (its thread, mujou-host, is a daemon "
                      "thread and calls no further callback)", timeout)
        if left:
            log.warning("%s message(s) were not delivered to subscribers: the callbacks were "
                        "still behind when stop_timeout (%s s) ran out (counted in "
                        "Subscription.undelivered)", left, timeout)

    def _discard_undelivered(self) -> int:
        """Count and drop every queued message (lock held); returns how many."""
        total = 0
        for sub in self._subs:
            n = len(sub._items)
            if n:
                sub._undelivered += n
                total += n
                sub._items.clear()
            sub._active = False
            self._fold(sub)
        self._subs.clear()
        return total

    def _next(self) -> tuple[Subscription, Any] | None:
        """The oldest queued message of all subscriptions, waiting for one (lock held).

        None once the run has ended and the queues are empty, or its time for
        delivery is over.
        """
        while True:
            deadline = self._deadline
            if deadline is not None and time.monotonic() >= deadline:
                self._discard_undelivered()
                return None
            subs = self._subs
            if len(subs) == 1:  # the common case: no order to merge
                best = subs[0] if subs[0]._items else None
            else:
                best = None
                for sub in subs:
                    if sub._items and (best is None or sub._items[0][0] < best._items[0][0]):
                        best = sub
            if best is not None:
                # Counted here, under the lock, so that a cancel() racing with
                # the call folds a count that already includes it.
                best._delivered += 1
                return best, best._items.popleft()[1]
            if self._closed:
                return None
            self.idle = True
            try:
                self.cond.wait(None if deadline is None else deadline - time.monotonic())
            finally:
                self.idle = False
            if not self._closed:  # see LINGER; a close() still wakes it at once
                self.cond.wait(LINGER if deadline is None
                               else min(LINGER, max(deadline - time.monotonic(), 0.0)))

    def _loop(self) -> None:
        lock, take, copy = self.lock, self._next, self._copy
        while True:
            with lock:
                item = take()
            if item is None:
                return
            sub, message = item
            try:
                sub.callback(copy(message))
            except BaseException as exc:  # noqa: BLE001 - every failure is reported
                try:
                    # Called no more: one report per broken callback, and the
                    # others are not held up by its failures until the end.
                    sub.cancel()
                    self._on_error(sub, exc)
                except BaseException:  # noqa: BLE001 - the thread goes on delivering
                    log.exception("reporting a subscriber's failure failed")
