"""``mujou.run(make_net, placement=...)``: check, start the group processes, hand over.

`start` is the part of `mujou.run` for a placed run: the host builds the
net once to check it and the placement (`placement.py`), starts one process
per group on the control plane (`system.ProcessSystem`) and its own group's
kernel, checks that every group built the same net, runs the start phase,
and hands over to the driver (`driver.py`), which alone talks to the groups
from then on. The run it returns is a `placed_run.PlacedRun`.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._runtime.kernel import Kernel
from .._runtime.loops import warn_loops
from ..devices import torch_settings
from ..errors import (
    describe,
)
from ..net import (
    check_fit,
    collect_ports,
    resolve_inputs,
    settle_seeds,
    walk,
    warn_suspect_net,
    warn_unknown_hooks,
)
from ..node import Node
from ..params import set_values
from ..ports import Input, Port
from . import cudaipc, dataplane, tracing, wire
from ._loopback import ANY, LOOPBACK
from .driver import RemoteTraceback, _Driver, _Group
from .group import LocalLink
from .placed_run import PlacedRun
from .placement import (
    HOST_GROUP,
    FactoryRef,
    Placement,
    PlacementPlan,
    build_net,
    check_placement,
    net_signature,
    resolve_factory,
)
from .recovery import GROUP_TARGET, check_same_net

log = logging.getLogger("mujou_actors")


__all__ = ["start", "PlacedRun", "RemoteTraceback"]



# ---------------------------------------------------------------------------
# the start: check -> processes -> same net? -> on_start -> state, inputs -> timer


def _warn_unused_fallbacks(machines: Mapping[str, Sequence[str]], supervisor: Any) -> None:
    """Say at the start that a fallback machine can serve only a supervisor that restarts."""
    if supervisor is not None and supervisor.restart != "none":
        return
    for group, on in machines.items():
        if len(on) > 1:
            log.warning("placement names %s as fallback machine(s) of group %r, but the run's "
                        "supervisor does not restart: a lost machine %r ends the run (pass "
                        "supervisor=mujou.Supervisor('one_for_all', snapshot_every=...), or "
                        "mujou run --restart one_for_all --snapshot-every S)",
                        ", ".join(repr(m) for m in on[1:]), group, on[0])


def start(net: Any, *, placement: Placement, args: Any,
          inputs: Mapping[Input | str, Any] | None, state: Any,
          make_system: Callable[..., Any] | None = None) -> PlacedRun:
    """Start a placed run: the part of `mujou.run` for ``placement`` (its arguments checked).

    Args:
        net: the net factory (a module-level function, or ``"module:function"``).
        placement (Placement): node path -> group, the factory's keyword
            arguments, where the convention of machines listens, if any.
        args: `mujou.run`'s other arguments, checked (run.py's ``_Arguments``).
        inputs: ``inputs=`` of `mujou.run`; state: its ``state=`` (for the errors).
        make_system: makes the control plane (default `system.ProcessSystem`;
            tests put one here that runs the groups in this process).

    Raises:
        TypeError / ValueError / NetError: see `placement.check_placement`,
            `placement.resolve_factory`; a group built another net (names the
            group and the differences).
        NodeError: an ``on_start`` or ``load_state_dict`` raised in a group.
        RuntimeError: called while a process of a run imports the main script, or
            the run's first process refused to start for that reason (a main
            script that starts the run at its top level: the main guard).
    """
    _check_not_bootstrapping()
    factory, ref = resolve_factory(net, placement.net_kwargs)
    built = build_net(factory, ref.kwargs)
    found = walk(built)
    # The start warnings of one process, said here, once: the groups' kernels say none.
    warn_unknown_hooks(found)
    for path, node in found:
        node._mujou_path = path
    # params=: the host's copy (its own group's kernel runs it), and each group's (_launch).
    set_values(args.params, found)
    ports = collect_ports(found)
    plan = check_placement(placement, found, ports)  # Placement checked listen= against it
    _warn_unused_fallbacks(plan.machines, args.supervisor)
    initial = resolve_inputs(ports, inputs)
    warn_suspect_net(found, ports, initial, args.end_s)
    if args.tree is not None:
        check_fit(args.tree, found, ports, state)
    seeds = settle_seeds(found, args.tree, args.seed)
    warn_loops(found, args.max_delta_cycles)  # last, as one process warns
    recorded = None
    if args.recording is not None:
        from ..recording.recorder import select_outputs

        recorded = select_outputs(ports, args.recording.ports)
    if make_system is None:
        from .system import ProcessSystem

        # Every group runs the package's group server: imported once, the groups forked.
        make_system = functools.partial(ProcessSystem,
                                        preload=(GROUP_TARGET.partition(":")[0],))
    run = _launch(built, found, ports, plan, ref, initial, seeds, args, make_system, placement,
                  record=None if recorded is None else (recorded, dict(placement.groups)))
    return run


def _check_not_bootstrapping() -> None:
    """Refuse a placed run started while a process of a run imports the main script.

    Each group process imports the host's main script again, as the ``spawn``
    start method does (`_mainscript.import_main`); a script that calls
    ``mujou.run`` at its top level would start a run from each of them.

    Raises:
        RuntimeError: this is such an import (says to use the main guard).
    """
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        message = ("mujou.run(placement=...) was called while a new process of a placed run "
                   "was importing the main script: put the code that starts the run under "
                   "`if __name__ == \"__main__\":` (the group processes import the script "
                   "again, as multiprocessing's spawn does)")
        from .admin import refuse_start

        refuse_start(message)  # the host raises it too, at once, rather than wait for us
        raise RuntimeError(message)


# How long a member's admin may take to answer: it is single-threaded, and the
# first actor of the package it creates makes it import that actor's module for
# the capability check (no torch: about 0.1 s, seconds on a loaded machine).
MEMBER_ANSWER_S = 5.0
# How long a member may stay silent (no answer, no refusal) before a start on it gives
# it up: a loaded machine's admin may be busy for seconds (the import, the creation).
MEMBER_SILENT_S = 15.0


class _Convention:
    """The run's side of a convention of machines: its leader's settings, secret, members."""

    def __init__(self, plan: PlacementPlan, placement: Placement, timeout: float) -> None:
        from . import convention
        from .secret import load_secret

        self.key = load_secret()  # the data plane's; a clear error says how to set one
        assert placement.listen is not None  # Placement requires it with machines
        self.admin = convention.leader_admin(placement.listen,
                                             allow_remote=placement.allow_remote)
        self.member_of = {g: on[0] for g, on in plan.machines.items()}
        self.machines = dict(plan.machines)
        self._join_timeout = placement.join_timeout
        self.addresses: dict[str, str] = {}
        self._heartbeat_timeout = placement.heartbeat_timeout
        self._silent_since: dict[str, float] = {}  # members found silent (answers)
        self.monitor: Any = None

    def start_monitor(self) -> None:
        """The heartbeat's `heartbeat.Monitor`, on the leader's address (a free port)."""
        from .heartbeat import PERIOD_S, Monitor

        period = min(PERIOD_S, self._heartbeat_timeout / 4)
        self.monitor = Monitor(f"tcp://{self.admin.host}:*", period=period,
                               timeout=self._heartbeat_timeout, secret=self.key)

    @property
    def _leader(self) -> tuple[str, int]:
        """Where this machine reaches the leader's admin (loopback for a wildcard bind)."""
        return (self.admin.host if self.admin.host != ANY else LOOPBACK, self.admin.port)

    def wait_for_members(self) -> None:
        """Wait for every member the placement names (`convention.wait_for_members`)."""
        from . import convention

        convention.wait_for_members(self._leader, self.member_of.values(), self._join_timeout)
        for info in convention.known_members(self._leader, MEMBER_ANSWER_S) or []:
            self.addresses[info.name] = info.address.rpartition(":")[0]

    def answers(self, member: str) -> bool:
        """Whether ``member`` may still be up (`convention.member_state`).

        The start of a group on a machine asks this every second
        (`system.ProcessSystem.member_check`): a machine that died after it
        was chosen fails the start then. False when it is gone (not listed,
        or its admin's port refuses), or silent for `MEMBER_SILENT_S` (a busy
        admin answers late, not never); True otherwise, and when the leader's
        own admin does not answer (no verdict).
        """
        from . import convention

        now = time.monotonic()
        try:
            state = convention.member_state(self._leader, member, MEMBER_ANSWER_S)
        except (ConnectionError, ValueError):
            return True
        if state is not None:
            self._silent_since.pop(member, None)
            return state
        since = self._silent_since.setdefault(member, now)
        return time.monotonic() - since < MEMBER_SILENT_S

    def lost(self, group: str) -> bool:
        """Whether the heartbeat has lost ``group`` (and it has not answered since)."""
        status = self.monitor.members().get(group)
        return status is not None and status.lost

    def choose(self, group: str) -> str:
        """The member to restart ``group`` on: the first of its machines that answers
        (the one it ran on, once back, or a fallback), waited for up to ``join_timeout``.

        Raises:
            JoinTimeoutError: none of them answered in time (names them).
        """
        from ..errors import JoinTimeoutError
        from . import convention

        leader = self._leader
        names = self.machines[group]
        deadline = time.monotonic() + self._join_timeout
        known: dict[str, Any] = {}
        while True:
            try:
                known = convention.members(leader, timeout=MEMBER_ANSWER_S)
            except ConnectionError:
                known = {}
            for name in names:
                if name in known:
                    return name
            if time.monotonic() >= deadline:
                raise JoinTimeoutError(tuple(names), known, f"{leader[0]}:{leader[1]}",
                                       self._join_timeout)
            time.sleep(0.2)

    def endpoint(self) -> str:
        """Where the host binds a group's data plane on another machine (any free port)."""
        return f"tcp://{self.admin.host}:0"

    def member_address(self, member: str) -> str:
        """The address ``member`` advertises (its admin's, as the leader lists it); loopback
        for a member the listing no longer has (then no peer reaches it: the relay)."""
        if member not in self.addresses:
            from . import convention

            for info in convention.known_members(self._leader, MEMBER_ANSWER_S) or []:
                self.addresses[info.name] = info.address.rpartition(":")[0]
        return self.addresses.get(member, LOOPBACK)

    def peer_host(self, machine: str, toward: str) -> str:
        """Where a group on ``machine`` (``""``: the host's) listens for its peer link to a
        group on ``toward`` (`peers.CrossLinks`): the address the member advertises, or
        the leader's for the host's machine; for a wildcard leader, the address this
        machine reaches ``toward``'s from (loopback unless the placement says otherwise)."""
        if machine:
            return self.member_address(machine)
        if self.admin.host != ANY:
            return str(self.admin.host)
        from .convention import _outward_address

        try:
            return str(_outward_address(self.member_address(toward))) if toward else LOOPBACK
        except ConnectionError:  # no route to it: no link either (the relay, said so)
            return LOOPBACK

    def advertised(self, endpoint: str, member: str) -> str:
        """``endpoint`` as the member reaches it (a wildcard bind: this machine's address
        toward the member's)."""
        if self.admin.host != ANY:
            return endpoint
        from .convention import _outward_address

        port = endpoint.rpartition(":")[2]
        return f"tcp://{_outward_address(self.addresses.get(member, LOOPBACK))}:{port}"


