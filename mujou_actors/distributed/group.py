"""What runs in a group process: the group's nodes on a kernel, driven by the host.

`groupmain.serve`, the function the control plane calls in a new group
process (`system.ProcessSystem.start_group`), makes a `GroupServer` (or, in
real time, a `grouprt.RealTimeGroupServer`): it builds the whole net from the
factory, makes a `Kernel` for the group's nodes and connects to the host's
data plane. From then on

* the **data plane** (a ZeroMQ ``PAIR`` socket, on a thread of its own,
  ``mujou-group-<name>``) carries the global delta cycles: each request is a
  *grant* (the messages from other groups, a bound), each reply the group's
  sends to other groups and its next due key (`dataplane.py` has the frames);
* the **control plane** (Thespian asks, `GroupServer.handle`) carries start,
  restore, state at a cut, stats, host writes and reads, and stop.

The host never asks both at once: a control request comes only while the
group has no grant to run, so the kernel is paused for it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import zmq

from .. import snapshot
from .._checks import check_workers
from .._runtime.kernel import Kernel, OutsideSend
from .._runtime.keys import HOST_ORDER, Key
from .._runtime.loops import DEFAULT_MAX_DELTA_CYCLES
from .._runtime.watchdog import Watchdog
from ..devices import apply_torch_settings, numerics
from ..errors import AlgebraicLoopError, DeadlineMissError, NodeError, describe
from ..messages import copy_message
from ..net import synchronizers, walk
from ..params import set_values
from ..ports import Input
from . import cudaipc, dataplane, peers
from ._loopback import alive, signals_blocked
from .failures import Stuck
from .grouplog import GroupLog
from .heartbeat import Responder
from .placement import HOST_GROUP, build_net, load_factory, net_signature
from .secret import load_secret
from .tracing import KernelTraces

__all__ = ["versions", "shipped", "clock_origin", "host_write", "run_grant",
           "node_stats", "failure_of", "Published", "GroupServer", "Subscribe", "Describe",
           "Start", "Load", "TakeState", "Write", "Read", "Stats", "Stop", "Reset",
           "RestartNode", "SetParam", "Params", "RunFree", "Hold", "Release", "TakeTrace",
           "BindPeers", "ConnectPeers", "CheckPeers", "DropPeers", "PeerClocks", "Logs",
           "split_tree", "merge_trees",
           "Watcher", "stop_kernel", "Busy", "NodeFailed", "LocalLink"]

log = logging.getLogger("mujou_actors")


# -- control requests (Thespian pickles them: plain data only) -------------------------

class Describe(NamedTuple):
    """Ask for the group's `net_signature`, pid and ports (checked against the host's)."""


class Start(NamedTuple):
    """Run the group's ``on_start`` hooks (`Kernel.start`).

    Attributes:
        timeout (float): wall seconds for them.
    """

    timeout: float


class Load(NamedTuple):
    """Load the group's part of a state tree (snapshot-encoded bytes) after `Start`."""

    tree: bytes
    timeout: float


class TakeState(NamedTuple):
    """Take the group's part of the state at the current cut (snapshot-encoded reply)."""

    timeout: float


class Write(NamedTuple):
    """Deliver a message to one of the group's Inputs as the host (``run.write``, ``inputs=``).

    Attributes:
        input (str): the Input's path.
        message (bytes): the message, snapshot-encoded.
        key (tuple[int, int] | None): the delta cycle it comes in at (the
            latest frontier of all groups); None before the timers start (a
            write of ``inputs=``, as in one process).
    """

    input: str
    message: bytes
    key: tuple[int, int] | None = None


class Read(NamedTuple):
    """The newest message of one of the group's ports (``run.read``), snapshot-encoded."""

    port: str


class SetParam(NamedTuple):
    """Queue a parameter set on one of the group's nodes (``run.set_param``); the reply is its key.

    Attributes:
        node (str): the node's path.
        name (str): the parameter's name.
        value (bool | int | float | str): the value, checked by the host.
        key (tuple[int, int] | None): the key it applies from (a simulated
            run's next delta cycle, chosen by the driver); None: the group's
            kernel picks it (real time: now; before the timers start: the
            node's first update).
    """

    node: str
    name: str
    value: Any
    key: tuple[int, int] | None = None


class Params(NamedTuple):
    """Every parameter of the group's nodes and its value now (``run.params``)."""


class Subscribe(NamedTuple):
    """Send the host a copy of every later message of one of the group's Outputs."""

    output: str


class RunFree(NamedTuple):
    """Real time: start the group's timer and let its nodes run (after `Start`, `Load`).

    The answer is the timer's origin on this machine's ``time.monotonic_ns()``
    (run time ``t_ns`` is monotonic ``t_ns + origin``, to within a
    microsecond), int: the host puts its messages' stamps on its own clock
    with it (`realtime.MessageAges`).
    """


class Hold(NamedTuple):
    """Real time: pause at a consistent cut; the reply says whether it came in ``timeout``."""

    timeout: float


class Release(NamedTuple):
    """Real time: go on after `Hold`."""


class Reset(NamedTuple):
    """Stop the kernel and build a fresh net and kernel in this process (a restart).

    The data plane and the host's subscriptions stay; `Start` and `Load`
    follow. The reply lists the nodes left stuck in a hook by the stop.
    """

    timeout: float


class RestartNode(NamedTuple):
    """Restart one node of the group from a state (``one_for_one``; snapshot-encoded)."""

    path: str
    state: bytes


class Stats(NamedTuple):
    """The group's counts: per node and for the process (pid, CPU time, traffic)."""


class BindPeers(NamedTuple):
    """Listen for the peer links of mesh ``generation`` made ahead, one per peer.

    Each end is a ``PAIR`` socket: toward a peer of this member's machine
    (named in ``local``), bound to ``ipc://`` in the group's private folder
    (`peers.LocalFolder`, with shared memory); toward another machine, or
    where that cannot be made (said in the log, with why), bound to
    ``tcp://HOST:0`` on the address ``hosts`` names (the one this machine
    advertises), a CURVE server with the run's secret, which this process
    reads from its own environment (it never travels). The group holds it
    until its `peers.PeerMesh` of that generation takes it over
    (`peers.CrossLinks`). The reply is ``{peer: endpoint}``. Ends held of
    another generation are closed first.

    Attributes:
        generation (int): the mesh's generation.
        hosts (dict[str, str]): peer group -> the address to listen on (TCP).
        local (dict[str, str]): peer group of this machine -> the ``ipc://``
            socket's file name (``peer-GENERATION-KEY``).
    """

    generation: int
    hosts: dict[str, str]
    local: dict[str, str] | None = None


