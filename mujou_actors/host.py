"""The host's side of a run: the `Run` API, and subscriptions, waiters, the ``mujou-host`` thread.

`Run` is the host's API of every run, whatever its placement: one process
(`run.LocalRun`) or groups of nodes in several processes or machines
(`distributed.placed_run.PlacedRun`). It states the contract both keep; the
rest of this module is what carries a run's messages to the host.

A hook's ``send`` (and the host's ``write``) hands each message to the
listeners of its port on the sending thread. For the host, a listener only
puts the message into a bounded queue, so a slow callback or predicate can
neither slow the net down nor make memory grow without bound:

* each subscription has its own queue of at most ``depth`` messages; its
  callback runs on the run's one ``mujou-host`` thread, which takes the
  oldest message of all subscriptions first (so callbacks see the messages in
  the order they were sent);
* each `Run.wait_for` has its own queue of at most ``depth`` messages, read by
  the waiting thread;
* each `Run.watch` has its own queue of at most ``depth`` messages that wakes
  nothing: its consumer takes it on its own schedule (`Watch.take`).

A full queue drops its oldest message and counts it (a subscription's and a
waiter's log it once; a watch's drops are its consumer's to show).
When the run ends, the thread delivers what is queued for at most
``stop_timeout`` seconds; what is left then is counted as undelivered and
logged. The counts are kept per port for the run's statistics
(`Host.stats`), those of cancelled subscriptions and returned waiters
included. Nothing here knows about nodes or the dispatcher.
"""

from __future__ import annotations

import abc
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from ._checks import is_int
from .errors import NotRunningError
from .node import Node
from .ports import Input, Port
from .stats import RunStats, SubscriptionStats

# Only the names users import (docs/reference.md); the package's own helpers stay importable.
__all__ = ["Run", "Subscription", "Watch"]

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


