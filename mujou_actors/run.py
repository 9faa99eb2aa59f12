"""``mujou.run`` and ``Run``: build the actors, start them, and the host's API.

The host talks to a running net only through envelopes (writes), views of
Outputs (read, subscribe, wait_for) and the dispatcher's phases (start, stop).
A coordinator thread (``mujou-run``) ends the run whatever ends it: its
duration, ``stop()``, leaving the ``with`` block or a node failure.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .actor import Actor
from .dispatcher import Dispatcher, default_workers
from .errors import (
    CallbackError,
    NetError,
    NodeError,
    NotRunningError,
    StopTimeoutError,
)
from .mailbox import Start, Stop
from .node import Node, iter_nodes, random_seed
from .ports import Input, Output, Port, copy_message
from .stats import NodeStats, RunStats, WorkerStats, percentile
from .supervisor import derive_seed
from .timers import make_timer

__all__ = ["run", "Run"]

log = logging.getLogger("mujou_actors")

_END = object()  # wakes waiters when the run ends


# ---------------------------------------------------------------------------
# The net


def _walk(net: Any) -> list[tuple[str, Node]]:
    """Every node of the net with its path, parents before children."""
    if isinstance(net, Node):
        roots = [("", net)]
    elif isinstance(net, (list, tuple, dict)):
        roots = list(iter_nodes("", net))
        size = len(net)
        if len(roots) != size:
            raise NetError("mujou.run: every item of a list or dict net must be a Node")
        if isinstance(net, dict) and not all(isinstance(k, str) and k and "." not in k
                                             for k in net):
            raise NetError("mujou.run: the keys of a dict net must be non-empty str without '.'")
    else:
        raise TypeError(
            f"mujou.run: net must be a Node, or a list or dict of Nodes, got {type(net).__name__}"
        )
    found: list[tuple[str, Node]] = []
    seen: dict[int, str] = {}
    stack = list(reversed(roots))
    while stack:
        path, node = stack.pop()
        if "_mujou_period_ns" not in vars(node):
            raise NetError(
                f"node {path or '<root>'!r} ({type(node).__name__}): its __init__ "
                "must call super().__init__()"
            )
        if id(node) in seen:
            raise NetError(
                f"node {type(node).__name__} is reachable twice, as {seen[id(node)] or '<root>'!r} "
                f"and {path or '<root>'!r}; a node belongs to one place in the net"
            )
        seen[id(node)] = path
        found.append((path, node))
        children = [(f"{path}.{name}" if path else name, child)
                    for name, child in node._mujou_children()]
        stack.extend(reversed(children))
    return found


class _View:
    """The host's view of one Output: the newest message and the listeners."""

    __slots__ = ("last", "listeners")

    def __init__(self) -> None:
        self.last: Any = None
        self.listeners: list[Callable[[Any], None]] = []

    def publish(self, message: Any) -> None:
        for listener in self.listeners:
            listener(message)


# ---------------------------------------------------------------------------
# Run