class ConnectPeers(NamedTuple):
    """Connect to the peers' listening ends of mesh ``generation`` (``ipc://`` with shared
    memory, or CURVE clients with the run's secret over ``tcp://``: `peers.connect_end`),
    held as `BindPeers`' ends are. No reply.

    Attributes:
        generation (int): the mesh's generation.
        endpoints (dict[str, str]): peer group -> its end's endpoint (`BindPeers`' reply).
    """

    generation: int
    endpoints: dict[str, str]


class CheckPeers(NamedTuple):
    """Wait up to ``timeout`` s for the CURVE handshake of the ends held for mesh
    ``generation`` that listen (``listening``) or connect; the reply is ``{peer: why}``
    for those that failed (empty: all in).

    A connecting end fails at once when its peer refuses it (another secret);
    a listening end counts the connections it refuses meanwhile (a stranger:
    `secret.Handshake`) and waits on for its peer. The host asks the
    connecting ends first, so a wrong secret is known at once, not after the
    listeners' bound.
    """

    generation: int
    timeout: float
    listening: bool = False


class DropPeers(NamedTuple):
    """Close every end held for a mesh not taken over yet (a failed `peers.CrossLinks`)."""


class PeerClocks(NamedTuple):
    """Real time: the timer origins of the groups on other machines that send to this one
    on the peer links of mesh ``generation``, for the ages of their messages.

    From then on the group notes, for each frame from one of them, its own
    monotonic clock at the arrival minus each send's stamp plus the sender's
    origin, in a ring per sending machine (`peers.AgeRing`; the figures'
    ``"peer_ages"``, `link_stats`). Origins of another generation than the
    group's mesh are kept for that mesh, or dropped by a later one. No reply.

    Attributes:
        generation (int): the mesh's generation.
        clocks (dict[str, tuple[str, int]]): peer group -> (its machine, ``""``
            for the host's; its timer origin on that machine's monotonic clock,
            `RunFree`'s answer).
    """

    generation: int
    clocks: dict[str, tuple[str, int]]


class Busy(NamedTuple):
    """The hooks in flight now, ``{node path: hook}`` (a grant the end gave up on names
    them: answered by the control thread while the grant's hook still runs)."""


class Logs(NamedTuple):
    """Forward the group's log records from ``level`` up (None: stop), and take them.

    The reply is ``(entries, dropped)``: the entries kept since the last
    `Logs`, oldest first, each ``(logging level, foxglove.Log object)`` of
    plain str and int, and how many were dropped meanwhile (`grouplog.GroupLog`).

    Attributes:
        level (int | None): the lowest `logging` level the host's log taps
            take; None: no tap (the group's handler comes off its root logger).
        loggers (dict[str, int]): the host's levels of `grouplog.MIRRORED`'s
            loggers, which the group's take while it forwards.
    """

    level: int | None
    loggers: dict[str, int]


class TakeTrace(NamedTuple):
    """The group's trace records (a traced run's; `tracing.KernelTraces.take`), after `Stop`.

    The reply is a list of plain-data parts (`Kernel.trace_part`), one per
    kernel the group ran (a restart makes a new one); empty when untraced.
    """


class Stop(NamedTuple):
    """Run ``on_stop`` and end the kernel's threads.

    The reply is ``(stuck, tree)``: ``{path: hook}`` of the nodes left stuck
    in a hook (`stop_kernel`), and with ``take_state`` the group's final
    state (snapshot-encoded bytes; None when a node is stuck, or when taking
    it raised: then the error is raised instead).

    Attributes:
        timeout (float): wall seconds for the ``on_stop`` hooks, then for the
            threads' exit.
        take_state (bool): take the final state too. Default: False.
        idle (float, optional): wall seconds for the hooks in flight first:
            what is left of the end's one ``stop_timeout`` (the driver's
            ``_stop_left``). Default: ``timeout``.
    """

    timeout: float
    take_state: bool = False
    idle: float | None = None


def split_tree(tree: Mapping[str, Any], paths: set[str]) -> dict[str, Any]:
    """The part of a state tree that belongs to the nodes ``paths`` (and their Inputs)."""
    def owner(port_path: str) -> str:
        return port_path.rpartition(".")[0]

    part = {k: v for k, v in tree.items() if k not in ("nodes", "seeds", "schedule",
                                                      "inputs", "pending", "sync", "params")}
    if "params" in tree:
        part["params"] = {p: v for p, v in tree["params"].items() if p in paths}
    for section in ("nodes", "seeds", "schedule"):
        part[section] = {p: v for p, v in tree.get(section, {}).items() if p in paths}
    for section in ("inputs", "pending"):
        part[section] = {p: v for p, v in tree.get(section, {}).items() if owner(p) in paths}
    if "sync" in tree:  # a synchronizer's path is its node's and its attribute's, as a port's
        part["sync"] = {p: v for p, v in tree["sync"].items() if owner(p) in paths}
    return part


# A step of a grant may take long (a slow hook); stop() ends it sooner (Kernel.stop).
STEP_LIMIT = 24 * 3600.0
# A grant gives the driver its turn back after this many wall seconds of delta cycles
# (see run_grant), so that host calls and a stop wait at most about this long.
SLICE_S = 0.05

# Wall seconds a group on another machine waits for its data plane's handshake
# with the host (CURVE, the run's secret) while it starts.
HANDSHAKE_S = 10.0

# A group on another machine ends itself once the host's heartbeat has not
# pinged it for this long (the host or the network is gone: nobody would
# stop it, and nobody reads what it does).
ORPHAN_S = 30.0


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


