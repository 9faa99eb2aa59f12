"""The driver of a placed run: the host's one thread that talks to every group.

`_Driver` runs the global delta cycles of a simulated placed run (the
conservative protocol below), or relays messages in real time
(`realtime.py`); it carries out the host's calls between two rounds, the
supervisor's snapshots and restarts across groups, and the end (every
group's ``on_stop``, the final state, the processes shut down). `placed.py`
builds it; `placed_run.PlacedRun` is the host's API over it.

The protocol (simulated time) is conservative and centralised. The driver
knows each group's next due key. In a *round* it grants each group whose
next key is no later than every other group's next key the right to run its
delta cycles up to that bound (inclusive): the others' messages can only
arrive one delta cycle after a key they run, so nothing can reach the group
below its bound. A group stops early after a delta cycle whose sends leave
it; the driver carries those messages to their readers' groups (lowering
the next key of a group whose reader they trigger to the delta cycle after
the send) with the next grant. The groups granted in a round run at once, in
their processes, so groups at the same key (two nodes with the same period)
run in parallel, and a group alone ahead runs many delta cycles per round.
Every message therefore reaches its reader's kernel before the reader's
kernel runs past the message's key, stamped as in one process: the results
are bit-identical to the single-process run's, for any placement and worker
counts.

Host calls (state_dict, write, read, subscribe, stats, stop) are queued to
the driver and run between two rounds: a cut (`state_dict`) caps the bounds
at the latest instant any group has reached, lets every group finish it,
and takes each group's tree there (messages between groups are all
delivered by then, so the merged tree holds them in their readers' Inputs).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import zmq

from .. import snapshot
from .._runtime.kernel import LAST_DELTA, Kernel
from .._runtime.keys import Key
from .._runtime.protocols import RecorderSide
from .._runtime.snapshots import Snapshots
from ..devices import numerics
from ..errors import (
    AlgebraicLoopError,
    CallbackError,
    GroupDied,
    NetError,
    NodeError,
    NotRunningError,
    RemoteError,
    StartTimeoutError,
    StopTimeoutError,
    describe,
    keep_end_failure,
)
from ..host import Host, Subscription
from ..messages import copy_message
from ..net import check_file_messages
from ..node import Node
from ..ports import Input, Port
from ..supervisor import Action, RestartIntensity, Supervisor, failure_verdict
from . import control, dataplane, group, realtime, tracing, wire
from .dataplane import Item
from .placement import HOST_GROUP, signature_differences

log = logging.getLogger("mujou_actors")


__all__ = ["RemoteTraceback", "merge_trees", "check_same_net"]

log = logging.getLogger("mujou_actors")

GROUP_TARGET = "mujou_actors.distributed.group:serve"
POLL_S = 0.05  # how often a waiting driver looks at exits and a stop
# The end's waits for hooks in flight (a real-time hold, a grant, each group's stop) share
# one stop_timeout (`_Driver._stop_left`); each still gets at least this much, so that a
# hook a moment from its return, in a group asked after the time ran out, is not "stuck".
STOP_FLOOR_S = 0.1
# What a stuck group's entry of StopTimeoutError.stuck says until its stop names the hooks.
_UNKNOWN_HOOKS = "a grant (the group's hooks unknown)"

@dataclasses.dataclass
class _Group:
    """The driver's view of one group: its link, its next due key, what waits for it."""

    name: str
    link: Any  # dataplane.HostLink, or _LocalLink for the host's own group
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
    ages: realtime.MessageAges | None = None
    # What the driver asks of it (control.GroupControl): set by the driver, local or remote.
    control: Any = None


