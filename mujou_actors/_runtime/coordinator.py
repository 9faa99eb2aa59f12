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
it out. What waits for a cut lives in two records the coordinator calls: the
host's state requests (`requests.StateRequests`) and the periodic snapshots
(`snapshots.Snapshots`); the coordinator asks for the cut they need.
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
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..devices import CudaRuntime
from ..errors import (
    CallbackError,
    DeadlineMissError,
    NodeError,
    StartTimeoutError,
    StopTimeoutError,
    describe,
)
from ..net import check_file_messages
from ..params import keep_values
from ..ports import Input, Port
from ..stats import SnapshotStats
from ..supervisor import (
    Action,
    RestartIntensity,
    Supervisor,
    failure_verdict,
)
from ..timers import Timer
from ..trace import Recorder, Tracer
from .actor import Actor
from .build import Seams, Wiring, unwire
from .cuts import NoCut, restore_tree, take_tree, why_no_cut
from .dispatcher import Dispatcher
from .mailbox import Restore, Start, Stop
from .outputs import close_outputs, file_snapshot
from .protocols import CapsuleSide, HostSide, RecorderSide, Subscribed
from .requests import StateRequest, StateRequests
from .snapshots import Snapshots
from .watchdog import Watchdog

__all__ = ["Coordinator", "EndReason", "ON_COORDINATOR"]

log = logging.getLogger("mujou_actors")

# Coordinators of runs not yet ended, so that interpreter exit can stop them:
# their threads are daemons, and a daemon killed inside a torch operation at
# exit aborts the process. Runs share nothing through this set; it only serves
# that stop.
_unended: weakref.WeakSet[Coordinator] = weakref.WeakSet()