class Run:
    """A started run of a net; made by `run`, not directly.

    Use it as a context manager (leaving the block stops the run and raises a
    node's failure) or call `join`. Ports are given as objects or by
    dotted path (``"ctrl.setpoint"``).
    """

    def __init__(self, *, actors: list[Actor], dispatcher: Dispatcher,
                 ports: dict[str, Port], seeds: dict[str, int],
                 stop_timeout: float) -> None:
        self._actors = actors
        self._dispatcher = dispatcher
        self._timer = dispatcher.timer
        self._ports = ports
        self._port_ids = {id(p) for p in ports.values()}
        self._seeds = seeds
        self._stop_timeout = stop_timeout
        self._actor_of = {id(a.node): a for a in actors}
        self._views: dict[int, _View] = {}
        self._input_views: dict[int, _View] = {}
        self._failures: list[NodeError | CallbackError] = []
        self._stuck: StopTimeoutError | None = None
        self._reported = False
        self._lock = threading.Lock()
        self._end_requested = threading.Event()
        self._ended = threading.Event()
        self._host_queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._host_thread: threading.Thread | None = None
        self._waiters: list[queue.SimpleQueue[Any]] = []
        self._wall_start = time.perf_counter()
        self._wall_end: float | None = None
        self._end_ns: int | None = None
        self._coordinator = threading.Thread(target=self._coordinate, name="mujou-run",
                                             daemon=True)

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

    def _view(self, output: Output) -> _View:
        return self._views[id(output)]

    def read(self, port: Port | str) -> Any:
        """The newest message of a port, as a copy for the host.

        Args:
            port (Port | str): an Output (the newest message sent on it) or an
                Input (its newest kept message), or its dotted path.

        Returns:
            A copy of the message, or ``None`` before the first. Works after
            the run has ended too.

        Raises:
            ValueError: no such port in this run.
        """
        p = self._port(port)
        message = self._view(p).last if isinstance(p, Output) else p.read()  # type: ignore[attr-defined]
        return copy_message(message)

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
        message = copy_message(p.check(value))
        if self._end_requested.is_set():
            raise NotRunningError(f"write to {p.path!r}: the run has ended")
        self._deliver(p, message)  # type: ignore[arg-type]

    def _deliver(self, port: Input, message: Any) -> None:
        actor = self._actor_of[id(port.node)]
        triggers = port in actor.triggers
        self._dispatcher.host_deliver(actor, port, message, triggers)
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

    def subscribe(self, port: Port | str, callback: Callable[[Any], None]) -> Callable[[], None]:
        """Call ``callback(message)`` for every later message of a port.

        Callbacks run in send order on the thread ``mujou-host`` (never on a
        worker), each with a copy of the message. A callback that raises stops
        the run; `join` raises `CallbackError`.

        Args:
            port (Port | str): an Output (every message sent on it) or an
                Input (every message delivered to it), or its dotted path.
            callback: called with one argument.

        Returns:
            A function that cancels the subscription.
        """
        p = self._port(port)
        if not callable(callback):
            raise TypeError(f"subscribe({p.path!r}): callback must be callable")
        self._start_host_thread()
        put = self._host_queue.put
        return self._listen(p, lambda m: put((p, callback, m)))

    def wait_for(self, port: Port | str, predicate: Callable[[Any], bool] | None = None,
                 timeout: float | None = None) -> Any:
        """Wait for the first message of a port, sent after this call, that matches.

        Args:
            port (Port | str): an Output or Input, or its dotted path.
            predicate: tried on every message in order (on the calling
                thread); None matches the first message.
            timeout (float, optional): wall seconds.

        Returns:
            A copy of the matching message.

        Raises:
            TimeoutError: no match within ``timeout``.
            NotRunningError: the run ended before a match.
        """
        p = self._port(port)
        if self._dispatcher.is_own_thread():
            raise RuntimeError("wait_for() from inside a hook would block a worker forever")
        inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        detach = self._listen(p, inbox.put)
        with self._lock:
            self._waiters.append(inbox)
            ended = self._ended.is_set()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                if ended and inbox.empty():
                    raise NotRunningError(f"wait_for({p.path!r}): the run ended without a match")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"wait_for({p.path!r}): no match within {timeout} s")
                try:
                    message = inbox.get(timeout=left)
                except queue.Empty:
                    continue
                if message is _END:
                    ended = True
                    continue
                message = copy_message(message)
                if predicate is None or predicate(message):
                    return message
        finally:
            detach()
            with self._lock:
                self._waiters.remove(inbox)

    def _start_host_thread(self) -> None:
        with self._lock:
            if self._host_thread is None:
                self._host_thread = threading.Thread(target=self._host_loop,
                                                     name="mujou-host", daemon=True)
                self._host_thread.start()

    def _host_loop(self) -> None:
        get = self._host_queue.get
        while True:
            item = get()
            if item is _END:
                return
            port, callback, message = item
            try:
                callback(copy_message(message))
            except Exception as exc:
                err = CallbackError(f"subscriber of {port.path!r} raised "
                                    f"{type(exc).__name__}: {exc}")
                err.__cause__ = exc
                log.error("%s", err, exc_info=exc)
                with self._lock:
                    self._failures.append(err)
                self._request_end()

    # -- ending -------------------------------------------------------------------------
    def _request_end(self) -> None:
        self._end_requested.set()

    def _on_failure(self, actor: Actor, hook: str, exc: BaseException) -> None:
        path = actor.path or "<root>"
        err = NodeError(actor.path, hook,
                        f"node {path!r} raised in {hook}: {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        log.error("node %r failed in %s", path, hook, exc_info=exc)
        with self._lock:
            self._failures.append(err)
        self._request_end()

    def _coordinate(self) -> None:
        self._end_requested.wait()
        try:
            self._finish()
        finally:
            self._wall_end = time.perf_counter()
            self._ended.set()

    def _finish(self) -> None:
        """Stop timed work, run every started node's on_stop, release the net."""
        d = self._dispatcher
        d.request_stop()
        stuck = {a.path: a.hook or "?" for a in d.wait_idle(self._stop_timeout)}
        self._end_ns = self._timer.now_ns()
        to_stop = [a for a in self._actors if a.started and a.path not in stuck]
        for actor in d.run_control(to_stop, Stop(), self._stop_timeout, help=True):
            stuck.setdefault(actor.path, actor.hook or "on_stop")
        if stuck:
            self._stuck = StopTimeoutError(stuck, self._stop_timeout)
            log.error("%s", self._stuck)
        d.shutdown()
        stuck_threads = {a.thread_name for a in self._actors if a.path in stuck}
        d.join_threads(timeout=self._stop_timeout, skip=stuck_threads)
        self._release()
        if self._host_thread is not None:
            self._host_queue.put(_END)
            if threading.current_thread() is not self._host_thread:
                self._host_thread.join()
        with self._lock:
            for inbox in self._waiters:
                inbox.put(_END)

    def _release(self) -> None:
        for actor in self._actors:
            actor.node._mujou_run = None
        for port in self._ports.values():
            if isinstance(port, Output):
                port._sink = None

    def stop(self) -> None:
        """End the run; idempotent.

        From the host it returns once every node's ``on_stop`` has run: hooks
        in flight finish first, for at most ``stop_timeout`` seconds; nodes
        still stuck then are reported (logged, and raised by `join` as
        `StopTimeoutError`) and left behind. From inside a hook (or a
        subscriber callback) it only asks the run to end, so it never
        deadlocks.
        """
        self._request_end()
        if self._dispatcher.is_own_thread() or threading.current_thread() in (
                self._host_thread, self._coordinator):
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
            RuntimeError: called from inside a hook (it would wait for itself).
        """
        if self._dispatcher.is_own_thread():
            raise RuntimeError("join() from inside a hook would wait for itself; use stop()")
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
        """Per-node and per-worker statistics, as a frozen `RunStats`.

        Cheap enough to call a few times a second while the run goes on.
        """
        nodes = {}
        for a in self._actors:
            late = sorted(a.lateness)
            drops = {name: p.drops for name, p in a.node._mujou_ports().items()
                     if isinstance(p, Input)}
            nodes[a.path] = NodeStats(
                path=a.path, updates=a.updates, overruns=a.overruns,
                dt_mean=a.dt_sum / a.updates if a.updates else 0.0, dt_max=a.dt_max,
                lateness_p50=percentile(late, 50) / 1e9,
                lateness_p99=percentile(late, 99) / 1e9,
                hook_time=a.hook_ns / 1e9, drops=drops, restarts=a.restarts)
        end = self._wall_end if self._wall_end is not None else time.perf_counter()
        workers = {name: WorkerStats(name, busy)
                   for name, busy in self._dispatcher.busy_fractions().items()}
        return RunStats(time=self.time, wall=end - self._wall_start, nodes=nodes,
                        workers=workers)

    def __repr__(self) -> str:
        state = "running" if self.running else "ended"
        return f"<Run {state} t={self.time:.6f}s nodes={len(self._actors)}>"


# ---------------------------------------------------------------------------
# mujou.run


def _check_number(name: str, value: Any, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"mujou.run: {name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"mujou.run: {name} must be a finite number "
                         f"{'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def _check_workers(workers: Any) -> None:
    if workers is None:
        return
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise TypeError(f"mujou.run: workers must be an int or None, got {workers!r}")
    if workers < 1:
        raise ValueError(f"mujou.run: workers must be >= 1, got {workers}")


def _collect_ports(found: list[tuple[str, Node]]) -> dict[str, Port]:
    ports: dict[str, Port] = {}
    for path, node in found:
        for name, port in node._mujou_ports().items():
            ports[f"{path}.{name}" if path else name] = port
    owners = {id(node) for _, node in found}
    for port in ports.values():
        if isinstance(port, Output):
            for reader in port._readers:
                if id(reader.node) not in owners:
                    raise NetError(f"{port.path!r} is connected to {reader.path!r}, "
                                   "whose node is not part of the net")
        elif isinstance(port, Input):
            for source in port._sources:
                if id(source.node) not in owners:
                    raise NetError(f"{port.path!r} is fed by {source.path!r}, "
                                   "whose node is not part of the net")
    return ports


def run(
    net: Node | list[Node] | dict[str, Node],
    *,
    workers: int | None = None,
    timer: str = "realtime",
    duration: float | None = None,
    seed: int | None = None,
    inputs: Mapping[Input | str, Any] | None = None,
    stop_timeout: float = 10.0,
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
            from this seed and the node's path (stable across processes).
        inputs (Mapping[Input | str, Any], optional): messages delivered to
            Inputs after every ``on_start``, before the timer starts.
        stop_timeout (float): seconds ``stop()`` waits for a hook in flight
            (and for the ``on_stop`` hooks) before it reports the stuck
            nodes. Default: 10.

    Returns:
        Run: the started run.

    Raises:
        NetError: an invalid net (a node reachable twice, a node already in a
            running net, a port connected outside the net, a missing
            ``super().__init__()``).
        PortTypeError: a value of ``inputs`` does not match its Input.
        ValueError / TypeError: a bad argument, naming it.
        NodeError: an ``on_start`` raised (the run is stopped first).
    """
    t = make_timer(timer)
    _check_workers(workers)
    end_s = None if duration is None else _check_number("duration", duration, allow_zero=True)
    timeout = _check_number("stop_timeout", stop_timeout, allow_zero=False)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"mujou.run: seed must be an int or None, got {seed!r}")

    found = _walk(net)
    for path, node in found:
        if node._mujou_run is not None:
            raise NetError(f"node {path or '<root>'!r} ({type(node).__name__}) "
                           "is already part of a running net")
    for path, node in found:
        node._mujou_path = path  # ports name themselves by path from here on
    ports = _collect_ports(found)
    initial = _resolve_inputs(ports, inputs)

    token = object()
    actors = []
    seeds = {}
    for order, (path, node) in enumerate(found):
        node._mujou_run = token
        actor = Actor(node, path, order)
        actors.append(actor)
        own = node._mujou_seed
        if own is None:
            own = derive_seed(seed, path) if seed is not None else random_seed()
            node._mujou_generator.manual_seed(own)
        seeds[path] = own
    for port in ports.values():
        if isinstance(port, Input):
            port._reset()
    pool = sum(1 for a in actors if not a.dedicated)
    n_workers = workers if workers is not None else default_workers(pool)

    holder: list[Run] = []
    dispatcher = Dispatcher(actors, t, n_workers,
                            on_failure=lambda a, h, e: holder[0]._on_failure(a, h, e),
                            on_end=lambda: holder[0]._request_end())
    result = Run(actors=actors, dispatcher=dispatcher, ports=ports, seeds=seeds,
                 stop_timeout=timeout)
    holder.append(result)
    _wire(result, actors, ports, dispatcher)

    dispatcher.start_threads()
    result._coordinator.start()
    for actor in dispatcher.run_control(actors, Start(), math.inf):
        log.error("node %r did not finish on_start", actor.path)
    if result._failures:
        result.stop()
        result._raise_outcome()
    for port, message in initial:
        result._deliver(port, message)
    if end_s is not None:
        dispatcher.end_ns = round(end_s * 1e9)
    dispatcher.start_running(0)
    return result


