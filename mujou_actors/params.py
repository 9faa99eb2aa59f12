"""Runtime parameters: ``Param``, declared on a node class, read in hooks as attributes.

A parameter is a named, typed setting of a node (a gain, a noise level, a
mode) that can change while the net runs, as ROS 2's node parameters can::

    class Sensor(mujou.Node):
        noise = mujou.Param(0.01, range=(0.0, 1.0), description="std of the noise, m")
        mode = mujou.Param("fast", choices=("fast", "slow"))

        def on_update(self, dt):
            x = self.truth + self.noise * torch.randn(3, generator=self.generator)

A set from outside the node (``run.set_param("sensor.noise", 0.02)``, ``mujou
run --param``, ``mujou param set``, Foxglove's Parameters panel) is checked
here first (`Param.check`); the run then hands it to the node, which applies
it at its next delta cycle (`ParamState`, docs/parameters.md). This module
knows nothing of runs or threads beyond that hand-over: one lock guards a
node's queue of sets, taken by a host thread and by the node's own update.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ._checks import declaration_of, is_int, is_number
from .errors import ParamError

# No import of node.py, even for types: node.py imports this module, and each module
# imports only those below it (docs/architecture.md, "Imports"). A node is `Any` here.

# Only the names users import (docs/reference.md); the package's own helpers stay importable.
__all__ = ["Param"]

log = logging.getLogger("mujou_actors")

# The value types a parameter may have: what a command line, a JSON client
# (Foxglove) and a recording (JSON) all carry without loss.
_TYPES = (bool, int, float, str)
_NAMES = {bool: "bool", int: "int", float: "float", str: "str"}
# A str parameter's bound: a set is a message, and a recording keeps every one.
MAX_STR = 4096


class Param:
    """A parameter of a node: declared in the class body, read and written as an attribute.

    Each node instance holds its own value, the default until set. Writing the
    attribute (``self.noise = 0.05``, in ``__init__`` or in a hook) checks the
    value and applies it at once; a set from outside the node (`Run.set_param`)
    is checked as it is made and applied at the node's next delta cycle, just
    before that update's ``on_update``, where the node's ``on_param(name, old,
    new)`` is called for it first.

    Args:
        default (bool | int | float | str): the value until set; checked
            against the rules below.
        type (type, optional): ``bool``, ``int``, ``float`` or ``str``; by
            default the default's type. A ``float`` parameter takes an int too
            (made a float); a ``bool`` one takes only ``True``/``False``, an
            ``int`` one no bool.
        range (tuple, optional): ``(low, high)``, inclusive bounds of an int or
            float parameter; either may be None (unbounded).
        choices (Iterable, optional): the only values allowed.
        description (str): what it means, with its unit; shown by ``mujou
            param`` and Foxglove.
        read_only (bool): set only before the run starts (in ``__init__``,
            ``mujou run --param``); a set on a running net is refused, as ROS
            2's read-only parameters are. Default: False.

    Raises:
        TypeError: an unsupported ``type``, a default or bound of the wrong
            type, a ``range`` on a bool or str parameter.
        ValueError: the default outside ``range`` or ``choices``, a range with
            ``low > high`` or a bound that is not finite, no choices, a str
            longer than `MAX_STR` characters. Declared in a class body, each
            error names the class and the attribute (``Param 'gain' of Gain:
            the default 5.0 is above the range's high bound 1.0``).
    """

    __slots__ = ("name", "owner", "type", "default", "low", "high", "choices", "description",
                 "read_only", "_slot")

    def __init__(self, default: bool | int | float | str, *, type: type | None = None,  # noqa: A002
                 range: tuple[Any, Any] | None = None,  # noqa: A002 - the field's term
                 choices: Iterable[Any] | None = None, description: str = "",
                 read_only: bool = False) -> None:
        try:
            self._declare(default, type, range, choices, description, read_only)
        except (TypeError, ValueError) as exc:
            if exc.__class__ not in (TypeError, ValueError):
                raise
            # Each rule's words start "Param: "; say which class's parameter broke it.
            raise exc.__class__(_declared_where(self) + str(exc).removeprefix("Param")) \
                from None

    def _declare(self, default: Any, type: type | None, range: tuple[Any, Any] | None,  # noqa: A002
                 choices: Iterable[Any] | None, description: str, read_only: bool) -> None:
        """`__init__`'s checks and fields; its errors start with ``Param:``."""
        kind = _declared_type(default, type)
        self.name = "?"
        self.owner = "?"
        self.type = kind
        self.low, self.high = _bounds(kind, range)
        self.choices: tuple[Any, ...] | None = None
        if choices is not None:
            if isinstance(choices, (str, bytes)):  # "abc" would be three choices
                raise TypeError(f"Param: choices must be a tuple or list of values, got the "
                                f"str {choices!r}; write ({choices!r},) for one")
            found = tuple(choices)
            if not found:
                raise ValueError("Param: choices must name at least one value")
            self.choices = tuple(self._declared(c, "a choice") for c in found)
            outside = [c for c in self.choices
                       if (self.low is not None and c < self.low)
                       or (self.high is not None and c > self.high)]
            if outside:
                raise ValueError(f"Param: the choice(s) {outside} lie outside the range "
                                 f"({self.low!r}, {self.high!r})")
        if not isinstance(description, str):
            raise TypeError(f"Param: description must be a str, got {description!r}")
        if not isinstance(read_only, bool):
            raise TypeError(f"Param: read_only must be a bool, got {read_only!r}")
        self.description = description
        self.read_only = read_only
        self.default = self._declared(default, "the default")
        problem = self.problem(self.default)
        if problem is not None:
            raise ValueError(f"Param: the default {default!r} {problem}")
        self._slot = ""

    # -- the descriptor protocol ------------------------------------------------------
    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.owner = owner.__name__
        self._slot = "_mujou_param_" + name

    def __get__(self, node: Any, owner: type | None = None) -> Any:
        if node is None:
            return self
        # No try/except: most parameters are never set, and a KeyError raised and caught
        # on each read made reading one three times slower (benchmarks/params.py).
        return node.__dict__.get(self._slot, self.default)

    def __set__(self, node: Any, value: Any) -> None:
        # The error's words are made only for a refusal: a node may write every update.
        try:
            checked = self.check(value)
        except ParamError as exc:
            raise ParamError(_where(node, self.name), exc.rule) from None
        node.__dict__[self._slot] = checked

    # -- checks ---------------------------------------------------------------------
    def check(self, value: Any, where: str | None = None) -> Any:
        """``value`` as this parameter holds it, or a `ParamError` naming the rule it breaks.

        Args:
            value: the value to set.
            where (str, optional): what the error names (``"parameter
                'sensor.noise'"``); default: the class and the name.

        Returns:
            The value, an int made a float for a float parameter.

        Raises:
            ParamError: a value of the wrong type, outside the range, not
                among the choices, or a str longer than `MAX_STR`.
        """
        try:
            converted = self._convert(value, "the value")
        except (TypeError, ValueError) as exc:
            raise ParamError(where or self._named(), str(exc)) from None
        problem = self.problem(converted)
        if problem is not None:
            raise ParamError(where or self._named(), f"{value!r} {problem}")
        return converted

    def _named(self) -> str:
        """What an error names when its caller gave no ``where``."""
        return f"parameter {self.owner}.{self.name}"

    def problem(self, value: Any) -> str | None:
        """Why a value of the right type breaks the range or the choices (None: it does not)."""
        if self.choices is not None and value not in self.choices:
            return f"is not one of the choices {list(self.choices)}"
        if self.low is not None and value < self.low:
            return f"is below the range's low bound {self.low!r}"
        if self.high is not None and value > self.high:
            return f"is above the range's high bound {self.high!r}"
        return None

    def _declared(self, value: Any, what: str) -> Any:
        """`_convert` for the declaration: its errors start with ``Param:``, as the others'."""
        try:
            return self._convert(value, what)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"Param: {exc}") from None

    def _convert(self, value: Any, what: str) -> Any:
        kind = self.type
        if kind is bool:
            if type(value) is not bool:
                raise TypeError(f"{what} {value!r} is not a bool (True or False)")
            return value
        if kind is int:
            if not is_int(value):
                raise TypeError(f"{what} {value!r} is not an int")
            return int(value)
        if kind is float:
            if not is_number(value):
                raise TypeError(f"{what} {value!r} is not a float (nor an int)")
            converted = float(value)
            if not math.isfinite(converted):
                raise ValueError(f"{what} {value!r} is not finite")
            return converted
        if type(value) is not str:
            raise TypeError(f"{what} {value!r} is not a str")
        if len(value) > MAX_STR:
            raise ValueError(f"{what} is {len(value)} characters long, more than {MAX_STR}")
        return value

    def parse(self, text: str, where: str | None = None) -> Any:
        """A value from its text, as a command line gives it (``--param sensor.noise=0.02``).

        ``true``/``false`` (any case), ``1``/``0`` for a bool; Python's
        ``int()`` and ``float()`` for numbers; a str as it is.

        Raises:
            ParamError: text that is not a value of the parameter's type, or
                a value that breaks its rules.
        """
        where = where or f"parameter {self.owner}.{self.name}"
        kind = self.type
        value: Any = text
        try:
            if kind is bool:
                lowered = text.strip().lower()
                if lowered not in ("true", "false", "1", "0"):
                    raise ValueError
                value = lowered in ("true", "1")
            elif kind is int:
                value = int(text)
            elif kind is float:
                value = float(text)
        except ValueError:
            accepted = " (true, false, 1 or 0)" if kind is bool else ""
            article = "an" if kind is int else "a"
            raise ParamError(where, f"{text!r} is not {article} {_NAMES[kind]}{accepted}") \
                from None
        return self.check(value, where)

    def describe(self) -> dict[str, Any]:
        """What the parameter is, as JSON-ready fields (the CLI's and a recording's listing)."""
        return {"type": _NAMES[self.type], "default": self.default,
                "range": None if self.low is None and self.high is None
                else [self.low, self.high],
                "choices": None if self.choices is None else list(self.choices),
                "description": self.description, "read_only": self.read_only}

    def __repr__(self) -> str:
        return f"Param({self.default!r}, type={_NAMES[self.type]})"