@atexit.register
def _stop_runs_at_exit() -> None:
    for coordinator in list(_unended):
        paths = [a.path or "<root>" for a in coordinator.actors]
        log.warning("a run of %s was still running when the interpreter exited: it is "
                    "stopped now, at t = %.3f s of its timer; to let it reach its duration, "
                    "call run.join() (or use `with mujou.run(...) as run: run.join()`) "
                    "before the script ends", ", ".join(repr(p) for p in paths[:3])
                    + (f" and {len(paths) - 3} more nodes" if len(paths) > 3 else ""),
                    coordinator.timer.now_ns() / 1e9)
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
        seams: the constructor seams (`build.Seams`): how the net is wired
            (``wire``) and how a snapshot file is written (``save_snapshot``).
    """

    def __init__(self, *, actors: list[Actor], ports: dict[str, Port], seeds: dict[str, int],
                 timer: Timer, workers: int, stop_timeout: float,
                 supervisor: Supervisor | None, rt: CudaRuntime | None,
                 tracer: Tracer | None, seams: Seams) -> None:
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
        self._watchdog = Watchdog(self.dispatcher, stop_timeout)  # hooks that do not return
        self.wiring: Wiring = seams.wire(actors, ports, self.dispatcher, rt)
        self._save_snapshot = seams.save_snapshot
        # Subscriptions, waiters and the mujou-host thread: the run's host side,
        # attached by the run (attach_host) before the threads start.
        self._host: HostSide | None = None
        self.recorder: RecorderSide | None = None  # the run's recording (attach_recorder)
        self.capsule: CapsuleSide | None = None  # its crash capsule (attach_capsule)
        self.lock = threading.Lock()  # the failures
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
        # What waits for the next cut: host state_dict() calls, a periodic
        # snapshot (in real time until its monotonic deadline) and a
        # one_for_all restart (its failure and deadline; set by the failing
        # thread before it asks for the hold).
        self._requests = StateRequests(self._events.put)
        self._supervisor = supervisor or Supervisor()
        self._snapshots = Snapshots(self._supervisor, actors, timer, stop_timeout=stop_timeout,
                                    hold_at=self.dispatcher.hold_at,
                                    simulated=self.dispatcher.simulated, wake=self._wake)
        self._restart_due: tuple[NodeError, float] | None = None
        self._asked = False  # the coordinator's own request_hold is pending
        within = self._supervisor.within
        assert within is not None  # Supervisor() allows no None
        self._intensity = RestartIntensity(self._supervisor.max_restarts, round(within * 1e9))
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

    def attach_recorder(self, recorder: RecorderSide) -> None:
        """Give the coordinator the run's recording, which it closes at the end.

        Called once, before `start_threads`; the recorder gets the supervisor's
        snapshots as they are taken.
        """
        self.recorder = recorder

    def attach_capsule(self, capsule: CapsuleSide) -> None:
        """Give the coordinator the run's crash capsule, which it closes at the end.

        Called once, before `start_threads`; the capsule gets the supervisor's
        snapshots as they are taken, a one_for_all restart's rewind and the
        failures.
        """
        self.capsule = capsule

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
        if self.recorder is not None:
            self.recorder.close(None, "the run did not start", self._stop_timeout)
        if self.capsule is not None:
            self.capsule.close(self._stop_timeout)

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
        dispatcher = self.dispatcher
        self._start_timeout = start_limit
        start_deadline = time.monotonic() + start_limit  # one bound for the whole phase
        late = dispatcher.run_control(self.actors, Start(), start_limit)
        if self._failures:  # an on_start raised: that is the cause, not what waited
            self.raise_outcome()
        if late:
            raise StartTimeoutError({a.path: dispatcher.hook_of(a) for a in late if a.busy},
                                    [a.path for a in late if not a.busy], start_limit)
        if tree is not None:
            # The tree holds every message the net had at the cut; what on_start
            # sent now was already delivered once, before the cut.
            dispatcher.discard_messages()
            self._restore_tree(tree, start_deadline, start_limit)
        if self._failures:
            self.raise_outcome()
        start_ns = self.start_ns = 0 if tree is None else tree["time_ns"]
        self.wiring.start_at(start_ns)
        for port, value in initial:
            self.wiring.deliver(port, self.wiring.write_copy(value, port))
        if end_s is not None:
            end_ns, grace_ns = start_ns + round(end_s * 1e9), round(self._stop_timeout * 1e9)
            dispatcher.set_end(end_ns, grace_ns)
            if not dispatcher.simulated:
                self._hard_end_ns = end_ns + grace_ns
                self._wake()
        self._start_supervision(start_ns)

    def start_timer(self) -> None:
        """Start the run's timer at its start time: timed work runs from here on."""
        self._timer_started = True
        self.dispatcher.start_running(self.start_ns)

    def _start_supervision(self, start_ns: int) -> None:
        """The first snapshot, right after the start (and restore), then the schedule."""
        snapshots = self._snapshots
        snapshots.open_writer(self._save_snapshot,
                              functools.partial(check_file_messages, ports=self._ports),
                              on_error=self._record_failure,
                              cancelled=self._end_requested.is_set)
        if snapshots.wanted:
            self._supervise_snapshot(time_ns=start_ns)
            snapshots.schedule(start_ns)

    def _wake(self) -> None:
        """Make the coordinator recompute its timeout (a new time to look at)."""
        self._events.put(_Signal.WAKE)

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
        return self._snapshots.stats()

    def wall_seconds(self) -> float:
        """Wall seconds since the run was built (until its end, once ended)."""
        end = self._wall_end if self._wall_end is not None else time.perf_counter()
        return end - self._wall_start

    # -- requests of the host -------------------------------------------------------------
    def post_state_request(self, req: StateRequest) -> bool:
        """Queue a host's state request; False once requests are closed (the run ends)."""
        return self._requests.post(req)

    def cancel_state_request(self, req: StateRequest) -> bool:
        """The host gave up waiting for ``req``: True unless it was answered meanwhile."""
        return self._requests.cancel(req)

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
        err = NodeError.from_hook(actor.path, hook, exc)  # whatever exc's own __str__ does
        if self.capsule is not None:
            # The hook's key: before the timer started (on_start) there is none.
            key = actor.stamp if self._timer_started else (-1, 0)
            self.capsule.failed(actor.path, hook, exc, key)
        # on_miss="stop" stops the run: a restarted node too slow would only miss again.
        verdict = failure_verdict(
            self._supervisor, self._intensity, self.timer.now_ns(),
            restartable=self._timer_started and not self._end_requested.is_set()
            and not isinstance(exc, DeadlineMissError))
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
            self._wake()

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
        latest = self._snapshots.latest
        assert latest is not None  # taken right after the start
        actor.restarts += 1
        state = keep_values(latest["nodes"].get(actor.path), actor.node)  # sets stay set
        self.dispatcher.post_control(actor, [Stop(), Start(), Restore(state, {}, None)])

    def _restart_all(self) -> None:
        """Restore the whole net from the latest snapshot (held: at a consistent cut)."""
        dispatcher = self.dispatcher
        tree = self._snapshots.latest
        assert tree is not None
        started = [a for a in self.actors if a.started]
        # Bounded as at the end and at the start; a node that does not make
        # it ends the run (the coordinator records the error), rather than
        # the restart going on without it.
        late = dispatcher.run_control(started, Stop(), self._stop_timeout, help=True)
        if late:
            raise StopTimeoutError(
                {a.path: dispatcher.hook_of(a) if a.busy else "on_stop" for a in late},
                self._stop_timeout)
        deadline = time.monotonic() + self._start_timeout
        late = dispatcher.run_control(self.actors, Start(), self._start_timeout, help=True)
        if late:
            raise StartTimeoutError({a.path: dispatcher.hook_of(a) for a in late if a.busy},
                                    [a.path for a in late if not a.busy],
                                    self._start_timeout)
        dispatcher.discard_messages()
        for actor in self.actors:
            actor.restarts += 1
        # The parameters are not rewound: the values set stay, the sets queued stay queued.
        kept = {**tree, "nodes": {a.path: keep_values(tree["nodes"][a.path], a.node)
                                  for a in self.actors}}
        restore_tree(self.dispatcher, self.actors, self._ports, kept, deadline,
                     self._start_timeout, self.wiring.deliver, restart=True)
        if self.capsule is not None:
            self.capsule.restored(kept)
        at = tree["time_ns"] if dispatcher.simulated else self.timer.now_ns()
        schedule = tree["schedule"]
        for actor in self.actors:
            # Real time: dt counts from the restart. Simulated: from the tree's last
            # update, which its Restore set; a tree taken before the timer started (the
            # first snapshot) has none, and dt counts from its time, the start, as the
            # first time (not from the update that failed after it).
            if not dispatcher.simulated or \
                    schedule.get(actor.path, {}).get("last_update_ns") is None:
                actor.set_last_update(at)
        self._snapshots.schedule(at)
        dispatcher.release(restart_at_ns=at)

    # -- consistent cuts -----------------------------------------------------------------
    def _serve(self) -> None:
        """Ask for, serve or give up the cut that what waits for one needs.

        Never waits: the dispatcher announces the hold with a ``HELD`` event,
        and each wish has a deadline that the coordinator's timeout covers.
        """
        dispatcher, requests, snapshots = self.dispatcher, self._requests, self._snapshots
        while True:
            if self._timed_due():
                return
            if dispatcher.held:  # only this thread releases: a hold seen is a hold
                self._at_hold()
                continue
            requests.drop_cancelled()
            now = time.monotonic()
            late = requests.late(now)
            cut_late = snapshots.late(now)
            restart_late = self._restart_due is not None and now >= self._restart_due[1]
            if late or cut_late or restart_late:
                busy = dispatcher.busy_hooks()
                if dispatcher.held:  # reached meanwhile after all
                    continue
                requests.time_out(late, busy)
                if cut_late:
                    snapshots.give_up(busy)
                if restart_late:
                    self._give_up_restart(busy)
            wanted = bool(requests) or snapshots.deadline is not None or (
                self._restart_due is not None)
            if wanted and not self._asked:
                self._asked = True
                dispatcher.request_hold()
                continue  # it may hold at once
            if not wanted and self._asked:
                self._asked = False
                if dispatcher.withdraw_hold() is None:  # held already: release it
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
        self._snapshots.come(now)
        return False

    def _next_timeout(self) -> float | None:
        """Wall seconds until the coordinator must look again (the watchdog looks at least
        every half stop_timeout)."""
        now_ns = self.timer.now_ns()
        now = time.monotonic()
        snapshots = self._snapshots
        left = [(t - now_ns) / 1e9 for t in (snapshots.next_ns, self._hard_end_ns)
                if t is not None]
        left += [deadline - now for deadline in self._requests.deadlines()]
        if snapshots.deadline is not None:
            left.append(snapshots.deadline - now)
        if self._restart_due is not None:
            left.append(self._restart_due[1] - now)
        left.append(self._watchdog.next_look())
        return max(0.0, min(left))

    def _at_hold(self) -> None:
        """The net is held: restart it, take the due snapshot, answer the requests."""
        dispatcher, snapshots = self.dispatcher, self._snapshots
        self._asked = False
        if self._restart_due is not None:
            self._restart_due = None
            # The restore reschedules the snapshots from the snapshot's time.
            dispatcher.take_cut_due()
            snapshots.restarted()
            self._restart_all()  # releases; the other wishes ask for the next cut
            return
        try:
            # The dispatcher's flag is taken (cleared) whatever the deadline says.
            if snapshots.due_at_cut(dispatcher.take_cut_due()):
                bound = snapshots.bound()
                try:
                    self._supervise_snapshot(timeout=bound)
                except NoCut as exc:  # a restart's hook took an actor during the cut
                    if not self._end_requested.is_set():  # else: the run stops at this cut
                        snapshots.miss(exc.busy, bound)
                except BaseException as exc:  # noqa: BLE001 - join() raises it
                    # Recorded while the net is held: the release then leaves
                    # it stopping, so the run ends at this very cut.
                    self._supervisor_failed(exc)
                else:
                    snapshots.taken()
            self._requests.serve(lambda left: self.take_tree(timeout=left), snapshots.bound(),
                                 self._end_requested.is_set)
        finally:
            dispatcher.release()

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
        """Take no more state requests; let those waiting fall back to the final state."""
        self._requests.close(self._queued_requests)

    def _queued_requests(self) -> Iterator[StateRequest]:
        """Empty the event queue (the run ends), yielding the state requests on it."""
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return
            if isinstance(event, StateRequest):
                yield event

    def _supervise_snapshot(self, time_ns: int | None = None,
                            timeout: float | None = None) -> None:
        """Take the supervisor's snapshot (the net is held or not yet running); file it."""
        t0 = time.perf_counter()
        tree = self.take_tree(time_ns, timeout)
        file_snapshot(self._snapshots, tree, time.perf_counter() - t0, self.recorder,
                      self.capsule)

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
                self._watchdog.look()
                if event is _Signal.END:
                    break
                if event is _Signal.REACHED_END:
                    self.end(EndReason.DURATION)  # its END event follows
                    continue
                if isinstance(event, StateRequest):
                    self._requests.add(event)
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
            recorder, capsule = self.recorder, self.capsule
            if recorder is not None or capsule is not None:  # _finish stopped short
                self.recorder = self.capsule = None
                close_outputs(self._failures, time_ns=self._end_ns, stop_timeout=0.0,
                              recorder=recorder, capsule=capsule, otherwise=self._stuck,
                              lock=self.lock)
            self._ended.set()

    def _finish(self) -> None:
        """Stop timed work, run every started node's on_stop, release the net.

        Two waits of at most ``stop_timeout`` each, as docs/run.md promises:
        one for the hooks in flight (the end of a simulated instant
        included), one for the ``on_stop`` hooks and the threads' exit. A
        real-time run that reached its duration gave the hooks in flight
        their ``stop_timeout`` already (the grace up to the hard end): the
        first wait only has what is left of it, never a second one.
        """
        dispatcher = self.dispatcher
        timeout = self._stop_timeout
        deadline = time.monotonic() + timeout  # hooks in flight: one wait in all
        if self.end_reason is EndReason.DURATION and self._hard_end_ns is not None:
            grace_left = max(0.0, (self._hard_end_ns - self.timer.now_ns()) / 1e9)
            deadline = min(deadline, time.monotonic() + grace_left)
        # end() asked for the stop at the boundary already (see there).
        if not dispatcher.wait_stopping(max(0.0, deadline - time.monotonic())):
            dispatcher.stop_now()  # the instant does not finish: a hook is stuck
        left = max(0.0, deadline - time.monotonic())
        stuck = {a.path: dispatcher.hook_of(a) for a in dispatcher.wait_idle(left)}
        self._end_ns = self.timer.now_ns()
        to_stop = [a for a in self.actors if a.started and a.path not in stuck]
        deadline = time.monotonic() + timeout  # the on_stop hooks, then the threads' exit
        for actor in dispatcher.run_control(to_stop, Stop(), timeout, help=True):
            stuck.setdefault(actor.path, dispatcher.hook_of(actor) if actor.busy else "on_stop")
        if stuck:
            self._stuck = StopTimeoutError(stuck, timeout)
            # Raised by join(): the command reports it itself, so it leaves this line out.
            log.error("%s", self._stuck, extra={"mujou_failure": True})
        dispatcher.shutdown()
        # Threads not stuck are out of their hooks and exit at once.
        stuck_threads = {a.thread_name for a in self.actors
                         if a.path in stuck and a.thread_name is not None}
        dispatcher.join_threads(timeout=max(0.0, deadline - time.monotonic()),
                                skip=stuck_threads)
        self._release()
        recorder, self.recorder = self.recorder, None
        capsule, self.capsule = self.capsule, None
        # The one order every run's outputs close in (outputs.py).
        close_outputs(self._failures, time_ns=self._end_ns, stop_timeout=self._stop_timeout,
                      trace=self._trace_writer(), recorder=recorder, capsule=capsule,
                      snapshots=self._snapshots, host=self._host, otherwise=self._stuck,
                      lock=self.lock)

    def _trace_writer(self) -> tuple[str, Callable[[], None]] | None:
        """A traced run's trace file and the function that writes it (its threads stopped)."""
        if self._trace is None:
            return None
        (tracer, recorder), self._trace = self._trace, None
        dispatcher = self.dispatcher

        def write() -> None:
            tracer._write(recorder, dispatcher.thread_names(),
                          {"timer": "simulated" if dispatcher.simulated else "realtime",
                           "workers": dispatcher.n_workers, "nodes": len(self.actors)})

        return str(tracer.path), write

    def _release(self) -> None:
        """Release the nodes: they may run in another net, their sends need one again."""
        for actor in self.actors:
            actor.node._mujou_run = None
        unwire(self._ports)
