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

from .errors import NetError, SnapshotError
from .node import Node, iter_nodes
from .ports import Input, Output, Port
from .state import check_tree

__all__ = [
    "walk", "collect_ports", "warn_unknown_hooks", "check_seconds", "check_workers",
    "load_state", "check_fit", "resolve_inputs",
]

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


def check_seconds(name: str, value: Any, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"mujou.run: {name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"mujou.run: {name} must be a finite number "
                         f"{'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def check_workers(workers: Any) -> None:
    if workers is None:
        return
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise TypeError(f"mujou.run: workers must be an int or None, got {workers!r}")
    if workers < 1:
        raise ValueError(f"mujou.run: workers must be >= 1, got {workers}")


_HOOKS = {"on_start", "on_update", "on_stop"}


def warn_unknown_hooks(found: list[tuple[str, Node]]) -> None:
    """A method named like a hook but unknown is most likely a typo (on_updte)."""
    for cls in {type(node) for _, node in found}:
        for name in dir(cls):
            if name.startswith("on_") and name not in _HOOKS and callable(getattr(cls, name)):
                log.warning("%s.%s is not a hook and is never called; the hooks are %s",
                            cls.__name__, name, ", ".join(sorted(_HOOKS)))


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
    return ports


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
    """Every node of the net has state in the tree and the reverse (like nn.Module strict)."""
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
        for path in sorted(set(tree[section]) & inputs):
            problems.extend(_message_problems(section, path, tree[section][path], ports[path]))
    for path in sorted(paths & set(tree["seeds"])):
        seed = tree["seeds"][path]
        if isinstance(seed, bool) or not isinstance(seed, int):
            problems.append(f"seeds[{path!r}] is {seed!r}, not an int")
    for path in sorted(paths):
        last = tree["schedule"].get(path, {}).get("last_update_ns") \
            if isinstance(tree["schedule"].get(path), dict) else "?"
        if last is not None and (isinstance(last, bool) or not isinstance(last, int)
                                 or not 0 <= last <= tree["time_ns"]):
            problems.append(f"schedule[{path!r}]['last_update_ns'] is {last!r}, not an int "
                            f"from 0 to time_ns ({tree['time_ns']})")
    if problems:
        raise SnapshotError(f"{where} does not fit the net: " + "; ".join(problems))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def _message_problems(section: str, path: str, messages: Any, port: Port) -> list[str]:
    """Messages of a tree's inputs/pending section that do not fit their Input."""
    if not isinstance(messages, list):
        return [f"{section}[{path!r}] is a {type(messages).__name__}, not a list of messages"]
    problems = []
    for i, message in enumerate(messages):
        try:
            port.check(message)
        except TypeError as exc:
            problems.append(f"{section}[{path!r}][{i}]: {exc}")
    return problems


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
