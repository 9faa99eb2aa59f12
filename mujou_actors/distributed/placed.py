"""``mujou.run(make_net, placement=...)``: check, start the group processes, hand over.

`start` is the part of `mujou.run` for a placed run: the host builds the
net once to check it and the placement (`placement.py`), starts one process
per group on the control plane (`system.ProcessSystem`) and its own group's
kernel, checks that every group built the same net, runs the start phase,
and hands over to the driver (`driver.py`), which alone talks to the groups
from then on. The run it returns is a `placed_run.PlacedRun`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from .._runtime.kernel import Kernel
from ..errors import (
    describe,
)
from ..net import check_fit, collect_ports, resolve_inputs, settle_seeds, walk
from ..node import Node
from ..ports import Input, Port
from . import dataplane, tracing, wire
from .driver import (
    GROUP_TARGET,
    RemoteTraceback,
    _Driver,
    _Group,
    _LocalLink,
    _start_phase,
    check_same_net,
)
from .placed_run import PlacedRun
from .placement import (
    HOST_GROUP,
    FactoryRef,
    Placement,
    build_net,
    check_placement,
    net_signature,
    resolve_factory,
)

log = logging.getLogger("mujou_actors")


__all__ = ["start", "Machines", "PlacedRun", "RemoteTraceback"]

log = logging.getLogger("mujou_actors")


# ---------------------------------------------------------------------------
# the start: check -> processes -> same net? -> on_start -> state, inputs -> timer


@dataclasses.dataclass(frozen=True)
class Machines:
    """`mujou.run`'s arguments for a run across machines (checked there).

    Attributes:
        listen (str | None): ``"HOST:PORT"`` of the convention's leader (this
            process), or None (one machine).
        join_timeout (float): wall seconds to wait for the members named.
        allow_remote (bool): ``listen`` may be off loopback.
    """

    listen: str | None = None
    join_timeout: float = 30.0
    allow_remote: bool = False


def start(net: Any, *, placement: Mapping[str, str], net_kwargs: Mapping[str, Any] | None,
          args: Any, inputs: Mapping[Input | str, Any] | None, state: Any,
          make_system: Callable[..., Any] | None = None,
          machines: Machines = Machines()) -> PlacedRun:
    """Start a placed run: the part of `mujou.run` for ``placement`` (its arguments checked).

    Args:
        net: the net factory (a module-level function, or ``"module:function"``).
        placement (Mapping[str, str]): node path -> group.
        net_kwargs (Mapping[str, Any], optional): the factory's keyword arguments.
        args: `mujou.run`'s other arguments, checked (run.py's ``_Arguments``).
        inputs: ``inputs=`` of `mujou.run`; state: its ``state=`` (for the errors).
        make_system: makes the control plane (default `system.ProcessSystem`;
            tests put one here that runs the groups in this process).
        machines (Machines): where the convention of machines listens, if any.

    Raises:
        TypeError / ValueError / NetError: see `placement.check_placement`,
            `placement.resolve_factory`; a group built another net (names the
            group and the differences).
        NodeError: an ``on_start`` or ``load_state_dict`` raised in a group.
    """
    _check_not_bootstrapping()
    factory, ref = resolve_factory(net, net_kwargs)
    built = build_net(factory, ref.kwargs)
    found = walk(built)
    for path, node in found:
        node._mujou_path = path
    ports = collect_ports(found)
    plan = check_placement(placement, found, ports)
    if plan.machines:
        group, on = next(iter(plan.machines.items()))
        if machines.listen is None:
            raise ValueError(f"mujou.run: placement puts group {group!r} on machine {on[0]!r}: "
                             f"pass listen='HOST:PORT', where this process leads the "
                             f"machines' convention (what `mujou worker --join` names)")
        raise ValueError(f"mujou.run: placement puts group {group!r} on machine {on[0]!r}: "
                         f"placing a group on another machine is not supported yet; name a "
                         f"group of this machine")
    elif machines.listen is not None:
        raise ValueError(f"mujou.run: listen={machines.listen!r} goes with a placement that "
                         f"puts groups on other machines ('machine:group'); this one names "
                         f"none")
    initial = resolve_inputs(ports, inputs)
    if args.tree is not None:
        check_fit(args.tree, found, ports, state)
    seeds = settle_seeds(found, args.tree, args.seed)
    if make_system is None:
        from .system import ProcessSystem
        make_system = ProcessSystem
    return _launch(built, found, ports, plan, ref, initial, seeds, args, make_system)


def _check_not_bootstrapping() -> None:
    """Refuse a placed run started while a process of a run imports the main script.

    The ``spawn`` start method imports the host's main script again in every
    process it starts; a script that calls ``mujou.run`` at its top level
    would start a run from each of them.

    Raises:
        RuntimeError: this is such an import (says to use the main guard).
    """
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(
            "mujou.run(placement=...) was called while a new process of a placed run was "
            "importing the main script: put the code that starts the run under "
            "`if __name__ == \"__main__\":` (the group processes import the script again, "
            "as multiprocessing's spawn does)")


def _launch(built: Any, found: list[tuple[str, Node]], ports: dict[str, Port],
            plan: Placement, ref: FactoryRef, initial: list[tuple[Input, Any]],
            seeds: dict[str, int], args: Any, make_system: Callable[..., Any]) -> PlacedRun:
    """Start the processes and the host's kernel, check them, run the start phase."""
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
    try:
        system = make_system(start_timeout=args.start_timeout)
        # The data plane's socket files go in the control plane's private folder when it
        # has one (its coordinator removes it even when the host is killed).
        folder = getattr(system, "folder", None)
        tmpdir = tempfile.mkdtemp(prefix="data-", dir=folder)
        def workers(n: int) -> int:
            return args.workers if args.workers is not None else default_workers(n)

        # The host builds its own copy of the net for its group (the one it checked).
        for i, name in enumerate(plan.groups):
            address = f"ipc://{tmpdir}/g{i}"
            routes = dataplane.Routes(found, {})
            pools = f"{run_id}{i}-"
            link = dataplane.HostLink(address, routes, pools)
            kwargs = {"group": name, "factory": ref.ref, "net_kwargs": ref.kwargs,
                      "nodes": plan.nodes[name], "seed": args.seed,
                      "workers": workers(len(plan.nodes[name])), "address": address,
                      "host_pid": os.getpid(),
                      "timer": "simulated" if args.timer.simulated else "realtime",
                      "pools": pools}
            if trace is not None:
                kwargs["trace"] = trace.share
            groups[name] = _Group(name, link, plan.nodes[name], 0, spawn=kwargs,
                                  base_address=address)
        _start_groups(system, groups, plan.groups, args.start_timeout)
        kind = "simulated" if args.timer.simulated else "realtime"
        wake = dataplane.Wake()

        def make_local(net: Any) -> Kernel:
            kernel = Kernel(net, host_nodes, workers=workers(len(host_nodes)),
                            seed=args.seed, timer=kind,
                            notify=wake.set if kind == "realtime" else None, subtrees=False,
                            trace=None if trace is None else trace.share)
            return kernel if trace is None else trace.local.track(kernel)

        if host_nodes:
            local = make_local(built)
            routes = dataplane.Routes(found, local.ports)
            groups[HOST_GROUP] = _Group(HOST_GROUP, _LocalLink(local, routes, wake.set if
                                                               kind == "realtime" else None),
                                        host_nodes, os.getpid(), remote=False)
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
                         run_id=run_id, trace=trace)
    except BaseException:
        _abandon(system, groups, local, tmpdir, run_id)
        raise
    run = PlacedRun(driver, ports, seeds, found)
    try:
        _start_phase(driver, initial, args.tree, args.start_timeout)
    except BaseException:
        driver.stop_asked.set()
        driver._finish()
        raise
    driver.thread.start()
    return run


def _start_groups(system: Any, groups: dict[str, _Group], names: list[str],
                  timeout: float) -> None:
    """Start the group processes, at once where the control plane can (their imports overlap)."""
    many = getattr(system, "start_groups", None)
    if many is not None and len(names) > 1:
        pids = many({n: (GROUP_TARGET, groups[n].spawn) for n in names}, timeout)
        for n in names:
            groups[n].pid = pids[n]
        return
    for n in names:
        groups[n].pid = system.start_group(n, GROUP_TARGET, groups[n].spawn, timeout)


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