def _launch(built: Any, found: list[tuple[str, Node]], ports: dict[str, Port],
            plan: PlacementPlan, ref: FactoryRef, initial: list[tuple[Input, Any]],
            seeds: dict[str, int], args: Any, make_system: Callable[..., Any],
            placement: Placement,
            record: tuple[list[str], dict[str, str]] | None = None) -> PlacedRun:
    """Start the processes and the host's kernel, check them, run the start phase.

    ``record``: the Outputs to record (``record=``) and the placement, or None.
    """
    from .._runtime.workers import default_workers

    run_id = f"mujou-{os.getpid()}-{secrets.token_hex(3)}-"  # its shared-memory pools
    system = None
    local: Kernel | None = None
    groups: dict[str, _Group] = {}
    host_nodes = plan.nodes.get(HOST_GROUP, [])
    trace = None  # each process that runs nodes records its share (distributed/tracing.py)
    if args.tracer is not None:
        trace = tracing.PlacedTrace(args.tracer, len(plan.groups) + bool(host_nodes))
    tmpdir = ""
    driver: _Driver | None = None
    conv = _Convention(plan, placement, args.start_timeout) if plan.machines else None
    try:
        if conv is None:
            system = make_system(start_timeout=args.start_timeout)
        else:
            system = make_system(start_timeout=args.start_timeout, admin=conv.admin)
            conv.wait_for_members()
            conv.start_monitor()
            system.lost_check = conv.lost
            system.member_check = conv.answers
        # The data plane's socket files go in the control plane's private folder when it
        # has one (its coordinator removes it even when the host is killed).
        folder = getattr(system, "folder", None)
        tmpdir = tempfile.mkdtemp(prefix="data-", dir=folder)
        def workers(n: int) -> int:
            return args.workers if args.workers is not None else default_workers(n)

        # CUDA tensors between groups by CUDA IPC: one machine only, and asked for
        # (MUJOU_CUDA_IPC=1) until a GPU run has checked it (benchmarks/gpu_check.py).
        cuda_ipc = conv is None and os.environ.get("MUJOU_CUDA_IPC") == "1"
        # The host builds its own copy of the net for its group (the one it checked).
        for i, name in enumerate(plan.groups):
            member = None if conv is None else conv.member_of.get(name)
            routes = dataplane.Routes(found, {})
            if member is None:
                address: str = f"ipc://{tmpdir}/g{i}"
                pools: str | None = f"{run_id}{i}-"
                link = dataplane.HostLink(address, routes, pools, cuda_ipc=cuda_ipc)
                reach = address
            else:  # on another machine: TCP with the secret's CURVE, no shared memory
                assert conv is not None
                address, pools = conv.endpoint(), None
                link = dataplane.HostLink(address, routes, None, conv.key)
                reach = conv.advertised(link.endpoint, member)
            kwargs = {"group": name, "factory": ref.ref, "net_kwargs": ref.kwargs,
                      "nodes": plan.nodes[name], "seed": args.seed,
                      # The seeds settled here (a tree's, derived, or random): every
                      # process seeds as run.seeds says, a restored run as one process.
                      "seeds": {p: seeds[p] for p in plan.nodes[name]},
                      "workers": workers(len(plan.nodes[name])), "address": reach,
                      "host_pid": os.getpid() if member is None else 0,
                      "timer": "simulated" if args.timer.simulated else "realtime",
                      "pools": pools, "secure": member is not None, "cuda_ipc": cuda_ipc,
                      "check_read_only": args.check_read_only,
                      "max_delta_cycles": args.max_delta_cycles,
                      # Its watchdog logs a hook that does not return, as one process's does.
                      "stop_timeout": args.stop_timeout,
                      # params=, the group's nodes' part: set on the net each build makes.
                      "params": _params_of(args.params, plan.nodes[name]),
                      # The host's torch settings (threads only on its own machine).
                      "torch_settings": torch_settings(threads=member is None)}
            if member is not None:
                assert conv is not None
                kwargs["heartbeat"] = conv.advertised(conv.monitor.address, member)
            if trace is not None:
                kwargs["trace"] = trace.share
            groups[name] = _Group(name, link, plan.nodes[name], 0, spawn=kwargs,
                                  base_address=address, member=member,
                                  key=None if conv is None else conv.key)
        _start_groups(system, groups, plan.groups, args.start_timeout)
        for g in groups.values():  # in once the group connected (another secret: refused)
            g.link.handshake(args.start_timeout)
            if conv is not None and g.member is not None:
                g.watched_ns = time.monotonic_ns()
                conv.monitor.watch(g.name)  # answering already: it started
        kind = "simulated" if args.timer.simulated else "realtime"
        wake = dataplane.Wake()

        def make_local(net: Any) -> Kernel:
            set_values(args.params, walk(net))  # (a rebuilt net is the factory's again)
            kernel = Kernel(net, host_nodes, workers=workers(len(host_nodes)),
                            seed=args.seed, seeds=seeds, timer=kind,
                            notify=wake.set if kind == "realtime" else None, subtrees=False,
                            trace=None if trace is None else trace.share,
                            max_delta_cycles=args.max_delta_cycles,
                            check_read_only=args.check_read_only)
            return kernel if trace is None else trace.local.track(kernel)

        if host_nodes:
            local = make_local(built)
            routes = dataplane.Routes(found, local.ports)
            local_link = LocalLink(local, routes, wake.set if kind == "realtime" else None)
            if cuda_ipc:  # relayed CUDA tensors are opened for the host's own nodes
                local_link.opener = cudaipc.LocalOpener(cudaipc.TorchIpc())
                cudaipc.to_host_without_cuda(local_link.opener.importer, local.actors)
            groups[HOST_GROUP] = _Group(HOST_GROUP, local_link, host_nodes, os.getpid(),
                                        remote=False)
        expected = net_signature(found)
        for name in plan.groups:
            check_same_net(system, name, expected, args.start_timeout)
        routes = dataplane.Routes(found, {})
        driver = _Driver(system=system, groups=groups, routes=routes, ports=ports,
                         owner=plan.group_of, found=found, seeds=seeds,
                         end_ns=None if args.end_s is None else round(args.end_s * 1e9)
                         + (args.tree["time_ns"] if args.tree is not None else 0),
                         stop_timeout=args.stop_timeout, tmpdir=tmpdir, local=local,
                         supervisor=args.supervisor, start_timeout=args.start_timeout,
                         rebuild=lambda: make_local(build_net(factory_of(ref), ref.kwargs)),
                         signature=expected, realtime=kind == "realtime", wake=wake,
                         run_id=run_id, trace=trace,
                         monitor=None if conv is None else conv.monitor,
                         choose_member=None if conv is None else conv.choose,
                         peer_host=None if conv is None else conv.peer_host)
        if record is not None:  # before the start phase: on_start's messages are recorded
            _record(driver, found, ports, seeds, args, *record)
    except BaseException:
        if record is not None and driver is not None and driver.recorder is not None:
            driver.recorder.close(None, "the run did not start", 1.0)
        _abandon(system, groups, local, tmpdir, run_id)
        if conv is not None and conv.monitor is not None:
            conv.monitor.close()
        raise
    run = PlacedRun(driver, ports, seeds, found)
    try:
        driver.start_phase(initial, args.tree, args.start_timeout)
    except BaseException:
        driver.stop_asked.set()
        driver.end.finish()
        raise
    driver.thread.start()
    return run