class _LocalLink:
    """The host's own group: a kernel in this process, run by the driver's thread."""

    def __init__(self, kernel: Kernel, routes: dataplane.Routes,
                 notify: Any = None, keep_waiting: Callable[[], bool] | None = None) -> None:
        self.kernel = kernel
        self.keep_waiting = keep_waiting
        self.routes = routes
        self.published = group.Published(routes, notify)
        self._reply: dataplane.Reply | None = None
        self._replies: list[dataplane.Reply] = []  # real time: markers waiting
        self.messages_in = self.messages_out = self.bytes_in = self.bytes_out = 0
        self.counted: dict[str, dict[str, Any]] | None = None  # by replaced kernels

    def send(self, grant: dataplane.Grant) -> None:
        self.messages_in += len(grant.messages)
        if not self.kernel.simulated:
            self._send_realtime(grant)
            return
        try:
            self._reply = group.run_grant(self.kernel, self.routes, grant, self.published,
                                          self.keep_waiting)
            self.messages_out += len(self._reply.sends)
        except TimeoutError:
            # A stop gave up on a hook of the host's group: the driver reports it stuck.
            raise _Stuck({a.path: f"{self.kernel.dispatcher.hook_of(a)} (in group {HOST_GROUP!r})"
                          for a in self.kernel.actors if a.busy}) from None
        except BaseException as exc:  # reported as a group's failure is, never swallowed
            self._reply = dataplane.Reply(due=None, time_ns=0, sends=[],
                                          failure=group.failure_of(exc))

    def receive(self, timeout: float) -> dataplane.Reply | None:
        if not self.kernel.simulated:
            return self._receive_realtime()
        reply, self._reply = self._reply, None
        return reply

    def _send_realtime(self, grant: dataplane.Grant) -> None:
        """Real time: deliver at once (as host writes); a flush answers with a marker."""
        kernel = self.kernel
        for t, delta, sender, output, message in grant.messages:
            for reader in self.routes.local_readers(output):
                kernel.write(reader, message, (t, delta, sender))
        if grant.take:  # what was sent so far goes first, then the marker
            shipped = group.shipped(self.kernel, self.routes, self.published)
            self.messages_out += sum(len(r.sends) for r in shipped)
            self._replies += shipped
            self._replies.append(dataplane.Reply(due=None, time_ns=kernel.time_ns, sends=[],
                                                 marker=True))

    def _receive_realtime(self) -> dataplane.Reply | None:
        """Real time: a marker waiting, or what the kernel sent, published or failed."""
        if not self._replies:
            self._replies = group.shipped(self.kernel, self.routes, self.published)
            self.messages_out += sum(len(r.sends) for r in self._replies)
        return self._replies.pop(0) if self._replies else None

    def close(self) -> None:
        pass


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
                 choose_member: Callable[[str], str] | None = None) -> None:
        self.system = system
        self.trace = trace  # a traced run's (written at the end: _write_trace)
        self.run_id = run_id
        self.stop_asked = threading.Event()
        self.realtime = realtime
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
        self.supervisor = supervisor
        self.start_timeout = start_timeout
        self._rebuild = rebuild
        self._signature = signature or []
        self.restarts: dict[str, int] = {}
        self.next_cut: int | None = None
        self.snapshots: Snapshots | None = None
        self.intensity = RestartIntensity(0, 1)
        if supervisor is not None:
            self.intensity = RestartIntensity(supervisor.max_restarts,
                                              round((supervisor.within or 0.0) * 1e9))
            snaps = Snapshots(supervisor, [], self, stop_timeout=stop_timeout,  # type: ignore[arg-type]
                              hold_at=self._hold_at, simulated=True, wake=lambda: None)
            if snaps.wanted:
                self.snapshots = snaps
                snaps.open_writer(snapshot.save, functools.partial(check_file_messages,
                                                                   ports=ports),
                                  on_error=self._writer_failed,
                                  cancelled=self.stop_asked.is_set)
        self.groups = groups
        # The heartbeat of the groups on other machines (`heartbeat.Monitor`), or None;
        # and where a group on another machine restarts (placed._Convention.choose).
        self.monitor = monitor
        self._choose_member = choose_member
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
        self.host = Host(copy_message, self._callback_failed)
        self.rounds = 0
        self.rounds_started = self.rounds_ended = 0.0
        self.stuck: dict[str, str] = {}
        self.dead: set[str] = set()  # groups whose process died, not restarted
        self.epoch = 0  # raised by every restore of all groups (HostLink.epoch)
        self._last_stats: dict[str, dict[str, Any]] = {}
        self._readers_cache: dict[int, list[tuple[_Group, bool]]] = {}
        self.final_stats: dict[str, dict[str, Any]] | None = None
        self._end_cut_done = False  # the end's cut and final stats are taken (`_end_cut`)
        self.order = [p for p, _ in found]
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
            if self.snapshots is not None:
                self._snapshot(self.time_ns)  # the first, right after the start
            while True:
                try:
                    self._died_as_exit(self._rounds)
                    # The end's cut is taken before any group stops, as a round would
                    # be: a group found dead there (a death racing the end) is
                    # restored by the supervisor, and the run finished, like any other.
                    self._died_as_exit(self._end_cut)
                    self._end_cut_done = True
                    break
                except (_Failed, _GroupDied) as failed:
                    if not self._supervise(failed):
                        break
        except _Stuck as stuck:
            self.stuck.update(stuck.busy)
        except BaseException as exc:  # the run fails with it; never swallowed
            self.failures.append(exc)
            log.error("placed run: the driver failed: %s", describe(exc), exc_info=exc)
        finally:
            self._finish()

    def _died_as_exit(self, fn: Callable[[], Any]) -> Any:
        """``fn()``, with a `GroupDied` of one of the run's groups (a control request
        found it dead, or lost) raised as the `_GroupDied` that the supervisor takes."""
        try:
            return fn()
        except GroupDied as died:
            if died.group not in self.groups:
                raise
            raise _GroupDied(_Lost(died.group, died.pid or 0, died.reason)) from died

    def _supervise(self, failed: _Failed | _GroupDied) -> bool:
        """Hand a hook's failure or a dead group to the supervisor (`_recover`); False when
        the run must end (the failure is recorded).

        A group that dies while the supervisor restores the net (its new
        machine went too: the start on it fails once it stops answering) is a
        failure of its own, handed over in turn; the restart intensity bounds
        how often.
        """
        while True:
            try:
                return bool(self._died_as_exit(functools.partial(self._supervise_one, failed)))
            except _GroupDied as again:
                failed = again

    def _supervise_one(self, failed: _Failed | _GroupDied) -> bool:
        """`_supervise` for one failure."""
        if isinstance(failed, _Failed):
            return self._recover(failed.error, failed.group, node=failed.node)
        e = failed.exit
        if self._recover(GroupDied(e.group, e.pid, e.reason), e.group, node=None):
            return True
        self.dead.add(e.group)
        return False

    def _rounds(self) -> None:
        """Rounds until the end, a stop, a failure; the supervisor's snapshots on their grid."""
        if self.realtime:
            realtime.run_rounds(self)
            return
        while not self.stop_asked.is_set():
            self._serve_requests()
            if self.stop_asked.is_set():
                return
            if self.end_key is None and all(g.due is None for g in self.groups.values()):
                # Nothing is due and there is no duration: as in one process, the run
                # waits, its time standing still, for a host write (a request) or stop().
                self._wait_for_request()
                continue
            limit = self.end_key
            snap = self.next_cut
            if snap is not None and (limit is None or (snap, LAST_DELTA) <= limit):
                limit = (snap, LAST_DELTA)
            if not self._round(limit):
                if snap is not None and limit == (snap, LAST_DELTA):
                    self._flush()
                    self._snapshot(snap)
                    continue
                return

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
        cut, `_finish`. One process gives the hooks in flight one
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

    def _hold_at(self, cut_ns: int | None) -> None:
        self.next_cut = cut_ns

    def _snapshot(self, t: int) -> None:
        """Take the supervisor's snapshot at ``t`` (every group has finished it); keep it.

        In real time the cut comes now (``t`` is its grid time): the groups are
        held and flushed first; one that cannot be held in time misses it.
        """
        assert self.snapshots is not None
        t0 = time.perf_counter()
        if self.realtime:
            try:
                tree = realtime.cut(self, self.snapshots.bound())
            except TimeoutError as exc:
                self.snapshots.miss({}, self.snapshots.bound())
                log.debug("snapshot missed: %s", exc)
                return
        else:
            tree = self._gather(t, None)
        self.time_ns = max(self.time_ns, t)
        self.snapshots.keep(tree, time.perf_counter() - t0)
        if self.recorder is not None:
            self.recorder.snapshot(tree)
        self.snapshots.schedule(t)

    def _writer_failed(self, exc: BaseException) -> None:
        self.failures.append(exc)
        self.stop_asked.set()

    def _recover(self, err: BaseException, group_name: str, node: str | None) -> bool:
        """Carry out the supervisor's verdict on a failure; False when the run must end.

        A node's failure restarts that node (``one_for_one``) or the whole net
        (``one_for_all``); a dead group process always rewinds every group to
        the latest snapshot (its nodes' state is gone, and in simulated time
        the others cannot stay ahead of it), restarting its process.
        """
        sup = self.supervisor
        if sup is None or self.snapshots is None or self.snapshots.latest is None \
                or self.stop_asked.is_set() or \
                (isinstance(err, NodeError) and err.hook == "kernel"):
            # (A group's own failure, not a hook's, is no node's to restart.)
            self.failures.append(err)
            return False
        verdict = failure_verdict(sup, self.intensity, self.time_ns, restartable=True)
        if verdict.action is Action.STOP:
            if verdict.note:
                noted = type(err)(*_args_of(err, verdict.note))
                noted.__cause__ = err.__cause__
                err = noted
            self.failures.append(err)
            return False
        latest = self.snapshots.latest
        if verdict.action is Action.RESTART_ONE and node is not None:
            log.warning("%s; restarting node %r (one_for_one)", err, node)
            g = self.groups[group_name]
            g.control.restart_node(node, latest["nodes"][node])
            self.restarts[node] = self.restarts.get(node, 0) + 1
            if self.realtime:
                self._refresh([g])
            else:
                # What the restart's on_start sent (stamped at the failed delta cycle)
                # crosses now: its readers may not run past that cycle without it.
                messages, g.queued = g.queued, []
                g.link.send(dataplane.Grant(None, True, messages))
                self._collect([g])
            return True
        if node is not None and not self.realtime and not self._finish_instant(
                self.groups[group_name].frontier[0]):
            return False
        log.warning("%s; restoring every group from the snapshot at t=%.6f s (%s)", err,
                    latest["time_ns"] / 1e9,
                    "one_for_all" if node is not None else
                    f"a dead group rewinds every group, whatever the strategy ({sup.restart})")
        self._restart_all(latest, dead=group_name if node is None else None)
        return True

    def _finish_instant(self, t: int) -> bool:
        """Run every group to the end of instant ``t`` before a ``one_for_all`` restore.

        One process restores at the failed instant's end (its hold comes at an
        instant's boundary), so the other nodes run the rest of the instant
        first: their counts and what subscribers get are the same here. A
        hook failing meanwhile is counted as one process counts it; False
        when the supervisor then gives up (the failure is recorded).
        """
        assert self.supervisor is not None
        while True:
            try:
                if not self._round((t, LAST_DELTA)):
                    return True
            except _Failed as again:
                verdict = failure_verdict(self.supervisor, self.intensity, self.time_ns,
                                          restartable=True)
                if verdict.action is Action.STOP:
                    self.failures.append(again.error)
                    return False

    def _restart_all(self, tree: dict[str, Any], dead: str | None) -> None:
        """Every group rebuilt (a dead group's process started anew) and restored from ``tree``."""
        self.epoch += 1  # replies to grants of the abandoned timeline are dropped from now on
        self._stop_deadline = None  # a death found by the end's cut: the end comes anew
        for g in self.groups.values():
            if g.remote:
                g.link.epoch = self.epoch
            g.queued, g.due, g.frontier, g.time_ns, g.waiting = [], None, (-1, 0), 0, False
            if g.name == dead:
                self.relaunch(g)
            elif g.remote:
                self.ask(g.name, group.Reset(self.stop_timeout), 2 * self.stop_timeout + 5.0)
            else:
                self.rebuild_local(g)
        for path in self.order:
            self.restarts[path] = self.restarts.get(path, 0) + 1
        self.time_ns = tree["time_ns"]
        _start_phase(self, [], tree, self.start_timeout)
        self.next_cut = None
        self.snapshots.schedule(tree["time_ns"])  # type: ignore[union-attr]

    def relaunch(self, g: _Group) -> None:
        """Start a dead group's process again, on a fresh data-plane endpoint."""
        g.refused += g.link.refused
        g.link.close()
        g.launches += 1
        self.dead.discard(g.name)  # a new process: whatever was found of the old one is past
        if g.member is None:
            address = f"{g.base_address}.{g.launches}"
            pools = f"{g.spawn['pools']}{g.launches}-" if g.spawn.get("pools") else None
            g.link = dataplane.HostLink(address, self.routes, pools)
            reach = address
        else:  # a fresh port: the dead peer's TCP connection may linger on the old one
            pools = None
            self.system.lost(g.name, "restarting")  # if not known lost yet (it may be)
            if self._choose_member is not None:
                g.member = self._choose_member(g.name)  # its machine, back, or a fallback
                log.warning("placed run: group %r starts again on machine %r", g.name, g.member)
            g.link = dataplane.HostLink(g.base_address, self.routes, None, g.key)
            old = g.spawn["address"]
            reach = f"{old.rpartition(':')[0]}:{g.link.endpoint.rpartition(':')[2]}"
        g.spawn = {**g.spawn, "address": reach, "pools": pools}
        g.link.epoch = self.epoch
        g.link.blocked = self._check_exits
        on = {} if g.member is None else {"member": g.member}
        g.pid = self.system.start_group(g.name, GROUP_TARGET, g.spawn, self.start_timeout, **on)
        g.link.handshake(self.start_timeout)
        if self.monitor is not None and g.member is not None:
            if g.name in self.monitor.members():
                self.monitor.unwatch(g.name)
            g.watched_ns = time.monotonic_ns()
            self.monitor.watch(g.name)  # afresh: the new process answers now
        check_same_net(self.system, g.name, self._signature, self.start_timeout)
        subscribed = [self.routes.outputs[i] for i in {**self.listeners, **self.item_listeners}
                      if self.owner[self.ports[self.routes.outputs[i]].node._mujou_path]
                      == g.name]
        for output in subscribed:
            g.control.subscribe(output)

    def rebuild_local(self, g: _Group) -> None:
        """The host's own group rebuilt: a fresh net and kernel in this process."""
        assert self.kernel is not None and self._rebuild is not None
        stuck = group.stop_kernel(self.kernel, self.stop_timeout)
        if stuck:
            raise StopTimeoutError({p: f"{h} (in group {g.name!r})" for p, h in stuck.items()},
                                   self.stop_timeout)
        old: _LocalLink = g.link
        self.kernel = self._rebuild()
        if self._watcher is not None:
            self._watcher.watch(self.kernel)
        link = _LocalLink(self.kernel, dataplane.Routes(self.found, self.kernel.ports),
                          self.wake.set if self.realtime else None, self.keep_waiting)
        for index in old.published._detach:
            link.published.listen(self.kernel, self.routes.outputs[index])
        link.messages_in, link.messages_out = old.messages_in, old.messages_out
        link.counted = group.node_stats(old.kernel, old.counted)
        g.link = link

    def _refresh(self, groups: list[_Group]) -> None:
        """Deliver what waits for ``groups`` and learn their next keys (nothing runs)."""
        if self.realtime:
            realtime.push(self)
            return
        for g in groups:
            messages, g.queued = g.queued, []
            g.link.send(dataplane.Grant(None, False, messages, self._settled()))
        self._collect(groups)

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
        while True:
            try:
                job = self.requests.get_nowait()
            except queue.Empty:
                return
            job()

    def _round(self, cap: Key | None) -> bool:
        """Grant every group that may run; wait for the replies, carry the messages.

        Returns False when no group may run (the end, or the cap reached).
        """
        limit = self.end_key if cap is None else cap
        granted: list[tuple[_Group, Key | None]] = []
        settled = self._settled()
        for g in self.groups.values():
            if g.due is None:
                continue
            others = [h.due for h in self.groups.values() if h is not g and h.due is not None]
            bound = min(others) if others else None
            if limit is not None and (bound is None or limit < bound):
                bound = limit
            if bound is None:
                bound = (1 << 62, LAST_DELTA)  # alone with no end: run until it sends
            if g.due <= bound:
                granted.append((g, bound))
        if not granted:
            return False
        # A group that may not run takes its messages all the same (bound None): what
        # waits in the driver, and in its mailboxes once settled, stays bounded.
        running = {id(g) for g, _ in granted}
        granted += [(g, None) for g in self.groups.values() if g.queued and id(g) not in running]
        # Remote groups first, the host's own group last: they all run at once.
        granted.sort(key=lambda gb: not gb[0].remote)
        for g, bound in granted:
            messages, g.queued = g.queued, []
            g.waiting = True
            g.link.send(dataplane.Grant(bound, False, messages, settled))
        self._collect([g for g, _ in granted])
        self.rounds += 1
        return True

    def _settled(self) -> Key | None:
        """The least next key of every group: every delta cycle before it is over
        everywhere and its messages were routed (`Kernel.settle`); None: no work left."""
        dues = [g.due for g in self.groups.values() if g.due is not None]
        return min(dues) if dues else None

    def _collect(self, waiting: list[_Group]) -> None:
        """Wait for the replies of ``waiting``, then take them in; a dead group or a stop
        is the way out."""
        pending = list(waiting)
        replies: list[tuple[_Group, dataplane.Reply]] = []
        poller = zmq.Poller()
        for g in pending:
            if g.remote:
                poller.register(g.link.sock, zmq.POLLIN)
        notices = getattr(self.system, "notices", None)
        if notices is not None:
            poller.register(notices, zmq.POLLIN)
        if self.monitor is not None:  # a lost machine wakes the wait as a crash notice does
            poller.register(self.monitor.fileno(), zmq.POLLIN)
        for g in list(pending):
            if not g.remote:
                replies.append((g, g.link.receive(0)))
                pending.remove(g)
        while pending:
            ready = dict(poller.poll(int(POLL_S * 1000)))
            for g in list(pending):
                if g.link.sock in ready:
                    reply = g.link.receive(0)
                    if reply is not None:
                        replies.append((g, reply))
                        pending.remove(g)
            self._check_exits()
            # After a stop, the grants in flight get what is left of the end's one
            # stop_timeout, not one of their own (issue 28, item 5).
            if self.stop_asked.is_set() and pending and self._stop_left() <= 0:
                raise _Stuck(self._busy_in(pending))
        self._take_replies(replies)

    def _busy_in(self, groups: list[_Group]) -> dict[str, str]:
        """The hooks in flight in ``groups`` (whose grants the end gave up on), each with its
        group: ``{path: "on_update (in group 'a')"}`` (`group.Busy`, asked of the control
        thread, free while the grant's hook runs); a group that cannot say is named itself."""
        busy: dict[str, str] = {}
        for g in groups:
            try:
                hooks = self.ask(g.name, group.Busy(), 5.0)
            except BaseException as exc:  # noqa: BLE001 - its stop says more, or its death
                log.debug("group %r did not say which hooks run: %s", g.name, describe(exc))
                hooks = None
            if not hooks:
                busy[g.name] = _UNKNOWN_HOOKS
                continue
            busy.update({p: f"{h} (in group {g.name!r})" for p, h in hooks.items()})
        return busy

    def _take_replies(self, replies: list[tuple[_Group, dataplane.Reply]]) -> None:
        """Take a round's replies in: every group's next key first, then the messages.

        In that order because a message lowers its reader's next key: a
        reply of the reader's own taken afterwards must not raise it again.
        """
        failed = None
        for g, reply in replies:
            g.waiting = False
            if reply.failure is not None and failed is None:
                failed = (_node_error(g.name, reply.failure), g.name)
            g.due = reply.due
            if reply.frontier > g.frontier:
                g.frontier = reply.frontier
            if reply.time_ns > g.time_ns:
                g.time_ns = reply.time_ns
                if reply.time_ns > self.time_ns:
                    self.time_ns = reply.time_ns
        for g, reply in replies:
            self._route(g, reply)
        if failed is not None:
            self._fail(*failed)

    def _route(self, g: _Group, reply: dataplane.Reply) -> None:
        """Pass a group's sends on to their readers' groups, and to the host's listeners.

        Simulated time: they wait for the reader's next grant, and lower its
        next key to the delta cycle after the send. Real time: the host's
        group gets them at once; a failure in the reply is raised (after the
        messages are passed on).
        """
        listeners, item_listeners = self.listeners, self.item_listeners
        for item in reply.published:
            for listener in listeners.get(item[3], ()):
                listener(item[4])
            for item_listener in item_listeners.get(item[3], ()):
                item_listener(item)
        realtime_ = self.realtime
        for item in reply.sends:
            t, delta, _, output, _ = item
            key = (t, delta + 1)
            for h, triggers in self._reader_groups(output):
                if h is g:
                    continue
                h.queued.append(item)
                # Only a triggering reader has work at the next delta cycle; the
                # others take the message in with their next grant, before any key.
                if triggers and not realtime_ and (h.due is None or key < h.due):
                    h.due = key
        if realtime_:
            if reply.time_ns > g.time_ns:
                g.time_ns = reply.time_ns
            if reply.failure is not None:
                self._fail(_node_error(g.name, reply.failure), g.name)

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
        """Raise `_GroupDied` for a group process found ended, or on another machine lost."""
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
                    raise _GroupDied(_Lost(g.name, g.pid, reason))
        take = getattr(self.system, "take_exits", None)
        if take is None:
            return
        for exit_ in take():
            g = self.groups.get(exit_.group)
            if g is not None and exit_.pid and g.pid and exit_.pid != g.pid:
                # A former process's notice, come after a request had found it dead and
                # the supervisor had restarted it: that death is restored already.
                continue
            raise _GroupDied(exit_)

    def _fail(self, err: NodeError, group_name: str) -> None:
        raise _Failed(err, group_name, err.path)

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
        raise _node_error(name, failure)

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
        if self.realtime:  # the relay's wait wakes for it (else it would wait out its poll)
            self.wake.set()
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
        if self.realtime:
            return realtime.cut(self, timeout)
        while True:
            t = max([g.time_ns for g in self.groups.values()] + [self.time_ns])
            try:
                while self._round((t, LAST_DELTA)):
                    pass
                break
            except (_Failed, _GroupDied) as failed:
                # A hook fails (or a group dies) on the way to the cut: the supervisor
                # decides, as between rounds; after a restart the cut is taken anew.
                if not self._supervise(failed):
                    self.stop_asked.set()  # the run ends with it, as between rounds
                    raise NotRunningError("state_dict(): the run failed before the cut "
                                          "(join() raises why)") from None
        self._flush()
        return self._gather(t, timeout)

    def _flush(self) -> None:
        """Deliver every message waiting in the driver (no group runs)."""
        if self.realtime:
            realtime.flush(self, timeout=self.stop_timeout)
            return
        waiting = [g for g in self.groups.values() if g.queued]
        for g in waiting:
            messages, g.queued = g.queued, []
            g.link.send(dataplane.Grant(None, False, messages, self._settled()))
        if waiting:
            self._collect(waiting)

    def _gather(self, t: int, timeout: float | None) -> dict[str, Any]:
        limit = 60.0 if timeout is None else timeout
        trees = [g.control.take_state(limit) for g in self.groups.values()]
        return merge_trees(trees, t, self.order)

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
        key: Key | None = max(h.frontier for h in self.groups.values())
        if initial or key == (-1, 0) or self.realtime:
            key = None  # real time, or the timers have not started (inputs=): as in one process
        g.control.write(path, message, key)
        if initial or self.realtime:
            # Real time: delivered now, as in one process (the relay carries what it
            # causes); a grant here would wait for a reply a real-time group never owes.
            return
        messages, g.queued = g.queued, []
        g.link.send(dataplane.Grant(None, False, messages, self._settled()))
        self._collect([g])

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
        ``strict``: raise the `GroupDied` instead (the end's cut: `_end_cut`).

        A group on another machine's have its ``"machine"``, the connections
        the host's ends of its links refused (``"refused"``), its heartbeat's
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
        return out

    # -- the end ------------------------------------------------------------------------
    def _callback_failed(self, sub: Subscription, exc: BaseException) -> None:
        err = CallbackError(f"subscriber of {sub.port!r} raised {describe(exc)}")
        err.__cause__ = exc
        self.failures.append(err)
        self.stop_asked.set()

    def _finish(self) -> None:
        """Stop every group (on_stop), take the final state, end the processes."""
        self.rounds_ended = time.perf_counter()  # the benchmarks' wall time of the rounds
        self.ending = True
        self._end_begins()
        if self._watcher is not None:
            self._watcher.close()
        stuck = self.stuck
        trees: list[dict[str, Any]] = []
        missing: dict[str, str] = {}  # groups that gave no final state, and why
        try:
            self._finish_groups(stuck, trees, missing)
        finally:
            self.end_wall = time.monotonic()
            if self.realtime:
                pass  # the time the rounds ended at (realtime.run_rounds keeps it)
            elif self.end_ns is not None and not self.failures and not self.stop_asked.is_set():
                self.time_ns = self.end_ns
            if self.dead:
                # A tree without a dead group's nodes would restore a different net.
                self.final_error = GroupDied(
                    sorted(self.dead)[0], self.groups[sorted(self.dead)[0]].pid,
                    "its nodes' state died with its process: the run has no final state "
                    "(restore the supervisor's latest snapshot instead)")
            elif missing:
                # Likewise a tree without a stuck group's nodes, or one whose stop failed:
                # the run ends with its failure and no final state, never a partial one.
                self.final_error = _no_final_state(missing)
                if not self.failures and not stuck:
                    self.failures.append(self.final_error)
            elif trees:
                try:
                    self.final_tree = merge_trees(trees, self.time_ns, self.order)
                except BaseException as exc:  # state_dict() raises it
                    self.final_error = exc
            self._write_trace()  # the groups are stopped, their processes still there
            self._close_recording()  # every published item is routed
            self.host.close(self.stop_timeout)
            if self.snapshots is not None:
                self.snapshots.close(self.stop_timeout)
            try:
                self.system.shutdown(self.stop_timeout)
            except BaseException as exc:
                log.error("placed run: shutting the processes down failed: %s", describe(exc))
            for g in self.groups.values():
                g.link.close()
            self.wake.close()  # its pipe: one a run, never closed before (a late set is a no-op)
            if self.monitor is not None:
                self.monitor.close()
            if self.run_id is not None:
                wire.remove_blocks(self.run_id)  # a killed group's pools too
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            if stuck and not self.failures:
                self.failures.append(StopTimeoutError(stuck, self.stop_timeout))
            self.ended.set()

    def _close_recording(self) -> None:
        """Close the run's recording (its end: the time, the failure); its error is the run's."""
        if self.recorder is None:
            return
        failure = self.failures[0] if self.failures else None
        error = self.recorder.close(self.time_ns, "" if failure is None else describe(failure),
                                    self.stop_timeout)
        if error is not None:  # join() raises it, or it is logged (keep_end_failure)
            keep_end_failure(self.failures, error, "could not write the recording")

    def _write_trace(self) -> None:
        """Write a traced run's file from every group's records (distributed/tracing.py).

        A file that cannot be written fails the run with the OSError, as in
        one process; a group whose records cannot be taken is left out.
        """
        trace, self.trace = self.trace, None
        if trace is None:
            return
        limit = self.stop_timeout + 5.0
        other = {"timer": "realtime" if self.realtime else "simulated",
                 "nodes": len(self.order),
                 "groups": {g.name: {"pid": g.pid, "nodes": list(g.nodes)}
                            for g in self.groups.values()}}
        try:
            tracing.write_placed(trace, self.groups.values(),
                                 lambda g: self.ask(g.name, group.TakeTrace(), limit),
                                 other, self._clocks())
        except Exception as exc:  # noqa: BLE001 - join() raises it, or it is logged
            keep_end_failure(self.failures, exc,
                             f"could not write the trace file {trace.tracer.path}")

    def _clocks(self) -> dict[str, tracing.Clock]:
        """Each group on another machine's clock offset now (the heartbeat's estimate)."""
        statuses = self.monitor.members() if self.monitor is not None else {}
        clocks = {}
        for g in self.groups.values():
            if g.member is not None:
                status = statuses.get(g.name)
                est = None if status is None else status.offset
                clocks[g.name] = tracing.Clock(g.member, None if est is None else est.offset_ns,
                                               None if est is None else est.uncertainty_ns)
        return clocks

    def _end_cut(self) -> None:
        """The end's consistent cut and final stats, before any group stops.

        Run inside the supervised loop (`_main`): a group found dead here (it
        died, or its machine was lost, as the run reached its end: the
        heartbeat may tell of it only now) raises, and the supervisor restores
        it and finishes the run, as for a death found between two rounds.
        Every remote group answers the final stats' request, so a death up to
        this moment is found here, not by the stop that follows.
        """
        if self.stuck or self.dead or any(g.waiting for g in self.groups.values()):
            return
        self._end_begins()  # a real-time run's hooks in flight get one stop_timeout from here
        try:
            self._settle_end()
        except (_GroupDied, GroupDied, _Stuck):
            raise
        except BaseException as exc:  # a group's hooks not held in time: the rest still ends
            log.warning("placed run: the last messages could not be delivered: %s",
                        describe(exc))
        # After the last messages are in (their drops count), before the stop.
        self.final_stats = self.group_stats(strict=True)
        self._check_exits()

    def _settle_end(self) -> None:
        """Every message on its way between groups into its reader's Inputs (the final
        tree holds them as pending, as one process's does)."""
        if self.realtime:
            realtime.hold_all(self, self._stop_left())
        elif not any(isinstance(f, GroupDied) for f in self.failures):
            # One process ends (a stop, a failure) at the end of the instant it is
            # in: every group finishes the latest instant any group has reached,
            # so that the final tree is a consistent cut (at the end: nothing runs).
            t = max([g.time_ns for g in self.groups.values()] + [self.time_ns])
            try:
                while self._round((t, LAST_DELTA)):
                    pass
            except _Failed as failed:  # a hook of that instant: the run fails too
                self.failures.append(failed.error)
        self._flush()

    def _finish_groups(self, stuck: dict[str, str], trees: list[dict[str, Any]],
                       missing: dict[str, str]) -> None:
        """Stop every group (their final trees into ``trees``, their stuck nodes into
        ``stuck``, the groups without a tree and why into ``missing``)."""
        if not self._end_cut_done:  # a failure ended the rounds: the cut as far as it goes
            if not self.stuck and not self.dead \
                    and not any(g.waiting for g in self.groups.values()):
                try:
                    self._settle_end()
                except BaseException as exc:  # a dead group: the others still stop
                    log.warning("placed run: the last messages could not be delivered: %s",
                                describe(exc))
            try:  # after the last messages are in (their drops count), before the stop
                self.final_stats = self.group_stats()
            except BaseException as exc:  # a dead group has none; the rest is still ended
                log.warning("placed run: the final stats could not be taken: %s",
                            describe(exc))
        for g in self.groups.values():
            if g.name in self.dead:
                continue  # nothing to stop; its death is the run's failure already
            # Its hooks in flight get what is left of the end's one stop_timeout; its
            # on_stop hooks a stop_timeout of their own, as in one process.
            idle = self._idle_left()
            try:
                hooks, tree = g.control.stop(self.stop_timeout, not g.waiting, idle)
                took = tree is not None
                if took:
                    trees.append(tree)
                named = _stuck_hooks(hooks)
                if named and stuck.get(g.name) == _UNKNOWN_HOOKS:
                    del stuck[g.name]  # its stop names them now
                for p, h in named.items():
                    stuck[p] = f"{h} (in group {g.name!r})"
                if not took:
                    missing[g.name] = ("stuck in a hook" if hooks else
                                       "its grant did not end within stop_timeout")
            except GroupDied as exc:  # it died as the run ended
                self.dead.add(g.name)
                if not self.failures:
                    self.failures.append(exc)
            except BaseException as exc:
                log.error("placed run: stopping group %r failed: %s", g.name, describe(exc))
                missing[g.name] = f"its stop failed: {describe(exc)}"
                if not isinstance(exc, NotRunningError) and not self.failures:
                    self.failures.append(exc)


def _stuck_hooks(hooks: Any) -> dict[str, str]:
    """A stop's stuck nodes as ``{path: hook}`` (`group.stop_kernel`); a list of paths
    (a group server that names no hooks) as ``"a hook"`` each."""
    if isinstance(hooks, Mapping):
        return dict(hooks)
    return {p: "a hook" for p in hooks}


def _no_final_state(missing: Mapping[str, str]) -> NodeError:
    """What ``state_dict()`` raises after an end that left groups without a final state."""
    why = "; ".join(f"group {name!r}: {reason}" for name, reason in sorted(missing.items()))
    return NodeError("", "state_dict", f"state_dict(): the run has no final state ({why}); "
                     f"a tree without these groups' nodes would restore another net")


class _Failed(Exception):
    """A group reported a hook's failure: the supervisor decides (`_Driver._recover`)."""

    def __init__(self, error: NodeError, group: str, node: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.group = group
        self.node = node


def _args_of(err: BaseException, note: str) -> tuple[Any, ...]:
    """The constructor arguments of a copy of ``err`` with ``note`` added to its message."""
    if isinstance(err, NodeError):
        return (err.path, err.hook, f"{err} ({note})")
    if isinstance(err, GroupDied):
        return (err.group, err.pid, f"{err.reason} ({note})")
    return (f"{err} ({note})",)


class _Stuck(Exception):
    """Groups did not answer a grant within the stop's bound."""

    def __init__(self, busy: dict[str, str]) -> None:
        super().__init__(f"groups still running a grant: {sorted(busy)}")
        self.busy = busy


class _Lost(NamedTuple):
    """A group on another machine that the heartbeat lost (as `system.GroupExit` reads)."""

    group: str
    pid: int
    reason: str


class _GroupDied(Exception):
    """A group process ended unasked."""

    def __init__(self, exit_: Any) -> None:
        pid = f" (pid {exit_.pid})" if exit_.pid else ""  # 0: it never reported one
        super().__init__(f"group {exit_.group!r}{pid} died: {exit_.reason}")
        self.exit = exit_


def _node_error(group_name: str, failure: Mapping[str, Any]) -> NodeError:
    """The host's NodeError for a group's failure, with the remote traceback as its cause."""
    err = NodeError(failure["path"], failure["hook"],
                    f"{failure['message']} (in group {group_name!r})")
    if "loop" in failure:  # an AlgebraicLoopError: the same type on the host
        nodes, time_ns, delta, loop = failure["loop"]
        err = AlgebraicLoopError(list(nodes), time_ns, delta, loop, group=group_name)
    err.__cause__ = RemoteTraceback(failure["type"], failure["traceback"])
    return err


class RemoteTraceback(Exception):
    """An exception raised in another process: its type's name and its traceback as text."""

    def __init__(self, type_name: str, text: str) -> None:
        super().__init__(f"{type_name} in a group process:\n{text}")
        self.type_name = type_name
        self.traceback = text


def merge_trees(trees: list[dict[str, Any]], time_ns: int, order: list[str]) -> dict[str, Any]:
    """One state tree from the groups' trees, at ``time_ns``, in the net's order.

    The groups' sections are disjoint (each names its own nodes and Inputs);
    entries come in the order of ``order`` (node paths, parents first), as a
    single process's tree lists them; the Inputs of one node (all from one
    group's tree) stay in that tree's order, which is one process's too.
    """
    rank = {p: i for i, p in enumerate(order)}

    def where(path: str, node_keyed: bool) -> int:
        return rank.get(path if node_keyed else path.rpartition(".")[0], len(rank))

    merged: dict[str, Any] = {}
    for tree in trees:
        for key, value in tree.items():
            if isinstance(value, dict):
                merged.setdefault(key, {}).update(value)
            else:
                merged.setdefault(key, value)
    for key, value in merged.items():
        if isinstance(value, dict):
            node_keyed = key in ("nodes", "seeds", "schedule")
            merged[key] = dict(sorted(value.items(), key=lambda kv: where(kv[0], node_keyed)))
    merged["time_ns"] = time_ns
    return merged


def check_same_net(system: Any, name: str, expected: list[list[Any]], timeout: float) -> None:
    """Refuse a group whose process built another net than the host's (`net_signature`).

    Raises:
        NetError: names the group and the first differences (the nodes' paths,
            classes and ports; the versions of mujou_actors, torch, msgpack and
            Python, which a group on another machine may not share).
    """
    described = system.ask(name, group.Describe(), timeout)
    diff = signature_differences(expected, described["signature"])
    here = group.versions()
    there = described.get("versions", here)
    diff += [f"{what} {there.get(what)} there, {version} here" for what, version in here.items()
             if there.get(what) != version]
    if diff:
        raise NetError(f"mujou.run: group {name!r} built another net than the host (is the "
                       f"factory deterministic, and the same code in every process?): "
                       f"{'; '.join(diff)}")
    _warn_other_kernels(name, described.get("numerics"))


def _warn_other_kernels(name: str, there: dict[str, str] | None) -> None:
    """Log a warning when a group's process computes with other CPU kernels than the host's.

    Not an error: the run is correct, but its floats may differ in the last bit
    from the same run in one process (docs/machines.md, "Determinism").
    """
    here = numerics()
    keys = ("cpu_capability", "mkl_cbwr", "aten_cpu_capability", "cpu")
    if there is None or all(there.get(k) == here[k] for k in keys):
        return
    differ = ", ".join(f"{k} {there.get(k) or 'unset'!s} there, {here[k] or 'unset'} here"
                       for k in keys if there.get(k) != here[k])
    log.warning("group %r computes with other CPU kernels than the host (%s): in simulated "
                "time its floats may differ in the last bit from the run in one process; set "
                "MKL_CBWR=COMPATIBLE (and ATEN_CPU_CAPABILITY=default) on every machine for "
                "bit-for-bit results across machines", name, differ)


def _start_phase(driver: _Driver, initial: list[tuple[Input, Any]],
                 tree: dict[str, Any] | None, start_timeout: float) -> None:
    """on_start everywhere, the tree, on_start's messages, ``inputs=``, the first keys.

    Also a restart's second half, after every group's kernel was rebuilt.
    """
    deadline = time.monotonic() + start_timeout
    left = lambda: max(0.1, deadline - time.monotonic())  # noqa: E731
    for g in driver.groups.values():
        g.ages = None  # a restart's processes stamp on timers of their own (realtime.start)
    for g in driver.groups.values():
        g.control.start(left())
    everyone = list(driver.groups.values())
    if tree is None and not driver.realtime:
        # What on_start sent crosses to its readers before any timer starts.
        for g in everyone:
            g.link.send(dataplane.Grant(None, True, []))
        driver._collect(everyone)
    elif tree is None:
        realtime.flush(driver, timeout=left())
    else:
        for g in everyone:
            g.control.load(group.split_tree(tree, set(g.nodes)), left())
            g.queued = []
    for port, value in initial:
        driver.write(port.path, value, initial=True)
    if driver.realtime:
        realtime.start(driver, tree)
    else:
        driver._refresh(everyone)  # the timers start: every group's first due key
        driver.start_ns = tree["time_ns"] if tree is not None else 0
    driver.time_ns = tree["time_ns"] if tree is not None else 0
