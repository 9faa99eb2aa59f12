"""The dispatcher: worker pool, earliest-due-first ready queue, dedicated threads.

One lock guards the schedule. Actors that are ready sit in a calendar queue
keyed by ``(time_ns, delta)``: a heap of keys, and per key the actors in the
order they were queued. A worker takes the earliest, with it the others that
may start at once (a batch), runs their hooks with the lock released, and
puts each actor back with its next key. An actor is queued at most once and
never on two threads at once, so the hooks of one node never overlap, and the
lock hand-over makes each hook see what the previous one wrote, whichever
thread ran it.

Simulated time adds one rule (``_may_start``): work at a later ``(time,
delta)`` waits until everything earlier has finished. A message sent at
``(t, d)`` is therefore applied before any later hook of its reader and never
during the same cycle, and deliveries are sorted by stamp: the result is
bit-identical whatever the number of workers.

Dedicated-thread actors are not in the heap; each has a thread that waits
for its own key under the same rules.
"""

from __future__ import annotations

import heapq
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from ._runtime.protocols import KernelListener
from .actor import CURRENT, NEVER, Actor
from .errors import NotRunningError, PortTypeError
from .mailbox import (
    HOST_ORDER,
    ORDER_BITS,
    SHIFT,
    STAMP,
    Delivery,
    Start,
    Stop,
    pack,
    stamp,
    unstamp,
)
from .timers import Timer, tight_timer_slack

__all__ = ["Dispatcher", "usable_cpus", "default_workers"]

log = logging.getLogger("mujou_actors")

CONTROL_KEY = (-1, 0)  # control envelopes sort before every timed key
HOST_STAMP = stamp(CONTROL_KEY, HOST_ORDER)  # the host's writes: before every node's send
CONTROL_T = CONTROL_KEY[0]

# Batches: a worker claims up to BATCH_MAX actors that may start now per lock
# acquisition (the only worker: BATCH_MAX_ALONE; real time with several
# workers: one). With several workers a batch also stops at BATCH_BUDGET_NS of
# the members' mean hook times, so that slow hooks spread over the workers.
BATCH_MAX = 64
BATCH_MAX_ALONE = 1024
BATCH_BUDGET_NS = 50_000

# The ready queue is a calendar: a heap of the distinct keys (instants) at
# which actors are queued, each packed into one int (mailbox.pack: sorts like
# the tuple, compares in C), and per key a list of its actors (a bucket).
# Nodes on a common grid of periods share keys, so queueing and taking an
# actor is O(1) for all but the first of a key. Actors of one key are equally
# due; a bucket is taken whole, in the order queued, when it fits in a batch,
# else from its end.
#
# A bucket keeps the key tuple of its first actor, and every actor queued in
# it refers to that one object (``queued_key``, and ``next_tick_ns`` when the
# tick set the key). With 100,000 nodes an update's cost is mostly cache
# misses, and an int or tuple made per actor is one more miss when the actor
# is next claimed; the bucket's objects stay in cache. Liveness is identity:
# an entry is live while its actor's ``queued_key`` is the bucket's key.

# Messages of these exact types are immutable: a send shares them uncopied.
SCALARS = frozenset((type(None), bool, int, float, complex, str, bytes))

# How a send triggers a reader (see make_send).
NOW, DEFER = 1, 2

# A claimed hook: (actor, now_ns, due_ns, is_tick, consumed trigger key).
Claim = tuple[Actor, int, int, bool, "tuple[int, int] | None"]

# Run modes of the dispatcher.
CONTROL, RUNNING, STOPPING, SHUTDOWN = "control", "running", "stopping", "shutdown"


# ---------------------------------------------------------------------------
# Worker count


def _cgroup_cpu_limit() -> float | None:
    """CPUs allowed by the cgroup quota of this process (v2 ``cpu.max`` or v1), if any."""
    limits: list[float] = []
    try:
        with open("/proc/self/cgroup") as f:
            entries = [line.strip().split(":", 2) for line in f if line.strip()]
    except OSError:
        return None
    for _, controllers, rel in entries:
        if controllers == "":  # cgroup v2: walk the path and its ancestors
            parts = [p for p in rel.split("/") if p]
            for i in range(len(parts), -1, -1):
                limit = _read_cpu_max(os.path.join("/sys/fs/cgroup", *parts[:i], "cpu.max"))
                if limit is not None:
                    limits.append(limit)
        elif "cpu" in controllers.split(","):
            for root in ("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"):
                limit = _read_cfs(os.path.join(root, rel.lstrip("/")))
                if limit is None:
                    limit = _read_cfs(root)
                if limit is not None:
                    limits.append(limit)
                    break
    return min(limits) if limits else None


def _read_cpu_max(path: str) -> float | None:
    try:
        with open(path) as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return int(quota) / int(period)


def _read_cfs(folder: str) -> float | None:
    try:
        with open(os.path.join(folder, "cpu.cfs_quota_us")) as f:
            quota = int(f.read())
        with open(os.path.join(folder, "cpu.cfs_period_us")) as f:
            period = int(f.read())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 else quota / period


def usable_cpus() -> int:
    """CPUs this process may use: logical cores, limited by affinity and cgroup quota.

    Returns:
        int: at least 1. The quota is rounded up (1.5 CPUs allow 2 threads to
        make progress).
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpu_limit()
    if quota is not None:
        cpus = min(cpus, max(1, -(-int(quota * 1000) // 1000)))
    return max(1, cpus)


def gil_enabled() -> bool:
    """Whether the GIL is enabled (always on Pythons before 3.13)."""
    probe = getattr(sys, "_is_gil_enabled", None)
    return True if probe is None else bool(probe())


def default_workers(pool_nodes: int, *, cpus: int | None = None, gil: bool | None = None) -> int:
    """The default number of worker threads.

    The usable CPUs, halved while the GIL is enabled (more threads would mostly
    contend for it), never more than the nodes that run on the workers, and at
    least 1.

    Args:
        pool_nodes (int): nodes without ``dedicated_thread``.
        cpus (int, optional): usable CPUs; default `usable_cpus`.
        gil (bool, optional): whether the GIL is enabled; default: this process.
    """
    cpus = usable_cpus() if cpus is None else cpus
    gil = gil_enabled() if gil is None else gil
    n = cpus // 2 if gil else cpus
    return max(1, min(n, pool_nodes))


def _on_time(loop: Callable[..., None], *args: Any) -> None:
    """Run a real-time thread's loop with tight timer slack (see `tight_timer_slack`)."""
    tight_timer_slack()
    loop(*args)


def _not_in_hook(sender: Actor, output: Any, send: Callable[[Any], None]) -> NotRunningError:
    """The error of a send made outside a hook of the port's node (cold path)."""
    if output._send is not send:  # kept from a run that has ended
        if output._send is None:
            return NotRunningError(f"output {output.path!r}: send() needs a running net")
        return NotRunningError(
            f"output {output.path!r}: this send() belongs to a run that has ended; "
            "call the port's send() again (self.out.send) rather than keeping it")
    return NotRunningError(
        f"output {output.path!r}: send() from outside a hook of node "
        f"{sender.path or '<root>'!r} (from the host, or from another node's hook)")


def _reader_check(output: Any, reader: Any) -> Callable[[Any], Any]:
    """The check of a reader's narrower type, naming the Output that sent the value too."""
    check = reader._check

    def checked(value: Any) -> Any:
        try:
            return check(value)
        except PortTypeError as exc:
            raise PortTypeError(f"output {output.path!r} sent to {exc}") from None

    return checked


