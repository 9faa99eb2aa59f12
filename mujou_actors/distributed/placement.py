"""A placement and the net factory of a placed run, checked before anything starts.

``mujou.run(make_net, placement=Placement({"sim": "physics"}, net_kwargs={...}))``
puts the subtree of each named node path into a *group*; every group but the
host's runs in an OS process of its own. Nodes are never pickled: each
process calls the same *factory* (an importable module-level function) with
the same ``net_kwargs`` and builds the whole net itself, then runs only its
group's nodes. What the factory must satisfy is said in `resolve_factory`;
whether every process built the same net is checked by comparing the
`net_signature` each one reports.

Everything here runs in the host before any process starts, so a bad
placement is reported without side effects. Users import `Placement`
(``mujou.Placement``), the placement's settings; the rest is the run's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import keyword
import os
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any, cast

from .. import snapshot
from .._checks import settings_repr
from ..errors import NetError, SnapshotError
from ..net import check_flag, check_seconds, walk
from ..node import Node
from ..ports import Input, Output, Port

__all__ = ["HOST_GROUP", "Placement", "PlacementPlan", "FactoryRef", "resolve_factory",
           "load_factory", "check_placement", "net_signature", "signature_differences"]

# The group of every node that the placement does not name: it runs in the host process.
# A placement may name it too ("ctrl": "host") to keep a subtree of a placed path there.
HOST_GROUP = "host"

NetFactory = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class FactoryRef:
    """Where a group process finds the net factory.

    Attributes:
        ref (str): ``"package.module:function"`` (imported by name) or
            ``"/abs/path/file.py:function"`` (a file loaded by path, as the
            CLI's ``FILE:NAME``).
        kwargs (bytes): ``net_kwargs`` encoded with the snapshot codec
            (msgpack, raw tensor bytes, never pickle).
    """

    ref: str
    kwargs: bytes


def _ref_of(factory: Callable[..., Any]) -> str:
    """The ``module:name`` (or ``file.py:name``) of a module-level function.

    Raises:
        TypeError: ``factory`` is not a module-level function that a new
            process can import (a lambda, a nested function, a bound method, a
            function whose module has no file).
    """
    name = getattr(factory, "__qualname__", None)
    module_name = getattr(factory, "__module__", None)
    if not (inspect.isfunction(factory) and isinstance(name, str) and module_name):
        raise TypeError(f"mujou.run: with placement, the net must be given as a module-level "
                        f"function that builds it, got {type(factory).__name__} {factory!r}")
    if "<" in name or "." in name:
        raise TypeError(f"mujou.run: the net factory {name!r} is not a module-level function "
                        f"(a lambda or a nested function cannot be imported by a group "
                        f"process): define it at the top level of a module")
    module = sys.modules.get(module_name)
    if module is None or getattr(module, name, None) is not factory:
        raise TypeError(f"mujou.run: the net factory {module_name}.{name} cannot be found under "
                        f"its name in its module (it is not what {module_name}.{name} is)")
    if _from_a_file(module_name):
        path = getattr(module, "__file__", None)
        if not path or not os.path.isfile(path):
            where = (f"{path}: a script read from standard input?" if path else
                     "an interactive session, or python -c?")
            raise TypeError(f"mujou.run: the net factory {name!r} is defined in {module_name}, "
                            f"which has no file ({where}): a group process cannot import it; "
                            f"define it in a module or a file")
        if not _defined_at_top(path, name):
            raise TypeError(f"mujou.run: the net factory {name!r} is not defined at the top "
                            f"level of {path} (under `if __name__ == \"__main__\":`, say): a "
                            f"group process loads the file as a module, where that block "
                            f"does not run; move the function to the top level")
        return f"{os.path.abspath(path)}:{name}"
    return f"{module_name}:{name}"


def _defined_at_top(path: str, name: str) -> bool:
    """Whether the file at ``path`` binds ``name`` at its top level (a def, an assignment,
    an import), read without running it. An unreadable file says yes: its load will tell."""
    import ast

    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return True
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return True
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return True
    return False


def resolve_factory(net: Any,
                    net_kwargs: Mapping[str, Any] | None) -> tuple[NetFactory, FactoryRef]:
    """Check the net factory and ``net_kwargs`` of a placed run.

    The factory must be a module-level function, importable in a new
    process by its module's name (or from its file, for a script's or the
    CLI's ``FILE:NAME``), that builds the same net every time it is called
    with the same keyword arguments: the same nodes at the same paths, the
    same ports and connections. It must not depend on state of the calling
    process (a global set at run time, a random draw of its own); seeds come
    from the run (``mujou.run(seed=)``) or from a node's own ``seed=``.

    Args:
        net: the factory, or a ``"module:function"`` / ``"file.py:function"`` string.
        net_kwargs (Mapping[str, Any], optional): keyword arguments of every
            call (`Placement.net_kwargs`: str keys); plain data the snapshot
            codec encodes (None, bool, int, float, str, bytes, tensors, and
            lists, tuples and str-keyed dicts of them).

    Returns:
        tuple: the factory (a function of this process) and its `FactoryRef`.

    Raises:
        TypeError: a net object was given (pass the function that builds
            it), or the factory is not a module-level function, or
            ``net_kwargs`` is not plain data.
        ValueError: a string reference that names no importable function.
    """
    if isinstance(net, (Node, list, tuple, dict)):
        raise TypeError("mujou.run: with placement, pass the function that builds the net "
                        "(mujou.run(make_net, placement=...)), not a net "
                        "object: every group process builds the net itself, nodes are never "
                        "pickled")
    if isinstance(net, str):
        factory = load_factory(net)
        # "__main__:make" names the host's script, which a group process loads by its
        # file (or cannot: a script on standard input): the function's own reference.
        ref = _ref_of(factory) if net.rpartition(":")[0] in ("__main__", "__mp_main__") \
            else net
    else:
        ref = _ref_of(net)
        factory = net
    try:
        encoded = snapshot.dumps(dict(net_kwargs or {}))
    except (TypeError, ValueError, SnapshotError) as exc:
        raise TypeError(f"mujou.run: net_kwargs must be plain data that a group process can "
                        f"receive without pickle (None, bool, int, float, str, bytes, tensors, "
                        f"lists, tuples, str-keyed dicts): {exc}") from None
    return factory, FactoryRef(ref, encoded)


def load_factory(ref: str) -> NetFactory:
    """Import the function that ``ref`` names (``"module:function"`` or ``"file.py:function"``).

    A file is loaded by `load_file` (named by its stem, or ``_mujou_file_<hash>``),
    never as ``__main__``, so its ``if __name__ == "__main__":`` block does not run.

    Raises:
        ValueError: ``ref`` is not ``X:NAME``, the module or file cannot be
            imported (the import's error is the ``__cause__``), or NAME is not
            a function there.
    """
    where, sep, name = ref.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ValueError(f"net factory {ref!r}: expected 'module:function' or "
                         f"'path/file.py:function'")
    try:
        if where.endswith(".py") or os.sep in where:
            module = load_file(where)
        else:
            module = importlib.import_module(where)
    except Exception as exc:
        raise ValueError(f"net factory {ref!r}: cannot import {where!r}: "
                         f"{type(exc).__name__}: {exc}") from exc
    factory = getattr(module, name, None)
    if factory is None:
        raise ValueError(f"net factory {ref!r}: {where!r} has no function {name!r} at its top "
                         f"level (one defined under `if __name__ == \"__main__\":` is not "
                         f"there when a group process loads the file)")
    if not callable(factory) or isinstance(factory, Node):
        raise ValueError(f"net factory {ref!r}: {name!r} is a {type(factory).__name__}, not a "
                         f"function that builds the net")
    return factory


def load_file(path: str, *, fresh: bool = False) -> Any:
    """The module of a Python file (a net's ``FILE``), loaded once per process.

    The file's folder goes first on ``sys.path``, as with ``python FILE``, and
    the module is named by the file's stem when that is the module ``import
    <stem>`` would give (``pendulum_net`` for ``pendulum_net.py``): its classes
    are then named in recordings, capsules and views as a script that imports
    the file names them, so a capsule written by ``mujou run FILE`` reproduces
    from Python and back. A stem that names another module (one imported
    already, a built-in) or no module gives ``_mujou_file_<hash of the path>``.

    Args:
        path (str): the file.
        fresh (bool): run the file again even if it was loaded (the CLI's
            ``mujou run FILE``: a module-level net is made anew, as by a new
            process). Default: False.

    Returns:
        module: the module, registered in ``sys.modules`` (dataclasses and
        pickling look a class's module up by name).

    Raises:
        FileNotFoundError: there is no such file.
        ImportError: it is not a Python file.
        Exception: whatever importing the file raises.
    """
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such file: {path}")
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # the file's own helpers import as in `python FILE`
    name = _module_name(path)
    module = sys.modules.get(name)
    if module is not None and not fresh:
        module.__mujou_file__ = path  # type: ignore[attr-defined]  # found by path from now
        return module
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    module.__mujou_file__ = path  # type: ignore[attr-defined]  # see _from_a_file
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _from_a_file(module_name: str) -> bool:
    """Whether a module is a script's (``__main__``) or a file `load_file` loaded: one a
    group process finds by its file's path, not by its name."""
    if module_name in ("__main__", "__mp_main__") or module_name.startswith("_mujou_file_"):
        return True
    return getattr(sys.modules.get(module_name), "__mujou_file__", None) is not None


def _module_name(path: str) -> str:
    """The name `load_file` gives the module of ``path`` (absolute, its folder on sys.path)."""
    stem = os.path.splitext(os.path.basename(path))[0]
    if stem.isidentifier() and not keyword.iskeyword(stem):
        known = sys.modules.get(stem)
        try:
            if known is not None:
                origin = getattr(known, "__file__", None)
            else:
                spec = importlib.util.find_spec(stem)
                origin = None if spec is None else spec.origin
            if origin and os.path.exists(origin) and os.path.samefile(origin, path):
                return stem
        except (ImportError, ValueError, OSError):
            pass  # a stem that names something else, or nothing importable
    return "_mujou_file_" + hashlib.sha1(path.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True, init=False, repr=False)
class Placement:
    """Which processes, and machines, run which nodes (``mujou.run(placement=Placement(...))``).

    A mapping given as ``placement=`` is ``Placement(mapping)``. The net given
    to ``mujou.run`` is then the module-level function that builds it (or
    ``"module:function"``), which every process calls (docs/processes.md). A
    frozen value: two placements with the same settings are equal.

    Args:
        groups (Mapping[str, str]): node path (its whole subtree; a deeper
            path placed elsewhere wins for its own) -> group name; nodes not
            named stay in this process (the group ``"host"``). A group name
            ``"robot:control"`` runs group ``control`` on the machine that
            joined as ``robot`` (``"robot,spare:control"``: ``spare`` is its
            fallback; docs/machines.md). Kept as a read-only copy.
        net_kwargs (Mapping[str, Any], optional): the keyword arguments of
            every call of the net function: plain data (the snapshot codec's
            types), never pickled. Kept as a read-only copy. Default: None
            (no arguments).
        listen (str, optional): the ``"HOST:PORT"`` this process listens on as
            the leader of the machines' convention, what each member's
            ``mujou worker --join`` names; required when ``groups`` puts a
            group on a machine, refused otherwise. Default: None (one machine).
        join_timeout (float): wall seconds to wait for the machines that
            ``groups`` names to join, before any node starts. Default: 30.
        allow_remote (bool): let ``listen`` be an address other machines can
            reach. Thespian's control plane unpickles what reaches it, so this
            says the network is trusted (docs/machines.md, "Security").
            Default: False (loopback only).
        heartbeat_timeout (float): wall seconds without an answer to the run's
            heartbeat after which a group on another machine counts as lost
            (and the supervisor restarts it, or the run fails with
            `GroupDied`). Default: 1.

    Raises:
        TypeError: an argument of the wrong type (``groups`` not a mapping of
            str to str, ``net_kwargs`` without str keys, ``listen=7000``,
            ``allow_remote="yes"``), naming it.
        ValueError: an argument of the right type and a wrong value: a group
            or machine name that is empty, has spaces around it or a second
            ``:``; a machine named twice for a group, or a group on two machine
            lists; the host's group on a machine; ``listen`` that is no
            ``"HOST:PORT"``, or given without a group on a machine (or missing
            with one); a timeout that is not a finite number > 0.
    """

    groups: Mapping[str, str]
    net_kwargs: Mapping[str, Any] | None
    listen: str | None
    join_timeout: float
    allow_remote: bool
    heartbeat_timeout: float

    def __init__(self, groups: Mapping[str, str], *,
                 net_kwargs: Mapping[str, Any] | None = None, listen: str | None = None,
                 join_timeout: float = 30.0, allow_remote: bool = False,
                 heartbeat_timeout: float = 1.0) -> None:
        if not isinstance(groups, Mapping):
            raise TypeError(f"Placement: groups must be a mapping of node paths to group "
                            f"names, got {type(groups).__name__}")
        for path, group in groups.items():
            if not isinstance(path, str):
                raise TypeError(f"Placement: groups key {path!r} must be a node path (a str)")
            if not isinstance(group, str):
                raise TypeError(f"Placement: groups[{path!r}] must be a group name (a str), "
                                f"got {type(group).__name__} {group!r}")
        machines = _machines(groups)
        if net_kwargs is not None and (not isinstance(net_kwargs, Mapping)
                                       or not all(isinstance(k, str) for k in net_kwargs)):
            raise TypeError(f"Placement: net_kwargs must be a mapping with str keys, "
                            f"got {net_kwargs!r}")
        _check_listen(listen, machines)
        settings: dict[str, Any] = {
            "groups": types.MappingProxyType(dict(groups)),
            "net_kwargs": None if net_kwargs is None else types.MappingProxyType(dict(net_kwargs)),
            "listen": listen,
            "join_timeout": check_seconds("join_timeout", join_timeout, allow_zero=False,
                                          where="Placement"),
            "allow_remote": check_flag("allow_remote", allow_remote, where="Placement"),
            "heartbeat_timeout": check_seconds("heartbeat_timeout", heartbeat_timeout,
                                               allow_zero=False, where="Placement"),
        }
        for name, setting in settings.items():  # frozen: set once, as a dataclass's __init__
            object.__setattr__(self, name, setting)

    def __repr__(self) -> str:
        return settings_repr(self)


def _check_listen(listen: Any, machines: Mapping[str, tuple[str, ...]]) -> None:
    """``Placement(listen=)``: a ``"HOST:PORT"`` exactly when a group runs on a machine.

    Raises:
        TypeError: not None nor a str. ValueError: no ``"HOST:PORT"``; given
            with no group on a machine, or missing with one.
    """
    if listen is not None and not isinstance(listen, str):
        raise TypeError(f"Placement: listen must be a 'HOST:PORT' str, got "
                        f"{type(listen).__name__}")
    if machines and listen is None:
        group, on = next(iter(machines.items()))
        raise ValueError(f"Placement: groups puts group {group!r} on machine {on[0]!r}: pass "
                         f"listen='HOST:PORT', where this process leads the machines' "
                         f"convention (what `mujou worker --join` names)")
    if listen is None:
        return
    if not machines:
        raise ValueError(f"Placement: listen={listen!r} goes with groups that put a group on "
                         f"another machine ('machine:group'); these name none")
    from .convention import parse_address  # Thespian's: only for a run across machines

    try:  # the members join this port: it must be the one they name, not any free one
        parse_address(listen)
    except ValueError as exc:
        raise ValueError(f"Placement: listen={listen!r}: {exc} (the 'HOST:PORT' that each "
                         f"machine's `mujou worker --join` names)") from None


def as_placement(placement: Any) -> Placement | None:
    """The `Placement` for ``mujou.run(placement=...)``: None, a mapping, or a Placement.

    Raises:
        TypeError: another type (and what `Placement` raises for a mapping).
    """
    if placement is None or isinstance(placement, Placement):
        return placement
    if not isinstance(placement, Mapping):
        raise TypeError("mujou.run: placement must be None, a mapping of node paths to group "
                        f"names or a mujou.Placement, got {type(placement).__name__}")
    return Placement(placement)


@dataclasses.dataclass(frozen=True)
class PlacementPlan:
    """A checked placement: which group runs which nodes.

    Attributes:
        group_of (dict[str, str]): node path -> group, for every node of the net.
        roots (dict[str, list[str]]): group -> the paths that place it (each
            with its subtree, minus deeper paths placed elsewhere); the host's
            group (`HOST_GROUP`) is listed only when it has nodes.
        nodes (dict[str, list[str]]): group -> its node paths, in the net's order.
        groups (list[str]): the groups other than the host's, sorted: one
            process each.
        machines (dict[str, tuple[str, ...]]): group -> the names of the
            convention members (machines) it may run on, in order: the first,
            then the fallbacks (``"robot,spare:control"``); a group not listed
            runs on the host's machine.
    """

    group_of: dict[str, str]
    roots: dict[str, list[str]]
    nodes: dict[str, list[str]]
    groups: list[str]
    machines: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


def check_placement(placement: Placement, found: list[tuple[str, Node]],
                    ports: Mapping[str, Port]) -> PlacementPlan:
    """Check ``placement`` against the net and say which group runs each node.

    A path places its whole subtree; a deeper path placed elsewhere wins for
    its own subtree. Nodes that no path covers stay in the host's group.

    Args:
        placement (Placement): node path -> group name, or
            ``"machine[,fallback...]:group"`` (checked by `Placement`).
        found: the net's nodes with their paths (`mujou_actors.net.walk`).
        ports: the net's ports by path.

    Raises:
        ValueError: a path names no node (the error lists the nodes), or no
            node is placed outside the host.
        NetError: a port that connects two groups has a message type that
            cannot cross processes (names the port).
    """
    paths = [p for p, _ in found]
    known = set(paths)
    for path in placement.groups:
        if path not in known:
            raise ValueError(f"mujou.run: placement names {path!r}, which is no node of the net "
                             f"(nodes: {', '.join(repr(p) for p in paths)})")
    groups_of = {path: _split_group(path, value)[0] for path, value in placement.groups.items()}
    group_of = {path: _group_of(path, groups_of) for path in paths}
    nodes: dict[str, list[str]] = {}
    for path in paths:
        nodes.setdefault(group_of[path], []).append(path)
    groups = sorted(g for g in nodes if g != HOST_GROUP)
    if not groups:
        raise ValueError("mujou.run: the placement puts every node in the host's group; name "
                         "at least one other group (or run without placement)")
    roots: dict[str, list[str]] = {}
    for path in paths:
        parent = path.rpartition(".")[0] if "." in path else ("" if path else None)
        if parent is None or group_of.get(parent) != group_of[path]:
            roots.setdefault(group_of[path], []).append(path)
    _check_crossings(ports, group_of)
    machines = _machines(placement.groups)
    return PlacementPlan(group_of=group_of, roots=roots, nodes=nodes, groups=groups,
                         machines={g: machines[g] for g in groups if g in machines})


def _machines(groups: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """Group -> the machines it runs on, for the groups that ``groups`` puts on one.

    Raises:
        ValueError: a bad group or machine name (`_split_group`); a group on
            two machine lists; the host's group on a machine.
    """
    machines: dict[str, tuple[str, ...]] = {}
    for path, value in groups.items():
        group, on = _split_group(path, value)
        if not on:
            continue
        if group == HOST_GROUP:
            raise ValueError(f"Placement: groups[{path!r}] = {value!r}: the host's group "
                             f"({HOST_GROUP!r}) runs in the host's process; name another "
                             f"group to run on {on[0]!r}")
        if machines.setdefault(group, on) != on:
            raise ValueError(f"Placement: groups[{path!r}] = {value!r}: group {group!r} is "
                             f"placed on {','.join(machines[group])!r} elsewhere; a group runs "
                             f"in one process, on one machine list")
    return machines


def _split_group(path: str, value: str) -> tuple[str, tuple[str, ...]]:
    """``"group"`` or ``"machine[,fallback...]:group"`` -> the group and its machines."""
    on, colon, group = value.rpartition(":")
    names = on.split(",") if colon else []
    for what, name in [("group", group)] + [("machine", m) for m in names]:
        if not name or name != name.strip() or ":" in name:
            raise ValueError(f"Placement: groups[{path!r}] = {value!r}: a {what} name must "
                             f"be a non-empty str without spaces around it or a ':' (the form "
                             f"is 'group' or 'machine[,fallback...]:group'), got {name!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"Placement: groups[{path!r}] = {value!r}: a machine is named twice")
    return group, tuple(names)


def _group_of(path: str, placement: Mapping[str, str]) -> str:
    """The group of the deepest placed path that ``path`` lies under (or is)."""
    probe = path
    while True:
        if probe in placement:
            return placement[probe]
        if probe == "":
            return HOST_GROUP
        probe = probe.rpartition(".")[0] if "." in probe else ""


def _check_crossings(ports: Mapping[str, Port], group_of: Mapping[str, str]) -> None:
    """Every connection between two groups carries a type the data plane can encode."""
    from .wire import crossing_problem  # the codec's own rule

    for path, port in ports.items():
        if not isinstance(port, Output):
            continue
        here = group_of[port.node._mujou_path]
        for reader in port.readers:
            if group_of[reader.node._mujou_path] != here:
                for p in (port, reader):
                    problem = crossing_problem(p._spec.type, p.path)
                    if problem is not None:
                        raise NetError(f"{path!r} -> {reader.path!r} connects groups "
                                       f"{here!r} and "
                                       f"{group_of[reader.node._mujou_path]!r}: "
                                       f"{problem}")


def net_signature(found: list[tuple[str, Node]]) -> list[list[Any]]:
    """What must be equal in every process of a placed run: nodes, their ports, connections.

    One row per node, in the net's order: ``[path, class, ports]``, and per port
    ``[name, kind, declared type, depth, trigger, readers]``. Plain data:
    it crosses the control plane and is compared with `signature_differences`.
    """
    def spec(port: Port) -> str:
        t = port._spec
        return f"{_class_name(t.type)} shape={t.shape} dtype={t.dtype}"

    rows: list[list[Any]] = []
    for path, node in found:
        cls = type(node)
        described: list[list[Any]] = []
        for name, port in sorted(node._mujou_ports().items()):
            if isinstance(port, Input):
                described.append([name, "Input", spec(port), port.depth, port.trigger, []])
            else:
                described.append([name, "Output", spec(port), None, None,
                                  sorted(r.path for r in cast(Output, port).readers)])
        rows.append([path, _class_name(cls), described])
    return rows


def _class_name(cls: type) -> str:
    """A class's name as every process of a placed run spells it: ``module.qualname``.

    A class defined in a script is ``__main__.X`` in the host, ``__mp_main__.X``
    where spawn imports the script again, and ``<stem>.X`` or
    ``_mujou_file_<hash>.X`` where `load_file` loads it from its file: all are
    named after the script's file instead, so the same class compares equal
    in every process.
    """
    module = cls.__module__
    if _from_a_file(module):
        path = getattr(sys.modules.get(module), "__file__", None)
        if path:
            module = os.path.realpath(path)
    return f"{module}.{cls.__qualname__}"


def signature_differences(expected: list[list[Any]], got: list[list[Any]],
                          limit: int = 5) -> list[str]:
    """The first ``limit`` differences between two `net_signature` results, readable."""
    out = []
    want = {row[0]: row for row in expected}
    have = {row[0]: row for row in got}
    for path in want.keys() - have.keys():
        out.append(f"node {path or '<root>'!r} is missing")
    for path in have.keys() - want.keys():
        out.append(f"node {path or '<root>'!r} is extra")
    if [r[0] for r in expected] != [r[0] for r in got] and not out:
        out.append("the nodes come in another order")
    for path in want.keys() & have.keys():
        a, b = want[path], have[path]
        if a[1] != b[1]:
            out.append(f"node {path or '<root>'!r} is a {b[1]}, expected a {a[1]}")
        elif a[2] != b[2]:
            out.append(f"node {path or '<root>'!r} has ports {b[2]}, expected {a[2]}")
    return sorted(out)[:limit]


def build_net(factory: NetFactory, kwargs: bytes) -> Any:
    """Call the factory with the decoded ``net_kwargs``; the net it built.

    Raises:
        NetError: the factory raised (its error is the ``__cause__``), or did
            not return a net (a Node, or a list or dict of Nodes).
    """
    name = getattr(factory, "__qualname__", repr(factory))
    try:
        net = factory(**snapshot.loads(kwargs))
    except Exception as exc:
        raise NetError(f"the net factory {name} raised {type(exc).__name__}: {exc}") from exc
    try:
        walk(net)
    except (TypeError, NetError) as exc:
        raise NetError(f"the net factory {name} did not build a net: {exc}") from None
    return net