class Published:
    """Copies of the messages sent on the Outputs the host subscribed to, until the next reply.

    Each item is ``(t_ns, delta, sender order, output index, message)``, the
    key of the hook that sent it (what a recording keeps; subscribers read the
    message only).
    """

    def __init__(self, routes: dataplane.Routes,
                 notify: Callable[[], None] | None = None) -> None:
        self._routes = routes
        self._notify = notify  # real time: the data-plane thread ships them at once
        self.items: list[tuple[int, int, int, int, Any]] = []
        self._detach: dict[int, Any] = {}

    def listen(self, kernel: Kernel, output: str) -> None:
        """Collect every later message of ``output`` (idempotent)."""
        index = self._routes.output_index[output]
        if index in self._detach:
            return
        items = self.items
        notify = self._notify
        sender = kernel.sender_of(output)  # the item carries the send's key (a recording's)
        order = sender.order

        def listener(message: Any) -> None:
            t, delta = sender.stamp
            items.append((t, delta, order, index, copy_message(message)))  # list.append: atomic
            if notify is not None:
                notify()

        self._detach[index] = kernel.listen(output, listener)

    def reattach(self, kernel: Kernel) -> None:
        """Listen to the same Outputs of a fresh kernel (after a restart); drop the rest."""
        outputs = [self._routes.outputs[i] for i in self._detach]
        self._detach = {}
        del self.items[:]
        for output in outputs:
            self.listen(kernel, output)

    def take(self) -> list[tuple[int, int, int, int, Any]]:
        """What was published since the last call, in send order."""
        taken = self.items[:len(self.items)]
        del self.items[:len(taken)]
        return taken


POLL_S = 0.05


def _step(kernel: Kernel, due: Key, keep_waiting: Callable[[], bool] | None) -> Key | None:
    """One delta cycle of ``kernel``, waited for as `run_grant` says."""
    if keep_waiting is None:
        return kernel.step(until=due, timeout=STEP_LIMIT)
    while True:
        try:
            return kernel.step(until=due, timeout=POLL_S)
        except TimeoutError:  # the cycle goes on: wait again, unless told not to
            if not keep_waiting():
                raise


def versions() -> dict[str, str]:
    """The versions that must agree across the processes of a run (on other machines too)."""
    import msgpack
    import torch

    # The package is imported before any of its modules; importing it here would
    # make this module depend on all of it (docs/architecture.md, "Imports").
    package = sys.modules[__name__.partition(".")[0]]
    return {"mujou_actors": str(package.__version__), "torch": str(torch.__version__),
            "msgpack": ".".join(map(str, msgpack.version)), "python": ".".join(
                map(str, sys.version_info[:2]))}


def run_grant(kernel: Kernel, routes: dataplane.Routes, grant: dataplane.Grant,
              published: Published | None = None,
              keep_waiting: Callable[[], bool] | None = None) -> dataplane.Reply:
    """Deliver a grant's messages to ``kernel``, run the delta cycles it allows, report.

    The one rule of the conservative protocol on the group's side: run the
    due delta cycles up to ``grant.bound`` one at a time and stop after the
    first whose sends reach another group (their readers may then have work
    before this kernel's next key). Used by group processes and by the host
    for its own group alike.

    It also stops after the delta cycle in progress once `SLICE_S` wall
    seconds have passed, and reports its next key as always: a group whose
    sends never leave it (alone with no end, or far ahead of the others)
    would otherwise keep the driver from host calls and a stop for good.
    Where a grant pauses changes no result: the driver grants again from
    the same key.

    ``keep_waiting`` (the host's own group): a delta cycle is waited for in
    slices of `POLL_S`, and once it returns False the wait ends with
    TimeoutError (the host's way out of a stuck hook: a stop). Without it, a
    group process waits up to `STEP_LIMIT`; its way out is `Kernel.stop`
    from the control plane's thread.
    """
    for t, delta, sender, output, message in grant.messages:
        for reader in routes.local_readers(output):
            kernel.deliver(reader, message, t, delta, sender)
    if grant.settled is not None:
        kernel.settle(grant.settled)
    index = routes.output_index
    sends: list[OutsideSend] = []
    failure = None
    more: list[dict[str, Any]] = []
    if grant.bound is None:  # carry only (the start, a cut's last messages)
        if grant.take:  # on_start's sends (before the timer starts, or of a restart)
            sends = kernel.take_sends()
            due = kernel.next_due() if kernel.timing else None
        else:
            due = kernel.next_due()
    else:
        bound = grant.bound
        due = kernel.next_due()
        give_back = time.monotonic() + SLICE_S
        try:
            while due is not None and due <= bound:
                due = _step(kernel, due, keep_waiting)
                sends = kernel.take_sends()
                if sends or time.monotonic() > give_back:
                    break
        except NodeError as exc:
            # The delta cycle ran to its end: its sends and the next key are
            # reported with the failure, so that the driver (and a one_for_one
            # restart) goes on from exactly here.
            failure = failure_of(exc)
            more = [failure_of(f) for f in kernel.take_failures()]  # of the same cycle
            sends = kernel.take_sends()
            due = kernel.next_due()
    items = [(s.t_ns, s.delta, s.sender, index[s.output], s.message) for s in sends]
    return dataplane.Reply(due=due, time_ns=kernel.time_ns if kernel.timing else 0,
                           sends=items, failure=failure,
                           published=published.take() if published is not None else [],
                           frontier=kernel.frontier, more_failures=more)


def host_write(kernel: Kernel, input: str, message: Any, key: Key | None) -> None:
    """A host write into ``kernel``: at ``key`` (sorted before the nodes' sends of that
    delta cycle, triggering at the next), or as one process's host write before the timer."""
    if key is None:
        kernel.write(input, message)
    else:
        kernel.deliver(input, message, key[0], key[1], HOST_ORDER)


class NodeFailed(Exception):
    """A node's hook raised in a control request (`GroupServer.handle`): the failure as
    the data plane's replies carry it (`failure_of`), so the host raises the same
    `NodeError` for both: the node's path and hook, its group named, the remote
    traceback as the cause (the driver's ``ask``). It pickles, unlike `NodeError`.

    Attributes:
        failure (dict[str, Any]): `failure_of`'s record of the node's `NodeError`.
    """

    def __init__(self, failure: dict[str, Any]) -> None:
        super().__init__(failure["message"])
        self.failure = failure

    def __reduce__(self) -> tuple[Any, ...]:
        return (NodeFailed, (self.failure,))


