"""The coordinator: the one thread (``mujou-run``) that changes the whole net.

Whatever changes the whole net goes through the coordinator's event queue and
is done on its thread, one at a time: the end of the run, a host's
``state_dict()``, a periodic snapshot, a ``one_for_all`` restart, and the
finish (every ``on_stop``, the threads' exit, the nodes released). No other
thread holds the net, so none waits for another while holding what it needs.

The coordinator drives the dispatcher and is its `KernelListener`: the
dispatcher reports failures, holds and the end through those four calls, and
the coordinator acts through the dispatcher's methods. The supervisor decides
what a failure does (`supervisor.failure_verdict`); the coordinator carries
it out.
"""

from __future__ import annotations

import atexit
import enum
import functools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

from ..devices import CudaRuntime
from ..errors import (
    CallbackError,
    NodeError,
    StartTimeoutError,
    StopTimeoutError,
    describe,
)
from ..net import check_file_messages
from ..ports import Input, Port
from ..stats import SnapshotStats
from ..supervisor import (
    Action,
    RestartIntensity,
    SnapshotWriter,
    Supervisor,
    failure_verdict,
)
from ..timers import Timer
from ..trace import Recorder, Tracer
from .actor import Actor
from .build import Wiring, unwire, wire
from .cuts import NoCut, restore_tree, take_tree, why_no_cut
from .dispatcher import Dispatcher
from .mailbox import Restore, Start, Stop
from .protocols import HostSide, Subscribed

__all__ = ["Coordinator", "EndReason", "StateRequest", "ON_COORDINATOR"]

log = logging.getLogger("mujou_actors")

# Coordinators of runs not yet ended, so that interpreter exit can stop them:
# their threads are daemons, and a daemon killed inside a torch operation at
# exit aborts the process. Runs share nothing through this set; it only serves
# that stop.
_unended: weakref.WeakSet[Coordinator] = weakref.WeakSet()


@atexit.register
def _stop_runs_at_exit() -> None:
    for coordinator in list(_unended):
        try:
            coordinator.end(EndReason.STOPPED)
            coordinator.wait_ended(None)
        except Exception:  # noqa: BLE001 - exit goes on; the failure is logged
            log.exception("stopping a run at interpreter exit failed")


class EndReason(enum.Enum):
    """Why a run ends: the first reason to end it is the one recorded."""

    STOPPED = "stopped"  # stop(), leaving the with block, interpreter exit
    FAILED = "failed"  # a hook, a subscriber callback, the supervisor, a kernel thread
    DURATION = "duration"  # the run's duration is over


class _Signal(enum.Enum):
    """An event of the coordinator's queue (a host's state request is the other kind)."""

    END = "end"  # the end is decided (Coordinator.end): finish the run
    REACHED_END = "reached_end"  # the dispatcher reached the run's end
    HELD = "held"  # the dispatcher holds the net at a cut
    WAKE = "wake"  # look at the schedule and the deadlines again


class StateRequest:
    """A host's `Run.state_dict` call, waiting for the coordinator's cut.

    The coordinator sets ``tree`` or ``error`` and then ``done``; ``done``
    alone means the run ended first (the caller then takes the final state).
    ``cancelled`` (set by a caller that gave up) makes it skip the request.
    Both sides change it under the coordinator's lock (`Coordinator.lock`).

    Args:
        timeout (float, optional): wall seconds the caller waits; None: no bound.
    """

    __slots__ = ("deadline", "timeout", "done", "tree", "error", "cancelled")

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.done = threading.Event()
        self.tree: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.cancelled = False


_Event = _Signal | StateRequest



# A node's state_dict() and load_state_dict() run on the run's own thread
# (mujou-run) at a cut and in a restart; that thread also ends the run.
ON_COORDINATOR = ("{call} from a node's state_dict() or load_state_dict() would block the "
                  "run's thread (mujou-run), which takes the cuts and ends the run, "
                  "so it would wait for itself")