def _record(driver: _Driver, found: list[tuple[str, Node]], ports: dict[str, Port],
            seeds: dict[str, int], args: Any, recorded: list[str],
            placement: dict[str, str]) -> None:
    """Record a placed run on the host: every recorded Output's group publishes its messages.

    Each group sends the host a copy of every message of its recorded Outputs
    with its key (`group.Published`), the host's own group's included; the
    driver hands them to the recorder as it routes them (`_Driver.listen_items`),
    so the file holds what one process would record.
    """
    from ..recording.mcapfile import ChannelSpec
    from ..recording.recorder import Recorder, run_metadata

    order = {path: i for i, (path, _) in enumerate(found)}
    channels = []
    for path in recorded:
        node_path = ports[path].node._mujou_path
        channels.append(ChannelSpec.of(ports[path], node_path, order[node_path]))
    metadata = run_metadata(found, ports, seeds=seeds, seed=args.seed,
                            timer="simulated" if args.timer.simulated else "realtime",
                            workers=args.workers, placement=placement,
                            patterns=args.recording.ports, log=args.recording.log)
    # The log's records: the host process's, and each group process's, forwarded to the
    # recorder's tap by the driver while it is attached (grouplog.py).
    recorder = Recorder(args.recording, channels, metadata, simulated=args.timer.simulated,
                        host_copy=None, now_ns=lambda: driver.time_ns)
    driver.recorder = recorder
    for ch, path in enumerate(recorded):
        driver.listen_items(path, recorder.item_hook(ch))
    recorder.start()


