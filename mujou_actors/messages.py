"""Messages: port types and their checks, copying, and the one container walker.

A port's declared type is a `_Spec` (a Python type, or a tensor with a shape
and a dtype), compiled into a small check function when the port is bound
(`_make_checker`). A message sent on a port is copied once (`copy_message`:
value semantics); the device routing rebuilds a message with its tensors moved
(`map_tensors`), and a node's state is copied into the state tree
(``state.copy_state``). All of these go through containers the same way, with
`walk`: iteratively, never recursing, so no message or state can overflow the
stack, and nested at most `MAX_NESTING` levels deep.

This module knows nothing of threads, nodes or runs.
"""

from __future__ import annotations

import copy
import dataclasses
import operator
import sys
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import torch
from torch.autograd import forward_ad as _forward_ad

from ._checks import is_int, is_number
from .errors import PortTypeError

# What users import: the limit the docs name. The rest (walk, Rules, copy_message,
# map_tensors, tensors_in, describe_value, SCALARS) is for the package's own modules.
__all__ = ["MAX_NESTING"]

Checker = Callable[[Any], Any]

SCALARS: frozenset[type] = frozenset((type(None), bool, int, float, complex, str, bytes))
"""The immutable types a message shares as it is (exact types: a subclass is copied)."""

MAX_NESTING = 1000
"""How deep containers may nest in a message or a state; the outermost counts as level 1.

Before `walk`, Python's recursion limit (1000 frames by default) refused
deeper ones with a bare ``RecursionError``, so nothing that worked is refused.
A snapshot file holds less: `mujou_actors.snapshot.MAX_DEPTH` levels.
"""

_Tensor = torch.Tensor
# What the flat fast paths of copy_message share or clone as they are.
_FLAT = SCALARS | {torch.Tensor}
_UNSET = object()  # an init=False field of a dataclass may have no value


# ---------------------------------------------------------------------------
# Message types


class _HasPath(Protocol):
    """What a check names in its errors: a port (read at failure, once bound)."""

    @property
    def path(self) -> str:
        """str: the port's dotted path."""
        ...


class _Spec:
    """The declared type of a port: a Python type, or a tensor with shape/dtype.

    Args:
        type_ (type): the message class (``torch.Tensor`` for tensor ports).
        shape (tuple[int | None, ...] | None): a tensor's shape, None entries free.
        dtype (torch.dtype | None): a tensor's dtype.
        where (str): the port being declared, for errors.

    Raises:
        TypeError: ``type_`` is not a class, or shape / dtype are malformed or
            given for a type other than a tensor.
    """

    __slots__ = ("type", "shape", "dtype", "exact")

    def __init__(self, type_: Any, shape: Any, dtype: Any, where: str) -> None:
        if not isinstance(type_, type):
            raise TypeError(f"{where}: the message type must be a class, got {type_!r}")
        is_tensor = issubclass(type_, torch.Tensor)
        if not is_tensor and (shape is not None or dtype is not None):
            raise TypeError(f"{where}: shape and dtype apply to torch.Tensor ports only")
        if shape is not None:
            if not isinstance(shape, (tuple, list)):
                raise TypeError(f"{where}: shape must be a tuple such as (3,) or (None, 4), "
                                f"got {shape!r}")
            shape = tuple(shape)
            for dim in shape:
                if dim is not None and (type(dim) is not int or dim < 0):
                    raise TypeError(
                        f"{where}: shape must hold ints >= 0 or None, got {shape!r}"
                    )
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"{where}: dtype must be a torch.dtype, got {dtype!r}")
        self.type = type_
        self.shape = shape
        self.dtype = dtype
        # Values of exactly this type pass the check as they are: a send tests
        # ``type(v) is exact`` inline and calls the checker only otherwise.
        # None: every value needs the checker (a tensor with a dtype or shape).
        self.exact: type | None = (
            None if is_tensor and (shape is not None or dtype is not None) else type_)

    def describe(self) -> str:
        """The type in words, as errors name it: ``float``, ``Tensor(dtype=..., shape=...)``."""
        if not issubclass(self.type, torch.Tensor):
            return self.type.__name__
        parts = []
        if self.dtype is not None:
            parts.append(f"dtype={self.dtype}")
        if self.shape is not None:
            parts.append(f"shape={self.shape}")
        return f"Tensor({', '.join(parts)})" if parts else "Tensor"

    def accepts_all_of(self, other: _Spec) -> bool:
        """True when every value of ``other`` passes as it is: no check, no conversion.

        An ``int`` port feeding a ``float`` one does not: its values are
        converted at send, whichever type the sending port declares.
        """
        if self.type is object:
            return True
        if not issubclass(other.type, self.type) or other.type is object:
            return False
        if self.dtype is not None and other.dtype != self.dtype:
            return False
        if self.shape is None:
            return True
        if other.shape is None or len(other.shape) != len(self.shape):
            return False
        return all(a is None or a == b for a, b in zip(self.shape, other.shape, strict=False))

    def may_accept_some_of(self, other: _Spec) -> bool:
        """False when no value of ``other`` can be a value of ``self``."""
        if self.type is object or other.type is object:
            return True
        if self.type is float and other.type is int:
            return True
        if not (issubclass(other.type, self.type) or issubclass(self.type, other.type)):
            return False
        if None not in (self.dtype, other.dtype) and self.dtype != other.dtype:
            return False
        if self.shape is None or other.shape is None:
            return True
        if len(self.shape) != len(other.shape):
            return False
        pairs = zip(self.shape, other.shape, strict=True)
        return all(a is None or b is None or a == b for a, b in pairs)


