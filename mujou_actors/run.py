"""``mujou.run`` and ``Run``: build the actors, start them, and the host's API.

The host talks to a running net only through envelopes (writes), views of
Outputs (read, subscribe, wait_for) and the dispatcher's phases (start, stop).
A coordinator thread (``mujou-run``) ends the run whatever ends it: its
duration, ``stop()``, leaving the ``with`` block or a node failure.
"""

from __future__ import annotations

import atexit
import enum
import functools
import logging
import math
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from ._runtime.actor import Actor
from ._runtime.dispatcher import Dispatcher
from ._runtime.mailbox import Restore, Snapshot, Start, Stop
from ._runtime.sends import make_send
from ._runtime.workers import default_workers
from .cuda import check_cuda_sync
from .devices import (
    CudaRuntime,
    HostCopier,
    Path,
    WriteCopier,
    copy_stream_devices,
    device_copier,
    mark_ready,
    send_path,
    to_host,
)
from .errors import (
    CallbackError,
    NetError,
    NodeError,
    NotRunningError,
    StartTimeoutError,
    StopTimeoutError,
    describe,
)
from .host import HOST_QUEUE_DEPTH, Host, Subscription, Waiter, check_depth
from .net import (
    check_file_messages,
    check_fit,
    check_flag,
    check_seconds,
    check_workers,
    collect_ports,
    load_state,
    resolve_inputs,
    settle_seeds,
    walk,
    warn_unknown_hooks,
)
from .node import Node, check_seed
from .ports import Input, Output, Port, copy_message
from .state import FORMAT
from .stats import NodeStats, RunStats, SnapshotStats, WorkerStats, percentile
from .supervisor import RestartIntensity, SnapshotWriter, Supervisor
from .timers import Timer, make_timer
from .trace import Recorder, Tracer, as_tracer, check_writable

__all__ = ["run", "Run"]

log = logging.getLogger("mujou_actors")

# Runs not yet ended, so that interpreter exit can stop them: their threads are
# daemons, and a daemon killed inside a torch operation at exit aborts the
# process. Runs share nothing through this set; it only serves that stop.
_unended: weakref.WeakSet[Run] = weakref.WeakSet()


@atexit.register
def _stop_runs_at_exit() -> None:
    for run_ in list(_unended):
        try:
            run_.stop()
        except Exception:  # noqa: BLE001 - exit goes on; the failure is logged
            log.exception("stopping a run at interpreter exit failed")


# ---------------------------------------------------------------------------
# The net


class _StateRequest:
    """A host's `Run.state_dict` call, waiting for the coordinator's cut.

    The coordinator sets ``tree`` or ``error`` and then ``done``; ``done``
    alone means the run ended first (the caller then takes the final state).
    ``cancelled`` (set by a caller that gave up) makes it skip the request.
    Both sides change it under the run's ``_lock``.
    """

    __slots__ = ("deadline", "timeout", "done", "tree", "error", "cancelled")

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.done = threading.Event()
        self.tree: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.cancelled = False


class _NoCut(TimeoutError):
    """No consistent cut within a bound: ``busy`` names the hooks in the way."""

    def __init__(self, timeout: float, busy: Mapping[str, str]) -> None:
        self.busy = dict(busy)
        super().__init__(f"no consistent cut within {timeout:g} s; " + _why_no_cut(busy))


# A node's state_dict() and load_state_dict() run on the run's own thread
# (mujou-run) at a cut and in a restart; that thread also ends the run.
_ON_COORDINATOR = ("{call} from a node's state_dict() or load_state_dict() would block the "
                   "run's thread (mujou-run), which takes the cuts and ends the run, "
                   "so it would wait for itself")


def _why_no_cut(busy: Mapping[str, str]) -> str:
    if not busy:
        return "the run was busy with another snapshot or a restart"
    return "still running: " + ", ".join(f"{p or '<root>'!r} in {h}" for p, h in busy.items())


class EndReason(enum.Enum):
    """Why a run ends: the first reason to end it is the one recorded."""

    STOPPED = "stopped"  # stop(), leaving the with block, interpreter exit
    FAILED = "failed"  # a hook, a subscriber callback, the supervisor, a kernel thread
    DURATION = "duration"  # the run's duration is over


class _View:
    """The host's view of one Output: the newest message and the listeners."""

    __slots__ = ("last", "listeners")

    def __init__(self) -> None:
        self.last: Any = None
        self.listeners: list[Callable[[Any], None]] = []

    def publish(self, message: Any) -> None:
        for listener in self.listeners:
            listener(message)


class _Listener:
    """The run's `KernelListener`: what its dispatcher reports, as the run's events.

    ``reached_end`` and ``held`` come with the dispatcher's lock held: they
    only post an event for the coordinator thread.
    """

    __slots__ = ("_run",)

    def __init__(self, run_: Run) -> None:
        self._run = run_

    def hook_failed(self, actor: Actor, hook: str, exc: BaseException) -> None:
        """A hook raised (on its thread, no lock held): the run's supervision decides."""
        self._run._on_failure(actor, hook, exc)

    def reached_end(self) -> None:
        """The duration is over (lock held): an event, nothing more."""
        self._run._events.put(("reached_end",))

    def held(self) -> None:
        """The net is held at a cut (lock held): an event, nothing more."""
        self._run._events.put(("held",))

    def crashed(self, exc: BaseException) -> None:
        """An exception escaped a kernel thread's loop: the run fails with it."""
        self._run._record_failure(exc)


# ---------------------------------------------------------------------------
# Run


