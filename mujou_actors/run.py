"""``mujou.run`` and ``Run``: check the arguments, build the kernel, start it; the host's API.

`run` validates every argument (net.py's checks, before any node is
claimed), builds the kernel (`_runtime.build`: the actors, CUDA, the wiring;
the `Coordinator` and its dispatcher) and starts it. `Run` is the host's API
only: the host talks to a running net through envelopes (writes), views of
Outputs (read, subscribe, wait_for) and the coordinator (state_dict, stop),
whose thread (``mujou-run``) ends the run whatever ends it.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ._checks import check_workers, is_int, is_number
from ._runtime.actor import guard_deadlines, guard_read_only
from ._runtime.build import Seams, make_actors, setup_cuda, unwire, watch_listener
from ._runtime.coordinator import ON_COORDINATOR, Coordinator, EndReason
from ._runtime.cuts import why_no_cut
from ._runtime.loops import DEFAULT_MAX_DELTA_CYCLES, warn_loops
from ._runtime.replay import Feed
from ._runtime.requests import StateRequest
from ._runtime.workers import default_workers
from .cuda import check_cuda_sync
from .distributed.placement import Placement, as_placement
from .errors import NetError, NotRunningError, ParamError
from .host import HOST_QUEUE_DEPTH, Host, Run, Subscription, Waiter, Watch, check_depth, check_watch
from .net import (
    check_fit,
    check_flag,
    check_seconds,
    collect_ports,
    load_state,
    resolve_inputs,
    settle_seeds,
    synchronizers,
    walk,
    warn_suspect_net,
    warn_unknown_hooks,
)
from .node import Node, check_seed
from .params import RunParams, set_values
from .ports import Input, Output, Port
from .recording.capsule import Capsule, CapsuleKeeper, as_capsule
from .recording.mcapfile import ChannelSpec
from .recording.recorder import (
    Recorder,
    Recording,
    as_recording,
    run_metadata,
    select_outputs,
)
from .recording.replay import RecordedParams, Replay, as_replay, check_timer, warn_no_duration
from .recording.replay import plan as plan_replay
from .stats import NodeStats, RunStats, WorkerStats, percentile
from .supervisor import Supervisor
from .timers import Timer
from .trace import Tracer, as_tracer, check_writable

__all__ = ["run", "Run"]


# ---------------------------------------------------------------------------
# Run


class LocalRun(Run):
    """`Run` for a run of the whole net in this process (a `Coordinator` and its kernel).

    Made by `run`; its methods keep the contract that `Run` documents.
    """

    def __init__(self, coordinator: Coordinator, host: Host, ports: dict[str, Port],
                 seeds: dict[str, int], params: RunParams) -> None:
        self._coordinator = coordinator
        self._params = params  # the nodes' parameters: resolve, check, queue (params.py)
        self._dispatcher = coordinator.dispatcher
        self._wiring = coordinator.wiring
        self._host = host  # subscriptions, waiters and the mujou-host thread (host.py)
        self._actors = coordinator.actors
        self._actor_of = self._wiring.actor_of
        self._ports = ports
        self._port_ids = {id(p) for p in ports.values()}
        self._seeds = seeds
        self._recorder = coordinator.recorder  # kept: the coordinator lets it go at the end
        self._capsule = coordinator.capsule  # so is the crash capsule
        # After the end each state_dict() takes the state on its own thread,
        # inside each node's context: one call at a time, as during the run
        # (a Context is entered by one thread at a time, and a node's
        # state_dict never runs alongside itself).
        self._final_lock = threading.Lock()

    # -- properties -----------------------------------------------------------------
    @property
    def seeds(self) -> Mapping[str, int]:
        """`Run.seeds`."""
        return dict(self._seeds)

    @property
    def time_ns(self) -> int:
        """`Run.time_ns`."""
        return self._coordinator.time_ns

    @property
    def nodes(self) -> Mapping[str, Node]:
        """`Run.nodes`."""
        return {a.path: a.node for a in self._actors}

    @property
    def ports(self) -> Mapping[str, Port]:
        """`Run.ports`."""
        return dict(self._ports)

    @property
    def groups(self) -> Mapping[str, list[str]]:
        """`Run.groups`: one group, ``"host"``, of every node."""
        return {"host": [a.path for a in self._actors]}

    @property
    def start_time(self) -> float:
        """`Run.start_time`."""
        return self._coordinator.start_ns / 1e9

    def wait(self, timeout: float | None = None) -> bool:
        """`Run.wait`: the coordinator's end."""
        self._check_caller("wait()")
        return self._coordinator.wait_ended(timeout)

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
        if self._coordinator.on_thread():
            raise RuntimeError(ON_COORDINATOR.format(call=call))

    @property
    def failure(self) -> BaseException | None:
        """`Run.failure`."""
        return self._coordinator.failure

    @property
    def running(self) -> bool:
        """`Run.running`."""
        return not self._coordinator.ended

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

    def read(self, port: Port | str) -> Any:
        """`Run.read`: the Output's host view, or the Input's newest kept message."""
        p = self._port(port)
        wiring = self._wiring
        if isinstance(p, Output):
            return wiring.host_copy(wiring.view(p).last)
        message = p.read()  # type: ignore[attr-defined]
        wiring.wait_kept(p)  # type: ignore[arg-type]
        return wiring.host_copy(message)

    def write(self, port: Input | str, value: Any) -> None:
        """`Run.write`: checked and copied here, delivered as the host's write."""
        p = self._port(port, Input)
        message = self._wiring.write_copy(p.check(value), p)  # type: ignore[arg-type]
        if self._coordinator.ending:
            raise NotRunningError(f"write to {p.path!r}: the run has ended")
        self._wiring.deliver(p, message)  # type: ignore[arg-type]

    def set_param(self, path: str, value: Any) -> tuple[int, int]:
        """`Run.set_param`: checked here, queued on the node at the next delta cycle, recorded."""
        node_path, name, checked = self._params.check(path, value)
        if node_path not in self._params.sets:
            raise ParamError(f"parameter {path!r}", f"node {node_path or '<root>'!r} is "
                             "replaced by the replay: its code does not run")
        if self._coordinator.ending:
            raise NotRunningError(f"set_param {path!r}: the run has ended")
        key = self._dispatcher.param_set(self._params.sets[node_path], name, checked)
        for keeper in (self._recorder, self._capsule):
            if keeper is not None:
                keeper.param(key, node_path, name, checked)
        return key

    def params(self) -> dict[str, Any]:
        """`Run.params`: every parameter's applied value, read from the nodes."""
        return self._params.values()

    def describe_params(self) -> dict[str, dict[str, Any]]:
        """`Run.describe_params`: each parameter's declaration and applied value."""
        return self._params.describe()

    def subscribe(self, port: Port | str, callback: Callable[..., None], *,
                  depth: int = HOST_QUEUE_DEPTH, with_time: bool = False) -> Subscription:
        """`Run.subscribe`: a listener on the port's wiring feeding the host thread."""
        p = self._port(port)
        if not callable(callback):
            raise TypeError(f"subscribe({p.path!r}): callback must be callable")
        depth = check_depth(f"subscribe({p.path!r})", depth)
        if type(with_time) is not bool:
            raise TypeError(f"subscribe({p.path!r}): with_time must be a bool, got {with_time!r}")
        if not with_time:
            sub = self._host.subscribe(p.path, callback, depth)
            sub.detach = self._wiring.listen(p, sub.put)
            return sub

        def timed(item: tuple[int, Any]) -> None:
            callback(*item)

        sub = self._host.subscribe(p.path, timed, depth)
        sub.detach = self._wiring.listen(p, sub.put, now=lambda: self.time_ns)
        return sub

    def watch(self, port: Port | str, *, depth: int = HOST_QUEUE_DEPTH,
              with_time: bool = False, messages: bool = True) -> Watch:
        """`Run.watch`: a listener on the port's wiring appending to the `Watch`'s queue."""
        p = self._port(port)
        what = f"watch({p.path!r})"
        depth = check_depth(what, depth)
        check_watch(what, with_time, messages)
        wiring = self._wiring
        watch = Watch(self._host, p.path, depth, with_time, messages, wiring.host_copy,
                      None if wiring.rt is None else wiring.host_view)
        self._host.add_watch(watch)  # refused once the run has ended
        put, count = watch._put, watch._count

        def now() -> int:
            return self.time_ns

        watch.detach = wiring.listen_each(
            p, lambda sender: watch_listener(put, count, sender, now, with_time, messages))
        return watch

    def wait_for(self, port: Port | str, predicate: Callable[[Any], bool] | None = None,
                 timeout: float | None = None, *, depth: int = HOST_QUEUE_DEPTH) -> Any:
        """`Run.wait_for`: a listener on the port's wiring feeding a `Waiter`."""
        p = self._port(port)
        self._check_caller("wait_for()")
        what = f"wait_for({p.path!r})"
        waiter = Waiter(p.path, what, check_depth(what, depth))
        deadline = None if timeout is None else time.monotonic() + timeout
        detach = self._wiring.listen(p, waiter.put)
        try:
            self._host.add_waiter(waiter)  # refused once the run has ended
            while True:
                # Checked before each message too: a port that keeps sending
                # must not keep a failing predicate from timing out.
                ok, message = waiter.get(deadline)
                if not ok or (deadline is not None and time.monotonic() > deadline):
                    raise TimeoutError(f"{what}: no match within {timeout} s"
                                       + waiter.drops_note())
                message = self._wiring.host_copy(message)
                if predicate is None or predicate(message):
                    return message
        finally:
            detach()
            self._host.remove_waiter(waiter)

    def state_dict(self, timeout: float | None = None) -> dict[str, Any]:
        """`Run.state_dict`: a state request to the coordinator, or the final tree."""
        if self._dispatcher.is_own_thread():
            raise RuntimeError("state_dict() from inside a hook would wait for itself")
        if self._coordinator.on_thread():
            raise RuntimeError(ON_COORDINATOR.format(call="state_dict()"))
        if self._host.on_thread() and self._coordinator.ending:
            raise RuntimeError(
                "state_dict() from a subscriber callback while the run ends would wait for "
                "the end, and the end waits for the callbacks: take it after run.join()")
        if timeout is not None:
            if not is_number(timeout):
                raise TypeError(f"state_dict(): timeout must be a number of seconds or None, "
                                f"got {timeout!r}")
            if not math.isfinite(timeout) or timeout < 0:
                raise ValueError(f"state_dict(): timeout must be a finite number >= 0, "
                                 f"got {timeout!r}")
        req = StateRequest(timeout)
        if self._coordinator.post_state_request(req):
            # Given up: the coordinator is behind (a restart, a snapshot).
            if not req.done.wait(timeout) and self._coordinator.cancel_state_request(req):
                raise TimeoutError(f"state_dict(): no consistent cut within {timeout:g} s; "
                                   + why_no_cut(self._dispatcher.busy_hooks()))
            if req.error is not None:
                raise req.error
            if req.tree is not None:
                return req.tree
        return self._final_state(req)

    def _final_state(self, req: StateRequest) -> dict[str, Any]:
        """The state at the end, once the run has ended (see `state_dict`)."""
        if self._host.on_thread() and not self._coordinator.ended:
            raise RuntimeError(
                "state_dict() from a subscriber callback while the run ends would wait for "
                "the end, and the end waits for the callbacks: take it after run.join()")
        left = None if req.deadline is None else max(0.0, req.deadline - time.monotonic())
        if not self._coordinator.wait_ended(left):
            raise TimeoutError(f"state_dict(): the run is ending and did not end within "
                               f"{req.timeout:g} s")
        left = None if req.deadline is None else max(0.0, req.deadline - time.monotonic())
        if not self._final_lock.acquire(timeout=-1 if left is None else left):
            raise TimeoutError(f"state_dict(): another state_dict() call, taking the final "
                               f"state, did not return within {req.timeout:g} s")
        try:
            return self._coordinator.take_tree()  # a node left stuck in a hook: NodeError
        finally:
            self._final_lock.release()

    def stop(self) -> None:
        """`Run.stop`: the coordinator ends the run (waits for it from the host)."""
        self._coordinator.end(EndReason.STOPPED)
        if (self._dispatcher.is_own_thread() or self._host.on_thread()
                or self._coordinator.on_thread()):
            return
        self._coordinator.wait_ended(None)

    def join(self, timeout: float | None = None) -> None:
        """`Run.join`: waits for the coordinator's end, raises its outcome."""
        self._check_caller("join()")
        if not self._coordinator.wait_ended(timeout):
            raise TimeoutError(f"the run has not ended within {timeout} s")
        self._coordinator.raise_outcome()

    def _raise_unreported(self) -> None:
        if not self._coordinator.reported:
            self._coordinator.raise_outcome()

    # -- stats ------------------------------------------------------------------------------
    def stats(self) -> RunStats:
        """`Run.stats`: read off the actors, the dispatcher, the coordinator and the host."""
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
                hook_time=a.hook_ns / 1e9, drops=drops, restarts=a.restarts,
                budget_misses=a.budget_misses, deadline_misses=a.deadline_misses)
        workers = {name: WorkerStats(name, busy)
                   for name, busy in self._dispatcher.busy_fractions().items()}
        c = self._coordinator
        recording = None if self._recorder is None else self._recorder.stats()
        capsule = None if self._capsule is None else self._capsule.stats()
        return RunStats(time=self.time, wall=c.wall_seconds(), nodes=nodes, workers=workers,
                        snapshots=c.snapshot_stats(), subscriptions=self._host.stats(),
                        recording=recording, capsule=capsule,
                        syncs={s.path: s.stats() for s in synchronizers(self._ports)})

    def __repr__(self) -> str:
        state = "running" if self.running else "ended"
        return f"<Run {state} t={self.time:.6f}s nodes={len(self._actors)}>"