def describe_value(value: Any) -> str:
    """A short description of a message for error messages (type, dtype, shape).

    Args:
        value: any message.

    Returns:
        str: ``"Tensor(dtype=torch.float32, shape=(3,))"`` for a tensor, the
        type's name otherwise.
    """
    if isinstance(value, torch.Tensor):
        return f"Tensor(dtype={value.dtype}, shape={tuple(value.shape)})"
    return type(value).__name__


def _mismatch(out: _Spec, inp: _Spec) -> str:
    """Which part of two incompatible specs differs, in words."""
    if out.type is not inp.type and not issubclass(out.type, torch.Tensor):
        return "incompatible types"
    if None not in (out.dtype, inp.dtype) and out.dtype != inp.dtype:
        return "the dtypes differ"
    if out.shape is not None and inp.shape is not None:
        if len(out.shape) != len(inp.shape):
            return "the numbers of dimensions differ"
        return "the shapes differ"
    return "incompatible types"


def _make_checker(spec: _Spec, port: _HasPath) -> Checker | None:
    """Compile the check of ``spec`` into one small function (None: accept all).

    The function returns the value to deliver (an ``int`` on a ``float`` port
    becomes a ``float``) or raises `PortTypeError` naming ``port``.
    """
    t = spec.type
    if t is object:
        return None

    def fail(value: Any) -> PortTypeError:
        return PortTypeError(
            f"port {port.path!r}: expected {spec.describe()}, got {describe_value(value)}"
        )

    if issubclass(t, torch.Tensor):
        return _tensor_checker(t, spec.dtype, spec.shape, fail)
    if t is float:

        def check_float(value: Any) -> Any:
            vt = type(value)
            if vt is float:
                return value
            if vt is int or is_number(value):  # the fast path first: no call for an int
                return float(value)
            raise fail(value)

        return check_float
    if t is int:

        def check_int(value: Any) -> Any:
            if type(value) is int or is_int(value):
                return value
            raise fail(value)

        return check_int

    def check_instance(value: Any) -> Any:
        if isinstance(value, t):
            return value
        raise fail(value)

    return check_instance


