"""The driver of a placed run: the host's one thread that talks to every group.

`_Driver` moves the run's time through its strategy, ``timing``: the
conservative protocol's rounds in simulated time (`rounds.SimulatedRounds`,
whose docstring gives the protocol), or the relay of messages in real time
(`realtime.RealTimeRelay`). Whatever the time, it carries out the host's
calls between two rounds, the supervisor's snapshots and restarts across
groups, and the end (every group's ``on_stop``, the final state, the
processes shut down). `placed.py` builds it; `placed_run.PlacedRun` is the
host's API over it.

Host calls (state_dict, write, read, subscribe, stats, stop) are queued to
the driver and run between two rounds: a cut (`state_dict`) caps the bounds
at the latest instant any group has reached, lets every group finish it,
and takes each group's tree there (messages between groups are all
delivered by then, so the merged tree holds them in their readers' Inputs).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from .._runtime.kernel import LAST_DELTA, Kernel
from .._runtime.keys import Key
from .._runtime.protocols import RecorderSide
from ..errors import (
    CallbackError,
    GroupDied,
    NotRunningError,
    RemoteError,
    StartTimeoutError,
    describe,
)
from ..host import Host, Subscription
from ..messages import copy_message
from ..node import Node
from ..params import join
from ..ports import Input, Port
from ..supervisor import Supervisor
from . import control, dataplane, group, grouplog, segments, tracing
from .dataplane import Item
from .ending import Ending
from .failures import Failed, GroupLost, Lost, RemoteTraceback, Stuck, node_error
from .placement import HOST_GROUP
from .realtime import MessageAges, PeerRelay, RealTimeRelay
from .recovery import Recovery
from .rounds import SimulatedRounds
from .segments import Segments

__all__ = ["RemoteTraceback"]

log = logging.getLogger("mujou_actors")

POLL_S = 0.05  # how often a waiting driver looks at exits and a stop
# The end's waits for hooks in flight (a real-time hold, a grant, each group's stop) share
# one stop_timeout (`_Driver._stop_left`); each still gets at least this much, so that a
# hook a moment from its return, in a group asked after the time ran out, is not "stuck".
STOP_FLOOR_S = 0.1

@dataclasses.dataclass
class _Group:
    """The driver's view of one group: its link, its next due key, what waits for it."""

    name: str
    link: Any  # dataplane.HostLink, or group.LocalLink for the host's own group
    nodes: list[str]
    pid: int
    due: Key | None = None
    time_ns: int = 0
    frontier: Key = (-1, 0)
    queued: list[dataplane.Item] = dataclasses.field(default_factory=list)
    waiting: bool = False  # a grant was sent, no reply yet
    remote: bool = True
    spawn: dict[str, Any] = dataclasses.field(default_factory=dict)  # start_group's kwargs
    launches: int = 1
    base_address: str = ""
    member: str | None = None  # the convention member (machine) it runs on; None: here
    key: bytes | None = None  # the data plane's secret, for a group on a member
    watched_ns: int = 0  # when the heartbeat began to watch its latest process (monotonic)
    refused: int = 0  # connections its closed links refused (dataplane.HostLink.refused)
    # Real time, on another machine: its messages' raw ages (realtime.MessageAges), from
    # its process's timer origin; None until that process runs free.
    ages: MessageAges | None = None
    # What the driver asks of it (control.GroupControl): set by the driver, local or remote.
    control: Any = None