class GroupServer:
    """A group's kernel in its process, with its data-plane thread and control requests.

    This class serves a simulated-time group (the host's grants drive its
    kernel); `grouprt.RealTimeGroupServer` extends it for real time.
    `groupmain.serve` makes the one for the run's timer.

    Args: as `groupmain.serve`.

    Raises:
        NetError, ValueError, TypeError: the factory cannot be imported, raised, or
            built a net the kernel refuses; ValueError also for a ``timer``
            that is not this class's `TIMER`.
    """

    TIMER = "simulated"  # the timer this class serves

    def __init__(self, *, group: str, factory: str, net_kwargs: bytes, nodes: list[str],
                 seed: int | None, workers: int, address: str, host_pid: int,
                 timer: str = "simulated", pools: str | None = None,
                 trace: int | None = None, secure: bool = False,
                 heartbeat: str | None = None, seeds: dict[str, int] | None = None,
                 check_read_only: bool = False,
                 max_delta_cycles: int = DEFAULT_MAX_DELTA_CYCLES,
                 stop_timeout: float = 10.0, cuda_ipc: bool = False,
                 params: dict[str, Any] | None = None,
                 torch_settings: dict[str, Any] | None = None) -> None:
        # Before the factory is imported and run: refused as mujou.run and Kernel refuse it.
        check_workers(workers, f"placed group {group!r}")
        if timer != self.TIMER:
            raise ValueError(f"placed group {group!r}: {type(self).__name__} serves the "
                             f"{self.TIMER!r} timer, not {timer!r} (`groupmain.serve` "
                             f"picks the server for the timer)")
        # The host's torch settings before the factory's module makes a tensor.
        apply_torch_settings(torch_settings, owner=f"placed group {group!r}")
        self._cuda_ipc = cuda_ipc is True
        self.group = group
        self._timer = timer
        self._max_delta = max_delta_cycles  # mujou.run(max_delta_cycles=), for each kernel
        self._check_read_only = check_read_only  # mujou.run(check_read_only=), likewise
        self._traces = KernelTraces(trace)
        self._wake = dataplane.Wake()
        self._build = (load_factory(factory), net_kwargs, nodes, workers, seed, seeds)
        self._params = params  # mujou.run(params=) of this group's nodes, set on each net
        self.kernel, found = self._make_kernel()
        self._counted: dict[str, dict[str, Any]] | None = None  # by replaced kernels (reset)
        self._signature = net_signature(found)
        self.routes = dataplane.Routes(found, self.kernel.ports)
        self.published = Published(self.routes,
                                   self._wake.set if timer == "realtime" else None)
        self._host_pid = host_pid
        # The run's log records made here, for the host's taps (none until it asks: Logs);
        # a server in the host's own process (the tests') never forwards: the taps see it.
        self.log = GroupLog(self._time, here=host_pid == os.getpid())
        self._started_ns = time.monotonic_ns()
        self._closing = threading.Event()
        self._mesh: peers.PeerMesh | None = None  # peer links, once asked for
        # Ends of peer links between machines made before their mesh (BindPeers,
        # ConnectPeers) on the control thread, taken over by the data-plane thread's
        # PeerMesh (`_held_peers`): (generation, {peer: link}), under the lock.
        self._held: tuple[int, dict[str, dataplane.PeerLink]] = (0, {})
        self._held_lock = threading.Lock()
        # The folder of its ipc:// ends toward groups of its member's machine (made at
        # the first; removed at its close, or when it finds the host gone).
        self._local = peers.LocalFolder()
        # Real time: the raw ages of messages from groups on other machines on peer links,
        # a ring per sending machine (for `link_stats`), and the senders' clocks of the
        # latest `PeerClocks`: (generation, {peer: (origin, ring)}).
        self._peer_ages: dict[str, peers.AgeRing] = {}
        self._peer_clocks: tuple[int, dict[str, tuple[int, peers.AgeRing]]] = (0, {})
        key = load_secret() if secure else None
        self._key = key  # the run's secret (a group of the host's machine reads it when asked)
        self._link = dataplane.GroupLink(address, self.routes, pools, key,
                                         cudaipc.TorchIpc() if self._cuda_ipc else None)
        self._link.blocked = self._end_if_host_gone
        if self._link.ipc is not None:  # no CUDA node here: received tensors on the CPU
            cudaipc.to_host_without_cuda(self._link.ipc[1], self.kernel.actors)
        self._responder: Responder | None = None
        try:
            self._link.handshake(HANDSHAKE_S)  # another secret: a clear error, not a hang
            if heartbeat is not None:
                with signals_blocked():  # its thread, like ours, leaves signals to Thespian's
                    self._responder = Responder(heartbeat, group, secret=key)
        except BaseException:
            self._link.close()
            raise
        self._thread = threading.Thread(target=self._serve, name=f"mujou-group-{group}",
                                        daemon=True)
        with signals_blocked():  # SIGCHLD and SIGTERM must reach Thespian's main thread
            self._thread.start()
        # A hook that does not return is logged here, as one process logs it: in
        # simulated time it holds every group, and the host only sees a grant unanswered.
        self._watcher = Watcher(self.kernel, stop_timeout, group)

    def _make_kernel(self) -> tuple[Kernel, list[tuple[str, Any]]]:
        factory, net_kwargs, nodes, workers, seed, seeds = self._build
        net = build_net(factory, net_kwargs)
        found = walk(net)
        set_values(self._params, found, f"placed group {self.group!r}")
        kernel = Kernel(net, nodes, workers=workers, seed=seed, timer=self._timer,
                        subtrees=False, trace=self._traces.capacity, seeds=seeds,
                        max_delta_cycles=self._max_delta,
                        check_read_only=self._check_read_only, outside_device=self._cuda_ipc,
                        **self._kernel_hooks())
        self._attach(kernel)
        return self._traces.track(kernel), found

    def _kernel_hooks(self) -> dict[str, Any]:
        """The kernel's ``notify`` and ``sent`` for this group's timer: none in simulated
        time (the host's grants drive the kernel)."""
        return {}

    def _attach(self, kernel: Kernel) -> None:
        """Set up what the group's data plane needs of a new kernel (before it starts)."""

    def reset(self, timeout: float) -> list[str]:
        """Stop the kernel; build a fresh net and kernel (a restart from a snapshot).

        Returns the nodes left stuck by the stop (their threads are left behind).
        """
        stuck = self.kernel.stop(timeout)
        self._counted = node_stats(self.kernel, self._counted)
        self.kernel, _ = self._make_kernel()
        self.published.reattach(self.kernel)
        self._watcher.watch(self.kernel)
        return stuck

    # -- the data plane -------------------------------------------------------------
    def _host_gone(self) -> bool:
        """Whether the host is gone: its pid (same machine), or its pings stopped."""
        if self._host_pid:
            return not alive(self._host_pid)
        responder = self._responder
        if responder is None:
            return False
        last = responder.last_ping_ns
        since = time.monotonic_ns() - (self._started_ns if last is None else last)
        return since > ORPHAN_S * 1e9

    def _end_if_host_gone(self) -> None:
        """End this process if the host is gone (`_host_gone`): no one is left to stop
        it cleanly. Also asked while a reply cannot go (`dataplane.HostLink.blocked`)."""
        if self._host_gone():
            log.warning("group %r: the host (pid %d) is gone; ending", self.group,
                        self._host_pid)
            self._closing.set()
            self._local.remove()  # no one else removes it (as the run's folder on the host's)
            os._exit(3)

    def _serve(self) -> None:
        """Answer grants until closed or the host is gone (its pid no longer exists)."""
        link = self._link
        while not self._closing.is_set():
            grant = link.receive(timeout=0.1)
            if grant is None:
                self._end_if_host_gone()
                continue
            if self._closing.is_set():
                break  # closing (told to, or its host is gone): a stopped kernel runs nothing
            if isinstance(grant.segment, str):
                continue  # a pause that crossed the segment's answer: that answer was it
            try:
                if grant.segment is not None:  # peer links (peers.py): it answers itself
                    self._run_segment(grant)
                    continue
                reply = run_grant(self.kernel, self.routes, grant, self.published)
            except BaseException as exc:  # reported to the host, never swallowed
                if self._closing.is_set():
                    # The kernel was stopped under the grant (the process is ending:
                    # its machine's admin, or its watchdog, closes it). No node failed;
                    # the host learns of the end as of any group's.
                    log.info("group %r: closing; the grant in flight ended with %s",
                             self.group, describe(exc))
                    break
                reply = dataplane.Reply(due=None, time_ns=self._time(), sends=[],
                                        failure=failure_of(exc))
            try:
                link.send(reply)
            except (TypeError, ValueError) as exc:
                # A message of an Input(object) port that the codec cannot carry: the
                # host hears of it (the run fails naming the port) instead of waiting.
                link.send(dataplane.Reply(due=None, time_ns=self._time(), sends=[],
                                          failure=failure_of(_not_crossing(exc, reply,
                                                                           self.routes))))
        if self._mesh is not None:
            self._mesh.close()
        link.close()
        self._wake.close()  # (made for every group; only real time polls it)

    def _run_segment(self, grant: dataplane.Grant) -> None:
        """A segment on peer links (`peers`), the mesh reopened for a new generation."""
        segment = grant.segment
        assert isinstance(segment, dataplane.Segment)
        mesh = self._mesh
        if mesh is None or mesh.generation != segment.generation:
            if mesh is not None:
                mesh.close()  # its counts go on in the new one
            if segment.mesh is None:
                raise RuntimeError(f"group {self.group!r}: a segment of mesh generation "
                                   f"{segment.generation} came without its mesh")
            kernel = self.kernel

            def waiting() -> None:
                """A connecting end waits for its peer to listen: a reset for a restore
                (the host gave the segment up), a close or the host's end ends it."""
                self._end_if_host_gone()
                if self.kernel is not kernel or self._closing.is_set():
                    raise peers.Abandoned

            try:
                self._mesh = peers.PeerMesh(self.group, segment.generation, segment.mesh,
                                            self.routes.declared, mesh,
                                            self._held_peers(segment.generation),
                                            waiting=waiting)
            except peers.Abandoned:
                self._mesh = mesh  # closed, its counts kept; the restore reopens the links
                return
            mesh = self._mesh
        kernel = self.kernel
        # A reset for a restore (`reset`: the kernel replaced) ends the segment: the host has
        # given it up, whether or not its abort gets here (every wait has a way out).
        peers.run_segment(kernel, self.routes, mesh, self._link, grant, self.published,
                          self._end_if_host_gone, _step, failure_of,
                          stale=lambda: self.kernel is not kernel)

    def _set_peer_clocks(self, request: PeerClocks) -> None:
        """`PeerClocks` (on the control thread): the senders' clocks for the mesh of that
        generation, kept for when it opens (real time: `grouprt`)."""
        rings = self._peer_ages
        clocks = {p: (int(origin), rings.setdefault(machine, peers.AgeRing()))
                  for p, (machine, origin) in request.clocks.items()}
        self._peer_clocks = (request.generation, clocks)

    # -- peer links between machines, made before their mesh -----------------------------
    def _held_peers(self, generation: int) -> dict[str, dataplane.PeerLink]:
        """The ends made for mesh ``generation``, handed to its `peers.PeerMesh` (on the
        data-plane thread: the control thread made them and touches them no more); those
        of another generation are closed."""
        with self._held_lock:
            held, links = self._held
            self._held = (generation, {})
        if held == generation:
            return links
        for link in links.values():
            link.close()
        return {}

    def _hold_peers(self, generation: int) -> dict[str, dataplane.PeerLink]:
        """The ends held for ``generation`` (those of another closed first); under the lock."""
        held, links = self._held
        if held != generation:
            for link in links.values():
                link.close()
            links = {}
            self._held = (generation, links)
        return links

    def _peer_key(self) -> bytes:
        """The run's secret for the peer links between machines (this machine's own)."""
        key = self._key
        if key is None:
            key = load_secret()  # required: no secret is a SecretError saying how to set one
            assert key is not None
            self._key = key
        return key

    def _bind_peers(self, request: BindPeers) -> dict[str, str]:
        local = request.local or {}
        with self._held_lock:
            links = self._hold_peers(request.generation)
            for peer, host in sorted(request.hosts.items()):
                old = links.pop(peer, None)
                if old is not None:
                    old.close()
                link = self._bind_local(peer, local[peer]) if peer in local else None
                if link is None:
                    link = dataplane.PeerLink(f"tcp://{host}:0", self.routes.declared,
                                              server=True, mine=None, theirs=None,
                                              secret=self._peer_key())
                links[peer] = link
            return {peer: links[peer].endpoint for peer in request.hosts}

    def _bind_local(self, peer: str, name: str) -> dataplane.PeerLink | None:
        """The listening ``ipc://`` end toward a group of this machine, or None (said why):
        TCP then, as between machines."""
        try:
            return self._local.bind(name, self.routes.declared)
        except (OSError, ValueError, zmq.ZMQError) as exc:
            log.warning("group %r: the peer link to group %r, on this machine too, takes "
                        "TCP with the run's secret: its ipc:// socket could not be made in "
                        "a private folder here: %s", self.group, peer, describe(exc))
            return None

    def _connect_peers(self, request: ConnectPeers) -> None:
        with self._held_lock:
            links = self._hold_peers(request.generation)
            for peer, endpoint in sorted(request.endpoints.items()):
                old = links.pop(peer, None)
                if old is not None:
                    old.close()
                links[peer] = peers.connect_end(endpoint, self.routes.declared,
                                                self._peer_key)

    def _check_peers(self, request: CheckPeers) -> dict[str, str]:
        from ..errors import HandshakeError

        deadline = time.monotonic() + request.timeout
        failed: dict[str, str] = {}
        with self._held_lock:
            held, links = self._held
            if held != request.generation:
                return {p: f"no end held for mesh generation {request.generation}"
                        for p in links}
            for peer, link in sorted(links.items()):
                if link.server != request.listening:
                    continue
                try:
                    link.handshake(max(0.0, deadline - time.monotonic()))
                except HandshakeError as exc:
                    failed[peer] = str(exc)
        return failed

    def _drop_held_peers(self) -> None:
        with self._held_lock:
            _, links = self._held
            self._held = (0, {})
        for link in links.values():
            link.close()

    def _time(self) -> int:
        try:
            return self.kernel.time_ns
        except Exception:
            return 0

    # -- the control plane ------------------------------------------------------------
    def handle(self, request: Any) -> Any:
        """Answer one control request (the classes above); called by the group actor.

        Raises:
            NodeFailed: a node's hook raised (on_start, load_state_dict,
                state_dict, ...): its `NodeError` as plain data, for the host.
            TypeError: an unknown request.
        """
        try:
            return self._answer(request)
        except NodeError as exc:
            raise NodeFailed(failure_of(exc)) from exc

    def _answer(self, request: Any) -> Any:
        """`handle` but for the form of a node's failure (a `NodeError` here)."""
        kernel = self.kernel
        if isinstance(request, Describe):
            return {"signature": self._signature, "pid": os.getpid(),
                    "versions": versions(), "numerics": numerics()}
        if isinstance(request, Start):
            with signals_blocked():  # the kernel's workers start here: no signals for them
                kernel.start(timeout=request.timeout)
            return None
        if isinstance(request, Load):
            kernel.load_state_dict(snapshot.loads(request.tree), timeout=request.timeout)
            return None
        if isinstance(request, TakeState):
            return snapshot.dumps(kernel.state_dict(timeout=request.timeout))
        if isinstance(request, Write):
            host_write(kernel, request.input, snapshot.loads(request.message), request.key)
            return None
        if isinstance(request, Read):
            return snapshot.dumps(kernel.read(request.port))
        if isinstance(request, SetParam):
            key = None if request.key is None else (int(request.key[0]), int(request.key[1]))
            return list(kernel.set_param(request.node, request.name, request.value, key))
        if isinstance(request, Params):
            return kernel.params.values()
        if isinstance(request, RunFree):
            kernel.run_free()
            return clock_origin(kernel)
        if isinstance(request, Hold):
            return kernel.hold(request.timeout)
        if isinstance(request, Release):
            kernel.release()
            return None
        if isinstance(request, Reset):
            return self.reset(request.timeout)
        if isinstance(request, RestartNode):
            kernel.restart_node(request.path, snapshot.loads(request.state))
            return None
        if isinstance(request, Subscribe):
            self.published.listen(kernel, request.output)
            return None
        if isinstance(request, Stats):
            return link_stats(kernel, self._link, self._counted, self._mesh, self._peer_ages)
        if isinstance(request, BindPeers):
            return self._bind_peers(request)
        if isinstance(request, ConnectPeers):
            self._connect_peers(request)
            return None
        if isinstance(request, CheckPeers):
            return self._check_peers(request)
        if isinstance(request, DropPeers):
            self._drop_held_peers()
            return None
        if isinstance(request, PeerClocks):
            self._set_peer_clocks(request)
            return None
        if isinstance(request, Busy):
            return kernel.dispatcher.busy_hooks()
        if isinstance(request, TakeTrace):
            return self._traces.take()
        if isinstance(request, Logs):
            return self.log.answer(request.level, dict(request.loggers))
        if isinstance(request, Stop):
            stuck = self.close(request.timeout, request.idle)
            tree = None
            if request.take_state and not stuck:
                tree = snapshot.dumps(kernel.state_dict(timeout=request.timeout))
            return stuck, tree
        raise TypeError(f"group {self.group!r}: unknown control request {request!r}")


    def close(self, timeout: float = 10.0, idle: float | None = None) -> dict[str, str]:
        """Stop the kernel (``on_stop``) and the data-plane thread; the stuck nodes' hooks.

        Idempotent (a second call finds none stuck); bounded by ``idle`` (the
        hooks in flight; default: ``timeout``) plus about twice ``timeout``.

        Returns:
            dict[str, str]: node path -> the hook it is stuck in (`stop_kernel`).
        """
        self._closing.set()
        self._watcher.close()
        stuck = stop_kernel(self.kernel, timeout, idle)
        self.log.configure(None, {})  # after on_stop: the host takes what is kept (Logs)
        self._thread.join(timeout)
        self._drop_held_peers()
        self._local.remove()  # its links are closed (or their process ends)
        if self._responder is not None:
            self._responder.close(timeout)
        return stuck


