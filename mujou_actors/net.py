"""The net given to ``mujou.run``: walking it, its ports, and checking arguments.

Everything here runs before any thread starts, so a bad net or argument is
reported without side effects: no node is claimed, no hook has run.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from typing import Any

import torch

from ._checks import is_int, is_number
from .codec import file_problem, from_file
from .deadlines import overrides, suspect_deadlines
from .errors import NetError, SnapshotError
from .node import Node, check_seed, iter_nodes, random_seed
from .params import param_problems
from .ports import Input, Output, Port
from .state import check_tree
from .supervisor import derive_seed
from .sync import Synchronizer, map_messages

# Nothing here is for users to import: mujou.run calls these checks.
__all__: list[str] = []

log = logging.getLogger("mujou_actors")


def walk(net: Any) -> list[tuple[str, Node]]:
    """Every node of the net with its path, parents before children."""
    if isinstance(net, Node):
        roots = [("", net)]
    elif isinstance(net, (list, tuple, dict)):
        items = net.items() if isinstance(net, dict) else enumerate(net)
        for key, item in items:
            if not isinstance(item, Node):
                hint = " (a class: did you forget the ()?)" if isinstance(item, type) else ""
                raise NetError(f"mujou.run: net[{key!r}] must be a Node, got "
                               f"{type(item).__name__}{hint}")
            if isinstance(net, dict) and not (isinstance(key, str) and key and "." not in key):
                raise NetError(f"mujou.run: net key {key!r} must be a non-empty str without '.'")
        roots = list(iter_nodes("", net))
    else:
        hint = " (a class: did you forget the ()?)" if isinstance(net, type) else ""
        raise TypeError(f"mujou.run: net must be a Node, or a list or dict of Nodes, got "
                        f"{type(net).__name__}{hint}")
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


def check_seconds(name: str, value: Any, *, allow_zero: bool, where: str = "mujou.run") -> float:
    if not is_number(value):
        raise TypeError(f"{where}: {name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{where}: {name} must be a finite number "
                         f"{'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def check_flag(name: str, value: Any, where: str = "mujou.run") -> bool:
    """An argument of ``where`` that must be True or False (``mujou.run(stats=)``)."""
    if not isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be True or False, got {value!r}")
    return value


def settle_seeds(found: list[tuple[str, Node]], tree: dict[str, Any] | None,
                 seed: int | None, *, warn: bool = True) -> dict[str, int]:
    """The seed of every node's generator in this run, by path; changes no node.

    A tree's seed wins (the generator's state comes with the node's), then the
    node's own, then one derived from the run's ``seed`` and the path, else a
    fresh random one. A node that drew from its generator before any run
    seeded it (in ``__init__``) and is seeded afresh now is warned about: what
    it drew came from a seed that no run records. ``warn=False``: not (a
    placed run's kernels, whose host settled the seeds and warned once).
    """
    seeds = {}
    for path, node in found:
        if tree is not None and path in tree["seeds"]:
            seeds[path] = tree["seeds"][path]
            continue
        own = node._mujou_seed
        if own is None:
            if warn and node._mujou_drew_before_run():
                log.warning(
                    "node %r (%s) drew from self.generator before the run seeded it "
                    "(in __init__?): those draws used a random seed that the run does not "
                    "record, so they differ from run to run whatever mujou.run(seed=) is; "
                    "give the node a seed of its own (Node(seed=...)) or draw in on_start",
                    path or "<root>", type(node).__name__)
            own = derive_seed(seed, path) if seed is not None else random_seed()
        seeds[path] = own
    return seeds


_HOOKS = {"on_start", "on_update", "on_stop", "on_deadline_miss", "on_param"}


def warn_unknown_hooks(found: list[tuple[str, Node]]) -> None:
    """A method named like a hook but unknown is most likely a typo (on_updte).

    A synchronizer's callback (``callback=self.on_pair``) is called, and not warned of.
    """
    for cls in {type(node) for _, node in found}:
        for name in dir(cls):
            if name.startswith("on_") and name not in _HOOKS and callable(getattr(cls, name)) \
                    and not _is_callback(found, cls, name):
                log.warning("%s.%s is not a hook and is never called; the hooks are %s",
                            cls.__name__, name, ", ".join(sorted(_HOOKS)))


def _is_callback(found: list[tuple[str, Node]], cls: type, name: str) -> bool:
    """Whether a node of class ``cls`` has a synchronizer whose callback is its method ``name``."""
    for _, node in found:
        if type(node) is cls and any(
                isinstance(value, Synchronizer)
                and getattr(value._callback, "__func__", None) is getattr(cls, name)
                for value in vars(node).values()):
            return True
    return False


def collect_ports(found: list[tuple[str, Node]]) -> dict[str, Port]:
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
    for sync in synchronizers(ports):
        _check_synchronizer(sync)
    _check_held_synchronizers(found)
    return ports


def synchronizers(ports: Mapping[str, Port]) -> list[Synchronizer]:
    """The synchronizers of the Inputs among ``ports``, in the order of their first Input."""
    found: dict[int, Synchronizer] = {}
    for port in ports.values():
        if isinstance(port, Input) and port._sync is not None:
            found.setdefault(id(port._sync), port._sync)
    return list(found.values())


def _check_synchronizer(sync: Synchronizer) -> None:
    """A synchronizer's Inputs are one node's, and that node holds it: its name is found.

    Its queues are part of the state tree under its path (the node's path and
    the attribute's name), so the node must hold it in an attribute.

    Raises:
        NetError: Inputs of no node or of several; the node does not hold it.
    """
    what = f"{type(sync).__name__} of {[i.path for i in sync.inputs]}"
    nodes = {id(i.node): i.node for i in sync.inputs}
    if None in nodes.values() or len(nodes) > 1:
        raise NetError(f"{what}: a synchronizer matches Inputs of one node, each an attribute "
                       "of it (a port declared on its class or assigned in its __init__)")
    node = sync.inputs[0].node
    names = [name for name, value in vars(node).items() if value is sync]
    if not names:
        raise NetError(f"{what} is not an attribute of node {node._mujou_path or '<root>'!r}: "
                       "assign it in that node's __init__ (self.sync = ...), whose Inputs it "
                       "matches; its queues are part of the node's state")
    sync._name = names[0]


def _check_held_synchronizers(found: list[tuple[str, Node]]) -> None:
    """A synchronizer a node holds matches that node's own Inputs: none is left out unseen.

    One made of Inputs that no node of the net holds (a class's port templates,
    ``Node.a``; Inputs made but never assigned) is found by no Input of the
    net, so the run would leave it idle without a word.

    Raises:
        NetError: a synchronizer held by a node matches Inputs that are not
            that node's (names the node, the attribute and the Inputs).
    """
    for path, node in found:
        for name, value in vars(node).items():
            if isinstance(value, Synchronizer) and any(
                    inp.node is not node for inp in value.inputs):
                raise NetError(
                    f"node {path or '<root>'!r}: its {type(value).__name__} {name!r} matches "
                    f"Inputs that are not the node's own ({[i.path for i in value.inputs]}): "
                    "give it the node's Input ports as attributes (self.camera, self.imu), "
                    "not the class's (Node.camera) nor Inputs never assigned to the node")


def load_state(state: Any) -> dict[str, Any] | None:
    if state is None:
        return None
    if isinstance(state, (str, os.PathLike)):
        from .snapshot import load

        return check_tree(load(state), os.fspath(state))
    if isinstance(state, Mapping):
        return check_tree(dict(state), "state")
    raise TypeError(f"mujou.run: state must be a state tree or a file path, "
                    f"got {type(state).__name__}")


def check_fit(tree: dict[str, Any], found: list[tuple[str, Node]],
               ports: dict[str, Port], source: Any) -> None:
    """Every node of the net has state in the tree and the reverse (like nn.Module strict).

    Also puts the messages of ``inputs``, ``pending`` and ``sync`` back into
    the NamedTuple or dataclass their Input declares (a file holds them as
    tuples and dicts): those sections of ``tree`` are replaced by new dicts
    holding the converted messages. An undelivered message of a
    synchronizer's Input is a ``(send time ns, message)`` pair, and every
    synchronizer of the net has an entry in ``sync``, which names no other.

    Args:
        tree (dict): a tree that passed ``check_tree``.
        found (list): the net's ``(path, node)`` pairs (`walk`).
        ports (dict): the net's ports by dotted path (`collect_ports`).
        source (Any): the ``state=`` argument, for the message.

    Raises:
        SnapshotError: the tree does not fit the net; every problem is listed.
    """
    where = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "state"
    paths = {p for p, _ in found}
    problems = []
    missing = sorted(paths - set(tree["nodes"]))
    unexpected = sorted(set(tree["nodes"]) - paths)
    if missing:
        problems.append(f"no state for node(s) {missing}")
    if unexpected:
        problems.append(f"state for node(s) not in the net {unexpected}")
    for path in sorted(paths & set(tree["nodes"])):
        if not isinstance(tree["nodes"][path], Mapping):  # what load_state_dict takes
            problems.append(f"nodes[{path!r}] is {_short(tree['nodes'][path])}, not a dict "
                            "(a node's state_dict())")
    inputs = {p for p, port in ports.items() if isinstance(port, Input)}
    for section in ("inputs", "pending"):
        extra = sorted(set(tree[section]) - inputs)
        if extra:
            problems.append(f"{section} for port(s) that are not Inputs of the net {extra}")
        # A file brings NamedTuples and dataclasses back as tuples and dicts: put them back
        # into the type their Input declares. New lists, so the caller's tree is unchanged.
        # An undelivered message of a synchronizer's Input is a (send time, message) pair.
        tree[section] = {path: [_from_file(m, ports[path], section == "pending")
                                for m in messages]
                         if path in inputs and isinstance(messages, list) else messages
                         for path, messages in tree[section].items()}
        for path in sorted(set(tree[section]) & inputs):
            problems.extend(_message_problems(section, path, tree[section][path], ports[path]))
    problems.extend(_sync_problems(tree, ports))
    problems.extend(param_problems(tree.get("params", {}), dict(found)))
    for path in sorted(paths & set(tree["seeds"])):
        seed = tree["seeds"][path]
        try:  # the check of Node(seed=) and mujou.run(seed=): a tree's seed is one of those
            fits = check_seed(seed, f"seeds[{path!r}]") is not None
        except (TypeError, ValueError):
            fits = False
        if not fits:
            problems.append(f"seeds[{path!r}] is {seed!r}, not a seed (an int in [0, 2**64))")
    # Only the nodes the tree has state for: one it lacks is reported above,
    # by its path, once (not again as a schedule problem).
    unscheduled = sorted(paths & set(tree["nodes"]) - set(tree["schedule"]))
    if unscheduled:
        problems.append(f"no schedule for node(s) {unscheduled}")
    for path in sorted(paths & set(tree["nodes"]) & set(tree["schedule"])):
        entry = tree["schedule"][path]
        if not isinstance(entry, dict):
            problems.append(f"schedule[{path!r}] is a {type(entry).__name__}, not a dict")
            continue
        last = entry.get("last_update_ns")
        if last is not None and (not is_int(last) or not 0 <= last <= tree["time_ns"]):
            problems.append(f"schedule[{path!r}]['last_update_ns'] is {last!r}, not an int "
                            f"from 0 to time_ns ({tree['time_ns']})")
    if problems:
        raise SnapshotError(f"{where} does not fit the net: " + "; ".join(problems))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def _from_file(message: Any, port: Port, pending: bool) -> Any:
    """`codec.from_file` for one message of a tree's section; a pair's message for a
    synchronizer's undelivered one (a file's pair is a list)."""
    if pending and _is_pair(message, port):
        return (message[0], from_file(message[1], port.type))
    return from_file(message, port.type)


def _is_pair(message: Any, port: Port) -> bool:
    """Whether ``message`` is what a synchronizer's Input has pending: (send time ns, message)."""
    return (isinstance(port, Input) and port._sync is not None
            and isinstance(message, (list, tuple)) and len(message) == 2 and is_int(message[0]))


def _message_problems(section: str, path: str, messages: Any, port: Port) -> list[str]:
    """Messages of a tree's inputs/pending section that do not fit their Input."""
    if not isinstance(messages, list):
        return [f"{section}[{path!r}] is a {type(messages).__name__}, not a list of messages"]
    synced = isinstance(port, Input) and port._sync is not None
    if synced and section == "inputs" and messages:
        return [f"inputs[{path!r}] holds messages, but a synchronized Input keeps none (its "
                "synchronizer's state is in the sync section)"]
    synced = synced and section == "pending"
    problems = []
    for i, message in enumerate(messages):
        if synced:
            if not _is_pair(message, port):
                problems.append(f"{section}[{path!r}][{i}] is {_short(message)}, not a pair "
                                "(send time ns, message): its Input is synchronized")
                continue
            message = message[1]
        try:
            port.check(message)
        except TypeError as exc:
            problems.append(f"{section}[{path!r}][{i}]: {exc}")
    return problems


def _sync_problems(tree: dict[str, Any], ports: Mapping[str, Port]) -> list[str]:
    """The ``sync`` section against the net's synchronizers (as strict as ``nodes``).

    Puts each entry's messages back into its Input's type, as for ``inputs``
    (the section is replaced by a new dict).
    """
    syncs = {s.path: s for s in synchronizers(ports)}
    section = tree.get("sync", {})
    problems = []
    missing = sorted(set(syncs) - set(section))
    unexpected = sorted(set(section) - set(syncs))
    if missing:
        problems.append(f"no state for synchronizer(s) {missing}")
    if unexpected:
        problems.append(f"state for synchronizer(s) not in the net {unexpected}")
    fitted = {}
    for path, entry in section.items():
        if path in syncs:
            types = [inp.type for inp in syncs[path].inputs]

            def convert(i: int, message: Any, types: list[type] = types) -> Any:
                return from_file(message, types[i])

            entry, found = syncs[path]._fit(entry, convert)
            problems.extend(found)
        fitted[path] = entry
    if syncs or "sync" in tree:
        tree["sync"] = fitted
    return problems


def check_file_messages(tree: dict[str, Any], ports: Mapping[str, Port]) -> None:
    """Refuse a tree whose messages would not come back from a snapshot file as they are.

    Args:
        tree (dict): a tree taken by the run (``Run.state_dict()``'s layout).
        ports (Mapping): the net's ports by dotted path.

    Raises:
        TypeError: a message kept by, or pending for, an Input is of a type a file
            cannot hold, or would not bring back as itself (see
            ``snapshot.file_problem``); the message names the Input and the type.
    """
    for section, role in (("inputs", "kept by"), ("pending", "on its way to")):
        for path, messages in tree[section].items():
            port = ports[path]
            for message in messages:
                if section == "pending" and _is_pair(message, port):
                    message = message[1]  # a synchronizer's Input: (send time, message)
                _refuse_in_file(message, role, path, port)
    syncs = {s.path: s for s in synchronizers(ports)}
    for path, entry in tree.get("sync", {}).items():
        inputs = syncs[path].inputs

        def check(i: int, message: Any, inputs: tuple[Input, ...] = inputs) -> Any:
            _refuse_in_file(message, "held by a synchronizer for", inputs[i].path, inputs[i])
            return message

        map_messages(entry, len(inputs), check)


def _refuse_in_file(message: Any, role: str, path: str, port: Port) -> None:
    problem = file_problem(message, port.type)
    if problem is not None:
        raise TypeError(
            f"a {type(message).__name__} message {role} Input {path!r} (declared "
            f"{port.type.__name__}) cannot go into a snapshot file: {problem}")


def resolve_inputs(ports: dict[str, Port], inputs: Any) -> list[tuple[Input, Any]]:
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
        resolved.append((port, port.check(value)))  # copied at delivery, for its device
    return resolved


LARGE_PERIOD_S = 10.0
"""A node's ``period`` above this many seconds is warned about: most likely a rate (Hz)."""

_SCANNED = 256  # items of an attribute's container looked at for nodes held out of the net


def warn_suspect_net(found: list[tuple[str, Node]], ports: Mapping[str, Port],
                     initial: list[tuple[Input, Any]], end_s: float | None) -> None:
    """Log the silent mistakes a net may hold; none of them stops the run.

    * a ``period`` above `LARGE_PERIOD_S` (``period=500`` meant as 500 Hz);
    * a triggering Input that nothing is connected to (nor given in
      ``inputs=``): its node updates on it only if the host writes to it;
    * a node with an ``on_update`` of its own, ``period=None`` and no
      triggering Input: nothing ever calls that ``on_update`` (a container
      of nodes, without an ``on_update`` of its own, is not warned of);
    * nodes held where the walk does not look (a list inside a list, a helper
      object): they are not part of the net and never run;
    * a node whose class defines ``on_deadline_miss`` with an ``on_miss``
      other than ``"safe"``: that hook is never called;
    * a node whose ``deadline`` or ``budget`` is longer than its period
      (`deadlines.suspect_deadlines`): its updates may make its ticks late.
    * a synchronizer whose node never updates (no period, no Input of it
      that triggers): it never matches a message.

    Args:
        found (list): the net's ``(path, node)`` pairs (`walk`).
        ports (Mapping[str, Port]): its ports by dotted path (`collect_ports`).
        initial (list): ``inputs=``, resolved (`resolve_inputs`).
        end_s (float | None): the run's ``duration``.
    """
    given = {id(port) for port, _ in initial}
    in_net = {id(node) for _, node in found}
    for path, node in found:
        name = path or "<root>"
        period = node._mujou_period_ns
        if period is not None and period > LARGE_PERIOD_S * 1e9:
            seconds = period / 1e9
            updates = "" if end_s is None else f" ({int(end_s // seconds)} updates in " \
                                               f"duration={end_s:g} s)"
            log.warning("node %r (%s) has period=%g s, one update every %g s%s: a rate in "
                        "Hz? period is the seconds between updates (%g Hz is period=%g)",
                        name, type(node).__name__, seconds, seconds, updates, seconds,
                        1 / seconds)
        if period is None and _updates_itself(node) and not any(
                port._trigger is not False for port in node._mujou_ports().values()
                if isinstance(port, Input)):
            log.warning("node %r (%s) has period=None and no Input that triggers it: its "
                        "on_update never runs; give it a period (period=0.01 is 100 updates "
                        "a second) or an Input that triggers it (trigger=None or True), "
                        "connected to an Output (mujou.connect)", name, type(node).__name__)
        if node._mujou_on_miss != "safe" and overrides(type(node), Node, "on_deadline_miss"):
            log.warning("node %r (%s) defines on_deadline_miss but has on_miss=%r: it is "
                        "never called; declare on_miss='safe' (and a budget or a deadline)",
                        name, type(node).__name__, node._mujou_on_miss)
        for rule in suspect_deadlines(period, node._mujou_budget_ns, node._mujou_deadline_ns):
            log.warning("node %r (%s): its %s", name, type(node).__name__, rule)
        for attr, where in _nodes_out_of_net(node, in_net):
            log.warning("node %r (%s) holds a Node in self.%s (%s): it is not part of the net "
                        "and never runs; hold nodes in attributes, or in lists, tuples or "
                        "dicts of nodes directly (docs/nodes-and-ports.md, 'Composition and "
                        "paths')", name, type(node).__name__, attr, where)
    for sync in synchronizers(ports):
        node = sync.inputs[0].node
        if node._mujou_period_ns is None and all(i._trigger is False for i in sync.inputs):
            log.warning("%s %r: node %r has period=None and none of the synchronized Inputs "
                        "triggers it: it never updates, so no message is ever matched; give "
                        "it a period or let an Input trigger it (trigger=None or True)",
                        type(sync).__name__, sync.path, node._mujou_path or "<root>")
    for path, port in ports.items():
        if not isinstance(port, Input) or port._sources or id(port) in given:
            continue
        owner = port.node
        triggers = port._trigger if port._trigger is not None \
            else owner._mujou_period_ns is None
        if triggers:
            log.warning("Input %r triggers node %r but nothing is connected to it: the node "
                        "updates on it only if the host writes to it (run.write); connect an "
                        "Output to it (mujou.connect)%s", path,
                        owner._mujou_path or "<root>",
                        " or give the node a period" if owner._mujou_period_ns is None else "")


def _updates_itself(node: Node) -> bool:
    """Whether ``node`` has an ``on_update`` of its own (its class's, or one set on it).

    `Node.on_update` does nothing: a node that keeps it (a container of
    nodes) loses nothing when it never updates.
    """
    if "on_update" in vars(node):
        return True
    # Looked up in the classes' own namespaces, as Python finds it: never through the
    # node (only _runtime/actor.py touches a node's hooks; tests/test_architecture.py).
    for cls in type(node).__mro__:
        if "on_update" in vars(cls):
            return cls is not Node
    return False


def _nodes_out_of_net(node: Node, in_net: set[int]) -> list[tuple[str, str]]:
    """Attributes of ``node`` holding nodes that the walk does not reach, and how."""
    found = []
    for attr, value in vars(node).items():
        if attr.startswith("_mujou") or isinstance(value, (Node, torch.Tensor, str, bytes)):
            continue
        if isinstance(value, (list, tuple, dict)):
            items = list(value.values() if isinstance(value, dict) else value)[:_SCANNED]
            for item in items:
                if isinstance(item, (list, tuple, dict)):
                    inner = item.values() if isinstance(item, dict) else item
                    if any(isinstance(x, Node) and id(x) not in in_net
                           for x in list(inner)[:_SCANNED]):
                        found.append((attr, "a container inside a container"))
                        break
        elif hasattr(value, "__dict__") and not isinstance(value, (type, torch.nn.Module)) \
                and not callable(value):
            if any(isinstance(x, Node) and id(x) not in in_net
                   for x in list(vars(value).values())[:_SCANNED]):
                found.append((attr, f"an attribute of a {type(value).__name__}"))
    return found