class Run:
    """A started run of a net; made by `run`, not directly.

    Use it as a context manager (leaving the block stops the run and raises a
    node's failure) or call `join`. Ports are given as objects or by
    dotted path (``"ctrl.setpoint"``).
    """

    def __init__(self, *, actors: list[Actor], timer: Timer, workers: int,
                 ports: dict[str, Port], seeds: dict[str, int],
                 stop_timeout: float, supervisor: Supervisor | None = None,
                 trace: Recorder | None = None) -> None:
        self._actors = actors
        # The run drives its dispatcher, which reports back only through the
        # KernelListener calls (hook_failed, reached_end, held, crashed).
        self._dispatcher = Dispatcher(actors, timer, workers, _Listener(self), trace)
        self._timer = timer
        self._ports = ports
        self._port_ids = {id(p) for p in ports.values()}
        self._seeds = seeds
        self._stop_timeout = stop_timeout
        self._start_timeout = 60.0  # set by run(): bounds a restart's on_start and restore too
        self._actor_of = {id(a.node): a for a in actors}
        self._views: dict[int, _View] = {}
        self._input_views: dict[int, _View] = {}
        self._failures: list[NodeError | CallbackError] = []
        self._stuck: StopTimeoutError | None = None
        self._reported = False
        self._lock = threading.Lock()
        # Set by _end, under _end_lock, with the reason recorded.
        self._end_requested = threading.Event()
        self._end_lock = threading.Lock()
        self._end_reason: EndReason | None = None
        self._ended = threading.Event()
        # Subscriptions, waiters and the mujou-host thread (see host.py).
        self._host = Host(self._host_copy, self._callback_failed)
        self._wall_start = time.perf_counter()
        self._wall_end: float | None = None
        self._end_ns: int | None = None
        self._coordinator = threading.Thread(target=self._coordinate, name="mujou-run",
                                             daemon=True)
        _unended.add(self)
        # Everything that changes the whole net (end, cuts, restarts) goes
        # through the coordinator's queue and is done on its thread, one at a
        # time; no other thread holds the net, so none waits for another
        # while holding what it needs.
        self._events: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        # What waits for the next cut (the coordinator's alone): host
        # state_dict() calls, a real-time periodic snapshot (until its
        # monotonic deadline) and a one_for_all restart (its failure and
        # deadline; set by the failing thread before it asks for the hold).
        self._requests: list[_StateRequest] = []
        self._closed = False  # set under _lock once the coordinator takes no more requests
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
        self._intensity = RestartIntensity(self._supervisor.max_restarts,
                                           round(self._supervisor.within * 1e9))
        self._writer: SnapshotWriter | None = None
        self._pauses: list[float] = []
        self._next_cut_ns: int | None = None
        self._finishing = False
        # After the end each state_dict() takes the state on its own thread,
        # inside each node's context: one call at a time, as during the run
        # (a Context is entered by one thread at a time, and a node's
        # state_dict never runs alongside itself).
        self._final_lock = threading.Lock()
        self._timer_started = False
        self._hard_end_ns: int | None = None
        self._rt: CudaRuntime | None = None  # set when a node is on CUDA
        self._trace: tuple[Tracer, Recorder] | None = None  # set when the run is traced
        self._start_ns = 0

    # -- properties -----------------------------------------------------------------
    @property
    def seeds(self) -> Mapping[str, int]:
        """Mapping[str, int]: the seed of every node's generator, by path."""
        return dict(self._seeds)

    @property
    def time(self) -> float:
        """float: the run's time in seconds of its timer (frozen once the run has ended)."""
        return self.time_ns / 1e9

    @property
    def time_ns(self) -> int:
        """int: the run's time in integer nanoseconds of its timer (frozen at the end)."""
        end = self._end_ns
        return self._timer.now_ns() if end is None else end

    @property
    def nodes(self) -> Mapping[str, Node]:
        """Mapping[str, Node]: every node of the run by dotted path, parents first."""
        return {a.path: a.node for a in self._actors}

    @property
    def start_time(self) -> float:
        """float: the time the run started at, seconds of its timer (a restored run's is > 0)."""
        return self._start_ns / 1e9

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
        self._check_caller("wait()")
        return self._ended.wait(timeout)

    def _check_caller(self, call: str) -> None:
        """Refuse a call that waits for the end from a thread the end waits for.

        The end waits for every hook and for the subscriber callbacks (the
        ``mujou-host`` thread) to return, so such a call would block until
        ``stop_timeout`` or forever.
        """
        if self._dispatcher.is_own_thread():
            raise RuntimeError(
                f"{call} from inside a hook would block its thread until the run ends, and "
                "the run's end waits for the hook: use run.stop() to end the run, "
                "run.running to check")
        if self._host.on_thread():
            raise RuntimeError(
                f"{call} from a subscriber callback would block the callbacks' thread "
                "(mujou-host) until the run ends, and the run's end waits for the callbacks: "
                "use run.stop() to end the run, run.running to check")
        if threading.current_thread() is self._coordinator:
            raise RuntimeError(_ON_COORDINATOR.format(call=call))

    @property
    def failure(self) -> BaseException | None:
        """BaseException | None: what `join` raises (the first failure, or stuck
        nodes at the stop), None for a run that did not fail; final once ended."""
        with self._lock:
            if self._failures:
                return self._failures[0]
        return self._stuck

    @property
    def running(self) -> bool:
        """bool: True until the run has ended."""
        return not self._ended.is_set()

    # -- ports ------------------------------------------------------------------------
    def _port(self, port: Port | str, want: type | None = None) -> Port:
        if isinstance(port, str):
            found = self._ports.get(port)
            if found is None:
                raise ValueError(f"no port {port!r} in this run (ports: {sorted(self._ports)})")
            port = found
        elif not isinstance(port, Port):
            raise TypeError(f"expected a port or a dotted port path, got {type(port).__name__}")
        elif id(port) not in self._port_ids:
            raise ValueError(f"port {port.path!r} is not part of this run")
        if want is not None and not isinstance(port, want):
            raise TypeError(f"port {port.path!r} is an {type(port).__name__}; "
                            f"expected an {want.__name__}")
        return port

    def _host_copy(self, message: Any) -> Any:
        """A private CPU copy of a message for the host (or a state tree)."""
        rt = self._rt
        if rt is None:
            return copy_message(message)
        return _host_message(to_host(message, rt), HostCopier(rt))

    def _view(self, output: Output) -> _View:
        return self._views[id(output)]

    def read(self, port: Port | str) -> Any:
        """The newest message of a port, as a copy for the host.

        Args:
            port (Port | str): an Output (the newest message sent on it) or an
                Input (its newest kept message), or its dotted path.

        Returns:
            A copy of the message, or ``None`` before the first. Works after
            the run has ended too. The copy of a CUDA message is made once its
            GPU work is done (a sent message's ready event, the receiving
            work of a CUDA node's Input).

        Raises:
            ValueError: no such port in this run.
        """
        p = self._port(port)
        if isinstance(p, Output):
            return self._host_copy(self._view(p).last)
        message = p.read()  # type: ignore[attr-defined]
        self._wait_kept(p)  # type: ignore[arg-type]
        return self._host_copy(message)

    def _wait_kept(self, port: Input) -> None:
        """Wait until the values kept by a CUDA node's Input are on its device.

        Its receive work (waits for senders' events, copies) is queued on the
        node's stream, which the host's stream is not ordered after. The event
        is recorded after each batch of received values, before they are
        kept, so a later record than the one of a value read just before
        this call only covers more.
        """
        event = self._actor_of[id(port.node)].kept_ready
        if event is not None:
            self._rt.wait_ready(event)  # type: ignore[union-attr]

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
        p = self._port(port, Input)
        message = _write_copy(p.check(value), self._actor_of[id(p.node)], self._rt)
        if self._end_requested.is_set():
            raise NotRunningError(f"write to {p.path!r}: the run has ended")
        self._deliver(p, message)  # type: ignore[arg-type]

    def _deliver(self, port: Input, message: Any) -> None:
        actor = self._actor_of[id(port.node)]
        slot = actor.slot(port)
        self._dispatcher.host_deliver(actor, slot, message, slot in actor.triggers)
        view = self._input_views.get(id(port))
        if view is not None and view.listeners:
            view.publish(message)

    def _listen(self, port: Port, listener: Callable[[Any], None]) -> Callable[[], None]:
        """Attach ``listener`` to every message sent on or delivered to ``port``."""
        if isinstance(port, Output):
            views = [self._view(port)]
        else:
            sources = port._sources  # type: ignore[attr-defined]
            views = [self._view(s) for s in sources]
            views.append(self._input_views.setdefault(id(port), _View()))
        for view in views:
            # Copy-on-write: senders iterate the list without a lock.
            view.listeners = view.listeners + [listener]

        def detach() -> None:
            for view in views:
                view.listeners = [x for x in view.listeners if x is not listener]

        return detach

    def subscribe(self, port: Port | str, callback: Callable[[Any], None], *,
                  depth: int = HOST_QUEUE_DEPTH) -> Subscription:
        """Call ``callback(message)`` for every later message of a port.

        Callbacks run in send order on the thread ``mujou-host`` (never on a
        worker), each with a copy of the message. Each subscription queues at
        most ``depth`` messages for its callback; when the callback falls
        further behind, the oldest is dropped and counted
        (`Subscription.dropped` and ``stats().subscriptions``, logged once). A callback that raises
        (whatever it raises) stops the run; `join` raises `CallbackError`. The
        other subscriptions are served until the end. When the run ends, what
        is queued is delivered for at most ``stop_timeout`` seconds, the rest
        counted in `Subscription.undelivered`.

        Args:
            port (Port | str): an Output (every message sent on it) or an
                Input (every message delivered to it), or its dotted path.
            callback: called with one argument.
            depth (int): the most messages waiting for this callback, >= 1.
                Default: `HOST_QUEUE_DEPTH` (1024).

        Returns:
            Subscription: call it (or its ``cancel()``) to cancel the
            subscription; it counts the calls and the dropped messages.

        Raises:
            ValueError / TypeError: no such port in this run, a callback that
                is not callable, a bad ``depth``.
            NotRunningError: the run has ended.
        """
        p = self._port(port)
        if not callable(callback):
            raise TypeError(f"subscribe({p.path!r}): callback must be callable")
        depth = check_depth(f"subscribe({p.path!r})", depth)
        sub = self._host.subscribe(p.path, callback, depth)
        sub.detach = self._listen(p, sub.put)
        return sub

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
        p = self._port(port)
        self._check_caller("wait_for()")
        what = f"wait_for({p.path!r})"
        waiter = Waiter(p.path, what, check_depth(what, depth))
        deadline = None if timeout is None else time.monotonic() + timeout
        detach = self._listen(p, waiter.put)
        try:
            self._host.add_waiter(waiter)  # refused once the run has ended
            while True:
                # Checked before each message too: a port that keeps sending
                # must not keep a failing predicate from timing out.
                ok, message = waiter.get(deadline)
                if not ok or (deadline is not None and time.monotonic() > deadline):
                    raise TimeoutError(f"{what}: no match within {timeout} s"
                                       + waiter.drops_note())
                message = self._host_copy(message)
                if predicate is None or predicate(message):
                    return message
        finally:
            detach()
            self._host.remove_waiter(waiter)

    def _callback_failed(self, sub: Subscription, exc: BaseException) -> None:
        """A subscriber callback raised: the run ends, and join() raises CallbackError."""
        err = CallbackError(f"subscriber of {sub.port!r} raised {describe(exc)}")
        err.__cause__ = exc
        with self._lock:
            self._failures.append(err)
        self._end(EndReason.FAILED)
        log.error("%s", err, exc_info=exc)

    # -- ending -------------------------------------------------------------------------
    # The end of a run is decided here and nowhere else: whatever ends it (the
    # duration, stop(), a failure) calls _end, the first call records its
    # reason and the later ones do nothing. The deciding call asks the
    # dispatcher to stop at the boundary itself, on its own thread, before any
    # other caller returns (_end_lock), not on the coordinator's later turn: a
    # failing hook's thread is still in flight then, so with simulated time the
    # run stops at the end of the failure's instant whatever the coordinator's
    # latency, and where a run stops does not depend on the thread timing.
    # The coordinator only finishes the run (_finish), and escalates to
    # Dispatcher.stop_now only if that boundary is not reached within
    # stop_timeout (a hook of the instant is stuck). Lock order: _end_lock,
    # then the dispatcher's; the dispatcher never calls back into _end with
    # its lock held (reached_end and held only post events).
    def _end(self, reason: EndReason) -> None:
        """Decide that the run ends (idempotent: the first reason is recorded)."""
        with self._end_lock:
            if self._end_reason is not None:
                return
            self._end_reason = reason
            self._dispatcher.stop_at_boundary()
            self._end_requested.set()
        self._events.put(("end",))

    def _supervisor_failed(self, exc: BaseException) -> None:
        # One line: join() raises it with its traceback (marked for front ends).
        log.error("the supervisor failed: %s", exc, extra={"mujou_failure": True})
        self._record_failure(exc)

    def _record_failure(self, err: BaseException) -> None:
        with self._lock:
            self._failures.append(err)  # type: ignore[arg-type]
        self._end(EndReason.FAILED)

    def _on_failure(self, actor: Actor, hook: str, exc: BaseException) -> None:
        """A hook raised (on its thread, no lock held): stop, or restart as the supervisor says."""
        path = actor.path or "<root>"
        # describe(): the exception's own __str__ may raise; this must not.
        err = NodeError(actor.path, hook, f"node {path!r} raised in {hook}: {describe(exc)}")
        err.__cause__ = exc
        strategy = self._supervisor.restart
        if strategy == "none" or self._end_requested.is_set() or not self._timer_started:
            # join() raises it with its traceback: the log gets one line, marked
            # so that a front end reporting join()'s error can leave it out.
            log.error("%s", err, extra={"mujou_failure": True})
            self._record_failure(err)
        elif not self._intensity.allow(self._timer.now_ns()):
            sup = self._supervisor
            err = NodeError(actor.path, hook,
                            f"{err} (the supervisor gave up: more than {sup.max_restarts} "
                            f"restarts within {sup.within} s)")
            err.__cause__ = exc
            log.error("%s", err, extra={"mujou_failure": True})
            self._record_failure(err)
        elif strategy == "one_for_one":
            log.warning("node %r failed in %s; restarting it (one_for_one)", path, hook,
                        exc_info=exc)
            self._restart_one(actor)
        else:
            log.warning("node %r failed in %s; restarting the net (one_for_all)", path, hook,
                        exc_info=exc)
            # Before the hold is asked for: the coordinator serves it at the
            # first cut, whoever asked for that cut (see _serve).
            self._restart_due = (err, time.monotonic() + self._stop_timeout)
            self._dispatcher.request_hold()  # now: the cut must not depend on thread timing
            self._events.put(("wake",))

    # -- snapshots and restarts ---------------------------------------------------------
    def _restart_one(self, actor: Actor) -> None:
        """on_stop, on_start and the latest snapshot's state, as envelopes to one actor."""
        latest = self._latest
        assert latest is not None  # taken right after the start
        actor.restarts += 1
        state = latest["nodes"].get(actor.path)
        self._dispatcher.post_control(actor, [Stop(), Start(), Restore(state, {}, None)])

    def _restart_all(self) -> None:
        """Restore the whole net from the latest snapshot (held: at a consistent cut)."""
        d = self._dispatcher
        tree = self._latest
        assert tree is not None
        started = [a for a in self._actors if a.started]
        # Bounded as at the end and at the start; a node that does not make
        # it ends the run (the coordinator records the error), rather than
        # the restart going on without it.
        late = d.run_control(started, Stop(), self._stop_timeout, help=True)
        if late:
            raise StopTimeoutError({a.path: d.hook_of(a) if a.busy else "on_stop" for a in late},
                                   self._stop_timeout)
        deadline = time.monotonic() + self._start_timeout
        late = d.run_control(self._actors, Start(), self._start_timeout, help=True)
        if late:
            raise StartTimeoutError({a.path: d.hook_of(a) for a in late if a.busy},
                                    [a.path for a in late if not a.busy],
                                    self._start_timeout)
        d.discard_messages()
        for actor in self._actors:
            actor.restarts += 1
        self._restore_tree(tree, deadline, self._start_timeout, rewind=True)
        at = tree["time_ns"] if d.simulated else self._timer.now_ns()
        if not d.simulated:
            for actor in self._actors:
                actor.set_last_update(at)
        self._schedule_cuts(at)
        d.release(restart_at_ns=at)

    # -- consistent cuts (the coordinator's) -------------------------------------------
    def _cut_bound(self) -> float:
        """Wall seconds a periodic snapshot waits for the net to reach a cut."""
        every = self._supervisor.snapshot_every
        return self._stop_timeout if every is None else min(every, self._stop_timeout)

    def _serve(self) -> None:
        """Ask for, serve or give up the cut that what waits for one needs.

        Never waits: the dispatcher announces the hold with a ``held`` event,
        and each wish has a deadline that the coordinator's timeout covers.
        """
        d = self._dispatcher
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
                        + _why_no_cut(busy)))
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
        now = self._timer.now_ns()
        if self._hard_end_ns is not None and now >= self._hard_end_ns:
            # Hooks still running stop_timeout after the end: every worker may
            # be stuck, so no worker would notice the end; end it from here.
            self._end(EndReason.DURATION)
            return True
        if self._next_cut_ns is not None and now >= self._next_cut_ns:
            self._next_cut_ns = None
            still = {a.path: h for a, (n, h) in self._missing.items()
                     if a.busy and a.updates == n and a.hook == h}
            if still:  # the hooks of the last miss are still running: no hold
                self._miss(still, 0.0)
            else:
                self._missing = {}
                self._cut_deadline = time.monotonic() + self._cut_bound()
        return False

    def _next_timeout(self) -> float | None:
        """Wall seconds until the coordinator must look again (None: an event will come)."""
        now_ns = self._timer.now_ns()
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
        d = self._dispatcher
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
                except _NoCut as exc:  # a restart's hook took an actor during the cut
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
                    self._schedule_cuts(self._timer.now_ns())
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
                    tree = self._take_tree(timeout=left)
                except _NoCut as exc:
                    if req.deadline is None or self._end_requested.is_set():
                        self._requests.append(req)
                    else:
                        self._answer(req, error=TimeoutError(
                            f"state_dict(): no consistent cut within {req.timeout:g} s; "
                            + _why_no_cut(exc.busy)))
                except BaseException as exc:  # noqa: BLE001 - the caller raises it
                    self._answer(req, error=exc)
                else:
                    self._answer(req, tree=tree)
        finally:
            d.release()

    def _answer(self, req: _StateRequest, tree: dict[str, Any] | None = None,
                error: BaseException | None = None) -> None:
        with self._lock:
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
        self._schedule_cuts(self._timer.now_ns())
        nxt = self._next_cut_ns if self._next_cut_ns is not None else self._dispatcher.next_cut_ns
        level = logging.WARNING if first else logging.DEBUG
        log.log(level, "snapshot missed at t=%.6f s: %s; the net goes on%s",
                self.time_ns / 1e9,
                _why_no_cut(busy) if bound == 0.0 else
                f"no consistent cut within {bound:g} s; {_why_no_cut(busy)}",
                "" if nxt is None else f", next try at t={nxt / 1e9:.6f} s")

    def _give_up_restart(self, busy: Mapping[str, str]) -> None:
        """A one_for_all restart found no cut within stop_timeout: the run fails."""
        err, _ = self._restart_due  # type: ignore[misc]
        self._restart_due = None
        failed = NodeError(err.path, err.hook,
                           f"{err} (one_for_all could not restart the net: no consistent "
                           f"cut within {self._stop_timeout:g} s; {_why_no_cut(busy)})")
        failed.__cause__ = err.__cause__
        log.error("%s", failed, extra={"mujou_failure": True})
        self._record_failure(failed)

    def _close_requests(self) -> None:
        """Take no more requests; let those waiting fall back to the final state."""
        with self._lock:
            self._closed = True
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                break
            if event[0] == "state":
                self._requests.append(event[1])
        requests, self._requests = self._requests, []
        for req in requests:
            self._answer(req)

    def _supervise_snapshot(self, time_ns: int | None = None,
                            timeout: float | None = None) -> None:
        t0 = time.perf_counter()
        tree = self._take_tree(time_ns, timeout)
        self._pauses.append(time.perf_counter() - t0)
        self._latest = tree
        if self._writer is not None:
            self._writer.submit(tree)

    def _schedule_cuts(self, now_ns: int) -> None:
        every = self._supervisor.snapshot_every
        if every is None:
            return
        every_ns = round(every * 1e9)
        nxt = (now_ns // every_ns + 1) * every_ns
        if self._dispatcher.simulated:
            self._dispatcher.hold_at(nxt)
        else:
            self._next_cut_ns = nxt
            self._events.put(("wake",))  # the coordinator recomputes its timeout

    def _take_tree(self, time_ns: int | None = None,
                   timeout: float | None = None) -> dict[str, Any]:
        """The state tree, taken now: the net must be held (or not running).

        ``time_ns`` overrides the timer's reading (the first snapshot is taken
        at the start time, before a real-time clock starts). ``timeout``:
        wall seconds to wait for actors busy with a restart's control hook
        (raises `_NoCut`).
        """
        d = self._dispatcher
        nodes: dict[str, Any] = {}
        errors: dict[str, BaseException] = {}
        if self._ended.is_set() or self._finishing:
            envelope = Snapshot(nodes, errors)
            for actor in self._actors:
                if actor.busy:
                    # Left behind in a hook at the stop: its state is still
                    # changing, and its context is entered on that thread.
                    hook = d.hook_of(actor)
                    errors[actor.path] = NodeError(
                        actor.path, hook,
                        f"node {actor.path or '<root>'!r} is still in {hook} (stuck when the "
                        "run stopped): its state cannot be taken")
                else:
                    actor.take_state(envelope)
        else:
            late = d.run_here(self._actors, Snapshot(nodes, errors), timeout)
            if late:
                raise _NoCut(timeout or 0.0, {a.path: d.hook_of(a) for a in late})
        if errors:
            raise next(iter(errors.values()))
        inputs: dict[str, list[Any]] = {}
        pending: dict[str, list[Any]] = {}
        for path, port in self._ports.items():
            if isinstance(port, Input):
                kept = list(port._buffer)
                self._wait_kept(port)
                inputs[path] = [self._host_copy(m) for m in kept]
        for actor in self._actors:
            for delivery in d.pending_deliveries(actor):
                pending.setdefault(delivery.input.path, []).append(
                    self._host_copy(delivery.message))
        return {
            "format": FORMAT,
            "time_ns": self.time_ns if time_ns is None else time_ns,
            "seeds": dict(self._seeds),
            "nodes": {a.path: nodes[a.path] for a in self._actors},
            "inputs": inputs,
            "pending": pending,
            "schedule": {a.path: {"last_update_ns": a.last_update_ns} for a in self._actors},
        }

    def _restore_tree(self, tree: dict[str, Any], deadline: float, limit: float,
                      rewind: bool = False) -> None:
        """Load a checked tree into the held net (Restore envelopes, then messages).

        Args:
            deadline: ``time.monotonic()`` by which every ``load_state_dict``
                must have returned.
            limit: the timeout that deadline stands for (seconds), for the error.

        Raises:
            StartTimeoutError: the deadline passed (names the stuck node and
                those not restored).
        """
        d = self._dispatcher
        by_node: dict[str, dict[Any, list[Any]]] = {a.path: {} for a in self._actors}
        for path, messages in tree["inputs"].items():
            port = self._ports[path]
            by_node[port.node._mujou_path][port] = [copy_message(m) for m in messages]
        for i, actor in enumerate(self._actors):
            last = tree["schedule"].get(actor.path, {}).get("last_update_ns")
            envelope = Restore(tree["nodes"][actor.path], by_node[actor.path], last)
            left = max(0.0, deadline - time.monotonic())
            if d.run_control([actor], envelope, left, help=True):
                stuck = {actor.path: d.hook_of(actor)} if actor.busy else {}
                rest = [a.path for a in self._actors[i + (1 if stuck else 0):]]
                raise StartTimeoutError(stuck, rest, limit)
        for path, messages in tree["pending"].items():
            port = self._ports[path]
            for message in messages:
                self._deliver(port, copy_message(message))  # type: ignore[arg-type]

    def state_dict(self, timeout: float | None = None) -> dict[str, Any]:
        """The state tree of the whole net, taken at a consistent cut.

        The run pauses while the state is copied: no hook is in flight, so no
        message is half delivered. With the simulated timer the cut falls
        between two instants. Works after the end too (the final state; a
        simulated run's ``time_ns`` is then its end time). A call waiting for
        its cut when the run ends returns the final state.

        Args:
            timeout (float, optional): wall seconds to wait for the cut (a
                hook that does not return keeps it from coming); None waits
                until the hooks in flight return or the run ends.

        Returns:
            dict: ``{"format", "time_ns", "seeds", "nodes", "inputs", "pending",
            "schedule"}`` (see docs/state.md), every tensor a CPU copy.

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
        if self._dispatcher.is_own_thread():
            raise RuntimeError("state_dict() from inside a hook would wait for itself")
        if threading.current_thread() is self._coordinator:
            raise RuntimeError(_ON_COORDINATOR.format(call="state_dict()"))
        if self._host.on_thread() and self._end_requested.is_set():
            raise RuntimeError(
                "state_dict() from a subscriber callback while the run ends would wait for "
                "the end, and the end waits for the callbacks: take it after run.join()")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise TypeError(f"state_dict(): timeout must be a number of seconds or None, "
                                f"got {timeout!r}")
            if not math.isfinite(timeout) or timeout < 0:
                raise ValueError(f"state_dict(): timeout must be a finite number >= 0, "
                                 f"got {timeout!r}")
        req = _StateRequest(timeout)
        with self._lock:  # against _close_requests: a request is posted only while served
            posted = not self._closed
            if posted:
                self._events.put(("state", req))
        if posted:
            if not req.done.wait(timeout):
                with self._lock:
                    req.cancelled = not req.done.is_set()
                if req.cancelled:  # the coordinator is behind (a restart, a snapshot)
                    raise TimeoutError(f"state_dict(): no consistent cut within {timeout:g} s; "
                                       + _why_no_cut(self._dispatcher.busy_hooks()))
            if req.error is not None:
                raise req.error
            if req.tree is not None:
                return req.tree
        return self._final_state(req)

    def _final_state(self, req: _StateRequest) -> dict[str, Any]:
        """The state at the end, once the run has ended (see `state_dict`)."""
        if self._host.on_thread() and not self._ended.is_set():
            raise RuntimeError(
                "state_dict() from a subscriber callback while the run ends would wait for "
                "the end, and the end waits for the callbacks: take it after run.join()")
        left = None if req.deadline is None else max(0.0, req.deadline - time.monotonic())
        if not self._ended.wait(left):
            raise TimeoutError(f"state_dict(): the run is ending and did not end within "
                               f"{req.timeout:g} s")
        left = None if req.deadline is None else max(0.0, req.deadline - time.monotonic())
        if not self._final_lock.acquire(timeout=-1 if left is None else left):
            raise TimeoutError(f"state_dict(): another state_dict() call, taking the final "
                               f"state, did not return within {req.timeout:g} s")
        try:
            return self._take_tree()  # a node left stuck in a hook: NodeError
        finally:
            self._final_lock.release()

    def _coordinate(self) -> None:
        try:
            while True:
                try:
                    event = self._events.get(timeout=self._next_timeout())
                except queue.Empty:
                    event = ("wake",)  # a deadline or a time of the schedule has come
                if event[0] == "end":
                    break
                if event[0] == "reached_end":
                    self._end(EndReason.DURATION)  # its "end" event follows
                    continue
                if event[0] == "state":
                    self._requests.append(event[1])
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
            self._host.close(0.0)
            self._ended.set()

    def _finish(self) -> None:
        """Stop timed work, run every started node's on_stop, release the net.

        Two waits of at most ``stop_timeout`` each, as docs/run.md promises:
        one for the hooks in flight (the end of a simulated instant
        included), one for the ``on_stop`` hooks and the threads' exit.
        """
        d = self._dispatcher
        timeout = self._stop_timeout
        deadline = time.monotonic() + timeout  # hooks in flight: one wait in all
        # _end asked for the stop at the boundary already (see there).
        if not d.wait_stopping(timeout):
            d.stop_now()  # the instant does not finish: a hook is stuck
        left = max(0.0, deadline - time.monotonic())
        stuck = {a.path: d.hook_of(a) for a in d.wait_idle(left)}
        self._end_ns = self._timer.now_ns()
        to_stop = [a for a in self._actors if a.started and a.path not in stuck]
        deadline = time.monotonic() + timeout  # the on_stop hooks, then the threads' exit
        for actor in d.run_control(to_stop, Stop(), timeout, help=True):
            stuck.setdefault(actor.path, d.hook_of(actor) if actor.busy else "on_stop")
        if stuck:
            self._stuck = StopTimeoutError(stuck, timeout)
            log.error("%s", self._stuck)
        d.shutdown()
        # Threads not stuck are out of their hooks and exit at once.
        stuck_threads = {a.thread_name for a in self._actors if a.path in stuck}
        d.join_threads(timeout=max(0.0, deadline - time.monotonic()), skip=stuck_threads)
        self._write_trace()
        self._release()
        if self._writer is not None:
            self._writer.close(self._stop_timeout)  # each file is complete or absent
        # Queued callbacks get at most stop_timeout more; waiters are woken.
        self._host.close(self._stop_timeout)

    def _write_trace(self) -> None:
        """Write the trace file of a traced run (once its threads have stopped)."""
        if self._trace is None:
            return
        (tracer, recorder), self._trace = self._trace, None
        d = self._dispatcher
        try:
            tracer._write(recorder, d.thread_names(),
                          {"timer": "simulated" if d.simulated else "realtime",
                           "workers": d.n_workers, "nodes": len(self._actors)})
        except Exception as exc:  # noqa: BLE001 - join() raises it
            log.error("could not write the trace file %s: %s", tracer.path, exc)
            with self._lock:
                self._failures.append(exc)  # type: ignore[arg-type]

    def _release(self) -> None:
        for actor in self._actors:
            actor.node._mujou_run = None
        for port in self._ports.values():
            if isinstance(port, Output):
                port._send = None
                port.__dict__.pop("send", None)  # back to Output.send: "needs a running net"

    def stop(self) -> None:
        """End the run; idempotent.

        From the host it returns once every node's ``on_stop`` has run: hooks
        in flight finish first, for at most ``stop_timeout`` seconds; nodes
        still stuck then are reported (logged, and raised by `join` as
        `StopTimeoutError`) and left behind. From inside a hook (or a
        subscriber callback) it only asks the run to end, so it never
        deadlocks.
        """
        self._end(EndReason.STOPPED)
        if (self._dispatcher.is_own_thread() or self._host.on_thread()
                or threading.current_thread() is self._coordinator):
            return
        self._ended.wait()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the run to end; raise what made it fail.

        Args:
            timeout (float, optional): wall seconds to wait; None waits for the end.

        Raises:
            NodeError: a hook raised (the node's path and hook in the message,
                the original exception as ``__cause__``).
            CallbackError: a subscriber callback raised.
            StopTimeoutError: nodes were stuck in a hook when the run stopped.
            TimeoutError: the run has not ended within ``timeout``.
            RuntimeError: called from inside a hook or a subscriber callback
                (it would wait for itself; use `stop`).
        """
        self._check_caller("join()")
        if not self._ended.wait(timeout):
            raise TimeoutError(f"the run has not ended within {timeout} s")
        self._raise_outcome()

    def _raise_outcome(self) -> None:
        with self._lock:
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

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop()
        # Raise the run's failure unless the block already raised, or join()
        # already reported it to the caller.
        if exc_type is None and not self._reported:
            self._raise_outcome()

    # -- stats ------------------------------------------------------------------------------
    def stats(self) -> RunStats:
        """The statistics of nodes, workers, snapshots and subscribers: a frozen `RunStats`.

        Counts and ``dt`` cover the whole run; the lateness percentiles only
        each node's newest 256 updates. ``subscriptions`` has the host's
        deliveries and drops for each port subscribed to or waited on.
        Cheap enough to call a few times a second while the run goes on.
        """
        nodes = {}
        for a in self._actors:
            late = sorted(a.lateness_samples())
            drops = {name: p.drops for name, p in a.node._mujou_ports().items()
                     if isinstance(p, Input)}
            nodes[a.path] = NodeStats(
                path=a.path, updates=a.updates, overruns=a.overruns,
                # stats=False: no dt statistics (dt_sum would still be exact)
                dt_mean=a.dt_sum / a.updates if a.updates and a.timed else 0.0,
                dt_max=a.dt_max,
                lateness_p50=percentile(late, 50) / 1e9,
                lateness_p99=percentile(late, 99) / 1e9,
                hook_time=a.hook_ns / 1e9, drops=drops, restarts=a.restarts)
        end = self._wall_end if self._wall_end is not None else time.perf_counter()
        workers = {name: WorkerStats(name, busy)
                   for name, busy in self._dispatcher.busy_fractions().items()}
        pauses = list(self._pauses)
        writes = list(self._writer.write_seconds) if self._writer is not None else []
        snaps = SnapshotStats(
            count=len(pauses), pause_mean=sum(pauses) / len(pauses) if pauses else 0.0,
            pause_max=max(pauses, default=0.0),
            write_mean=sum(writes) / len(writes) if writes else 0.0, files=len(writes),
            skipped=self._writer.skipped if self._writer is not None else 0,
            missed=self._missed)
        return RunStats(time=self.time, wall=end - self._wall_start, nodes=nodes,
                        workers=workers, snapshots=snaps, subscriptions=self._host.stats())

    def __repr__(self) -> str:
        state = "running" if self.running else "ended"
        return f"<Run {state} t={self.time:.6f}s nodes={len(self._actors)}>"


# ---------------------------------------------------------------------------
# mujou.run


def run(
    net: Node | list[Node] | dict[str, Node],
    *,
    workers: int | None = None,
    timer: str = "realtime",
    duration: float | None = None,
    seed: int | None = None,
    inputs: Mapping[Input | str, Any] | None = None,
    state: Mapping[str, Any] | str | os.PathLike[str] | None = None,
    supervisor: Supervisor | None = None,
    trace: str | os.PathLike[str] | Tracer | None = None,
    cuda_sync: str = "block",
    stats: bool = True,
    stop_timeout: float = 10.0,
    start_timeout: float = 60.0,
) -> Run:
    """Start a net and return the started `Run`.

    Validates the net, derives the seeds, starts the threads, runs every
    ``on_start`` (a dedicated node's on its own thread), delivers ``inputs``,
    then starts the timer at t = 0. Returns once all of that is done.

    Args:
        net (Node | list[Node] | dict[str, Node]): the root node (every node
            reachable through its attributes runs too), or a list or dict of
            nodes (paths are the indices or keys).
        workers (int, optional): worker threads. Default: the usable CPUs
            (affinity and cgroup quota), halved while the GIL is enabled,
            never more than the nodes on the workers, at least 1.
        timer (str): ``"realtime"`` (monotonic clock) or ``"simulated"``
            (integer nanoseconds, as fast as possible, deterministic).
            Default: ``"realtime"``.
        duration (float, optional): seconds of the run's timer; every update
            due at t <= duration runs (delta cycles included), then the run
            ends. Default: runs until stopped.
        seed (int, optional): derives the seed of every node without its own
            from this seed and the node's path (stable across processes); in
            ``[0, 2**64)``, as ``Node(seed=)``.
        inputs (Mapping[Input | str, Any], optional): messages delivered to
            Inputs after every ``on_start`` (and the restore), before the timer
            starts.
        state (dict | str | os.PathLike, optional): a state tree
            (``Run.state_dict()``) or a snapshot file (``mujou.save``) to
            restore after every ``on_start`` (what ``on_start`` sends is
            dropped: the tree holds the messages of its cut): node states,
            kept and undelivered messages, and the time, so schedules continue where they were (the
            timer starts at the tree's ``time_ns``; ``duration`` counts from
            there). Seeds come from the tree.
        supervisor (Supervisor, optional): snapshots and restart strategy;
            default: no snapshots, a failure stops the run.
        trace (str | os.PathLike | Tracer, optional): record a timeline of
            every hook and write it, when the run ends, as a Chrome trace
            event file (open it in Perfetto or ``chrome://tracing``): a path,
            or a `Tracer` to set the ring buffer's capacity. The file is
            complete when `Run.join` returns, a failed run included. Whether
            it can be written is checked before anything starts; a file that
            still cannot be written at the end makes `Run.join` raise the
            ``OSError``.
            Default: None (nothing is recorded).
        cuda_sync (str): how a worker waits for a CUDA node's stream after
            ``on_update`` and a restore: ``"block"`` (the thread sleeps on an
            event made with blocking sync), ``"spin"`` (busy-polls: lowest
            latency, burns a core) or ``"yield"`` (polls, yielding the CPU).
            Default: ``"block"``.
        stats (bool): keep the timing statistics (dt, lateness, hook time,
            worker busy share). False saves their cost on the hot path for
            benchmarks; update, overrun, drop and restart counts remain.
            Default: True.
        stop_timeout (float): wall seconds ``stop()`` waits for the hooks in
            flight, and then again for the ``on_stop`` hooks, before it reports
            the stuck nodes: it returns within twice this. Default: 10.
        start_timeout (float): wall seconds that the start phase (every
            ``on_start``, then the restore of ``state``) may take in all.
            ``on_start`` hooks begin in the net's order (parents first): one
            after the other on a single worker, so an ``on_start`` must never
            wait for a later node's. Default: 60.

    Returns:
        Run: the started run.

    Raises:
        NetError: an invalid net (a node reachable twice, a node already in a
            running net, a port connected outside the net, a missing
            ``super().__init__()``).
        PortTypeError: a value of ``inputs`` does not match its Input.
        ValueError / TypeError: a bad argument, naming it. Every argument is
            checked before the nodes are claimed, and a failure after that
            releases them: the same nodes may be run again at once.
        NodeError: an ``on_start`` (or a ``load_state_dict``) raised; the run
            is stopped first.
        StartTimeoutError: ``start_timeout`` ran out (names the nodes stuck in
            ``on_start`` or ``load_state_dict``, and those never started); the
            run is stopped first (``on_stop`` of the started nodes, within
            ``stop_timeout``) and the nodes are released.
        SnapshotError: ``state`` is not a valid tree or file, or does not fit
            the net (names the missing and unexpected nodes and inputs).
        OSError: the ``trace`` file, or files in the supervisor's
            ``snapshot_dir``, could not be written: the path is a folder (a
            file for ``snapshot_dir``), lies under a file, or its folder takes
            no new file (``IsADirectoryError``, ``NotADirectoryError``,
            ``PermissionError``); raised before any node is claimed.
    """
    t = make_timer(timer)
    check_workers(workers)
    end_s = None if duration is None else check_seconds("duration", duration, allow_zero=True)
    timeout = check_seconds("stop_timeout", stop_timeout, allow_zero=False)
    start_limit = check_seconds("start_timeout", start_timeout, allow_zero=False)
    check_seed(seed, "mujou.run")
    check_flag("stats", stats)

    if supervisor is not None and not isinstance(supervisor, Supervisor):
        raise TypeError(f"mujou.run: supervisor must be a Supervisor, got {supervisor!r}")
    if supervisor is not None and supervisor.snapshot_dir is not None:
        # The first file is written after every on_start: find a bad folder first.
        check_writable(supervisor.snapshot_dir, "mujou.run: snapshot_dir", make_folders=True,
                       folder=True)
    tree = load_state(state)
    check_cuda_sync(cuda_sync)
    tracer = as_tracer(trace)

    found = walk(net)
    for path, node in found:
        if node._mujou_run is not None:
            raise NetError(f"node {path or '<root>'!r} ({type(node).__name__}) "
                           "is already part of a running net")
    warn_unknown_hooks(found)
    previous = [(node, node._mujou_path) for _, node in found]
    for path, node in found:
        node._mujou_path = path  # ports name themselves by path from here on
    try:
        ports = collect_ports(found)
        initial = resolve_inputs(ports, inputs)
        if tree is not None:
            check_fit(tree, found, ports, state)
        seeds = settle_seeds(found, tree, seed)
    except BaseException:
        for node, old in previous:  # a refused run leaves the nodes as they were
            node._mujou_path = old
        raise

    # Every argument is checked: the nodes are claimed from here on, and a
    # failure before the threads run releases them again (a later
    # mujou.run of the same nodes must not find them part of a running net).
    token = object()
    for _, node in found:
        node._mujou_run = token
    result: Run | None = None
    started: Dispatcher | None = None
    try:
        actors = []
        periods: dict[int, int] = {}
        for order, (path, node) in enumerate(found):
            actors.append(Actor(node, path, order, periods))
            if node._mujou_seed is None and (tree is None or path not in tree["seeds"]):
                node._mujou_reseed(seeds[path])  # a tree's generator state comes with the node's
            node._mujou_gen_seed = seeds[path]  # what Node.seed and Run.seeds show
            node._mujou_run_seeded = True  # later draws are the run's: no warning next time
        for port in ports.values():
            if isinstance(port, Input):
                port._reset()
        for actor in actors:
            actor.timed = stats
        pool = sum(1 for a in actors if not a.dedicated)
        n_workers = workers if workers is not None else default_workers(pool)

        recorder = None
        if tracer is not None:  # before the sinks are made: they keep the recorder
            recorder = tracer._recorder([a.path for a in actors], ports)
            for actor in actors:
                actor.trace = recorder
        result = Run(actors=actors, timer=t, workers=n_workers, ports=ports, seeds=seeds,
                     stop_timeout=timeout, supervisor=supervisor, trace=recorder)
        dispatcher = result._dispatcher
        if tracer is not None:
            result._trace = (tracer, recorder)  # type: ignore[assignment]
        _setup_cuda(result, actors, cuda_sync)
        _wire(result, actors, ports, dispatcher)
        started = dispatcher
        dispatcher.start_threads()
        result._coordinator.start()
    except BaseException:
        if started is not None:  # no hook has run: the threads exit at once
            started.shutdown()
            started.join_threads(timeout=timeout)
        _unclaim(found, ports, token)
        for node, old in previous:
            node._mujou_path = old
        if result is not None:
            _unended.discard(result)  # never started: there is nothing to stop at exit
        raise
    # One bound for the whole start phase: the on_start hooks, then the restore.
    result._start_timeout = start_limit
    start_deadline = time.monotonic() + start_limit
    try:
        # Inside the try: a KeyboardInterrupt while the host waits stops the run too.
        late = dispatcher.run_control(actors, Start(), start_limit)
        if result._failures:  # an on_start raised: that is the cause, not what waited
            result._raise_outcome()
        if late:
            raise StartTimeoutError({a.path: dispatcher.hook_of(a) for a in late if a.busy},
                                    [a.path for a in late if not a.busy], start_limit)
        if tree is not None:
            # The tree holds every message the net had at the cut; what on_start
            # sent now was already delivered once, before the cut.
            dispatcher.discard_messages()
            result._restore_tree(tree, start_deadline, start_limit)
        if result._failures:
            result._raise_outcome()
        for port, value in initial:
            result._deliver(port, _write_copy(value, result._actor_of[id(port.node)], result._rt))
        start_ns = result._start_ns = 0 if tree is None else tree["time_ns"]
        if end_s is not None:
            end_ns, grace_ns = start_ns + round(end_s * 1e9), round(timeout * 1e9)
            dispatcher.set_end(end_ns, grace_ns)
            if not dispatcher.simulated:
                result._hard_end_ns = end_ns + grace_ns
                result._events.put(("wake",))  # the coordinator recomputes its timeout
        _start_supervision(result, start_ns)
    except BaseException:
        result.stop()  # on_stop for the started nodes, threads ended, nodes released
        raise
    result._timer_started = True
    dispatcher.start_running(start_ns)
    return result


def _unclaim(found: list[tuple[str, Node]], ports: dict[str, Port], token: object) -> None:
    """Release the nodes of a run that failed before its threads started."""
    for _, node in found:
        if node._mujou_run is token:
            node._mujou_run = None
    for port in ports.values():
        if isinstance(port, Output):
            port._send = None
            port.__dict__.pop("send", None)


def _start_supervision(result: Run, start_ns: int) -> None:
    """The first snapshot, right after the start (and restore), then the schedule."""
    sup = result._supervisor
    if sup.snapshot_dir is not None:
        from .snapshot import save

        # Simulated time waits for each file (every snapshot gets one, a failure stops the
        # run before the next); real time skips a snapshot rather than stall the net.
        result._writer = SnapshotWriter(
            sup.snapshot_dir, sup.keep, save, on_error=result._record_failure,
            check=functools.partial(check_file_messages, ports=result._ports),
            block=result._dispatcher.simulated, cancelled=result._end_requested.is_set)
    if sup.restart != "none" or sup.snapshot_every is not None or sup.snapshot_dir:
        result._supervise_snapshot(time_ns=start_ns)
        result._schedule_cuts(start_ns)


_NO_TRIGGERS: frozenset[Any] = frozenset()  # shared by the many nodes without one


def _wire(result: Run, actors: list[Actor], ports: dict[str, Port],
          dispatcher: Dispatcher) -> None:
    """Install each Output's sink and each actor's set of triggering Inputs."""
    actor_of = result._actor_of
    for actor in actors:
        period_none = actor.period_ns is None
        actor.inputs = tuple(
            p for p in actor.node._mujou_ports().values() if isinstance(p, Input))
        actor.triggers = frozenset(
            i for i, p in enumerate(actor.inputs)
            if (period_none if p.trigger is None else p.trigger)
        ) or _NO_TRIGGERS
    for port in ports.values():
        if isinstance(port, Output):
            sender = actor_of[id(port.node)]
            routes = []
            for r in port._readers:
                reader = actor_of[id(r.node)]
                routes.append((r, reader, reader.slot(r) in reader.triggers))
            view = _View()
            result._views[id(port)] = view
            copy = _copier(sender, [a for _, a, _ in routes], result._rt)
            port._send = make_send(dispatcher.sends, sender, port, routes, view, copy)
            if type(port).send is Output.send:  # a subclass's own send() stays in the way
                # An instance attribute: a hook's ``out.send(v)`` calls it directly.
                port.send = port._send


def _copier(sender: Actor, readers: list[Actor], rt: CudaRuntime | None) -> Callable[[Any], Any]:
    """How an Output of ``sender`` copies each message, by its readers' devices.

    Also gives each reader the copy stream it needs on the sender's device.
    """
    if rt is None:
        return copy_message  # a net without CUDA: plain value semantics
    device = sender.device
    if send_path(device, [a.device for a in readers]) is Path.HOST:
        # A fresh copier per send: it keeps the streams its copies are on.
        return lambda value: _host_message(value, HostCopier(rt))
    for reader in readers:
        if device in copy_stream_devices(reader.device, [device]):
            if device not in reader.copy_streams:
                reader.copy_streams[device] = rt.new_stream(device)
    place = device_copier(device, rt)
    # One ready event per Output, recorded again at each send (see mark_ready):
    # creating events on the workers is slow, and the run needs no more.
    event = rt.new_event()
    return lambda value: mark_ready(copy_message(value, place), device, rt, event)


def _host_message(value: Any, copier: HostCopier) -> Any:
    """``value`` copied with ``copier`` (a `HostCopier`), once its copies are done."""
    message = copy_message(value, copier)
    copier.wait()
    return message


def _write_copy(value: Any, actor: Actor, rt: CudaRuntime | None) -> Any:
    """The copy of a value that ``run.write``/``inputs=`` deliver to ``actor``."""
    if rt is None:
        return copy_message(value)
    return _host_message(value, WriteCopier(actor.device, actor.stream, rt))


def _setup_cuda(result: Run, actors: list[Actor], cuda_sync: str) -> None:
    """Give CUDA nodes a stream and a waiter; synchronize the host's streams.

    Nothing happens, and CUDA stays untouched, when no node is on CUDA.
    """
    devices = {a.device for a in actors if a.device.type == "cuda"}
    if not devices:
        return
    rt = result._rt = _cuda_runtime()
    rt.set_sync(cuda_sync)
    for device in sorted(devices, key=str):
        # Tensors made in __init__ on the host's stream are complete before
        # any node's stream uses them.
        rt.wait(rt.current_stream(device))
    for actor in actors:
        actor.rt = rt
        if actor.device.type == "cuda":
            actor.stream = rt.new_stream(actor.device)
            actor.waiter = _make_waiter(cuda_sync)
            actor.kept_ready = rt.new_event()


def _cuda_runtime() -> CudaRuntime:
    return CudaRuntime()  # a seam: the CPU tests put a fake runtime here


def _make_waiter(cuda_sync: str) -> Any:
    from .cuda import make_waiter

    return make_waiter(cuda_sync)


