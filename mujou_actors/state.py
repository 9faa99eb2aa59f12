"""The state tree: taking CPU copies of a net's state and putting it back.

A tree is a plain nested structure (DESIGN.md section 5)::

    {"format": 1, "time_ns": int, "seeds": {path: int},
     "nodes": {path: node.state_dict()},
     "inputs": {input path: [kept messages, oldest first]},
     "pending": {input path: [messages sent but not yet delivered, in order]},
     "schedule": {path: {"last_update_ns": int}}}

It is taken at a consistent cut (no hook in flight), so restoring it loses
and doubles nothing. ``pending`` holds messages still in a mailbox at the
cut; ``schedule`` what ``dt`` is measured from, so a resumed run is
bit-identical to one that never stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .errors import SnapshotError

__all__ = ["FORMAT", "copy_state", "check_tree"]

FORMAT = 1
_LEAVES = (type(None), bool, int, float, str, bytes)
_CPU = torch.device("cpu")
_SECTIONS = ("format", "time_ns", "seeds", "nodes", "inputs", "pending", "schedule")


def _to_cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(_CPU, copy=True)


def copy_state(value: Any, where: str,
               tensor_copy: Callable[[torch.Tensor], torch.Tensor] = _to_cpu) -> Any:
    """A CPU copy of a state value, checked against what a tree may hold.

    Args:
        value: a node's ``state_dict()`` (or part of it).
        where: the key path for errors, e.g. ``"node 'ctrl', key 'model'"``.
        tensor_copy: how each tensor is copied to the CPU (default: detached,
            ``.to("cpu", copy=True)``). A CUDA node's cut passes one whose
            copies complete only after a wait (`devices.HostCopier`).

    Returns:
        The same structure with every tensor detached, copied to the CPU.

    Raises:
        TypeError: a value that is not a tensor, None, bool, int, float, str,
            bytes, or a list / tuple / dict (str or int keys) of these; names
            ``where`` and the key.
    """
    return _copy(value, where, (), tensor_copy)


def _copy(value: Any, where: str, keys: tuple[Any, ...],
          tensor_copy: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    # ``keys`` is the path below ``where``; it is put into words only for an
    # error (a snapshot of a big net copies thousands of small states).
    vt = type(value)
    if vt in _LEAVES:
        return value
    if isinstance(value, torch.Tensor):
        return tensor_copy(value)
    if vt is list or vt is tuple:
        items = [_copy(v, where, (*keys, i), tensor_copy) for i, v in enumerate(value)]
        return items if vt is list else tuple(items)
    if vt is dict:
        out = {}
        for k, v in value.items():
            if type(k) not in (str, int):
                raise TypeError(f"{_where(where, keys)}: key {k!r} is a {type(k).__name__}; "
                                "state keys must be str or int")
            out[k] = _copy(v, where, (*keys, k), tensor_copy)
        return out
    if isinstance(value, (list, tuple, dict)):  # subclasses, e.g. OrderedDict
        return _copy(vt.__base__(value) if vt.__base__ in (list, tuple, dict)
                     else dict(value), where, keys, tensor_copy)
    raise TypeError(f"{_where(where, keys)}: a {vt.__name__} cannot be part of the state; use "
                    "tensors, numbers, str, bytes, None, and lists / tuples / dicts of these")


def _where(where: str, keys: tuple[Any, ...]) -> str:
    return where + "".join(f"[{k!r}]" for k in keys)


def check_tree(tree: Any, source: str) -> dict[str, Any]:
    """Check the shape of a state tree before restoring it.

    Args:
        tree: what ``Run.state_dict()`` or ``mujou.load`` returned.
        source: where it came from, for errors (a file name or ``"state"``).

    Returns:
        dict: ``tree`` itself.

    Raises:
        SnapshotError: not a tree of this format, a section is missing or not a
            dict, a section has a key that is not a str, or ``time_ns`` is not an
            int in ``[0, 2**63)``.
    """
    if not isinstance(tree, dict):
        raise SnapshotError(f"{source}: a state tree is a dict, got {type(tree).__name__}")
    if tree.get("format") != FORMAT:
        raise SnapshotError(f"{source}: state tree format {tree.get('format')!r}; "
                            f"this version reads format {FORMAT}")
    missing = [k for k in _SECTIONS if k not in tree]
    if missing:
        raise SnapshotError(f"{source}: state tree lacks {', '.join(missing)}")
    time_ns = tree["time_ns"]
    if type(time_ns) is not int or not 0 <= time_ns < 2**63:
        raise SnapshotError(f"{source}: time_ns must be an int in [0, 2**63) (a timer's "
                            f"nanoseconds), got {time_ns!r}")
    for section in ("seeds", "nodes", "inputs", "pending", "schedule"):
        if not isinstance(tree[section], dict):
            raise SnapshotError(f"{source}: {section} must be a dict")
        # Its keys are paths; any other key would also make the fit check compare
        # an int with a str.
        bad = [key for key in tree[section] if type(key) is not str]
        if bad:
            raise SnapshotError(f"{source}: {section} has the key {bad[0]!r} (a "
                                f"{type(bad[0]).__name__}); its keys are dotted paths (str)")
    return tree