# ---------------------------------------------------------------------------
# mujou.run: validate -> build -> start


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
    max_delta_cycles: int = DEFAULT_MAX_DELTA_CYCLES,
    placement: Placement | Mapping[str, str] | None = None,
    record: str | os.PathLike[str] | Recording | None = None,
    replay: str | os.PathLike[str] | Replay | None = None,
    record_on_failure: str | os.PathLike[str] | Capsule | None = None,
    check_read_only: bool = False,
    params: Mapping[str, Any] | None = None,
    record_ports: Sequence[str] | None = None,
    record_snapshots: bool | None = None,
    record_view: bool | None = None,
    replace: Iterable[str] | None = None,
    replay_speed: float | None = None,
    replay_loop: bool | None = None,
    replay_allow_damaged: bool | None = None,
    net_kwargs: Mapping[str, Any] | None = None,
    listen: str | None = None,
    join_timeout: float | None = None,
    allow_remote: bool | None = None,
    heartbeat_timeout: float | None = None,
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
            the stuck nodes: it returns within twice this. Also how long a
            hook may run before the run logs that it is still running (and
            again after twice as long, and so on). Default: 10.
        start_timeout (float): wall seconds that the start phase (every
            ``on_start``, then the restore of ``state``) may take in all.
            ``on_start`` hooks begin in the net's order (parents first): one
            after the other on a single worker, so an ``on_start`` must never
            wait for a later node's. Default: 60.
        max_delta_cycles (int): the delta cycles one instant may take (real
            time: the depth of one chain of triggered updates, each triggered
            by the previous one's message). Nodes that trigger one another
            with no delay (an algebraic loop, warned of when the run starts)
            never let time advance; an instant past this limit stops the run
            and ``join()`` raises `AlgebraicLoopError`, naming the nodes and
            the instant. Default: 10000.
        placement (Placement | Mapping[str, str], optional): run groups of
            nodes in processes of their own (docs/processes.md), and on other
            machines (docs/machines.md): a `Placement`, or its mapping of node
            path (its whole subtree) -> group name alone; nodes not named stay
            in this process (the group ``"host"``). ``net`` must then be the
            module-level function that builds the net (or
            ``"module:function"``), which every process calls with
            ``Placement.net_kwargs``. The returned run has the same API.
            Default: one process.
        record (str | os.PathLike | Recording, optional): record the messages
            of the Outputs to an MCAP file (docs/recording.md): one channel
            per Output, each message with its send time and delta cycle,
            lossless; the run's metadata (seeds, versions, the net). A path,
            or a `Recording` that also says which Outputs, whether to attach
            the supervisor's snapshots and to write Foxglove's view channels,
            and the writer's queue bounds. Whether the file can be written is
            checked before anything starts. The file is complete when
            `Run.join` returns; a crash leaves it readable up to its last
            chunk. Default: None (nothing recorded, and nothing of recording
            costs anything).
        replay (str | os.PathLike | Replay, optional): a recording
            (``record=``, an MCAP file) to replay nodes from
            (docs/recording.md, "Replay"): a `Replay`, which names the nodes
            it replaces (``replace``), its speed and whether to loop, or the
            file's path alone (nothing replaced: the net reruns with the
            recorded seeds). The replaced nodes' code does not run: a
            stand-in with the node's path, Outputs and order sends each
            recorded message at its recorded time and delta cycle, so with the
            simulated timer every reader gets exactly what it got in the
            recorded run. Their Inputs still take what their upstream sends,
            which never wakes them. Nodes without a seed of their own (and
            without ``seed=``) get the seeds of the recorded run. One process
            only (no ``placement``). Default: None.
        record_on_failure (str | os.PathLike | Capsule, optional): keep a
            crash capsule (docs/recording.md, "Crash capsules"): every
            message of every Output since the older of the last two
            snapshots, in memory (bounded by the `Capsule`'s ``max_bytes``
            and ``max_messages``), written to this MCAP file with the
            snapshot when a node first fails. The snapshots are the
            supervisor's; without its ``snapshot_every`` the run takes one
            every ``Capsule.seconds`` (5 s of its timer). Replay it with
            `mujou.testing.reproduce_failure` or ``mujou replay``. One
            process only (no ``placement``). Default: None.
        check_read_only (bool): a debugging aid: fail a node that changes a
            message it received in place (messages are read-only: every
            reader gets the same object). Each received tensor's version
            counter, and every other message's fingerprint (its pickle bytes:
            a list, a dict, a numpy array, a dataclass...), is compared before
            and after the reader's ``on_update``; one that differs fails the
            node with a `NodeError` caused by ``errors.MessageChangedError``,
            naming the node and its Input (docs/nodes-and-ports.md, "Sending
            and value semantics"). Costs a few microseconds per update of a
            node with Inputs when on (more for large messages other than
            tensors: they are pickled twice), and nothing when off. With
            ``placement``, each group's kernel checks its own readers.
            Default: False.
        params (Mapping[str, bool | int | float | str], optional): values of
            the nodes' parameters (`mujou.Param`) by dotted path
            (``{"sensor.noise": 0.02}``), set on the nodes before any hook
            runs, read-only ones included, without ``on_param`` (what ``mujou
            run --param`` gives); with ``placement``, in every group's
            process. A replay sets the recorded start values first, then
            these. Default: None.

    Deprecated:
        Each of these keywords sets one field of ``record=``, ``replay=`` or
        ``placement=`` (whose plain form, a path or a mapping, it turns into
        the object), warns with a `DeprecationWarning`, and goes in the next
        release: ``record_ports``, ``record_snapshots``, ``record_view``
        (`Recording`'s ``ports``, ``snapshots``, ``view``); ``replace``,
        ``replay_speed``, ``replay_loop``, ``replay_allow_damaged``
        (`Replay`'s ``replace``, ``speed``, ``loop``, ``allow_damaged``);
        ``net_kwargs``, ``listen``, ``join_timeout``, ``allow_remote``,
        ``heartbeat_timeout`` (`Placement`'s fields of those names). None
        (the default) is not given. Given without its argument it is a
        ``TypeError``; given with an object that sets the same field, a
        ``ValueError`` naming both.

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
        OSError: the ``trace`` or ``record`` file, or files in the supervisor's
            ``snapshot_dir``, could not be written: the path is a folder (a
            file for ``snapshot_dir``), lies under a file, or its folder takes
            no new file (``IsADirectoryError``, ``NotADirectoryError``,
            ``PermissionError``); raised before any node is claimed.
        RecordingError: ``replay`` is not an MCAP file, not a mujou
            recording, or damaged and not ``Replay.allow_damaged``
            (``FileNotFoundError``: there is no such file).
        ValueError: a path of ``Replay.replace`` is no node (the nodes are listed), or
            an Output of a replaced node that a node which runs reads is not in
            the recording (the missing channels are named).
    """
    old = {name: value for name, value in (
        ("record_ports", record_ports), ("record_snapshots", record_snapshots),
        ("record_view", record_view), ("replace", replace), ("replay_speed", replay_speed),
        ("replay_loop", replay_loop), ("replay_allow_damaged", replay_allow_damaged),
        ("net_kwargs", net_kwargs), ("listen", listen), ("join_timeout", join_timeout),
        ("allow_remote", allow_remote), ("heartbeat_timeout", heartbeat_timeout),
    ) if value is not None}
    if old:
        record, replay, placement = _fold_deprecated(old, record, replay, placement)
    return _start(net, seams=Seams(), workers=workers, timer=timer, duration=duration,
                  seed=seed, inputs=inputs, state=state, supervisor=supervisor, trace=trace,
                  cuda_sync=cuda_sync, stats=stats, stop_timeout=stop_timeout,
                  start_timeout=start_timeout, max_delta_cycles=max_delta_cycles,
                  placement=placement, record=record, replay=replay,
                  record_on_failure=record_on_failure, check_read_only=check_read_only,
                  params=params)


# The keywords of `run` that each set one field of record=, replay= or placement=, from
# before those took objects; they warn, and go in the next release. Old keyword -> the
# argument that holds it now, its field there, and the new form the warning names.
DEPRECATED: dict[str, tuple[str, str, str]] = {
    "record_ports": ("record", "ports", "record=mujou.Recording(path, ports=[...])"),
    "record_snapshots": ("record", "snapshots", "record=mujou.Recording(path, snapshots=True)"),
    "record_view": ("record", "view", "record=mujou.Recording(path, view=True)"),
    "replace": ("replay", "replace", "replay=mujou.Replay(path, replace=[...])"),
    "replay_speed": ("replay", "speed", "replay=mujou.Replay(path, speed=...)"),
    "replay_loop": ("replay", "loop", "replay=mujou.Replay(path, loop=True)"),
    "replay_allow_damaged": ("replay", "allow_damaged",
                             "replay=mujou.Replay(path, allow_damaged=True)"),
    "net_kwargs": ("placement", "net_kwargs",
                   "placement=mujou.Placement({...}, net_kwargs={...})"),
    "listen": ("placement", "listen", "placement=mujou.Placement({...}, listen='HOST:PORT')"),
    "join_timeout": ("placement", "join_timeout",
                     "placement=mujou.Placement({...}, join_timeout=...)"),
    "allow_remote": ("placement", "allow_remote",
                     "placement=mujou.Placement({...}, allow_remote=True)"),
    "heartbeat_timeout": ("placement", "heartbeat_timeout",
                          "placement=mujou.Placement({...}, heartbeat_timeout=...)"),
}
# The class of each argument's object.
_SETTINGS: dict[str, Any] = {"record": Recording, "replay": Replay, "placement": Placement}


def _fold_deprecated(old: Mapping[str, Any], record: Any, replay: Any, placement: Any, *,
                     where: str = "mujou.run", stacklevel: int = 3, owned: Iterable[str] = (),
                     ) -> tuple[Any, Any, Any]:
    """``record``, ``replay`` and ``placement`` with the deprecated keywords ``old`` set in them.

    Each keyword warns (at the line that called `run`, or what ``stacklevel``
    names), then sets its field of the object its argument is, or becomes: a
    path ``Recording(path, ports=...)``, a mapping ``Placement(mapping, listen=...)``.

    Args:
        where (str): what was called, for the errors. Default: ``"mujou.run"``.
        stacklevel (int): the warnings' ``stacklevel`` here: 3 is the line that
            called `run`. Default: 3.
        owned (Iterable[str]): of ``"record"``, ``"replay"``, ``"placement"``,
            those that ``where`` (a helper) sets itself. Default: none.

    Raises:
        TypeError: a keyword without its argument (``record_ports`` without
            ``record``).
        ValueError: a keyword whose field the object sets too (names both); one
            that sets a field of an argument in ``owned``.
    """
    given = {"record": record, "replay": replay, "placement": placement}
    fields: dict[str, dict[str, Any]] = {}
    for name, value in old.items():
        argument, field, new = DEPRECATED[name]
        warnings.warn(f"{name}= is deprecated; use {new}", DeprecationWarning,
                      stacklevel=stacklevel)
        if argument in owned:
            # Refused as the argument itself is: the helper's own object would take it.
            raise ValueError(f"{where}: {name}= sets the {field} of {argument}=, which "
                             f"{where} sets itself; leave it out")
        settings = given[argument]
        if settings is None:
            raise TypeError(f"{where}: {name}= goes with {argument}= (it sets its {field}): "
                            f"use {new}")
        if isinstance(settings, _SETTINGS[argument]) and _sets(settings, field):
            raise ValueError(f"{where}: {name}= and {argument}={settings!r} both set "
                             f"{field}: use {new} alone")
        fields.setdefault(argument, {})[field] = value
    for argument, values in fields.items():
        # Every field at once: Placement checks listen= against the machines its groups name.
        settings, kind = given[argument], _SETTINGS[argument]
        given[argument] = (dataclasses.replace(settings, **values) if isinstance(settings, kind)
                           else kind(settings, **values))
    return given["record"], given["replay"], given["placement"]


def _fold_run_kwargs(where: str, run_kwargs: Mapping[str, Any], *,
                     owned: Iterable[str] = (), stacklevel: int = 3) -> dict[str, Any]:
    """The ``**run_kwargs`` a helper passes on to `run`, with its deprecated keywords folded in.

    For the helpers of `mujou_actors.testing`, which take `run`'s arguments
    and start their runs with `_start` (which has no deprecated keywords):
    each one warns and sets its field of ``record``, ``replay`` or
    ``placement`` as `run` does, with `run`'s errors. Only the arguments
    a keyword set are added: a helper passes its own.

    Args:
        where (str): the helper, for the errors (``"check_restore"``).
        run_kwargs (Mapping[str, Any]): what the helper was given.
        owned (Iterable[str]): of ``"record"``, ``"replay"``, ``"placement"``,
            those the helper sets itself: a keyword that sets a field of one
            is refused, as the argument is. Default: none.
        stacklevel (int): the warnings' ``stacklevel`` as seen from here: 3 is
            the line that called the helper, when the helper calls this.
            Default: 3.

    Returns:
        dict[str, Any]: ``run_kwargs`` without the deprecated keywords (None,
        their default, is not given), with the arguments they set.

    Raises:
        TypeError / ValueError: as `run` raises them for these keywords, naming ``where``.
    """
    old = {name: value for name, value in run_kwargs.items()
           if name in DEPRECATED and value is not None}
    kwargs = {name: value for name, value in run_kwargs.items() if name not in DEPRECATED}
    if not old:
        return kwargs
    folded = _fold_deprecated(old, run_kwargs.get("record"), run_kwargs.get("replay"),
                              run_kwargs.get("placement"), where=where,
                              stacklevel=stacklevel + 1, owned=owned)
    for argument, value in zip(("record", "replay", "placement"), folded, strict=True):
        if value is not run_kwargs.get(argument):
            kwargs[argument] = value
    return kwargs


def _sets(settings: object, field: str) -> bool:
    """Whether a settings object gives ``field`` another value than its ``__init__``'s default."""
    default = inspect.signature(type(settings)).parameters[field].default
    return bool(getattr(settings, field) != default)


def _start(
    net: Node | list[Node] | dict[str, Node],
    *,
    seams: Seams,
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
    max_delta_cycles: int = DEFAULT_MAX_DELTA_CYCLES,
    placement: Placement | Mapping[str, str] | None = None,
    record: str | os.PathLike[str] | Recording | None = None,
    replay: str | os.PathLike[str] | Replay | None = None,
    record_on_failure: str | os.PathLike[str] | Capsule | None = None,
    check_read_only: bool = False,
    params: Mapping[str, Any] | None = None,
) -> Run:
    """`run` with the kernel's seams given (the CPU tests put fakes there).

    The arguments, defaults and errors of `run` but its deprecated keywords
    (a test checks that the two signatures agree), and ``seams`` (`Seams`).
    """
    args = _check_arguments(seams, workers=workers, timer=timer, duration=duration,
                            seed=seed, state=state, supervisor=supervisor, trace=trace,
                            cuda_sync=cuda_sync, stats=stats, stop_timeout=stop_timeout,
                            start_timeout=start_timeout, max_delta_cycles=max_delta_cycles,
                            record=record)
    placing = as_placement(placement)
    replaying = _check_replay(args, replay, placing)
    if check_flag("check_read_only", check_read_only):
        # One process wraps its readers' updates (_build); a placed run's kernels theirs.
        args = dataclasses.replace(args, check_read_only=True)
    if params is not None:
        if not isinstance(params, Mapping):
            raise TypeError(f"mujou.run: params must be a mapping of parameter path to value "
                            f"(e.g. {{'sensor.noise': 0.02}}), got {type(params).__name__}")
        args = dataclasses.replace(args, params=dict(params))
    capsule = as_capsule(record_on_failure)
    if capsule is not None:
        if placing is not None:
            raise ValueError("mujou.run: record_on_failure keeps a crash capsule in one "
                             "process; placement is not supported with it")
        args = dataclasses.replace(args, capsule=capsule,
                                   supervisor=_capsule_supervisor(args.supervisor, capsule))
    if placing is not None:
        from .distributed.placed import start as start_placed

        return _attach(start_placed(net, placement=placing, args=args, inputs=inputs,
                                    state=state), args, net)
    plan = _check_net(net, args, inputs, state)
    if replaying is not None:
        plan = _plan_replay(plan, args, replaying)
    coordinator, host, table = _build(plan, args, seams)
    return _begin(coordinator, host, table, plan, args, net)


def _attach(run: Run, args: _Arguments, net: Any) -> Run:
    """Open the started run's local endpoint (``mujou ls``, ``echo``...: endpoint.py).

    Unless ``MUJOU_ATTACH=0``; a folder that cannot be used is only warned of.
    """
    from .endpoint import open_endpoint

    open_endpoint(run, simulated=args.timer.simulated, net=net)
    return run


@dataclasses.dataclass(frozen=True)
class _Arguments:
    """The checked arguments of one `run` call, besides the net and its ``inputs``."""

    timer: Timer
    workers: int | None
    end_s: float | None  # the duration
    stop_timeout: float
    start_timeout: float
    seed: int | None
    stats: bool
    supervisor: Supervisor | None
    tree: dict[str, Any] | None  # the state to restore, loaded and checked as a tree
    cuda_sync: str
    tracer: Tracer | None
    recording: Recording | None = None  # record=, checked (its file can be written)
    capsule: Capsule | None = None  # record_on_failure=, checked (its file can be written)
    check_read_only: bool = False  # wrap each reader's update (actor.guard_read_only)
    params: dict[str, Any] | None = None  # params=: values set on the nodes before the start
    max_delta_cycles: int = DEFAULT_MAX_DELTA_CYCLES  # an instant's delta cycles, at most


def _capsule_supervisor(supervisor: Supervisor | None, capsule: Capsule) -> Supervisor:
    """The run's supervisor, with snapshots every ``capsule.seconds`` if it takes none."""
    if supervisor is not None and supervisor.snapshot_every is not None:
        return supervisor
    if supervisor is None:
        return Supervisor(snapshot_every=capsule.seconds)
    own = copy.copy(supervisor)  # the user's object stays as it was given
    own.snapshot_every = capsule.seconds
    return own


def _check_arguments(seams: Seams, *, workers: int | None, timer: str,
                     duration: float | None, seed: int | None,
                     state: Mapping[str, Any] | str | os.PathLike[str] | None,
                     supervisor: Supervisor | None,
                     trace: str | os.PathLike[str] | Tracer | None, cuda_sync: str,
                     stats: bool, stop_timeout: float, start_timeout: float,
                     max_delta_cycles: int = DEFAULT_MAX_DELTA_CYCLES,
                     record: str | os.PathLike[str] | Recording | None = None) -> _Arguments:
    """Check every argument that does not need the net; nothing is claimed yet."""
    t = seams.make_timer(timer)
    check_workers(workers, "mujou.run", optional=True)
    end_s = None if duration is None else check_seconds("duration", duration, allow_zero=True)
    timeout = check_seconds("stop_timeout", stop_timeout, allow_zero=False)
    start_limit = check_seconds("start_timeout", start_timeout, allow_zero=False)
    if not is_int(max_delta_cycles) or max_delta_cycles < 1:
        raise (TypeError if not is_int(max_delta_cycles) else ValueError)(
            f"mujou.run: max_delta_cycles must be an int >= 1, got {max_delta_cycles!r}")
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
    recording = as_recording(record)
    if recording is not None:
        if recording.snapshots and (supervisor is None or supervisor.snapshot_every is None):
            raise ValueError("mujou.run: Recording(snapshots=True) attaches the supervisor's "
                             "snapshots, and this run takes none: pass "
                             "supervisor=mujou.Supervisor(snapshot_every=...)")
        check_writable(recording.path, "mujou.run: record file", make_folders=True)
    return _Arguments(timer=t, workers=workers, end_s=end_s, stop_timeout=timeout,
                      start_timeout=start_limit, max_delta_cycles=max_delta_cycles,
                      seed=seed, stats=stats, supervisor=supervisor,
                      tree=tree, cuda_sync=cuda_sync, tracer=tracer, recording=recording)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """A checked net: its nodes by path, its ports, ``inputs=``, the seeds.

    ``previous`` holds each node's path before this run named it, to give it
    back should the run not start.
    """

    found: list[tuple[str, Node]]
    ports: dict[str, Port]
    initial: list[tuple[Input, Any]]
    seeds: dict[str, int]
    previous: list[tuple[Node, str | None]]
    recorded: list[str] = dataclasses.field(default_factory=list)  # Output paths
    replaced: Mapping[str, Feed] | None = None  # a replay's stand-ins' feeds, by node path
    params: RecordedParams | None = None  # a replay's recorded parameters and sets

    def give_back_paths(self) -> None:
        """A refused run leaves the nodes named as they were."""
        for node, old in self.previous:
            node._mujou_path = old


def _check_net(net: Node | list[Node] | dict[str, Node], args: _Arguments,
               inputs: Mapping[Input | str, Any] | None,
               state: Mapping[str, Any] | str | os.PathLike[str] | None) -> _Plan:
    """Check the net, ``inputs=`` and the state's fit; names the nodes by path.

    Raises:
        NetError: a node already in a running net (or another net error).
        PortTypeError, ValueError, TypeError, SnapshotError: see `run`. The
            nodes are then left as they were.
    """
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
        warn_suspect_net(found, ports, initial, args.end_s)
        if args.tree is not None:
            check_fit(args.tree, found, ports, state)
        seeds = settle_seeds(found, args.tree, args.seed)
        recorded = ([] if args.recording is None
                    else select_outputs(ports, args.recording.ports))
    except BaseException:
        for node, old in previous:  # a refused run leaves the nodes as they were
            node._mujou_path = old
        raise
    return _Plan(found=found, ports=ports, initial=initial, seeds=seeds, previous=previous,
                 recorded=recorded)


def _check_replay(args: _Arguments, replay: str | os.PathLike[str] | Replay | None,
                  placement: Placement | None) -> Replay | None:
    """Check ``replay`` as far as it does not need the net; None without one."""
    replaying = as_replay(replay)
    if replaying is None:
        return None
    if placement is not None:
        raise ValueError("mujou.run: replay runs in one process; placement is not supported "
                         "with it")
    check_timer(replaying, args.timer.simulated)
    return replaying


def _plan_replay(plan: _Plan, args: _Arguments, replay: Replay) -> _Plan:
    """Check the replay against the net and the file; the plan with the stand-ins' feeds.

    Nodes that the run seeds (no seed of their own, no tree's, no ``seed=``)
    get the recorded run's seeds. A refused replay leaves the nodes named as
    they were.
    """
    try:
        planned = plan_replay(replay, plan.found, plan.ports, simulated=args.timer.simulated)
    except BaseException:
        plan.give_back_paths()
        raise
    warn_no_duration(planned, replay.loop, args.end_s)
    seeds = dict(plan.seeds)
    if args.seed is None:
        tree_seeds = {} if args.tree is None else args.tree["seeds"]
        for path_, node in plan.found:
            if node._mujou_seed is None and path_ not in tree_seeds and path_ in planned.seeds:
                seeds[path_] = planned.seeds[path_]
    return dataclasses.replace(plan, seeds=seeds, replaced=planned.feeds,
                               params=planned.params)


def _build(plan: _Plan, args: _Arguments, seams: Seams
           ) -> tuple[Coordinator, Host, RunParams]:
    """Claim the nodes, build the kernel and start its threads (no hook has run yet).

    Every argument is checked: the nodes are claimed from here on, and a
    failure before the threads run releases them again (a later mujou.run
    of the same nodes must not find them part of a running net).
    """
    token = object()
    for _, node in plan.found:
        node._mujou_run = token
    coordinator: Coordinator | None = None
    try:
        actors = make_actors(plan.found, plan.seeds, args.tree, args.stats, plan.ports,
                             replaced=plan.replaced)
        pool = sum(1 for a in actors if not a.dedicated)
        n_workers = args.workers if args.workers is not None else default_workers(pool)
        rt = setup_cuda(actors, args.cuda_sync, seams)
        coordinator = Coordinator(actors=actors, ports=plan.ports, seeds=plan.seeds,
                                  timer=args.timer, workers=n_workers,
                                  stop_timeout=args.stop_timeout, supervisor=args.supervisor,
                                  rt=rt, tracer=args.tracer, seams=seams)
        coordinator.dispatcher.set_loop_limit(
            args.max_delta_cycles, warn_loops(plan.found, args.max_delta_cycles))
        dispatcher = coordinator.dispatcher
        # Nodes with parameters only: their sets are applied inside the budget's measure.
        params = RunParams(plan.found)
        params.guard(actors, skip=plan.replaced or ())
        replayed: list[tuple[int, int, str, str, Any]] = []
        if plan.params is not None:
            assert plan.replaced is not None  # a replay's
            replayed = params.preload(plan.params.initial, plan.params.sets, "the recording")
        set_values(args.params, plan.found)  # after a replay's start values: these win
        # Nodes with a budget or deadline only (a replayed one never runs); wrapped first,
        # so that the read-only check's time is not charged to the node's budget. In
        # real time the dispatcher's monitor watches the deadlines as the hooks run.
        for actor in actors:
            if plan.replaced is None or actor.path not in plan.replaced:
                guard_deadlines(actor, dispatcher.timer, dispatcher.simulated,
                                dispatcher.deadlines.add)
        if args.check_read_only:  # the update wrapped once here; a run without it pays nothing
            for actor in actors:
                guard_read_only(actor)
        host = Host(coordinator.wiring.host_copy, coordinator.callback_failed)
        coordinator.attach_host(host)
        if args.recording is not None:
            _record(coordinator, plan, args, n_workers)
            assert coordinator.recorder is not None
            for t_ns, delta, owner, name, value in replayed:  # a recording of the replay
                coordinator.recorder.param((t_ns, delta), owner, name, value)
        if args.capsule is not None:
            _keep_capsule(coordinator, plan, args, n_workers)
        coordinator.start_threads()
    except BaseException:
        if coordinator is not None:  # no hook has run: the threads exit at once
            coordinator.abandon()
        _unclaim(plan, token)
        raise
    return coordinator, host, params


def _record(coordinator: Coordinator, plan: _Plan, args: _Arguments, workers: int) -> None:
    """Make the run's recorder: the file, its hooks on the recorded Outputs, its thread.

    Before the threads start, so that what ``on_start`` sends is recorded too.
    """
    assert args.recording is not None
    wiring = coordinator.wiring
    actor_of = wiring.actor_of
    outputs = [(port, actor_of[id(port.node)]) for port in
               (plan.ports[path] for path in plan.recorded) if isinstance(port, Output)]
    metadata = run_metadata(plan.found, plan.ports, seeds=plan.seeds, seed=args.seed,
                            timer="simulated" if args.timer.simulated else "realtime",
                            workers=workers, placement=None, patterns=args.recording.ports,
                            log=args.recording.log)
    channels = [ChannelSpec.of(output, actor.path, actor.order) for output, actor in outputs]
    recorder = Recorder(args.recording, channels, metadata, simulated=args.timer.simulated,
                        host_copy=None if wiring.rt is None else wiring.host_copy,
                        now_ns=lambda: coordinator.time_ns)
    coordinator.attach_recorder(recorder)
    for ch, (output, actor) in enumerate(outputs):
        wiring.listen(output, recorder.hook(ch, actor))
    recorder.start()


def _keep_capsule(coordinator: Coordinator, plan: _Plan, args: _Arguments,
                  workers: int) -> None:
    """Make the run's crash capsule: its hooks on every Output (before the threads start)."""
    assert args.capsule is not None
    wiring = coordinator.wiring
    actor_of = wiring.actor_of
    outputs = [(port, actor_of[id(port.node)]) for port in plan.ports.values()
               if isinstance(port, Output)]
    metadata = run_metadata(plan.found, plan.ports, seeds=plan.seeds, seed=args.seed,
                            timer="simulated" if args.timer.simulated else "realtime",
                            workers=workers, placement=None, patterns=None)
    channels = [ChannelSpec.of(output, actor.path, actor.order) for output, actor in outputs]
    keeper = CapsuleKeeper(args.capsule, channels, metadata,
                           host_copy=None if wiring.rt is None else wiring.host_copy)
    coordinator.attach_capsule(keeper)
    for ch, (output, actor) in enumerate(outputs):
        wiring.listen(output, keeper.hook(ch, actor))


def _unclaim(plan: _Plan, token: object) -> None:
    """Release the nodes of a run that failed before its threads started."""
    for _, node in plan.found:
        if node._mujou_run is token:
            node._mujou_run = None
    unwire(plan.ports)
    plan.give_back_paths()


def _begin(coordinator: Coordinator, host: Host, params: RunParams, plan: _Plan,
           args: _Arguments, net: Any) -> Run:
    """Run the start phase, open the endpoint, then start the timer; a failure stops the
    run first."""
    run = LocalRun(coordinator, host, plan.ports, plan.seeds, params)
    try:
        # Inside the try: a KeyboardInterrupt while the host waits stops the run too.
        coordinator.begin(tree=args.tree, initial=plan.initial, end_s=args.end_s,
                          start_limit=args.start_timeout)
    except BaseException:
        run.stop()  # on_stop for the started nodes, threads ended, nodes released
        raise
    _attach(run, args, net)  # before the timer: what the caller does at t = 0 is not delayed
    coordinator.start_timer()
    return run
