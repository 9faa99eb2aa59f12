"""The actor behind each node: its mailbox, schedule, context and statistics.

An actor runs one hook at a time. The dispatcher decides *when* (and on which
thread); the actor does *what*: apply the deliveries that are due, work out
``dt`` and the tick bookkeeping, call the hook in the node's own
``contextvars.Context`` and record its statistics.

This is the one module that calls the user's code: the hooks (`Actor.run_update`,
`Actor.handle` for ``on_start`` / ``on_stop``), ``state_dict`` (`Actor.take_state`)
and ``load_state_dict`` (`Actor.restore`), each inside the node's own context
and, for a CUDA node, on its streams. Nothing else reaches into a node.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from array import array
from collections.abc import Callable
from itertools import groupby
from typing import TYPE_CHECKING, Any

from ..deadlines import DeadlineMiss
from ..devices import HostCopier, enter_streams, map_tensors, receive
from ..errors import DeadlineMissError, MessageChangedError, NodeError
from ..state import copy_state
from . import readonly
from .keys import ORDER_BITS, SHIFT, Key, SharedKey, unstamp
from .mailbox import MESSAGE, SLOT, Envelope, Mailbox, Restore, Snapshot, Start, Stop, prune_limit

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # pure Python without mypy installed: the decorator does nothing
    def mypyc_attr(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
        """A stand-in for ``mypy_extensions.mypyc_attr``: returns the class as it is."""
        return lambda cls: cls

if TYPE_CHECKING:
    from ..cuda import StreamWaiter
    from ..devices import CudaRuntime
    from ..node import Node
    from ..ports import Input

__all__ = ["Actor", "LATENESS_SAMPLES", "CURRENT", "NEVER", "DeadlineGuard", "guard_deadlines",
           "guard_read_only"]

log = logging.getLogger("mujou_actors")

# The actor whose context the calling code runs in: set in each actor's context
# as the actor is made (Actor.__init__), and its hooks run in it and only they.
# A send checks it (a ContextVar read hits a per-thread cache), so that another
# thread or another node's hook cannot send for the node; a log record of a hook
# is named after it (recording/logview.py).
CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("mujou_actors.current")

# The lateness percentiles in stats() are taken over this many recent updates
# (a power of two). The samples sit in a float32 ring: 1 KiB per node, exact
# to the nanosecond up to 16 ms and to 1e-7 of the value beyond.
LATENESS_SAMPLES = 256
_RING_MASK = LATENESS_SAMPLES - 1

# A mailbox bound that no mailbox reaches.
NEVER = 1 << 62

_clock = time.perf_counter_ns  # bound once: read twice per hook on the hot path

# A budget's clock: the CPU time of the hook's thread, so that a hook kept
# waiting for the GIL or a CPU is not charged for the wait. Looked up at each
# call (tests put a scripted clock here); read only for nodes with a budget or
# a deadline (guard_deadlines).
_cpu_clock = time.thread_time_ns

# After a node's first missed budget or deadline, its misses are logged at
# most once per this many wall seconds (with the count since the last line).
MISS_LOG_S = 10.0


# Subclassed in Python (replay.StandIn): a compiled Actor must allow it.
@mypyc_attr(allow_interpreted_subclasses=True)
class Actor:
    """Runtime record of one node inside one run (not a public class)."""

    # Slots are laid out in this order: what every update reads and writes
    # comes first, so that it shares a few cache lines (with 100,000 nodes,
    # memory traffic is what an update costs beyond the Python code).
    __slots__ = (
        # every update: schedule (guarded by the dispatcher's lock while not
        # busy), the hook in flight, statistics (timed: False turns the timing
        # ones off, see run(stats=)); rt: CUDA, trace: tracing, None without.
        # 23 slots: with the object's header, four cache lines at most.
        "busy", "queued_key", "next_tick_ns", "trigger_key", "flight", "thread_name", "cohort",
        "inputs", "dedicated", "failed", "deferred", "rt", "trace", "timed",
        "update", "node", "context",
        "period_ns", "last_update_ns", "updates", "dt_max_ns", "lateness",
        "hook_ns",
        # read only when there is something for the node (deliveries: a node
        # with Inputs; control: while some control envelope is pending), and
        # the time of a hook run by call() or of an update that raised
        "deliveries", "control", "seq", "last_hook_ns",
        # the mailbox's bound: a send that finds more deliveries than
        # prune_at has it pruned (see prune); prune_at is the bound, or
        # NEVER while a prune is already due (simulated time)
        "prune_at", "bound", "input_depths",
        # dt_sum, kept as spans of last_update_ns (see the property)
        "dt_from_ns", "dt_done_ns",
        # identity and the rest
        "path", "order", "device", "mailbox", "triggers", "started",
        "overruns", "restarts",
        # the latest missed tick a late tick stood for, and that update's number
        # (written only when a tick is a period late: a DeadlineGuard's due)
        "stands_for_ns", "stands_for_update",
        # written by a DeadlineGuard only (0 for a node without budget or deadline)
        "budget_misses", "deadline_misses",
        # CUDA (None for a net that uses no CUDA; see devices.py)
        "stream", "copy_streams", "copy_done", "waiter", "kept_ready",
        # tracing (None for a run without a trace; see trace.py)
        "applied", "depths",
    )

    def __init__(self, node: Node, path: str, order: int,
                 periods: dict[int, int] | None = None) -> None:
        """Make the actor of ``node`` at ``path``, ``order``-th in the net.

        ``periods`` maps each period (ns) to one int object shared by the
        run's actors: with many nodes, reading a shared int stays in cache.
        """
        self.node = node
        # Found once per run: the update reaches neither the node's class nor
        # its __dict__ (replacing on_update on a running node is not
        # supported). A plain method is kept as its function, called with the
        # node: nodes of a class share it, so no bound method per node is
        # read on each update.
        bound = node.on_update
        if getattr(bound, "__self__", None) is node and hasattr(bound, "__func__"):
            self.update = bound.__func__
        else:
            self.update = lambda _node, dt: bound(dt)
        self.path = path
        self.order = order
        self.dedicated: bool = node._mujou_dedicated
        period = node._mujou_period_ns
        if periods is not None and period is not None:
            period = periods.setdefault(period, period)
        self.period_ns: int | None = period
        self.device = node._mujou_device
        self.mailbox = Mailbox()
        # The mailbox's own deque and list, one hop less per update.
        self.deliveries = self.mailbox.deliveries
        self.control = self.mailbox.control
        # A fresh, empty context per node: contextvars set in one node's hooks
        # are seen by its later hooks and by no other node, nor by the host.
        self.context = contextvars.Context()
        # In it, the actor itself: what a send checks (sends.py), and what names a log
        # record of its hooks (recording/logview.py).
        self.context.run(CURRENT.set, self)
        # The node's Inputs: a delivery names its Input by index in this tuple
        # (why an index: see mailbox.Delivery). Set when the run wires the net.
        self.inputs: tuple[Input, ...] = ()
        self.triggers: frozenset[int] = frozenset()  # indices of triggering Inputs
        # Set with the Inputs (bound_mailbox); until then nothing is pruned.
        self.input_depths: tuple[int | None, ...] | None = None
        self.prune_at = self.bound = NEVER
        self.next_tick_ns: int | None = None
        # A `Key | None` field stays a Python object in a compiled build.
        self.trigger_key: Key | None = None
        # Its bucket's key, or None: compared by identity (calendar.py, the liveness
        # rule), hence a SharedKey (keys.py), which no compiled code unboxes.
        self.queued_key: SharedKey = None
        self.busy = False
        # Its period's `calendar.Cohort` in a planned run (Calendar.plan), else None.
        # Any: the calendar, above this module, types it where it reads it.
        self.cohort: Any = None
        # [hook, stamp] of the hook in flight (the properties below): a list,
        # because the sends (Python, sends.py) read both for every message,
        # and from Python bytecode an item of a list is read three times as
        # fast as a field of a compiled class (through its C descriptor).
        # The kernel's per-update writes go to the list too: through the
        # properties each would be a call (a Python one on the fallback).
        self.flight: list[Any] = [None, (0, 0)]
        self.seq = 0
        self.thread_name: str | None = None
        # Readers this hook's sends trigger, as dict keys (setting one again
        # allocates nothing); triggered as the hook ends (sends.make_send).
        self.deferred: dict[Actor, None] | None = None  # made at wiring for a sender that defers
        self.started = False
        self.failed = False
        self.updates = 0
        self.overruns = 0
        self.stands_for_ns = 0
        self.stands_for_update = -1
        self.budget_misses = 0
        self.deadline_misses = 0
        self.dt_from_ns: int | None = None
        self.dt_done_ns = 0
        self.dt_max_ns = 0
        self.lateness: array[float] | None = None  # ring of samples (ns), made when first used
        self.hook_ns = 0
        self.last_hook_ns = 0
        self.restarts = 0
        self.last_update_ns: int | None = None
        self.rt: CudaRuntime | None = None  # when the run uses CUDA
        self.stream: Any = None        # the node's own stream (a CUDA node)
        self.copy_streams: dict[Any, Any] = {}  # by source device
        self.copy_done: dict[Any, Any] = {}  # an event per copy stream, reused (devices.receive)
        self.waiter: StreamWaiter | None = None  # waits for self.stream (cuda_sync)
        # Recorded on self.stream after each batch of received messages, before
        # they are kept: the host waits for it before it copies a kept value.
        self.kept_ready: Any = None
        self.trace: Any = None  # the run's trace.Recorder, if traced (trace.py imports this)
        self.applied: list[Any] | None = None  # deliveries read by the next hook (traced)
        self.depths = (0, 0)  # ready heap and hooks in flight as the hook started (traced)
        self.timed = True

    @property
    def hook(self) -> str | None:
        """The name of the hook in flight (``"on_update"``, ``"on_start"``...); None between."""
        return self.flight[0]

    @hook.setter
    def hook(self, name: str | None) -> None:
        self.flight[0] = name

    @property
    def stamp(self) -> SharedKey:
        """``(t_ns, delta)`` of the hook in flight: the key object of its batch.

        Shared, so setting it per hook allocates nothing, and the sends restamp
        only when it is another object (see `sends.make_send`).
        """
        return self.flight[1]

    @stamp.setter
    def stamp(self, key: SharedKey) -> None:
        self.flight[1] = key

    def schedule_first_tick(self, start_ns: int) -> None:
        """Make the first tick due one period after ``start_ns`` (drift-free grid)."""
        period = self.period_ns
        if period is not None:
            # Ticks sit on the grid k * period even for a run that starts late
            # (a restored run), so schedules continue where they were.
            self.next_tick_ns = (start_ns // period + 1) * period
        if self.last_update_ns is None:  # a restore sets it: dt goes on as it was
            self.set_last_update(start_ns)

    def set_last_update(self, ns: int) -> None:
        """Set the time (ns) of the last update, which the next ``dt`` counts from.

        For a start, a restore or a restart: the updates since the previous
        such time add up to one span of `dt_sum`.
        """
        if self.dt_from_ns is not None:
            self.dt_done_ns += self.last_update_ns - self.dt_from_ns  # type: ignore[operator]
        self.last_update_ns = self.dt_from_ns = ns

    @property
    def dt_max(self) -> float:
        """The largest ``dt`` so far, seconds of the run's timer."""
        return self.dt_max_ns / 1e9

    @property
    def dt_sum(self) -> float:
        """Sum of the ``dt`` of every update so far, seconds of the run's timer.

        Not added up per update: each ``dt`` runs from the previous update to
        this one, so the sum over a span is its last update's time less its
        first's (exact, in ns). One float fewer per update, which with
        100,000 nodes is one cache miss fewer.
        """
        if self.dt_from_ns is None:
            return 0.0
        return (self.dt_done_ns + self.last_update_ns - self.dt_from_ns) / 1e9  # type: ignore[operator]

    def slot(self, port: Input) -> int:
        """Index of ``port`` (one of the node's Inputs) in `inputs`: what a delivery names."""
        for i, p in enumerate(self.inputs):
            if p is port:
                return i
        raise ValueError(f"input {port.path!r} is not an input of node {self.path!r}")

    def bound_mailbox(self) -> None:
        """Bound the mailbox by the depths of the node's Inputs (set once they are known).

        A node whose Inputs all have ``depth=None`` keeps every message: its
        mailbox is never pruned, and its hooks take their deliveries without
        the mailbox's lock.
        """
        if self.input_depths is None:
            depths = self.input_depths = tuple(p.depth for p in self.inputs)
            if any(depth is not None for depth in depths):
                self.mailbox.make_lock()
                self.prune_at = self.bound = prune_limit(depths)

    def prune(self, by_stamp: bool, below: int | None = None) -> list[tuple[Input, int]]:
        """Drop the deliveries its next hook would push out unseen (`Mailbox.prune`).

        The caller holds what `Mailbox.prune` asks for: the dispatcher's lock
        between two instants, or while the node is not busy with ``below``
        the least stamp of the current instant (simulated time), or the
        mailbox's lock (real time). Counts the drops of each Input; returns
        ``(input, drops)`` for those with some, for the caller to log once it
        holds no lock.
        """
        depths = self.input_depths
        removed = self.mailbox.prune(depths, by_stamp, below)  # type: ignore[arg-type]
        self.prune_at = self.bound = prune_limit(depths, len(self.deliveries))  # type: ignore[arg-type]
        return self._count_lost(removed)

    def prune_cycles(self, below: int | None) -> list[tuple[Input, int]]:
        """Prune a driven kernel's mailbox as one process did, cycle by cycle, below a stamp.

        See `Mailbox.prune_cycles` (the caller holds the dispatcher's lock,
        no hook in flight). Sets the bound; ``prune_at`` is the caller's.
        Returns the drops as `prune` does.
        """
        removed, self.bound = self.mailbox.prune_cycles(
            self.input_depths, self.bound, below)  # type: ignore[arg-type]
        return self._count_lost(removed)

    def _count_lost(self, removed: list[int]) -> list[tuple[Input, int]]:
        """Count the drops ``removed`` (per slot) into the Inputs; ``(input, drops)`` of each."""
        lost = []
        for slot, n in enumerate(removed):
            if n:
                port = self.inputs[slot]
                port._lost += n  # only ever written here, under the caller's lock
                lost.append((port, n))
        return lost

    def apply_deliveries(self, before: Key | None) -> Key | None:
        """Push due deliveries into the node's Inputs.

        Args:
            before: ``(t_ns, delta)`` of the hook about to run (simulated
                time: deliveries from that instant wait), or None (real time:
                every delivery is due).

        Returns:
            The trigger key ``(t, delta + 1)`` owed to the earliest triggering
            delivery left for a later hook (simulated time), or None. A sender
            at the same instant may have found this actor's trigger already
            set for the current hook; this key keeps its message from waiting
            for an unrelated update.
        """
        rt = self.rt
        inputs = self.inputs
        mailbox = self.mailbox
        if before is None:
            # Real time: a sender may prune the mailbox (Actor.prune) from its
            # own thread; holding the lock, this hook takes what is there.
            lock = mailbox.lock  # None: never pruned (bound_mailbox)
            if len(inputs) == 1 and rt is None and self.trace is None:  # the common case, lean
                if lock is None:
                    inputs[0]._push_many(mailbox.take_messages())
                    return None
                lock.acquire()  # no `with`: half the cost
                try:
                    messages = mailbox.take_messages()
                finally:
                    lock.release()
                inputs[0]._push_many(messages)
                return None
            if lock is None:
                taken, kept = mailbox.take_deliveries(None)
            else:
                with lock:
                    taken, kept = mailbox.take_deliveries(None)
        else:  # simulated time: pruned only between instants, never meanwhile
            taken, kept = mailbox.take_deliveries(before)
        if self.trace is not None:
            self.applied = taken
        if rt is None:
            if len(taken) == 1:
                delivery = taken[0]  # (stamp, input slot, message[, seq])
                inputs[delivery[1]]._push(delivery[2])
            else:  # runs of messages for one Input go in with one extend
                for slot, run in groupby(taken, SLOT):
                    inputs[slot]._push_many(list(map(MESSAGE, run)))
        else:
            with self.on_stream():
                got = [(dv[1], receive(dv[2], self.device, self.stream, self.copy_streams, rt,
                                       self.copy_done)) for dv in taken]
                if self.stream is not None and got:
                    # Before the values are kept (the host may read them at once):
                    # one event covers every copy and wait queued for them so far.
                    rt.record(self.kept_ready, self.stream)
            for slot, value in got:
                inputs[slot]._push(value)
        triggers = self.triggers
        owed = None
        for delivery in kept:
            if delivery[1] in triggers:
                t, delta, _ = unstamp(delivery[0])
                key = (t, delta + 1)
                if owed is None or key < owed:
                    owed = key
        return owed

    def run_due(self, t_ns: int, is_tick: bool, end_ns: int | None,
                owes: dict[Actor, Key]) -> int:
        """Apply the due deliveries and run the update of a hook at ``self.stamp`` (simulated).

        Simulated time starts every hook exactly when it is due (at ``t_ns``,
        the stamp's time): no tick is ever missed and every lateness is 0, so
        this is `apply_deliveries` then `run_update` with ``now_ns == due_ns``,
        without what only real time needs. The lateness ring is never written
        (`lateness_samples` gives the zeros). A trigger key owed to deliveries
        kept for a later hook goes into ``owes`` (the dispatcher's, read as
        the actor is finished).

        Returns what `run_update` returns; raises what the deliveries or the
        hook raise.
        """
        queue = self.deliveries
        if queue and self.inputs:  # no Inputs: the deque stays unread
            key = self.stamp
            # The common case, lean: one delivery sent before this hook's key
            # (senders only append: it stays the first). Else apply_deliveries.
            if len(queue) == 1 and queue[0][0] >> ORDER_BITS < ((key[0] << SHIFT) | key[1]) \
                    and self.rt is None and self.trace is None:
                delivery = queue.popleft()
                self.inputs[delivery[1]]._push(delivery[2])
            else:
                owed = self.apply_deliveries(key)
                if owed is not None:
                    owes[self] = owed
        if self.rt is not None or self.trace is not None:
            return self.run_update(t_ns, t_ns, is_tick, end_ns)
        # run_update's common case with now == due, inlined: once per update.
        if is_tick:
            self.next_tick_ns = t_ns + self.period_ns  # type: ignore[operator]
        gap = t_ns - self.last_update_ns  # type: ignore[operator]
        self.last_update_ns = t_ns
        self.updates += 1  # counted when called: an update that raises counts too
        flight = self.flight  # not the `hook` property: a call per write (see __init__)
        flight[0] = "on_update"
        if not self.timed:
            try:
                self.context.run(self.update, self.node, gap / 1e9)
            finally:
                flight[0] = None
            return 0
        if gap > self.dt_max_ns:
            self.dt_max_ns = self.period_ns if gap == self.period_ns else gap
        t0 = _clock()
        try:
            self.context.run(self.update, self.node, gap / 1e9)
        except BaseException:  # timed and re-raised: the dispatcher reports it
            took = self.last_hook_ns = _clock() - t0
            self.hook_ns += took
            flight[0] = None
            raise
        took = _clock() - t0
        self.hook_ns += took
        flight[0] = None
        return took

    def run_update(self, now_ns: int, due_ns: int, is_tick: bool,
                   end_ns: int | None = None) -> int:
        """Call ``on_update`` for a tick due at ``due_ns`` or a trigger, at ``now_ns``.

        A tick that starts a full period or more after it was due stands for
        the latest missed tick: the missed ones are counted as overruns and
        skipped, never run as a burst. ``end_ns``, the run's end if it has
        one: ticks after it are not due, so a tick starting after the end
        stands for the latest tick due by the end, and neither counts nor
        measures its lateness against the later ones (a periodic node's
        updates and overruns add up to the ticks due by the end).

        Returns the hook's wall time in ns (0 when it was not timed: without
        statistics or tracing). If the hook raises, that time is left in
        ``last_hook_ns`` instead, for the dispatcher to take.
        """
        if is_tick:
            period: int = self.period_ns  # type: ignore[assignment]  # ticks have a period
            missed = (now_ns - due_ns) // period
            if missed > 0:
                if end_ns is not None and now_ns > end_ns:
                    missed = (end_ns - due_ns) // period  # the latest tick due by the end
                self.overruns += missed
                due_ns += missed * period
                self.stands_for_ns, self.stands_for_update = due_ns, self.updates + 1
            self.next_tick_ns = due_ns + period
        gap = now_ns - self.last_update_ns  # type: ignore[operator]
        dt = gap / 1e9
        self.last_update_ns = now_ns
        n = self.updates
        self.updates = n + 1  # counted when called: an update that raises counts too
        if self.timed:  # fixed for a run: every update writes a sample, the n-th at n
            ring = self.lateness
            if ring is None:
                ring = self.lateness = array("f", bytes(4 * LATENESS_SAMPLES))
            ring[n & _RING_MASK] = now_ns - due_ns
            if gap > self.dt_max_ns:
                # A gap of one period keeps the run's shared period object:
                # read on every update, it stays in cache (see __init__).
                self.dt_max_ns = self.period_ns if gap == self.period_ns else gap
        if self.rt is not None or self.trace is not None:
            try:
                self.call("on_update", dt)
            finally:
                self.wait_stream()  # also after a failure: a restart must not race the GPU
            took, self.last_hook_ns = self.last_hook_ns, 0  # taken once, by the caller
            return took
        # What call() does, inlined for the common case (no CUDA, no trace):
        # this runs once per update. The hook's time is returned rather than
        # stored: an int kept per node is one more cache miss per update
        # with 100,000 nodes.
        flight = self.flight  # not the `hook` property: a call per write (see __init__)
        flight[0] = "on_update"
        if not self.timed:
            try:
                self.context.run(self.update, self.node, dt)
            finally:
                flight[0] = None
            return 0
        t0 = _clock()
        ok = False
        try:
            self.context.run(self.update, self.node, dt)
            ok = True
        finally:
            took = _clock() - t0
            self.hook_ns += took
            flight[0] = None
            if not ok:
                self.last_hook_ns = took
        return took

    def lateness_samples(self) -> list[float]:
        """The recent lateness samples (ns), oldest first: at most ``LATENESS_SAMPLES``.

        Safe to call from another thread while the node runs: a sample written
        meanwhile may be the newest or not yet there.
        """
        ring, n = self.lateness, self.updates
        if ring is None:  # never made: no statistics, or simulated time (all 0, see run_due)
            return [0.0] * min(n, LATENESS_SAMPLES) if self.timed else []
        if n <= LATENESS_SAMPLES:
            return ring.tolist()[:n]
        start = n & _RING_MASK
        return ring[start:].tolist() + ring[:start].tolist()

    def on_stream(self) -> Any:
        """Context making the node's streams current: its own, and its copy streams.

        A no-op for a node that uses no CUDA. The copy streams (on the devices
        of the CUDA nodes it reads) are made current first, so the node's own
        device ends up the current one.
        """
        return enter_streams(self.rt, self.stream, self.copy_streams)

    def wait_stream(self) -> None:
        """Wait until the GPU has done the work queued on the node's stream."""
        if self.stream is not None:
            assert self.waiter is not None  # set with the stream (build.setup_cuda)
            self.waiter.wait(self.stream)

    def call(self, hook: str, *args: Any) -> None:
        """Call a hook of the node in the node's context, timing it.

        A CUDA node's device and stream are current during the hook, so all
        its operations go on its own stream. Without statistics and tracing
        the clock is not read at all.
        """
        self.hook = hook
        if not self.timed and self.trace is None:
            try:
                self._invoke(hook, args)
            finally:
                self.hook = None
            return
        t0 = _clock()
        try:
            self._invoke(hook, args)
        finally:
            took = _clock() - t0
            self.last_hook_ns = took
            self.hook_ns += took
            self.hook = None
            if self.trace is not None:
                self.trace.hook(self, hook, t0, took, args)

    def control_hook(self, hook: str) -> Callable[[], None]:
        """The function that runs the control hook ``hook`` (``on_start``, ``on_stop``).

        The node's own method; a replay's stand-in (`replay.StandIn`) has its own.
        """
        fn: Callable[[], None] = getattr(self.node, hook)
        return fn

    def _invoke(self, hook: str, args: tuple[Any, ...]) -> None:
        if hook == "on_update":  # the one found as the run started, as without tracing
            fn, args = self.update, (self.node, *args)
        else:
            fn = self.control_hook(hook)
        if self.rt is None:
            self.context.run(fn, *args)
        else:
            with self.on_stream():
                self.context.run(fn, *args)

    # -- control envelopes: on_start, on_stop, state_dict, load_state_dict -----------
    def handle(self, envelope: Envelope) -> tuple[str, BaseException] | None:
        """Run one control envelope; return ``(hook, exception)`` if it failed, else None.

        `Start` runs ``on_start`` (the node counts as started once it
        returns), `Stop` runs ``on_stop`` of a started node, `Restore` loads a
        state (`restore`), `Snapshot` takes one (`take_state`; its errors go
        into the envelope, never count as the node's failure). A CUDA node's
        stream is waited for after ``on_start`` and ``on_stop`` as after
        ``on_update``, also after a failure: the run starts with the work of
        every ``on_start`` done, and the end never leaves a node's GPU work
        queued. Whatever the hook raises (any BaseException) is returned, for
        the dispatcher to report.
        """
        if isinstance(envelope, Snapshot):
            self.take_state(envelope)
            return None
        if isinstance(envelope, Stop) and not self.started:
            return None
        hook = (envelope.hook if isinstance(envelope, Restore)
                else "on_start" if isinstance(envelope, Start) else "on_stop")
        try:
            if isinstance(envelope, Restore):
                self.restore(envelope)
            else:
                if isinstance(envelope, Stop):
                    self.started = False
                try:
                    self.call(hook)
                finally:
                    self.wait_stream()
                if isinstance(envelope, Start):
                    self.started = True
        except BaseException as exc:  # noqa: BLE001 - returned, never swallowed
            return hook, exc
        return None

    def take_state(self, envelope: Snapshot) -> None:
        """Copy the node's state into ``envelope.into[path]``; errors into ``envelope.errors``.

        A CUDA node's stream is waited for before and after, on the thread
        taking the cut (never a worker): the state is complete when read, and
        the CPU copies are done when the run goes on. The copies of CUDA
        tensors go into pinned memory without blocking and are waited for
        through the thread's waiter (cuda_sync), not inside the copy.
        """
        try:
            self.wait_stream()
            copier = None if self.rt is None else HostCopier(self.rt)
            with self.on_stream():
                try:
                    state = self.context.run(self.node.state_dict)
                except BaseException as exc:  # noqa: BLE001 - reported, whatever it is
                    envelope.errors[self.path] = NodeError.from_hook(self.path, envelope.hook,
                                                                     exc)
                    return
                where = f"node {self.path!r} state"
                if copier is None:
                    state = copy_state(state, where)
                else:
                    state = copy_state(state, where, copier)
                    copier.wait()
                envelope.into[self.path] = state
            self.wait_stream()
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            envelope.errors[self.path] = exc

    def restore(self, envelope: Restore) -> None:
        """Load a state, the kept messages of the node's Inputs and its ``dt`` reference.

        ``load_state_dict`` runs in the node's context, on its stream; kept
        messages of a CUDA node are moved to its device on that stream, which
        is then waited for. Clears ``failed`` (a restart). Raises what
        ``load_state_dict`` raises.
        """
        with self.on_stream():
            if envelope.state is not None:
                self.context.run(self.node.load_state_dict, envelope.state)
            device = self.device
            rt = self.rt

            def place(t: Any) -> Any:
                # Queued on the node's stream without a host wait; the
                # wait_stream below covers them (cuda_sync).
                assert rt is not None  # only called for a CUDA node
                return t if t.device == device else rt.to_device(t, device)

            for port, messages in envelope.inputs.items():
                if device.type == "cuda":  # kept messages arrive on the node's device
                    messages = [map_tensors(m, place) for m in messages]
                port._restore(messages)
        self.wait_stream()
        if envelope.last_update_ns is not None:
            self.set_last_update(envelope.last_update_ns)
        self.failed = False