def _tensor_checker(t: type[torch.Tensor], dtype: torch.dtype | None,
                    shape: tuple[int | None, ...] | None,
                    fail: Callable[[Any], PortTypeError]) -> Checker:
    """The check of a tensor port: what its spec constrains, in one test for the common case.

    A tensor of exactly the port's class passes on one comparison against
    values worked out here: its dtype (``is``: dtypes are singletons) and its
    whole shape (``==`` of a ``torch.Size`` with a tuple, in C), or, with free
    dimensions, its number of dimensions and the fixed sizes picked in one
    go. What the spec leaves free is not looked at. Anything else (a
    subclass, a mismatch) goes through the full check, which raises the
    error naming the port.
    """
    ndim = None if shape is None else len(shape)
    fixed = () if shape is None else tuple(
        (i, size) for i, size in enumerate(shape) if size is not None)

    def full(value: Any) -> Any:
        """The check of any value, subclasses included: each part apart, as errors name them."""
        if not isinstance(value, t):
            raise fail(value)
        if dtype is not None and value.dtype != dtype:
            raise fail(value)
        if ndim is not None:
            vshape = value.shape
            if len(vshape) != ndim:
                raise fail(value)
            for i, size in fixed:
                if vshape[i] != size:
                    raise fail(value)
        return value

    if shape is not None and len(fixed) == ndim:  # every size given: compare the shape whole
        whole = tuple(shape)
        if dtype is None:
            def check_shape(value: Any) -> Any:
                if type(value) is t and value.shape == whole:
                    return value
                return full(value)

            return check_shape

        def check_dtype_shape(value: Any) -> Any:
            if type(value) is t and value.dtype is dtype and value.shape == whole:
                return value
            return full(value)

        return check_dtype_shape
    if shape is not None:  # free dimensions: the count, then the fixed sizes in one pick
        pick = operator.itemgetter(*(i for i, _ in fixed)) if fixed else None
        want = tuple(size for _, size in fixed)
        if len(want) == 1:
            want = want[0]  # type: ignore[assignment]  # itemgetter of one index: the item

        def check_free(value: Any) -> Any:
            if type(value) is t and (dtype is None or value.dtype is dtype):
                vshape = value.shape
                if len(vshape) == ndim and (pick is None or pick(vshape) == want):
                    return value
            return full(value)

        return check_free
    if dtype is not None:
        def check_dtype(value: Any) -> Any:
            if type(value) is t and value.dtype is dtype:
                return value
            return full(value)

        return check_dtype
    return full  # a subclass port without dtype or shape: isinstance alone


# ---------------------------------------------------------------------------
# The container walker


class Rules:
    """What `walk` does with each value it meets, besides tensors.

    Plain lists, tuples and dicts are always containers, walked and rebuilt.

    Args:
        leaves (Iterable[type]): exact types returned as they are.
        convert (bool): True: a subclass of list, tuple or dict is walked as
            (and rebuilt into) its base type, and dataclasses are other values
            (the state tree). False: tuple subclasses (NamedTuples too) and
            dict subclasses keep their type (a dict subclass, like a dataclass,
            is rebuilt from a shallow ``copy.copy`` with its entries replaced,
            so its order and default stay), dataclass instances are rebuilt the
            same way with every set field replaced, ``init=False`` ones
            included, without calling ``__init__`` or ``__post_init__`` again;
            a list subclass is another value.
        other (Callable[[Any, Callable[[], str]], Any]): what any other value
            becomes; called with the value and a function that puts its key
            path into words (for an error).
        bad_key (Callable[[Any], str | None] | None): checks each dict key
            (plain dicts, and converted ones): None when it is fine, else why
            not, which `walk` raises as a ``TypeError`` naming the dict's path.
            None (the default): any key.
    """

    __slots__ = ("leaves", "flat", "convert", "other", "bad_key")

    def __init__(self, leaves: Iterable[type], convert: bool,
                 other: Callable[[Any, Callable[[], str]], Any],
                 bad_key: Callable[[Any], str | None] | None = None) -> None:
        self.leaves = frozenset(leaves)
        # What a container may hold to be rebuilt in one go: leaves and plain tensors.
        self.flat = self.leaves | {torch.Tensor}
        self.convert = convert
        self.other = other
        self.bad_key = bad_key


