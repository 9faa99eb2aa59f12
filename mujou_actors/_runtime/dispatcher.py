"""The dispatcher: the lock, the threads' loops, claiming and finishing hooks, the phases.

One lock guards the schedule. Actors that are ready sit in the `Calendar`
(the ready queue, earliest key first). A worker takes the earliest, with it
the others that may start at once (a batch), runs their hooks with the lock
released, and finishes each (`_finish`: its owed and deferred triggers, its
next key). An actor is queued at most once and never on two threads at once,
so the hooks of one node never overlap, and the lock hand-over makes each
hook see what the previous one wrote, whichever thread ran it.

Where simulated and real time differ, the dispatcher asks its `TimePolicy`
and acts on the decision. Simulated time adds one rule: work at a later
``(time, delta)`` waits until everything earlier has finished, so a message
sent at ``(t, d)`` is applied before any later hook of its reader and never
during the same cycle, and deliveries are sorted by stamp: the result is
bit-identical whatever the number of workers.

What the dispatcher tells its driver goes through one `KernelListener`
(a hook failed, the end is reached, the net is held, a thread crashed); what
the driver asks goes through the public methods below. Which methods take the
lock: every public method takes it (none may be called with it held); every
method whose name starts with an underscore is called with it held, except
`_run_claimed` and the loops, which say so.

Dedicated-thread actors are not in the heap; each has a thread that waits
for its own key under the same rules.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import AlgebraicLoopError
from .actor import NEVER, Actor
from .calendar import Calendar, Group
from .keys import CONTROL_KEY, CONTROL_T, HOST_STAMP, ORDER_BITS, Key, SharedKey, pack, unstamp
from .loops import DEFAULT_MAX_DELTA_CYCLES, Loop, describe_loop
from .mailbox import STAMP, Delivery, Envelope, Snapshot
from .overdue import DeadlineMonitor
from .policy import RealTime, SimulatedTime, Step, make_policy
from .protocols import KernelListener
from .sends import SendContext
from .workers import on_time

if TYPE_CHECKING:
    from ..ports import Input
    from ..timers import Timer
    from ..trace import Recorder

__all__ = ["Dispatcher", "Mode"]

log = logging.getLogger("mujou_actors")

# Batches: a worker claims up to `TimePolicy.batch_max` actors that may start
# now per lock acquisition. With several workers a batch also stops at
# BATCH_BUDGET_NS of the members' mean hook times (`calendar.cost`), so that
# slow hooks spread over the workers.
BATCH_BUDGET_NS = 50_000

# A claimed hook: (actor, now_ns, due_ns, is_tick, consumed trigger key).
Claim = tuple[Actor, int, int, bool, "Key | None"]


class Mode(enum.Enum):
    """What the dispatcher lets run.

    CONTROL: only control envelopes (before the start, at a hold, in a stop's
    on_stop phase); RUNNING: timed work too; STOPPING: no new timed work;
    SHUTDOWN: the threads exit once out of their hooks.
    """

    CONTROL = "control"
    RUNNING = "running"
    STOPPING = "stopping"
    SHUTDOWN = "shutdown"


CONTROL, RUNNING, STOPPING, SHUTDOWN = Mode.CONTROL, Mode.RUNNING, Mode.STOPPING, Mode.SHUTDOWN


class _Batch:
    """A batch of several claims in flight on one worker (see `Dispatcher._run_batch`)."""

    __slots__ = ("todo", "done")

    def __init__(self, claims: list[Claim]) -> None:
        self.todo: deque[Claim] = deque(claims)  # not started; `_unclaim` may take them back
        self.done: deque[Actor] = deque()  # have run, not yet finished


def _claim_simulated(groups: list[Group], name: str) -> list[Claim]:
    """`Dispatcher._claim` in simulated time: the groups are at the frontier ``(t, d)``.

    Every hook starts when it is due (``now == due == t``); a tick is due at
    delta 0 only. An actor queued at ``key`` has its trigger at ``key`` or
    later (it is queued at the earlier of its tick and its trigger), so the
    trigger is consumed exactly when it equals ``key``.
    """
    batch: list[Claim] = []
    for key, group in groups:
        t, d = key
        for actor in group:
            if actor.queued_key is not key or actor.busy:  # Calendar.live, inlined
                continue
            actor.queued_key = None
            actor.busy = True
            trig = actor.trigger_key
            if trig is not None and trig <= key:
                actor.trigger_key = None
            else:
                trig = None
            actor.flight[1] = key  # Actor.stamp, without the property's call
            actor.thread_name = name
            batch.append((actor, t, t, d == 0 and actor.next_tick_ns == t, trig))
    return batch


def _claim_next(actors: list[Actor], key: SharedKey, name: str) -> list[Claim]:
    """Claim the actors of the delta cycle ``key`` that `Dispatcher._finish_lone` entered.

    Each was triggered at ``key`` (consumed here) and is not busy; an entry
    it may still have in the calendar (its next tick) goes stale.
    """
    t = key[0]
    batch: list[Claim] = []
    for actor in actors:
        actor.queued_key = None
        actor.busy = True
        actor.trigger_key = None
        actor.flight[1] = key  # Actor.stamp, without the property's call
        actor.thread_name = name
        batch.append((actor, t, t, False, key))
    return batch


class Dispatcher:
    """Runs the actors' hooks on a pool of workers and dedicated threads.

    Args:
        actors (list[Actor]): every actor it runs, in the net's order.
        timer (Timer): the run's timer; its ``simulated`` picks the `TimePolicy`.
        workers (int): number of worker threads to start, >= 1.
        listener (KernelListener): told of failures, the end, holds and crashes.
        trace (Recorder, optional): the run's trace recorder; None without a trace.

    Attributes:
        planned (bool): the run has a tick plan (`Calendar.plan`): simulated
            time, one worker, no dedicated thread, no trace.
    """

    def __init__(self, actors: list[Actor], timer: Timer, workers: int,
                 listener: KernelListener, trace: Recorder | None = None) -> None:
        self.actors = actors
        self.timer = timer
        self.policy: SimulatedTime | RealTime = make_policy(timer.simulated)
        self.simulated = timer.simulated
        self.n_workers = workers
        self.trace = trace
        self._listener = listener
        # Holding: a consistent cut. With simulated time it falls between two
        # instants (all work at t done, none after t started), so a snapshot
        # taken there resumes exactly; _cut_ns asks for a cut at that time.
        # _hold_requested counts the requests not yet withdrawn (a request
        # that times out withdraws only itself, not a restart's); a release
        # ends them all.
        self._hold_requested = 0
        self._stop_requested = False
        self.held = False
        self._cut_ns: int | None = None
        self._cut_due = False  # held at _cut_ns: a supervisor snapshot is due
        # A driven kernel's bound (Kernel.step): no work after this key starts.
        self._bound: Key | None = None
        self._paused = False  # the bound is reached: nothing in flight, the rest waits
        self._cond = threading.Condition(threading.Lock())
        self._dedicated = [a for a in actors if a.dedicated]
        self._calendar = Calendar(self._dedicated)
        # One worker in simulated time, no dedicated thread: the lean loop
        # (`_lone_loop`), on the tick plan (`Calendar.plan`) unless traced
        # (the trace's queue depths count the buckets' entries).
        self._lone = self.simulated and workers == 1 and not self._dedicated
        self.planned = self._lone and trace is None
        if self.planned:
            self._calendar.plan(actors)
        self._batches: dict[int, _Batch] = {}  # batches of several in flight, by id
        # Trigger keys owed to deliveries kept for a later hook (apply_deliveries),
        # set by the thread that ran the actor, taken as the actor is finished.
        self._owed: dict[Actor, Key] = {}
        # Simulated time: readers whose mailbox a send found over its bound,
        # pruned between two instants (see _prune_crowded).
        self._crowded: dict[Actor, None] = {}
        self._batch_budget_ns = None if workers == 1 else BATCH_BUDGET_NS
        self._batch_max = self.policy.batch_max(workers)
        self._delta_step = self.policy.delta_step  # read per update (_flush_triggers)
        # Simulated time: an instant past this many delta cycles is an algebraic
        # loop (set_loop_limit); checked where the frontier enters a delta cycle.
        self._max_delta = DEFAULT_MAX_DELTA_CYCLES
        self._loops: tuple[Loop, ...] = ()  # the net's rings, found before the start
        self.loop_error: AlgebraicLoopError | None = None
        self._mode = CONTROL
        self._inflight = 0
        self._waiting = 0  # threads in _wait(); notifies are skipped when none
        self._idle_workers = 0  # of those, workers with nothing to start (_worker_wait)
        # Real time, a placed group's: an idle worker waits on its links and reads them
        # (set_reader); _reading while one does, on the thread _reader_thread.
        self._reader: Callable[[float | None], None] | None = None
        self._reader_wake: Callable[[], None] | None = None
        self._reading = False
        self._reader_thread = 0
        # Per control phase (id of its envelope, see run_control): envelopes
        # neither handled nor withdrawn yet. A phase waits for its own only,
        # not for a hook stuck in an earlier phase's.
        self._phase_left: dict[int, int] = {}
        self._in_control: dict[Actor, Envelope] = {}  # the envelope each actor is running
        self._frontier: SharedKey = CONTROL_KEY  # becomes the stamps of its hooks
        self._end_ns: int | None = None
        self._grace_ns = 10_000_000_000  # the run's stop_timeout
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
        # What the sends of this run share (sends.make_send).
        self.sends = SendContext(self.policy, workers, self, trace)
        # Real time: catches an update still running at its deadline. Its thread
        # starts with the others only if some node's guard is added to it
        # (actor.guard_deadlines); it fails a node of on_miss="stop" as a hook's
        # exception does.
        self.deadlines = DeadlineMonitor(timer, self._fail)

    # -- settings from the driver ---------------------------------------------------
    @property
    def end_ns(self) -> int | None:
        """int | None: the run's end, ns of its timer (None: runs until stopped)."""
        return self._end_ns

    def set_end(self, end_ns: int | None, grace_ns: int) -> None:
        """Set the run's end and how long hooks in flight may hold it after the end.

        Args:
            end_ns (int | None): every update due at ``t <= end_ns`` runs, then
                the run ends (`KernelListener.reached_end`); None: no end.
            grace_ns (int): real time: hooks still in flight this long after
                the end no longer hold the run (the run's ``stop_timeout``).
        """
        with self._cond:
            self._end_ns = end_ns
            self._grace_ns = grace_ns
            self._notify_all()

    def set_loop_limit(self, max_delta_cycles: int, loops: Sequence[Loop] = ()) -> None:
        """Simulated time: stop the run when an instant takes more than ``max_delta_cycles``.

        Past the limit the dispatcher stops starting timed work at once (the
        instant never ends by itself) and tells its listener (`crashed`) of an
        `AlgebraicLoopError` naming the nodes of the loop and the instant.

        Args:
            max_delta_cycles (int): delta cycles one instant may take, >= 1.
            loops (Sequence[Loop]): the net's algebraic loops found before the
                start (`loops.find_loops`), named in the error.
        """
        with self._cond:
            self._max_delta = max_delta_cycles
            self._loops = tuple(loops)

    def hold_at(self, cut_ns: int | None) -> None:
        """Simulated time: hold at a consistent cut once every update due at ``t <= cut_ns`` ran.

        The hold is announced like any (`KernelListener.held`), and
        `take_cut_due` then says it was this one. None: no scheduled cut.
        """
        with self._cond:
            self._cut_ns = cut_ns

    @property
    def next_cut_ns(self) -> int | None:
        """int | None: the time of the scheduled cut not reached yet (see `hold_at`)."""
        return self._cut_ns

    # -- a kernel driven from outside (kernel.Kernel) ------------------------------
    def set_bound(self, bound: Key | None) -> None:
        """Let no timed work after ``bound`` start (a driven kernel; see `run_until`).

        None lifts the bound: the work runs freely (a real-time kernel).
        """
        with self._cond:
            self._bound = bound
            self._paused = False
            self._notify_all()

    def run_until(self, bound: Key, timeout: float) -> bool:
        """Let the work at keys up to ``bound`` run; wait until it is done.

        Returns True once nothing is in flight and the next work (if any) is
        due after ``bound``, or the dispatcher stopped; False after ``timeout``
        wall seconds (the work goes on).
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            self._bound = bound
            self._paused = False
            self._notify_all()
            while not self._paused and self._mode is RUNNING:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wait(left)
            return True

    def next_due(self) -> Key | None:
        """The key of the earliest pending work (None: none), stale entries dropped.

        None after an algebraic loop stopped the dispatcher (`set_loop_limit`):
        its instant never ends, and nothing of it runs any more.
        """
        with self._cond:
            if self.loop_error is not None:
                return None
            return self._calendar.earliest()

    @property
    def frontier(self) -> Key:
        """Key: the delta cycle entered last (the control key before the timer starts)."""
        return self._frontier

    def take_cut_due(self) -> bool:
        """Whether the hold now is the scheduled cut (`hold_at`); the flag is cleared."""
        with self._cond:
            due, self._cut_due = self._cut_due, False
            return due

    # -- threads -----------------------------------------------------------------
    def start_threads(self) -> None:
        """Start the worker threads, one thread per dedicated actor, and the deadline
        monitor's if it watches any node (`deadlines`)."""
        for i in range(self.n_workers):
            self._spawn(f"mujou-worker-{i}", self._lone_loop if self._lone else self._worker_loop,
                        None)
        for actor in self._dedicated:
            self._spawn(f"mujou-node-{actor.path or 'root'}", self._dedicated_loop, actor)
        self.deadlines.start()

    def _spawn(self, name: str, target: Callable[..., None], arg: Actor | None) -> None:
        args: tuple[Any, ...] = (target,) if arg is None else (target, arg)
        if self.policy.tight_slack:
            args = (on_time, *args)
        thread = threading.Thread(target=self._guarded, args=args, name=name, daemon=True)
        self._threads.append(thread)  # before it runs: it looks itself up there
        self._busy_ns[name] = 0
        try:
            thread.start()
        except BaseException:  # "can't start new thread": never one of ours to join
            self._threads.remove(thread)
            del self._busy_ns[name]
            raise

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
        """True on a worker, dedicated or helper thread of this dispatcher."""
        me = threading.current_thread()
        return me in self._threads or me in self._helpers

    def join_threads(self, timeout: float, skip: Iterable[str] = ()) -> None:
        """Wait (up to ``timeout`` s in all) for the threads to exit, except ``skip``.

        Helpers of the control phases are joined too, and the deadline monitor's.
        """
        deadline = time.monotonic() + timeout
        skip = set(skip)
        for thread in self._threads + self._helpers:
            if thread.name not in skip and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        self.deadlines.join(max(0.0, deadline - time.monotonic()))

    # -- modes -------------------------------------------------------------------------
    def _set_mode(self, mode: Mode) -> None:
        self._mode = mode
        self._calendar.open_timed(mode is RUNNING)

    def start_running(self, start_ns: int) -> None:
        """Start the timer at ``start_ns`` and let timed work run."""
        with self._cond:
            self.timer.start(start_ns)
            self._frontier = (start_ns, 0)
            first = self.policy.first_trigger(start_ns)
            for actor in self.actors:
                actor.schedule_first_tick(start_ns)
                if actor.trigger_key is not None and actor.trigger_key < first:
                    # Messages written before the timer started (inputs=, and
                    # sends from on_start) trigger right after t = start; those
                    # stamped later (a driven kernel's deliveries) at their key.
                    actor.trigger_key = first
            self._set_mode(STOPPING if self._stop_requested else RUNNING)
            self._schedule_all()

    def _schedule_all(self) -> None:
        calendar = self._calendar
        for actor in self.actors:
            if not actor.busy:
                calendar.schedule(actor)
        self._notify_all()

    def request_hold(self) -> None:
        """Ask for a consistent cut: no hook in flight, timed work held.

        In real time the cut comes as soon as the hooks in flight return; in
        simulated time once the current instant (with its delta cycles) is
        done. The hold is announced through `KernelListener.held`; it lasts
        until `release`. A request that can wait no longer is taken back with
        `withdraw_hold`.
        """
        with self._cond:
            self._hold_requested += 1
            if self._mode is RUNNING:
                if not self.simulated:
                    self._unclaim()
                self._try_hold_now()
            self._notify_all()

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
            self._notify_all()  # workers that saw the request wait for a notify
            return self._busy_hooks()

    def busy_hooks(self) -> dict[str, str]:
        """The hooks in flight now, ``{node path: hook name}`` (``"?"`` between hooks)."""
        with self._cond:
            return self._busy_hooks()

    def hooks_in_flight(self) -> dict[str, tuple[str, Key, int]]:
        """The hooks running now: ``{node path: (hook name, its key, the node's updates)}``.

        For the watchdog (`watchdog.Watchdog`): the three together tell one
        call of a hook from the next one of the same node.
        """
        with self._cond:
            return {a.path: (self.hook_of(a), a.stamp, a.updates) for a in self.actors
                    if a.busy and (a.hook is not None or a in self._in_control)}

    def _busy_hooks(self) -> dict[str, str]:
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
            if self._mode is not CONTROL:
                return
            if restart_at_ns is not None:
                self._restart_schedules(restart_at_ns)
            self._set_mode(STOPPING if self._stop_requested else RUNNING)
            self._schedule_all()

    def _restart_schedules(self, start_ns: int) -> None:
        if self.simulated:
            self.timer.rewind_to(start_ns)  # type: ignore[attr-defined]
        self._frontier = (start_ns, 0)
        first = self.policy.first_trigger(start_ns)
        for actor in self.actors:
            actor.schedule_first_tick(start_ns)
            actor.queued_key = None
            if actor.trigger_key is not None:
                actor.trigger_key = first
        self._calendar.clear()

    def _enter_hold(self, scheduled: bool = False) -> None:
        if self._crowded:  # a cut between instants: what it holds is bounded too
            if self._bound is None:
                self._prune_crowded()
            else:  # a driven kernel's hold: every delta cycle so far is settled
                self._settle(None)
        self._set_mode(CONTROL)
        self.held = True
        self._notify_all()
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
        The way a run ends (see the coordinator's end). A stop is for good: a
        later control phase, release or start does not make timed work run.
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
            # For good: timed work never runs again, even when a control phase
            # (run_control) took the mode back to CONTROL and a release or the
            # start follows.
            self._stop_requested = True
            if boundary and self.simulated and self._mode is RUNNING:
                if not self._inflight and not self._instant_pending():
                    self._set_mode(STOPPING)
            elif self._mode in (CONTROL, RUNNING):
                self._set_mode(STOPPING)
            self._notify_all()

    def wait_stopping(self, timeout: float) -> bool:
        """Wait until timed work no longer starts; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._mode is RUNNING:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wait(left)
            return True

    def _instant_pending(self) -> bool:
        first = self._calendar.earliest()
        return first is not None and first[0] == self._frontier[0]

    def shutdown(self) -> None:
        """Make every thread exit once it is out of its hook (the deadline monitor's at once)."""
        with self._cond:
            self._set_mode(SHUTDOWN)
            self._notify_all()
        self.deadlines.stop()

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

    # -- control phases (start, stop, restore) ---------------------------------------
    def run_control(self, actors: list[Actor], envelope: Envelope, timeout: float,
                    help: bool = False) -> list[Actor]:
        """Post ``envelope`` to each actor and wait until all have handled it.

        Pool actors' envelopes are taken in the order of ``actors`` (the
        net's order), so with one worker and no helpers they run one after
        the other in that order. The calling thread only waits: it never runs
        a hook itself, so that the deadline holds whatever a hook does.

        Args:
            actors (list[Actor]): the actors, in the order their envelopes start.
            envelope (Envelope): a control envelope (`Start`, `Stop`, `Restore`),
                one object posted to every actor.
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
        calendar = self._calendar
        with self._cond:
            if self._mode is RUNNING:
                raise RuntimeError("control phases run while timed work is held")
            if self._mode is STOPPING:
                self._set_mode(CONTROL)
            for actor in actors:
                actor.mailbox.control.append(envelope)
            calendar.count_control(len(actors))
            phase = id(envelope)  # unique while this call holds the envelope
            self._phase_left[phase] = len(actors)
            # Taken from the end of the control key's bucket (Calendar.top):
            # queued in reverse, the envelopes start in the order of ``actors``.
            for actor in reversed(actors):
                if not actor.busy:
                    calendar.schedule(actor)
            self._notify_all()
            try:
                while self._phase_left[phase]:
                    if help and not self._free_helpers and calendar.top_is_control():
                        self._start_helper()
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    # Polled too: an envelope queued behind a stuck helper wakes no one.
                    self._wait(min(remaining, 0.05))
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

    def _withdraw(self, actors: list[Actor], envelope: Envelope) -> None:
        """Take back ``envelope`` from the actors that have not started it."""
        withdrawn = False
        for actor in actors:
            control = actor.mailbox.control
            left = [e for e in control if e is not envelope]
            if len(left) == len(control):
                continue
            self._calendar.count_control(len(left) - len(control))
            control[:] = left
            withdrawn = True
            if not actor.busy:
                actor.queued_key = None  # its control-key entry is stale now
                self._calendar.schedule(actor)
        if withdrawn:
            self._notify_all()  # helpers waiting for the phase to end

    def post_control(self, actor: Actor, envelopes: list[Envelope]) -> None:
        """Queue control envelopes for one actor while the run goes on (a restart)."""
        with self._cond:
            actor.mailbox.control.extend(envelopes)
            self._calendar.count_control(len(envelopes))
            if not actor.busy:
                self._calendar.schedule(actor)
            self._notify_all()

    def hook_of(self, actor: Actor) -> str:
        """The name of the hook ``actor`` is in, for a report of stuck nodes.

        Also names ``load_state_dict``, which a `Restore` envelope runs outside
        ``actor.call``; ``"?"`` when nothing says.
        """
        if actor.hook is not None:
            return actor.hook
        envelope = self._in_control.get(actor)
        return getattr(envelope, "hook", None) or "?"

    def _start_helper(self) -> None:
        """Start a helper thread for the control phase (see `run_control`)."""
        thread = threading.Thread(target=self._guarded, args=(self._helper_loop,),
                                  name=f"mujou-helper-{self._helpers_started}", daemon=True)
        self._helpers_started += 1
        self._free_helpers += 1  # free until it takes an envelope: one start per wait
        # Those that have exited go: many restarts must not grow the list.
        # A new list, not an edit: is_own_thread reads it without the lock.
        self._helpers = [t for t in self._helpers if t.is_alive()] + [thread]
        thread.start()

    def _helper_loop(self) -> None:
        """Run queued control envelopes until none waits (a thread's loop; takes the lock).

        It exits rather than wait for more: an envelope queued later (an
        actor's next one) is taken by a worker or by a helper started then.
        """
        name = threading.current_thread().name
        calendar = self._calendar
        with self._cond:
            try:
                while self._mode is not SHUTDOWN and calendar.top_is_control():
                    actor = calendar.top()
                    calendar.take_top()
                    self._free_helpers -= 1
                    try:
                        self._run_control(actor, name)  # type: ignore[arg-type]
                    finally:
                        self._free_helpers += 1
            finally:
                self._free_helpers -= 1

    def _run_control(self, actor: Actor, name: str) -> None:
        """Run the actor's next control envelope, the lock released meanwhile."""
        actor.queued_key = None
        actor.busy = True
        self._inflight += 1
        actor.thread_name = name
        if self.trace is not None:
            actor.depths = (self._calendar.queued, self._inflight)
        envelope = actor.mailbox.control.pop(0)
        actor.stamp = self.policy.control_stamp(self._frontier, self.timer.now_ns())
        self._in_control[actor] = envelope  # names the hook should it get stuck
        self._cond.release()
        failure = None
        try:
            failure = actor.handle(envelope)
        finally:
            if failure is not None:
                self._fail(actor, *failure)  # without the lock, as the listener asks
            self._cond.acquire()
            # The envelope's hook time, if it ran one through call(); taken
            # once (an envelope that runs no hook, a Restore, adds nothing).
            took, actor.last_hook_ns = actor.last_hook_ns, 0
            if name in self._busy_ns:  # a helper of a control phase is no worker
                self._busy_ns[name] += took
            self._calendar.count_control(-1)
            del self._in_control[actor]
            left = self._phase_left.get(id(envelope))
            if left is not None:
                self._phase_left[id(envelope)] = left - 1
            self._inflight -= 1
            self._finish((actor,))
            if self._waiting:
                self._notify_all()

    def run_here(self, actors: list[Actor], envelope: Snapshot,
                 timeout: float | None = None) -> list[Actor]:
        """Take each actor's state on the calling thread, one actor at a time.

        Used at a cut for snapshots, so that no worker waits for a CUDA node's
        stream: the actors are marked busy meanwhile, so nothing else of them
        runs (a restart's control envelopes may run during a cut). All those
        not busy are taken in one go, the others as they come free; the
        workers are woken once at the end (at a cut they have nothing to do,
        and waking them per actor would only make them fight this thread for
        the GIL).

        Args:
            actors (list[Actor]): whose state to take.
            envelope (Snapshot): where the states (and errors) go.
            timeout (float, optional): wall seconds to wait for actors that
                are busy (a restart's hook); None waits for them.

        Returns:
            list[Actor]: those still busy at ``timeout``, or once the run is
            stopping, whose state was not taken (empty when all were).
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
                        # Its calendar entry goes stale, as a claim's does: `Calendar.top`
                        # drops the entries of busy actors, and `_finish` queues it again
                        # only when it is not queued (a kept queued_key would lose its tick).
                        actor.queued_key = None
                try:
                    for actor in mine:
                        actor.take_state(envelope)
                finally:
                    with self._cond:
                        self._finish(mine)
        finally:
            with self._cond:
                self._notify_all()
        return left

    def discard_messages(self) -> None:
        """Drop every undelivered message and pending trigger (a whole-net restore)."""
        with self._cond:
            for actor in self.actors:
                actor.mailbox.deliveries.clear()
                actor.trigger_key = None

    def trigger_keys(self) -> list[Key]:
        """The keys at which deliveries that have come trigger their readers, earliest first.

        For a driven kernel's check that its state may be taken (`kernel.Kernel.state_dict`).
        """
        with self._cond:
            return sorted(a.trigger_key for a in self.actors if a.trigger_key is not None)

    def pending_deliveries(self, actor: Actor) -> list[Delivery]:
        """The actor's undelivered messages in delivery order (call while held)."""
        inputs = actor.inputs
        queued = list(actor.mailbox.deliveries)
        if self.simulated:
            queued.sort(key=STAMP)  # stable: a stamp's messages in send order
        return [Delivery(*unstamp(dv[0]), inputs[dv[1]], dv[2]) for dv in queued]

    # -- when work may start ----------------------------------------------------------
    def _wait(self, timeout: float | None) -> None:
        self._waiting += 1
        try:
            self._cond.wait(timeout)
        finally:
            self._waiting -= 1

    def _worker_wait(self, timeout: float | None) -> None:
        """`_wait` for a worker with nothing it may start: counted apart (`_notify_finished`).

        With a reader set (`set_reader`) and none of the others waiting on the
        links, the worker waits on them instead (`_read_links`).
        """
        self._idle_workers += 1
        try:
            if self._reader is not None and not self._reading:
                self._read_links(timeout)
            else:
                self._wait(timeout)
        finally:
            self._idle_workers -= 1

    def _read_links(self, timeout: float | None) -> None:
        """Wait in the reader, the lock let go: the one worker that waits on the links.

        The Leader/Followers pattern (Schmidt, O'Ryan, Pyarali, Kircher and
        Buschmann, "Leader/Followers", PLoP 2000): of the idle workers, one at a
        time (the leader) waits for the messages of other processes and writes
        what comes into the kernel itself; the others wait on the condition.
        The leader then finds the work in the calendar as it takes the lock
        again, and runs it: no other thread is woken between a message's
        arrival and its hook. Any notify reaches the leader through the
        reader's ``wake``, so it misses nothing a waiting worker would see.
        """
        reader = self._reader
        assert reader is not None
        self._reading = True
        self._reader_thread = threading.get_ident()
        self._waiting += 1
        self._cond.release()
        try:
            reader(timeout)  # never raises (set_reader)
        finally:
            self._cond.acquire()
            self._waiting -= 1
            self._reading = False
            self._reader_thread = 0

    def set_reader(self, reader: Callable[[float | None], None] | None,
                   wake: Callable[[], None] | None = None) -> None:
        """Let an idle worker wait on the run's links and read them (real time, placed).

        Args:
            reader (Callable[[float | None], None] | None): called by one idle
                worker at a time, the dispatcher's lock let go, with the
                longest it may wait (seconds of the timer; None: until
                woken). It waits on what it reads from (and on what
                ``wake`` sets), writes what came into the kernel (`write`,
                which the reader's own thread may call) and returns; it must
                return once ``wake`` is called and must never raise. None:
                workers wait on the condition only (the default).
            wake (Callable[[], None] | None): makes a waiting ``reader``
                return; called from any thread, the lock held, so it must
                not block.

        Raises:
            ValueError: a reader without a wake.
        """
        if reader is not None and wake is None:
            raise ValueError("set_reader: a reader needs its wake")
        with self._cond:
            old = self._reader_wake if self._reading else None
            self._reader, self._reader_wake = reader, wake
            if old is not None:
                old()  # the leader waits in the old reader: it looks again, with the new one

    def _notify_finished(self, resumes: bool) -> None:
        """Wake the threads that wait for hooks to finish, as a batch has finished (some wait).

        In simulated time a worker that looks for work again at once
        (``resumes``) starts the next delta cycle itself, and wakes the idle
        workers only when it leaves work of that cycle for them (see
        `_worker_loop`). Woken by every finish, each idle worker would find
        nothing it may start and wait again: a hand-over of the lock and the
        GIL per hook, and hooks spread over the CPUs for nothing. Threads
        other than idle workers (the host, a driver) are always woken.
        """
        if not resumes or not self.simulated or self._waiting > self._idle_workers:
            self._notify_all()

    def _may_start(self, key: Key, now: int | None = None) -> tuple[bool, float | None]:
        """Whether work at ``key`` may start now; else how long to wait (None: a notify).

        ``now``: the timer's time (ns) in real time, if the caller read it already.
        """
        if key == CONTROL_KEY:
            return True, None
        if self._mode is not RUNNING:
            return False, None
        if self.simulated:
            if key == self._frontier:
                return True, None
            # The caller checked that the heap's top is live: without dedicated
            # actors it is the earliest pending work.
            if self._inflight or (self._dedicated and key != self._calendar.earliest()):
                return False, None
            return self._advance(key), None
        if self._hold_requested:
            self._try_hold_now()
            return False, None
        if now is None:
            now = self.timer.now_ns()
        if key[0] <= now and self._end_ns is None:
            return True, None  # RealTime.start's common case, inlined: one call fewer per hop
        step, arg = self.policy.start(key, now, self._end_ns,  # type: ignore[union-attr]
                                      self._grace_ns)
        if step is Step.START:
            return True, None
        if step is Step.AT_END:
            return False, self._at_end(now)
        return False, arg  # type: ignore[return-value]

    def _at_end(self, now: int) -> float | None:
        """Real time, nothing more may start before the end: end the run, or how long to wait."""
        earliest = self._calendar.earliest()
        step, arg = self.policy.at_end(now, self._end_ns, self._grace_ns,  # type: ignore
                                       self._inflight, earliest)
        if step is Step.END:
            end = self._end_ns
            if earliest is not None and earliest[0] <= end and not self._ended:  # type: ignore
                self._warn_cut()  # the grace is over (at_end waits for work due by the end)
            self._reach_end()
            return None
        return arg  # type: ignore[return-value]

    def _warn_cut(self) -> None:
        """Real time, the grace after the end is over: name the triggered updates left undone.

        Updates due by the end still start after it (the chains of triggered
        updates that began by then), for ``stop_timeout`` at most: a chain still
        going then is cut there, and the run says whose updates it leaves (a
        node stuck in a hook is reported by the stop, as such).
        """
        end = self._end_ns
        nodes = [a.path or "<root>" for a in self.actors
                 if a.trigger_key is not None and a.trigger_key[0] <= end]  # type: ignore
        if nodes:
            log.warning("the run's end: triggered updates of %s due by the end (t = %d ns) "
                        "were still to run stop_timeout = %g s after it, and do not run (a "
                        "chain of triggered updates that does not end: an algebraic loop "
                        "that max_delta_cycles = %d does not stop in time?)",
                        ", ".join(map(repr, nodes)), end, self._grace_ns / 1e9,
                        self._max_delta)

    def _advance(self, key: Key | None) -> bool:
        """Simulated time, nothing in flight, ``key`` the earliest work (None: none): move on.

        Acts on `SimulatedTime.advance`. Returns True when work at ``key``
        may start now; otherwise the run holds at a cut, stops, ends or waits.
        """
        if self._crowded:
            if self._bound is None:
                self._prune_crowded()
            else:
                # Driven: the cycles before the next one to run here are settled; and
                # those before its bound, since no other group runs one of them meanwhile.
                bound = self._bound
                self._settle(key if key is not None and key < bound else bound)
        if key is not None and key[0] == self._frontier[0] and self._bound is None:
            if key[1] > self._max_delta:
                return self._loop_found(key)
            self._frontier = key  # SimulatedTime.advance's NEXT_DELTA, inlined: per delta cycle
            return True
        step, arg = self.policy.advance(  # type: ignore[union-attr]
            key, self._frontier, stop_requested=self._stop_requested,
            hold_requested=bool(self._hold_requested), end_ns=self._end_ns,
            cut_ns=self._cut_ns, bound=self._bound)
        if step is Step.NEXT_DELTA:
            if arg[1] > self._max_delta:  # type: ignore[index]
                return self._loop_found(arg)  # type: ignore[arg-type]
            self._frontier = arg
            return True
        if step is Step.NEXT_INSTANT:
            self._frontier = arg
            self.timer.advance_to(arg[0])  # type: ignore[attr-defined, index]
            return True
        if step is Step.STOP:
            self._set_mode(STOPPING)
            self._cond.notify_all()
        elif step is Step.CUT:
            self._cut_ns = None
            self.timer.advance_to(arg)  # type: ignore[attr-defined]
            self._frontier = (arg, 0)
            self._enter_hold(scheduled=True)
        elif step is Step.HOLD:
            self._enter_hold()
        elif step is Step.END:
            self._reach_end()
        elif step is Step.PAUSE and not self._paused:
            self._paused = True
            self._cond.notify_all()  # the driver waits in Kernel.step
        return False

    def _plain_instant(self, t_ns: int) -> bool:
        """Whether the next instant ``t_ns`` starts with nothing asked of the boundary before it.

        `SimulatedTime.advance`'s ``NEXT_INSTANT`` for a run that is not
        driven (no bound), with nothing in flight and no mailbox crowded: no
        stop, cut, hold or end falls between the instant that finished and
        ``t_ns``. The lone loop's test once per instant, as one compiled call
        without the policy's decision tuple; `tests/test_policy.py` checks
        that it agrees with `SimulatedTime.advance` everywhere.
        """
        if self._stop_requested or self._hold_requested:
            return False
        end, cut = self._end_ns, self._cut_ns
        if cut is not None and t_ns > cut and (end is None or cut <= end):
            return False
        return end is None or t_ns <= end

    def _loop_found(self, key: Key) -> bool:
        """The instant of ``key`` is past ``max_delta_cycles``: stop the run; False.

        (Real time: the chain of triggered updates that reached ``key``, see
        `_claim`.) In simulated time, timed work stops at once (a stop at the
        instant's boundary would wait forever); the listener hears of the
        `AlgebraicLoopError` (once), with the lock released for that call (it
        may end the run, which takes the lock). Called with nothing in flight.
        """
        if self.loop_error is not None:
            return False
        t, d = key
        # The nodes of the loop: those pending at this instant and those that
        # updated in its last delta cycles (real time: the last hops of the
        # chain), then the rings that hold them.
        recent = d - 2
        nodes = [a.path for a in self.actors
                 if (a.trigger_key is not None and a.trigger_key[0] == t
                     and a.trigger_key[1] >= recent)
                 or (a.stamp[0] == t and a.stamp[1] >= recent)]
        rings = [loop for loop in self._loops
                 if any(s in nodes or r in nodes for s, _, r, _ in loop)] or list(self._loops)
        for loop in rings:
            nodes += [s for s, _, _, _ in loop if s not in nodes]
        err = self.loop_error = AlgebraicLoopError(
            nodes, t, d, "; ".join(describe_loop(loop) for loop in rings))
        log.error("%s", err, extra={"mujou_failure": True})
        # The failure is recorded before timed work stops: a driver that wakes
        # as it stops (Kernel.step) finds it.
        self._cond.release()
        try:
            self._listener.crashed(err)
        finally:
            self._cond.acquire()
        if self.simulated:
            # The stop at the instant's boundary would wait forever: timed work stops
            # now. (Real time: the listener's stop takes effect at once, and a driven
            # kernel must stay able to hold for the driver's last cut.)
            self._stop_requested = True
            if self._mode in (CONTROL, RUNNING):
                self._set_mode(STOPPING)
            self._cond.notify_all()
        return False

    def _idle_wait(self) -> float | None:
        """Nothing is queued: hold or end the run if due, else say how long to wait."""
        if self._mode is not RUNNING or self._inflight:
            return None
        earliest = self._calendar.earliest() if self._dedicated else None
        if earliest is not None:
            return None
        if self.simulated:
            self._advance(None)
            return None
        if self._hold_requested:
            self._try_hold_now()
            return None
        if self._end_ns is None:
            return None
        return self._at_end(self.timer.now_ns())

    def _reach_end(self) -> None:
        """The run's end: no more timed work; the listener is told once."""
        if self._ended:
            return
        self._ended = True
        if self.simulated and self._end_ns is not None:
            self.timer.advance_to(self._end_ns)  # type: ignore[attr-defined]
        self._set_mode(STOPPING)
        self._notify_all()
        self._listener.reached_end()  # posts an event: it never blocks or calls back

    # -- pruning mailboxes -------------------------------------------------------------
    def crowd(self, reader: Actor) -> None:
        """A send found ``reader``'s mailbox over its bound (`sends.SendTarget`).

        Simulated time: note it, to be pruned between two instants (the
        current instant's hooks may still take some of its deliveries and not
        others); no lock is needed for the note, since every hook of the
        instant can only add to it. Real time: prune it now, under the
        mailbox's own lock.
        """
        if self.simulated:
            self._crowded[reader] = None
            reader.prune_at = NEVER  # noted: the instant's other sends need not check
        else:
            self._prune_now(reader)

    def _prune_crowded(self) -> None:
        """Prune the mailboxes that sends found over their bound (simulated time).

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

    def settle(self, below: Key | None) -> None:
        """A driven kernel: every delta cycle before ``below`` is over, everywhere.

        The driver says so with each grant (`distributed.driver`): every
        group has finished the cycles before ``below`` and their messages
        have come. The crowded mailboxes are pruned as one process pruned
        them at the end of each of those cycles (`_settle`), so what they
        hold stays bounded, even in a kernel with no work of its own, and is
        what one process holds. Call it with no step in flight.

        Args:
            below (Key | None): ``(t_ns, delta)``; None: every cycle so far.
        """
        with self._cond:
            if self._crowded:
                self._settle(below)

    def _settle(self, below: Key | None) -> None:
        """Prune the crowded mailboxes cycle by cycle below ``below`` (`Actor.prune_cycles`).

        A mailbox that still holds more than its bound (deliveries of cycles
        not settled yet) stays noted, to be settled again.
        """
        limit = None if below is None else pack(below) << ORDER_BITS
        lost: list[tuple[Input, int]] = []
        for actor in list(self._crowded):
            lost += actor.prune_cycles(limit)
            if len(actor.deliveries) <= actor.bound:
                del self._crowded[actor]
                actor.prune_at = actor.bound  # sends check it again
        for port, _ in lost:
            port._log_first_drop()

    def _prune_now(self, actor: Actor) -> None:
        """Prune ``actor``'s mailbox now (real time), holding its lock; NOT the dispatcher's."""
        lock = actor.mailbox.lock
        if lock is None:  # keeps every message (its bound is NEVER): not reached
            return
        with lock:
            if len(actor.deliveries) <= actor.prune_at:
                return  # another sender pruned it meanwhile
            lost = actor.prune(False)
        for port, _ in lost:
            port._log_first_drop()

    # -- worker and dedicated loops -----------------------------------------------
    def _worker_loop(self) -> None:
        """A worker thread's loop (takes the lock; releases it while hooks run)."""
        name = threading.current_thread().name
        calendar = self._calendar
        simulated, now_ns = self.simulated, self.timer.now_ns
        with self._cond:
            while self._mode is not SHUTDOWN:
                actor = calendar.top()
                if actor is None:
                    self._worker_wait(self._idle_wait())
                    continue
                key: SharedKey = actor.queued_key
                if key[0] == CONTROL_T:
                    calendar.take_top()
                    self._run_control(actor, name)
                    continue
                # Real time: one reading of the clock decides and stamps the claim.
                now = None if simulated else now_ns()
                ok, wait = self._may_start(key, now)
                if not ok:
                    self._worker_wait(wait)
                    continue
                # The batch (see _claim): simulated time, the actors queued at
                # exactly the frontier; real time, those of the following keys
                # too while due (and due by the run's end).
                if simulated:
                    now, limit_t = key[0], None
                else:
                    end = self._end_ns
                    limit_t = now if end is None or now < end else end  # type: ignore[operator]
                groups = calendar.take(self._batch_max, self._batch_budget_ns, limit_t)
                batch = self._claim(groups, now, name)  # type: ignore[arg-type]
                if simulated and self._idle_workers:
                    # Work of this delta cycle left over: the idle workers share it.
                    left = calendar.top()
                    if left is not None and left.queued_key == key:
                        self._cond.notify_all()
                elif self._reader is not None and not self._reading and self._idle_workers:
                    # Leader/Followers' promotion: while this worker runs hooks, a
                    # follower watches the links (or takes the work left over).
                    self._cond.notify()
                self._run_batch(batch, name, resumes=True)

    def _lone_loop(self) -> None:
        """`_worker_loop` of the one worker of a simulated run without dedicated threads.

        The same rules, lean: no clock, no budget, and a delta cycle's bucket
        taken whole (`Calendar.take_bucket`). The plan of an instant is
        known before it starts: its ticks are the cohorts standing at it
        (`Calendar.plan`: each period's actors, moved from instant to instant
        as one list), and each later delta cycle's actors are those the
        cycle before triggered, claimed straight from it when nothing else
        is due before them (`_finish_lone`): what the calendar would return,
        without a round trip through it. An instant with nothing asked of
        its boundary (no stop, cut, hold or end: `_plain_instant`) is entered
        without the policy's decision.
        """
        name = threading.current_thread().name
        calendar = self._calendar
        most = self._batch_max
        with self._cond:
            while self._mode is not SHUTDOWN:
                actor = calendar.top()
                if actor is None:
                    self._wait(self._idle_wait())
                    continue
                key: SharedKey = actor.queued_key
                if key[0] == CONTROL_T:
                    calendar.take_top()
                    self._run_control(actor, name)
                    continue
                frontier = self._frontier
                if key != frontier or self._mode is not RUNNING:
                    if self._mode is not RUNNING or self._inflight or self._bound is not None \
                            or self._crowded:
                        ok, _ = self._may_start(key)  # simulated: never a timed wait
                        if not ok:
                            self._wait(None)
                            continue
                    elif key[0] == frontier[0]:
                        if not self._advance(key):
                            self._wait(None)
                            continue
                    elif self._plain_instant(key[0]):
                        # The next instant, nothing asked of its boundary
                        # (_advance's NEXT_INSTANT, inlined: once per instant).
                        self._frontier = key
                        self.timer.advance_to(key[0])  # type: ignore[attr-defined]
                    else:
                        ok, _ = self._may_start(key)  # simulated: never a timed wait
                        if not ok:
                            self._wait(None)
                            continue
                batch = _claim_simulated(calendar.take_bucket(most), name)
                while True:  # this delta cycle, then the next ones taken directly
                    if self.trace is not None:
                        self._record_depths(batch)
                    nxt = self._run_lone(batch, key, name)
                    if nxt is None:
                        break
                    key = self._frontier  # _finish_lone entered the next cycle
                    batch = _claim_next(nxt, key, name)

    def _run_lone(self, batch: list[Claim], key: SharedKey, name: str) -> list[Actor] | None:
        """Run the claimed delta cycle ``key`` of `_lone_loop` and finish it (`_finish_lone`).

        Called and returns with the lock held (released while the hooks run).
        A cycle of one hook runs with neither a batch record nor a member
        loop; several are a `_Batch`, as `_run_batch` runs them, so that
        `_unclaim` can take back the members not started yet.

        Returns the next delta cycle's actors when `_finish_lone` entered it
        directly, else None.
        """
        end, owes = self._end_ns, self._owed
        self._inflight += len(batch)
        if len(batch) == 1:
            actor, t, _, is_tick, _ = batch[0]
            self._cond.release()
            took = 0
            try:
                took = actor.run_due(t, is_tick, end, owes)
            except BaseException as exc:  # noqa: BLE001 - reported, never swallowed
                took = self._failed_update(actor, exc)
            finally:
                self._cond.acquire()
                self._busy_ns[name] += took
                self._inflight -= 1
                nxt = self._finish_lone((actor,), key)
            return nxt
        rec = _Batch(batch)
        self._batches[id(rec)] = rec
        self._cond.release()
        busy = 0
        try:
            busy = self._run_members(rec)
        finally:
            self._cond.acquire()
            del self._batches[id(rec)]
            self._busy_ns[name] += busy
            actors = list(rec.done)  # those `_unclaim` has not finished already
            rec.done.clear()
            self._inflight -= len(actors)
            nxt = self._finish_lone(actors, key)
        return nxt

    def _finish_lone(self, actors: Sequence[Actor], key: SharedKey) -> list[Actor] | None:
        """`_finish` for `_lone_loop`'s delta cycle ``key``; enter the next cycle if it may.

        The actors that the cycle triggered at ``(t, d + 1)`` (readers of its
        sends, and its own members triggered while they ran) are collected in
        the order `_finish` would have queued them in that key's bucket. The
        next cycle is entered directly (the frontier moves; the caller claims
        them) when the calendar would give exactly them next: the run is
        running, not driven, no mailbox is crowded (pruned between cycles by
        `_advance`), no control envelope or trace, the instant is within
        ``max_delta_cycles``, none of them failed, and nothing is queued at
        ``(t, d + 1)`` or earlier (a host's write, say). Otherwise they are
        queued as `_finish` queues them, and the caller goes back to the
        calendar. Returns them, or None.
        """
        t, d = key
        nkey: SharedKey = (t, d + self._delta_step)  # every trigger of this cycle's sends
        owes = self._owed
        calendar = self._calendar
        nxt: list[Actor] = []
        for actor in actors:
            if owes:
                owed = owes.pop(actor, None)
                if owed is not None:
                    self._lower_trigger(actor, owed)
            deferred = actor.deferred
            if deferred:
                for reader in deferred:
                    current = reader.trigger_key  # _lower_trigger, inlined: per send
                    if current is None or nkey < current:
                        reader.trigger_key = nkey
                        if not reader.busy:
                            nxt.append(reader)
                deferred.clear()  # the sends hold this very dict
            actor.busy = False
            trigger = actor.trigger_key
            if trigger is not None and trigger == nkey and actor.queued_key is None:
                nxt.append(actor)
            else:
                calendar.requeue(actor)
        if self._waiting:
            self._cond.notify_all()
        if not nxt:
            return None
        if self._mode is RUNNING and self._bound is None and not self._crowded \
                and self.trace is None and not calendar.control_pending \
                and nkey[1] <= self._max_delta and not any(a.failed for a in nxt):
            first = calendar.top()
            if first is None or nkey < first.queued_key:
                self._frontier = nkey
                return nxt
        for actor in nxt:
            calendar.schedule(actor)
        return None

    def _dedicated_loop(self, actor: Actor) -> None:
        """A dedicated actor's thread: waits for its own key under the same rules."""
        name = threading.current_thread().name
        with self._cond:
            while self._mode is not SHUTDOWN:
                key = actor.queued_key
                if key is None or actor.busy:
                    self._wait(self._idle_wait())
                    continue
                if key == CONTROL_KEY:
                    self._run_control(actor, name)
                    continue
                ok, wait = self._may_start(key)
                if not ok:
                    self._wait(wait)
                    continue
                now = key[0] if self.simulated else self.timer.now_ns()
                self._run_batch(self._claim([(key, [actor])], now, name), name)

    # -- running hooks ----------------------------------------------------------------
    #
    # A hook runs in three steps: claim (lock held: the actor becomes busy and
    # its trigger is consumed), run (no lock) and finish (lock held: the
    # triggers it owes and deferred, the actor's next key). A worker claims
    # a *batch* of actors that may all start now, so a lock hand-over is paid
    # per batch rather than per hook: for no-op hooks it is most of the cost.

    def _claim(self, groups: list[Group], now: int, name: str) -> list[Claim]:
        """Make the live actors of ``groups`` busy for their timed work.

        Each group is ``(key, actors)``: actors queued at ``key`` whose
        entries must still be live (`Calendar.live`). An actor's trigger is
        consumed if due by ``key`` (real time: by its time). Returns the claims
        ``(actor, now_ns, due_ns, is_tick, consumed trigger)``.

        Real time: the update's stamp is its key with the depth of the chain
        it continues (the trigger's delta, when deeper: see `_lower_trigger`);
        past ``max_delta_cycles`` that chain is an algebraic loop
        (`_loop_found`), whatever the interleaving of the messages that carry it.
        """
        if self.simulated:
            batch = _claim_simulated(groups, name)
        else:  # real time, here and not in a function (a call fewer per hop): a tick
            # counts if due by now
            batch = []
            # A trigger claimed late must not consume a tick not due by the end.
            end = self._end_ns
            due_by = now if end is None or now < end else end
            looping: Key | None = None
            for key, group in groups:
                for actor in group:
                    if not Calendar.live(actor, key):
                        continue
                    actor.queued_key = None
                    actor.busy = True
                    tick = actor.next_tick_ns
                    is_tick = tick is not None and tick <= due_by
                    due = tick if is_tick else 0
                    trig = actor.trigger_key
                    stamp = key
                    # Due by the key's time: a trigger at the same time may be a
                    # deeper chain's than the key it is queued at (_lower_trigger).
                    if trig is not None and trig[0] <= key[0]:
                        actor.trigger_key = None
                        if not is_tick:
                            due = trig[0]
                        if trig[1] > key[1]:
                            stamp = (key[0], trig[1])
                        if stamp[1] > self._max_delta:  # a chain that does not end
                            looping = stamp
                    else:
                        trig = None
                    actor.flight[1] = stamp  # Actor.stamp, without the property's call
                    actor.thread_name = name
                    batch.append((actor, now, due, is_tick, trig))  # type: ignore[arg-type]
            if looping is not None:
                self._inflight += len(batch)
                self._loop_found(looping)
                self._inflight -= len(batch)
        if self.trace is not None:
            self._record_depths(batch)
        self._inflight += len(batch)
        return batch

    def _record_depths(self, batch: list[Claim]) -> None:
        """Queue depths as each hook of ``batch`` starts, for its slice of the trace."""
        queued, inflight = self._calendar.queued, self._inflight
        for i, claim in enumerate(batch, 1):
            claim[0].depths = (queued, inflight + i)

    def _run_batch(self, batch: list[Claim], name: str, resumes: bool = False) -> None:
        """Run a claimed batch (called and returns with the lock held).

        ``resumes``: the caller is a worker that looks for work again at once
        (see `_notify_finished`).

        The members of a batch of several are taken one by one from a shared
        deque, so that `_unclaim` can give the ones not started yet back to
        the schedule (a stop or a cut must not wait for them behind a stuck
        hook). Each member's due deliveries are applied, then its update
        runs; a failure of either is the node's failure.
        """
        if len(batch) == 1:  # the common case in real time: no deque
            claim = batch[0]
            self._cond.release()
            took = 0
            try:
                took = self._run_claimed(claim, fresh=False)
            finally:
                self._cond.acquire()
                self._busy_ns[name] += took
                self._inflight -= 1
                self._finish((claim[0],))
                if self._waiting:  # no call when nobody waits
                    self._notify_finished(resumes)
            return
        rec = _Batch(batch)
        self._batches[id(rec)] = rec
        self._cond.release()
        busy = 0  # the members' hook times, for the worker's busy share
        try:
            todo, done = rec.todo, rec.done
            take, add = todo.popleft, done.append
            if self.simulated:
                busy = self._run_members(rec)
            else:
                run_claimed = self._run_claimed
                while todo:
                    try:
                        item = take()
                    except IndexError:  # given back meanwhile
                        break
                    busy += run_claimed(item)
                    add(item[0])
        finally:
            self._cond.acquire()
            del self._batches[id(rec)]
            self._busy_ns[name] += busy
            self._finish_done(rec, final=True)
            if self._waiting:
                self._notify_finished(resumes)

    def _run_members(self, rec: _Batch) -> int:
        """Run a simulated batch's members one by one (NO lock held); their hook times (ns).

        `_run_claimed` for simulated time, inlined: each hook starts when due
        (`Actor.run_due`). Members are taken from ``rec.todo`` one at a time,
        so that `_unclaim` can give back those not started yet; each that ran
        goes to ``rec.done``.
        """
        owes, end = self._owed, self._end_ns
        todo, done = rec.todo, rec.done
        take, add = todo.popleft, done.append
        busy = 0
        while todo:
            try:
                actor, now, _, is_tick, _ = take()
            except IndexError:  # given back meanwhile
                break
            try:
                busy += actor.run_due(now, is_tick, end, owes)
            except BaseException as exc:  # noqa: BLE001 - reported, never swallowed
                busy += self._failed_update(actor, exc)
            add(actor)
        return busy

    def _finish_done(self, rec: _Batch, final: bool = False) -> None:
        """`_finish` the members of a batch that have run.

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
        self._inflight -= len(actors)
        self._finish(actors)

    def _failed_update(self, actor: Actor, exc: BaseException) -> int:
        """Report a failed update (or its deliveries); return its hook time for the busy share.

        Called without the lock, as the hook that raised returns.
        """
        self._fail(actor, "on_update", exc)
        took, actor.last_hook_ns = actor.last_hook_ns, 0  # taken once
        return took if actor.timed else 0

    def _run_claimed(self, item: Claim, fresh: bool = True) -> int:
        """Apply a claimed actor's due deliveries and run its update (NO lock held).

        In simulated time that is `Actor.run_due`. In real time the update
        starts at the timer's time read now (``fresh``), or, for a hook
        claimed alone, at the claim's: that was
        read just before the lock was released, and one clock read fewer
        per hop is measurable in a ping-pong. A trigger key owed to
        deliveries kept for a later hook goes to ``_owed``.

        Returns the hook's wall time (ns; 0 without statistics), which the
        caller adds to its thread's busy time.
        """
        actor, now, due, is_tick, _ = item
        if self.simulated:
            try:
                return actor.run_due(now, is_tick, self._end_ns, self._owed)
            except BaseException as exc:  # noqa: BLE001 - reported, never swallowed
                return self._failed_update(actor, exc)
        ran = False
        try:
            if fresh:
                now = self.timer.now_ns()  # at the start of the hook, not of the batch
            if actor.inputs and actor.deliveries:  # no Inputs: the deque stays unread
                actor.apply_deliveries(None)  # real time: nothing is kept for later
            ran = True
            return actor.run_update(now, due, is_tick, self._end_ns)
        except BaseException as exc:  # noqa: BLE001 - reported, never swallowed
            self._fail(actor, "on_update", exc)
            took, actor.last_hook_ns = actor.last_hook_ns, 0  # taken once
            return took if ran and actor.timed else 0

    def _finish(self, actors: Sequence[Actor]) -> None:
        """After their hooks: the triggers each owes and deferred, and its next key.

        The one way an actor leaves ``busy`` after running (an update, a batch
        member, a control envelope, a snapshot), but for `_finish_lone`, its
        form for the lone worker's delta cycles. The caller counts the busy
        time, lowers ``_inflight`` and notifies.
        """
        owes = self._owed
        calendar = self._calendar
        for actor in actors:  # runs once per update: kept lean
            if owes:
                owed = owes.pop(actor, None)
                if owed is not None:
                    self._lower_trigger(actor, owed)
            if actor.deferred:
                self._flush_triggers(actor)
            actor.busy = False
            calendar.requeue(actor)

    def _lower_trigger(self, actor: Actor, key: Key) -> bool:
        """Make ``actor``'s trigger key ``key`` if that is earlier; True if it changed.

        The one place a trigger key is lowered: a send, the host, a deferred
        trigger, an owed one, a claim given back (`_finish_lone` has a copy
        of its simulated case, for speed). The caller queues the
        actor (if it is not busy) and notifies.

        Real time: the delta of a key is the depth of the chain of triggered
        updates that sent the message (`RealTime.delta_step`), and the one
        update that takes both messages continues the deeper chain: the
        trigger keeps the earlier time and the greater delta. So a ring fed
        by a periodic node, or a ring across groups whose crossings restart
        the time, still counts its hops (see `_claim`). Keeping the deeper
        delta at the same time returns False: the actor stays queued where it
        is (its claim takes the trigger by time).
        """
        current = actor.trigger_key
        if current is None:
            actor.trigger_key = key
            return True
        if key < current:
            if current[1] > key[1] and not self.simulated:
                key = (key[0], current[1])
            actor.trigger_key = key
            return True
        if key[1] > current[1] and not self.simulated:
            actor.trigger_key = (current[0], key[1])
        return False

    def _flush_triggers(self, sender: Actor) -> None:
        """Apply the triggers that ``sender``'s sends deferred to the end of its hook.

        Their key is that of every send of the hook (see `sends.make_send`).
        """
        t, d = sender.stamp
        key = (t, d + self._delta_step)  # see TimePolicy.delta_step
        deferred = sender.deferred
        calendar = self._calendar
        lower = self._lower_trigger
        for reader in deferred:  # type: ignore[union-attr]
            if lower(reader, key) and not reader.busy:
                calendar.schedule(reader)
        deferred.clear()  # type: ignore[union-attr]  # the sends hold this very dict

    def _unclaim(self) -> None:
        """Free the batches in flight of every member but the one running.

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
                if trig is not None:
                    self._lower_trigger(actor, trig)
                self._inflight -= 1
                actor.busy = False
                self._calendar.schedule(actor)
        self._notify_all()

    def _fail(self, actor: Actor, hook: str, exc: BaseException) -> None:
        """Report that ``actor``'s ``hook`` raised ``exc`` (whatever it is: any BaseException).

        Called without the lock. The listener is reached even if tracing the
        failure raises, and the thread running the hook goes on either way.
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
    def trigger(self, actor: Actor, key: Key) -> None:
        """Make ``actor`` run a triggered update at ``key`` or earlier (`sends.SendTarget`)."""
        with self._cond:
            if self._lower_trigger(actor, key) and not actor.busy:
                self._calendar.schedule(actor)
                if self._waiting:
                    self._wake(actor)

    def _wake(self, actor: Actor) -> None:
        """Wake a thread for newly queued work of ``actor`` (its own, if dedicated)."""
        if actor.dedicated or self._dedicated:
            self._notify_all()  # one notify might wake the wrong dedicated thread
        elif not self._reading:
            self._cond.notify()
        elif threading.get_ident() != self._reader_thread:
            self._cond.notify()
            self._wake_reader()
        # (else the leader wrote it from the links: it finds the work as it takes the
        # lock again, and wakes a follower only as it starts a batch: _worker_loop)

    def _notify_all(self) -> None:
        """Wake every waiting thread (the lock held), the worker waiting on the links too."""
        self._cond.notify_all()
        if self._reading:
            self._wake_reader()

    def _wake_reader(self) -> None:
        """Make the worker waiting on the links (`_read_links`) look again; not when it is
        the caller (a message it read, written into the kernel: it looks anyway)."""
        wake = self._reader_wake
        if wake is not None and threading.get_ident() != self._reader_thread:
            wake()

    def deliver(self, actor: Actor, slot: int, message: Any, stamp: int,
                trigger: Key | None, not_before: Key) -> int:
        """Deliver a message from outside the kernel to ``actor.inputs[slot]``.

        For messages from another group of nodes (`kernel.Kernel.deliver`);
        the host's writes go through `host_deliver`.

        Args:
            actor (Actor): the reader.
            slot (int): the Input's index in ``actor.inputs``.
            message: the message, already copied for the reader.
            stamp (int): its stamp (`keys.stamp`): where it sorts among the reader's
                deliveries in simulated time.
            trigger (Key | None): the key at which it triggers the reader, or None.
            not_before (Key): the key it was sent at: refused if the kernel has
                already entered a later delta cycle (it would have missed it).

        Returns:
            int: the delivery's number (>= 1: the ``seq`` a trace's flow end
            carries); 0, and nothing delivered, when it came too late.
        """
        actor.bound_mailbox()
        with self._cond:
            if self._frontier > not_before:
                return 0
            # A crowded mailbox is only noted here (never pruned: what one process
            # drops is decided at the end of each delta cycle, and the driver says
            # when those are over everywhere: `settle`).
            self._deliver(actor, slot, message, stamp, trigger, driven=True)
            return self._host_seq  # this delivery's: numbered under the same lock

    def param_set(self, sets: Any, name: str, value: Any) -> Key:
        """Queue a checked parameter set on its node's `params.ParamState`; return its key.

        The key is the one a host's triggering write gets (`TimePolicy.host_trigger`:
        the next delta cycle in simulated time, now in real time, the first
        update before the start); the set is added under the same lock, so no
        update at that key or after can start without it (`params.guard_params`).

        Args:
            sets (ParamState): the node's queue of sets.
            name (str): the parameter's name.
            value: the checked value.

        Returns:
            Key: ``(t_ns, delta)``, the key the set applies from (what a
            recording keeps).
        """
        with self._cond:
            key = self.policy.host_trigger(self._frontier, self.timer.now_ns())
            sets.add(key[0], key[1], name, value)
        return key

    def host_deliver(self, actor: Actor, slot: int, message: Any, triggers: bool,
                     hops: int = 0) -> int:
        """Deliver a message written by the host (run.write, inputs=) to ``actor.inputs[slot]``.

        It sorts before every node's send of the same instant, and triggers
        (if ``triggers``) at the next delta cycle (simulated time; before the
        start: right after it), or now (real time). ``hops`` (real time, a
        placed run's message from another group): the trigger's key is
        ``(now, hops)``, so a chain of triggered updates across processes
        counts its crossings in the keys' delta, and a ring of them is an
        algebraic loop past ``max_delta_cycles`` (see `_claim`).

        Returns:
            int: the delivery's number (the ``seq`` a trace's flow end carries).
        """
        actor.bound_mailbox()
        with self._cond:
            # Under the lock with the append: the instant cannot move in between.
            key = self.policy.host_trigger(self._frontier, self.timer.now_ns()) if triggers \
                else None
            if hops and key is not None and not self.simulated:
                key = (key[0], hops)
            lost = self._deliver(actor, slot, message, HOST_STAMP, key)
            seq = self._host_seq
        for port, _ in lost:
            port._log_first_drop()
        return seq

    def _deliver(self, actor: Actor, slot: int, message: Any, stamp: int,
                 trigger: Key | None, driven: bool = False) -> list[tuple[Input, int]]:
        """Append a delivery, keep the mailbox bounded, trigger; return the drops to log.

        ``driven`` (a driven kernel's deliveries): a crowded mailbox is noted,
        to be settled (`settle`), as if its node were busy.
        """
        self._host_seq += 1
        mailbox = actor.mailbox
        mailbox.put((stamp, slot, message, self._host_seq))
        box = mailbox.deliveries
        lost: list[tuple[Input, int]] = []
        if len(box) > actor.prune_at:
            if not self.simulated:
                self._prune_now(actor)  # the mailbox's lock inside ours, never the reverse
            elif actor.busy or driven:  # its hook may be taking deliveries: between instants
                self._crowded[actor] = None
                actor.prune_at = NEVER
            else:
                # Not busy, and it can only be claimed under our lock: its
                # next hook, at the current instant or later, takes every
                # delivery stamped before this instant (this one too), so
                # those can be pruned now. (An idle net may never reach the
                # next instant.)
                lost = actor.prune(True, pack(self._frontier) << ORDER_BITS)
        if trigger is not None:
            self._lower_trigger(actor, trigger)
            if not actor.busy:
                self._calendar.schedule(actor)
                if self._waiting:
                    self._wake(actor)
        return lost

    def busy_fractions(self) -> dict[str, float]:
        """Share of wall time each thread spent running hooks, by thread name."""
        elapsed = max(1, time.perf_counter_ns() - self._started_ns)
        with self._cond:
            return {name: busy / elapsed for name, busy in self._busy_ns.items()}