class Watcher:
    """The watchdog of a kernel outside `mujou.run`, on a thread of its own.

    `watchdog.Watchdog` itself, as one process's coordinator runs it: a hook
    still running ``limit`` wall seconds after it was first seen is logged (a
    warning naming the node, the hook, the instant and the group), and again
    after 2, 4, 8... times ``limit``. A group process logs it there (its
    records reach the host's stderr through the run's Thespian logger); the
    host's own group in the host. The thread wakes every half ``limit``.

    Args:
        kernel (Kernel): the kernel to watch (`watch` replaces it).
        limit (float): wall seconds, > 0 (the run's ``stop_timeout``).
        group (str): the group's name, said in each warning.
    """

    def __init__(self, kernel: Kernel, limit: float, group: str) -> None:
        self._limit = limit
        self._where = f" (in group {group!r})"
        self._dog = Watchdog(kernel.dispatcher, limit, self._where)
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"mujou-watchdog-{group}",
                                        daemon=True)
        with signals_blocked():  # in a group process, signals are Thespian's main thread's
            self._thread.start()

    def watch(self, kernel: Kernel) -> None:
        """Watch a fresh kernel instead (a restart's): its hooks are new ones."""
        self._dog = Watchdog(kernel.dispatcher, self._limit, self._where)

    def _watch(self) -> None:
        while not self._closing.wait(max(self._dog.next_look(), 0.001)):
            self._dog.look()

    def close(self) -> None:
        """End the thread (idempotent); it is out of any look within a moment."""
        self._closing.set()
        if self._thread is not threading.current_thread():
            self._thread.join(1.0)


