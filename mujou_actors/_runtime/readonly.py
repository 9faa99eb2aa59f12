"""What ``check_read_only=True`` notes of the messages a reader holds, to tell a change.

Every reader of an Output holds the same message object, so a reader must not
change what it received. `note` takes, before the reader's ``on_update``,
what tells a change afterwards, and `changed` compares once it returned
(`actor.guard_read_only` calls both around the update):

* a tensor: its version counter (``tensor._version``, which every in-place
  operation moves), cheap whatever its size;
* anything else that can change (a list, a dict, a set, a numpy array, a
  dataclass or another object, and every container holding one): a
  fingerprint, the message's pickle bytes. In it each tensor stands for
  itself by identity (its counter checks its values), and so does each class
  and function (a class defined inside a function has no name to pickle by).
  A numpy array pickles its bytes, so a write into it is a change;
* an int, float, str, bytes, None, and tuples (``NamedTuple`` included) of
  those and of tensors: nothing but their tensors' counters, since nothing
  else in them can change.

A message that pickle cannot write (it holds a lock, a generator, an open
file) is checked for its tensors only; its Input is logged once.

Nothing here runs unless the run checks: off, `note` is never called.
"""

from __future__ import annotations

import copyreg
import io
import logging
import pickle
import sys
from types import FunctionType
from typing import TYPE_CHECKING, Any

from torch import Tensor

from ..errors import describe
from ..messages import tensors_in

if TYPE_CHECKING:
    from ..ports import Input

__all__ = ["note", "changed", "kind_of", "Fingerprinter"]

log = logging.getLogger("mujou_actors")

# Values of these exact types never change: nothing of them is noted.
_IMMUTABLE = frozenset({int, float, complex, bool, str, bytes, type(None)})

# How deep `_frozen` looks into tuples before it takes the fingerprint instead.
_FROZEN_DEPTH = 8

Versions = list[tuple["Input", Tensor, int]]
Prints = list[tuple["Input", Any, bytes]]


def note(inputs: tuple[Input, ...], refused: set[int],
         fingerprinter: Fingerprinter) -> tuple[Versions, Prints]:
    """What tells whether the messages that ``inputs`` hold change: before an update.

    Args:
        inputs (tuple[Input, ...]): the reader's Inputs.
        refused (set[int]): ids of the Inputs already logged for a message
            pickle cannot write (updated here: each is logged once).
        fingerprinter (Fingerprinter): the reader's.

    Returns:
        tuple: ``(port, tensor, version)`` for each tensor held, and
        ``(port, message, fingerprint)`` for each message that may change
        otherwise.
    """
    versions: Versions = []
    prints: Prints = []
    for port in inputs:
        for message in port._buffer:
            kind = type(message)
            if kind is Tensor:
                _add_version(versions, port, message)
            elif kind in _IMMUTABLE:
                continue
            elif _frozen(message, 0):
                for t in tensors_in(message):
                    _add_version(versions, port, t)
            else:
                tensors: list[Tensor] = []
                try:
                    prints.append((port, message, fingerprinter.take(message, tensors)))
                except Exception as exc:  # noqa: BLE001 - pickle's refusals take many types
                    if id(port) not in refused:
                        refused.add(id(port))
                        log.warning("check_read_only: a %s received on %r cannot be "
                                    "pickled (%s): only the tensors in it are checked",
                                    kind_of(message), port.path, describe(exc))
                    tensors = _tensors_or_none(message)
                for t in tensors:
                    _add_version(versions, port, t)
    return versions, prints


def changed(message: Any, fingerprint: bytes, fingerprinter: Fingerprinter) -> bool:
    """Whether ``message`` no longer has ``fingerprint`` (taken by `note`): it was changed.

    A message that pickle cannot write any more (a lock put into it) changed too.
    """
    try:
        return fingerprinter.take(message, []) != fingerprint
    except Exception:  # noqa: BLE001 - it pickled before the update: what went in changed it
        return True