class Run(abc.ABC):
    """A started run of a net, wherever its nodes run; made by `mujou.run`, not directly.

    The same API for a run in this process and for a placed run (``mujou.run(
    factory, placement=...)``, docs/processes.md): ``isinstance(run, mujou.Run)``
    holds for both. Use it as a context manager (leaving the block stops the
    run and raises a node's failure) or call `join`. Ports are given as
    objects or by dotted path (``"ctrl.setpoint"``). A call that would wait
    for the run's end from a thread the end waits for (a hook, a subscriber
    callback) is refused with a `RuntimeError`.
    """

    __slots__ = ()

    # -- properties -----------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def seeds(self) -> Mapping[str, int]:
        """Mapping[str, int]: the seed of every node's generator, by path."""

    @property
    def time(self) -> float:
        """float: the run's time in seconds of its timer (frozen once the run has ended).

        A placed run's is the latest time any group has reached.
        """
        return self.time_ns / 1e9

    @property
    @abc.abstractmethod
    def time_ns(self) -> int:
        """int: `time` in integer nanoseconds of the run's timer."""

    @property
    @abc.abstractmethod
    def start_time(self) -> float:
        """float: the time the run started at, seconds of its timer (a restored run's is > 0)."""

    @property
    @abc.abstractmethod
    def nodes(self) -> Mapping[str, Node]:
        """Mapping[str, Node]: every node of the run by dotted path, parents first.

        In a placed run only the host's group runs in this process; the other
        nodes are the copies the host built to check the net (read their state
        with `read` and `state_dict`).
        """

    @property
    @abc.abstractmethod
    def ports(self) -> Mapping[str, Port]:
        """Mapping[str, Port]: every port of the net by dotted path (``"ctrl.setpoint"``).

        The port objects of `nodes`: in a placed run, of the host's copies.
        """

    @property
    @abc.abstractmethod
    def groups(self) -> Mapping[str, list[str]]:
        """Mapping[str, list[str]]: each group's node paths, by group name.

        The host's own group is ``"host"``; a run in one process has that group only.
        """

    @property
    @abc.abstractmethod
    def failure(self) -> BaseException | None:
        """BaseException | None: what `join` raises (the first failure, or stuck
        nodes at the stop), None for a run that did not fail; final once ended."""

    @property
    @abc.abstractmethod
    def running(self) -> bool:
        """bool: True until the run has ended."""

    # -- waiting and ending -----------------------------------------------------------------
    @abc.abstractmethod
    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the end without raising its failure (see `join` for that).

        Args:
            timeout (float, optional): wall seconds; None waits for the end.

        Returns:
            bool: True when the run has ended.

        Raises:
            RuntimeError: called from inside a hook or a subscriber callback
                (the end waits for those to return; check `running` instead).
        """

    @abc.abstractmethod
    def stop(self) -> None:
        """End the run; idempotent.

        From the host it returns once every node's ``on_stop`` has run: hooks
        in flight finish first, for at most ``stop_timeout`` seconds; nodes
        still stuck then are reported (logged, and raised by `join` as
        `StopTimeoutError`, naming node and hook, and in a placed run the
        group) and left behind. From inside a hook (or a subscriber callback)
        it only asks the run to end, so it never deadlocks.
        """

    @abc.abstractmethod
    def join(self, timeout: float | None = None) -> None:
        """Wait for the run to end; raise what made it fail.

        Args:
            timeout (float, optional): wall seconds to wait; None waits for the end.

        Raises:
            NodeError: a hook raised (the node's path and hook in the message,
                the original exception as ``__cause__``; from another process, a
                `RemoteTraceback`).
            GroupDied: a placed run's group process died.
            CallbackError: a subscriber callback raised.
            StopTimeoutError: nodes were stuck in a hook when the run stopped.
            TimeoutError: the run has not ended within ``timeout``.
            RuntimeError: called from inside a hook or a subscriber callback
                (it would wait for itself; use `stop`).
        """

    @abc.abstractmethod
    def _raise_unreported(self) -> None:
        """Raise the run's failure, once ended, unless `join` already reported it."""

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop()
        # Raise the run's failure unless the block already raised, or join()
        # already reported it to the caller.
        if exc_type is None:
            self._raise_unreported()

    # -- ports ------------------------------------------------------------------------------
    @abc.abstractmethod
    def read(self, port: Port | str) -> Any:
        """The newest message of a port, as a copy for the host.

        Args:
            port (Port | str): an Output (the newest message sent on it) or an
                Input (its newest kept message), or its dotted path.

        Returns:
            A copy of the message, or ``None`` before the first. In one
            process it works after the run has ended too; the copy of a CUDA
            message is made once its GPU work is done (a sent message's ready
            event, the receiving work of a CUDA node's Input).

        Raises:
            ValueError: no such port in this run.
            NotRunningError: a placed run has ended (its groups are gone:
                read the final `state_dict` instead).
        """

    @abc.abstractmethod
    def write(self, port: Input | str, value: Any) -> None:
        """Deliver ``value`` to an Input as the host; writes to one Input arrive in order.

        Args:
            port (Input | str): the Input, or its dotted path.
            value: the message, checked against the Input's type and copied.

        Raises:
            PortTypeError: the value does not match the Input's type.
            ValueError / TypeError: no such Input in this run.
            NotRunningError: the run has ended.
        """

    # -- parameters -------------------------------------------------------------------------
    @abc.abstractmethod
    def set_param(self, path: str, value: Any) -> tuple[int, int]:
        """Set a node's parameter (`mujou.Param`) on the running net.

        The value is checked now; the node applies it at its next delta cycle:
        its first update at or after the key returned, just before that
        update's ``on_update``, calling ``on_param(name, old, new)`` first.
        In simulated time the key is the run's next delta cycle, so the
        update that applies it does not depend on the workers; in real time
        it is now. A recorded run keeps the set (and a replay applies it at
        the same update); a state tree taken before it is applied holds it
        (``params``). Sets to one node apply in the order they were made.

        Args:
            path (str): the node's path and the parameter's name,
                ``"sensor.noise"`` (a root node's: ``"noise"``).
            value (bool | int | float | str): the new value.

        Returns:
            tuple[int, int]: ``(t_ns, delta)``, the key the set applies from
            (``(-1, 0)``: before the timer starts, at the node's first update).

        Raises:
            ParamError: no such parameter (the message lists them), a read-only
                one, or a value of the wrong type, outside the range or not
                among the choices; nothing changes.
            NotRunningError: the run has ended.
        """

    @abc.abstractmethod
    def params(self) -> dict[str, Any]:
        """Every parameter of the net and its value now (sets not yet applied excluded).

        Returns:
            dict[str, bool | int | float | str]: by dotted path (``"sensor.noise"``).

        Raises:
            NotRunningError: a placed run has ended (its groups are gone).
        """

    @abc.abstractmethod
    def describe_params(self) -> dict[str, dict[str, Any]]:
        """Every parameter's declaration and value now: what ``mujou param list`` shows.

        Returns:
            dict[str, dict]: by dotted path, ``{"type", "default", "range",
            "choices", "description", "read_only", "value"}`` (JSON-ready).

        Raises:
            NotRunningError: a placed run has ended.
        """

    @abc.abstractmethod
    def subscribe(self, port: Port | str, callback: Callable[..., None], *,
                  depth: int = HOST_QUEUE_DEPTH, with_time: bool = False) -> Subscription:
        """Call ``callback(message)`` for every later message of a port.

        Callbacks run in send order on the thread ``mujou-host`` (never on a
        worker), each with a copy of the message, up to 1 ms after the send
        when that thread was idle (it lets messages gather: `host.LINGER`).
        Each subscription queues at most ``depth`` messages for its callback;
        when the callback falls further behind, the oldest is dropped and
        counted (`Subscription.dropped` and ``stats().subscriptions``, logged
        once). A callback that raises (whatever it raises) stops the run;
        `join` raises `CallbackError`. The
        other subscriptions are served until the end. When the run ends, what
        is queued is delivered for at most ``stop_timeout`` seconds, the rest
        counted in `Subscription.undelivered`.

        Args:
            port (Port | str): an Output (every message sent on it) or an
                Input (every message delivered to it), or its dotted path.
            callback: called with one argument.
            depth (int): the most messages waiting for this callback, >= 1.
                Default: `HOST_QUEUE_DEPTH` (1024).
            with_time (bool): call ``callback(t_ns, message)`` instead, ``t_ns``
                the send's time on the run's timer (ns: the time of the hook
                that sent it, -1 for a send of ``on_start`` before the timer
                started; for a host's write to an Input, the run's time when
                it was written): what a recording stores as the message's log
                time. Default: False.

        Returns:
            Subscription: call it (or its ``cancel()``) to cancel the
            subscription; it counts the calls and the dropped messages.

        Raises:
            ValueError / TypeError: no such port in this run, a callback that
                is not callable, a bad ``depth``, a ``with_time`` not a bool.
            NotRunningError: the run has ended.
        """

    @abc.abstractmethod
    def watch(self, port: Port | str, *, depth: int = HOST_QUEUE_DEPTH,
              with_time: bool = False, messages: bool = True) -> Watch:
        """Keep the later messages of a port in a bounded queue that the caller takes.

        A watch wakes nothing: for each message the sending thread (a worker,
        or a placed run's driver as it routes the message) appends a
        reference to the watch's queue and counts it, without a copy, a lock
        or a notify (well under 1 us; docs/performance.md, "Watching a
        running net"). The caller takes the queue when it likes with
        `Watch.take` (a GUI at 30 Hz, ``mujou echo``'s endpoint and the live
        Foxglove view every 20 ms),
        which makes the copies then, on the calling thread: a CUDA message is
        copied once its GPU work is done, as `read` does. When more than
        ``depth`` messages wait, the oldest is dropped and counted
        (`Watch.dropped`, ``stats().subscriptions``): a consumer that cannot
        keep up loses messages on its own side and never slows the net.
        What is queued when the run ends can still be taken; `Watch.cancel`
        ends the watch. Unlike `subscribe`, this may be called from inside a
        hook in a run of one process (it never waits); a placed run attaches
        it through its driver, so there it is refused from inside a hook.

        Args:
            port (Port | str): an Output (every message sent on it) or an
                Input (every message delivered to it: what its Outputs send
                and what the host writes), or its dotted path.
            depth (int): the most messages the queue holds, >= 1 (its memory
                is at most ``depth`` messages of the port). Default:
                `HOST_QUEUE_DEPTH` (1024).
            with_time (bool): `Watch.take` returns ``(t_ns, message)`` pairs,
                ``t_ns`` the send's time on the run's timer in ns (as
                `subscribe`'s ``with_time``: -1 for ``on_start``'s sends, the
                run's time for a host write). Default: False.
            messages (bool): False keeps only the send times, not the
                messages (``with_time=True`` required): `Watch.take` returns
                the ``t_ns`` ints, and nothing is copied (``mujou hz``).
                Default: True.

        Returns:
            Watch: the queue's handle (``take``, ``dropped``, ``cancel``);
            thread-safe.

        Raises:
            ValueError / TypeError: no such port in this run, a bad ``depth``,
                ``with_time`` or ``messages`` not a bool, ``messages=False``
                without ``with_time=True``.
            NotRunningError: the run has ended.
            RuntimeError: a placed run's, called from inside a hook or a
                subscriber callback.
        """

    @abc.abstractmethod
    def wait_for(self, port: Port | str, predicate: Callable[[Any], bool] | None = None,
                 timeout: float | None = None, *, depth: int = HOST_QUEUE_DEPTH) -> Any:
        """Wait for the first message of a port, sent after this call, that matches.

        Args:
            port (Port | str): an Output or Input, or its dotted path.
            predicate: tried on every message in order (on the calling
                thread); None matches the first message.
            timeout (float, optional): wall seconds.
            depth (int): the most messages waiting for the predicate, >= 1;
                when it falls further behind, the oldest is dropped unseen
                (logged once, counted in ``stats().subscriptions``).
                Default: `HOST_QUEUE_DEPTH` (1024).

        Returns:
            A copy of the matching message.

        Raises:
            TimeoutError: no match within ``timeout``.
            NotRunningError: the run ended before a match.
            RuntimeError: called from inside a hook or a subscriber callback
                (the run's end waits for those).
        """

    # -- state and statistics -------------------------------------------------------------
    @abc.abstractmethod
    def state_dict(self, timeout: float | None = None) -> dict[str, Any]:
        """The state tree of the whole net, taken at a consistent cut.

        The run pauses while the state is copied: no hook is in flight, so no
        message is half delivered. With the simulated timer the cut falls
        between two instants (in a placed run, the same cut in every group).
        Works after the end too (the final state; a simulated run's
        ``time_ns`` is then its end time). A call waiting for its cut when the
        run ends returns the final state.

        Args:
            timeout (float, optional): wall seconds to wait for the cut (a
                hook that does not return keeps it from coming); None waits
                until the hooks in flight return or the run ends.

        Returns:
            dict: ``{"format", "time_ns", "seeds", "nodes", "inputs", "pending",
            "schedule"}``, and ``"sync"`` for a net with synchronizers (see
            docs/state.md), every tensor a CPU copy.

        Raises:
            TimeoutError: no cut within ``timeout``; names the nodes still in
                a hook and the hook. The run goes on as if not asked. After
                the end: another thread's call, taking the final state (one
                at a time), did not return within ``timeout``.
            NodeError: a node's ``state_dict()`` raised (hook ``"state_dict"``,
                the node's path, the original exception as ``__cause__``), or,
                after the end, a node is still stuck in a hook. The run goes on.
            ValueError / TypeError: ``timeout`` is not a number >= 0 or None.
            TypeError: a node's ``state_dict()`` holds a value a tree cannot
                (names the node and the key), raised as is.
            RuntimeError: called from inside a hook, or from a subscriber
                callback once the run is ending (the final state comes only
                once the end, which waits for the callbacks, is done).
        """

    @abc.abstractmethod
    def stats(self) -> RunStats:
        """The statistics of nodes, workers, snapshots and subscribers: a frozen `RunStats`.

        Counts and ``dt`` cover the whole run; the lateness percentiles only
        each node's newest 256 updates. ``subscriptions`` has the host's
        deliveries and drops for each port subscribed to or waited on; a
        placed run adds each group's and machine's figures (``groups``,
        ``machines``). Cheap enough to call a few times a second while the
        run goes on.
        """


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