def _start_groups(system: Any, groups: dict[str, _Group], names: list[str],
                  timeout: float) -> None:
    """Start the group processes, at once where the control plane can (their imports overlap)."""
    members = {n: m for n in names if (m := groups[n].member) is not None}
    try:
        _start_each(system, groups, names, timeout, members)
    except Exception as exc:
        failure = _refused_member(exc, members) or exc
        if members:  # say where, and what a machine must have, when one of them failed
            failure.add_note("Groups on other machines: " + ", ".join(
                f"{n!r} on {m!r}" for n, m in members.items()) + ". Each machine must import "
                "the net factory by the same name (an installed package, or PYTHONPATH "
                "there) and hold the host's MUJOU_SECRET (docs/machines.md).")
        if failure is exc:
            raise
        raise failure from exc


def _start_each(system: Any, groups: dict[str, _Group], names: list[str], timeout: float,
                members: dict[str, str]) -> None:
    """`_start_groups`' work: every group at once if the control plane can, else in turn."""
    # On other machines: the host's ends of the links take their handshakes while the
    # groups start, so connections refused there are logged as they come.
    watch = {"check": functools.partial(_take_handshakes, groups, members)} if members else {}
    many = getattr(system, "start_groups", None)
    if many is not None and len(names) > 1:
        pids = many({n: (GROUP_TARGET, groups[n].spawn) for n in names}, timeout,
                    **({"members": members} if members else {}), **watch)
        for n in names:
            groups[n].pid = pids[n]
        return
    for n in names:
        on = {"member": members[n]} if n in members else {}
        groups[n].pid = system.start_group(n, GROUP_TARGET, groups[n].spawn, timeout,
                                           **on, **watch)