# The kinds of container a frame rebuilds (see _close).
_LIST, _TUPLE, _DICT, _NAMED, _TUPLE_OF, _ITEMS, _FIELDS = range(7)


def walk(value: Any, fn: Callable[[torch.Tensor], Any], rules: Rules, where: str) -> Any:
    """Rebuild ``value`` with ``fn`` applied to each of its tensors, as ``rules`` say.

    The one walk through the containers of a message or a state. It keeps its
    own stack instead of recursing, so no nesting can overflow Python's, and
    it visits values depth first in order (``fn`` sees the tensors in the
    order they appear). Each tensor (``isinstance``, subclasses too) is
    replaced by ``fn(tensor)``.

    Args:
        value: the message or state.
        fn (Callable[[torch.Tensor], Any]): what each tensor becomes.
        rules (Rules): leaves, containers, other values and dict keys.
        where (str): what ``value`` is, for errors, e.g. ``"message"`` or
            ``"node 'ctrl' state"``; the key path is appended to it.

    Returns:
        The rebuilt value.

    Raises:
        ValueError: containers nest deeper than `MAX_NESTING` levels; names
            ``where``, the key path and the limit.
        TypeError: a dict key ``rules.bad_key`` refuses; names ``where`` and
            the dict's key path. Also what ``rules.other`` and ``fn`` raise.
    """
    leaves, flat, bad_key = rules.leaves, rules.flat, rules.bad_key
    # Each open container is a frame: [kind, values, keys (None: by index),
    # index of the value being walked, rebuilt values so far, type or clone].
    stack: list[list[Any]] = []
    while True:
        vt = type(value)
        if vt in leaves:
            result = value
        elif isinstance(value, _Tensor):
            result = fn(value)
        else:
            if vt is list or vt is tuple:
                # A container of leaves and tensors (most are) is rebuilt in one go.
                for v in value:
                    if type(v) not in flat:
                        frame = [_LIST if vt is list else _TUPLE, value, None, 0, [], None]
                        break
                else:
                    frame = None
                    if len(stack) >= MAX_NESTING:
                        raise _too_deep(where, stack)
                    out = [fn(v) if type(v) is _Tensor else v for v in value]
                    result = out if vt is list else tuple(out)
            elif vt is dict:
                for v in value.values():
                    if type(v) not in flat:
                        frame = [_DICT, list(value.values()), list(value), 0, [], None]
                        break
                else:
                    frame = None
                    if len(stack) >= MAX_NESTING:
                        raise _too_deep(where, stack)
                    if bad_key is not None:
                        for k in value:
                            _check_key(bad_key, k, where, stack, len(stack))
                    result = {k: fn(v) if type(v) is _Tensor else v for k, v in value.items()}
            else:
                frame = _open(value, vt, rules.convert)
                if frame is None:
                    result = rules.other(value, lambda: _path(where, stack, len(stack)))
            if frame is not None:
                if len(stack) >= MAX_NESTING:
                    raise _too_deep(where, stack)
                values = frame[1]
                if values:
                    stack.append(frame)
                    if bad_key is not None and frame[0] == _DICT:
                        _check_key(bad_key, frame[2][0], where, stack, len(stack) - 1)
                    value = values[0]
                    continue
                result = _close(frame)
        # Hand the result to its container; close each container that is done.
        while stack:
            frame = stack[-1]
            frame[4].append(result)
            i = frame[3] = frame[3] + 1
            values = frame[1]
            if i < len(values):
                if bad_key is not None and frame[0] == _DICT:
                    _check_key(bad_key, frame[2][i], where, stack, len(stack) - 1)
                value = values[i]
                break
            stack.pop()
            kind = frame[0]
            if kind == _LIST:
                result = frame[4]
            elif kind == _DICT:
                result = dict(zip(frame[2], frame[4], strict=True))
            else:
                result = _close(frame)
        else:
            return result