def _declared_type(default: Any, kind: Any) -> type:
    if kind is None:
        kind = type(default)
    if kind not in _TYPES:
        raise TypeError(f"Param: type must be one of bool, int, float, str; got {kind!r}"
                        + ("" if kind is not type(default) else " (the default's type)"))
    return kind


def _bounds(kind: type, bounds: Any) -> tuple[Any, Any]:
    if bounds is None:
        return None, None
    if kind not in (int, float):
        raise TypeError(f"Param: range applies to int and float parameters, not {_NAMES[kind]}")
    if not isinstance(bounds, tuple) or len(bounds) != 2:
        raise TypeError(f"Param: range must be a tuple (low, high), got {bounds!r}")
    found: list[Any] = []
    for bound in bounds:
        if bound is None:
            found.append(None)
            continue
        if not (is_int(bound) if kind is int else is_number(bound)):
            raise TypeError(f"Param: the range's bound {bound!r} is not "
                            f"{'an' if kind is int else 'a'} {_NAMES[kind]}")
        if not math.isfinite(bound):
            raise ValueError(f"Param: the range's bound {bound!r} is not finite")
        found.append(kind(bound))
    low, high = found
    if low is not None and high is not None and low > high:
        raise ValueError(f"Param: range ({low!r}, {high!r}) has low > high")
    return low, high