def _take_handshakes(groups: dict[str, _Group], members: dict[str, str]) -> None:
    """Take the handshakes of the host's ends of the links to other machines so far
    (`dataplane.HostLink.check_handshake`): a refused connection is counted and logged,
    never an error (anyone may connect; the group's own refusal fails its start)."""
    for name in members:
        groups[name].link.check_handshake()


def _refused_member(exc: BaseException, members: Mapping[str, str]) -> Exception | None:
    """A group on another machine whose own handshake the host refused, as the host's
    `HandshakeError` naming the group and its machine; None for any other failure."""
    from ..errors import HandshakeError, RemoteError

    if not isinstance(exc, RemoteError) or exc.group not in members:
        return None
    remote = exc.exception
    if not isinstance(remote, HandshakeError) or remote.server:
        return None
    return HandshakeError(remote.address, f"{remote.reason} (group {exc.group!r} on machine "
                          f"{members[exc.group]!r}, which must hold the host's MUJOU_SECRET)",
                          server=False)


def factory_of(ref: FactoryRef) -> Callable[..., Any]:
    """The factory function of ``ref`` in this process."""
    from .placement import load_factory
    return load_factory(ref.ref)


def _abandon(system: Any, groups: dict[str, _Group], local: Kernel | None, tmpdir: str,
             run_id: str) -> None:
    """Undo a start that failed before the driver existed: processes, sockets, the kernel."""
    if local is not None:
        local.stop(1.0)
    if system is not None:
        try:
            system.shutdown(10.0)
        except BaseException as exc:
            log.error("placed run: shutting the processes down failed: %s", describe(exc))
    for g in groups.values():
        g.link.close()
    wire.remove_blocks(run_id)
    if tmpdir:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _params_of(values: dict[str, Any] | None, nodes: list[str]) -> dict[str, Any] | None:
    """The part of ``mujou.run(params=)`` whose parameters belong to ``nodes`` (paths)."""
    if not values:
        return None
    own = set(nodes)
    return {path: value for path, value in values.items()
            if path.rpartition(".")[0] in own}
