"""The state tree: taking CPU copies of a net's state and putting it back.

A tree is a plain nested structure (DESIGN.md section 5)::

    {"format": 1, "time_ns": int, "seeds": {path: int},
     "nodes": {path: node.state_dict()},
     "inputs": {input path: [kept messages, oldest first]},
     "pending": {input path: [messages sent but not yet delivered, in order]},
     "schedule": {path: {"last_update_ns": int}},
     "sync": {synchronizer path: its state},      # only a net with synchronizers
     "params": {node path: [[t_ns, delta, name, value], ...]}}  # only with sets queued

It is taken at a consistent cut (no hook in flight), so restoring it loses
and doubles nothing. ``pending`` holds messages still in a mailbox at the
cut (for an Input of a synchronizer, ``(send time ns, message)`` pairs);
``schedule`` what ``dt`` is measured from, so a resumed run is
bit-identical to one that never stopped. ``params`` holds the parameter sets
made on the net that its nodes have not applied yet, each with the key it
applies from (`params.ParamState`); the values applied are in ``nodes``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import torch

from .errors import SnapshotError
from .messages import Rules, walk

# Nothing here is for users to import: trees come from Run.state_dict and mujou.save.
__all__: list[str] = []

FORMAT = 1
_LEAVES = frozenset((type(None), bool, int, float, str, bytes))
_CPU = torch.device("cpu")
_SECTIONS = ("format", "time_ns", "seeds", "nodes", "inputs", "pending", "schedule")


def _to_cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(_CPU, copy=True)


def copy_state(value: Any, where: str,
               tensor_copy: Callable[[torch.Tensor], torch.Tensor] = _to_cpu) -> Any:
    """A CPU copy of a state value, checked against what a tree may hold.

    Walked without recursion (`messages.walk`), so no state can overflow the stack.

    Args:
        value: a node's ``state_dict()`` (or part of it).
        where: the key path for errors, e.g. ``"node 'ctrl', key 'model'"``.
        tensor_copy: how each tensor is copied to the CPU (default: detached,
            ``.to("cpu", copy=True)``). A CUDA node's cut passes one whose
            copies complete only after a wait (`devices.HostCopier`).

    Returns:
        The same structure with every tensor detached, copied to the CPU. A
        subclass of list, tuple or dict (an OrderedDict, a NamedTuple) becomes
        a plain one.

    Raises:
        TypeError: a value that is not a tensor, None, bool, int, float, str,
            bytes, or a list / tuple / dict (str or int keys) of these; names
            ``where`` and the key.
        ValueError: lists, tuples and dicts nested deeper than
            `messages.MAX_NESTING` levels; names ``where``, the key path and the limit.
    """
    return walk(value, tensor_copy, _RULES, where)


def _refuse(value: Any, path: Callable[[], str]) -> NoReturn:
    """What a value the tree cannot hold becomes: a ``TypeError`` naming its key path."""
    raise TypeError(f"{path()}: a {type(value).__name__} cannot be part of the state; use "
                    "tensors, numbers, str, bytes, None, and lists / tuples / dicts of these")


def _bad_key(key: Any) -> str | None:
    """Why a dict key cannot be part of the state (None: it can)."""
    if type(key) in (str, int):
        return None
    return f"key {key!r} is a {type(key).__name__}; state keys must be str or int"


# What copy_state keeps, converts and refuses (messages.walk's rules for the tree).
_RULES = Rules(_LEAVES, True, _refuse, _bad_key)


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
    # "sync" is there only for a net with synchronizers (mujou_actors.sync), "params"
    # only while parameter sets wait to be applied (mujou_actors.params).
    for section in ("seeds", "nodes", "inputs", "pending", "schedule", "sync", "params"):
        if section in ("sync", "params") and section not in tree:
            continue
        if not isinstance(tree[section], dict):
            raise SnapshotError(f"{source}: {section} must be a dict")
        # Its keys are paths; any other key would also make the fit check compare
        # an int with a str.
        bad = [key for key in tree[section] if type(key) is not str]
        if bad:
            raise SnapshotError(f"{source}: {section} has the key {bad[0]!r} (a "
                                f"{type(bad[0]).__name__}); its keys are dotted paths (str)")
    return tree