def guard_read_only(actor: Actor) -> None:
    """Make the actor's ``on_update`` fail if it changes a message it received in place.

    ``mujou.run(check_read_only=True)`` (and each kernel of a placed run):
    before the update, `readonly.note` takes the version counter of every
    tensor the node's Inputs hold and the fingerprint (pickle bytes) of every
    other message that can change (a list, a dict, a numpy array, a
    dataclass...); after it, `readonly.changed` compares. One that differs
    raises `MessageChangedError` naming the node and the Input, which fails
    the node as any exception of its hook does. The check wraps
    ``actor.update`` once, as the run starts: a run without it runs the
    update as it always does, and pays nothing. Inference-mode tensors keep
    no version counter and are not checked.

    Args:
        actor (Actor): an actor whose Inputs are wired (``actor.inputs``).
    """
    inputs = actor.inputs
    if not inputs:
        return
    update = actor.update
    path = actor.path
    refused: set[int] = set()  # Inputs logged for a message pickle cannot write
    fingerprinter = readonly.Fingerprinter()  # the node's hooks never overlap: one will do

    def checked(node: Node, dt: float) -> None:
        versions, prints = readonly.note(inputs, refused, fingerprinter)
        update(node, dt)
        for port, t, version in versions:
            if t._version != version:
                raise MessageChangedError(path, port.path)
        for port, message, fingerprint in prints:
            if readonly.changed(message, fingerprint, fingerprinter):
                raise MessageChangedError(path, port.path, readonly.kind_of(message))

    actor.update = checked