def _resolve_inputs(ports: dict[str, Port], inputs: Any) -> list[tuple[Input, Any]]:
    """Check ``inputs=`` before anything starts: ports exist, values match."""
    if inputs is None:
        return []
    if not isinstance(inputs, Mapping):
        raise TypeError(f"mujou.run: inputs must be a mapping, got {type(inputs).__name__}")
    by_id = {id(p): p for p in ports.values()}
    resolved = []
    for key, value in inputs.items():
        port = ports.get(key) if isinstance(key, str) else by_id.get(id(key))
        if not isinstance(port, Input):
            name = key if isinstance(key, str) else getattr(key, "path", repr(key))
            raise ValueError(f"mujou.run: inputs names {name!r}, which is not an Input of the net")
        resolved.append((port, copy_message(port.check(value))))
    return resolved


def _wire(result: Run, actors: list[Actor], ports: dict[str, Port],
          dispatcher: Dispatcher) -> None:
    """Install each Output's sink and each actor's set of triggering Inputs."""
    actor_of = result._actor_of
    for actor in actors:
        period_none = actor.period_ns is None
        actor.triggers = frozenset(
            p for p in actor.node._mujou_ports().values()
            if isinstance(p, Input) and (period_none if p.trigger is None else p.trigger))
    for port in ports.values():
        if isinstance(port, Output):
            routes = [(r, actor_of[id(r.node)], False) for r in port._readers]
            routes = [(r, a, r in a.triggers) for r, a, _ in routes]
            view = _View()
            result._views[id(port)] = view
            port._sink = dispatcher.make_sink(actor_of[id(port.node)], routes, view)