class _Driver:
    """Everything of a placed run that lives in the host (see the module's docstring)."""

    def __init__(self, *, system: Any, groups: dict[str, _Group], routes: dataplane.Routes,
                 ports: dict[str, Port], owner: dict[str, str], found: list[tuple[str, Node]],
                 seeds: dict[str, int], end_ns: int | None, stop_timeout: float,
                 tmpdir: str, local: Kernel | None, supervisor: Supervisor | None = None,
                 start_timeout: float = 60.0, rebuild: Callable[[], Kernel] | None = None,
                 signature: list[list[Any]] | None = None, realtime: bool = False,
                 wake: dataplane.Wake | None = None, run_id: str | None = None,
                 trace: tracing.PlacedTrace | None = None, monitor: Any = None,
                 choose_member: Callable[[str], str] | None = None,
                 peer_host: Callable[[str, str], str] | None = None) -> None:
        self.system = system
        # Where a group on machine m listens for a peer link toward machine n
        # (`peers.CrossLinks`): the address m advertises; None: loopback.
        self.peer_host = peer_host
        # Port messages the driver passed from one group to another (each reading group
        # counts one): none where peer links carry them (`_route`).
        self.relayed = 0
        self.trace = trace  # a traced run's (written at the end: Ending._trace_writer)
        self.run_id = run_id
        self.stop_asked = threading.Event()
        # How the run's time moves (see the module's docstring): asked, never tested.
        self.wake = wake if wake is not None else dataplane.Wake()
        self.start_ns = 0
        self.start_mono_ns = time.monotonic_ns()
        self.clock_started = False
        # The end's one stop_timeout for the hooks in flight: its deadline, set as the end
        # begins (`_end_begins`), taken back by a restore (the end begins again after it).
        self._stop_deadline: float | None = None
        for g in groups.values():
            if not g.remote:
                g.link.keep_waiting = self.keep_waiting
                g.control = control.LocalControl(g)
            else:  # a grant to a dead group cannot go: the send looks for the death
                g.link.blocked = self._check_exits
                g.control = control.RemoteControl(self.ask, g.name)
        self.start_timeout = start_timeout
        self.groups = groups
        # The supervisor's side: its snapshots across groups, and the restarts.
        self.recovery = Recovery(self, supervisor, ports, stop_timeout, rebuild, signature,
                                 choose_member)
        # The heartbeat of the groups on other machines (`heartbeat.Monitor`), or None;
        # and where a group on another machine restarts (placed._Convention.choose).
        self.monitor = monitor
        self.routes = routes
        self.ports = ports
        self.owner = owner  # node path -> group
        self.found = found
        self.seeds = seeds
        self.end_key: Key | None = None if end_ns is None else (end_ns, LAST_DELTA)
        self.end_ns = end_ns
        self.stop_timeout = stop_timeout
        self.tmpdir = tmpdir
        self.kernel = local
        self.requests: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.ended = threading.Event()
        self.ending = False
        self.failures: list[BaseException] = []
        self.final_tree: dict[str, Any] | None = None
        self.final_error: BaseException | None = None
        self.reported = False
        self.time_ns = 0
        self.start_wall = time.monotonic()
        self.end_wall: float | None = None
        self.listeners: dict[int, list[Callable[[Any], None]]] = {}
        # A recording's listeners, called with the whole published item (its key too), and
        # the recording (placed.py attaches it; the end closes it).
        self.item_listeners: dict[int, list[Callable[[Item], None]]] = {}
        self.recorder: RecorderSide | None = None
        self.param_log: dict[str, Any] = {}  # the latest set of each parameter, by path
        # The groups' log records for the host's log taps, while it has one (grouplog.py).
        self.logs = grouplog.Forwarding(self)
        self.host = Host(copy_message, self._callback_failed)
        self.rounds_started = self.rounds_ended = 0.0
        self.stuck: dict[str, str] = {}
        self.dead: set[str] = set()  # groups whose process died, not restarted
        self._last_stats: dict[str, dict[str, Any]] = {}
        self._readers_cache: dict[int, list[tuple[_Group, bool]]] = {}
        self.final_stats: dict[str, dict[str, Any]] | None = None
        self.end = Ending(self)  # the last cut, every group's stop, the final tree
        self.order = [p for p, _ in found]
        # How the run's time moves (see the module's docstring): asked, never tested.
        # Peer links where they apply (peers.py; segments.py in simulated time), unless
        # MUJOU_PEER_LINKS=0 keeps the host on every message's path.
        on_peers = os.environ.get(segments.ENV) != "0"
        self.timing: SimulatedRounds | RealTimeRelay = (
            (PeerRelay(self) if on_peers else RealTimeRelay(self)) if realtime
            else Segments(self) if on_peers else SimulatedRounds(self))
        # The host's own group's watchdog (group processes run their own): a hook that
        # does not return is logged, as in one process. Started with the driver's thread
        # (`_main`), so that a start that fails before leaves no thread behind.
        self._watcher: group.Watcher | None = None
        self.thread = threading.Thread(target=self._main, name="mujou-driver", daemon=True)

    # -- the rounds ---------------------------------------------------------------------
    def _main(self) -> None:
        self.rounds_started = time.perf_counter()
        if self.kernel is not None:
            self._watcher = group.Watcher(self.kernel, self.stop_timeout, HOST_GROUP)
        try:
            while True:
                try:
                    # The supervisor's first snapshot, unless the start took it (real time,
                    # before the clocks ran): a group found dead in it is the supervisor's
                    # as anywhere (no snapshot yet to restore from: the run fails with it).
                    self._died_as_exit(lambda: self.recovery.first_snapshot(self.time_ns))
                    self._died_as_exit(self.timing.run)
                    # The end's cut is taken before any group stops, as a round would
                    # be: a group found dead there (a death racing the end) is
                    # restored by the supervisor, and the run finished, like any other.
                    self._died_as_exit(self.end.last_cut)
                    self.end.cut_done = True
                    break
                except (Failed, GroupLost) as failed:
                    if not self.recovery.supervise(failed):
                        break
        except Stuck as stuck:
            self.stuck.update(stuck.busy)
        except BaseException as exc:  # the run fails with it; never swallowed
            self.failures.append(exc)
            log.error("placed run: the driver failed: %s", describe(exc), exc_info=exc)
        finally:
            self.end.finish()

    def _died_as_exit(self, fn: Callable[[], Any]) -> Any:
        """``fn()``, with a `GroupDied` of one of the run's groups (a control request
        found it dead, or lost) raised as the `GroupLost` that the supervisor takes."""
        try:
            return fn()
        except GroupDied as died:
            if died.group not in self.groups:
                raise
            raise GroupLost(Lost(died.group, died.pid or 0, died.reason)) from died

    # -- the supervisor -------------------------------------------------------------------
    def now_ns(self) -> int:
        """The latest time any group has reached (the snapshots' timer)."""
        return self.time_ns

    def keep_waiting(self) -> bool:
        """Whether the host's own group may keep waiting for a delta cycle (no stop due).

        After a stop, hooks in flight get what is left of the end's one
        ``stop_timeout`` (`_stop_left`); then the wait ends (a stuck hook in
        the host's group is reported as stuck).
        """
        return not self.stop_asked.is_set() or self._stop_left() > 0

    def _end_begins(self) -> None:
        """Start the end's one ``stop_timeout`` for the hooks in flight (once).

        Called where the end is first seen: a stop found by a wait, the end's
        cut, `Ending.finish`. One process gives the hooks in flight one
        ``stop_timeout`` in all; so does a placed run, whose end waits for
        them in several steps (a real-time hold, a grant, each group's stop):
        each gets what is left (issue 28, item 5).
        """
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + self.stop_timeout

    def _stop_left(self) -> float:
        """Wall seconds left of the end's one ``stop_timeout`` (it begins now if not yet)."""
        self._end_begins()
        assert self._stop_deadline is not None
        return max(0.0, self._stop_deadline - time.monotonic())

    def _idle_left(self) -> float:
        """What a group's stop gives its hooks in flight: `_stop_left`, at least `STOP_FLOOR_S`."""
        return max(self._stop_left(), STOP_FLOOR_S)

    def _wait_for_request(self) -> None:
        """Serve the next host request, waiting up to `POLL_S` for one (a group's death
        found meanwhile is raised, as between rounds)."""
        try:
            job = self.requests.get(timeout=POLL_S)
        except queue.Empty:
            self._check_exits()
            return
        job()

    def _serve_requests(self) -> None:
        """Serve the host's requests queued; take the groups' log records when due."""
        self.logs.poll()
        while True:
            try:
                job = self.requests.get_nowait()
            except queue.Empty:
                return
            job()

    def _route(self, g: _Group, reply: dataplane.Reply) -> None:
        """Pass a group's sends on to their readers' groups, and to the host's listeners.

        They wait for the reader's next grant (simulated time) or the relay's
        next push (real time); where the timing lowers next keys (simulated),
        a triggered reader's group is due at the delta cycle after the send.
        """
        listeners, item_listeners = self.listeners, self.item_listeners
        for item in reply.published:
            for listener in listeners.get(item[3], ()):
                listener(item[4])
            for item_listener in item_listeners.get(item[3], ()):
                item_listener(item)
        lowers = self.timing.lowers_due
        for item in reply.sends:
            t, delta, _, output, _ = item
            key = (t, delta + 1)
            for h, triggers in self._reader_groups(output):
                if h is g:
                    continue
                h.queued.append(item)
                self.relayed += 1
                # Only a triggering reader has work at the next delta cycle; the
                # others take the message in with their next grant, before any key.
                if triggers and lowers and (h.due is None or key < h.due):
                    h.due = key

    def _reader_groups(self, output: int) -> list[tuple[_Group, bool]]:
        """The groups that read an Output, each with whether a reader there is triggered."""
        cached = self._readers_cache.get(output)
        if cached is None:
            by_group: dict[str, bool] = {}
            triggering = self.routes.triggering[output]
            for reader in self.routes.readers[output]:
                name = self.owner[reader.rpartition(".")[0]]
                by_group[name] = by_group.get(name, False) or reader in triggering
            cached = self._readers_cache[output] = [(self.groups[n], by_group[n])
                                                    for n in sorted(by_group)]
        return cached

    def _check_exits(self) -> None:
        """Raise `GroupLost` for a group process found ended, or on another machine lost."""
        if self.monitor is not None:
            for change in self.monitor.take_changes():
                g = self.groups.get(change.name)
                # (A loss whose silence began before the group's latest process was
                # watched is its former process's, found while it was replaced.)
                if change.lost and g is not None \
                        and change.at_ns - change.silent_ns >= g.watched_ns:
                    reason = (f"lost: machine {g.member!r} did not answer the heartbeat for "
                              f"{change.silent_ns / 1e9:.2f} s")
                    self.system.lost(g.name, reason)
                    raise GroupLost(Lost(g.name, g.pid, reason))
        take = getattr(self.system, "take_exits", None)
        if take is None:
            return
        for exit_ in take():
            g = self.groups.get(exit_.group)
            if g is not None and exit_.pid and g.pid and exit_.pid != g.pid:
                # A former process's notice, come after a request had found it dead and
                # the supervisor had restarted it: that death is restored already.
                continue
            raise GroupLost(exit_)

    def ask(self, name: str, request: Any, timeout: float) -> Any:
        """A control request to group ``name`` (``system.ask``): every one goes here.

        Raises:
            NodeError: a node's hook raised in it (`group.NodeFailed`), as the
                data plane reports one: path, hook, group, remote traceback.
            StartTimeoutError: the group's start or restore timed out (its
                nodes named), as one process raises it.
            RemoteError, GroupDied, TimeoutError: see `system.ProcessSystem.ask`.
        """
        try:
            return self.system.ask(name, request, timeout)
        except RemoteError as exc:
            if isinstance(exc.exception, StartTimeoutError):
                # The group's start or restore timed out: what one process raises.
                raise exc.exception from exc
            if not isinstance(exc.exception, group.NodeFailed):
                raise
            failure = exc.exception.failure
        raise node_error(name, failure)

    def start_phase(self, initial: list[tuple[Input, Any]], tree: dict[str, Any] | None,
                    start_timeout: float) -> None:
        """on_start everywhere, the tree, on_start's messages, ``inputs=``, the first keys.

        Also a restart's second half, after every group's kernel was rebuilt.
        """
        deadline = time.monotonic() + start_timeout
        left = lambda: max(0.1, deadline - time.monotonic())  # noqa: E731
        for g in self.groups.values():
            g.ages = None  # a restart's processes stamp on timers of their own (start_timers)
        self.logs.start()  # before on_start: its records are forwarded to the taps too
        for g in self.groups.values():
            g.control.start(left())
        if tree is None:
            try:
                self.timing.start_sends(left())  # what on_start sent, before any timer starts
            except Failed as failed:
                # An on_start that raised, seen on the data plane before its group's answer
                # to Start said so (real time: the group reports as it goes): mujou.run
                # raises the NodeError itself, as one process does.
                raise failed.error from failed.error.__cause__
        else:
            for g in self.groups.values():
                g.control.load(group.split_tree(tree, set(g.nodes)), left())
                g.queued = []
        for port, value in initial:
            self.write(port.path, value, initial=True)
        self.timing.start_timers(tree)
        self.time_ns = tree["time_ns"] if tree is not None else 0

    # -- requests from the host ---------------------------------------------------------
    def call(self, fn: Callable[[], Any], timeout: float | None, what: str) -> Any:
        """Run ``fn`` on the driver's thread between two rounds; its result.

        Raises:
            NotRunningError: the run has ended (or ends before ``fn`` ran).
            TimeoutError: ``fn`` did not run within ``timeout``.
        """
        if threading.current_thread() is self.thread:
            return fn()
        done = threading.Event()
        box: dict[str, Any] = {}

        def job() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the caller
                box["error"] = exc
            finally:
                done.set()

        if self.ended.is_set() or self.ending:
            raise NotRunningError(f"{what}: the run has ended")
        self.requests.put(job)
        self.timing.wake()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done.wait(POLL_S):
            if self.ended.is_set():
                self._serve_late()
                if done.is_set():
                    break
                raise NotRunningError(f"{what}: the run ended first")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not done within {timeout:g} s")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def _serve_late(self) -> None:
        """Requests queued as the run ended: refused (they would talk to no one)."""

    def cut(self, timeout: float | None) -> dict[str, Any]:
        """The state tree of every group at a consistent cut (on the driver's thread)."""
        return self.timing.cut(timeout)

    def _gather(self, t: int, timeout: float | None) -> dict[str, Any]:
        limit = 60.0 if timeout is None else timeout
        trees = [g.control.take_state(limit) for g in self.groups.values()]
        return group.merge_trees(trees, t, self.order)

    def write(self, path: str, message: Any, initial: bool = False) -> None:
        """Deliver a host write to the Input's group, then refresh its next key.

        It comes in at the latest delta cycle any group has entered (as a host
        write in one process comes in at the run's frontier): no group has
        run past it, so the message and what it triggers sort as they would
        in one process at that point.

        ``initial``: a write of ``inputs=``, before the timers start, as in
        one process; the group is not refreshed (that would start its timer,
        and its next write would come in at the timer's first delta cycle,
        after what ``on_start`` sent): the start phase refreshes every group
        once all are written.
        """
        g = self.groups[self.owner[path.rpartition(".")[0]]]
        # None: the timers have not started (inputs=), or real time: as in one process.
        g.control.write(path, message, None if initial else self.timing.write_key())
        if not initial:
            self.timing.written(g)

    def set_param(self, node: str, name: str, value: Any) -> Key:
        """Queue a checked parameter set in the node's group; the key it applies from.

        In simulated time the key is the delta cycle after the latest any
        group has entered (as a host write's, plus one: the next delta cycle,
        as in one process), so no group has run an update at or past it; the
        key is None before the timers start and in real time, where the
        group's kernel picks it.
        """
        key = self.timing.write_key()
        if key is not None:
            key = (key[0], key[1] + 1)
        applies = self.groups[self.owner[node]].control.set_param(node, name, value, key)
        self.param_log[join(node, name)] = value  # what a rebuilt group keeps (recovery.py)
        return applies

    def params(self) -> dict[str, Any]:
        """Every parameter's value now, asked of each group that has some."""
        values: dict[str, Any] = {}
        for g in self.groups.values():
            values.update(g.control.params())
        return values

    def read(self, path: str) -> Any:
        owner = self.ports[path].node._mujou_path
        return self.groups[self.owner[owner]].control.read(path)

    def listen(self, output: str, listener: Callable[[Any], None]) -> Callable[[], None]:
        """Make the Output's group publish it; call ``listener`` with every message."""
        index = self.routes.output_index[output]
        g = self.groups[self.owner[self.ports[output].node._mujou_path]]
        if index not in self.listeners:
            g.control.subscribe(output)
        self.listeners[index] = self.listeners.get(index, []) + [listener]

        def detach() -> None:
            self.listeners[index] = [x for x in self.listeners.get(index, [])
                                     if x is not listener]

        return detach

    def listen_items(self, output: str,
                     listener: Callable[[Item], None]) -> Callable[[], None]:
        """Make the Output's group publish it; call ``listener`` with every published item.

        An item is ``(t_ns, delta, sender order, output index, message)`` (a
        recording's listener: `recording.Recorder.item_hook`; a subscription
        ``with_time``); it is called on the driver's thread as the item is
        routed. Returns the function that detaches it.
        """
        index = self.routes.output_index[output]
        g = self.groups[self.owner[self.ports[output].node._mujou_path]]
        if index not in self.listeners and index not in self.item_listeners:
            g.control.subscribe(output)
        self.item_listeners[index] = self.item_listeners.get(index, []) + [listener]

        def detach() -> None:
            self.item_listeners[index] = [x for x in self.item_listeners.get(index, [])
                                          if x is not listener]

        return detach

    def group_stats(self, strict: bool = False) -> dict[str, dict[str, Any]]:
        """Every group's figures, as plain data; a dead group's are its last ones known.

        A group whose process is found gone here is not marked dead: its
        death reaches the driver as every death does (`_check_exits`), which
        hands it to the supervisor, and the restarted group answers the next
        call. (A host's ``stats()`` polled while a group restarted used to
        mark it dead for good, and the run ended without its final state.)
        ``strict``: raise the `GroupDied` instead (the end's cut: `Ending.last_cut`).

        Every group's ``"refused"`` counts the connections its own listening
        ends of peer links to other machines refused (``"peer_refused"``:
        the CURVE handshake failed). A group on another machine's have its
        ``"machine"``, the connections the host's ends of its links refused
        (in ``"refused"`` too), its heartbeat's
        frame bytes (``"heartbeat_in"``: the pings to it, ``"heartbeat_out"``:
        its answers), its clock (``"clock"``, once it answered) and, in real
        time, the raw ages of its newest messages (``"ages"``, ns, the clock
        offset not added: `realtime.MessageAges`).
        """
        out = {}
        for g in self.groups.values():
            if g.remote:
                if g.name in self.dead:
                    if g.name in self._last_stats:
                        out[g.name] = self._last_stats[g.name]
                    continue
                try:
                    out[g.name] = self._last_stats[g.name] = g.control.stats()
                except GroupDied:
                    if strict:
                        raise
                    if g.name in self._last_stats:
                        out[g.name] = self._last_stats[g.name]
            else:
                out[g.name] = g.control.stats()
        if self.monitor is not None:
            members = self.monitor.members()
            for name, figures in out.items():
                g = self.groups[name]
                if g.member is None:
                    continue
                figures = out[name] = {**figures, "machine": g.member,
                                       "refused": g.refused + g.link.refused}
                if g.ages is not None:
                    figures["ages"] = g.ages.raw()
                status = members.get(name)
                if status is not None:
                    figures["heartbeat_in"] = status.bytes_sent
                    figures["heartbeat_out"] = status.bytes_received
                if status is not None and status.offset is not None:
                    figures["clock"] = {"offset_ns": status.offset.offset_ns,
                                        "uncertainty_ns": status.offset.uncertainty_ns,
                                        "rtt_ns": status.rtt_ns}
        for name, figures in out.items():
            if figures.get("peer_refused"):
                out[name] = {**figures, "refused": figures.get("refused", 0)
                             + figures["peer_refused"]}
        return out

    # -- the end ------------------------------------------------------------------------
    def _callback_failed(self, sub: Subscription, exc: BaseException) -> None:
        err = CallbackError(f"subscriber of {sub.port!r} raised {describe(exc)}")
        err.__cause__ = exc
        self.failures.append(err)
        self.stop_asked.set()