class DeadlineGuard:
    """The ``on_update`` of a node that declares a budget or a deadline (`guard_deadlines`).

    Calls the update it wraps and measures it as it returns: its thread's CPU
    time against the budget, and its finish against the deadline, counted
    from the update's stamp (the time it stands for: its tick's due time, or
    its trigger's). Real time reads the finish on the run's timer; simulated
    time, whose clock stands still while a hook runs, takes the CPU time.
    A miss is counted in the actor, traced, and handled by the node's policy.
    In simulated time the policy is always ``"warn"``: a skipped tick, a safe
    state or a stop that depended on how fast the machine ran the hook would
    make the results depend on it too.

    In real time, a guard with a deadline is also watched by the run's
    deadline monitor (`overdue.DeadlineMonitor`, `watched`): as an update
    starts, the guard publishes its deadline (`until_ns`); the monitor's
    thread catches an update still running past it (`overdue`): it counts
    the miss then, traces and logs it, and for ``"stop"`` fails the node,
    which stops the run while the hook still runs. What needs the hook to
    have returned (``"skip"``, ``"safe"``: a hook cannot be interrupted, and
    ``on_deadline_miss`` never runs beside the node's own hook) is done as it
    returns, where the miss is not counted again. The hand-over of an update
    between the two threads (`caught`) is under `lock`, held for a few
    statements, never across a wait.
    """

    def __init__(self, actor: Actor, timer: Any, simulated: bool) -> None:
        node = actor.node
        self.actor = actor
        self.update = actor.update
        self.timer = timer
        self.simulated = simulated
        self.budget_ns: int | None = node._mujou_budget_ns
        self.deadline_ns: int | None = node._mujou_deadline_ns
        self.declared: str = node._mujou_on_miss
        self.policy: str = "warn" if simulated else self.declared
        self.logged_at = float("-inf")  # time.monotonic() of the last line logged
        self.unlogged = 0  # misses since then
        # Set by `watched` (real time, a deadline); None: not watched, nothing to publish.
        self.lock: threading.Lock | None = None
        self.until_ns = NEVER  # the deadline (timer ns) of the update in flight; NEVER: none
        self.caught = False  # the monitor counted the miss of the update in flight
        self.wake: list[int] = [NEVER]  # the monitor's: the time its thread waits until
        self.poke: Callable[[], None] = _ignore  # wakes the monitor's thread at once
        self.fail: Callable[[Actor, str, BaseException], None] | None = None

    def watched(self, wake: list[int], poke: Callable[[], None],
                fail: Callable[[Actor, str, BaseException], None]) -> None:
        """Be watched by the run's deadline monitor (`overdue.DeadlineMonitor.add`).

        Args:
            wake (list[int]): the monitor's one-item list: the time (ns of the
                run's timer) its thread waits until. An update due by an
                earlier time wakes it (``poke``) as the update starts.
            poke (Callable[[], None]): wakes the monitor's thread at once.
            fail (Callable[[Actor, str, BaseException], None]): fails the node
                (the dispatcher's report of a hook's exception): what
                ``"stop"`` does with a miss caught while the hook runs.
        """
        self.lock = threading.Lock()
        self.wake, self.poke, self.fail = wake, poke, fail

    def __call__(self, node: Node, dt: float) -> None:
        """Run the wrapped update of ``node`` (``dt``: seconds of the run's timer), measured.

        Raises:
            DeadlineMissError: see `measure`; and what the update raises.
        """
        lock = self.lock
        if lock is None:  # not watched: the update as it was
            t0 = _cpu_clock()
            self.update(node, dt)
            self.measure(node, _cpu_clock() - t0, False)
            return
        # Published before the hook runs, without the lock: the monitor reads
        # NEVER (between updates) or this update's deadline, never another's.
        until = self.due_ns() + self.deadline_ns  # type: ignore[operator]  # watched: one
        self.until_ns = until
        if until < self.wake[0]:  # the monitor waits past it: wake it to wait less
            self.poke()
        t0 = _cpu_clock()
        try:
            self.update(node, dt)
        except BaseException:
            self.returned()
            raise
        took = _cpu_clock() - t0
        self.measure(node, took, self.returned())

    def due_ns(self) -> int:
        """The time (ns of the run's timer) the update in flight stands for, its deadline's start.

        The stamp's time (its tick's due time, or its trigger's), except for a
        tick that started a period or more late: that one stands for the
        latest missed tick (`Actor.run_update`, the others counted as
        overruns), and its deadline counts from that tick, so that one stall
        is one miss, not a miss for the stalled update and another for the
        one that catches up.
        """
        actor = self.actor
        if actor.stands_for_update == actor.updates:
            return actor.stands_for_ns
        stamp: int = actor.flight[1][0]  # Actor.stamp, without the property's call
        return stamp

    def returned(self) -> bool:
        """The update in flight returned: unpublish it; whether the monitor caught it."""
        lock = self.lock
        assert lock is not None  # a watched guard's
        with lock:
            caught = self.caught
            self.until_ns = NEVER
            self.caught = False
        return caught

    def measure(self, node: Node, took: int, caught: bool) -> None:
        """Check an update that has returned; count, trace, log and handle its miss.

        Args:
            node (Node): the node (``"safe"`` calls its ``on_deadline_miss``).
            took (int): the update's CPU time, ns (its thread's).
            caught (bool): the monitor counted, traced and logged its deadline
                miss while it ran (and for ``"stop"`` failed the node): not
                counted again; a budget miss is still this method's, and so
                is what needs the hook to have returned (``"skip"``,
                ``"safe"``).

        Raises:
            DeadlineMissError: a miss of a node with ``on_miss="stop"`` that
                the monitor did not catch (the node fails with it).
        """
        actor = self.actor
        due = self.due_ns()
        finished = took if self.simulated else self.timer.now_ns() - due
        budget, deadline = self.budget_ns, self.deadline_ns
        over = budget is not None and took > budget
        late = not caught and deadline is not None and finished > deadline
        if not (over or late or caught):
            return
        if over:
            actor.budget_misses += 1
        if late:
            actor.deadline_misses += 1
        miss = DeadlineMiss(actor.path, due / 1e9, took / 1e9, finished / 1e9,
                            None if budget is None else budget / 1e9,
                            None if deadline is None else deadline / 1e9)
        if (over or late) and actor.trace is not None:
            # After a catch, only the budget is news (the deadline's event is the monitor's).
            actor.trace.miss(actor, miss, "budget" if caught else None)
        policy = self.policy
        if policy == "stop":
            if caught:
                return  # the monitor failed the node already: the run is stopping
            raise DeadlineMissError(miss)  # the node fails; the coordinator stops the run
        if over or late:
            self.log(miss)
        if policy == "skip":
            # Set for this update already (Actor.run_update): the tick after is the next.
            actor.next_tick_ns += actor.period_ns  # type: ignore[operator]  # skip needs one
        elif policy == "safe":
            node.on_deadline_miss(miss)  # in the node's context: the update's own

    def overdue(self, now_ns: int) -> int:
        """The monitor's look (on its thread): catch the update in flight past its deadline.

        An update still running at ``now_ns``, past its deadline and not
        caught yet, is caught: its deadline miss counted (once: `measure`
        will not count it again), traced, logged, and for ``"stop"`` the
        node failed (`fail`), which stops the run as a miss found as the
        hook returns would. What else the policy does waits for the hook to
        return (`measure`).

        Args:
            now_ns (int): the run's timer, ns.

        Returns:
            int: when to look again (ns of the run's timer): the deadline of
            the update in flight; between updates, the deadline of the next
            tick if it is still ahead (an update due earlier, a triggered
            one, wakes the monitor as it starts); `NEVER`: nothing to look for.
        """
        actor, lock, deadline = self.actor, self.lock, self.deadline_ns
        assert lock is not None and deadline is not None  # a watched guard's
        with lock:
            until = self.until_ns
            if until == NEVER:  # between updates: the next tick's deadline, if ahead
                tick = actor.next_tick_ns
                if tick is None or tick + deadline <= now_ns:
                    return NEVER
                return tick + deadline
            if self.caught or now_ns < until:
                return NEVER if self.caught else until
            self.caught = True
            # Counted and traced before the lock is let go: once `returned`
            # sees the catch, the count is there (measure counts it no more),
            # and the trace's event falls inside the hook's slice.
            actor.deadline_misses += 1
            due = until - deadline
            budget = self.budget_ns
            miss = DeadlineMiss(actor.path, due / 1e9, 0.0, (now_ns - due) / 1e9,
                                None if budget is None else budget / 1e9, deadline / 1e9,
                                running=True)
            if actor.trace is not None:
                actor.trace.miss(actor, miss, "deadline")
        if self.policy == "stop":
            assert self.fail is not None  # set with the lock (watched)
            self.fail(actor, "on_update", DeadlineMissError(miss))
        else:
            self.log(miss)
        return NEVER

    def log(self, miss: DeadlineMiss) -> None:
        """Log a miss: the first at once, then at most a line per `MISS_LOG_S` per node."""
        now = time.monotonic()
        self.unlogged += 1
        if now - self.logged_at < MISS_LOG_S:
            return
        more = "" if self.unlogged == 1 else f" ({self.unlogged} misses since the last line)"
        if self.simulated and self.declared != "warn":
            log.warning("%s%s; on_miss=%r applies in real time only: simulated time counts "
                        "and logs misses", miss, more, self.declared)
        elif self.policy == "warn":
            log.warning("%s%s", miss, more)
        elif miss.running:
            log.warning("%s%s; on_miss=%r is applied as the hook returns (a running hook is "
                        "not interrupted)", miss, more, self.policy)
        else:
            log.info("%s%s; on_miss=%r", miss, more, self.policy)
        self.logged_at = now
        self.unlogged = 0


def _ignore() -> None:
    """Nothing to wake (a guard that no monitor watches)."""


def guard_deadlines(actor: Actor, timer: Any, simulated: bool,
                    watch: Callable[[DeadlineGuard], None] | None = None) -> None:
    """Measure ``actor``'s updates against its node's budget and deadline, if it has either.

    Wraps ``actor.update`` once, as the run starts (as `guard_read_only`
    does): a node that declares neither keeps its update as it is and pays
    nothing, on the hot path or anywhere else.

    Args:
        actor (Actor): an actor of the run, its node's settings checked.
        timer (Timer): the run's timer (real time reads the finish on it).
        simulated (bool): the run's time is simulated.
        watch (Callable[[DeadlineGuard], None] | None): the run's deadline
            monitor's ``add`` (`overdue.DeadlineMonitor`), given the guard of
            a node with a deadline in real time, so that an update still
            running at its deadline is caught then. None: measured only as
            each update returns. Default: None.
    """
    node = actor.node
    if node._mujou_budget_ns is not None or node._mujou_deadline_ns is not None:
        guard = DeadlineGuard(actor, timer, simulated)
        actor.update = guard
        if watch is not None and not simulated and guard.deadline_ns is not None:
            watch(guard)