class Coordinator:
    """The ``mujou-run`` thread of one run, its event queue, and the finish.

    It makes the run's dispatcher (and is its `KernelListener`), wires the
    net, and owns what the host's API asks of the whole net: the end, the
    state requests, the cuts and periodic snapshots, the restarts.

    Args:
        actors: every actor of the run, in the net's order.
        ports: every port of the net, by dotted path.
        seeds: every node's seed, by path (a state tree's ``seeds``).
        timer: the run's timer.
        workers: the number of worker threads.
        stop_timeout: wall seconds of each of the end's two waits.
        supervisor: snapshots and the restart strategy (None: the defaults).
        rt: the run's CUDA runtime, None without CUDA nodes.
        tracer: records a timeline of the run when given.
    """

    def __init__(self, *, actors: list[Actor], ports: dict[str, Port], seeds: dict[str, int],
                 timer: Timer, workers: int, stop_timeout: float,
                 supervisor: Supervisor | None, rt: CudaRuntime | None,
                 tracer: Tracer | None) -> None:
        self.actors = actors
        self.timer = timer
        self._ports = ports
        self._seeds = seeds
        self._stop_timeout = stop_timeout
        self._start_timeout = 60.0  # set by begin(): bounds a restart's on_start and restore too
        # The dispatcher reports back only through this object's KernelListener
        # calls (hook_failed, reached_end, held, crashed).
        self._trace: tuple[Tracer, Recorder] | None = None  # set when the run is traced
        recorder = None
        if tracer is not None:  # before the sends are made: they keep the recorder
            recorder = tracer._recorder([a.path for a in actors], ports)
            for actor in actors:
                actor.trace = recorder
            self._trace = (tracer, recorder)
        self.dispatcher = Dispatcher(actors, timer, workers, self, recorder)
        self.wiring: Wiring = wire(actors, ports, self.dispatcher, rt)
        # Subscriptions, waiters and the mujou-host thread: the run's host side,
        # attached by the run (attach_host) before the threads start.
        self._host: HostSide | None = None
        self.lock = threading.Lock()  # the failures, the state requests
        self._failures: list[BaseException] = []
        self._stuck: StopTimeoutError | None = None
        self._reported = False
        # Set by end(), under _end_lock, with the reason recorded.
        self._end_requested = threading.Event()
        self._end_lock = threading.Lock()
        self.end_reason: EndReason | None = None
        self._ended = threading.Event()
        self._wall_start = time.perf_counter()
        self._wall_end: float | None = None
        self._end_ns: int | None = None
        self.start_ns = 0
        self._thread = threading.Thread(target=self._coordinate, name="mujou-run", daemon=True)
        self._events: queue.SimpleQueue[_Event] = queue.SimpleQueue()
        # What waits for the next cut (the coordinator's alone): host
        # state_dict() calls, a real-time periodic snapshot (until its
        # monotonic deadline) and a one_for_all restart (its failure and
        # deadline; set by the failing thread before it asks for the hold).
        self._requests: list[StateRequest] = []
        self._closed = False  # set under lock once the coordinator takes no more requests
        self._cut_deadline: float | None = None
        self._restart_due: tuple[NodeError, float] | None = None
        self._asked = False  # the coordinator's own request_hold is pending
        # Periodic snapshots that could not be taken (a hook did not return
        # within the bound), and the hooks of the last miss: while the same
        # hook invocations are still running, later ones are missed at once
        # rather than holding the net again.
        self._missed = 0
        self._missing: dict[Actor, tuple[int, str | None]] = {}
        # A miss was logged: the next snapshot taken logs that they resume.
        # Not _missing, which is emptied as soon as those hooks return, before
        # the next snapshot is even tried.
        self._resume_due = False
        self._by_path = {a.path: a for a in actors}
        self._supervisor = supervisor or Supervisor()
        self._latest: dict[str, Any] | None = None
        within = self._supervisor.within
        assert within is not None  # Supervisor() allows no None
        self._intensity = RestartIntensity(self._supervisor.max_restarts, round(within * 1e9))
        self._writer: SnapshotWriter | None = None
        self._pauses: list[float] = []
        self._next_cut_ns: int | None = None
        self._finishing = False
        self._timer_started = False
        self._hard_end_ns: int | None = None

    # -- threads ------------------------------------------------------------------------
    def attach_host(self, host: HostSide) -> None:
        """Give the coordinator the run's host side, which it closes at the end.

        Called once, before `start_threads`: the host side is made from the
        wiring (its copies) and reports its callbacks' failures here
        (`callback_failed`), so it comes after the coordinator.
        """
        self._host = host

    def start_threads(self) -> None:
        """Start the dispatcher's threads and ``mujou-run``; the nodes' hooks may run."""
        self.dispatcher.start_threads()
        _unended.add(self)
        self._thread.start()

    def abandon(self) -> None:
        """Undo a build that failed before any hook ran: the threads exit, the sends go."""
        self.dispatcher.shutdown()
        self.dispatcher.join_threads(timeout=self._stop_timeout)
        _unended.discard(self)

    def on_thread(self) -> bool:
        """True on the ``mujou-run`` thread (a node's state_dict or load_state_dict)."""
        return threading.current_thread() is self._thread

    # -- the start -------------------------------------------------------------------------
    def begin(self, *, tree: dict[str, Any] | None, initial: list[tuple[Input, Any]],
              end_s: float | None, start_limit: float) -> None:
        """The start phase: every ``on_start``, the restore, ``inputs=``, then the timer.

        Args:
            tree: the checked state tree to restore, if any.
            initial: the values ``inputs=`` delivers, ``(Input, value)`` (checked;
                copied here, after the restore).
            end_s: the run's duration (seconds of its timer), None: no end.
            start_limit: wall seconds the on_start hooks and the restore take in all.

        Raises:
            NodeError: an ``on_start`` or a ``load_state_dict`` raised.
            StartTimeoutError: ``start_limit`` ran out.
            BaseException: whatever the supervisor's first snapshot raised.
            The caller stops the run.
        """
        d = self.dispatcher
        self._start_timeout = start_limit
        start_deadline = time.monotonic() + start_limit  # one bound for the whole phase
        late = d.run_control(self.actors, Start(), start_limit)
        if self._failures:  # an on_start raised: that is the cause, not what waited
            self.raise_outcome()
        if late:
            raise StartTimeoutError({a.path: d.hook_of(a) for a in late if a.busy},
                                    [a.path for a in late if not a.busy], start_limit)
        if tree is not None:
            # The tree holds every message the net had at the cut; what on_start
            # sent now was already delivered once, before the cut.
            d.discard_messages()
            self._restore_tree(tree, start_deadline, start_limit)
        if self._failures:
            self.raise_outcome()
        for port, value in initial:
            self.wiring.deliver(port, self.wiring.write_copy(value, port))
        start_ns = self.start_ns = 0 if tree is None else tree["time_ns"]
        if end_s is not None:
            end_ns, grace_ns = start_ns + round(end_s * 1e9), round(self._stop_timeout * 1e9)
            d.set_end(end_ns, grace_ns)
            if not d.simulated:
                self._hard_end_ns = end_ns + grace_ns
                self._events.put(_Signal.WAKE)  # the coordinator recomputes its timeout
        self._start_supervision(start_ns)

    def start_timer(self) -> None:
        """Start the run's timer at its start time: timed work runs from here on."""
        self._timer_started = True
        self.dispatcher.start_running(self.start_ns)

    def _start_supervision(self, start_ns: int) -> None:
        """The first snapshot, right after the start (and restore), then the schedule."""
        sup = self._supervisor
        if sup.snapshot_dir is not None:
            from ..snapshot import save

            # Simulated time waits for each file (every snapshot gets one, a failure stops
            # the run before the next); real time skips a snapshot rather than stall the net.
            self._writer = SnapshotWriter(
                sup.snapshot_dir, sup.keep, save, on_error=self._record_failure,
                check=functools.partial(check_file_messages, ports=self._ports),
                block=self.dispatcher.simulated, cancelled=self._end_requested.is_set)
        if sup.restart != "none" or sup.snapshot_every is not None or sup.snapshot_dir:
            self._supervise_snapshot(time_ns=start_ns)
            self._schedule_cuts(start_ns)

    # -- what the host reads -------------------------------------------------------------
    @property
    def time_ns(self) -> int:
        """int: the run's time, ns of its timer (frozen at the end)."""
        end = self._end_ns
        return self.timer.now_ns() if end is None else end

    @property
    def ending(self) -> bool:
        """bool: the end is decided (the run takes no more writes)."""
        return self._end_requested.is_set()

    @property
    def ended(self) -> bool:
        """bool: the run has ended (every on_stop has run or was given up)."""
        return self._ended.is_set()

    def wait_ended(self, timeout: float | None) -> bool:
        """Wait for the end (``timeout``: wall seconds, None: no bound); True once ended."""
        return self._ended.wait(timeout)

    @property
    def failure(self) -> BaseException | None:
        """BaseException | None: the first failure, else the stuck nodes at the stop."""
        with self.lock:
            if self._failures:
                return self._failures[0]
        return self._stuck

    @property
    def reported(self) -> bool:
        """bool: `raise_outcome` was called (``join()`` reported the outcome)."""
        return self._reported

    def raise_outcome(self) -> None:
        """Raise what made the run fail (the first failure, listing the others), if any."""
        with self.lock:
            failures = list(self._failures)
            self._reported = True
        if failures:
            first = failures[0]
            if isinstance(first, NodeError):
                first.failures = [f for f in failures if isinstance(f, NodeError)]
                more = len(first.failures) - 1
                if more and not str(first).endswith("see .failures)"):
                    first.args = (f"{first} (and {more} more failure(s): see .failures)",)
            raise first
        if self._stuck is not None:
            raise self._stuck

    def snapshot_stats(self) -> SnapshotStats:
        """The supervisor's snapshots so far: pauses, files, skipped and missed ones."""
        pauses = list(self._pauses)
        writes = list(self._writer.write_seconds) if self._writer is not None else []
        return SnapshotStats(
            count=len(pauses), pause_mean=sum(pauses) / len(pauses) if pauses else 0.0,
            pause_max=max(pauses, default=0.0),
            write_mean=sum(writes) / len(writes) if writes else 0.0, files=len(writes),
            skipped=self._writer.skipped if self._writer is not None else 0,
            missed=self._missed)

    def wall_seconds(self) -> float:
        """Wall seconds since the run was built (until its end, once ended)."""
        end = self._wall_end if self._wall_end is not None else time.perf_counter()
        return end - self._wall_start

    # -- requests of the host -------------------------------------------------------------
    def post_state_request(self, req: StateRequest) -> bool:
        """Queue a host's state request; False once requests are closed (the run ends)."""
        with self.lock:  # against _close_requests: a request is posted only while served
            if self._closed:
                return False
            self._events.put(req)
            return True

    # -- ending -------------------------------------------------------------------------
    # The end of a run is decided here and nowhere else: whatever ends it (the
    # duration, stop(), a failure) calls end(), the first call records its
    # reason and the later ones do nothing. The deciding call asks the
    # dispatcher to stop at the boundary itself, on its own thread, before any
    # other caller returns (_end_lock), not on the coordinator's later turn: a
    # failing hook's thread is still in flight then, so with simulated time the
    # run stops at the end of the failure's instant whatever the coordinator's
    # latency, and where a run stops does not depend on the thread timing.
    # The coordinator only finishes the run (_finish), and escalates to
    # Dispatcher.stop_now only if that boundary is not reached within
    # stop_timeout (a hook of the instant is stuck). Lock order: _end_lock,
    # then the dispatcher's; the dispatcher never calls end() with its lock
    # held (reached_end and held only post events).
    def end(self, reason: EndReason) -> None:
        """Decide that the run ends (idempotent: the first reason is recorded).

        Args:
            reason (EndReason): what ends it.
        """
        with self._end_lock:
            if self.end_reason is not None:
                return
            self.end_reason = reason
            self.dispatcher.stop_at_boundary()
            self._end_requested.set()
        self._events.put(_Signal.END)

    def _record_failure(self, err: BaseException) -> None:
        """Keep ``err`` for join() and end the run."""
        with self.lock:
            self._failures.append(err)
        self.end(EndReason.FAILED)

    def _supervisor_failed(self, exc: BaseException) -> None:
        """The supervisor's own work (a snapshot, a restart) raised: the run fails with it."""
        # One line: join() raises it with its traceback (marked for front ends).
        log.error("the supervisor failed: %s", exc, extra={"mujou_failure": True})
        self._record_failure(exc)

    def callback_failed(self, sub: Subscribed, exc: BaseException) -> None:
        """A subscriber callback raised: the run ends, and join() raises CallbackError."""
        err = CallbackError(f"subscriber of {sub.port!r} raised {describe(exc)}")
        err.__cause__ = exc
        with self.lock:
            self._failures.append(err)
        self.end(EndReason.FAILED)
        log.error("%s", err, exc_info=exc)

    # -- the dispatcher's listener (KernelListener) -----------------------------------------
    def hook_failed(self, actor: Actor, hook: str, exc: BaseException) -> None:
        """A hook raised (on its thread, no lock held): do what the supervisor decides."""
        path = actor.path or "<root>"
        # describe(): the exception's own __str__ may raise; this must not.
        err = NodeError(actor.path, hook, f"node {path!r} raised in {hook}: {describe(exc)}")
        err.__cause__ = exc
        verdict = failure_verdict(
            self._supervisor, self._intensity, self.timer.now_ns(),
            restartable=self._timer_started and not self._end_requested.is_set())
        if verdict.action is Action.STOP:
            if verdict.note:
                err = NodeError(actor.path, hook, f"{err} ({verdict.note})")
                err.__cause__ = exc
            # join() raises it with its traceback: the log gets one line, marked
            # so that a front end reporting join()'s error can leave it out.
            log.error("%s", err, extra={"mujou_failure": True})
            self._record_failure(err)
        elif verdict.action is Action.RESTART_ONE:
            log.warning("node %r failed in %s; restarting it (one_for_one)", path, hook,
                        exc_info=exc)
            self._restart_one(actor)
        else:
            log.warning("node %r failed in %s; restarting the net (one_for_all)", path, hook,
                        exc_info=exc)
            # Before the hold is asked for: the coordinator serves it at the
            # first cut, whoever asked for that cut (see _serve).
            self._restart_due = (err, time.monotonic() + self._stop_timeout)
            self.dispatcher.request_hold()  # now: the cut must not depend on thread timing
            self._events.put(_Signal.WAKE)

    def reached_end(self) -> None:
        """The duration is over (the dispatcher's lock is held): an event, nothing more."""
        self._events.put(_Signal.REACHED_END)

    def held(self) -> None:
        """The net is held at a cut (the dispatcher's lock is held): an event, nothing more."""
        self._events.put(_Signal.HELD)

    def crashed(self, exc: BaseException) -> None:
        """An exception escaped a kernel thread's loop: the run fails with it."""
        self._record_failure(exc)

    # -- snapshots and restarts ---------------------------------------------------------
    def _restart_one(self, actor: Actor) -> None:
        """on_stop, on_start and the latest snapshot's state, as envelopes to one actor."""
        latest = self._latest
        assert latest is not None  # taken right after the start
        actor.restarts += 1
        state = latest["nodes"].get(actor.path)
        self.dispatcher.post_control(actor, [Stop(), Start(), Restore(state, {}, None)])

    def _restart_all(self) -> None:
        """Restore the whole net from the latest snapshot (held: at a consistent cut)."""
        d = self.dispatcher
        tree = self._latest
        assert tree is not None
        started = [a for a in self.actors if a.started]
        # Bounded as at the end and at the start; a node that does not make
        # it ends the run (the coordinator records the error), rather than
        # the restart going on without it.
        late = d.run_control(started, Stop(), self._stop_timeout, help=True)
        if late:
            raise StopTimeoutError({a.path: d.hook_of(a) if a.busy else "on_stop" for a in late},
                                   self._stop_timeout)
        deadline = time.monotonic() + self._start_timeout
        late = d.run_control(self.actors, Start(), self._start_timeout, help=True)
        if late:
            raise StartTimeoutError({a.path: d.hook_of(a) for a in late if a.busy},
                                    [a.path for a in late if not a.busy],
                                    self._start_timeout)
        d.discard_messages()
        for actor in self.actors:
            actor.restarts += 1
        self._restore_tree(tree, deadline, self._start_timeout)
        at = tree["time_ns"] if d.simulated else self.timer.now_ns()
        if not d.simulated:
            for actor in self.actors:
                actor.set_last_update(at)
        self._schedule_cuts(at)
        d.release(restart_at_ns=at)

    # -- consistent cuts -----------------------------------------------------------------
    def _cut_bound(self) -> float:
        """Wall seconds a periodic snapshot waits for the net to reach a cut."""
        every = self._supervisor.snapshot_every
        return self._stop_timeout if every is None else min(every, self._stop_timeout)

    def _serve(self) -> None:
        """Ask for, serve or give up the cut that what waits for one needs.

        Never waits: the dispatcher announces the hold with a ``HELD`` event,
        and each wish has a deadline that the coordinator's timeout covers.
        """
        d = self.dispatcher
        while True:
            if self._timed_due():
                return
            if d.held:  # only this thread releases: a hold seen is a hold
                self._at_hold()
                continue
            self._requests = [r for r in self._requests if not r.cancelled]
            now = time.monotonic()
            late = [r for r in self._requests if r.deadline is not None and now >= r.deadline]
            cut_late = self._cut_deadline is not None and now >= self._cut_deadline
            restart_late = self._restart_due is not None and now >= self._restart_due[1]
            if late or cut_late or restart_late:
                busy = d.busy_hooks()
                if d.held:  # reached meanwhile after all
                    continue
                for req in late:
                    self._requests.remove(req)
                    self._answer(req, error=TimeoutError(
                        f"state_dict(): no consistent cut within {req.timeout:g} s; "
                        + why_no_cut(busy)))
                if cut_late:
                    self._cut_deadline = None
                    self._miss(busy, self._cut_bound())
                if restart_late:
                    self._give_up_restart(busy)
            wanted = bool(self._requests) or self._cut_deadline is not None or (
                self._restart_due is not None)
            if wanted and not self._asked:
                self._asked = True
                d.request_hold()
                continue  # it may hold at once
            if not wanted and self._asked:
                self._asked = False
                if d.withdraw_hold() is None:  # held already: release it
                    continue
            return

    def _timed_due(self) -> bool:
        """Act on the real-time schedule: the hard end (True: the run ends) and
        a periodic snapshot that has come due."""
        now = self.timer.now_ns()
        if self._hard_end_ns is not None and now >= self._hard_end_ns:
            # Hooks still running stop_timeout after the end: every worker may
            # be stuck, so no worker would notice the end; end it from here.
            self.end(EndReason.DURATION)
            return True
        if self._next_cut_ns is not None and now >= self._next_cut_ns:
            self._next_cut_ns = None
            still = {a.path: str(h) for a, (n, h) in self._missing.items()
                     if a.busy and a.updates == n and a.hook == h}
            if still:  # the hooks of the last miss are still running: no hold
                self._miss(still, 0.0)
            else:
                self._missing = {}
                self._cut_deadline = time.monotonic() + self._cut_bound()
        return False

    def _next_timeout(self) -> float | None:
        """Wall seconds until the coordinator must look again (None: an event will come)."""
        now_ns = self.timer.now_ns()
        now = time.monotonic()
        left = [(t - now_ns) / 1e9 for t in (self._next_cut_ns, self._hard_end_ns)
                if t is not None]
        left += [r.deadline - now for r in self._requests if r.deadline is not None]
        if self._cut_deadline is not None:
            left.append(self._cut_deadline - now)
        if self._restart_due is not None:
            left.append(self._restart_due[1] - now)
        return max(0.0, min(left)) if left else None

    def _at_hold(self) -> None:
        """The net is held: restart it, take the due snapshot, answer the requests."""
        d = self.dispatcher
        self._asked = False
        if self._restart_due is not None:
            self._restart_due = None
            # The restore reschedules the snapshots from the snapshot's time.
            d.take_cut_due()
            self._cut_deadline = None
            self._restart_all()  # releases; the other wishes ask for the next cut
            return
        try:
            cut_due = d.take_cut_due()  # taken (cleared) whatever the deadline says
            if cut_due or self._cut_deadline is not None:
                self._cut_deadline = None
                bound = self._cut_bound()
                try:
                    self._supervise_snapshot(timeout=bound)
                except NoCut as exc:  # a restart's hook took an actor during the cut
                    if not self._end_requested.is_set():  # else: the run stops at this cut
                        self._miss(exc.busy, bound)
                except BaseException as exc:  # noqa: BLE001 - join() raises it
                    # Recorded while the net is held: the release then leaves
                    # it stopping, so the run ends at this very cut.
                    self._supervisor_failed(exc)
                else:
                    self._missing = {}
                    if self._resume_due:
                        self._resume_due = False
                        log.info("snapshots resume at t=%.6f s", self.time_ns / 1e9)
                    self._schedule_cuts(self.timer.now_ns())
            requests, self._requests = self._requests, []
            for req in requests:
                if req.cancelled:
                    continue
                # Never an unbounded wait here: the coordinator must get back
                # to its queue (the end, the hard end). A call without a
                # timeout tries again at the next cut, and so does any call
                # once the run is ending (it then gets the final state).
                left = (self._cut_bound() if req.deadline is None
                        else max(0.0, req.deadline - time.monotonic()))
                try:
                    tree = self.take_tree(timeout=left)
                except NoCut as exc:
                    if req.deadline is None or self._end_requested.is_set():
                        self._requests.append(req)
                    else:
                        self._answer(req, error=TimeoutError(
                            f"state_dict(): no consistent cut within {req.timeout:g} s; "
                            + why_no_cut(exc.busy)))
                except BaseException as exc:  # noqa: BLE001 - the caller raises it
                    self._answer(req, error=exc)
                else:
                    self._answer(req, tree=tree)
        finally:
            d.release()

    def _answer(self, req: StateRequest, tree: dict[str, Any] | None = None,
                error: BaseException | None = None) -> None:
        """Answer a state request (unless its caller gave up) and wake the caller."""
        with self.lock:
            if not req.cancelled:
                req.tree, req.error = tree, error
            req.done.set()

    def _miss(self, busy: Mapping[str, str], bound: float) -> None:
        """Count a periodic snapshot that could not be taken; the next multiple tries again."""
        self._missed += 1
        self._resume_due = True
        first = not self._missing
        self._missing = {a: (a.updates, a.hook) for a in
                         (self._by_path[p] for p in busy if p in self._by_path)}
        self._schedule_cuts(self.timer.now_ns())
        nxt = self._next_cut_ns if self._next_cut_ns is not None else self.dispatcher.next_cut_ns
        level = logging.WARNING if first else logging.DEBUG
        log.log(level, "snapshot missed at t=%.6f s: %s; the net goes on%s",
                self.time_ns / 1e9,
                why_no_cut(busy) if bound == 0.0 else
                f"no consistent cut within {bound:g} s; {why_no_cut(busy)}",
                "" if nxt is None else f", next try at t={nxt / 1e9:.6f} s")

    def _give_up_restart(self, busy: Mapping[str, str]) -> None:
        """A one_for_all restart found no cut within stop_timeout: the run fails."""
        err, _ = self._restart_due  # type: ignore[misc]
        self._restart_due = None
        failed = NodeError(err.path, err.hook,
                           f"{err} (one_for_all could not restart the net: no consistent "
                           f"cut within {self._stop_timeout:g} s; {why_no_cut(busy)})")
        failed.__cause__ = err.__cause__
        log.error("%s", failed, extra={"mujou_failure": True})
        self._record_failure(failed)

    def _close_requests(self) -> None:
        """Take no more requests; let those waiting fall back to the final state."""
        with self.lock:
            self._closed = True
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                break
            if isinstance(event, StateRequest):
                self._requests.append(event)
        requests, self._requests = self._requests, []
        for req in requests:
            self._answer(req)

    def _supervise_snapshot(self, time_ns: int | None = None,
                            timeout: float | None = None) -> None:
        """Take the supervisor's snapshot (the net is held or not yet running); file it."""
        t0 = time.perf_counter()
        tree = self.take_tree(time_ns, timeout)
        self._pauses.append(time.perf_counter() - t0)
        self._latest = tree
        if self._writer is not None:
            self._writer.submit(tree)

    def _schedule_cuts(self, now_ns: int) -> None:
        """Schedule the next periodic snapshot after ``now_ns``, on its grid."""
        every = self._supervisor.snapshot_every
        if every is None:
            return
        every_ns = round(every * 1e9)
        nxt = (now_ns // every_ns + 1) * every_ns
        if self.dispatcher.simulated:
            self.dispatcher.hold_at(nxt)
        else:
            self._next_cut_ns = nxt
            self._events.put(_Signal.WAKE)  # the coordinator recomputes its timeout

    # -- state trees ---------------------------------------------------------------------
    def take_tree(self, time_ns: int | None = None,
                  timeout: float | None = None) -> dict[str, Any]:
        """The state tree, taken now: the net must be held (or not running).

        Args:
            time_ns: overrides the timer's reading (the first snapshot is
                taken at the start time, before a real-time clock starts).
            timeout: wall seconds to wait for actors busy with a restart's
                control hook.

        Raises:
            NoCut: ``timeout`` passed with such an actor still busy.
            NodeError: a node's ``state_dict()`` raised, or (after the end) a
                node is still stuck in a hook.
        """
        return take_tree(self.dispatcher, self.actors, self._ports,
                         time_ns=self.time_ns if time_ns is None else time_ns,
                         seeds=self._seeds, host_copy=self.wiring.host_copy,
                         wait_kept=self.wiring.wait_kept, timeout=timeout,
                         ended=self._ended.is_set() or self._finishing)

    def _restore_tree(self, tree: dict[str, Any], deadline: float, limit: float) -> None:
        """Load a checked tree into the held net (see `cuts.restore_tree`)."""
        restore_tree(self.dispatcher, self.actors, self._ports, tree, deadline, limit,
                     self.wiring.deliver)

    # -- the thread -----------------------------------------------------------------------
    def _coordinate(self) -> None:
        """The ``mujou-run`` thread: serve the events until the end, then finish."""
        try:
            while True:
                try:
                    event: _Event = self._events.get(timeout=self._next_timeout())
                except queue.Empty:
                    event = _Signal.WAKE  # a deadline or a time of the schedule has come
                if event is _Signal.END:
                    break
                if event is _Signal.REACHED_END:
                    self.end(EndReason.DURATION)  # its END event follows
                    continue
                if isinstance(event, StateRequest):
                    self._requests.append(event)
                try:
                    self._serve()
                except BaseException as exc:  # noqa: BLE001 - e.g. a state that cannot be taken
                    self._supervisor_failed(exc)
            self._close_requests()  # before _finish: it joins the subscriber thread
            self._finishing = True
            self._finish()
        finally:
            self._wall_end = time.perf_counter()
            _unended.discard(self)
            self._close_requests()
            # Whatever stopped _finish short, no waiter may wait on (a no-op
            # once _finish closed the host's side).
            if self._host is not None:
                self._host.close(0.0)
            self._ended.set()

    def _finish(self) -> None:
        """Stop timed work, run every started node's on_stop, release the net.

        Two waits of at most ``stop_timeout`` each, as docs/run.md promises:
        one for the hooks in flight (the end of a simulated instant
        included), one for the ``on_stop`` hooks and the threads' exit.
        """
        d = self.dispatcher
        timeout = self._stop_timeout
        deadline = time.monotonic() + timeout  # hooks in flight: one wait in all
        # end() asked for the stop at the boundary already (see there).
        if not d.wait_stopping(timeout):
            d.stop_now()  # the instant does not finish: a hook is stuck
        left = max(0.0, deadline - time.monotonic())
        stuck = {a.path: d.hook_of(a) for a in d.wait_idle(left)}
        self._end_ns = self.timer.now_ns()
        to_stop = [a for a in self.actors if a.started and a.path not in stuck]
        deadline = time.monotonic() + timeout  # the on_stop hooks, then the threads' exit
        for actor in d.run_control(to_stop, Stop(), timeout, help=True):
            stuck.setdefault(actor.path, d.hook_of(actor) if actor.busy else "on_stop")
        if stuck:
            self._stuck = StopTimeoutError(stuck, timeout)
            log.error("%s", self._stuck)
        d.shutdown()
        # Threads not stuck are out of their hooks and exit at once.
        stuck_threads = {a.thread_name for a in self.actors
                         if a.path in stuck and a.thread_name is not None}
        d.join_threads(timeout=max(0.0, deadline - time.monotonic()), skip=stuck_threads)
        self._write_trace()
        self._release()
        if self._writer is not None:
            self._writer.close(self._stop_timeout)  # each file is complete or absent
        # Queued callbacks get at most stop_timeout more; waiters are woken.
        if self._host is not None:
            self._host.close(self._stop_timeout)

    def _write_trace(self) -> None:
        """Write the trace file of a traced run (once its threads have stopped)."""
        if self._trace is None:
            return
        (tracer, recorder), self._trace = self._trace, None
        d = self.dispatcher
        try:
            tracer._write(recorder, d.thread_names(),
                          {"timer": "simulated" if d.simulated else "realtime",
                           "workers": d.n_workers, "nodes": len(self.actors)})
        except Exception as exc:  # noqa: BLE001 - join() raises it
            log.error("could not write the trace file %s: %s", tracer.path, exc)
            with self.lock:
                self._failures.append(exc)

    def _release(self) -> None:
        """Release the nodes: they may run in another net, their sends need one again."""
        for actor in self.actors:
            actor.node._mujou_run = None
        unwire(self._ports)