def _too_deep(where: str, stack: list[list[Any]]) -> ValueError:
    """The error for a container one level deeper than `MAX_NESTING`, below ``stack``."""
    return ValueError(f"{_path(where, stack, len(stack))}: containers nested deeper than "
                      f"{MAX_NESTING} levels (mujou_actors.messages.MAX_NESTING)")


def _open(value: Any, vt: type, convert: bool) -> list[Any] | None:
    """The frame of a container other than a plain list, tuple or dict (None: not one).

    Clones are made here, before the container's values are walked, as a
    recursive copy makes them.
    """
    if convert:  # the state tree: a subclass is its base type
        if isinstance(value, list):
            return [_LIST, list(value), None, 0, [], None]
        if isinstance(value, tuple):
            return [_TUPLE, tuple(value), None, 0, [], None]
        if isinstance(value, dict):
            plain = dict(value)
            return [_DICT, list(plain.values()), list(plain), 0, [], None]
        return None
    if isinstance(value, tuple):  # a NamedTuple, or another tuple subclass
        return [_NAMED if hasattr(vt, "_fields") else _TUPLE_OF, list(value), None, 0, [], vt]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names, values = [], []
        for f in dataclasses.fields(value):
            field = getattr(value, f.name, _UNSET)
            if field is not _UNSET:
                names.append(f.name)
                values.append(field)
        return [_FIELDS, values, names, 0, [], copy.copy(value)]
    if isinstance(value, dict):
        items = list(value.items())
        return [_ITEMS, [v for _, v in items], [k for k, _ in items], 0, [], copy.copy(value)]
    return None


def _close(frame: list[Any]) -> Any:
    """The container a finished frame rebuilds from its walked values (plain ones inline)."""
    kind, _, keys, _, out, extra = frame
    if kind == _LIST:
        return out
    if kind == _TUPLE:
        return tuple(out)
    if kind == _DICT:
        return dict(zip(keys, out, strict=True))
    if kind == _NAMED:
        return extra(*out)
    if kind == _TUPLE_OF:
        return extra(out)
    if kind == _ITEMS:
        for k, v in zip(keys, out, strict=True):
            extra[k] = v
        return extra
    for name, v in zip(keys, out, strict=True):  # _FIELDS
        object.__setattr__(extra, name, v)  # frozen dataclasses too
    return extra


def _check_key(bad_key: Callable[[Any], str | None], key: Any, where: str,
               stack: list[list[Any]], depth: int) -> None:
    """Raise ``TypeError`` if ``bad_key`` refuses ``key``, naming the dict at ``depth``.

    The dict's path is the keys through the first ``depth`` frames of ``stack``.
    """
    why = bad_key(key)
    if why is not None:
        raise TypeError(f"{_path(where, stack, depth)}: {why}")


def _path(where: str, stack: list[list[Any]], depth: int) -> str:
    """``where`` and the keys that lead through the first ``depth`` frames, in words.

    Put together only for an error (a snapshot of a big net copies thousands of
    small states). A long path shows its first and last four keys.
    """
    keys = []
    for frame in stack[:depth]:
        i = frame[3]
        if frame[0] == _FIELDS:
            keys.append(f".{frame[2][i]}")
        else:
            keys.append(f"[{(i if frame[2] is None else frame[2][i])!r}]")
    if len(keys) > 10:
        keys[4:-4] = ["..."]
    return where + "".join(keys)


# ---------------------------------------------------------------------------
# Copying messages


def clone_tensor(t: torch.Tensor) -> torch.Tensor:
    """A message's own copy of a tensor: detached (no autograd graph), on its device.

    A plain tensor that takes no part in autograd (no ``requires_grad``, and
    no forward-mode dual level open, so no tangent) is cloned without the
    ``detach`` first: the clone is the same tensor, about 0.4 µs sooner.
    """
    if type(t) is _Tensor and not t.requires_grad and _forward_ad._current_level < 0:
        return t.clone()
    return t.detach().clone()


