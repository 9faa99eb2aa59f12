"""The supervisor's side of a placed run: snapshots across groups, and restarts.

A placed run's supervisor (`mujou.Supervisor`) takes its snapshots as one
process's does, at consistent cuts on its ``snapshot_every`` grid (the
driver's timing stops its rounds there: `rounds.SimulatedRounds.run`,
`realtime.RealTimeRelay.run`), and acts on a failure as one process's does:
a node's failure restarts that node (``one_for_one``) or every group from
the latest snapshot (``one_for_all``). A group whose process dies, or whose
machine is lost, rewinds every group to the latest snapshot, whatever the
strategy (its nodes' state is gone, and in simulated time the others cannot
stay ahead of it), and its process is started anew (`Recovery.relaunch`),
on its machine or another (`check_same_net` refuses one that built another
net).

`Recovery` is the driver's (``driver.recovery``); every method runs on the
driver's thread.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from .. import snapshot
from .._runtime.outputs import file_snapshot
from .._runtime.snapshots import Snapshots
from ..devices import numerics
from ..errors import GroupDied, NetError, NodeError, StopTimeoutError
from ..net import check_file_messages
from ..ports import Port
from ..supervisor import Action, RestartIntensity, Supervisor, failure_verdict
from . import dataplane, group
from .failures import Failed, GroupLost, args_of
from .placement import signature_differences

# The placed run's driver and its groups (driver._Driver, driver._Group): driver.py
# imports this module, so they are named here, not imported.
_Driver = Any
_Group = Any

__all__ = ["GROUP_TARGET", "Recovery", "check_same_net"]

log = logging.getLogger("mujou_actors")

GROUP_TARGET = "mujou_actors.distributed.groupmain:serve"  # what a group's process runs


class Recovery:
    """The snapshots and restarts of one placed run (see the module's docstring).

    Args:
        driver (driver._Driver): the run's driver (its groups, its timing, its failures).
        supervisor (Supervisor | None): the run's supervisor; None: no snapshot, no restart.
        ports (dict[str, Port]): the net's ports, by path (the snapshot files' check).
        stop_timeout (float): seconds a snapshot file may take to close.
        rebuild (Callable[[], Kernel] | None): builds the host's own group anew.
        signature (list | None): the net's signature (`placement.net_signature`), which
            a relaunched group's process must build.
        choose_member (Callable[[str], str] | None): where a group on another machine
            starts again (the convention's choice).

    Attributes:
        snapshots (Snapshots | None): the supervisor's snapshots, when it takes any.
        restarts (dict[str, int]): restarts per node path.
        next_cut (int | None): the time (ns) of the next snapshot's cut.
        epoch (int): raised by every restore of all groups (`dataplane.HostLink.epoch`):
            replies to grants of an abandoned timeline are dropped.
    """

    def __init__(self, driver: _Driver, supervisor: Supervisor | None, ports: dict[str, Port],
                 stop_timeout: float, rebuild: Callable[[], Any] | None = None,
                 signature: list[list[Any]] | None = None,
                 choose_member: Callable[[str], str] | None = None) -> None:
        self.driver = driver
        self.supervisor = supervisor
        self.rebuild = rebuild
        self.signature = signature or []
        self.choose_member = choose_member
        self.restarts: dict[str, int] = {}
        self.next_cut: int | None = None
        self.snapshots: Snapshots | None = None
        self.epoch = 0
        self.first_taken = False  # the supervisor's first snapshot (`first_snapshot`)
        self.intensity = RestartIntensity(0, 1)
        if supervisor is not None:
            self.intensity = RestartIntensity(supervisor.max_restarts,
                                              round((supervisor.within or 0.0) * 1e9))
            # The driver is the snapshots' timer (`_Driver.now_ns`: the latest time reached).
            snaps = Snapshots(supervisor, [], driver, stop_timeout=stop_timeout,
                              hold_at=self.hold_at, simulated=True, wake=lambda: None)
            if snaps.wanted:
                self.snapshots = snaps
                snaps.open_writer(snapshot.save, functools.partial(check_file_messages,
                                                                   ports=ports),
                                  on_error=self._writer_failed,
                                  cancelled=driver.stop_asked.is_set)

    def supervise(self, failed: Failed | GroupLost) -> bool:
        """Hand a hook's failure or a dead group to the supervisor (`recover`); False when
        the run must end (the failure is recorded).

        A group that dies while the supervisor restores the net (its new
        machine went too: the start on it fails once it stops answering) is a
        failure of its own, handed over in turn; the restart intensity bounds
        how often.
        """
        driver = self.driver
        while True:
            try:
                return bool(driver._died_as_exit(functools.partial(self._supervise_one, failed)))
            except GroupLost as again:
                failed = again

    def _supervise_one(self, failed: Failed | GroupLost) -> bool:
        """`supervise` for one failure."""
        driver = self.driver
        if isinstance(failed, Failed):
            return self.recover(failed.error, failed.group, node=failed.node,
                                others=failed.others, restartable=failed.restartable)
        e = failed.exit
        if self.recover(GroupDied(e.group, e.pid, e.reason), e.group, node=None):
            return True
        driver.dead.add(e.group)
        return False

    def hold_at(self, cut_ns: int | None) -> None:
        """The time of the next snapshot's cut (the rounds stop there), or None."""
        self.next_cut = cut_ns

    def first_snapshot(self, t: int) -> None:
        """The supervisor's first snapshot, at the run's start time ``t``, once.

        As one process takes it: right after the start, before any timer runs
        (real time: `realtime.RealTimeRelay.start_timers` takes it so, as the
        groups' clocks are not running yet; simulated time: the driver's first
        act, before any round). A run without snapshots takes none.
        """
        if self.snapshots is None or self.first_taken:
            return
        self.first_taken = True
        self.snapshot(t)

    def snapshot(self, t: int) -> None:
        """Take the supervisor's snapshot at ``t`` (every group has finished it); keep it.

        In real time the cut comes now (``t`` is its grid time): the groups are
        held and flushed first; one that cannot be held in time misses it.
        """
        driver = self.driver
        assert self.snapshots is not None
        t0 = time.perf_counter()
        tree = driver.timing.snapshot_tree(t)
        if tree is None:  # real time: a group could not be held in time
            self.snapshots.miss({}, self.snapshots.bound())
            return
        driver.time_ns = max(driver.time_ns, t)
        file_snapshot(self.snapshots, tree, time.perf_counter() - t0, driver.recorder, None)
        self.snapshots.schedule(t)

    def _writer_failed(self, exc: BaseException) -> None:
        """The snapshots' file writer failed: the run fails with it, and stops."""
        driver = self.driver
        driver.failures.append(exc)
        driver.stop_asked.set()

    def recover(self, err: BaseException, group_name: str, node: str | None,
                others: list[Failed] | None = None, restartable: bool = True) -> bool:
        """Carry out the supervisor's verdict on a failure; False when the run must end.

        A node's failure restarts that node (``one_for_one``) or the whole net
        (``one_for_all``); a dead group process always rewinds every group to
        the latest snapshot (its nodes' state is gone, and in simulated time
        the others cannot stay ahead of it), restarting its process.

        ``others``: the hooks that failed in the same round, after this one. As
        in one process, each gets the supervisor's verdict in turn (each counts
        against the restart intensity): under ``one_for_one`` each node is
        restarted, under ``one_for_all`` the net is restored once; when the
        run ends instead, each failure is recorded.

        ``restartable``: False for a failure that stops the run whatever the
        strategy (`Failed.restartable`: a missed budget or deadline with
        ``on_miss="stop"``; a restarted node too slow would only miss again),
        as in one process. One such failure among ``others`` stops it too.
        """
        others = others or []
        driver = self.driver
        sup = self.supervisor
        if sup is None or self.snapshots is None or self.snapshots.latest is None \
                or driver.stop_asked.is_set() or \
                (isinstance(err, NodeError) and err.hook == "kernel"):
            # (A group's own failure, not a hook's, is no node's to restart.)
            driver.failures += [err, *(o.error for o in others)]
            return False
        verdict = failure_verdict(sup, self.intensity, driver.time_ns, restartable=restartable)
        if verdict.action is Action.STOP:
            if verdict.note:
                noted = type(err)(*args_of(err, verdict.note))
                noted.__cause__ = err.__cause__
                err = noted
            driver.failures += [err, *(o.error for o in others)]
            return False
        latest = self.snapshots.latest
        if verdict.action is Action.RESTART_ONE and node is not None:
            log.warning("%s; restarting node %r (one_for_one)", err, node)
            g = driver.groups[group_name]
            g.control.restart_node(node, latest["nodes"][node])
            self.restarts[node] = self.restarts.get(node, 0) + 1
            driver.timing.restarted_node(g)
            return all(self.recover(o.error, o.group, o.node, restartable=o.restartable)
                       for o in others)
        if not all(self._count(o) for o in others):
            return False  # (the net is restored once for all of them)
        if node is not None and not driver.timing.before_restore(driver.groups[group_name]):
            return False
        log.warning("%s; restoring every group from the snapshot at t=%.6f s (%s)", err,
                    latest["time_ns"] / 1e9,
                    "one_for_all" if node is not None else
                    f"a dead group rewinds every group, whatever the strategy ({sup.restart})")
        self.restart_all(latest, dead=group_name if node is None else None)
        return True

    def count_again(self, again: Failed) -> bool:
        """A hook failed again while the groups finish an instant before a restore
        (`SimulatedRounds.before_restore`): counted against the restart intensity, as
        one process counts it; False (the failure recorded) when the supervisor gives up."""
        return all(self._count(f) for f in [again, *again.others])

    def _count(self, failed: Failed) -> bool:
        """One failure counted against the restart intensity; False (recorded) at the limit."""
        driver = self.driver
        assert self.supervisor is not None
        verdict = failure_verdict(self.supervisor, self.intensity, driver.time_ns,
                                  restartable=failed.restartable)
        if verdict.action is Action.STOP:
            driver.failures.append(failed.error)
            return False
        return True

    def restart_all(self, tree: dict[str, Any], dead: str | None) -> None:
        """Every group rebuilt (a dead group's process started anew) and restored from ``tree``."""
        driver = self.driver
        tree = self._keep_params(tree, dead)  # before the kernels go: their values now
        self.epoch += 1  # replies to grants of the abandoned timeline are dropped from now on
        driver._stop_deadline = None  # a death found by the end's cut: the end comes anew
        for g in driver.groups.values():
            if g.remote:
                g.link.epoch = self.epoch
            g.queued, g.due, g.frontier, g.time_ns, g.waiting = [], None, (-1, 0), 0, False
            if g.name == dead:
                self.relaunch(g)
            elif g.remote:
                driver.ask(g.name, group.Reset(driver.stop_timeout),
                           2 * driver.stop_timeout + 5.0)
            else:
                self.rebuild_local(g)
        for path in driver.order:
            self.restarts[path] = self.restarts.get(path, 0) + 1
        driver.time_ns = tree["time_ns"]
        driver.start_phase([], tree, driver.start_timeout)
        self.next_cut = None
        self.snapshots.schedule(tree["time_ns"])  # type: ignore[union-attr]

    def _keep_params(self, tree: dict[str, Any], dead: str | None) -> dict[str, Any]:
        """``tree`` with each parameter at its value now: a rewind does not undo a set.

        As one process's restarts (`params.keep_values`): the live groups give
        their values; a dead group's nodes get the host's latest set of each
        parameter (a set still queued when the group died applies at the
        restart). The tree's queued sets are dropped: the values hold them.
        """
        driver = self.driver
        values = dict(driver.param_log)
        for g in driver.groups.values():
            if g.name != dead:
                values.update(g.control.params())
        if not values:
            return tree
        nodes = dict(tree["nodes"])
        for path, value in values.items():
            node, _, name = path.rpartition(".")
            if isinstance(nodes.get(node), dict):
                nodes[node] = {**nodes[node], name: value}
        kept = {**tree, "nodes": nodes}
        kept.pop("params", None)
        return kept

    def relaunch(self, g: _Group) -> None:
        """Start a dead group's process again, on a fresh data-plane endpoint."""
        driver = self.driver
        g.refused += g.link.refused
        g.link.close()
        g.launches += 1
        driver.dead.discard(g.name)  # a new process: whatever was found of the old one is past
        if g.member is None:
            address = f"{g.base_address}.{g.launches}"
            pools = f"{g.spawn['pools']}{g.launches}-" if g.spawn.get("pools") else None
            g.link = dataplane.HostLink(address, driver.routes, pools,
                                        cuda_ipc=g.spawn.get("cuda_ipc", False))
            reach = address
        else:  # a fresh port: the dead peer's TCP connection may linger on the old one
            pools = None
            driver.system.lost(g.name, "restarting")  # if not known lost yet (it may be)
            if self.choose_member is not None:
                g.member = self.choose_member(g.name)  # its machine, back, or a fallback
                log.warning("placed run: group %r starts again on machine %r", g.name, g.member)
            g.link = dataplane.HostLink(g.base_address, driver.routes, None, g.key)
            old = g.spawn["address"]
            reach = f"{old.rpartition(':')[0]}:{g.link.endpoint.rpartition(':')[2]}"
        g.spawn = {**g.spawn, "address": reach, "pools": pools}
        g.link.epoch = self.epoch
        g.link.blocked = driver._check_exits
        on = {} if g.member is None else {"member": g.member}
        g.pid = driver.system.start_group(g.name, GROUP_TARGET, g.spawn, driver.start_timeout,
                                          **on)
        g.link.handshake(driver.start_timeout)
        if driver.monitor is not None and g.member is not None:
            if g.name in driver.monitor.members():
                driver.monitor.unwatch(g.name)
            g.watched_ns = time.monotonic_ns()
            driver.monitor.watch(g.name)  # afresh: the new process answers now
        check_same_net(driver.system, g.name, self.signature, driver.start_timeout)
        outputs = driver.routes.outputs
        subscribed = [outputs[i] for i in {**driver.listeners, **driver.item_listeners}
                      if driver.owner[driver.ports[outputs[i]].node._mujou_path] == g.name]
        for output in subscribed:
            g.control.subscribe(output)

    def rebuild_local(self, g: _Group) -> None:
        """The host's own group rebuilt: a fresh net and kernel in this process."""
        driver = self.driver
        assert driver.kernel is not None and self.rebuild is not None
        stuck = group.stop_kernel(driver.kernel, driver.stop_timeout)
        if stuck:
            raise StopTimeoutError({p: f"{h} (in group {g.name!r})" for p, h in stuck.items()},
                                   driver.stop_timeout)
        old: group.LocalLink = g.link
        driver.kernel = self.rebuild()
        if driver._watcher is not None:
            driver._watcher.watch(driver.kernel)
        link = group.LocalLink(driver.kernel, dataplane.Routes(driver.found, driver.kernel.ports),
                          driver.timing.local_notify(), driver.keep_waiting)
        for index in old.published._detach:
            link.published.listen(driver.kernel, driver.routes.outputs[index])
        link.messages_in, link.messages_out = old.messages_in, old.messages_out
        link.opener, old.opener = old.opener, None  # a run with CUDA IPC keeps its opener
        link.counted = group.node_stats(old.kernel, old.counted)
        g.link = link


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