def check_watch(what: str, with_time: Any, messages: Any) -> None:
    """A watch's ``with_time`` and ``messages``, or a TypeError / ValueError naming ``what``."""
    for name, value in (("with_time", with_time), ("messages", messages)):
        if type(value) is not bool:
            raise TypeError(f"{what}: {name} must be a bool, got {value!r}")
    if not messages and not with_time:
        raise ValueError(f"{what}: messages=False keeps only the send times: "
                         f"give with_time=True")


class Watch:
    """A watch made by `Run.watch`: a port's later messages in a bounded queue, taken by the caller.

    The sending thread only appends each message (a reference) to the queue
    and counts it: no lock, no copy, no wakeup. `take` empties the queue and
    copies what it returns on the calling thread. When `depth` messages wait,
    the next one pushes the oldest out: it is counted in `dropped` (and summed
    per port in ``run.stats().subscriptions``, where the count stays after a
    cancel). Every method may be called from any thread, by several at once.

    Attributes:
        port (str): the dotted path of the port watched.
        depth (int): the most messages the queue holds.
        with_time (bool): `take` returns ``(t_ns, message)`` pairs.
        messages (bool): False: `take` returns only the send times (ints).
    """

    __slots__ = ("port", "depth", "with_time", "messages", "_items", "_put", "_count",
                 "_reads", "_taken", "_dropped", "_active", "_lock", "_copy", "_view",
                 "_host", "detach")

    def __init__(self, host: Host, port: str, depth: int, with_time: bool, messages: bool,
                 copy: Callable[[Any], Any], view: Callable[[Any], Any] | None = None) -> None:
        self.port = port
        self.depth = depth
        self.with_time = with_time
        self.messages = messages
        self._host = host
        # The queue: a full deque drops its oldest itself as the new one comes, so
        # the sender's append is one call in C, atomic under the GIL (no lock).
        self._items: deque[Any] = deque(maxlen=depth)
        # What the run's listeners call for each message, on the sending thread:
        # ``_put(item)`` then ``_count()`` (see `_settle` for how drops are counted).
        self._put = self._items.append
        self._count = itertools.count().__next__
        self._reads = 0  # calls of _count made by _settle, not by a message
        self._taken = 0
        self._dropped = 0
        self._active = True
        self._lock = threading.Lock()  # the consumers' (take, dropped, cancel), never a sender's
        self._copy = copy  # the host's private copy of a message (Run.read's)
        self._view = view  # take(copy=False): the message as the host sees it; None: as sent
        self.detach: Callable[[], None] | None = None  # set by the run: takes the listeners off

    def _settle(self) -> int:
        """Count the drops so far (lock held); returns `dropped`.

        A message is counted after it is appended, and the count is read
        before the queue's length, so ``counted - taken - queued`` is never
        more than the drops (a message appended and not yet counted makes it
        one less for a moment): the highest value seen is kept.
        """
        counted = self._count() - self._reads  # this very call advances the count too
        self._reads += 1
        dropped = counted - self._taken - len(self._items)
        if dropped > self._dropped:
            self._dropped = dropped
        return self._dropped

    def take(self, *, copy: bool = True) -> list[Any]:
        """Every message queued now, oldest first; the queue is left empty.

        Args:
            copy (bool): True: each message is the host's own copy (as
                `Run.read` makes it: a CUDA message copied to the CPU once its
                GPU work is done), free to change. False: the message as it
                was sent, shared with the net's readers (read it, never change
                it): no copy for a message in host memory, a CUDA one still
                brought to the CPU once its GPU work is done. Default: True.

        Returns:
            list: the messages; ``(t_ns, message)`` pairs with ``with_time``;
            the ``t_ns`` ints with ``messages=False``. Empty once cancelled.
        """
        with self._lock:
            if not self._active:
                return []
            items = self._items
            pop = items.popleft
            # Only the consumers pop, one at a time: the length read first is there to
            # pop, whatever the senders append (or push out) meanwhile.
            got = [pop() for _ in range(len(items))]
            self._taken += len(got)
            self._settle()
        if not self.messages or not got:
            return got
        make = self._copy if copy else self._view
        if make is None:
            return got
        if self.with_time:
            return [(t_ns, make(message)) for t_ns, message in got]
        return [make(message) for message in got]

    @property
    def dropped(self) -> int:
        """int: messages pushed out of the full queue before they were taken, so far."""
        with self._lock:
            return self._settle() if self._active else self._dropped

    @property
    def taken(self) -> int:
        """int: messages `take` has returned so far."""
        return self._taken

    @property
    def pending(self) -> int:
        """int: messages in the queue now (at most `depth`)."""
        return len(self._items) if self._active else 0

    @property
    def active(self) -> bool:
        """bool: True until cancelled (the run's end does not end it: the queue stays to take)."""
        return self._active

    def cancel(self) -> None:
        """End the watch: no later message is queued, what is queued is discarded; idempotent.

        The counts (`taken`, `dropped`) stay as they are, and in
        ``run.stats().subscriptions``.
        """
        detach, self.detach = self.detach, None
        if detach is not None:
            detach()
        with self._lock:
            if not self._active:
                return
            self._settle()
            self._active = False
            self._items.clear()
        self._host.remove_watch(self)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cancel()

    def __repr__(self) -> str:
        state = "active" if self._active else "cancelled"
        return (f"<Watch {self.port!r} {state} pending={self.pending} taken={self._taken} "
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
                 "wait_dropped", "watches", "watch_taken", "watch_dropped")

    def __init__(self) -> None:
        self.subscriptions = self.delivered = self.dropped = self.undelivered = 0
        self.waits = self.wait_dropped = 0
        self.watches = self.watch_taken = self.watch_dropped = 0


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
        self._watches: list[Watch] = []
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

    def add_watch(self, watch: Watch) -> None:
        """Register a watch, for `stats` (nothing of the host's thread serves it).

        Raises:
            NotRunningError: the run has ended.
        """
        with self.lock:
            if self._closed:
                raise NotRunningError(f"watch({watch.port!r}): the run has ended")
            self._watches.append(watch)
            self._total(watch.port).watches += 1

    def remove_watch(self, watch: Watch) -> None:
        """Forget a cancelled watch (its counts, final now, stay in `stats`)."""
        with self.lock:
            if watch in self._watches:
                self._watches.remove(watch)
                total = self._total(watch.port)
                total.watch_taken += watch.taken
                total.watch_dropped += watch._dropped

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
            sums = {port: [t.delivered, t.dropped, t.undelivered, t.wait_dropped,
                           t.watch_taken, t.watch_dropped]
                    for port, t in self._totals.items()}
            for sub in self._subs:
                row = sums[sub.port]
                row[0] += sub._delivered
                row[1] += sub._dropped
                row[2] += sub._undelivered
            waiters = list(self._waiters)
            watches = list(self._watches)
            made = {port: (t.subscriptions, t.waits, t.watches)
                    for port, t in self._totals.items()}
        for waiter in waiters:  # read without the host's lock: a put takes only the waiter's
            sums[waiter.port][3] += waiter.dropped
        for watch in watches:  # each under its own lock (a watch cancelled meanwhile: its last)
            dropped = watch.dropped
            sums[watch.port][4] += watch.taken
            sums[watch.port][5] += dropped
        return {port: SubscriptionStats(
                    port=port, subscriptions=made[port][0], delivered=row[0], dropped=row[1],
                    undelivered=row[2], waits=made[port][1], wait_dropped=row[3],
                    watches=made[port][2], watch_taken=row[4], watch_dropped=row[5])
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