def _cost(actor: Actor, budget: int) -> int:
    """What ``actor``'s next update counts against a batch's budget, in nanoseconds.

    Its mean hook time (``on_start`` included); the whole budget for its
    first update (so that nodes of unknown cost start in parallel); an eighth
    of it without timing statistics (batches of eight).
    """
    if not actor.timed:
        return budget // 8
    n = actor.updates
    return actor.hook_ns // n if n else budget


class _Batch:
    """A batch of several claims in flight on one worker (see `Dispatcher._run_batch`)."""

    __slots__ = ("todo", "done")

    def __init__(self, claims: list[Claim]) -> None:
        self.todo: deque[Claim] = deque(claims)  # not started; `_unclaim` may take them back
        self.done: deque[Actor] = deque()  # have run, not yet finished


# ---------------------------------------------------------------------------
# Dispatcher


class Dispatcher:
    """Runs the actors' hooks on a pool of workers and dedicated threads.

    Args:
        actors: every actor of the run, in the net's order.
        timer: the run's timer.
        workers: number of worker threads to start.
        listener: what drives the dispatcher (the run's coordinator): told
            of a hook's failure, the end, each hold and a crash of a thread's
            loop, each call with its locking rule (see `KernelListener`).
    """

    def __init__(
        self,
        actors: list[Actor],
        timer: Timer,
        workers: int,
        listener: KernelListener,
    ) -> None:
        self.actors = actors
        self.timer = timer
        self.simulated = timer.simulated
        self.n_workers = workers
        self._listener = listener
        # Holding: a consistent cut. With simulated time it falls between two
        # instants (all work at t done, none after t started), so a snapshot
        # taken there resumes exactly; `hold_at` asks for a cut at that time.
        # _hold_requested counts the requests not yet withdrawn (a request
        # that times out withdraws only itself, not a restart's); a release
        # ends them all.
        self._hold_requested = 0
        # A stop was asked (stop_at_boundary, stop_now): for good. Timed work
        # then never runs again, even when a control phase (run_control)
        # took the mode back to CONTROL and a release or the start follows.
        self._stop_requested = False
        self.held = False
        self._hold_at_ns: int | None = None
        self._cut_due = False  # held at _hold_at_ns: a supervisor snapshot is due
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[int] = []  # keys with queued pool actors, packed (see SHIFT)
        # Per packed key: (the key tuple its actors share, its actors in the order queued).
        self._due: dict[int, tuple[tuple[int, int], list[Actor]]] = {}
        self._queued = 0  # entries in the buckets, stale ones included (a trace counter)
        self._batches: dict[int, _Batch] = {}  # batches of several in flight, by id
        # Trigger keys owed to deliveries kept for a later hook (apply_deliveries),
        # set by the thread that ran the actor, taken as the actor is finished.
        self._owed: dict[Actor, tuple[int, int]] = {}
        # Simulated time: readers whose mailbox a send found over its bound,
        # pruned between two instants (see _prune_crowded).
        self._crowded: dict[Actor, None] = {}
        self._batch_budget_ns = None if workers == 1 else BATCH_BUDGET_NS
        # Real time with several workers: no batches. A hook that is slow now
        # and then would hold its batch-mates while another worker is idle,
        # and in real time that lateness is what the user sees.
        self._batch_max = (BATCH_MAX_ALONE if workers == 1
                           else BATCH_MAX if timer.simulated else 1)
        self._dedicated = [a for a in actors if a.dedicated]
        self._mode = CONTROL
        self._inflight = 0
        self._waiting = 0  # threads in _wait(); notifies are skipped when none
        self._pending_control = 0  # control envelopes queued or in flight, all phases
        # Per control phase (id of its envelope, see run_control): envelopes
        # neither handled nor withdrawn yet. A phase waits for its own only,
        # not for a hook stuck in an earlier phase's.
        self._phase_left: dict[int, int] = {}
        self._in_control: dict[Actor, Any] = {}  # the envelope each actor is running
        self._frontier: tuple[int, int] = CONTROL_KEY
        self._end_ns: int | None = None  # see set_end
        self._end_grace_ns = 10_000_000_000  # the run's stop_timeout
        self._ended = False
        self._host_seq = 0
        self._threads: list[threading.Thread] = []
        # Helpers of a control phase (see run_control): started on demand,
        # gone once no control envelope waits. Not in _threads: they are no
        # worker and get no track of their own in the thread list.
        self._helpers: list[threading.Thread] = []  # alive ones (pruned as one starts)
        self._helpers_started = 0  # names them
        self._free_helpers = 0  # helpers started, not in a hook
        self._busy_ns: dict[str, int] = {}
        self._started_ns = time.perf_counter_ns()
        self.trace: Any = None  # the run's trace.Recorder; set before the sinks are made

    # -- threads -----------------------------------------------------------------
    def start_threads(self) -> None:
        """Start the worker threads and one thread per dedicated actor."""
        for i in range(self.n_workers):
            self._spawn(f"mujou-worker-{i}", self._worker_loop, None)
        for actor in self._dedicated:
            self._spawn(f"mujou-node-{actor.path or 'root'}", self._dedicated_loop, actor)

    def _spawn(self, name: str, target: Callable[..., None], arg: Any) -> None:
        args = (target,) if arg is None else (target, arg)
        if not self.simulated:
            args = (_on_time, *args)
        thread = threading.Thread(target=self._guarded, args=args, name=name, daemon=True)
        self._threads.append(thread)
        self._busy_ns[name] = 0
        thread.start()

    def _guarded(self, loop: Callable[..., None], *args: Any) -> None:
        """Run a thread's loop; what escapes it ends the run as a failure, never silently.

        Hooks' exceptions are caught where the hooks run (`_fail`); this is
        the last line for a defect of the dispatcher itself, which would
        otherwise leave the run without the thread and ``join()`` waiting.
        """
        try:
            loop(*args)
        except BaseException as exc:  # noqa: BLE001 - reported to the run
            log.critical("thread %s of the run died", threading.current_thread().name,
                         exc_info=exc)
            self._listener.crashed(exc)

    def thread_names(self) -> list[str]:
        """Names of the worker and dedicated threads, in the order they started."""
        return [thread.name for thread in self._threads]

    def is_own_thread(self) -> bool:
        """True on a worker or dedicated thread of this dispatcher."""
        me = threading.current_thread()
        return me in self._threads or me in self._helpers

    def join_threads(self, timeout: float, skip: Iterable[str] = ()) -> None:
        """Wait (up to ``timeout`` s in all) for the threads to exit, except ``skip``.

        Helpers of the control phases are joined too.
        """
        deadline = time.monotonic() + timeout
        skip = set(skip)
        for thread in self._threads + self._helpers:
            if thread.name not in skip and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    # -- modes -------------------------------------------------------------------------
    def start_running(self, start_ns: int) -> None:
        """Start the timer at ``start_ns`` and let timed work run (unless a stop was asked)."""
        with self._cond:
            self.timer.start(start_ns)
            self._frontier = (start_ns, 0)
            first_trigger = (start_ns, 1) if self.simulated else (start_ns, 0)
            for actor in self.actors:
                actor.schedule_first_tick(start_ns)
                if actor.trigger_key is not None:
                    # Messages written before the timer started (inputs=, and
                    # sends from on_start) trigger right after t = start.
                    actor.trigger_key = first_trigger
            self._mode = STOPPING if self._stop_requested else RUNNING
            for actor in self.actors:
                self._schedule(actor)
            self._cond.notify_all()

    def set_end(self, end_ns: int | None, grace_ns: int) -> None:
        """Set the run's end: timed work due after ``end_ns`` does not run.

        Args:
            end_ns (int | None): the end, ns of the timer; None runs until stopped.
            grace_ns (int): real time: how long (ns) hooks still in flight at
                the end may hold the run before it ends anyway (the run's
                ``stop_timeout``).
        """
        with self._cond:
            self._end_ns = end_ns
            self._end_grace_ns = grace_ns
            self._cond.notify_all()

    @property
    def end_ns(self) -> int | None:
        """int | None: the run's end set by `set_end` (ns of the timer), None without one."""
        return self._end_ns

    def hold_at(self, ns: int | None) -> None:
        """Simulated time: hold at the cut at ``ns`` (the next scheduled snapshot).

        Once every instant up to ``ns`` is done, and none after it started,
        the timer moves to ``ns`` and the dispatcher holds, with
        `take_cut_due` then True. A cut after the run's end is never reached.

        Args:
            ns (int | None): the cut's time, ns of the timer; None: no cut.
        """
        with self._cond:
            self._hold_at_ns = ns

    @property
    def next_cut_ns(self) -> int | None:
        """int | None: the cut asked for with `hold_at` and not yet reached."""
        return self._hold_at_ns

    def take_cut_due(self) -> bool:
        """Whether the hold now is the scheduled cut of `hold_at`; clears it.

        Returns:
            bool: True once for each hold at a scheduled cut.
        """
        with self._cond:
            due, self._cut_due = self._cut_due, False
            return due

    def request_hold(self) -> None:
        """Ask for a consistent cut: no hook in flight, timed work held.

        In real time the cut comes as soon as the hooks in flight return; in
        simulated time once the current instant (with its delta cycles) is
        done. The hold is announced through the listener's ``held``; it lasts until
        `release`. A request that can wait no longer is taken back with
        `withdraw_hold`.
        """
        with self._cond:
            self._hold_requested += 1
            if self._mode == RUNNING:
                if not self.simulated:
                    self._unclaim()
                self._try_hold_now()
            self._cond.notify_all()

    def withdraw_hold(self) -> dict[str, str] | None:
        """Take back one `request_hold` that has not been met yet.

        Returns:
            None when the dispatcher holds already (the request is met: the
            caller must `release` as usual); otherwise the hooks that kept the
            cut from coming, ``{node path: hook name}``, and timed work goes on
            unless another request is still pending.
        """
        with self._cond:
            if self.held:
                return None
            if self._hold_requested:
                self._hold_requested -= 1
            busy = {a.path: a.hook or "?" for a in self.actors if a.busy}
            self._cond.notify_all()  # workers that saw the request wait for a notify
            return busy

    def busy_hooks(self) -> dict[str, str]:
        """The hooks in flight now, ``{node path: hook name}`` (``"?"`` between hooks)."""
        with self._cond:
            return {a.path: a.hook or "?" for a in self.actors if a.busy}

    def release(self, restart_at_ns: int | None = None) -> None:
        """Let timed work run again after a hold.

        Args:
            restart_at_ns: when given, every actor's schedule restarts from this
                time (a whole-net restore: ticks continue on their grid after
                it, and a simulated timer rewinds to it).
        """
        with self._cond:
            self.held = False
            self._hold_requested = 0
            if self._mode != CONTROL:
                return
            if restart_at_ns is not None:
                self._restart_schedules(restart_at_ns)
            self._mode = STOPPING if self._stop_requested else RUNNING
            for actor in self.actors:
                self._schedule(actor)
            self._cond.notify_all()

    def _restart_schedules(self, start_ns: int) -> None:
        if self.simulated:
            self.timer.rewind_to(start_ns)  # type: ignore[attr-defined]
        self._frontier = (start_ns, 0)
        first_trigger = (start_ns, 1) if self.simulated else (start_ns, 0)
        for actor in self.actors:
            actor.schedule_first_tick(start_ns)
            actor.queued_key = None
            if actor.trigger_key is not None:
                actor.trigger_key = first_trigger
        self._heap.clear()
        self._due.clear()
        self._queued = 0

    def _enter_hold(self, scheduled: bool = False) -> None:
        if self._crowded:  # a cut between instants: what it holds is bounded too
            self._prune_crowded()
        self._mode = CONTROL
        self.held = True
        self._cond.notify_all()
        if scheduled:
            self._cut_due = True
        self._listener.held()

    def _try_hold_now(self) -> bool:
        """Hold if nothing is in flight and, in simulated time, the instant is done."""
        if self._inflight or (self.simulated and self._instant_pending()):
            return False
        self._enter_hold()
        return True

    def stop_at_boundary(self) -> None:
        """Stop starting timed work once the current instant is done; hooks in flight finish.

        With simulated time the current instant (its delta cycles included)
        finishes first, so the final state is a clean cut that does not depend
        on the number of workers; with real time timed work stops at once.
        The way a run ends (see the coordinator's end).
        """
        self._request_stop(boundary=True)

    def stop_now(self) -> None:
        """Stop starting timed work at once, even within a simulated instant.

        The escalation of `stop_at_boundary` when its boundary does not come
        (a hook of the instant is stuck): the rest of the instant never runs.
        """
        self._request_stop(boundary=False)

    def _request_stop(self, boundary: bool) -> None:
        with self._cond:
            self._unclaim()
            self._stop_requested = True
            if boundary and self.simulated and self._mode == RUNNING:
                if not self._inflight and not self._instant_pending():
                    self._mode = STOPPING
            elif self._mode in (CONTROL, RUNNING):
                self._mode = STOPPING
            self._cond.notify_all()

    def wait_stopping(self, timeout: float) -> bool:
        """Wait until timed work no longer starts; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._mode == RUNNING:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wait(left)
            return True

    def _instant_pending(self) -> bool:
        first = self._global_min()
        return first is not None and first[0] == self._frontier[0]

    def shutdown(self) -> None:
        """Make every thread exit once it is out of its hook."""
        with self._cond:
            self._mode = SHUTDOWN
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> list[Actor]:
        """Wait until no hook is in flight; return the actors still busy at timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._unclaim()
            while self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._wait(left)
            return [a for a in self.actors if a.busy]

    # -- control phases (start, stop) -----------------------------------------------
    def run_control(self, actors: list[Actor], envelope: Any, timeout: float,
                    help: bool = False) -> list[Actor]:
        """Post ``envelope`` to each actor and wait until all have handled it.

        Pool actors' envelopes are taken in the order of ``actors`` (the
        net's order), so with one worker and no helpers they run one after
        the other in that order. The calling thread only waits: it never runs
        a hook itself, so that the deadline holds whatever a hook does.

        Args:
            actors (list[Actor]): the actors, in the order their envelopes start.
            envelope: a control envelope (`Start`, `Stop`, `Restore`, ...), one
                object posted to every actor.
            timeout (float): wall seconds to wait in all.
            help (bool): helper threads run pool actors' envelopes alongside
                the workers, so that a phase finishes even when every worker
                is stuck in a hook (the stop phase). A helper is started
                whenever an envelope waits and no helper is free, so a helper
                stuck in a hook holds up only its own node. Dedicated actors
                always run theirs on their own thread.

        Returns:
            list[Actor]: those that had not handled the envelope after
            ``timeout``, in the order of ``actors``: still inside its hook
            (``busy``), or never started on it. The envelope of the latter is
            withdrawn, so it does not run later behind the caller's back.

        Raises:
            RuntimeError: timed work is not held (a defect of the caller).
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            if self._mode == RUNNING:
                raise RuntimeError("control phases run while timed work is held")
            if self._mode == STOPPING:
                self._mode = CONTROL
            for actor in actors:
                actor.mailbox.control.append(envelope)
            self._pending_control += len(actors)
            phase = id(envelope)  # unique while this call holds the envelope
            self._phase_left[phase] = len(actors)
            # Taken from the end of the control key's bucket (see _top): queued
            # in reverse, the envelopes start in the order of ``actors``.
            for actor in reversed(actors):
                if not actor.busy:
                    self._schedule(actor)
            self._cond.notify_all()
            try:
                while self._phase_left[phase]:
                    if help and not self._free_helpers and self._control_waits():
                        self._start_helper()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    # Polled too: an envelope queued behind a stuck helper wakes no one.
                    self._wait(min(left, 0.05))
            except BaseException:  # the waiting thread interrupted (KeyboardInterrupt)
                self._phase_left.pop(phase)
                self._withdraw(actors, envelope)  # none of them starts behind its back
                raise
            left = self._phase_left.pop(phase)
            if not left:
                return []
            late = [a for a in actors
                    if a.busy or any(e is envelope for e in a.mailbox.control)]
            self._withdraw(late, envelope)
            return late

    def _withdraw(self, actors: list[Actor], envelope: Any) -> None:
        """Take back ``envelope`` from the actors that have not started it (lock held)."""
        withdrawn = False
        for actor in actors:
            control = actor.mailbox.control
            left = [e for e in control if e is not envelope]
            if len(left) == len(control):
                continue
            self._pending_control -= len(control) - len(left)
            control[:] = left
            withdrawn = True
            if not actor.busy:
                actor.queued_key = None  # its control-key entry is stale now
                self._schedule(actor)
        if withdrawn:
            self._cond.notify_all()  # helpers waiting for the phase to end

    def hook_of(self, actor: Actor) -> str:
        """The name of the hook ``actor`` is in, for a report of stuck nodes.

        Also names ``load_state_dict``, which a `Restore` envelope runs outside
        ``actor.call``; ``"?"`` when nothing says.
        """
        if actor.hook is not None:
            return actor.hook
        envelope = self._in_control.get(actor)
        return getattr(envelope, "hook", None) or "?"

    def _control_waits(self) -> bool:
        """Whether a control envelope is queued and no thread has taken it (lock held)."""
        actor = self._top()
        return actor is not None and actor.queued_key[0] == CONTROL_T  # type: ignore[index]

    def _start_helper(self) -> None:
        """Start a helper thread for the control phase (lock held; see `run_control`)."""
        thread = threading.Thread(target=self._guarded, args=(self._helper_loop,),
                                  name=f"mujou-helper-{self._helpers_started}", daemon=True)
        self._helpers_started += 1
        self._free_helpers += 1  # free until it takes an envelope: one start per wait
        # Those that have exited go: many restarts must not grow the list.
        # A new list, not an edit: is_own_thread reads it without the lock.
        self._helpers = [t for t in self._helpers if t.is_alive()] + [thread]
        thread.start()

    def _helper_loop(self) -> None:
        """Run queued control envelopes until none waits (see `run_control`).

        It exits rather than wait for more: an envelope queued later (an
        actor's next one) is taken by a worker or by a helper started then.
        """
        name = threading.current_thread().name
        with self._cond:
            try:
                while self._mode != SHUTDOWN:
                    actor = self._pop_control()
                    if actor is None:
                        break
                    self._free_helpers -= 1
                    try:
                        self._run_locked(actor, name)
                    finally:
                        self._free_helpers += 1
            finally:
                self._free_helpers -= 1

    def _pop_control(self) -> Actor | None:
        actor = self._top()
        if actor is None or actor.queued_key[0] != CONTROL_T:  # type: ignore[index]
            return None
        self._take(actor)
        return actor

    # -- scheduling (lock held) ------------------------------------------------------
    def _wait(self, timeout: float | None) -> None:
        self._waiting += 1
        try:
            self._cond.wait(timeout)
        finally:
            self._waiting -= 1

    def _schedule(self, actor: Actor) -> None:
        """Queue a non-busy actor at its earliest pending key.

        The key is a control envelope's (first), else the earlier of the next
        tick ``(t, 0)`` and the pending trigger; none while timed work is held
        or after the actor failed (until a restart).
        """
        tick = None
        # _pending_control first: with none anywhere, the actor's list is not read.
        if self._pending_control and actor.control:
            key = CONTROL_KEY
        elif self._mode != RUNNING or actor.failed:
            actor.queued_key = None
            return
        else:
            key = actor.trigger_key
            tick = actor.next_tick_ns
            if tick is not None and (key is None or (tick, 0) < key):
                key = (tick, 0)
            if key is None:
                actor.queued_key = None
                return
        queued = actor.queued_key
        if queued is not None and queued <= key:
            return
        if actor.dedicated:
            actor.queued_key = key
            if self._waiting:
                self._cond.notify_all()
            return
        code = (key[0] << SHIFT) | key[1]
        entry = self._due.get(code)
        if entry is None:
            self._due[code] = (key, [actor])
            heapq.heappush(self._heap, code)
        else:
            key = entry[0]  # the bucket's key object (see the calendar's comment)
            entry[1].append(actor)
            if tick == key[0]:
                actor.next_tick_ns = key[0]
        actor.queued_key = key
        self._queued += 1
        # No notify here: callers queue many actors at once (a batch's
        # finish, a release) and wake the workers once when done.

    def _global_min(self) -> tuple[int, int] | None:
        """Earliest key of all pending work, dropping stale heap entries."""
        top = self._top()
        best = None if top is None else top.queued_key
        for actor in self._dedicated:
            k = actor.queued_key
            if k is not None and not actor.busy and (best is None or k < best):
                best = k
        return best

    def _may_start(self, key: tuple[int, int],
                   now: int | None = None) -> tuple[bool, float | None]:
        """Whether work at ``key`` may start now; else how long to wait (None: a notify).

        ``now``: the timer's time (ns) in real time, if the caller read it already.
        """
        if key == CONTROL_KEY:
            return True, None
        if self._mode != RUNNING:
            return False, None
        end = self._end_ns
        if self.simulated:
            if key == self._frontier:
                return True, None
            # The caller checked that the heap's top is live: without dedicated
            # actors it is the earliest pending work.
            if self._inflight or (self._dedicated and key != self._global_min()):
                return False, None
            return self._advance_simulated(key), None
        if self._hold_requested:
            self._try_hold_now()
            return False, None
        if now is None:
            now = self.timer.now_ns()
        if end is not None and (key[0] > end or now >= end + self._end_grace_ns):
            return False, self._realtime_end(now, end)
        if key[0] <= now:
            return True, None
        return False, (key[0] - now) / 1e9

    def _advance_simulated(self, key: tuple[int, int] | None) -> bool:
        """Nothing in flight, ``key`` is the earliest work (None: no work): move on.

        Returns True when work at ``key`` may start now; otherwise the run
        holds at a cut or ends.
        """
        if self._crowded:
            self._prune_crowded()
        t_next = None if key is None else key[0]
        frontier_t = self._frontier[0]
        if t_next is not None and t_next == frontier_t:
            self._frontier = key  # type: ignore[assignment]  # next delta cycle
            return True
        if self._stop_requested:
            self._mode = STOPPING
            self._cond.notify_all()
            return False
        end = self._end_ns
        cut = self._hold_at_ns
        if cut is not None and (t_next is None or t_next > cut) and (end is None or cut <= end):
            self._hold_at_ns = None
            self.timer.advance_to(cut)  # type: ignore[attr-defined]
            self._frontier = (cut, 0)
            self._enter_hold(scheduled=True)
            return False
        if self._hold_requested:
            self._enter_hold()
            return False
        if t_next is None or (end is not None and t_next > end):
            if end is not None:
                self._reach_end()
            return False
        self._frontier = key  # type: ignore[assignment]
        self.timer.advance_to(t_next)  # type: ignore[attr-defined]
        return True

    def _idle_wait(self) -> float | None:
        """Nothing is queued: hold or end the run if due, else say how long to wait."""
        end = self._end_ns
        if self._mode != RUNNING or self._inflight:
            return None
        if self._dedicated and self._global_min() is not None:
            return None
        if self.simulated:
            self._advance_simulated(None)
            return None
        if self._hold_requested:
            self._try_hold_now()
            return None
        if end is None:
            return None
        return self._realtime_end(self.timer.now_ns(), end)

    def _prune_crowded(self) -> None:
        """Prune the mailboxes that sends found over their bound (simulated time; lock held).

        Called between two instants, with no hook in flight: every delivery
        in a mailbox then goes into the Inputs at the node's next update, so
        `Mailbox.prune` removes only what that update would push out unseen,
        and the run's results do not change. Whether a mailbox is pruned
        depends only on its length now, not on which send saw it over its
        bound first: the same for any number of workers. (Every send to a
        mailbox that has a bound checks it, so a mailbox over its bound now
        was noted by its last send, if not before.)
        """
        crowded = list(self._crowded)
        self._crowded.clear()
        for actor in crowded:
            actor.prune_at = actor.bound  # sends check it again
            if len(actor.deliveries) > actor.bound:
                for port, _ in actor.prune(True):
                    port._log_first_drop()

    def _prune_now(self, actor: Actor) -> None:
        """Prune ``actor``'s mailbox now (real time), holding its lock; no other lock held."""
        lock = actor.mailbox.lock
        if lock is None:  # keeps every message (its bound is NEVER): not reached
            return
        with lock:
            if len(actor.deliveries) <= actor.prune_at:
                return  # another sender pruned it meanwhile
            lost = actor.prune(False)
        for port, _ in lost:
            port._log_first_drop()

    def _realtime_end(self, now: int, end: int) -> float | None:
        """End a real-time run once its work due by ``end`` is done; else the wait.

        Hooks still in flight ``grace_ns`` (`set_end`) after the end no longer hold
        the run: it ends, and stopping reports them as stuck.
        """
        if now < end:
            return (end - now) / 1e9
        late = now >= end + self._end_grace_ns
        first = self._global_min()
        if late or (not self._inflight and (first is None or first[0] > end)):
            self._reach_end()
            return None
        return (end + self._end_grace_ns - now) / 1e9

    def _reach_end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self.simulated and self._end_ns is not None:
            self.timer.advance_to(self._end_ns)  # type: ignore[attr-defined]
        self._mode = STOPPING
        self._cond.notify_all()
        # The listener only posts an event: the end is handled on its thread.
        self._listener.reached_end()

    # -- worker and dedicated loops -----------------------------------------------
    def _worker_loop(self) -> None:
        name = threading.current_thread().name
        wait_ = self._wait
        top = self._top
        simulated, now_ns = self.simulated, self.timer.now_ns
        with self._cond:
            while self._mode != SHUTDOWN:
                actor = top()
                if actor is None:
                    wait_(self._idle_wait())
                    continue
                key = actor.queued_key
                if key[0] == CONTROL_T:  # type: ignore[index]
                    self._take(actor)
                    self._run_locked(actor, name)
                    continue
                # Real time: one reading of the clock decides and stamps the claim.
                now = None if simulated else now_ns()
                ok, wait = self._may_start(key, now)  # type: ignore[arg-type]
                if not ok:
                    wait_(wait)
                    continue
                self._run_batch(self._claim_batch(key, name, now), name)  # type: ignore[arg-type]

    def _top(self) -> Actor | None:
        """A live actor of the earliest key (its bucket's last), dropping stale entries.

        An entry is stale when its actor was queued again at another key since
        (its ``queued_key`` is not the bucket's), or is busy. The actor stays
        queued. Called with the lock held.
        """
        heap, due = self._heap, self._due
        while heap:
            code = heap[0]
            key, bucket = due[code]
            while bucket:
                actor = bucket[-1]
                if actor.queued_key is key and not actor.busy:
                    return actor
                bucket.pop()
                self._queued -= 1
            del due[code]
            heapq.heappop(heap)
        return None

    def _take(self, actor: Actor) -> None:
        """Remove ``actor``, just returned by `_top`, from its bucket (lock held)."""
        self._due[self._heap[0]][1].pop()
        self._queued -= 1

    def _dedicated_loop(self, actor: Actor) -> None:
        name = threading.current_thread().name
        with self._cond:
            while self._mode != SHUTDOWN:
                key = actor.queued_key
                if key is None or actor.busy:
                    self._wait(self._idle_wait())
                    continue
                ok, wait = self._may_start(key)
                if not ok:
                    self._wait(wait)
                    continue
                self._run_locked(actor, name)

    # -- running hooks ----------------------------------------------------------------
    #
    # A hook runs in three steps: claim (lock held: the actor becomes busy and
    # its trigger is consumed), run (no lock) and finish (lock held: statistics
    # of the thread, deferred triggers, the actor's next key). A worker claims
    # a *batch* of actors that may all start now, so a lock hand-over is paid
    # per batch rather than per hook: for no-op hooks it is most of the cost.

    def _claim_batch(self, key: tuple[int, int], name: str,
                     now: int | None = None) -> list[Claim]:
        """Claim the queued actors at ``key = (t, d)``, the earliest, that may start now.

        Simulated time: the actors queued at exactly ``(t, d)`` (the
        frontier). Real time: those of the following keys too, as long as
        they are due (and due by the run's end). At most ``BATCH_MAX`` (the
        only worker: ``BATCH_MAX_ALONE``; real time with several workers: 1);
        with more than one worker a batch also stops once the members' mean
        hook times add up to ``BATCH_BUDGET_NS`` (see `_cost`), so slow hooks
        are spread over the workers.
        Called with the lock held and a live actor first at ``key``; ``now``:
        the timer's time (ns) in real time, if the caller read it already.
        """
        heap, due = self._heap, self._due
        t = key[0]
        simulated = self.simulated
        if simulated:
            now = limit_t = t
        else:
            if now is None:
                now = self.timer.now_ns()
            end = self._end_ns
            limit_t = now if end is None else min(now, end)
        budget = self._batch_budget_ns
        most = self._batch_max
        spent = taken = 0
        # (key, actors) per key; a whole bucket is taken as it is, stale
        # entries included (the claim skips them).
        groups: list[tuple[tuple[int, int], list[Actor]]] = []
        while True:
            code = heap[0]  # the earliest key
            key, bucket = due[code]
            if budget is None and len(bucket) + taken <= most:
                del due[code]  # the whole bucket, in the order queued
                heapq.heappop(heap)
                self._queued -= len(bucket)
                groups.append((key, bucket))
                taken += len(bucket)
            else:
                group: list[Actor] = []
                while bucket and taken < most:
                    actor = bucket.pop()
                    if actor.queued_key is not key or actor.busy:
                        self._queued -= 1
                        continue  # stale: queued again elsewhere
                    if budget is not None:
                        spent += _cost(actor, budget)
                        if taken and spent > budget:
                            bucket.append(actor)
                            break
                    self._queued -= 1
                    group.append(actor)
                    taken += 1
                groups.append((key, group))
                if bucket:
                    break
                del due[code]
                heapq.heappop(heap)
            if simulated or taken >= most or not heap:
                break
            t = heap[0] >> SHIFT
            if t > limit_t or t == CONTROL_T:
                break
        return self._claim(groups, now, name)

    def _claim(self, groups: list[tuple[tuple[int, int], list[Actor]]], now: int,
               name: str) -> list[Claim]:
        """Make the live actors of ``groups`` busy for their timed work (lock held).

        Each group is ``(key, actors)``: actors queued at ``key`` whose
        ``queued_key`` must still be that object (else the entry is stale). An
        actor's trigger is consumed if due by ``key``. Returns the claims
        ``(actor, now_ns, due_ns, is_tick, consumed trigger)``.
        """
        simulated = self.simulated
        traced = self.trace is not None
        batch: list[Claim] = []
        # Real time: ticks due by now count, but none after the run's end (a
        # trigger claimed late must not consume a tick that is not due).
        end = self._end_ns
        due_by = now if end is None or now < end else end
        for key, group in groups:
            t, d = key
            for actor in group:
                if actor.queued_key is not key or actor.busy:
                    continue
                actor.queued_key = None
                actor.busy = True
                tick = actor.next_tick_ns
                if simulated:
                    is_tick = d == 0 and tick == t
                else:
                    is_tick = tick is not None and tick <= due_by
                due = tick if is_tick else 0
                trig = actor.trigger_key
                if trig is not None and trig <= key:
                    actor.trigger_key = None
                    if not is_tick:
                        due = trig[0]
                else:
                    trig = None
                actor.stamp = key
                actor.thread_name = name
                batch.append((actor, now, due, is_tick, trig))  # type: ignore[arg-type]
                if traced:  # queue depths, recorded with the hook's slice
                    actor.depths = (self._queued, self._inflight + len(batch))
        self._inflight += len(batch)
        return batch

    def _run_batch(self, batch: list[Claim], name: str) -> None:
        """Run a claimed batch (called and returns with the lock held).

        The members of a batch of several are taken one by one from a shared
        deque, so that `_unclaim` can give the ones not started yet back to
        the schedule (a stop or a cut must not wait for them behind a stuck
        hook). Each member's due deliveries are applied, then its update
        runs; a failure of either is the node's failure.
        """
        if len(batch) == 1:  # the common case in real time: no deque, no lists
            actor = batch[0][0]
            self._cond.release()
            took = 0
            try:
                took = self._run_claimed(batch[0], fresh=False)
            finally:
                self._cond.acquire()
                self._busy_ns[name] += took
                self._finish(actor)
                self._inflight -= 1
                if self._waiting:
                    self._cond.notify_all()
            return
        rec = _Batch(batch)
        self._batches[id(rec)] = rec
        self._cond.release()
        busy = 0  # the members' hook times, for the worker's busy share
        try:
            todo, done = rec.todo, rec.done
            take = todo.popleft
            run = self._run_claimed
            while todo:
                try:
                    item = take()
                except IndexError:  # given back meanwhile
                    break
                busy += run(item)
                done.append(item[0])
        finally:
            self._cond.acquire()
            del self._batches[id(rec)]
            self._busy_ns[name] += busy
            self._finish_done(rec, final=True)
            if self._waiting:
                self._cond.notify_all()

    def _finish_done(self, rec: _Batch, final: bool = False) -> None:
        """`_finish` the members of a batch that have run (lock held).

        Called as the batch ends (``final``: its worker appends no more), and
        by `_unclaim` while it still runs, so that members behind a stuck hook
        are not held busy: each member is taken from ``rec.done`` once, by
        whichever comes first.
        """
        done = rec.done
        if final:
            actors = list(done)
            done.clear()
        else:  # the worker may append meanwhile: take one at a time
            actors = []
            while True:
                try:
                    actors.append(done.popleft())
                except IndexError:
                    break
        owes = self._owed
        schedule = self._schedule
        for actor in actors:  # what _finish does, inlined: this runs once per update
            if owes:
                self._take_owed(actor)
            if actor.deferred:
                self._flush_triggers(actor)
            actor.busy = False
            schedule(actor)
        self._inflight -= len(actors)

    def _run_claimed(self, item: Claim, fresh: bool = True) -> int:
        """Apply a claimed actor's due deliveries and run its update (no lock held).

        In real time the update starts at the timer's time read now
        (``fresh``), or, for a hook claimed alone, at the claim's: that was
        read just before the lock was released, and one clock read fewer
        per hop is measurable in a ping-pong. A trigger key owed to
        deliveries kept for a later hook goes to ``_owed``.

        Returns the hook's wall time (ns; 0 without statistics), which the
        caller adds to its thread's busy time.
        """
        actor, now, due, is_tick, _ = item
        ran = False
        try:
            if fresh and not self.simulated:
                now = self.timer.now_ns()  # at the start of the hook, not of the batch
            if actor.inputs and actor.deliveries:  # no Inputs: the deque stays unread
                owed = actor.apply_deliveries(actor.stamp if self.simulated else None)
                if owed is not None:
                    self._owed[actor] = owed
            ran = True
            return actor.run_update(now, due, is_tick, self._end_ns)
        except BaseException as exc:  # noqa: BLE001 - reported, never swallowed
            self._fail(actor, "on_update", exc)
            took, actor.last_hook_ns = actor.last_hook_ns, 0  # taken once
            return took if ran and actor.timed else 0

    def _take_owed(self, actor: Actor) -> None:
        """Move a trigger key owed to ``actor`` (see `_run_claimed`) to its trigger (lock held)."""
        owed = self._owed.pop(actor, None)
        if owed is not None and (actor.trigger_key is None or owed < actor.trigger_key):
            actor.trigger_key = owed

    def _finish(self, actor: Actor) -> None:
        """After an actor's hook (lock held): the triggers it owes and defers,
        and its next key. The caller counts the busy time and lowers ``_inflight``."""
        if self._owed:
            self._take_owed(actor)
        if actor.deferred:
            self._flush_triggers(actor)
        actor.busy = False
        self._schedule(actor)

    def _flush_triggers(self, sender: Actor) -> None:
        """Apply the triggers that ``sender``'s sends deferred to the end of its hook.

        Their key is that of every send of the hook (see `make_send`).
        """
        t, d = sender.stamp
        key = (t, d + 1) if self.simulated else (t, 0)
        deferred = sender.deferred
        for reader in deferred:  # type: ignore[union-attr]
            current = reader.trigger_key
            if current is None or key < current:
                reader.trigger_key = key
                if not reader.busy:
                    self._schedule(reader)
        deferred.clear()  # type: ignore[union-attr]  # the sends hold this very dict

    def _unclaim(self) -> None:
        """Free the batches in flight of every member but the one running (lock held).

        Members not started yet go back to the schedule; members that have
        run are finished now rather than when their batch ends (a stop or a
        cut must not wait for them behind a stuck hook).
        """
        for rec in self._batches.values():
            self._finish_done(rec)
            while True:
                try:
                    actor, _, _, _, trig = rec.todo.pop()
                except IndexError:
                    break
                if trig is not None and (actor.trigger_key is None or trig < actor.trigger_key):
                    actor.trigger_key = trig
                self._inflight -= 1
                actor.busy = False
                self._schedule(actor)
        self._cond.notify_all()

    def _run_locked(self, actor: Actor, name: str) -> None:
        """Run the actor's next work alone: a control envelope, or a dedicated thread's update.

        Called and returns with the lock held.
        """
        key = actor.queued_key
        if key != CONTROL_KEY:
            assert key is not None
            now = key[0] if self.simulated else self.timer.now_ns()
            self._run_batch(self._claim([(key, [actor])], now, name), name)
            return
        actor.queued_key = None
        actor.busy = True
        self._inflight += 1
        actor.thread_name = name
        if self.trace is not None:
            actor.depths = (self._queued, self._inflight)
        control = actor.mailbox.control.pop(0)
        actor.stamp = self._control_stamp()
        self._in_control[actor] = control  # names the hook should it get stuck
        self._cond.release()
        try:
            self._run_control(actor, control)
        finally:
            self._cond.acquire()
            # The envelope's hook time, if it ran one through call(); taken
            # once (an envelope that runs no hook, a Restore, adds nothing).
            took, actor.last_hook_ns = actor.last_hook_ns, 0
            if name in self._busy_ns:  # a helper of a control phase is no worker
                self._busy_ns[name] += took
            self._pending_control -= 1
            del self._in_control[actor]
            left = self._phase_left.get(id(control))
            if left is not None:
                self._phase_left[id(control)] = left - 1
            if actor.deferred:
                self._flush_triggers(actor)
            self._inflight -= 1
            actor.busy = False
            self._schedule(actor)
            if self._waiting:
                self._cond.notify_all()

    def _control_stamp(self) -> tuple[int, int]:
        """The key that a control hook's sends carry (lock held).

        Before the timer starts, the control key: `start_running` moves the
        triggers it causes to just after the start. Later (a restart's
        ``on_start`` or ``on_stop``), the instant the run is at, so that its
        messages are ordered and trigger their readers like any hook's sends.
        """
        if self._frontier == CONTROL_KEY:
            return CONTROL_KEY
        return self._frontier if self.simulated else (self.timer.now_ns(), 0)

    def _run_control(self, actor: Actor, envelope: Any) -> None:
        # A CUDA node's stream is waited for after on_start and on_stop as after
        # on_update, also after a failure: the run starts with the work of every
        # on_start done, and join() never returns with a node's GPU work queued.
        if isinstance(envelope, Start):
            try:
                try:
                    actor.call("on_start")
                finally:
                    actor.wait_stream()
            except BaseException as exc:  # noqa: BLE001
                self._fail(actor, "on_start", exc)
            else:
                actor.started = True
        elif isinstance(envelope, Stop):
            if actor.started:
                actor.started = False
                try:
                    try:
                        actor.call("on_stop")
                    finally:
                        actor.wait_stream()
                except BaseException as exc:  # noqa: BLE001
                    self._fail(actor, "on_stop", exc)
        else:
            try:
                envelope(actor)
            except BaseException as exc:  # noqa: BLE001
                self._fail(actor, envelope.hook, exc)

    def run_here(self, actors: list[Actor], envelope: Callable[[Actor], None],
                 timeout: float | None = None) -> list[Actor]:
        """Run ``envelope`` for each actor on the calling thread, one actor at a time.

        Used at a cut for snapshots, so that no worker waits for a CUDA node's
        stream: the actors are marked busy meanwhile, so nothing else of them
        runs (a restart's control envelopes may run during a cut). All those
        not busy are taken in one go, the others as they come free; the
        workers are woken once at the end (at a cut they have nothing to do,
        and waking them per actor would only make them fight this thread for
        the GIL).

        Args:
            timeout: wall seconds to wait for actors that are busy (a
                restart's hook); None waits for them.

        Returns:
            The actors still busy at ``timeout``, or once the run is stopping,
            whose envelope did not run (empty when all ran).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        left = list(actors)
        try:
            while left:
                with self._cond:
                    while all(a.busy for a in left):
                        wait = None if deadline is None else deadline - time.monotonic()
                        if (wait is not None and wait <= 0) or self._mode in (STOPPING,
                                                                               SHUTDOWN):
                            return left  # the run is stopping: it takes no cut now
                        self._wait(wait)
                    mine = [a for a in left if not a.busy]
                    left = [a for a in left if a.busy]
                    for actor in mine:
                        actor.busy = True
                try:
                    for actor in mine:
                        envelope(actor)
                finally:
                    with self._cond:
                        for actor in mine:
                            if actor.deferred:
                                self._flush_triggers(actor)
                            actor.busy = False
                            self._schedule(actor)
        finally:
            with self._cond:
                self._cond.notify_all()
        return left

    def post_control(self, actor: Actor, envelopes: list[Any]) -> None:
        """Queue control envelopes for one actor while the run goes on (a restart)."""
        with self._cond:
            actor.mailbox.control.extend(envelopes)
            self._pending_control += len(envelopes)
            if not actor.busy:
                self._schedule(actor)
            self._cond.notify_all()

    def discard_messages(self) -> None:
        """Drop every undelivered message and pending trigger (a whole-net restore)."""
        with self._cond:
            for actor in self.actors:
                actor.mailbox.deliveries.clear()
                actor.trigger_key = None

    def pending_deliveries(self, actor: Actor) -> list[Delivery]:
        """The actor's undelivered messages in delivery order (call while held)."""
        inputs = actor.inputs
        queued = list(actor.mailbox.deliveries)
        if self.simulated:
            queued.sort(key=STAMP)  # stable: a stamp's messages in send order
        return [Delivery(*unstamp(d[0]), inputs[d[1]], d[2]) for d in queued]

    def _fail(self, actor: Actor, hook: str, exc: BaseException) -> None:
        """Report that ``actor``'s ``hook`` raised ``exc`` (whatever it is: any BaseException).

        The listener's ``hook_failed`` is reached even if tracing the failure
        raises, and the thread running the hook goes on either way.
        """
        actor.failed = True
        if self.trace is not None:
            try:
                self.trace.failure(actor, hook, exc)
            except BaseException as err:  # noqa: BLE001 - the failure itself must get through
                log.error("could not trace the failure of node %r in %s", actor.path, hook,
                          exc_info=err)
        self._listener.hook_failed(actor, hook, exc)

    # -- messages ----------------------------------------------------------------------
    def trigger(self, actor: Actor, key: tuple[int, int]) -> None:
        """Make ``actor`` run a triggered update at ``key`` (or earlier)."""
        with self._cond:
            current = actor.trigger_key
            if current is None or key < current:
                actor.trigger_key = key
                if not actor.busy:
                    self._schedule(actor)
                    if self._waiting:
                        self._cond.notify()

    def host_deliver(self, actor: Actor, slot: int, message: Any, triggers: bool) -> None:
        """Deliver a message written by the host (run.write, inputs=) to ``actor.inputs[slot]``."""
        actor.bound_mailbox()
        with self._cond:
            self._host_seq += 1
            seq = self._host_seq
            box = actor.mailbox.deliveries
            box.append((HOST_STAMP, slot, message, seq))
            lost = None
            if len(box) > actor.prune_at:
                if not self.simulated:
                    self._prune_now(actor)  # the mailbox's lock inside ours, never the reverse
                elif actor.busy:  # its hook may be taking deliveries: between instants
                    self._crowded[actor] = None
                    actor.prune_at = NEVER
                else:
                    # Not busy, and it can only be claimed under our lock: its
                    # next hook, at the current instant or later, takes every
                    # delivery stamped before this instant (this one too), so
                    # those can be pruned now. (An idle net may never reach the
                    # next instant.)
                    lost = actor.prune(True, pack(self._frontier) << ORDER_BITS)
            if triggers:
                if self._frontier == CONTROL_KEY:  # the timer has not started
                    key = CONTROL_KEY  # made (start, 1) when it starts
                elif self.simulated:  # running, or held at a cut: the next delta cycle
                    t, d = self._frontier
                    key = (t, d + 1)
                else:
                    key = (self.timer.now_ns(), 0)
                current = actor.trigger_key
                if current is None or key < current:
                    actor.trigger_key = key
                if not actor.busy:
                    self._schedule(actor)
                    if self._waiting:
                        self._cond.notify()
        for port, _ in lost or ():
            port._log_first_drop()

    def make_send(self, sender: Actor, output: Any, routes: list[tuple[Any, Actor, bool]],
                  view: Any, copy: Callable[[Any], Any]) -> Callable[[Any], None]:
        """Build the ``send`` of one Output of ``sender`` for this run.

        The run installs it on the Output, so a hook's ``out.send(value)`` is a
        single call that checks, copies, stamps and delivers (see
        `ports.Output.send` for what it promises).

        Args:
            sender: the actor owning the Output.
            output: the Output.
            routes: ``(input, reader actor, triggers)`` for every connected Input.
            view: the host's view of the Output (``last`` and ``listeners``).
            copy: makes the message the readers share from the sent value
                (value semantics, on the path the readers' devices ask for).
        """
        # A trigger is deferred to the end of the sending hook when nothing
        # could run the reader earlier anyway: in simulated time (a triggered
        # update at (t, d + 1) waits for the instant (t, d) to finish), and in
        # real time with one worker busy with the sender. That saves a lock
        # hand-over per send.
        for _, reader, _ in routes:
            reader.bound_mailbox()
        # Every send to a reader with a bounded Input checks the bound, also
        # those to its depth=None Inputs: in simulated time, whether a mailbox
        # is over its bound between two instants must be seen by its last send,
        # whichever thread made it (see _prune_crowded).
        plan = [(reader.slot(port), reader.mailbox.deliveries, reader,
                 0 if not triggers else DEFER if self._defers(sender, reader) else NOW,
                 port if port in output._strict_readers else None,
                 reader.bound != NEVER)
                for port, reader, triggers in routes]
        if CURRENT not in sender.context:
            sender.context.run(CURRENT.set, sender)  # what the send checks
        if sender.deferred is None and any(route[3] is DEFER for route in plan):
            sender.deferred = {}  # made once; emptied as each hook ends
        if len(plan) == 1 and self.trace is None:
            return self._send_one(sender, output, plan[0], view, copy)
        return self._send_many(sender, output, routes, plan, view, copy)

    def _crowd(self) -> Callable[[Actor], None]:
        """What a send does with a reader whose mailbox it finds over its bound.

        Simulated time: note it, to be pruned between two instants (the
        current instant's hooks may still take some of its deliveries and not
        others). Real time: prune it now.
        """
        if self.simulated:
            crowded = self._crowded

            def note(reader: Actor) -> None:
                crowded[reader] = None
                reader.prune_at = NEVER  # noted: the instant's other sends need not check

            return note
        return self._prune_now

    def _send_one(self, sender: Actor, output: Any, route: tuple[Any, ...],
                  view: Any, copy: Callable[[Any], Any]) -> Callable[[Any], None]:
        """`make_send` for an Output with one reader and no trace: the common case, lean."""
        check, exact = output._check, output._spec.exact
        slot, box, reader, how, narrow, bounded = route
        crowd = self._crowd()
        reader_check = None if narrow is None else _reader_check(output, narrow)
        reader_exact = None if narrow is None else narrow._spec.exact
        append = box.append
        deferred = sender.deferred
        order = sender.order
        trigger = self.trigger
        simulated = self.simulated
        running = CURRENT.get
        # The stamp of the hook in flight, packed once per hook (mailbox.stamp)
        # and shared by its messages: the sender's key object changes at
        # each hook, and is held here so its identity cannot be reused.
        seen: Any = None
        stamped = 0

        def send(value: Any) -> None:
            nonlocal seen, stamped
            if sender.hook is None or running(None) is not sender:
                raise _not_in_hook(sender, output, send)
            vt = type(value)
            if check is not None and vt is not exact:
                value = check(value)
                vt = type(value)
            if vt in SCALARS:  # immutable: shared as it is
                message = value
                if reader_check is not None and vt is not reader_exact:
                    message = reader_check(value)  # a narrower reader: int -> float
            else:
                if reader_check is not None:
                    reader_check(value)  # passes a non-scalar through as it is
                message = value = copy(value)
            key = sender.stamp
            if key is not seen:
                seen, stamped = key, stamp(key, order)
            append((stamped, slot, message))  # a delivery (mailbox.Delivery)
            if bounded and len(box) > reader.prune_at:
                crowd(reader)  # the mailbox's bound: see Actor.prune
            if how is DEFER:
                deferred[reader] = None
            elif how:
                # Real time: the triggered update is due when the sending
                # update was, so work caused by a tick due before the run's
                # end still runs, and lateness is end-to-end.
                t, d = key
                trigger(reader, (t, d + 1) if simulated else (t, 0))
            view.last = value
            if view.listeners:
                view.publish(value)

        return send

    def _send_many(self, sender: Actor, output: Any, routes: list[tuple[Any, Actor, bool]],
                   plan: list[tuple[Any, ...]], view: Any,
                   copy: Callable[[Any], Any]) -> Callable[[Any], None]:
        """`make_send` for any number of readers, traced or not."""
        check = output._check
        order = sender.order
        seen: Any = None
        stamped = 0
        trigger = self.trigger
        simulated = self.simulated
        running = CURRENT.get
        trace = self.trace
        deferred = sender.deferred
        checks = [None if route[4] is None else _reader_check(output, route[4])
                  for route in plan]
        narrow = any(c is not None for c in checks)
        crowd = self._crowd()

        def send(value: Any) -> None:
            nonlocal seen, stamped
            if sender.hook is None or running(None) is not sender:
                raise _not_in_hook(sender, output, send)
            if check is not None:
                value = check(value)
            # Every reader's check passes before anything is delivered; a
            # narrower reader gets a scalar as its own check gives it (an int
            # becomes a float for a float Input); other values pass as they
            # are and share the one copy.
            narrowed = [value if c is None else c(value) for c in checks] if narrow else None
            if type(value) not in SCALARS:
                value = copy(value)
            key = sender.stamp
            if key is not seen:  # as in _send_one
                seen, stamped = key, stamp(key, order)
            t, d = key
            if trace is not None:  # before any reader can see the message
                seq = sender.seq = sender.seq + 1  # names the trace's flow arrows
                trace.send(sender, output, seq, routes)
            for i, (slot, box, reader, how, _, bounded) in enumerate(plan):
                message = value
                if narrowed is not None and type(narrowed[i]) in SCALARS:
                    message = narrowed[i]
                if trace is None:
                    box.append((stamped, slot, message))  # a delivery (mailbox.Delivery)
                else:
                    box.append((stamped, slot, message, seq))
                if bounded and len(box) > reader.prune_at:
                    crowd(reader)  # the mailbox's bound: see Actor.prune
                if how is DEFER:
                    deferred[reader] = None
                elif how:
                    trigger(reader, (t, d + 1) if simulated else (t, 0))
            view.last = value
            if view.listeners:
                view.publish(value)

        return send

    def _defers(self, sender: Actor, reader: Actor) -> bool:
        """Whether ``sender``'s triggers of ``reader`` may wait for the end of its hook."""
        if self.simulated:
            return True
        return self.n_workers == 1 and not sender.dedicated and not reader.dedicated

    def busy_fractions(self) -> dict[str, float]:
        """Share of wall time each thread spent running hooks, by thread name."""
        elapsed = max(1, time.perf_counter_ns() - self._started_ns)
        with self._cond:
            return {name: busy / elapsed for name, busy in self._busy_ns.items()}
