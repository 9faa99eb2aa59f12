"""Snapshot files: the state tree on disk, written atomically, read without running code.

A *tree* is nested ``dict`` (keys ``str`` or ``int``), ``list``, ``tuple``,
``None``, ``bool``, ``int`` (within int64/uint64), ``float``, ``str``,
``bytes`` and ``torch.Tensor`` (strided, any device: saved from a CPU copy,
loaded on the CPU). Subclasses are stored as their base type (an
``OrderedDict`` loads as a ``dict``, a ``bytearray`` as ``bytes``, a NamedTuple
as a ``tuple``) and a dataclass instance as a ``dict`` of its fields;
`from_file` puts a message back into the NamedTuple or dataclass its Input
declares.

File format, version 1 (all integers little-endian)::

    offset      size  field
    0           8     magic b"MUJOUSNP"
    8           4     format version, uint32 (1)
    12          8     S: structure length in bytes, uint64
    20          8     D: tensor data length in bytes, uint64
    28          4     CRC-32 of bytes 0..28 (so a damaged header is not taken for truncation)
    32          S     structure: one msgpack object (the tree)
    32+S        D     tensor data: each tensor's raw bytes (C order, native little-endian),
                      back to back, in the order the tensors appear in the structure
    32+S+D      4     CRC-32 of bytes 0..32+S+D, uint32

In the structure, a tuple is msgpack extension type 2 whose payload is the
msgpack array of its items; a tensor is extension type 1 whose payload is the
msgpack array ``[dtype name, shape, offset, nbytes]``: the dtype as torch names
it without ``torch.`` (``"float32"``, ``"bfloat16"``), the shape as a list of
ints, the offset of its bytes from the start of the tensor data and their
length. Any other extension type, or an unknown dtype name, cannot be decoded.

Limits, which ``save`` and ``load`` apply alike (``save`` refuses what ``load``
would refuse): containers (dicts, lists, tuples) nest at most `MAX_DEPTH` (100)
levels; dict keys are str or int, each once per dict; a tuple's payload is
exactly one array; and the decoded objects may take at most `MEMORY_PER_BYTE`
(32) bytes of memory per byte of structure plus `MEMORY_SLACK` (16 MiB), as
charged by a fixed model of CPython's object sizes. The structure is parsed
without recursion, so no file, however nested, can overflow the stack.

Tensor bytes never go through the msgpack buffer. ``save`` streams each tensor
from its own memory (a tensor that is not contiguous, or not on the CPU, is
copied first, one tensor at a time) and ``load`` reads each one straight into a
tensor made with ``torch.empty``: neither holds a second copy of the data. For
more than a few MiB of tensors the disk I/O runs on a helper thread, one 4 MiB
chunk ahead of the checksum. The checksum is CRC-32 (zlib, about 4 GB/s on one
core) rather than BLAKE2b (under 1 GB/s, slower than many disks): it guards
against accidents (torn writes, bit rot), not against tampering.

Each occurrence of a tensor is stored on its own: two entries holding the same
tensor, or a view and its base, load as independent tensors.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import secrets
import struct
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, TYPE_CHECKING, Any, Protocol, TypeGuard

import msgpack
import torch

from ._checks import is_int
from .errors import SnapshotError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# The functions users import (docs/reference.md) and the limits docs/state.md names; the
# package's own helpers (dumps, loads, inspect_file, ...) stay importable.
__all__ = ["save", "load", "MAX_DEPTH", "MEMORY_PER_BYTE", "MEMORY_SLACK"]

MAGIC = b"MUJOUSNP"
VERSION = 1

_HEAD = struct.Struct("<8sIQQ")  # magic, version, S, D
_CRC = struct.Struct("<I")
_HEADER_LEN = _HEAD.size + _CRC.size  # 32
_MIN_LEN = _HEADER_LEN + _CRC.size  # header and trailer
_EXT_TENSOR = 1
_EXT_TUPLE = 2
_CHUNK = 4 << 20  # read/write and CRC in pieces that stay in the CPU cache

# -- limits (what save refuses and load refuses alike) ---------------------------------

MAX_DEPTH = 100
"""How deep containers (dicts, lists, tuples) may nest in a file; the root container is level 1."""

MEMORY_PER_BYTE = 32
"""Decoded objects may take this many bytes of memory per byte of structure (see `MEMORY_SLACK`)."""

MEMORY_SLACK = 16 << 20
"""Bytes of decoded objects allowed on top of ``MEMORY_PER_BYTE`` per byte of structure."""

# The memory a decoded object is charged, in bytes: a deterministic model of CPython's sizes
# (64-bit), computed the same way when saving (from the objects) and when loading (from the
# bytes), so that save refuses exactly what load would. Shared objects (None, bools, small ints,
# strs and bytes of at most one byte) cost nothing beyond the slot of the container holding them.
_COST_LIST, _COST_TUPLE, _COST_DICT = 56, 40, 64  # plus per item:
_COST_SLOT, _COST_ENTRY = 8, 40  # a list/tuple item, a dict entry
_COST_STR, _COST_BYTES = 56, 40  # plus one per (UTF-8) byte
_COST_INT, _COST_FLOAT, _COST_TENSOR = 32, 24, 512


def _memory_budget(structure_len: int) -> int:
    # Bytes of decoded objects that a structure of ``structure_len`` bytes may make.
    return MEMORY_PER_BYTE * structure_len + MEMORY_SLACK


def _int_cost(value: int) -> int:
    return 0 if -5 <= value <= 256 else _COST_INT


def _text_cost(n: int, base: int) -> int:
    return 0 if n <= 1 else base + n


_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in (
        "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
        "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
        "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
        "float8_e8m0fnu", "float4_e2m1fn_x2",
    )
    if isinstance(getattr(torch, name, None), torch.dtype)  # older torch lacks some
}
# The name a file gives each dtype it holds: what `str(dtype)` says, without "torch." (a dict
# lookup, where formatting the name costs about as much as the rest of a small tensor's entry).
_DTYPE_NAMES: dict[torch.dtype, str] = {
    dtype: str(dtype).removeprefix("torch.") for dtype in _DTYPES.values()
    if str(dtype).removeprefix("torch.") in _DTYPES
}


def save(tree: Any, path: str | os.PathLike[str]) -> None:
    """Write a tree to a snapshot file, atomically.

    The file is written under a temporary name (``.<name>.<random>.tmp``) in the
    same folder, flushed to disk, then renamed onto ``path``: a crash leaves
    either the previous file or the new one, never a mix. Tensor bytes are
    streamed from the tensors' memory; a tensor that is not contiguous or not on
    the CPU is copied, one at a time.

    Args:
        tree (Any): the tree to store (see the module docstring for what it may hold).
        path (str | os.PathLike): the file to write; its folder must exist.

    Raises:
        TypeError: a value, key or tensor cannot be stored; the message names its
            key path (``nodes['ctrl']['model']: unsupported type Foo``). Nothing
            is written and an existing file is left as it was.
        ValueError: the tree is beyond what `load` accepts: containers nested
            deeper than `MAX_DEPTH`, or more decoded memory than `MEMORY_PER_BYTE`
            bytes per byte of structure plus `MEMORY_SLACK`. Nothing is written.
        OSError: the file cannot be written (the message names ``path``, also
            for a full disk); an existing file is left as it was.
    """
    structure, tensors = _encode(tree)  # every TypeError is raised before the disk is touched
    target = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(target))
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
    try:
        try:
            with open(tmp, "xb") as f:
                _write(f, structure, tensors)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        _fsync_folder(folder)
    except OSError as e:
        # A write() or fsync() that fails (a full disk) names no file: say which one.
        raise _naming(e, target) from e


def _naming(exc: OSError, target: str) -> OSError:
    """The same error (its errno picks the same OSError subclass), naming the snapshot file."""
    what = exc.strerror or _reason(exc)
    if exc.errno is None:
        return OSError(f"cannot write the snapshot file {target}: {what}")
    return OSError(exc.errno, f"{what} (writing the snapshot file)", target)


def load(path: str | os.PathLike[str]) -> Any:
    """Read a tree from a snapshot file, checking it as it goes.

    Decoding never runs code from the file (no pickle). Tensors come back on the
    CPU, contiguous, writable and sharing memory with nothing.

    Args:
        path (str | os.PathLike): the file written by `save`.

    Returns:
        Any: the tree, with tuples, lists, int keys, dtypes and shapes as saved.

    Raises:
        FileNotFoundError: there is no such file.
        SnapshotError: the file is not a mujou snapshot, was written by a newer
            format version, is truncated or is corrupted (checksum mismatch, or a
            structure that does not decode or is beyond the limits of the module
            docstring); the message names the file and which.
    """
    with open(path, "rb") as f:
        return _read(f, os.fspath(path))


def dumps(tree: Any) -> bytes:
    """Encode a tree to bytes, in the same format as a snapshot file.

    Args:
        tree (Any): the tree to encode.

    Returns:
        bytes: the encoded tree, readable by `loads` (or by `load` once in a file).

    Raises:
        TypeError: a value cannot be stored; the message names its key path.
        ValueError: the tree is beyond the limits `load` applies (as for `save`).
    """
    structure, tensors = _encode(tree)
    f = io.BytesIO()
    _write(f, structure, tensors)
    return f.getvalue()


def loads(data: bytes) -> Any:
    """Decode a tree from bytes made by `dumps` (or read from a snapshot file).

    Args:
        data (bytes): the encoded tree.

    Returns:
        Any: the tree; its tensors own their memory (none is a view of ``data``).

    Raises:
        SnapshotError: as for `load`, with ``<bytes>`` in place of the file name.
    """
    return _read(io.BytesIO(data), "<bytes>")


def inspect_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Describe a snapshot file without keeping its tensor data in memory.

    The whole file is checked first, as `load` checks it: its tensor data is
    read through the checksum in chunks of a few MiB and dropped, so a damaged
    file is refused before anything is decoded and nothing in the result comes
    from unchecked bytes.

    Args:
        path (str | os.PathLike): the snapshot file.

    Returns:
        dict: ``version`` (int), ``size`` (file size, bytes), ``structure_bytes``
        (int), ``tensors`` (how many), ``tensor_bytes`` (their total size, bytes)
        and ``tree``: the tree with every tensor on the ``meta`` device (dtype and
        shape, no data).

    Raises:
        FileNotFoundError: there is no such file.
        SnapshotError: as for `load` (not a snapshot, a newer format version,
            truncated, or corrupted anywhere: header, structure, tensor data or
            checksum); the message names the file.
    """
    name = os.fspath(path)
    with open(path, "rb") as f:
        size, structure_len, data_len, crc = _read_header(f, name)
        structure = f.read(structure_len)
        _check_rest(f, zlib.crc32(structure, crc), data_len, name)
        decoder = _Decoder(data_len, device="meta")
        tree = _decode(decoder, structure, name)
    return {"version": VERSION, "size": size, "structure_bytes": structure_len,
            "tensors": len(decoder.tensors), "tensor_bytes": data_len, "tree": tree}