# ---------------------------------------------------------------------------
# Handing a temporary over uncopied
#
# A send copies its value so that the sender may change or reuse it after the
# call. A value that nothing but the send holds any more (a temporary, as in
# ``self.out.send(torch.tanh(x))``) cannot be changed by anyone: it is handed
# to the readers as it is, as numpy reuses a temporary array in place of a new
# one. Whether a tensor is such a temporary is read from what holds it: the
# send reads the Python references to the object (against `sends`'s
# calibrated count for a temporary argument); `sole_tensor` reads everything
# else. Any doubt keeps the copy.

_refs = sys.getrefcount
_weak_refs = weakref.getweakrefcount
_inference = torch.is_inference_mode_enabled
# Private torch functions, read once: without them no tensor is handed over.
_storage_uses: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)


def _storage_refs(t: torch.Tensor) -> tuple[int, int]:
    """The references to ``t``'s storage object and the storage's uses, as `sole_tensor` reads them.

    The same statements as there: the calibration's probe.
    """
    st = t.untyped_storage()
    return _refs(st), _storage_uses(st._cdata)  # type: ignore[misc]


def _calibrate_storage() -> tuple[int, int]:
    """The storage readings of a tensor that alone holds its storage; (-1, -1): unusable.

    Checks that a storage object kept elsewhere and a second tensor on the
    storage both read higher, else nothing is ever handed over.
    """
    if _storage_uses is None or not hasattr(_Tensor, "_use_count"):
        return -1, -1
    try:
        t = torch.empty(1)
        alone = _storage_refs(t)
        kept = t.untyped_storage()
        with_object = _storage_refs(t)
        del kept
        other = t.detach()
        with_tensor = _storage_refs(t)
        del other
    except Exception:  # a torch without these internals: copy everything
        return -1, -1
    if with_object[0] <= alone[0] or with_tensor[1] <= alone[1] or _storage_refs(t) != alone:
        return -1, -1
    return alone


_STORAGE_REFS, _STORAGE_USES = _calibrate_storage()


def sole_tensor(t: torch.Tensor) -> bool:
    """Whether the readers may have ``t`` itself, the send's own copy needless.

    The caller has made sure that ``t`` is a plain ``torch.Tensor`` (no
    subclass) and that no Python reference to it is left but its own (see
    `sends`). This function checks everything else that could still reach the
    data or make ``t`` differ from the clone a send makes: no weak reference
    to it; no holder in C++ (``_use_count``: a view of it keeps it, so does a
    DLPack capsule or an autograd graph); no autograd (``requires_grad``,
    which a ``grad_fn`` implies, and no forward-mode tangent: no dual level
    open); as inference-mode-made as a clone made now would be; on the CPU
    (other devices keep their copy path); and a storage that only ``t`` uses
    (no view, no ``detach()`` twin, no storage object kept elsewhere), no
    Python attributes set on it (they could hold the sender's mutable objects,
    and a clone has none), that
    torch's allocator owns (resizable: not numpy's memory from
    ``torch.from_numpy``, not a buffer's from ``torch.frombuffer``, not a
    DLPack producer's, not a mapped file) and that no other process shares.
    A tensor without a storage (sparse, a vmap or functorch wrapper) is copied.

    Args:
        t (torch.Tensor): a tensor only the caller holds.

    Returns:
        bool: True when ``t`` can be handed over as it is.
    """
    if (_weak_refs(t) or t._use_count() != 1  # type: ignore[attr-defined]  # torch's, untyped
            or t.__dict__  # attributes set on it could be the sender's objects: the clone has none
            or t.requires_grad or not t.is_cpu
            or _forward_ad._current_level >= 0 or t.is_inference() is not _inference()):
        return False
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # no storage of its own
        return False
    return (_refs(st) == _STORAGE_REFS
            and _storage_uses(st._cdata) == _STORAGE_USES  # type: ignore[misc]
            and st.resizable() and not st.is_shared())


