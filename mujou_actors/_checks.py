"""The one check for "a number, but not a bool" behind every argument check of the package.

``bool`` is a subclass of ``int``: ``isinstance(True, int)`` holds, so a bare
``isinstance`` check would take ``period=True`` as one second and ``depth=False``
as zero. Every argument that counts or measures something refuses True and
False, and asks here rather than repeat the two ``isinstance`` calls.

Subclasses of int and float pass (an ``IntEnum``, ``numpy.float64``), as they
do for ``isinstance``. This module imports nothing from the package, so any
module may use it.
"""

from __future__ import annotations

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