def stop_kernel(kernel: Kernel, timeout: float, idle: float | None = None) -> dict[str, str]:
    """`Kernel.stop`, with the hook each stuck node is in (for `StopTimeoutError`).

    Args:
        kernel (Kernel): the group's kernel.
        timeout (float): wall seconds for the ``on_stop`` hooks, then the threads.
        idle (float, optional): wall seconds for the hooks in flight first.
            Default: ``timeout``.

    Returns:
        dict[str, str]: node path -> hook name (``on_stop`` for one that
        never returned from it); empty when none is stuck, or when the kernel
        was stopped before.
    """
    stuck = kernel.stop(timeout, idle)
    actors = {a.path: a for a in kernel.actors}
    return {p: kernel.dispatcher.hook_of(actors[p]) if actors[p].busy else "on_stop"
            for p in stuck}


def clock_origin(kernel: Kernel) -> int:
    """A running real-time kernel's timer origin on ``time.monotonic_ns()``, ns.

    The kernel's time ``t`` is monotonic ``t + origin``; read between two
    readings of the monotonic clock, so within half their gap (about a
    microsecond).
    """
    before = time.monotonic_ns()
    now = kernel.time_ns
    after = time.monotonic_ns()
    return (before + after) // 2 - now


def shipped(kernel: Kernel, routes: dataplane.Routes, published: Published,
            to_peers: Callable[[list[Any]], None] | None = None) -> list[dataplane.Reply]:
    """Real time: the replies that carry what ``kernel``'s nodes sent outside, published
    or failed since the last call (none when nothing happened); one reply per failure.

    ``to_peers`` (peer links: `peers.RealTimePeers.ship`) takes the sends
    (`Kernel.take_sends`) instead of the replies.
    """
    index = routes.output_index
    taken = kernel.take_sends()
    items = published.take()
    failures = kernel.take_failures()
    if to_peers is not None and taken:
        to_peers(taken)
        taken = []
    sends = [(s.t_ns, s.delta, s.sender, index[s.output], s.message) for s in taken]
    if not (sends or items or failures):
        return []
    first = failure_of(failures[0]) if failures else None
    replies = [dataplane.Reply(due=None, time_ns=kernel.time_ns, sends=sends, failure=first,
                               published=items)]
    replies += [dataplane.Reply(due=None, time_ns=kernel.time_ns, sends=[],
                                failure=failure_of(f)) for f in failures[1:]]
    return replies