def _take(t: torch.Tensor, once: int) -> torch.Tensor:
    """A plain tensor of a flat container only the send holds: itself if nothing else holds it.

    ``once`` is the count of Python references that `_take_flat`'s rebuilding
    reads for a tensor the container alone holds (`_calibrate_flat`).
    """
    if _refs(t) == once and sole_tensor(t):
        return t
    return clone_tensor(t)


def _flat(values: Iterable[Any]) -> bool:
    """Whether every value is a leaf or a plain tensor (a flat container's values)."""
    for v in values:
        if type(v) not in _FLAT:
            return False
    return True


def _take_flat(value: Any, vt: type, once: int) -> Any:
    """A flat list, tuple or dict (``vt``) that only the send holds, rebuilt for the readers.

    Each plain tensor in it that nothing but the container holds is handed
    over (`_take`), the others cloned; the container itself is rebuilt, as
    `copy_message` rebuilds it.
    """
    if vt is dict:
        return {k: _take(v, once) if type(v) is _Tensor else v for k, v in value.items()}
    out = [_take(v, once) if type(v) is _Tensor else v for v in value]
    return out if vt is list else tuple(out)


def _calibrate_flat(vt: type) -> int:
    """The references `_take` reads for a tensor that only a flat ``vt`` holds; 0: unknown.

    Found by running `_take_flat` itself on fresh tensors with each candidate
    count until all of them are handed over; the count is kept only if a
    tensor also held elsewhere is then still cloned, at every position.
    """
    def fresh(n: int, keep: torch.Tensor | None = None) -> Any:
        items = [torch.empty(1) for _ in range(n)]
        if keep is not None:
            items[1] = keep
        return dict(zip("abc", items, strict=False)) if vt is dict else vt(items)

    def taken(message: Any, once: int) -> list[bool]:
        values = list(message.values()) if vt is dict else list(message)
        ptrs = [t.data_ptr() for t in values]
        del values
        out = _take_flat(message, vt, once)
        rebuilt = out.values() if vt is dict else out
        return [t.data_ptr() == ptr for t, ptr in zip(rebuilt, ptrs, strict=True)]

    if _STORAGE_REFS < 0:
        return 0
    try:
        for once in range(1, 10):
            if taken(fresh(3), once) == [True, True, True]:
                keep = torch.empty(1)
                if taken(fresh(3, keep), once) == [True, False, True]:
                    return once
                return 0
    except Exception:  # the probe itself failed: copy every container
        return 0
    return 0


_ONCE_IN_LIST = _calibrate_flat(list)
_ONCE_IN_TUPLE = _calibrate_flat(tuple)
_ONCE_IN_DICT = _calibrate_flat(dict)


def take_message(value: Any) -> Any:
    """The message for the readers of a value that nothing but the send holds any more.

    The send has counted the Python references to ``value``: none is left but
    its own. A plain tensor is handed over as it is when `sole_tensor` says
    so, else cloned. A flat list, tuple or dict (its values leaves and plain
    tensors) is rebuilt, as `copy_message` rebuilds it, with each tensor only
    the container holds handed over (the same rule), the others cloned. Any
    other value is copied by `copy_message`: the containers of a nested
    message may be held elsewhere, which only their own counts could tell.

    Args:
        value: the sent value, held by nothing but the send.

    Returns:
        The message; shares no mutable memory with anything the sender holds.

    Raises:
        ValueError: as `copy_message`.
    """
    vt = type(value)
    if vt is _Tensor:
        return value if sole_tensor(value) else clone_tensor(value)
    if vt is list:
        once = _ONCE_IN_LIST
    elif vt is tuple:
        once = _ONCE_IN_TUPLE
    elif vt is dict:
        once = _ONCE_IN_DICT
    else:
        return copy_message(value)
    if once and _flat(value.values() if vt is dict else value) and not (
            vt is dict and _tensor_key(value)):
        return _take_flat(value, vt, once)
    return copy_message(value)