def _declared_where(param: Param) -> str:
    """How a declaration error names the parameter: ``Param 'gain' of Gain`` in a class body.

    Read off the statement being run (`declaration_of`), as ``__set_name__``
    comes only once the class body has run: ``Param of Gain`` when the
    statement assigns no name, ``Param`` outside a class body.
    """
    found = declaration_of(param)
    if not found.class_body:
        return "Param"
    named = "" if found.attribute is None else f" {found.attribute!r}"
    return f"Param{named} of {found.cls}"


def _where(node: Any, name: str) -> str:
    path = getattr(node, "_mujou_path", None)
    return (f"parameter {name!r} of {type(node).__name__}" if path is None
            else f"parameter {join(path, name)!r}")


def join(node_path: str, name: str) -> str:
    """A parameter's dotted path: its node's path and its name (the root's: the name)."""
    return f"{node_path}.{name}" if node_path else name


_param_names: dict[type, tuple[str, ...]] = {}


def params_of_class(cls: type) -> dict[str, Param]:
    """The parameters declared on ``cls`` and its bases, by name, in definition order."""
    names = _param_names.get(cls)
    if names is None:
        seen: dict[str, None] = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                if isinstance(value, Param):
                    seen[name] = None
        names = _param_names[cls] = tuple(seen)
    found = {}
    for name in names:
        declared = getattr(cls, name, None)
        if isinstance(declared, Param):  # (a subclass may hide a base's with a plain value)
            found[name] = declared
    return found


