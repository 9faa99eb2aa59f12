"""The one check for "a number, but not a bool" behind every argument check of the package.

``bool`` is a subclass of ``int``: ``isinstance(True, int)`` holds, so a bare
``isinstance`` check would take ``period=True`` as one second and ``depth=False``
as zero. Every argument that counts or measures something refuses True and
False, and asks here rather than repeat the two ``isinstance`` calls.

Subclasses of int and float pass (an ``IntEnum``, ``numpy.float64``), as they
do for ``isinstance``. `settings_repr` is the repr of the settings objects
these checks guard. This module imports nothing from the package, so any
module may use it.
"""

from __future__ import annotations

import inspect
import types
from typing import TypeGuard


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