def _not_crossing(exc: BaseException, reply: dataplane.Reply,
                  routes: dataplane.Routes) -> NodeError:
    """The failure of a reply whose messages could not be encoded: names the ports."""
    ports = sorted({routes.outputs[item[3]] for item in reply.sends + reply.published})
    path = ports[0].rpartition(".")[0] if len(ports) == 1 else ""
    # The codec names the batch's item and port index; the ports are named here already.
    why = re.sub(r"^item \d+ \(port \d+\): ", "", str(exc))
    err = NodeError(path, "send", f"a message sent on {', '.join(map(repr, ports))} cannot "
                    f"cross to another group process: {why}")
    err.__cause__ = exc
    return err


def failure_of(exc: BaseException) -> dict[str, Any]:
    """A failure as plain data for the host: node, hook, message, the remote traceback.

    A node that missed with ``on_miss="stop"`` (its cause a `DeadlineMissError`)
    is marked ``"restartable": False``: the host's supervisor stops the run for
    it, as one process's does (`failures.Failed.restartable`).
    """
    cause = exc.__cause__ if isinstance(exc, NodeError) and exc.__cause__ else exc
    text = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
    if isinstance(exc, AlgebraicLoopError):  # rebuilt as such on the host (driver)
        return {"path": exc.path, "hook": exc.hook, "message": str(exc), "traceback": text,
                "type": type(exc).__name__, "loop": [exc.nodes, exc.time_ns, exc.delta,
                                                     exc.loop]}
    if isinstance(exc, NodeError):
        failure: dict[str, Any] = {"path": exc.path, "hook": exc.hook, "message": str(exc),
                                   "traceback": text, "type": type(cause).__name__}
        if isinstance(cause, DeadlineMissError):
            failure["restartable"] = False
        return failure
    return {"path": "", "hook": "kernel", "message": f"{type(exc).__name__}: {exc}",
            "traceback": text, "type": type(exc).__name__}