def values_of(node: Any) -> dict[str, Any]:
    """Every parameter of ``node`` and its current value, by name."""
    return {name: getattr(node, name) for name in params_of_class(type(node))}


class ParamState:
    """The sets handed to one node and not yet applied, ordered by the key they apply from.

    A set made at key ``(t_ns, delta)`` (the next delta cycle as the run
    stood when the set came: `Dispatcher.param_key`) is applied by the
    node's first update whose key is at or past it, so in simulated time
    which update applies it does not depend on the workers' timing: a
    recording keeps that key and a replay applies it at the same update.
    Host threads add; the node's update takes (never both at once: one lock,
    held for a few statements).
    """

    __slots__ = ("_lock", "_sets")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sets: list[tuple[int, int, str, Any]] = []  # (t_ns, delta, name, value), sorted

    def add(self, t_ns: int, delta: int, name: str, value: Any) -> None:
        """Queue a checked set that applies from key ``(t_ns, delta)``."""
        item = (t_ns, delta, name, value)
        with self._lock:
            # Sets come in key order, but a replay's come all at once: keep them sorted,
            # equal keys in the order they came.
            bisect.insort_right(self._sets, item, key=lambda s: (s[0], s[1]))

    def __bool__(self) -> bool:
        return bool(self._sets)

    def due(self, key: tuple[int, int]) -> list[tuple[str, Any]]:
        """Take the sets that apply at or before ``key`` (an update's), oldest first."""
        with self._lock:
            sets = self._sets
            n = 0
            while n < len(sets) and (sets[n][0], sets[n][1]) <= key:
                n += 1
            taken, self._sets = sets[:n], sets[n:]
        return [(name, value) for _, _, name, value in taken]

    def pending(self) -> list[list[Any]]:
        """What is queued, as ``[t_ns, delta, name, value]`` lists (a state tree's entry)."""
        with self._lock:
            return [list(s) for s in self._sets]


def iter_params(nodes: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any, Param]]:
    """``(parameter path, node, Param)`` for every parameter of the nodes given by path."""
    for path, node in nodes:
        for name, param in params_of_class(type(node)).items():
            yield join(path, name), node, param


def guard_params(actor: Any, sets: ParamState) -> None:
    """Apply the node's due parameter sets before each of its updates.

    Wraps ``actor.update`` once, as the run starts, for a node that declares
    parameters (as `_runtime.actor.guard_deadlines` wraps it for a budget):
    a node without parameters keeps its update as it is and pays nothing.
    Before ``on_update``, each set due at the update's key (``actor.flight``'s
    stamp) is applied in key order and ``on_param(name, old, new)`` is called
    for it, in the node's context, on the update's thread; what ``on_param``
    raises fails the node as ``on_update`` would (the value stays set).

    Args:
        actor (Actor): the node's actor.
        sets (ParamState): the node's queue of sets.
    """
    update = actor.update
    flight = actor.flight  # [hook, stamp]: the stamp is the update's key
    slots = {name: p._slot for name, p in params_of_class(type(actor.node)).items()}

    def applying(node: Any, dt: float) -> None:
        if sets:
            for name, value in sets.due(flight[1]):
                slot = slots[name]
                old = node.__dict__.get(slot, getattr(type(node), name).default)
                node.__dict__[slot] = value
                node.on_param(name, old, value)
        update(node, dt)

    actor.update = applying


# Where a node holds its run's queue of sets (a node is in one run at a time).
SETS = "_mujou_param_sets"