def _message_key(key: Any) -> str | None:
    """Why a dict key cannot be in a message (None: it can).

    A tensor hashes by identity, so the copy that value semantics makes
    would be another key, and a shared one could change under the reader.
    """
    if isinstance(key, _Tensor):
        return (f"key is a {type(key).__name__}; a message's dict keys cannot be tensors "
                "(a tensor hashes by identity: use an int, a str or a tuple of numbers)")
    return None


def _tensor_key(keys: Iterable[Any]) -> bool:
    """Whether any of ``keys`` is a tensor (such a dict goes through `walk`, which refuses it)."""
    for k in keys:
        if isinstance(k, _Tensor):
            return True
    return False


_COPY = Rules(SCALARS, False, lambda value, path: copy.deepcopy(value), _message_key)
_MAP = Rules(SCALARS, False, lambda value, path: value)


def copy_message(value: Any,
                 tensor_copy: Callable[[torch.Tensor], torch.Tensor] = clone_tensor,
                 where: str = "message") -> Any:
    """Copy a message for value semantics: tensors are cloned, containers rebuilt.

    Immutable scalars (`SCALARS`) are shared. Tensors are detached and cloned
    (a message carries data, not an autograd graph), also inside lists,
    tuples, dicts (dict subclasses such as OrderedDict too, keeping their type
    and default), NamedTuples and dataclasses. Other objects are deep-copied.
    Dict keys are kept as they are (they are hashable, so they should be
    immutable); a tensor key is refused, since a tensor hashes by identity.

    Args:
        value: any message.
        tensor_copy (Callable[[torch.Tensor], torch.Tensor]): how each tensor
            is copied (default: detach and clone on its device); the device
            routing passes one that also moves it.
        where (str): what the message is, for errors, e.g. ``"port 'a.out'"``.
            Default: ``"message"``.

    Returns:
        A copy that shares no mutable memory with ``value``.

    Raises:
        ValueError: containers nest deeper than `MAX_NESTING` levels; names
            ``where``, the key path and the limit.
        TypeError: a dict key is a tensor; names ``where`` and the key path.
    """
    # Fast paths, for what most sends carry: a tensor, a flat tuple, list or dict.
    vt = type(value)
    if vt in SCALARS:
        return value
    if vt is _Tensor:
        return tensor_copy(value)
    if vt is tuple or vt is list:
        for v in value:
            if type(v) not in _FLAT:
                break
        else:
            out = [tensor_copy(v) if type(v) is _Tensor else v for v in value]
            return out if vt is list else tuple(out)
    elif vt is dict:
        for v in value.values():
            if type(v) not in _FLAT:
                break
        else:
            if not _tensor_key(value):
                return {k: tensor_copy(v) if type(v) is _Tensor else v for k, v in value.items()}
    return walk(value, tensor_copy, _COPY, where)


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor in a message, rebuilding its containers.

    Lists, tuples, NamedTuples, dicts (dict subclasses too, with their type
    and default) and dataclasses are rebuilt as `copy_message` rebuilds them:
    a dataclass is a shallow copy with every field replaced, ``init=False``
    ones included, without calling ``__init__`` or ``__post_init__`` again
    (those could drop or change fields). Other values are returned as they are.

    Args:
        value: any message.
        fn (Callable[[torch.Tensor], torch.Tensor]): what each tensor becomes.

    Returns:
        The message with every tensor replaced by ``fn(tensor)``.

    Raises:
        ValueError: containers nest deeper than `MAX_NESTING` levels.
    """
    if isinstance(value, _Tensor):
        return fn(value)
    return walk(value, fn, _MAP, "message")


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Every tensor in a message, in order.

    Args:
        value: any message.

    Returns:
        list[torch.Tensor]: the tensors `map_tensors` would map, in the order
        it meets them.

    Raises:
        ValueError: containers nest deeper than `MAX_NESTING` levels.
    """
    found: list[torch.Tensor] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        found.append(t)
        return t

    map_tensors(value, keep)
    return found