def link_stats(kernel: Kernel, link: Any, counted: dict[str, dict[str, Any]] | None,
               mesh: peers.PeerMesh | None = None,
               ages: Mapping[str, peers.AgeRing] | None = None) -> dict[str, Any]:
    """A group's figures as plain counts for `Run.stats` (the host makes the frozen records).

    Args:
        kernel (Kernel): the group's kernel.
        link: its data plane's end (``messages_in``, ``messages_out``,
            ``bytes_in``, ``bytes_out``): a `dataplane.GroupLink`, or the host's
            own group's `LocalLink`.
        counted: the counts of the group's kernels a restart replaced (`node_stats`).
        mesh (peers.PeerMesh | None): its peer links, whose traffic adds to the
            link's (the meshes a restore closed included); None: none.
        ages (Mapping[str, peers.AgeRing] | None): real time, the raw ages of the
            messages that came on its peer links from groups on other machines, by
            sending machine (`peers.RealTimePeers`): ``"peer_ages"``, machine ->
            raw ages (ns), when there are any.
    """
    t = os.times()
    own = [link.bytes_in, link.bytes_out]
    traffic = [link.messages_in, link.messages_out, *own]
    if mesh is not None:
        traffic = [a + b for a, b in zip(traffic, mesh.traffic(), strict=True)]
    figures = {"pid": os.getpid(), "cpu": t.user + t.system, "host": socket.gethostname(),
               "nodes": node_stats(kernel, counted),
               "messages_in": traffic[0], "messages_out": traffic[1],
               "bytes_in": traffic[2], "bytes_out": traffic[3],
               # Where the bytes went: the link to the host, and each peer link (which of
               # them crossed machines: `placed_run.machine_stats`).
               "link_bytes": own, "peer_bytes": {} if mesh is None else mesh.peer_bytes(),
               "peer_refused": 0 if mesh is None else mesh.refused,
               "cuda_ipc": getattr(link, "ipc_stats", None),
               "syncs": {s.path: dataclasses.asdict(s.stats())
                         for s in synchronizers(kernel.ports)}}
    if ages:
        figures["peer_ages"] = {machine: ring.raw() for machine, ring in list(ages.items())}
    return figures


def node_stats(kernel: Kernel,
               before: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Each node's counts and timings as plain data, by path (for `Run.stats`).

    Args:
        kernel: the group's kernel.
        before: the counts of the kernels that restarts replaced (a
            ``one_for_all`` restart builds a fresh net and kernel), added in:
            one process's counts go on across a restart, and so do these.
    """
    nodes = {}
    for a in kernel.actors:
        drops = {name: p.drops for name, p in a.node._mujou_ports().items()
                 if isinstance(p, Input)}
        now = {"updates": a.updates, "overruns": a.overruns, "dt_sum": a.dt_sum,
               "dt_max": a.dt_max, "hook_ns": a.hook_ns, "drops": drops,
               "restarts": a.restarts, "timed": a.timed, "budget_misses": a.budget_misses,
               "deadline_misses": a.deadline_misses,
               "lateness": sorted(a.lateness_samples())}
        old = before.get(a.path) if before is not None else None
        if old is not None:
            for key in ("updates", "overruns", "dt_sum", "hook_ns", "restarts", "budget_misses",
                        "deadline_misses"):
                now[key] += old[key]
            now["dt_max"] = max(now["dt_max"], old["dt_max"])
            now["drops"] = {name: n + old["drops"].get(name, 0) for name, n in drops.items()}
            now["lateness"] = sorted(now["lateness"] + old["lateness"])
        nodes[a.path] = now
    return nodes


class LocalLink:
    """The host's own group's link: a kernel in this process, run by the driver's thread.

    It answers the driver as a remote group's `dataplane.HostLink` does: a
    grant runs the kernel's delta cycles (`run_grant`) in simulated time, or
    delivers the relayed messages at once in real time; `receive` gives the
    reply, or what the kernel shipped since.

    Args:
        kernel (Kernel): the host's group's kernel.
        routes (dataplane.Routes): the net's Outputs and their readers.
        notify (Callable | None): called as a node sends to another group
            (real time: the relay's wake).
        keep_waiting (Callable[[], bool] | None): whether a grant may keep
            waiting for a delta cycle (no stop due).
    """

    def __init__(self, kernel: Kernel, routes: dataplane.Routes,
                 notify: Any = None, keep_waiting: Callable[[], bool] | None = None) -> None:
        self.kernel = kernel
        self.keep_waiting = keep_waiting
        self.routes = routes
        self.published = Published(routes, notify)
        self._reply: dataplane.Reply | None = None
        self._replies: list[dataplane.Reply] = []  # real time: markers waiting
        self.messages_in = self.messages_out = self.bytes_in = self.bytes_out = 0
        self.counted: dict[str, dict[str, Any]] | None = None  # by replaced kernels
        # A run with CUDA IPC: relayed placeholders opened here (set by the host).
        self.opener: cudaipc.LocalOpener | None = None

    def send(self, grant: dataplane.Grant) -> None:
        self.messages_in += len(grant.messages)
        if self.opener is not None:
            grant.messages = self.opener.open(grant.messages)
        if not self.kernel.simulated:
            self._send_realtime(grant)
            return
        try:
            self._reply = run_grant(self.kernel, self.routes, grant, self.published,
                                          self.keep_waiting)
            self.messages_out += len(self._reply.sends)
        except TimeoutError:
            # A stop gave up on a hook of the host's group: the driver reports it stuck.
            raise Stuck({a.path: f"{self.kernel.dispatcher.hook_of(a)} (in group {HOST_GROUP!r})"
                         for a in self.kernel.actors if a.busy}) from None
        except BaseException as exc:  # reported as a group's failure is, never swallowed
            self._reply = dataplane.Reply(due=None, time_ns=0, sends=[],
                                          failure=failure_of(exc))

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
            replies = shipped(self.kernel, self.routes, self.published)
            self.messages_out += sum(len(r.sends) for r in replies)
            self._replies += replies
            self._replies.append(dataplane.Reply(due=None, time_ns=kernel.time_ns, sends=[],
                                                 marker=True))

    def _receive_realtime(self) -> dataplane.Reply | None:
        """Real time: a marker waiting, or what the kernel sent, published or failed."""
        if not self._replies:
            self._replies = shipped(self.kernel, self.routes, self.published)
            self.messages_out += sum(len(r.sends) for r in self._replies)
        return self._replies.pop(0) if self._replies else None

    def close(self) -> None:
        if self.opener is not None:
            self.opener.close()