class RunParams:
    """The parameters of a run's nodes: resolve a path, check a set, and queue it.

    Made as a run (or a placed run's kernel, or its host) is built, from the
    nodes; `guard` then gives each actor whose node declares parameters a
    `ParamState` (kept on the node, where a cut finds it) and wraps its update
    (`guard_params`). A placed run's host only resolves and checks: its
    groups' kernels queue.

    Args:
        nodes (Iterable[tuple[str, Node]]): the nodes by path.
    """

    def __init__(self, nodes: Iterable[tuple[str, Any]]) -> None:
        self.nodes: dict[str, Any] = {path: node for path, node in nodes
                                      if params_of_class(type(node))}
        self.sets: dict[str, ParamState] = {}

    def guard(self, actors: Iterable[Any], skip: Iterable[str] = ()) -> None:
        """Queue and apply sets for these actors' nodes (those with parameters).

        Args:
            actors (Iterable[Actor]): the actors of this kernel.
            skip (Iterable[str]): paths of nodes that never update (a
                replay's stand-ins): they get no queue, and sets to them are
                refused (`check`).
        """
        skipped = set(skip)
        for actor in actors:
            node = actor.node
            if actor.path not in self.nodes:
                continue
            if actor.path in skipped:
                node.__dict__.pop(SETS, None)
                continue
            sets = self.sets[actor.path] = ParamState()
            node.__dict__[SETS] = sets
            guard_params(actor, sets)

    def resolve(self, path: Any) -> tuple[str, str, Param]:
        """``(node path, name, Param)`` of a parameter's dotted path.

        Raises:
            ParamError: not a str, or no such parameter (the message lists
                the node's parameters, or the nodes that have some).
        """
        if not isinstance(path, str):
            raise ParamError(f"parameter {path!r}", "a parameter is named by its dotted path "
                             "(a str, e.g. 'sensor.noise')")
        node_path, _, name = path.rpartition(".")
        node = self.nodes.get(node_path)
        if node is None and not self.nodes:
            raise ParamError(f"parameter {path!r}", "this net declares no parameters (a "
                             "node declares one as a class attribute, mujou.Param)")
        if node is None:
            raise ParamError(f"parameter {path!r}", f"no node {node_path or '<root>'!r} with "
                             f"parameters in this run (nodes with parameters: "
                             f"{sorted(self.nodes)})")
        declared = params_of_class(type(node))
        if name not in declared:
            raise ParamError(f"parameter {path!r}", f"node {node_path or '<root>'!r} "
                             f"({type(node).__name__}) has no parameter {name!r} (its "
                             f"parameters: {sorted(declared)})")
        return node_path, name, declared[name]

    def check(self, path: Any, value: Any) -> tuple[str, str, Any]:
        """``(node path, name, checked value)`` of a set on the running net.

        Raises:
            ParamError: no such parameter, a read-only one, or a value that
                breaks its rules.
        """
        node_path, name, param = self.resolve(path)
        if param.read_only:
            raise ParamError(f"parameter {path!r}", "is read-only: set it before the run "
                             "starts (in __init__, or mujou run --param)")
        return node_path, name, param.check(value, f"parameter {path!r}")

    def values(self) -> dict[str, Any]:
        """Every parameter's current value (applied, not queued), by dotted path."""
        return {join(path, name): getattr(node, name) for path, node in self.nodes.items()
                for name in params_of_class(type(node))}

    def describe(self) -> dict[str, dict[str, Any]]:
        """Every parameter's `Param.describe`, with its current ``value``, by dotted path."""
        found = {}
        for path, node in self.nodes.items():
            for name, param in params_of_class(type(node)).items():
                found[join(path, name)] = {**param.describe(), "value": getattr(node, name)}
        return found

    def preload(self, initial: dict[str, Any], sets: Iterable[tuple[int, int, str, str, Any]],
                where: str) -> list[tuple[int, int, str, str, Any]]:
        """Give the nodes a recorded run's parameters: its start values, and its sets queued.

        A replay's: each value goes in as a set of the node's own (checked,
        no ``on_param``) and each set is queued at its recorded key, so the
        update that applied it in the recorded run applies it again. A
        parameter this net does not have (its code changed) is skipped, with
        one warning naming them all.

        Args:
            initial (dict): value by dotted path (`RecordedParams.initial`).
            sets (Iterable): ``(t_ns, delta, node, name, value)`` of each set.
            where (str): the recording, for the warning.

        Returns:
            list: the sets queued, ``(t_ns, delta, node, name, value)`` (what
            a recording of the replay keeps).

        Raises:
            ParamError: a recorded value breaks its parameter's rules here.
        """
        skipped = []
        queued = []
        for path, value in initial.items():
            try:
                node_path, name, _ = self.resolve(path)
            except ParamError:
                skipped.append(path)
                continue
            setattr(self.nodes[node_path], name, value)
        for t_ns, delta, node_path, name, value in sets:
            path = join(node_path, name)
            try:
                self.resolve(path)
            except ParamError:
                skipped.append(path)
                continue
            state = self.sets.get(node_path)
            if state is not None:  # (a replaced node's sets change nothing)
                param = params_of_class(type(self.nodes[node_path]))[name]
                checked = param.check(value, f"parameter {path!r}")
                state.add(t_ns, delta, name, checked)
                queued.append((t_ns, delta, node_path, name, checked))
        if skipped:
            log.warning("replay of %s: the net has no parameter(s) %s that the recorded run "
                        "had; their values and sets are not applied", where,
                        sorted(set(skipped)))
        return queued