# -- writing ------------------------------------------------------------------------------


def _encode(tree: Any) -> tuple[bytes, list[tuple[torch.Tensor, int]]]:
    """Packs the structure; returns it and the tensors with their byte sizes, in file order.

    Refuses what `load` would refuse: nesting deeper than `MAX_DEPTH` and a structure whose
    decoded objects would exceed `_memory_budget` (charged as the decoder charges them).
    """
    tensors: list[tuple[torch.Tensor, int]] = []
    packable, _, cost = _convert(tree, tensors, 0, "")
    structure = msgpack.packb(packable)
    if cost > _memory_budget(len(structure)):
        raise ValueError(f"the tree's {len(structure)} bytes of structure would take more than "
                         f"{_memory_budget(len(structure))} bytes of memory to load (the most "
                         f"is {MEMORY_PER_BYTE} bytes per byte plus {MEMORY_SLACK >> 20} MiB: "
                         "store many small values as a tensor)")
    return structure, tensors


def _convert(tree: Any, tensors: list[tuple[torch.Tensor, int]], offset: int,
             root: str) -> tuple[Any, int, int]:
    """A tree made ready for ``msgpack.packb``: tuples and tensors as the format's extensions.

    The tree's tensors are appended to ``tensors`` with their byte sizes, their bytes placed
    from ``offset`` on in the tensor data. ``root`` is the tree's key path in errors (``""``:
    ``<root>``). Returns the packable tree, the offset after its tensors and the memory its
    decoding is charged (`_memory_budget`'s model). Raises what `save` raises for the tree.
    """
    cost = 0

    def convert(obj: Any, path: str, depth: int) -> Any:
        nonlocal offset, cost
        if obj is None or isinstance(obj, bool):
            return obj
        if isinstance(obj, float):
            cost += _COST_FLOAT
            return obj
        if isinstance(obj, int):
            cost += _int_cost(obj)
            return _checked_int(obj, path)
        if isinstance(obj, str):
            cost += _text_cost(_utf8_len(obj, path), _COST_STR)
            return obj
        if isinstance(obj, (bytes, bytearray)):
            cost += _text_cost(len(obj), _COST_BYTES)
            return bytes(obj)
        if isinstance(obj, (dict, list, tuple)) and depth >= MAX_DEPTH:
            raise ValueError(f"{path or '<root>'}: containers nested deeper than {MAX_DEPTH} "
                             "levels, the most a snapshot file holds")
        if isinstance(obj, dict):
            cost += _COST_DICT + _COST_ENTRY * len(obj)
            for key in obj:
                if not (isinstance(key, str) or is_int(key)):
                    raise TypeError(f"{_child(path, key)}: unsupported key type "
                                    f"{type(key).__name__} (keys must be str or int)")
                if isinstance(key, int):
                    _checked_int(key, _child(path, key))
                    cost += _int_cost(key)
                else:
                    cost += _text_cost(_utf8_len(key, _child(path, key)), _COST_STR)
            return {key: convert(value, _child(path, key), depth + 1)
                    for key, value in obj.items()}
        if isinstance(obj, list):
            cost += _COST_LIST + _COST_SLOT * len(obj)
            return [convert(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(obj)]
        if isinstance(obj, tuple):
            cost += _COST_TUPLE + _COST_SLOT * len(obj)
            items = [convert(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(obj)]
            return msgpack.ExtType(_EXT_TUPLE, msgpack.packb(items))
        if isinstance(obj, torch.Tensor):
            ext, nbytes = _tensor_ext(obj, path, offset)
            cost += _COST_TENSOR
            tensors.append((obj, nbytes))
            offset += nbytes
            return ext
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            # A message type the ports allow: stored as a dict of its fields (a restore
            # puts it back into the dataclass its Input declares; see `from_file`).
            return convert({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)},
                           path, depth)
        raise TypeError(f"{path or '<root>'}: unsupported type {type(obj).__name__}")

    try:
        packable = convert(tree, root, 0)
    finally:
        # convert refers to itself through its closure: a reference cycle that, left alone,
        # holds `tensors` (the tree's tensors) until the cyclic garbage collector runs, which
        # few allocations may mean never; each supervisor snapshot would stay in memory.
        # Rebound rather than deleted: ruff takes a `del` of the closure's own name for an
        # undefined name inside it (F821).
        convert = None  # type: ignore[assignment]
    return packable, offset, cost


def _tensor_ext(obj: torch.Tensor, path: str, offset: int) -> tuple[msgpack.ExtType, int]:
    """A tensor's extension (its bytes placed at ``offset`` in the tensor data) and its size.

    Raises TypeError, naming ``path``, for a tensor a file cannot hold: a dtype the format
    does not name, a layout other than strided, no data (meta), too many dimensions.
    """
    name = _DTYPE_NAMES.get(obj.dtype)
    if name is None:
        raise TypeError(f"{path or '<root>'}: unsupported tensor dtype "
                        f"{str(obj.dtype).removeprefix('torch.')}")
    if obj.layout != torch.strided or obj.is_meta:
        raise TypeError(f"{path or '<root>'}: unsupported {obj.layout} tensor "
                        f"on {obj.device} (only strided tensors with data)")
    nbytes = obj.numel() * obj.element_size()
    meta = msgpack.packb([name, list(obj.shape), offset, nbytes])
    if len(meta) > _MAX_TENSOR_META:
        raise TypeError(f"{path or '<root>'}: a tensor of {obj.dim()} dimensions "
                        "has too many for a snapshot file")
    return msgpack.ExtType(_EXT_TENSOR, meta), nbytes


def _utf8_len(text: str, path: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as e:  # a lone surrogate: no UTF-8 form, so load could not read it
        raise TypeError(f"{path or '<root>'}: a str that is not valid Unicode ({e.reason} at "
                        f"index {e.start})") from None


def _child(path: str, key: object) -> str:
    # Paths read like Python with the top-level str key bare: nodes['ctrl']['model'].
    return key if not path and isinstance(key, str) else f"{path}[{key!r}]"


def _checked_int(value: int, path: str) -> int:
    if not -(2**63) <= value < 2**64:  # what msgpack can hold
        raise TypeError(f"{path or '<root>'}: int {value} is outside the int64/uint64 range")
    return value


def _write(f: IO[bytes], structure: bytes, tensors: list[tuple[torch.Tensor, int]]) -> None:
    data_len = sum(n for _, n in tensors)
    head = _HEAD.pack(MAGIC, VERSION, len(structure), data_len)
    head += _CRC.pack(zlib.crc32(head))
    f.write(head)
    f.write(structure)
    crc = _stream(f.write, _tensor_chunks(tensors), zlib.crc32(structure, zlib.crc32(head)),
                  data_len)
    f.write(_CRC.pack(crc))


def _tensor_chunks(tensors: list[tuple[torch.Tensor, int]]) -> Iterator[memoryview]:
    for tensor, nbytes in tensors:
        data = _raw_bytes(tensor)  # made only when reached: few tensor copies alive at a time
        if data.nbytes != nbytes:
            raise RuntimeError("a tensor was resized while it was being saved")
        yield from _split(data)


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes in C order: a view of its memory when it is a plain CPU tensor."""
    return _memory(tensor.detach().cpu().resolve_conj().resolve_neg().contiguous())


def _memory(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, as a writable view of its memory."""
    # A contiguous tensor's elements lie back to back from its storage offset, but its strides
    # may still be odd where they do not matter (empty or size-1 dims); restate them as 1.
    flat = t.as_strided((t.numel(),), (1,))
    return flat.view(torch.uint8).numpy().data


def _fsync_folder(folder: str) -> None:
    # Makes the rename itself durable. Windows cannot open a folder; its rename is durable enough.
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- messages: what comes back from a file as it was ------------------------------------

_EXACT = (type(None), bool, int, float, str, bytes, torch.Tensor, list, dict, tuple)
_DTYPE_SET = frozenset(_DTYPES.values())


class _NamedTupleClass(Protocol):
    """A NamedTuple class, as far as this module uses one: its name, fields and `_make`."""

    __name__: str
    _fields: tuple[str, ...]

    def _make(self, iterable: Iterable[Any], /) -> tuple[Any, ...]:
        """A new instance from the field values, in order."""
        ...


def _is_named_tuple(cls: type) -> TypeGuard[_NamedTupleClass]:
    """Whether ``cls`` is a NamedTuple class (a tuple subclass with ``_fields``)."""
    return issubclass(cls, tuple) and hasattr(cls, "_fields")


def _is_dataclass_type(cls: type) -> TypeGuard[type[DataclassInstance]]:
    """Whether ``cls`` is a dataclass (the class, not an instance)."""
    return isinstance(cls, type) and dataclasses.is_dataclass(cls)


def file_problem(message: Any, declared: type) -> str | None:
    """Why a message would not come back from a file as itself; None when it would.

    A file holds plain types only (see the module docstring): a subclass comes
    back as its base type, a NamedTuple as a tuple, a dataclass as a dict of its
    fields. A restore puts a message back into the NamedTuple or dataclass its
    Input declares (`from_file`), so such a message round-trips when it is of
    exactly that type and its fields hold plain values.

    Args:
        message (Any): a message kept by, or pending for, an Input.
        declared (type): the Input's declared message type.

    Returns:
        str | None: the first thing that would not come back as it is, in words
        (``"its field 'goal' is a Pose (a NamedTuple), which comes back as a
        tuple"``), or None.
    """
    top = type(message)
    if top is not declared:
        return _plain_problem(message, "it")
    if _is_named_tuple(top):
        fields = list(zip(top._fields, message, strict=True))
    elif _is_dataclass_type(top):
        names = [f.name for f in dataclasses.fields(message)]
        extra = sorted(set(getattr(message, "__dict__", {})) - set(names))
        if extra:
            return (f"it has attributes that are not fields of {top.__name__} "
                    f"({', '.join(extra)}), which a file leaves out")
        fields = [(name, getattr(message, name)) for name in names]
    else:
        return _plain_problem(message, "it")
    for name, value in fields:
        problem = _plain_problem(value, f"its field {name!r}")
        if problem:
            return problem
    return None


def _plain_problem(value: Any, what: str) -> str | None:
    """The first value inside ``value`` that a file does not bring back as it is; None if none.

    Checks what `_encode` checks (cheaply: this runs on every message at every supervisor
    snapshot) and also that every type is exactly a plain one.
    """
    stack = [(value, what, 0)]
    while stack:
        value, what, depth = stack.pop()
        vt = type(value)
        if vt is torch.Tensor:
            if value.dtype not in _DTYPE_SET or value.layout != torch.strided or value.is_meta:
                return f"{what} is a {value.layout} {value.dtype} tensor, which a file cannot hold"
            continue
        if vt is int or vt is str:
            problem = _scalar_problem(value, what)
            if problem:
                return problem
            continue
        if vt not in _EXACT:
            if _is_named_tuple(vt):
                kind, back = "a NamedTuple", "a tuple"
            elif _is_dataclass_type(vt):
                kind, back = "a dataclass", "a dict"
            else:
                base = next((b for b in _EXACT if isinstance(value, b)), None)
                if base is None:
                    return f"{what} is {_a(vt.__name__)}, which a file cannot hold"
                kind, back = f"a subclass of {base.__name__}", f"a {base.__name__}"
            return f"{what} is {_a(vt.__name__)} ({kind}), which a file brings back as {back}"
        if depth >= MAX_DEPTH:
            return f"{what} is nested deeper than {MAX_DEPTH} levels"
        if vt is dict:
            for key, item in value.items():
                if type(key) not in (str, int):
                    return (f"{what} has a key of type {type(key).__name__} (a file holds str "
                            "and int keys)")
                problem = _scalar_problem(key, f"{what} has a key that")
                if problem:
                    return problem
                stack.append((item, f"{what}[{key!r}]", depth + 1))
        elif vt is list or vt is tuple:
            stack.extend((item, f"{what}[{i}]", depth + 1) for i, item in enumerate(value))
    return None


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _scalar_problem(value: int | str, what: str) -> str | None:
    """Why an int or a str (exactly one: the callers check the type) would not fit a file."""
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return f"{what} is a str that is not valid Unicode (a lone surrogate)"
    elif not -(2**63) <= value < 2**64:
        return f"{what} is the int {value}, outside the int64/uint64 range of a file"
    return None


def from_file(message: Any, declared: type) -> Any:
    """A message read from a file, put back into the NamedTuple or dataclass its Input declares.

    A tuple of the right length becomes the declared NamedTuple; a dict whose
    keys are exactly the fields of the declared dataclass becomes an instance of
    it (made without calling its ``__init__``, as a copy would be). Any other
    message is returned as it is, for the Input's type check to judge.

    Args:
        message (Any): a message of a loaded tree's ``inputs`` or ``pending``.
        declared (type): the Input's declared message type.

    Returns:
        Any: the message as the Input holds it.
    """
    if type(message) is tuple and _is_named_tuple(declared) and \
            len(message) == len(declared._fields):
        return declared._make(message)
    if type(message) is dict and _is_dataclass_type(declared):
        names = [f.name for f in dataclasses.fields(declared)]
        if set(message) == set(names):
            obj = declared.__new__(declared)
            for name in names:
                object.__setattr__(obj, name, message[name])  # frozen dataclasses too
            return obj
    return message


# -- streaming tensor bytes -----------------------------------------------------------------


def _split(data: memoryview) -> Iterator[memoryview]:
    return (data[i : i + _CHUNK] for i in range(0, len(data), _CHUNK))


def _stream(io: Callable[[memoryview], int | None], chunks: Iterable[memoryview], crc: int,
            total: int) -> int:
    """Runs ``io`` (a write or a readinto) on each chunk; returns the CRC carried through them.

    For big data ``io`` runs on a helper thread one chunk ahead of the CRC computed here, so the
    checksum costs little beyond the disk time (both release the GIL). Raises EOFError when
    ``io`` moves fewer bytes than the chunk holds.
    """
    if total <= 2 * _CHUNK:  # small (messages): a thread would cost more than it saves
        for chunk in chunks:
            crc = _crc_after(io(chunk), chunk, crc)
        return crc
    pending: deque[tuple[Future[int | None], memoryview]] = deque()
    with ThreadPoolExecutor(1, thread_name_prefix="mujou-snapshot-io") as pool:
        for chunk in chunks:
            pending.append((pool.submit(io, chunk), chunk))
            if len(pending) == 2:
                job, done = pending.popleft()
                crc = _crc_after(job.result(), done, crc)
        for job, done in pending:
            crc = _crc_after(job.result(), done, crc)
    return crc


def _crc_after(moved: int | None, chunk: memoryview, crc: int) -> int:
    if moved != len(chunk):
        raise EOFError
    return zlib.crc32(chunk, crc)


# -- reading ------------------------------------------------------------------------------


def _read(f: io.BufferedReader | io.BytesIO, name: str) -> Any:
    """The tree of the open snapshot file ``f`` (``name`` for the messages): see `load`."""
    _, structure_len, data_len, crc = _read_header(f, name)
    structure = f.read(structure_len)
    crc = zlib.crc32(structure, crc)
    decoder = _Decoder(data_len, device="cpu")
    tree = _decode(decoder, structure, name, lambda: _rest_matches(f, crc, data_len))
    # Read straight into each tensor's memory: no extra copy.
    chunks = (chunk for tensor in decoder.tensors for chunk in _split(_memory(tensor)))
    try:
        crc = _stream(f.readinto, chunks, crc, data_len)
        trailer = f.read(_CRC.size)
        if len(trailer) != _CRC.size:
            raise EOFError
    except EOFError:
        raise SnapshotError(f"{name}: truncated (the file shrank while it was read)") from None
    if _CRC.unpack(trailer)[0] != crc:
        raise SnapshotError(f"{name}: corrupted (checksum mismatch)")
    return tree


def _check_rest(f: IO[bytes], crc: int, data_len: int, name: str) -> None:
    """Carries ``crc`` through the tensor data (read and dropped) and checks the trailer."""
    left = data_len
    while left:
        chunk = f.read(min(left, _CHUNK))
        if not chunk:
            raise SnapshotError(f"{name}: truncated (the file shrank while it was read)")
        crc = zlib.crc32(chunk, crc)
        left -= len(chunk)
    trailer = f.read(_CRC.size)
    if len(trailer) != _CRC.size:
        raise SnapshotError(f"{name}: truncated (the file shrank while it was read)")
    if _CRC.unpack(trailer)[0] != crc:
        raise SnapshotError(f"{name}: corrupted (checksum mismatch)")


def _rest_matches(f: IO[bytes], crc: int, data_len: int) -> bool:
    """Whether the tensor data and the trailer, read from the current offset, fit ``crc``."""
    try:
        _check_rest(f, crc, data_len, "")
    except SnapshotError:
        return False
    return True


def _read_header(f: IO[bytes], name: str) -> tuple[int, int, int, int]:
    """Checks the header against the file size; returns (size, S, D, CRC of the header)."""
    size = f.seek(0, io.SEEK_END)
    f.seek(0)
    head = f.read(_HEADER_LEN)
    if head[:8] != MAGIC[: len(head)]:
        raise SnapshotError(f"{name}: not a mujou snapshot (starts with {head[:8]!r})")
    # The version comes before anything else: a newer format may lay out the rest differently.
    version = struct.unpack_from("<I", head, 8)[0] if len(head) >= 12 else 0
    if version > VERSION and len(head) >= _HEADER_LEN and _damaged_version(head):
        raise SnapshotError(f"{name}: corrupted (header checksum mismatch; its version field "
                            f"reads {version}, a damaged {VERSION})")
    if version > VERSION:
        raise SnapshotError(f"{name}: written by a newer format version {version} "
                            f"(this mujou_actors reads up to version {VERSION})")
    if len(head) < _HEADER_LEN:
        raise SnapshotError(f"{name}: truncated: expected at least {_MIN_LEN} bytes, got {size}")
    crc = zlib.crc32(head[: _HEAD.size])
    if _CRC.unpack_from(head, _HEAD.size)[0] != crc:
        raise SnapshotError(f"{name}: corrupted (header checksum mismatch)")
    if version < 1:
        raise SnapshotError(f"{name}: corrupted (format version 0 does not exist)")
    _, _, structure_len, data_len = _HEAD.unpack_from(head)
    expected = _HEADER_LEN + structure_len + data_len + _CRC.size
    if size < expected:
        raise SnapshotError(f"{name}: truncated: expected {expected} bytes, got {size}")
    if size > expected:
        raise SnapshotError(f"{name}: corrupted: {size} bytes where the header says {expected}")
    return size, structure_len, data_len, zlib.crc32(head)


def _damaged_version(head: bytes) -> bool:
    """Whether a header whose version reads newer is a version-1 header with that field damaged.

    Its checksum then fits the header once the version reads `VERSION` again (and not as it
    is): a flipped bit there must not pass for a file from a newer mujou_actors.
    """
    stored = _CRC.unpack_from(head, _HEAD.size)[0]
    if zlib.crc32(head[: _HEAD.size]) == stored:
        return False  # the header is as it was written: a newer format's (or its look-alike)
    repaired = head[:8] + struct.pack("<I", VERSION) + head[12 : _HEAD.size]
    return zlib.crc32(repaired) == stored


def _decode(decoder: _Decoder, structure: bytes, name: str,
            checksum_ok: Callable[[], bool] | None = None) -> Any:
    """Decodes the structure; a failure is reported as a checksum mismatch when it is one.

    ``checksum_ok`` (reading the rest of the file) is asked only when the structure does not
    decode: a damaged file is then reported as damaged, not as the first oddity its damage made.
    """
    try:
        tree = decoder.unpack(structure)
        if decoder.offset != decoder.data_len:
            raise ValueError(f"tensors of {decoder.offset} bytes, not {decoder.data_len}")
    except Exception as e:  # anything the bytes can make the parser or torch raise
        if checksum_ok is not None and not checksum_ok():
            raise SnapshotError(f"{name}: corrupted (checksum mismatch)") from None
        raise SnapshotError(f"{name}: corrupted: cannot decode the structure: "
                            f"{_reason(e)}") from e
    return tree


def _reason(exc: BaseException) -> str:
    """The exception in words, never empty (its ``__str__`` may be empty or raise)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - the type's name is still worth showing
        text = ""
    return text or type(exc).__name__




_LIST, _MAP, _TUPLE = 0, 1, 2
_CPU = torch.device("cpu")
_NO_KEY = object()  # a dict frame waiting for its next key
_MAX_TENSOR_META = 1024  # bytes of a tensor's [dtype, shape, offset, nbytes]: ~100 dims
_SCALARS = {  # format byte -> (struct format, size) of the fixed-size values
    0xca: (">f", 4), 0xcb: (">d", 8),
    0xcc: (">B", 1), 0xcd: (">H", 2), 0xce: (">I", 4), 0xcf: (">Q", 8),
    0xd0: (">b", 1), 0xd1: (">h", 2), 0xd2: (">i", 4), 0xd3: (">q", 8),
}
_LENGTHS = {  # format byte -> (what it starts, struct format of its length, its size)
    0xc4: ("bin", ">B", 1), 0xc5: ("bin", ">H", 2), 0xc6: ("bin", ">I", 4),
    0xd9: ("str", ">B", 1), 0xda: ("str", ">H", 2), 0xdb: ("str", ">I", 4),
    0xdc: ("list", ">H", 2), 0xdd: ("list", ">I", 4),
    0xde: ("dict", ">H", 2), 0xdf: ("dict", ">I", 4),
    0xc7: ("ext", ">B", 1), 0xc8: ("ext", ">H", 2), 0xc9: ("ext", ">I", 4),
}
_FIXEXT = {0xd4: 1, 0xd5: 2, 0xd6: 4, 0xd7: 8, 0xd8: 16}


class _Decoder:
    """Rebuilds the tree from the structure, making (not yet filling) each tensor.

    The structure is parsed here rather than by msgpack's C decoder, which would decode each
    tuple's payload in a nested call (a few hundred nested tuples overflow the C stack) and
    takes any amount of memory a small file asks for. This parser keeps its own stack, so it
    never recurses, and refuses (ValueError, with the offset) nesting deeper than `MAX_DEPTH`,
    more memory than `_memory_budget`, extension types other than tensors and tuples, a tuple
    whose payload is not exactly one array, dict keys that are not str or int, and a key that
    appears twice.
    """

    def __init__(self, data_len: int, device: str, budget: int | None = None) -> None:
        self.data_len = data_len
        self.device = device
        # Parsed once (torch.empty would parse the str per tensor); the CPU's made once.
        self._device = _CPU if device == "cpu" else torch.device(device)
        self.offset = 0
        self.tensors: list[torch.Tensor] = []
        self.budget = budget
        self.cost = 0

    def unpack(self, data: bytes, start: int = 0) -> Any:
        """The tree that ``data[start:]`` holds, all of it (offsets in errors count from 0).

        Without a budget given, the decoded objects may take `_memory_budget` of the
        structure's length (``len(data) - start``).
        """
        if self.budget is None:
            self.budget = _memory_budget(len(data) - start)
        value, pos = self._parse(data, start, len(data), ext=True)
        if pos != len(data):
            raise ValueError(f"{len(data) - pos} bytes after the tree, from offset {pos}")
        return value

    def _parse(self, data: bytes, pos: int, end: int, ext: bool) -> tuple[Any, int]:
        """The value starting at ``pos`` and the offset after it; ``ext``: tensors and tuples."""
        stack: list[list[Any]] = []  # open containers: [kind, items, left, key, offset]
        value: Any  # whatever the bytes hold: a scalar, a tensor, a container
        unpack_from = struct.unpack_from
        budget = self.budget
        assert budget is not None
        while True:
            if pos >= end:
                raise ValueError(f"the structure ends inside a value, at offset {pos}")
            at = pos
            b = data[pos]
            pos += 1
            kind = -1  # the container b opens, if any, with its length n and a tuple's end
            n = stop = 0
            cost = 0
            if b <= 0x7F:
                value = b
            elif b >= 0xE0:
                value = b - 0x100
                cost = _int_cost(value)
            elif b <= 0x8F:
                kind, n = _MAP, b & 0x0F
            elif b <= 0x9F:
                kind, n = _LIST, b & 0x0F
            elif b <= 0xBF:
                value, pos = self._text(data, pos, b & 0x1F, end, "str", at)
                cost = _text_cost(b & 0x1F, _COST_STR)
            elif b == 0xC0:
                value = None
            elif b == 0xC2:
                value = False
            elif b == 0xC3:
                value = True
            elif b in _SCALARS:
                fmt, size = _SCALARS[b]
                if pos + size > end:
                    raise ValueError(f"the structure ends inside a number, at offset {at}")
                value = unpack_from(fmt, data, pos)[0]
                pos += size
                cost = _COST_FLOAT if b <= 0xCB else _int_cost(value)
            elif b in _LENGTHS or b in _FIXEXT:
                if b in _FIXEXT:
                    what, length = "ext", _FIXEXT[b]
                else:
                    what, fmt, size = _LENGTHS[b]
                    if pos + size > end:
                        raise ValueError(f"the structure ends inside a length, at offset {at}")
                    length = unpack_from(fmt, data, pos)[0]
                    pos += size
                if what in ("str", "bin"):
                    value, pos = self._text(data, pos, length, end, what, at)
                    cost = _text_cost(length, _COST_STR if what == "str" else _COST_BYTES)
                elif what == "list":
                    kind, n = _LIST, length
                elif what == "dict":
                    kind, n = _MAP, length
                else:
                    if pos + 1 + length > end:
                        raise ValueError(f"an extension at offset {at} runs past the structure "
                                         f"({length} bytes)")
                    code = unpack_from(">b", data, pos)[0]
                    pos += 1
                    if stack and stack[-1][0] == _MAP and stack[-1][3] is _NO_KEY:
                        raise ValueError(f"the dict key at offset {at} is an extension (type "
                                         f"{code}); keys must be str or int")
                    if not ext:
                        raise ValueError(f"an extension (type {code}) at offset {at} inside "
                                         "a tensor's description")
                    if code == _EXT_TUPLE:
                        stop = pos + length
                        kind, n, pos = _TUPLE, *self._array_header(data, pos, stop, at)
                    elif code == _EXT_TENSOR:
                        value = self._tensor(data, pos, pos + length, at)
                        pos += length
                        cost = _COST_TENSOR
                    else:
                        raise ValueError(f"unknown extension type {code} at offset {at}")
            else:
                raise ValueError(f"byte 0x{b:02x} at offset {at} starts no value")
            if stack and stack[-1][0] == _MAP and stack[-1][3] is _NO_KEY and (
                    kind != -1 or type(value) not in (str, int)):
                found = ("list", "dict", "tuple")[kind] if kind != -1 else type(value).__name__
                raise ValueError(f"the dict key at offset {at} is a {found}; keys must be str "
                                 "or int")
            if kind != -1:
                if len(stack) >= MAX_DEPTH:
                    raise ValueError(f"containers nested deeper than {MAX_DEPTH} levels "
                                     f"(at offset {at}), the most a snapshot holds")
                # Each item takes at least a byte: a length the bytes cannot hold is damage,
                # refused before anything is made.
                if n * (2 if kind == _MAP else 1) > end - pos:
                    raise ValueError(f"a {('list', 'dict', 'tuple')[kind]} at offset {at} "
                                     f"claims {n} items in {end - pos} bytes")
                cost = (_COST_DICT + _COST_ENTRY * n if kind == _MAP
                        else (_COST_LIST if kind == _LIST else _COST_TUPLE) + _COST_SLOT * n)
            self.cost += cost
            if self.cost > budget:
                raise ValueError(f"the structure would take more than {budget} bytes of memory "
                                 f"(at offset {at}); a snapshot's structure may take "
                                 f"{MEMORY_PER_BYTE} bytes per byte plus {MEMORY_SLACK >> 20} MiB")
            if kind != -1:
                if n:
                    # The last slot: where a tuple's payload ends, where a dict starts.
                    stack.append([kind, {} if kind == _MAP else [], n, _NO_KEY,
                                  at if kind == _MAP else stop])
                    continue
                value = {} if kind == _MAP else ([] if kind == _LIST else ())
                if kind == _TUPLE and pos != stop:
                    raise ValueError(f"the tuple at offset {at} holds more than its array")
            while True:  # put the value into its container; close the containers it fills
                if not stack:
                    return value, pos
                top = stack[-1]
                if top[0] == _MAP:
                    key = top[3]
                    if key is _NO_KEY:
                        top[3] = value
                        break
                    if key in top[1]:
                        raise ValueError(f"the dict at offset {top[4]} holds the key "
                                         f"{key!r} twice")
                    top[1][key] = value
                    top[3] = _NO_KEY
                else:
                    top[1].append(value)
                top[2] -= 1
                if top[2]:
                    break
                stack.pop()
                value = top[1]
                if top[0] == _TUPLE:
                    if pos != top[4]:
                        raise ValueError(f"a tuple ending at offset {pos} holds more than "
                                         "its array")
                    value = tuple(value)

    @staticmethod
    def _text(data: bytes, pos: int, n: int, end: int, what: str, at: int) -> tuple[Any, int]:
        if pos + n > end:
            raise ValueError(f"a {what} at offset {at} runs past the structure ({n} bytes)")
        raw = data[pos : pos + n]
        if what == "bin":
            return raw, pos + n
        try:
            return raw.decode("utf-8"), pos + n
        except UnicodeDecodeError:
            raise ValueError(f"the str at offset {at} is not valid UTF-8") from None

    @staticmethod
    def _array_header(data: bytes, pos: int, stop: int, at: int) -> tuple[int, int]:
        """A tuple's length and where its items start: its payload must be one array."""
        b = data[pos] if pos < stop else None
        if b is not None and 0x90 <= b <= 0x9F:
            return b & 0x0F, pos + 1
        if b in (0xDC, 0xDD):
            size = 2 if b == 0xDC else 4
            if pos + 1 + size <= stop:
                return struct.unpack_from(">H" if size == 2 else ">I", data, pos + 1)[0], \
                    pos + 1 + size
        raise ValueError(f"the tuple at offset {at}: its payload is not an array")

    def _tensor(self, data: bytes, pos: int, stop: int, at: int) -> torch.Tensor:
        """The tensor whose description is ``data[pos:stop]``: made, checked, not filled."""
        if stop - pos > _MAX_TENSOR_META:
            raise ValueError(f"the tensor at offset {at} has a description of {stop - pos} "
                             f"bytes (at most {_MAX_TENSOR_META})")
        meta = self._tensor_meta(data, pos, stop, at)
        if type(meta) is not list or len(meta) != 4:
            raise ValueError(f"the tensor at offset {at}: its payload is not "
                             "[dtype, shape, offset, nbytes]")
        dtype_name, shape, offset, nbytes = meta
        dtype = _DTYPES.get(dtype_name) if type(dtype_name) is str else None
        if dtype is None:
            raise ValueError(f"unknown tensor dtype {dtype_name!r}")
        if type(shape) is not list or not all([type(n) is int and n >= 0 for n in shape]):
            raise ValueError(f"bad tensor shape {shape!r}")
        # Checked before allocating, so damaged sizes can never ask for more than the file holds.
        if (offset != self.offset or nbytes != math.prod(shape) * dtype.itemsize
                or offset + nbytes > self.data_len):
            raise ValueError(f"tensor bytes out of place ({offset=}, {nbytes=})")
        self.offset += nbytes
        # The sizes as arguments: torch parses them about 0.5 us sooner than a list.
        tensor = torch.empty(*shape, dtype=dtype, device=self._device) if shape else \
            torch.empty((), dtype=dtype, device=self._device)
        self.tensors.append(tensor)
        return tensor

    def _tensor_meta(self, data: bytes, pos: int, stop: int, at: int) -> Any:
        """The value of a tensor's description (at most `_MAX_TENSOR_META` bytes), unchecked.

        Parsed here like the rest, without extensions, and charged nothing: it is dropped at
        once. Raises ValueError when it is not exactly one value.
        """
        cost = self.cost
        meta, after = self._parse(data, pos, stop, ext=False)
        self.cost = cost
        if after != stop:
            raise ValueError(f"the tensor at offset {at}: its payload is not "
                             "[dtype, shape, offset, nbytes]")
        return meta
