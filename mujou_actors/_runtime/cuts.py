"""A kernel's state at a consistent cut: taking it as a state tree, and loading one.

Both run while the dispatcher holds a cut (no hook in flight; simulated time:
between two instants), or before the start, or after the end. The tree's
layout is `state.FORMAT` (docs/state.md): every node's state dict, the messages
each Input keeps, the deliveries not yet applied, each node's last update, and
for a net with synchronizers (`mujou_actors.sync`) each one's state.
What differs between drivers (CUDA copies for the host, the host's views of
a write) comes in as functions, so the run and a driven `kernel.Kernel` take
and load their part of the state the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import NodeError, StartTimeoutError
from ..messages import copy_message
from ..params import SETS
from ..ports import Input, Port
from ..state import FORMAT
from .mailbox import Restore, Snapshot

if TYPE_CHECKING:
    from ..sync import Synchronizer
    from .actor import Actor
    from .dispatcher import Dispatcher

__all__ = ["NoCut", "take_tree", "restore_tree", "why_no_cut"]

log = logging.getLogger("mujou_actors")
_TOLD = "_mujou_told_generator"  # a node's flag: warned of a state without its generator


def why_no_cut(busy: Mapping[str, str]) -> str:
    """Say which hooks kept a cut from coming (``{node path: hook}``)."""
    if not busy:
        return "the run was busy with another snapshot or a restart"
    return "still running: " + ", ".join(f"{p or '<root>'!r} in {h}" for p, h in busy.items())


class NoCut(TimeoutError):
    """No consistent cut within a bound: ``busy`` names the hooks in the way."""

    def __init__(self, timeout: float, busy: Mapping[str, str]) -> None:
        self.busy = dict(busy)
        super().__init__(f"no consistent cut within {timeout:g} s; " + why_no_cut(busy))


def take_tree(dispatcher: Dispatcher, actors: list[Actor], ports: Mapping[str, Port], *,
              time_ns: int, seeds: Mapping[str, int], host_copy: Callable[[Any], Any],
              wait_kept: Callable[[Input], None], timeout: float | None = None,
              ended: bool = False) -> dict[str, Any]:
    """The state tree of ``actors``, taken now: the dispatcher must hold a cut (or not run).

    Args:
        dispatcher: the actors' dispatcher.
        actors: whose state to take, in the net's order.
        ports: the ports of those actors' nodes, by dotted path.
        time_ns: the tree's ``time_ns``.
        seeds: every node's seed, by path.
        host_copy: makes the host's private CPU copy of a message.
        wait_kept: waits until the values an Input keeps are complete (CUDA).
        timeout: wall seconds to wait for actors busy with a restart's control
            hook (`NoCut`); None waits.
        ended: the run has ended (or is ending): the states are taken on this
            thread, and a node still stuck in a hook is an error.

    Raises:
        NoCut: an actor stayed busy for ``timeout``.
        NodeError: a node's ``state_dict`` raised, or (``ended``) it is stuck in a hook.
        TypeError: a state holds a value a tree cannot (names the node and key).
    """
    nodes: dict[str, Any] = {}
    errors: dict[str, BaseException] = {}
    envelope = Snapshot(nodes, errors)
    if ended:
        for actor in actors:
            if actor.busy:
                # Left behind in a hook at the stop: its state is still
                # changing, and its context is entered on that thread.
                hook = dispatcher.hook_of(actor)
                errors[actor.path] = NodeError(
                    actor.path, hook,
                    f"node {actor.path or '<root>'!r} is still in {hook} (stuck when the "
                    "run stopped): its state cannot be taken")
            else:
                actor.take_state(envelope)
    else:
        late = dispatcher.run_here(actors, envelope, timeout)
        if late:
            raise NoCut(timeout or 0.0, {a.path: dispatcher.hook_of(a) for a in late})
    if errors:
        raise next(iter(errors.values()))
    _warn_generators_left_out(actors, nodes)
    inputs: dict[str, list[Any]] = {}
    pending: dict[str, list[Any]] = {}
    syncs: dict[int, Synchronizer] = {}
    for path, port in ports.items():
        if isinstance(port, Input):
            kept = list(port._buffer)
            wait_kept(port)
            inputs[path] = [host_copy(m) for m in kept]
            if port._sync is not None:
                syncs[id(port._sync)] = port._sync
    for actor in actors:
        for delivery in dispatcher.pending_deliveries(actor):
            port, message = delivery.input, delivery.message
            if port._sync is not None and not port._stamped:
                # A replay's stand-in took plain messages: stamped as sent, as a
                # synchronized Input's undelivered messages always are in a tree.
                message = (delivery.t_ns, message)
            pending.setdefault(port.path, []).append(host_copy(message))
    tree = {
        "format": FORMAT,
        "time_ns": time_ns,
        "seeds": dict(seeds),
        "nodes": {a.path: nodes[a.path] for a in actors},
        "inputs": inputs,
        "pending": pending,
        "schedule": {a.path: {"last_update_ns": a.last_update_ns} for a in actors},
    }
    if syncs:  # only a net with synchronizers has the section
        tree["sync"] = {s.path: s._state(host_copy) for s in syncs.values()}
    sets = {a.path: queued.pending() for a in actors
            if (queued := a.node.__dict__.get(SETS)) is not None and queued}
    if sets:  # only a tree with parameter sets not yet applied has the section
        tree["params"] = sets
    return tree


def _warn_generators_left_out(actors: list[Actor], nodes: dict[str, Any]) -> None:
    """Warn, once a node, of a state that leaves out the generator the node has used.

    A ``state_dict`` override that does not call ``super().state_dict()``
    drops ``"generator"``: a restore from the tree then draws other random
    numbers than the run it was taken from did, silently (a newcomer check
    found it). Said on the ``mujou_actors`` logger, naming the node.
    """
    for actor in actors:
        node, state = actor.node, nodes.get(actor.path)
        if (getattr(node, "_mujou_generator", None) is None or not isinstance(state, dict)
                or "generator" in state or node.__dict__.get(_TOLD, False)):
            continue
        node.__dict__[_TOLD] = True
        log.warning("node %r draws from self.generator, but its state_dict() leaves "
                    "\"generator\" out (an override that does not call super().state_dict()?): "
                    "a restore from this state does not go on with the same random numbers",
                    actor.path or "<root>")


def restore_tree(dispatcher: Dispatcher, actors: list[Actor], ports: Mapping[str, Port],
                 tree: Mapping[str, Any], deadline: float, limit: float,
                 deliver: Callable[..., object], restart: bool = False) -> bool:
    """Load a checked tree into the held (or not started) kernel: Restore envelopes, messages.

    Args:
        dispatcher: the actors' dispatcher, holding a cut or not started.
        actors: the actors to restore, in the net's order (each must be in the tree).
        ports: their ports by dotted path (the tree's Inputs must be among them).
        tree: a checked state tree (`state.check_tree`, `net.check_fit`).
        deadline: ``time.monotonic()`` by which every ``load_state_dict`` must
            have returned.
        limit: the timeout that deadline stands for (seconds), for the error.
        deliver: delivers an undelivered message of the tree to its Input
            (as the host's write: before every node's send), ``deliver(port,
            message)``; for an Input of a synchronizer with the message's send
            time, ``stamp_ns=`` (`build.Wiring.deliver`).
        restart: a restart's rewind (``one_for_all``): the parameter sets
            queued now stay queued, and the tree's ``params`` is not loaded
            (`params.keep_values`). False: the tree's sets are queued, beside
            what a replay queued from its recording.

    Returns:
        bool: True when every node was restored; False when a node's
        ``load_state_dict`` raised. The loop stops at that node: its failure
        went to the dispatcher's listener (the caller raises it), and may
        already be ending the run, whose stop would leave the next nodes'
        envelopes unrun until the deadline (issue 28, item 7).

    Raises:
        StartTimeoutError: the deadline passed (names the stuck node and
            those not restored).
    """
    by_node: dict[str, dict[Input, list[Any]]] = {a.path: {} for a in actors}
    for path, messages in tree["inputs"].items():
        port = ports[path]
        assert isinstance(port, Input)  # a checked tree names Inputs only (net.check_fit)
        by_node[port.node._mujou_path][port] = [copy_message(m) for m in messages]
    # A synchronizer's state goes in with its node's Restore, as what its first Input
    # keeps (a synchronized Input keeps nothing itself): a CUDA node's Restore puts its
    # tensors on the node's device, on its stream, as it does with kept messages.
    syncs = {p._sync.path: p._sync for p in ports.values()
             if isinstance(p, Input) and p._sync is not None and p._stamped}
    for path, entry in tree.get("sync", {}).items():
        if path in syncs:  # (a placed run's group gets its own nodes' part of the tree)
            first = syncs[path].inputs[0]
            by_node[first.node._mujou_path][first] = [copy_message(entry)]
    for i, actor in enumerate(actors):
        last = tree["schedule"].get(actor.path, {}).get("last_update_ns")
        envelope = Restore(tree["nodes"][actor.path], by_node[actor.path], last)
        left = max(0.0, deadline - time.monotonic())
        if dispatcher.run_control([actor], envelope, left, help=True):
            stuck = {actor.path: dispatcher.hook_of(actor)} if actor.busy else {}
            rest = [a.path for a in actors[i + (1 if stuck else 0):]]
            raise StartTimeoutError(stuck, rest, limit)
        if actor.failed:  # set before run_control returned; a success clears it
            return False
    for actor in actors:  # parameter sets not yet applied: the tree's join a replay's
        queued = actor.node.__dict__.get(SETS)
        if queued is not None and not restart:
            for t_ns, delta, name, value in tree.get("params", {}).get(actor.path, []):
                queued.add(t_ns, delta, name, value)
    for path, messages in tree["pending"].items():
        port = ports[path]
        assert isinstance(port, Input)  # a checked tree names Inputs only (net.check_fit)
        for message in messages:
            if port._sync is not None:  # (send time, message): see take_tree
                deliver(port, copy_message(message[1]), stamp_ns=message[0])
            else:
                deliver(port, copy_message(message))
    return True