def param_problems(section: Any, nodes: dict[str, Any]) -> list[str]:
    """What keeps a state tree's ``params`` section from loading into these nodes, in words.

    Args:
        section: the tree's ``params`` (``{node path: [[t_ns, delta, name,
            value], ...]}``), ``{}`` when it has none.
        nodes (dict[str, Node]): the net's nodes by path.

    Returns:
        list[str]: one line per problem (empty: it fits).
    """
    problems = []
    for path, entries in section.items():
        node = nodes.get(path)
        declared = {} if node is None else params_of_class(type(node))
        if not declared:
            problems.append(f"params[{path!r}]: no node with parameters at that path")
            continue
        if not isinstance(entries, list):
            problems.append(f"params[{path!r}] is a {type(entries).__name__}, not a list")
            continue
        for i, entry in enumerate(entries):
            where = f"params[{path!r}][{i}]"
            if not isinstance(entry, (list, tuple)) or len(entry) != 4:
                problems.append(f"{where} is not a set [t_ns, delta, name, value]")
                continue
            t_ns, delta, name, value = entry
            if not (is_int(t_ns) and is_int(delta) and t_ns >= -1 and delta >= 0):
                problems.append(f"{where}: t_ns and delta must be the ints of a key")
            elif name not in declared:
                problems.append(f"{where}: node {path!r} has no parameter {name!r}")
            else:
                try:
                    declared[name].check(value, f"{where} (parameter {name!r})")
                except ParamError as exc:
                    problems.append(str(exc))
    return problems


def check_values(values: Any, found: Iterable[tuple[str, Any]],
                 where: str = "mujou.run") -> dict[str, tuple[Any, str, Any]]:
    """Check ``mujou.run(params=)`` against a net: ``{path: (node, name, value)}``.

    Read-only parameters may be given: the run has not started.

    Raises:
        TypeError: ``values`` is not a mapping with str keys.
        ParamError: a path that names no parameter, or a value that breaks
            its rules (every value is checked before any is set).
    """
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise TypeError(f"{where}: params must be a mapping of parameter path to value, "
                        f"got {type(values).__name__}")
    table = RunParams(found)
    checked = {}
    for path, value in values.items():
        node_path, name, param = table.resolve(path)
        checked[path] = (table.nodes[node_path], name, param.check(value, f"parameter {path!r}"))
    return checked


def set_values(values: Any, found: Iterable[tuple[str, Any]], where: str = "mujou.run") -> None:
    """Set ``mujou.run(params=)`` on a net's nodes before it starts: all checked, then all set.

    Raises:
        TypeError, ParamError: as `check_values`; nothing is set then.
    """
    for node, name, value in check_values(values, found, where).values():
        setattr(node, name, value)


def keep_values(state: Any, node: Any) -> Any:
    """A restart's state for ``node``: ``state`` with each parameter at the node's current value.

    A restart from a snapshot rewinds a node's state, but not its parameters:
    a set made after the snapshot stays set, as an operator expects of a
    setting (ROS 2 keeps a node's parameters across its lifecycle's
    transitions too). The caller holds the node still (no hook in flight).

    Args:
        state: the node's entry of the snapshot (a dict), or None.
        node (Node): the node being restarted.

    Returns:
        A new dict (``state`` itself when the node has no parameters or
        ``state`` is not a dict).
    """
    declared = params_of_class(type(node))
    if not declared or not isinstance(state, dict):
        return state
    return {**state, **{name: getattr(node, name) for name in declared}}
