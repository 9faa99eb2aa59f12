"""`PlacedRun`: the `Run` of a placed run, the host's API over the run's driver.

Every call but the properties is carried out by the run's driver thread
(`driver._Driver`) between two global delta cycles, so each waits at most
for the round in progress; calls that would wait for the end from a thread
the end waits for (a hook of the host's group, a subscriber callback) are
refused, as in one process.
"""

from __future__ import annotations

import functools
import logging
import operator
import socket
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from ..errors import (
    NodeError,
    NotRunningError,
)
from ..host import HOST_QUEUE_DEPTH, Run, Subscription, Waiter, Watch, check_depth, check_watch
from ..messages import copy_message
from ..node import Node
from ..params import RunParams
from ..ports import Input, Output, Port
from ..stats import (
    GroupStats,
    MachineStats,
    NodeStats,
    RunStats,
    SnapshotStats,
    SyncStats,
    percentile,
)

log = logging.getLogger("mujou_actors")


__all__ = ["PlacedRun", "machine_stats"]

# The run's driver (driver._Driver): driver.py's start builds it, so it is named here,
# not imported (placed.py imports both).
_Driver = Any

class PlacedRun(Run):
    """`Run` for a placed run: the host's API over the run's driver (docs/processes.md).

    Made by ``mujou.run(factory, placement=...)``. Calls other than the
    properties are carried out by the run's driver thread between two global
    delta cycles, so each waits at most for the round in progress.
    """

    def __init__(self, driver: _Driver, ports: dict[str, Port], seeds: dict[str, int],
                 found: list[tuple[str, Node]]) -> None:
        self._driver = driver
        self._ports = ports
        self._seeds = seeds
        self._found = found
        # The host's own writes, by Input path: what observes that Input sees them as one
        # process's subscriptions do (they come from no Output that the groups publish).
        self._writes: dict[str, list[Callable[[Any], None]]] = {}
        self._params = RunParams(found)  # resolves and checks; the groups' kernels queue

    # -- properties ---------------------------------------------------------------------
    @property
    def seeds(self) -> Mapping[str, int]:
        """Mapping[str, int]: the seed of every node's generator, by path."""
        return dict(self._seeds)

    @property
    def time_ns(self) -> int:
        """int: `time` in integer nanoseconds of the run's timer."""
        return self._driver.time_ns

    @property
    def start_time(self) -> float:
        """float: the time the run started at, seconds (a restored run's is > 0)."""
        return getattr(self._driver, "start_ns", 0) / 1e9

    @property
    def nodes(self) -> Mapping[str, Node]:
        """Mapping[str, Node]: the host's copy of every node, by path.

        Only the host's group's nodes run in this process; the others are the
        copies the host built to check the net (their state is not the run's:
        use `read` and `state_dict`).
        """
        return {p: n for p, n in self._found}

    @property
    def ports(self) -> Mapping[str, Port]:
        """`Run.ports`: the ports of the host's copies of the nodes."""
        return dict(self._ports)

    @property
    def groups(self) -> Mapping[str, list[str]]:
        """Mapping[str, list[str]]: each group's node paths (the host's group is ``"host"``)."""
        return {g.name: list(g.nodes) for g in self._driver.groups.values()}

    @property
    def failure(self) -> BaseException | None:
        """BaseException | None: what `join` raises, None for a run that did not fail."""
        return self._outcome()

    @property
    def running(self) -> bool:
        """bool: True until the run has ended."""
        return not self._driver.ended.is_set()

    # -- waiting and ending ---------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the end without raising its failure; True once ended.

        Raises:
            RuntimeError: called from inside a hook or a subscriber callback.
        """
        self._check_caller("wait()")
        return self._driver.ended.wait(timeout)

    def stop(self) -> None:
        """End the run: every group's ``on_stop`` runs, the processes end; idempotent.

        Returns once the run has ended: a hook stuck in an update costs it one
        ``stop_timeout`` in all (plus the processes' shutdown), a stuck
        ``on_stop`` one more (docs/processes.md); its group is then ended and
        `join` reports it as `StopTimeoutError`, naming node, hook and group.
        """
        self._driver.stop_asked.set()
        if self._inside():
            return  # only asked: the end waits for this very thread
        self._driver.ended.wait(4 * self._driver.stop_timeout + 30.0)

    def _inside(self) -> bool:
        """On a thread the end waits for: a hook of the host's group, a callback, the driver."""
        drv = self._driver
        kernel = drv.kernel
        return (threading.current_thread() is drv.thread or drv.host.on_thread()
                or (kernel is not None and kernel.dispatcher.is_own_thread()))

    def _check_caller(self, call: str) -> None:
        """Refuse a call that would wait for the end from a thread the end waits for."""
        if self._inside():
            raise RuntimeError(f"{call} from inside a hook or a subscriber callback would "
                               f"wait for itself: use run.stop() to end the run, "
                               f"run.running to check")

    def join(self, timeout: float | None = None) -> None:
        """Wait for the end; raise what made it fail (as `Run.join`).

        Raises:
            NodeError: a hook raised in a group (the node's path and hook; the
                remote traceback as the ``__cause__``, a `RemoteTraceback`).
            GroupDied: a group process died.
            CallbackError, StopTimeoutError: as `Run.join`.
            TimeoutError: not ended within ``timeout``.
        """
        self._check_caller("join()")
        if not self._driver.ended.wait(timeout):
            raise TimeoutError(f"the run has not ended within {timeout} s")
        self._driver.reported = True
        err = self._outcome()
        if err is not None:
            raise err

    def _outcome(self) -> BaseException | None:
        failures = self._driver.failures
        if not failures:
            return None
        first = failures[0]
        if isinstance(first, NodeError):
            first.failures = [f for f in failures if isinstance(f, NodeError)]
        return first

    def _raise_unreported(self) -> None:
        if not self._driver.reported:
            self._driver.reported = True
            err = self._outcome()
            if err is not None:
                raise err

    # -- ports ------------------------------------------------------------------------------
    def _path(self, port: Port | str, want: type | None = None) -> str:
        if isinstance(port, Port):
            # As `Run`: a port object of another net is refused, even at a path of this one.
            if self._ports.get(port.path) is not port:
                raise ValueError(f"port {port.path!r} is not part of this run (use the "
                                 f"ports of run.nodes, or the dotted path)")
            port = port.path
        if not isinstance(port, str):
            raise TypeError(f"expected a port or a dotted port path, got {type(port).__name__}")
        found = self._ports.get(port)
        if found is None:
            raise ValueError(f"no port {port!r} in this run (ports: {sorted(self._ports)})")
        if want is not None and not isinstance(found, want):
            raise TypeError(f"port {port!r} is an {type(found).__name__}; "
                            f"expected an {want.__name__}")
        return port

    def read(self, port: Port | str) -> Any:
        """The newest message of a port (a copy), from whichever group runs it.

        Raises:
            ValueError: no such port; NotRunningError: the run has ended
                (the groups are gone; read the final `state_dict` instead).
        """
        self._check_caller("read()")
        path = self._path(port)
        return self._driver.call(lambda: self._driver.read(path), 60.0, f"read({path!r})")

    def write(self, port: Input | str, value: Any) -> None:
        """Deliver ``value`` to an Input as the host, in whichever group runs it.

        Raises:
            PortTypeError: the value does not match the Input's type.
            ValueError / TypeError: no such Input.
            NotRunningError: the run has ended.
        """
        self._check_caller("write()")
        path = self._path(port, Input)
        checked = self._ports[path].check(value)
        self._driver.call(lambda: self._driver.write(path, checked), 60.0, f"write({path!r})")
        for put in list(self._writes.get(path, ())):
            put(checked)

    def set_param(self, path: str, value: Any) -> tuple[int, int]:
        """`Run.set_param`: checked here, queued in the node's group, recorded here."""
        self._check_caller("set_param()")
        node, name, checked = self._params.check(path, value)
        drv = self._driver
        key = drv.call(lambda: drv.set_param(node, name, checked), 60.0, f"set_param({path!r})")
        if drv.recorder is not None:
            drv.recorder.param(key, node, name, checked)
        return key

    def params(self) -> dict[str, Any]:
        """`Run.params`: asked of the groups."""
        self._check_caller("params()")
        drv = self._driver
        values: dict[str, Any] = drv.call(drv.params, 60.0, "params()")
        return values

    def describe_params(self) -> dict[str, dict[str, Any]]:
        """`Run.describe_params`: the host's declarations, the groups' values."""
        values = self.params()
        found = self._params.describe()
        for path, entry in found.items():
            entry["value"] = values.get(path, entry["value"])
        return found

    def _watch_writes(self, path: str, put: Callable[[Any], None]) -> Callable[[], None]:
        """Call ``put`` with every later host write to ``path`` if it is an Input; the undo."""
        if not isinstance(self._ports[path], Input):
            return lambda: None
        self._writes.setdefault(path, []).append(put)

        def undo() -> None:
            puts = self._writes.get(path, [])
            if put in puts:
                puts.remove(put)

        return undo

    def subscribe(self, port: Port | str, callback: Callable[..., None], *,
                  depth: int = HOST_QUEUE_DEPTH, with_time: bool = False) -> Subscription:
        """Call ``callback(message)`` for every later message of a port (as `Run.subscribe`).

        The group that runs the port sends the host a copy of each message with
        its reply to each grant; an Input's messages are those of the Outputs
        that feed it. With ``with_time``, ``callback(t_ns, message)``: the
        send's time, which the group sends with each message.
        """
        self._check_caller("subscribe()")
        path = self._path(port)
        if not callable(callback):
            raise TypeError(f"subscribe({path!r}): callback must be callable")
        depth = check_depth(f"subscribe({path!r})", depth)
        if type(with_time) is not bool:
            raise TypeError(f"subscribe({path!r}): with_time must be a bool, got {with_time!r}")
        what = f"subscribe({path!r})"
        driver = self._driver
        detaches: list[Callable[[], None]] = []
        if with_time:
            sub = driver.host.subscribe(path, lambda item: callback(*item), depth)
            put = sub.put

            def timed(item: tuple[int, int, int, int, Any]) -> None:
                put((item[0], item[4]))

            listen = lambda o: driver.call(  # noqa: E731
                lambda: driver.listen_items(o, timed), 60.0, what)
            # A host write's time: the run's when it is written, as in one process.
            detaches.append(self._watch_writes(path, lambda m: put((self.time_ns, m))))
        else:
            sub = driver.host.subscribe(path, callback, depth)
            listen = lambda o: self._listen(o, sub.put, what)  # noqa: E731
            detaches.append(self._watch_writes(path, sub.put))
        try:
            for o in self._outputs(path):
                detaches.append(listen(o))
        except BaseException:  # the run ended meanwhile: no subscription is left behind
            for undo in detaches:
                undo()
            sub.cancel()
            raise

        def detach() -> None:
            for undo in detaches:
                undo()

        sub.detach = detach
        return sub

    def watch(self, port: Port | str, *, depth: int = HOST_QUEUE_DEPTH,
              with_time: bool = False, messages: bool = True) -> Watch:
        """Keep the later messages of a port in a bounded queue (as `Run.watch`).

        The listeners run on the driver's thread as it routes each message the
        port's group publishes (and on the writing thread for a host write):
        they append it to the watch's queue and nothing more. With
        ``with_time``, the send's time that the group sends with each message.
        """
        self._check_caller("watch()")
        path = self._path(port)
        what = f"watch({path!r})"
        depth = check_depth(what, depth)
        check_watch(what, with_time, messages)
        driver = self._driver
        # Published messages come decoded, shared with the other listeners: the host's
        # copy is a plain one (take(copy=False): the message as it came).
        watch = Watch(driver.host, path, depth, with_time, messages, copy_message)
        driver.host.add_watch(watch)  # refused once the run has ended
        put, count = watch._put, watch._count
        detaches: list[Callable[[], None]] = []
        listen: Callable[[str], Callable[[], None]]
        written: Callable[[Any], None]
        if not with_time:
            def routed(message: Any) -> None:
                put(message)
                count()

            listen = lambda o: self._listen(o, routed, what)  # noqa: E731
            written = routed
        else:
            def item(published: tuple[int, int, int, int, Any]) -> None:
                put((published[0], published[4]) if messages else published[0])
                count()

            def written(message: Any) -> None:  # a host write: the run's time then
                put((self.time_ns, message) if messages else self.time_ns)
                count()

            listen = lambda o: driver.call(  # noqa: E731
                lambda: driver.listen_items(o, item), 60.0, what)
        detaches.append(self._watch_writes(path, written))
        try:
            for o in self._outputs(path):
                detaches.append(listen(o))
        except BaseException:  # the run ended meanwhile: no listener is left behind
            for undo in detaches:
                undo()
            watch.cancel()
            raise

        def detach() -> None:
            for undo in detaches:
                undo()

        watch.detach = detach
        return watch

    def _listen(self, output: str, listener: Callable[[Any], None],
                what: str) -> Callable[[], None]:
        """Attach ``listener`` to an Output in whichever group runs it (on the driver)."""
        driver = self._driver
        return driver.call(lambda: driver.listen(output, listener), 60.0, what)

    def _outputs(self, path: str) -> list[str]:
        port = self._ports[path]
        if isinstance(port, Output):
            return [path]
        return [s.path for s in port._sources]  # type: ignore[attr-defined]

    def wait_for(self, port: Port | str, predicate: Callable[[Any], bool] | None = None,
                 timeout: float | None = None, *, depth: int = HOST_QUEUE_DEPTH) -> Any:
        """Wait for the first later message of a port that matches (as `Run.wait_for`)."""
        self._check_caller("wait_for()")
        path = self._path(port)
        what = f"wait_for({path!r})"
        waiter = Waiter(path, what, check_depth(what, depth))
        deadline = None if timeout is None else time.monotonic() + timeout
        detaches = [self._listen(o, waiter.put, what) for o in self._outputs(path)]
        detaches.append(self._watch_writes(path, waiter.put))
        try:
            self._driver.host.add_waiter(waiter)
            while True:
                ok, message = waiter.get(deadline)
                if not ok or (deadline is not None and time.monotonic() > deadline):
                    raise TimeoutError(f"{what}: no match within {timeout} s"
                                       + waiter.drops_note())
                # As `Run.wait_for`: the predicate gets a copy of its own, which it may
                # change (the published message is shared with the other listeners).
                message = copy_message(message)
                if predicate is None or predicate(message):
                    return message
        finally:
            for undo in detaches:
                undo()
            self._driver.host.remove_waiter(waiter)

    def state_dict(self, timeout: float | None = None) -> dict[str, Any]:
        """One state tree of every group, taken at a consistent cut (as `Run.state_dict`).

        Every group finishes the latest instant any group has reached, the
        messages between groups are delivered, and each group's part is taken
        there; the parts form one tree in the format of one process
        (docs/state.md), which restores into any placement. After the end:
        the final state.

        Raises:
            TimeoutError: no cut within ``timeout``.
            NodeError: a node's ``state_dict`` raised.
        """
        self._check_caller("state_dict()")
        drv = self._driver
        if not drv.ended.is_set() and not drv.ending:
            try:
                return drv.call(lambda: drv.cut(timeout), timeout, "state_dict()")
            except NotRunningError:
                pass
        if not drv.ended.wait(None if timeout is None else timeout):
            raise TimeoutError(f"state_dict(): the run did not end within {timeout} s")
        if drv.final_error is not None:
            raise drv.final_error
        if drv.final_tree is None:
            raise NodeError("", "state_dict", "state_dict(): the final state could not be taken "
                            "(a group was stuck or had died)")
        return drv.final_tree

    # -- stats ------------------------------------------------------------------------------
    def stats(self) -> RunStats:
        """Statistics of every node, group process and machine (`RunStats.groups`,
        `RunStats.machines`)."""
        drv = self._driver
        if drv.ended.is_set() or drv.ending:
            drv.ended.wait(4 * drv.stop_timeout + 30.0)
            raw = drv.final_stats or {}
        else:
            try:
                raw = drv.call(drv.group_stats, 60.0, "stats()")
            except NotRunningError:
                drv.ended.wait(4 * drv.stop_timeout + 30.0)
                raw = drv.final_stats or {}
        nodes = {}
        groups = {}
        syncs = {}
        for name, g in raw.items():
            for path, s in g.get("syncs", {}).items():
                syncs[path] = SyncStats(**s)
            for path, n in g["nodes"].items():
                late = n["lateness"]
                nodes[path] = NodeStats(
                    path=path, updates=n["updates"], overruns=n["overruns"],
                    dt_mean=n["dt_sum"] / n["updates"] if n["updates"] and n["timed"] else 0.0,
                    dt_max=n["dt_max"], lateness_p50=percentile(late, 50) / 1e9,
                    lateness_p99=percentile(late, 99) / 1e9, hook_time=n["hook_ns"] / 1e9,
                    drops=n["drops"], restarts=drv.recovery.restarts.get(path, 0),
                    budget_misses=n["budget_misses"], deadline_misses=n["deadline_misses"])
            clock = g.get("clock") or {}
            groups[name] = GroupStats(
                name=name, pid=g["pid"], cpu_time=g["cpu"], nodes=tuple(g["nodes"]),
                messages_in=g["messages_in"], messages_out=g["messages_out"],
                bytes_in=g["bytes_in"], bytes_out=g["bytes_out"],
                drops=sum(sum(n["drops"].values()) for n in g["nodes"].values()),
                machine=g.get("machine", ""), clock_offset_ns=clock.get("offset_ns"),
                clock_uncertainty_ns=clock.get("uncertainty_ns"), rtt_ns=clock.get("rtt_ns"),
                refused=g.get("refused", 0),
                cuda_ipc=MappingProxyType(g["cuda_ipc"]) if g.get("cuda_ipc") else None)
        wall = (drv.end_wall or time.monotonic()) - drv.start_wall
        ordered = {p: nodes[p] for p, _ in self._found if p in nodes}
        kept = drv.recovery.snapshots
        snaps = kept.stats() if kept is not None else SnapshotStats()
        recording = None if drv.recorder is None else drv.recorder.stats()
        return RunStats(time=self.time, wall=wall, nodes=ordered, workers={},
                        snapshots=snaps, subscriptions=drv.host.stats(), groups=groups,
                        machines=machine_stats(groups, raw), recording=recording, syncs=syncs)

    def __repr__(self) -> str:
        state = "running" if self.running else "ended"
        return (f"<PlacedRun {state} t={self.time:.6f}s nodes={len(self._found)} "
                f"groups={len(self._driver.groups)}>")


def machine_stats(groups: Mapping[str, GroupStats],
                  raw: Mapping[str, Mapping[str, Any]]) -> dict[str, MachineStats]:
    """Each machine's figures from its groups' (`MachineStats`): the host's ``""`` first.

    A machine's bytes are those that crossed the network into it or out of
    it: a member's, its groups' bytes on their links to the host and on their
    peer links to groups of other machines; the host's machine's, the mirror
    (every member group's bytes on its link to the host, and the peer links
    between the host's machine's groups and the members'). A peer link between
    two groups of one machine crosses no network. A member's clock is the
    estimate of its group with the tightest bound (its processes share one
    clock).

    A machine's message ages (real time) are those of the messages its groups
    sent to groups of other machines, each measured where it first arrived
    on another machine: at the host's relay (a member's groups' messages the
    host relays: ``"ages"``, the host's clock less the member's, so the
    member's offset is added) or at the reading group over a peer link (any
    machine's groups', the host's machine's too: the reader's
    ``"peer_ages"``, its clock less the sender's, so the reader's offset is
    taken off and the sender's added; the host's machine's offset is 0). A
    ring whose offsets are not known yet (no heartbeat answer) is left out.
    Messages between groups of one machine, and the host's own messages to
    the members, are not measured.

    Args:
        groups (Mapping[str, GroupStats]): the run's groups, by name.
        raw (Mapping[str, Mapping]): the driver's plain figures of the same
            groups (`driver._Driver.group_stats`): ``"host"``, where its bytes
            went (``"link_bytes"``: ``[in, out]`` on the link to the host;
            ``"peer_bytes"``: peer -> ``[in, out]``; without them, every byte
            is taken to be on the link to the host), and for a group on
            another machine ``"heartbeat_in"``, ``"heartbeat_out"`` (bytes)
            and, in real time, ``"ages"`` (raw ages at the host's relay, ns,
            `realtime.MessageAges`); in real time, any group's ``"peer_ages"``
            (sending machine -> raw ages on its peer links, ns, `peers.AgeRing`).

    Returns:
        dict[str, MachineStats]: by machine name.
    """
    on: dict[str, list[GroupStats]] = {"": []}
    for g in groups.values():
        on.setdefault(g.machine, []).append(g)
    machine = {g.name: g.machine for g in groups.values()}

    def host_link(g: GroupStats) -> tuple[int, int]:
        own = raw.get(g.name, {}).get("link_bytes")
        return (g.bytes_in, g.bytes_out) if own is None else (own[0], own[1])

    def across(g: GroupStats, where: Callable[[str], bool]) -> tuple[int, int]:
        """The bytes in and out of ``g``'s peer links to the groups where ``where`` holds."""
        ins = outs = 0
        for peer, (b_in, b_out) in raw.get(g.name, {}).get("peer_bytes", {}).items():
            if where(machine.get(peer, "")):
                ins, outs = ins + b_in, outs + b_out
        return ins, outs

    clock: dict[str, GroupStats | None] = {}  # each member's group with the tightest bound
    offsets: dict[str, int | None] = {"": 0}  # each machine's clock minus the host's
    for name, gs in on.items():
        if name:
            clocked = [g for g in gs if g.clock_uncertainty_ns is not None]
            best = min(clocked, key=lambda g: g.clock_uncertainty_ns or 0, default=None)
            clock[name] = best
            offsets[name] = None if best is None else best.clock_offset_ns
    ages: dict[str, list[float]] = {name: [] for name in on}  # by sending machine
    for name, gs in on.items():
        at = offsets[name]  # the clock the group's rings were noted on
        for g in gs:
            own = raw.get(g.name, {})
            if name and at is not None:  # its messages at the host's relay
                ages[name] += [a + at for a in own.get("ages", ())]
            for sender, raw_ages in own.get("peer_ages", {}).items():  # at g, on peer links
                there = offsets.get(sender)
                if at is None or there is None or sender == name or sender not in ages:
                    continue
                ages[sender] += [a - at + there for a in raw_ages]

    def p50_p99(name: str) -> tuple[float | None, float | None]:
        kept = sorted(ages[name])
        if not kept:
            return None, None
        return percentile(kept, 50) / 1e9, percentile(kept, 99) / 1e9

    members = {}
    for name, gs in on.items():
        if not name:
            continue
        best = clock[name]
        offset = offsets[name]
        figures = [raw.get(g.name, {}) for g in gs]
        crossed = [(host_link(g), across(g, functools.partial(operator.ne, name)))
                   for g in gs]
        members[name] = MachineStats(
            name=name, hostname=next((f["host"] for f in figures if f.get("host")), ""),
            groups=tuple(g.name for g in gs), pids=tuple(g.pid for g in gs),
            cpu_time=sum(g.cpu_time for g in gs),
            bytes_in=sum(h[0] + p[0] for h, p in crossed),
            bytes_out=sum(h[1] + p[1] for h, p in crossed),
            heartbeat_bytes_in=sum(f.get("heartbeat_in", 0) for f in figures),
            heartbeat_bytes_out=sum(f.get("heartbeat_out", 0) for f in figures),
            clock_offset_ns=offset,
            clock_uncertainty_ns=None if best is None else best.clock_uncertainty_ns,
            rtt_ns=None if best is None else best.rtt_ns,
            message_age_p50=p50_p99(name)[0], message_age_p99=p50_p99(name)[1],
            refused=sum(g.refused for g in gs))
    here = on[""]
    them = members.values()
    # The mirror of the members' links to the host, and the host's machine's groups'
    # peer links to the members' groups.
    links = [host_link(g) for n, gs in on.items() if n for g in gs]
    peered = [across(g, bool) for g in here]
    host = MachineStats(
        name="", hostname=socket.gethostname(), groups=tuple(g.name for g in here),
        pids=tuple(g.pid for g in here), cpu_time=sum(g.cpu_time for g in here),
        bytes_in=sum(b[1] for b in links) + sum(p[0] for p in peered),
        bytes_out=sum(b[0] for b in links) + sum(p[1] for p in peered),
        heartbeat_bytes_in=sum(m.heartbeat_bytes_out for m in them),
        heartbeat_bytes_out=sum(m.heartbeat_bytes_in for m in them),
        message_age_p50=p50_p99("")[0], message_age_p99=p50_p99("")[1],
        refused=sum(m.refused for m in them) + sum(g.refused for g in here))
    return {"": host, **members}
