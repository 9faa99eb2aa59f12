"""The one check for "a number, but not a bool" behind every argument check of the package.

``bool`` is a subclass of ``int``: ``isinstance(True, int)`` holds, so a bare
``isinstance`` check would take ``period=True`` as one second and ``depth=False``
as zero. Every argument that counts or measures something refuses True and
False, and asks here rather than repeat the two ``isinstance`` calls.

Subclasses of int and float pass (an ``IntEnum``, ``numpy.float64``), as they
do for ``isinstance``. `settings_repr` is the repr of the settings objects
these checks guard. `declaration_of` finds, for an error of a declaration
(``gain = mujou.Param(...)`` in a class body, ``self.sync =
mujou.ExactTime(...)`` in ``__init__``), the class and the attribute that the
declaration's line makes. This module imports nothing from the package, so
any module may use it.
"""

from __future__ import annotations

import dis
import inspect
import sys
import types
from dataclasses import dataclass
from typing import Any, TypeGuard


def is_number(value: object) -> TypeGuard[int | float]:
    """Whether ``value`` is an int or a float, and not a bool.

    Args:
        value (object): anything.

    Returns:
        bool: True for an ``int`` or a ``float`` (a subclass of either included),
        False for ``True``, ``False`` and everything else.
    """
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an int, and not a bool: `is_number` for counts and seeds.

    Args:
        value (object): anything.

    Returns:
        bool: True for an ``int`` (a subclass included), False for ``True``,
        ``False``, a float and everything else.
    """
    return isinstance(value, int) and not isinstance(value, bool)


def check_workers(workers: object, where: str, *, optional: bool = False) -> None:
    """Refuse a worker count that is not an int >= 1, naming ``workers`` and the caller.

    One check for every place that takes a number of worker threads
    (``mujou.run(workers=)``, ``Kernel(workers=)``, a placed group's kernel),
    so that each refuses a bad count with the same exception and words.

    Args:
        workers (object): the count given.
        where (str): who takes it, the start of the message (``"mujou.run"``).
        optional (bool): None is allowed too (the package's choice). Default: False.

    Raises:
        TypeError: ``workers`` is not an int (a float, a bool, a str; None
            unless ``optional``).
        ValueError: ``workers`` is an int below 1.
    """
    if workers is None and optional:
        return
    expected = "an int >= 1 (worker threads)" + (" or None" if optional else "")
    if not is_int(workers):
        raise TypeError(f"{where}: workers must be {expected}, got {workers!r} "
                        f"({type(workers).__name__})")
    if workers < 1:
        raise ValueError(f"{where}: workers must be {expected}, got {workers}")


def settings_repr(settings: object) -> str:
    """The repr of a settings object (`mujou.Recording`, `Replay`, `Placement`...).

    Its first argument, then every other one whose value differs from the
    default of the class's ``__init__``: ``Recording('run.mcap', view=True)``.
    Each argument is read back from the attribute of the same name.

    Args:
        settings (object): an instance whose ``__init__`` arguments are its attributes.

    Returns:
        str: ``Name(first, name=value, ...)``.
    """
    first, *rest = inspect.signature(type(settings)).parameters.values()
    shown = [repr(_plain(getattr(settings, first.name)))]
    shown += [f"{p.name}={_plain(getattr(settings, p.name))!r}" for p in rest
              if getattr(settings, p.name) != p.default]
    return f"{type(settings).__name__}({', '.join(shown)})"


def _plain(value: object) -> object:
    """A read-only mapping shown as the dict it copies (what the caller passed)."""
    return dict(value) if isinstance(value, types.MappingProxyType) else value


@dataclass(frozen=True)
class Declaration:
    """What a declaration's statement assigns to, as far as its frame tells (`declaration_of`).

    Attributes:
        cls (str | None): the class: the one whose body holds the statement
            (``gain = Param(...)``), else the class of the object assigned to
            (``self.sync = ExactTime(...)``: ``type(self)``) or of the
            method's first argument; None when none is known.
        owner (Any): the object assigned to (``self``), or the method's first
            argument; None in a class body or when none is known.
        attribute (str | None): the name the statement assigns the new object
            to; None when the object is not assigned at once (``[Param(...)]``,
            a ``return``, a ``lambda``).
        class_body (bool): the statement is in a class body.
    """

    cls: str | None = None
    owner: Any = None
    attribute: str | None = None
    class_body: bool = False


# The loads of a local before `STORE_ATTR` (``self.x = ...``), across Python versions.
_LOAD_LOCAL = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW", "LOAD_DEREF",
                         "LOAD_NAME", "LOAD_GLOBAL"})


def declaration_of(made: object) -> Declaration:
    """The class and attribute of the statement that is making ``made`` (for its errors).

    Called from ``made``'s ``__init__`` (or a method of it) while it refuses
    its arguments, so that the error can name the class and attribute
    declared, which the object itself learns only later (``__set_name__``,
    a run) or never: the statement is the first frame up the stack that
    holds no reference to ``made`` in its locals (``made``'s own methods and
    helpers do: its ``self``, their argument), and the attribute is the one the instruction
    right after its call stores to. Only the errors pay for it (it reads a
    frame and its bytecode); it never raises, and gives what it could not
    find as None.

    Args:
        made (object): the object being made (its ``__init__``'s ``self``).

    Returns:
        Declaration: the class, the owner object and the attribute, each
        None where the frame does not say.
    """
    try:
        frame: types.FrameType | None = sys._getframe(1)
        while frame is not None and any(v is made for v in frame.f_locals.values()):
            frame = frame.f_back
        if frame is None:
            return Declaration()
        return _declaration_in(frame)
    except Exception:  # noqa: BLE001 - only words of an error depend on it
        return Declaration()


def _declaration_in(frame: types.FrameType) -> Declaration:
    code = frame.f_code
    names = frame.f_locals
    in_class = ("__qualname__" in names and "__module__" in names
                and not code.co_flags & inspect.CO_NEWLOCALS)
    after = _after_call(code, frame.f_lasti)
    if in_class:
        cls = str(names["__qualname__"]).rpartition(".")[2]
        stored = (after[0].argval if after and after[0].opname in ("STORE_NAME", "STORE_GLOBAL")
                  else None)
        return Declaration(cls=cls, attribute=stored, class_body=True)
    owner, attribute = None, None
    if len(after) >= 2 and after[0].opname in _LOAD_LOCAL and after[1].opname == "STORE_ATTR":
        loaded = after[0].argval
        owner = names[loaded] if loaded in names else frame.f_globals.get(loaded)
        attribute = after[1].argval
    elif code.co_argcount:
        owner = names.get(code.co_varnames[0])
    return Declaration(cls=None if owner is None else type(owner).__name__, owner=owner,
                       attribute=attribute)


def _after_call(code: types.CodeType, lasti: int) -> list[dis.Instruction]:
    """The two instructions after the call that ``lasti`` is in ([]: it is no call)."""
    instructions = list(dis.get_instructions(code))
    at = max((i for i, ins in enumerate(instructions) if ins.offset <= lasti), default=-1)
    if at < 0 or not instructions[at].opname.startswith("CALL"):
        return []
    return instructions[at + 1:at + 3]
