"""A kernel for some of a net's nodes, driven from outside: deliveries in, sends out, stepped.

`Kernel` runs the nodes of a net that it is given (each path with its
subtree) on its own dispatcher and workers, in simulated time, and lets a
driver do everything else: this is how a group of nodes runs in a process of
its own, driven by the run's coordinator across processes (docs/architecture.md,
"The kernel from outside"). The driver

* feeds it messages sent by nodes outside the kernel (`Kernel.deliver`, with
  the sender's time, delta cycle and order in the net, so they sort exactly
  as they would in one process);
* tells it when the delta cycles before a key are over in every kernel, their
  messages delivered (`Kernel.settle`): its mailboxes are then pruned as one
  process prunes them at the end of each cycle, so they stay bounded (and hold
  what one process holds) even while it has no work of its own;
* collects what its nodes send to Inputs outside it (`Kernel.take_sends`);
* asks when its next work is due (`Kernel.next_due`) and lets it run one delta
  cycle, or up to a key, at a time (`Kernel.step`): nothing later starts until
  the driver grants it;
* takes and loads its part of the state at a cut (`Kernel.state_dict`,
  `Kernel.load_state_dict`);
* records a trace of its hooks, sends and reads when asked to
  (``Kernel(trace=capacity)``, `Kernel.trace_part`): a placed run's host
  writes the parts of every process into one file (distributed/tracing.py).

Run with the same inputs, a net split over several kernels, each stepped
through the same global sequence of delta cycles, sends every message and
reaches every state bit for bit as the whole net does in one `mujou.run`
(tests/test_kernel.py checks it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from .._checks import check_workers, is_int
from ..errors import AlgebraicLoopError, NetError, NodeError, StartTimeoutError, describe
from ..net import collect_ports, settle_seeds, walk
from ..node import Node, check_seed
from ..params import RunParams, join, keep_values
from ..ports import Input, Output, Port
from ..timers import RealtimeTimer, SimulatedTimer
from ..trace import Recorder
from .actor import Actor, guard_deadlines, guard_read_only
from .build import Seams, make_actors, setup_cuda, unwire, wire
from .cuts import restore_tree, take_tree
from .dispatcher import Dispatcher
from .keys import CONTROL_KEY, CONTROL_T, HOST_ORDER, MASK, Key, stamp, unstamp
from .loops import DEFAULT_MAX_DELTA_CYCLES, find_loops
from .mailbox import STAMP, Restore, Start, Stop
from .sends import stamped_message

__all__ = ["Kernel", "OutsideSend"]

# The latest delta cycle of an instant: step(until=(t, LAST_DELTA)) runs all of t.
LAST_DELTA = MASK


class OutsideSend(NamedTuple):
    """A message sent by a node of the kernel to an Input outside it.

    Attributes:
        t_ns (int): the time of the sending hook, ns of the run's timer.
        delta (int): its delta cycle.
        sender (int): the sending node's order in the net (its place in
            `mujou_actors.net.walk`): what orders messages of one instant.
        output (str): the dotted path of the Output.
        message: the message (the kernel's own copy; deliver it as it is).
    """

    t_ns: int
    delta: int
    sender: int
    output: str
    message: Any


class _Outbox:
    """What a local Output sends to Inputs outside the kernel, in send order.

    ``sent`` (a real-time kernel's) is called after each send with the send's
    stamp: the driver ships sends as they come rather than between steps.
    """

    __slots__ = ("path", "sends", "sent")

    def __init__(self, path: str, sends: list[tuple[int, str, Any]],
                 sent: Callable[[int], None] | None) -> None:
        self.path = path
        self.sends = sends
        self.sent = sent

    def __call__(self, stamped: int, message: Any) -> None:
        self.sends.append((stamped, self.path, message))  # list.append: atomic
        if self.sent is not None:
            self.sent(stamped)


def _notify_only(notify: Callable[[], None]) -> Callable[[int], None]:
    """A ``sent`` that calls ``notify`` (which takes no stamp)."""
    def sent(stamped: int) -> None:
        notify()
    return sent


class _Events:
    """The kernel's `KernelListener`: it records failures; holds and ends need no event."""

    def __init__(self, notify: Callable[[], None] | None = None) -> None:
        self.failures: list[NodeError] = []
        self.lock = threading.Lock()
        self.hold_reached = threading.Event()  # a real-time kernel's hold (Kernel.hold)
        self.notify = notify

    def hook_failed(self, actor: Actor, hook: str, exc: BaseException) -> None:
        err = NodeError.from_hook(actor.path, hook, exc)
        with self.lock:
            self.failures.append(err)
        if self.notify is not None:
            self.notify()  # a real-time driver reports it at once

    def reached_end(self) -> None:
        pass

    def held(self) -> None:
        self.hold_reached.set()

    def take_failures(self) -> list[NodeError]:
        """The failures recorded since the last call, oldest first."""
        with self.lock:
            failures, self.failures = self.failures, []
        return failures

    def crashed(self, exc: BaseException) -> None:
        if isinstance(exc, AlgebraicLoopError):  # the dispatcher stopped an endless instant
            err: NodeError = exc
        else:
            err = NodeError("", "kernel", f"a thread of the kernel died: {describe(exc)}")
            err.__cause__ = exc
        with self.lock:
            self.failures.append(err)
        if self.notify is not None:
            # Reported at once, as a hook's failure: a real-time driver is not woken by
            # the sends that led here when they went to their readers directly.
            self.notify()


def _is_key(value: object) -> bool:
    """Whether ``value`` is a key ``(t_ns, delta)``: a tuple of two ints (no bools)."""
    return (isinstance(value, tuple) and len(value) == 2
            and is_int(value[0]) and is_int(value[1]))


def _in(path: str, roots: Iterable[str]) -> bool:
    """Whether the node at ``path`` lies in the subtree of one of ``roots``."""
    return any(r == "" or path == r or path.startswith(r + ".") for r in roots)


class Kernel:
    """Runs some nodes of a net in simulated time, one delta cycle at a time, for a driver.

    Args:
        net (Node | list[Node] | dict[str, Node]): the whole net, as `mujou.run`
            takes it: every process builds the same net, and paths, port
            names and the nodes' order come from all of it.
        nodes (Iterable[str], optional): paths of the nodes this kernel runs,
            each with its subtree (``""``: the root, so all). Default: all.
        subtrees (bool): False: exactly the nodes that ``nodes`` names, without
            their children (a placed group's nodes, whose subtrees may hold
            nodes of other groups). Default: True.
        workers (int): worker threads, >= 1. Results do not depend on it.
        seed (int, optional): the run's seed, as ``mujou.run(seed=)``.
        seeds (Mapping[str, int], optional): the seeds the run settled, by
            node path (a placed run's host settles them once, a restored
            tree's included, so that every process seeds as `Run.seeds`
            says); they win over ``seed`` for the nodes they name.
        seams (Seams, optional): the constructor seams (a fake CUDA runtime in tests).
        timer (str): ``"simulated"`` (stepped by the driver: `step`) or
            ``"realtime"`` (on this process's monotonic clock: after `start`,
            `run_free` lets it run on its own; `hold` / `release` pause it at
            a cut).
        notify (Callable[[], None], optional): called, on the sending
            thread, after each send to an Input outside the kernel (a
            real-time driver wakes up to ship it) and after each failure of
            a hook. Must not block.
        sent (Callable[[int], None], optional): called instead of ``notify``
            after each send to an Input outside the kernel, on the sending
            thread, with the send's stamp (`keys.stamp` of its hook's key and
            the sender's order: the same for every send of one hook). It may
            ship the send from that thread (`take_sends`); it may wait only
            for the reader to take what was sent (the back-pressure of a
            link), never for another thread of this kernel.
        trace (int, optional): record the kernel's hooks, sends and reads
            as `mujou.run(trace=)` does, into a buffer that keeps the newest
            ``trace`` records (`trace_part` takes them); sends to Inputs
            outside the kernel and deliveries from outside are recorded too,
            so that the arrows across processes can be drawn. Default None:
            nothing recorded, at no cost.
        max_delta_cycles (int): simulated time: an instant past this many
            delta cycles stops the kernel's timed work, and `take_failures`
            holds an `AlgebraicLoopError` (as ``mujou.run(max_delta_cycles=)``).
            Default: 10000.
        check_read_only (bool): fail a node of the kernel that changes a
            message it received in place, as ``mujou.run(check_read_only=True)``
            (`actor.guard_read_only`). Default: False (nothing installed).

    Raises:
        NetError / TypeError: an invalid net (as `mujou.run`), or a node of it
            already part of a running net or kernel; TypeError:
            ``nodes`` is a string (a list of paths is meant), or ``seed``,
            ``trace`` or ``workers`` is not an int (a bool neither).
        ValueError: a path of ``nodes`` names no node of the net; ``workers``
            or ``seed`` out of range, or ``trace`` < 1; a node of the kernel
            is in a running net already, or a node of the net is in another
            running net.

    A refused kernel leaves the nodes as they were (unclaimed, unwired, with
    their paths).

    Only the kernel's own nodes are claimed (``Node``'s "part of a running
    net"); the others are only walked for their paths and ports.
    """

    def __init__(self, net: Node | list[Node] | dict[str, Node],
                 nodes: Iterable[str] | None = None, *, workers: int = 1,
                 seed: int | None = None, seams: Seams | None = None,
                 timer: str = "simulated", notify: Callable[[], None] | None = None,
                 sent: Callable[[int], None] | None = None, subtrees: bool = True,
                 trace: int | None = None,
                 seeds: Mapping[str, int] | None = None,
                 max_delta_cycles: int = DEFAULT_MAX_DELTA_CYCLES,
                 check_read_only: bool = False, outside_device: bool = False) -> None:
        # Every argument is checked before a node is touched, as in mujou.run.
        # A group whose data plane shares CUDA memory: its outboxes get device messages.
        self._outside_device = outside_device is True
        if not isinstance(check_read_only, bool):
            raise TypeError(f"Kernel: check_read_only must be True or False, got "
                            f"{check_read_only!r}")
        self._check_read_only = check_read_only
        if trace is not None and (not is_int(trace) or trace < 1):
            raise (TypeError if not is_int(trace) else ValueError)(
                f"Kernel: trace must be None or an int >= 1 (a capacity), got {trace!r}")
        self._trace_capacity = trace
        if not is_int(max_delta_cycles) or max_delta_cycles < 1:
            raise (TypeError if not is_int(max_delta_cycles) else ValueError)(
                f"Kernel: max_delta_cycles must be an int >= 1, got {max_delta_cycles!r}")
        self._max_delta = max_delta_cycles
        if timer not in ("simulated", "realtime"):
            raise ValueError(f"Kernel: timer must be 'simulated' or 'realtime', got {timer!r}")
        self._kind = timer
        self._notify = notify
        if sent is None and notify is not None:
            sent = _notify_only(notify)
        self._sent = sent
        if isinstance(nodes, str):
            raise TypeError(f"Kernel: nodes must be an iterable of node paths, not the "
                            f"string {nodes!r} (write [{nodes!r}])")
        check_workers(workers, "Kernel")
        check_seed(seed, "Kernel")
        self._workers = workers
        found = walk(net)
        roots = [""] if nodes is None else list(nodes)
        paths = {p for p, _ in found}
        for root in roots:
            if root not in paths and not (nodes is None and root == ""):
                raise ValueError(f"Kernel: no node {root!r} in the net "
                                 f"(nodes: {sorted(paths)})")
        named = set(roots)
        local = [(order, path, node) for order, (path, node) in enumerate(found)
                 if (_in(path, roots) if subtrees else path in named)]
        for _, path, node in local:
            if node._mujou_run is not None:
                raise NetError(f"Kernel: node {path or '<root>'!r} is already part of a "
                                 "running net")
        for path, node in found:
            # A node of a running net keeps its path: another kernel of this same
            # net named it so already; under another name it is another net's.
            if node._mujou_run is not None and node._mujou_path != path:
                raise ValueError(f"Kernel: node {path or '<root>'!r} is part of another "
                                 f"running net, as {node._mujou_path!r}")
        previous = [(node, node._mujou_path) for _, node in found]
        self._token = object()
        try:
            for path, node in found:
                node._mujou_path = path  # ports name themselves by path from here on
            self._build(found, local, seed, seams, seeds)
        except BaseException:
            # A refused kernel leaves the nodes as they were: unclaimed, unwired, named
            # as before (and its threads are not started yet).
            for node, _ in previous:
                if node._mujou_run is self._token:
                    node._mujou_run = None
            unwire(getattr(self, "ports", {}))
            for node, old in previous:
                node._mujou_path = old
            raise
        self._started = False
        self._stopped = False
        self._timing = False  # the timer has started
        self._held_untimed = False  # a hold taken before the timer started (`hold`)
        self._start_ns = 0

    def _build(self, found: list[tuple[str, Node]], local: list[tuple[int, str, Node]],
               seed: int | None, seams: Seams | None,
               settled: Mapping[str, int] | None = None) -> None:
        """Claim the kernel's nodes and build its dispatcher and wiring (`__init__`'s work)."""
        self._ports = collect_ports(found)
        self._n_nodes = len(found)
        # Seeds settled by a placed run's host: it warned of early draws, once.
        seeds = settle_seeds(found, None, seed, warn=settled is None)
        if settled is not None:
            seeds.update((p, s) for p, s in settled.items() if p in seeds)
        self.seeds = {path: seeds[path] for _, path, _ in local}
        self._sends: list[tuple[int, str, Any]] = []
        self._events = _Events(self._notify)
        local_paths = {path for _, path, _ in local}
        self.ports: dict[str, Port] = {p: port for p, port in self._ports.items()
                                       if port.node._mujou_path in local_paths}
        self.actors = make_actors(found, seeds, None, True, self.ports, only=local_paths)
        for actor in self.actors:
            actor.node._mujou_run = self._token
        self._actor_of = {id(a.node): a for a in self.actors}
        # As a traced run's coordinator does: before the sends are made, which keep it.
        self.recorder: Recorder | None = None
        if self._trace_capacity is not None:
            self.recorder = Recorder(self._trace_capacity, [p for p, _ in found], self._ports)
            for actor in self.actors:
                actor.trace = self.recorder
        clock = SimulatedTimer() if self._kind == "simulated" else RealtimeTimer()
        self.dispatcher = Dispatcher(self.actors, clock, self._workers, self._events,
                                     self.recorder)
        self.dispatcher.set_loop_limit(self._max_delta, find_loops(found))
        # CUDA nodes get their streams and waiters as in a run (cuda_sync "block").
        rt = setup_cuda(self.actors, "block", seams or Seams())
        self._wiring = wire(self.actors, self.ports, self.dispatcher, rt, self._outbox,
                            self._outside_device)
        # Nodes with parameters (their sets applied inside the budget's measure), then
        # those with a budget or deadline, first (as mujou.run).
        self.params = RunParams((a.path, a.node) for a in self.actors)
        self.params.guard(self.actors)
        for actor in self.actors:
            guard_deadlines(actor, clock, self._kind == "simulated", self.dispatcher.deadlines.add)
        if self._check_read_only:  # the update wrapped once here, as mujou.run does
            for actor in self.actors:
                guard_read_only(actor)

        self._started = False
        self._stopped = False
        self._timing = False  # the timer has started
        self._held_untimed = False  # a hold taken before the timer started (`hold`)
        self._start_ns = 0

    def _outbox(self, output: Output) -> _Outbox:
        """The outbox of a local Output with readers outside the kernel (see `build.wire`)."""
        if self.recorder is not None:
            self.recorder.add_outside(output, [r for r in output.readers
                                               if self.ports.get(r.path) is not r])
        return _Outbox(output.path, self._sends, self._sent)

    # -- the phases -----------------------------------------------------------------
    def start(self, start_ns: int = 0, timeout: float = 60.0) -> None:
        """Start the threads and run every ``on_start`` (in the net's order).

        The timer starts at ``start_ns`` (or a loaded tree's time) at the
        first `next_due` or `step`; until then, messages that other kernels'
        ``on_start`` sent may be delivered, and a state loaded.

        Raises:
            NodeError: an ``on_start`` raised.
            StartTimeoutError: the ``on_start`` hooks did not all return within ``timeout``.
            RuntimeError: the kernel was started before.
        """
        if self._started:
            raise RuntimeError("Kernel.start: the kernel is started already")
        self._started = True
        self._start_ns = start_ns
        dispatcher = self.dispatcher
        dispatcher.set_bound(CONTROL_KEY)  # driven: nothing timed starts before a step
        dispatcher.start_threads()
        late = dispatcher.run_control(self.actors, Start(), timeout)
        self._raise_failures()
        if late:
            raise StartTimeoutError({a.path: dispatcher.hook_of(a) for a in late if a.busy},
                                    [a.path for a in late if not a.busy], timeout)

    def _timer(self) -> None:
        """Start the timer (at the first `next_due` or `step`), once."""
        if not self._timing:
            self._timing = True
            self._held_untimed = False  # a hold taken before is over: the timer runs
            self.dispatcher.start_running(self._start_ns)

    def stop(self, timeout: float = 10.0, idle: float | None = None) -> list[str]:
        """Run every started node's ``on_stop``, end the threads, release the nodes.

        Idempotent. Returns the paths of nodes still stuck in a hook (left
        behind, as `mujou.run`'s stop does).

        Args:
            timeout (float): wall seconds for the ``on_stop`` hooks, then for
                the threads' exit (a stuck node's thread is not waited for).
                Default: 10.0.
            idle (float, optional): wall seconds for the hooks in flight to
                return first; a placed run's end gives them what is left of its
                one ``stop_timeout`` (docs/processes.md). Default: ``timeout``.
        """
        if self._stopped:
            return []
        self._stopped = True
        dispatcher = self.dispatcher
        stuck = []
        if self._started:
            dispatcher.stop_now()
            stuck = [a.path for a in dispatcher.wait_idle(timeout if idle is None else idle)]
            started = [a for a in self.actors if a.started and a.path not in stuck]
            stuck += [a.path for a in dispatcher.run_control(started, Stop(), timeout, help=True)]
            dispatcher.shutdown()
            # A stuck node's thread stays in its hook: waiting for it would cost the whole
            # timeout once more (as the coordinator's end, which skips them too).
            dispatcher.join_threads(timeout, skip={a.thread_name for a in self.actors
                                                   if a.path in stuck and a.thread_name})
        for actor in self.actors:
            if actor.node._mujou_run is self._token:
                actor.node._mujou_run = None
        unwire(self.ports)
        return stuck

    def __enter__(self) -> Kernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- driving --------------------------------------------------------------------
    def next_due(self) -> Key | None:
        """The key ``(t_ns, delta)`` of the kernel's earliest pending work, or None.

        Work comes from the nodes' ticks, from their own sends within the
        kernel and from `deliver`; a driver steps the kernels of a run through
        the least of their next due keys (and of the messages in transit).
        """
        if not self._started or self._stopped:
            raise RuntimeError("Kernel.next_due: the kernel is not running (start() it first)")
        self._timer()
        return self.dispatcher.next_due()

    @property
    def simulated(self) -> bool:
        """bool: the kernel runs in simulated time (stepped), else in real time."""
        return self._kind == "simulated"

    def run_free(self) -> None:
        """A real-time kernel: start the timer and let the work run on its own.

        Raises:
            RuntimeError: not started, stopped, or a simulated kernel (step it).
        """
        if self.simulated or not self._started or self._stopped:
            raise RuntimeError("Kernel.run_free: only a started real-time kernel runs freely")
        self._timer()
        self.dispatcher.set_bound(None)

    def hold(self, timeout: float) -> bool:
        """A real-time kernel: pause at a consistent cut (no hook in flight); True once held.

        The cut comes as soon as the hooks in flight return. Until `release`,
        no timed work starts; messages may still be delivered (they wait in
        the Inputs' mailboxes, and a state tree holds them as pending).

        Before the timer starts (`run_free`), the kernel is at a cut as it is:
        no timed work runs, and no hook is in flight once `start` returned.
        The hold is then True at once, and its `release` leaves the timer as
        it is (a real-time run's end after a failed start holds the groups
        whose timers never started: they used to be waited for a whole
        ``stop_timeout``).

        Returns:
            bool: False when the hooks in flight did not return within
            ``timeout`` wall seconds (the hold is taken back: the work goes on).
        """
        if not self._timing:
            self._held_untimed = True
            return True
        dispatcher = self.dispatcher
        self._events.hold_reached.clear()
        dispatcher.request_hold()
        if dispatcher.held or self._events.hold_reached.wait(timeout):
            return True
        dispatcher.withdraw_hold()
        return False

    def release(self) -> None:
        """A real-time kernel: go on after `hold`."""
        if self._held_untimed:  # held before the timer started: nothing to let go on
            self._held_untimed = False
            return
        self.dispatcher.release()

    def step(self, until: Key | None = None, timeout: float = 10.0) -> Key | None:
        """Run the pending work with keys up to ``until``, then pause; return `next_due`.

        Args:
            until (Key, optional): the latest ``(t_ns, delta)`` that may run;
                ``(t, LAST_DELTA)`` runs the whole instant ``t``. Default: the
                next due key, so one delta cycle runs.
            timeout (float): wall seconds for the step.

        Returns:
            Key | None: the next due key once the step is done.

        Raises:
            RuntimeError: the kernel is not started, or is stopped.
            TypeError: ``until`` is not a pair of ints.
            TimeoutError: the step did not finish within ``timeout`` (names the
                hooks still running).
            NodeError: a hook raised during the step (the first failure; the
                others of the step stay for `take_failures`; a failed node runs
                no more, as with no supervisor).
        """
        if not self._started or self._stopped:
            raise RuntimeError("Kernel.step: the kernel is not running (start() it first)")
        if not self.simulated:
            raise RuntimeError("Kernel.step: a real-time kernel runs freely (run_free)")
        if until is not None and not _is_key(until):
            # Checked here: a worker comparing keys with it would die of it.
            raise TypeError(f"Kernel.step: until must be a key (t_ns, delta) of two ints, "
                            f"got {until!r}")
        dispatcher = self.dispatcher
        self._timer()
        if until is None:
            until = dispatcher.next_due()
            if until is None:
                return None
        if not dispatcher.run_until(until, timeout):
            busy = dispatcher.busy_hooks()
            raise TimeoutError(f"Kernel.step: work up to {until} did not finish within "
                               f"{timeout:g} s; still running: {busy}")
        self._raise_failures()
        return dispatcher.next_due()

    def deliver(self, input: str, message: Any, t_ns: int, delta: int, sender: int,
                owned: bool = False) -> None:
        """Deliver a message sent outside the kernel to one of its Inputs.

        It is stamped as the sender's send was, so it sorts among the Input's
        messages exactly as in one process, and it triggers a triggering Input
        at ``(t_ns, delta + 1)``.

        Args:
            input (str): the dotted path of an Input of a node of this kernel.
            message: the message (checked against the Input's type, then copied
                unless ``owned``).
            t_ns (int): the sending hook's time, ns; delta (int): its delta cycle;
            sender (int): the sender's order in the net (`OutsideSend.sender`).
            owned (bool): as `write`'s (a message decoded from another process
            is not copied in a net without CUDA nodes). Default False.

        Raises:
            RuntimeError: the kernel is stopped.
            TypeError: ``t_ns``, ``delta`` or ``sender`` is not an int (a bool is not).
            ValueError: no such Input in this kernel; ``t_ns`` below -1 (the time
                of ``on_start``'s sends), ``delta`` outside ``[0, LAST_DELTA)``,
                ``sender`` outside ``[-1, nodes in the net)`` (-1: the host); or
                the message comes too late: the kernel has already run past
                ``(t_ns, delta)``.
            PortTypeError: the Input refuses the value.
        """
        if self._stopped:
            raise RuntimeError("Kernel.deliver: the kernel is stopped")
        for name, value in (("t_ns", t_ns), ("delta", delta), ("sender", sender)):
            if not is_int(value):
                raise TypeError(f"Kernel.deliver: {name} must be an int, got {value!r}")
        # A stamp packs the three into one int: out of range, they would run into
        # each other's bits and misorder the message (or move the kernel's time).
        if t_ns < CONTROL_T:
            raise ValueError(f"Kernel.deliver: t_ns must be >= {CONTROL_T}, got {t_ns}")
        if not 0 <= delta < LAST_DELTA:
            raise ValueError(f"Kernel.deliver: delta must be in [0, {LAST_DELTA}), got {delta}")
        if not HOST_ORDER <= sender < self._n_nodes:
            raise ValueError(f"Kernel.deliver: sender must be in [{HOST_ORDER}, "
                             f"{self._n_nodes}) (a node's order in the net), got {sender}")
        port = self._input(input, "deliver")
        actor = self._actor_of[id(port.node)]
        slot = actor.slot(port)
        key = (t_ns, delta)
        trigger = (t_ns, delta + 1) if slot in actor.triggers else None
        value = self._wiring.write_copy(port.check(message), port, owned)
        if port._stamped:  # an Input of a synchronizer: with its send time, as in one process
            value = stamped_message(t_ns, value)
        seq = self.dispatcher.deliver(actor, slot, value, stamp(key, sender), trigger,
                                      not_before=key)
        if not seq:
            raise ValueError(f"Kernel.deliver: a message for {input!r} sent at {key} comes "
                             f"too late: the kernel has run past it "
                             f"(frontier {self.dispatcher.frontier})")
        if self.recorder is not None and sender != HOST_ORDER:  # the end of its arrow
            self.recorder.arrival(sender, seq, port, sender, t_ns, delta)

    def settle(self, until: Key | None) -> None:
        """Say that every delta cycle before ``until`` is over, in every kernel of the net.

        Between steps only (the driver's thread), once every message sent in
        those cycles has been delivered (`deliver`). A mailbox that holds
        more than its bound is pruned as one process prunes it at the end of
        each of those cycles (`Dispatcher.settle`): what is dropped, and what
        a state dict holds, are the same. Without it, a kernel prunes at its
        own steps (the cycles before the next it runs) and its holds
        (`state_dict`); a kernel with no work of its own would hold every
        message it is given until then.

        Args:
            until (Key | None): ``(t_ns, delta)``: the least key of a cycle not
                over everywhere (the least next key of every kernel); None:
                every cycle so far.

        Raises:
            RuntimeError: the kernel is stopped.
            TypeError: ``until`` is not None nor a key of two ints.
        """
        if self._stopped:
            raise RuntimeError("Kernel.settle: the kernel is stopped")
        if until is not None and not _is_key(until):
            raise TypeError(f"Kernel.settle: until must be a key (t_ns, delta) of two ints, "
                            f"or None; got {until!r}")
        self.dispatcher.settle(until)

    def set_reader(self, reader: Callable[[float | None], None] | None,
                   wake: Callable[[], None] | None = None) -> None:
        """Real time, a placed group's kernel: let an idle worker wait on the group's links
        to other processes and read them (`Dispatcher.set_reader`, the Leader/Followers
        pattern): a message then reaches its hook with no thread woken in between.

        Args:
            reader (Callable[[float | None], None] | None): waits at most the
                seconds given (None: until woken) on the links and ``wake``,
                writes what came (`write`) and returns; never raises. None:
                idle workers wait for the kernel's own work only.
            wake (Callable[[], None] | None): makes a waiting ``reader`` return
                (any thread; must not block).

        Raises:
            ValueError: a reader without a wake.
        """
        self.dispatcher.set_reader(reader, wake)

    def write(self, input: str, message: Any,
              origin: tuple[int, int, int] | None = None, owned: bool = False) -> None:
        """Deliver a message to one of the kernel's Inputs as the host (``run.write``).

        Between steps only (the driver's thread): the message is stamped as
        the host's writes are in one process and triggers a triggering
        Input as such a write does; call `next_due` afterwards.

        Args:
            input (str): the Input's dotted path.
            message: the message (checked against the Input's type, then copied
                unless ``owned``).
            origin (tuple[int, int, int], optional): ``(t_ns, delta, sender)``
                of the send in another kernel that this write delivers (a
                real-time placed run's messages between groups): a traced
                kernel records it as the end of that send's arrow.
            owned (bool): the message is the kernel's to keep (decoded from
                another process: nothing else holds it): in a net without CUDA
                nodes it is not copied. Default False.

        Raises:
            RuntimeError: the kernel is stopped.
            ValueError: no such Input in this kernel.
            PortTypeError: the Input refuses the value.
        """
        if self._stopped:
            raise RuntimeError("Kernel.write: the kernel is stopped")
        port = self._input(input, "write")
        # Real time: a message from another group's update at delta d triggers at
        # delta d + 1, so a ring across processes counts its crossings (Dispatcher.host_deliver).
        hops = origin[1] + 1 if origin is not None and self._kind == "realtime" else 0
        seq = self._wiring.deliver(port, self._wiring.write_copy(port.check(message), port, owned),
                                   hops, None if origin is None else origin[0])
        if origin is not None and self.recorder is not None:
            t_ns, delta, sender = origin
            self.recorder.arrival(HOST_ORDER, seq, port, sender, t_ns, delta)

    def set_param(self, node: str, name: str, value: Any, key: Key | None = None) -> Key:
        """Queue a parameter set on one of the kernel's nodes (``run.set_param``).

        Args:
            node (str): the node's path.
            name (str): the parameter's name.
            value: the value (checked again here).
            key (Key | None): the key it applies from, chosen by the driver
                (a simulated placed run's next delta cycle, which no group has
                entered: the group is between grants); None: this kernel's
                next delta cycle, or now in real time (`Dispatcher.param_set`).

        Returns:
            Key: the key it applies from.

        Raises:
            RuntimeError: the kernel is stopped.
            ParamError: no such parameter in this kernel, or a refused value.
        """
        if self._stopped:
            raise RuntimeError("Kernel.set_param: the kernel is stopped")
        node_path, name, checked = self.params.check(join(node, name), value)
        sets = self.params.sets[node_path]
        if key is None:
            return self.dispatcher.param_set(sets, name, checked)
        if not _is_key(key):
            raise TypeError(f"Kernel.set_param: key must be (t_ns, delta) or None, got {key!r}")
        sets.add(key[0], key[1], name, checked)
        return (key[0], key[1])

    def read(self, port: str) -> Any:
        """The newest message of one of the kernel's ports, as a copy (``run.read``).

        Raises:
            ValueError: no such port in this kernel.
        """
        p = self.ports.get(port)
        if p is None:
            raise ValueError(f"Kernel.read: no port {port!r} in this kernel "
                             f"(ports: {sorted(self.ports)})")
        wiring = self._wiring
        if isinstance(p, Output):
            return wiring.host_copy(wiring.view(p).last)
        assert isinstance(p, Input)
        message = p.read()
        wiring.wait_kept(p)
        return wiring.host_copy(message)

    def listen(self, port: str, listener: Callable[[Any], None]) -> Callable[[], None]:
        """Attach ``listener(message)`` to every later message sent on an Output of the kernel.

        (An Input's messages come from its sources' Outputs, which may be in
        other kernels: a driver listens to those.) The listener runs on the
        sending worker, with the message as sent: it must copy what it keeps.

        Returns:
            Callable[[], None]: detaches it again.

        Raises:
            ValueError: no such Output in this kernel.
        """
        p = self.ports.get(port)
        if not isinstance(p, Output):
            outputs = sorted(q for q, o in self.ports.items() if isinstance(o, Output))
            raise ValueError(f"Kernel.listen: no output {port!r} in this kernel "
                             f"(outputs: {outputs})")
        return self._wiring.listen(p, listener)

    def sender_of(self, port: str) -> Actor:
        """The actor of the node that owns the Output ``port`` (whose ``stamp`` a send carries).

        A listener reads the sending hook's key there: ``actor.stamp``, on the
        sending thread, while the send is in flight.

        Raises:
            KeyError: no such port in this kernel.
        """
        return self._wiring.actor_of[id(self.ports[port].node)]

    def restart_node(self, path: str, state: Any, timeout: float = 60.0) -> None:
        """Restart one node (a ``one_for_one`` restart): ``on_stop``, ``on_start``, ``state``.

        As the run's coordinator does after a failure: the envelopes run at
        once, before any timed work, stamped at the delta cycle the kernel
        entered last (what ``on_start`` sends goes out as sent there); the
        node's schedule goes on. A simulated kernel returns once they have
        run, so that `next_due` and `take_sends` afterwards see the restarted
        node (a failure of its hooks is raised by the next `step`).

        Args:
            path (str): the node's path.
            state: its state (a node's entry of a state tree).
            timeout (float): wall seconds for the envelopes (simulated time).

        Raises:
            ValueError: no such node in this kernel.
            TimeoutError: the envelopes did not run within ``timeout``.
        """
        actor = next((a for a in self.actors if a.path == path), None)
        if actor is None:
            raise ValueError(f"Kernel.restart_node: no node {path!r} in this kernel")
        actor.restarts += 1
        state = keep_values(state, actor.node)  # a set made after the snapshot stays set
        self.dispatcher.post_control(actor, [Stop(), Start(), Restore(state, {}, None)])
        if not self.simulated:
            return
        # A worker takes them at once (control comes before any bound). The actor is
        # busy from before it takes an envelope until after it finished the last.
        deadline = time.monotonic() + timeout
        while actor.control or actor.busy:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Kernel.restart_node: node {path!r} did not restart "
                                   f"within {timeout:g} s (in {self.dispatcher.hook_of(actor)})")
            time.sleep(0.0005)

    def _input(self, input: str, what: str) -> Input:
        port = self.ports.get(input)
        if not isinstance(port, Input):
            inputs = sorted(p for p, q in self.ports.items() if isinstance(q, Input))
            raise ValueError(f"Kernel.{what}: no input {input!r} in this kernel "
                             f"(inputs: {inputs})")
        return port

    def take_sends(self) -> list[OutsideSend]:
        """The messages its nodes sent to Inputs outside it since the last call, in order.

        Ordered by ``(t_ns, delta, sender)``, and one sender's messages of one
        hook in send order: the order in which they are to be delivered. They
        wait here until taken (no QoS depth applies before the reader's own
        kernel gets them), so a driver takes them after every `step`: what
        waits is then at most one delta cycle's sends.
        """
        taken = self._sends[:len(self._sends)]
        del self._sends[:len(taken)]
        taken.sort(key=STAMP)  # stable
        out = []
        for stamped, path, message in taken:
            t, d, order = unstamp(stamped)
            out.append(OutsideSend(t, d, order, path, message))
        return out

    @property
    def frontier(self) -> Key:
        """Key: the delta cycle the kernel entered last (`CONTROL_KEY` before the timer)."""
        return self.dispatcher.frontier

    @property
    def timing(self) -> bool:
        """bool: whether the timer has started (the first `next_due` or `step`)."""
        return self._timing

    @property
    def time_ns(self) -> int:
        """int: the kernel's time, ns of the run's (simulated) timer."""
        return self.dispatcher.timer.now_ns()

    # -- state at a cut ---------------------------------------------------------------
    def state_dict(self, timeout: float | None = None) -> dict[str, Any]:
        """The state tree of the kernel's nodes, taken while it is paused (between steps).

        The layout of `mujou.Run.state_dict` (docs/state.md), for this kernel's
        nodes and Inputs only; ``time_ns`` is the kernel's time.

        Take it at an instant's boundary, as a run takes its cuts, once the
        messages the other kernels sent up to it are delivered (the mailboxes
        are settled first: `settle`, as one process prunes them): when no
        delivery that has come waits to trigger its reader at a key other
        than ``(time_ns, 1)`` (so after ``step(until=(t, LAST_DELTA))``, or
        after any step that leaves no triggered update due). A tree holds
        undelivered messages without their stamps, and a loaded one triggers
        their readers at ``(time_ns, 1)``: a tree taken between two delta
        cycles would not go on as the kernel did.

        Raises:
            RuntimeError: a triggered update is due at another key than
                ``(time_ns, 1)`` (the kernel is within an instant).
            NodeError: a node's ``state_dict`` raised.
            TimeoutError: an actor stayed busy for ``timeout``.
        """
        if self._timing and not self._stopped and self.simulated:
            now = self.time_ns
            late = [k for k in self.dispatcher.trigger_keys() if k != (now, 1)]
            if late:
                raise RuntimeError(
                    f"Kernel.state_dict: a triggered update is due at {late[0]}, within an "
                    f"instant (the kernel's time is {now}): take the state at an instant's "
                    f"boundary, after step(until=(t, LAST_DELTA))")
            self.dispatcher.settle(None)  # a cut: every cycle so far is over everywhere
        return take_tree(self.dispatcher, self.actors, self.ports, time_ns=self.time_ns,
                         seeds=self.seeds, host_copy=self._wiring.host_copy,
                         wait_kept=self._wiring.wait_kept, timeout=timeout,
                         ended=self._stopped)

    def load_state_dict(self, tree: Mapping[str, Any], timeout: float = 60.0) -> None:
        """Load a tree taken by `state_dict` (of a kernel with the same nodes).

        Call it after `start` and before the timer starts (the first
        `next_due` or `step`): the nodes' states, kept and undelivered messages
        and the time are restored (what ``on_start`` sent is dropped, within
        the kernel and to Inputs outside it, which `take_sends` no longer
        returns: the trees hold the messages of their cut), and the schedules go on from the
        tree's ``time_ns``.

        Raises:
            RuntimeError: not started, or the timer has started.
            StartTimeoutError: a ``load_state_dict`` did not return in time.
            NodeError: a ``load_state_dict`` raised.
        """
        dispatcher = self.dispatcher
        if not self._started or self._timing or self._stopped:
            raise RuntimeError("Kernel.load_state_dict: call it after start() and before "
                               "the first next_due() or step()")
        dispatcher.discard_messages()
        del self._sends[:]  # on_start's sends to other kernels' Inputs: the trees hold theirs
        restore_tree(dispatcher, self.actors, self.ports, tree, time.monotonic() + timeout, timeout,
                     self._wiring.deliver)
        self._raise_failures()
        self._start_ns = tree["time_ns"]
        self._wiring.start_at(self._start_ns)

    def trace_part(self) -> dict[str, Any] | None:
        """What the kernel's trace kept, as plain data (`trace.Recorder.export`); None untraced.

        Take it after `stop` for the ``on_stop`` hooks too; before, it holds
        what was recorded so far.
        """
        if self.recorder is None:
            return None
        return self.recorder.export(self.dispatcher.thread_names())

    def take_failures(self) -> list[NodeError]:
        """The hooks' failures since the last call, oldest first (a real-time driver's)."""
        return self._events.take_failures()

    def _raise_failures(self) -> None:
        """Raise the oldest failure recorded; the others stay for `take_failures` (two
        hooks may fail in one delta cycle: each is the supervisor's to handle)."""
        events = self._events
        with events.lock:
            if not events.failures:
                return
            first = events.failures.pop(0)
        raise first