def kind_of(message: Any) -> str:
    """What ``message`` is, for an error: its type's name, after its module's for a type
    not built in (``list``, ``numpy.ndarray``, ``robot.messages.Pose``)."""
    kind = type(message)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _add_version(versions: Versions, port: Input, t: Tensor) -> None:
    try:
        versions.append((port, t, t._version))
    except RuntimeError:  # an inference-mode tensor keeps no version counter
        pass


def _frozen(value: Any, depth: int) -> bool:
    """Whether nothing in ``value`` can change but its tensors (checked by counter)."""
    if isinstance(value, Tensor) or type(value) in _IMMUTABLE:
        return True
    # A tuple subclass with a __dict__ holds attributes that may change.
    if isinstance(value, tuple) and depth < _FROZEN_DEPTH and not hasattr(value, "__dict__"):
        return all(_frozen(item, depth + 1) for item in value)
    return False


def _tensors_or_none(message: Any) -> list[Tensor]:
    try:
        return tensors_in(message)
    except ValueError:  # nested past MAX_NESTING: a send refuses it, a write may not
        return []


def _token(*parts: Any) -> None:
    """What a tensor, class, function, array or plain object becomes in a fingerprint.

    Its reduction calls this with what tells the object apart: a fingerprint
    is compared, never unpickled, so this is never called.
    """


class Fingerprinter:
    """Takes fingerprints (`take`): one per reader, reused, as a reader's hooks never overlap.

    Making a pickler costs more than pickling a small message: each reader
    keeps one, with its buffer, for all its updates.
    """

    def __init__(self) -> None:
        self._buffer = io.BytesIO()
        self._pickler = _Pickler(self._buffer)

    def take(self, message: Any, tensors: list[Tensor]) -> bytes:
        """The pickle bytes of ``message``; the tensors met go into ``tensors``.

        Raises:
            Exception: what pickle raises for a message it cannot write.
        """
        buffer, pickler = self._buffer, self._pickler
        buffer.seek(0)
        buffer.truncate()
        pickler.clear_memo()  # the memo holds the last message's objects: not across takes
        pickler.tensors = tensors
        try:
            pickler.dump(message)
        finally:
            pickler.tensors = []
        return buffer.getvalue()


class _Pickler(pickle.Pickler):
    """Pickles a message for its fingerprint, by identity what a fingerprint need not hold.

    Tensors stand for themselves (their counters check their values), as do
    classes and functions (a class defined in a function has no name to
    pickle by); a numpy array by its dtype, shape and bytes, and a plain
    object (a dataclass) by its class and ``__dict__``, which pickle faster
    than their own reductions.
    """

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors: list[Tensor] = []

    # Called for every object but exact ints, floats, strs, lists, dicts and the like
    # (pickle's own fast path): a list of a million floats costs no Python call each.
    def reducer_override(self, obj: Any) -> Any:
        if obj is _token:  # what the reductions below call: pickled by its name
            return NotImplemented
        kind = type(obj)
        if isinstance(obj, Tensor):
            self.tensors.append(obj)
            return _token, (id(obj),)
        if isinstance(obj, (type, FunctionType)):
            return _token, (id(obj),)
        numpy = sys.modules.get("numpy")  # no numpy imported: no array in any message
        if numpy is not None and kind is numpy.ndarray and not obj.dtype.hasobject:
            return _token, (obj.dtype.str, obj.shape, obj.tobytes())
        if _plain(kind) and hasattr(obj, "__dict__"):
            # The state after the reduction, as pickle's own: an object that holds itself
            # is memoized before its __dict__ is written, not written for ever.
            return _token, (id(kind),), obj.__dict__
        return NotImplemented


def _plain(kind: type) -> bool:
    """Whether instances of ``kind`` pickle as their ``__dict__`` alone (a dataclass's do)."""
    methods: Any = (getattr(kind, "__reduce_ex__", None), getattr(kind, "__reduce__", None),
                    getattr(kind, "__getstate__", _DEFAULTS[2]))
    return (methods == _DEFAULTS and kind not in copyreg.dispatch_table
            and not hasattr(kind, "__slots__"))


# object's own reduction and state: a class that keeps them pickles as its __dict__.
_DEFAULTS: Any = (object.__reduce_ex__, object.__reduce__, getattr(object, "__getstate__", None))
