"""The tree codec: trees with tensors turned into bytes and back, within documented bounds.

A *tree* is nested ``dict`` (keys ``str`` or ``int``), ``list``, ``tuple``,
``None``, ``bool``, ``int`` (within int64/uint64), ``float``, ``str``,
``bytes`` and ``torch.Tensor`` (strided, any device: encoded from a CPU copy,
decoded on the CPU or the ``meta`` device). Subclasses are encoded as their
base type (an ``OrderedDict`` decodes as a ``dict``, a ``bytearray`` as
``bytes``, a NamedTuple as a ``tuple``) and a dataclass instance as a ``dict``
of its fields; `from_file` puts a message back into the NamedTuple or
dataclass its Input declares, and `file_problem` says what would not come back
as itself.

A tree is encoded as a *structure* and *tensor data*. The structure is one
msgpack object. In format 2 (`FORMAT`, what this module writes) a tuple is a
msgpack array whose first item is the *tuple marker*, an extension of type 2
with an empty payload, followed by the tuple's items; a tensor is extension
type 1 whose payload is a fixed little-endian layout (`tensor_ext`): its dtype
code (uint8, an index into `DTYPE_CODES`), its number of dimensions (uint8),
its shape (int64 each), the offset of its bytes from the start of the tensor
data (uint64) and their length (uint64). The tensor data is each tensor's raw
bytes (C order, native little-endian), back to back in the order the tensors
appear in the structure; this module hands them over as tensors (`encode`,
`raw_bytes`) and makes the empty tensors they are read into (`decode`,
`tensor_memory`), so that the bytes never go through a msgpack buffer. Any
other extension type (msgpack's timestamp, -1, included), a marker anywhere
but first in an array, or an unknown dtype code, cannot be decoded.

Format 1 (snapshot files and recordings written before format 2) differs in
the two extensions: a tuple is extension type 2 whose payload is the msgpack
array of its items, a tensor extension type 1 whose payload is the msgpack
array ``[dtype name, shape, offset, nbytes]``. `decode` reads it with the
module's own parser (``version=1``); nothing writes it any more.

Its users: snapshot files (``snapshot.py``: a header and checksums around a
structure and its tensor data), recordings (``recording/mcapfile.py``: each message
record is a snapshot file's bytes) and the data plane (``distributed/wire.py``:
a batch of port messages as one structure, `encode_batch` and `decode_batch`,
its tensor data in frames or shared memory).

Limits, which encoding and decoding apply alike (an encoder refuses what the
decoder would refuse): containers (dicts, lists, tuples) nest at most
`MAX_DEPTH` (100) levels; dict keys are str or int, each once per dict;
tensors have at most `MAX_NDIM` (255) dimensions. Format 2 is decoded by
msgpack's C decoder once the structure has been proven to be one complete
value with nothing after it, nested at most `MAX_DEPTH` deep (a pass that
makes no objects, msgpack's own stack counting the levels), so the decoded
objects take at most `V2_MEMORY_PER_BYTE` (128) bytes of memory per byte of
structure, whatever it holds (a structure under 64 bytes skips that pass:
msgpack then allocates at most about 12 KiB for it, whatever its headers
claim): there is no budget to count, and nothing for an encoder to refuse for
its memory. Format 1 is parsed without recursion, its
decoded objects charged by a fixed model of CPython's object sizes and
refused past `MEMORY_PER_BYTE` (32) bytes per byte of structure plus
`MEMORY_SLACK` (16 MiB) (`memory_budget`). No input, however nested, can
overflow the stack.

Each occurrence of a tensor is encoded on its own: two entries holding the same
tensor, or a view and its base, decode as independent tensors.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

import msgpack
import torch

from ._checks import is_int
from .errors import reason

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# The limits docs/state.md names (also as `snapshot.MAX_DEPTH`, ...). The package's own
# interface below (encode, decode, encode_batch, decode_batch, ...) is importable, not public
# API: a public module's __all__ lists only public names (tests/test_public_api.py).
__all__ = ["MAX_DEPTH", "MEMORY_PER_BYTE", "MEMORY_SLACK", "V2_MEMORY_PER_BYTE"]

_EXT_TENSOR = 1
_EXT_TUPLE = 2


class TensorSource(Protocol):
    """Where `decode_batch` may take a tensor's bytes from instead of a new tensor."""

    def __call__(self, index: int, shape: Sequence[int], dtype: torch.dtype,
                 nbytes: int) -> torch.Tensor | None:
        """The tensor of data-order ``index`` (``shape``, ``dtype``, ``nbytes`` checked
        against the data), filled already, or None to make a new one."""

FORMAT = 2
"""The format `encode` and `encode_batch` write; `decode` reads it and format 1."""

FORMATS = (1, 2)
"""The formats `decode` reads."""

# -- limits (what encoding refuses and decoding refuses alike) ----------------------------

MAX_DEPTH = 100
"""How deep containers (dicts, lists, tuples) may nest in a tree; the root container is level 1."""

MAX_NDIM = 255
"""The most dimensions a tensor may have: what format 2's uint8 holds (torch makes them all)."""

V2_MEMORY_PER_BYTE = 128
"""The most bytes of Python objects a format-2 structure decodes into, per byte of it.

Not counted while decoding: it follows from the format (see the derivation at
`_V2_WORST`), once the structure is proven complete before anything is made.
"""

MEMORY_PER_BYTE = 32
"""Format 1: decoded objects may take this many bytes of memory per byte of structure."""

MEMORY_SLACK = 16 << 20
"""Format 1: bytes of decoded objects allowed beyond ``MEMORY_PER_BYTE`` per byte of structure."""

# Format 1's memory model: what its parser charges a decoded object, in bytes (CPython's
# sizes, 64-bit). Shared objects (None, bools, small ints, strs and bytes of at most one
# byte) cost nothing beyond the slot of the container holding them.
_COST_LIST, _COST_TUPLE, _COST_DICT = 56, 40, 64  # plus per item:
_COST_SLOT, _COST_ENTRY = 8, 40  # a list/tuple item, a dict entry
_COST_STR, _COST_BYTES = 56, 40  # plus one per (UTF-8) byte
_COST_INT, _COST_FLOAT, _COST_TENSOR = 32, 24, 512

# _V2_WORST: why V2_MEMORY_PER_BYTE is 128. Once the structure is known to be one complete
# msgpack value, every container's items are there, so each object msgpack makes stands for
# bytes of the structure. The most memory a byte can make, in CPython 3.11 (64-bit; pymalloc
# rounds each block up to 16 bytes; each object also takes its 8-byte slot in its container,
# counted with the container here):
#   a one-entry map with a 1-byte int key (0x81 0x00, 2 bytes, its value apart): a dict, 64,
#     and its smallest keys table (8 slots, 5 entries of 24 bytes), 160      = 112 per byte
#     (nested as {0: {0: ...}}, only MAX_DEPTH deep; a str key's table is 120: 92 per byte)
#   an empty map (0x80, 1 byte): a dict, 64, + slot 8                      = 72 per byte
#   an empty array (0x90, 1 byte): a list, 56 -> 64, + slot 8              = 72 per byte
#   a one-item array (0x91, 1 byte, its item apart): a list 64 + items 16  = 80 per byte
#   a negative fixint -32..-6 (1 byte): an int, 28 -> 32, + slot 8         = 40 per byte
#   a str or bin of 2 bytes (3-4 bytes): 51 -> 64 (bin: 35 -> 48), + slot 8 = 24 per byte
#   a tuple ([marker, x], 5 bytes): a tuple 48 (its list, 80, only while it is made)
#                                                                          = 10 per byte
#   a tensor (21 bytes at least): charged `_COST_TENSOR`, 512, as in format 1 (its C++
#     parts are torch's; the payload's bytes object is dropped at once)  = 25 per byte
# Transient objects come on top only along the open path (a map's pending pairs list and
# tuples until its dict is made, at most MAX_DEPTH of them at once): 112 stays the worst
# per byte, and 128 leaves room for the allocator's own slack. tests/test_codec.py measures
# the peak (tracemalloc) of each shape against it.


def memory_budget(structure_len: int) -> int:
    """Bytes of decoded objects that a format-1 structure of ``structure_len`` bytes may make.

    Format 1's parser charges each object it makes by a fixed model of
    CPython's sizes (64-bit) and refuses a structure whose charge passes this.
    Format 2 needs no budget: see `V2_MEMORY_PER_BYTE`.

    Args:
        structure_len (int): the structure's length, bytes (>= 0).

    Returns:
        int: ``MEMORY_PER_BYTE * structure_len + MEMORY_SLACK``, bytes (the
        module's values when called: a test may lower them).
    """
    return MEMORY_PER_BYTE * structure_len + MEMORY_SLACK


def _int_cost(value: int) -> int:
    return 0 if -5 <= value <= 256 else _COST_INT


def _text_cost(n: int, base: int) -> int:
    return 0 if n <= 1 else base + n


DTYPE_CODES: tuple[str, ...] = (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
    "float8_e8m0fnu", "float4_e2m1fn_x2",
)
"""Format 2's dtype codes: a tensor's code is its dtype's index here (``"float32"``: 11).

Append only: a code, once written to a file, names the same dtype for good.
"""

DTYPES: Mapping[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in DTYPE_CODES
    if isinstance(getattr(torch, name, None), torch.dtype)  # older torch lacks some
}
"""The dtypes the format holds, by the name it gives them (``"float32"``); read only."""
# The name format 1 gives each dtype it holds: what `str(dtype)` says, without "torch.".
_DTYPE_NAMES: dict[torch.dtype, str] = {
    dtype: str(dtype).removeprefix("torch.") for dtype in DTYPES.values()
    if str(dtype).removeprefix("torch.") in DTYPES
}
_CODE_OF: dict[torch.dtype, int] = {DTYPES[name]: DTYPE_CODES.index(name) for name in DTYPES}
_DTYPE_OF: list[torch.dtype | None] = [DTYPES.get(name) for name in DTYPE_CODES]
_DTYPE_OF += [None] * (256 - len(_DTYPE_OF))  # an unknown code reads as None, not IndexError
# A tensor's payload in format 2, by its number of dimensions: dtype code, ndim, the shape,
# offset and nbytes, little-endian (made once: a format string per tensor costs as much as
# the rest of its entry).
_LAYOUTS = [struct.Struct(f"<BB{ndim}qQQ") for ndim in range(MAX_NDIM + 1)]
_LAYOUT_MIN = _LAYOUTS[0].size  # 18 bytes: a 0-dim tensor


# -- encoding ------------------------------------------------------------------------------


def encode(tree: Any) -> tuple[bytes, list[tuple[torch.Tensor, int]]]:
    """A tree's structure (format 2), and its tensors in the order of their bytes in the data.

    Tensor bytes are not copied here: a caller writes each tensor's `raw_bytes`
    (or a view of its memory), back to back, after the structure.

    Args:
        tree (Any): the tree (see the module docstring for what it may hold).

    Returns:
        tuple[bytes, list[tuple[torch.Tensor, int]]]: the structure (msgpack),
        and each tensor of the tree with its size in bytes, in data order.

    Raises:
        TypeError: a value, key or tensor cannot be encoded; the message names
            its key path (``nodes['ctrl']['model']: unsupported type Foo``).
        ValueError: the tree is beyond what `decode` accepts: containers nested
            deeper than `MAX_DEPTH`.
    """
    tensors: list[tuple[torch.Tensor, int]] = []
    packable, _ = _convert(tree, tensors, 0, "")
    return msgpack.packb(packable), tensors


# A tuple in format 2: an array led by this marker (packed as c7 00 02), then its items.
_TUPLE_MARK = msgpack.ExtType(_EXT_TUPLE, b"")


def _convert(tree: Any, tensors: list[tuple[torch.Tensor, int]], offset: int,
             root: str) -> tuple[Any, int]:
    """A tree made ready for ``msgpack.packb``: tuples and tensors as format 2 writes them.

    The tree's tensors are appended to ``tensors`` with their byte sizes, their bytes placed
    from ``offset`` on in the tensor data. ``root`` is the tree's key path in errors (``""``:
    ``<root>``). Returns the packable tree and the offset after its tensors. Raises what
    `encode` raises for the tree.
    """

    def convert(obj: Any, path: str, depth: int) -> Any:
        nonlocal offset
        if obj is None or isinstance(obj, (bool, float)):
            return obj
        if isinstance(obj, int):
            return _checked_int(obj, path)
        if isinstance(obj, str):
            return _checked_str(obj, path)
        if isinstance(obj, (bytes, bytearray)):
            return bytes(obj)
        if isinstance(obj, (dict, list, tuple)) and depth >= MAX_DEPTH:
            raise ValueError(f"{path or '<root>'}: containers nested deeper than {MAX_DEPTH} "
                             "levels, the most a snapshot file holds")
        if isinstance(obj, dict):
            for key in obj:
                if not (isinstance(key, str) or is_int(key)):
                    raise TypeError(f"{_child(path, key)}: unsupported key type "
                                    f"{type(key).__name__} (keys must be str or int)")
                if isinstance(key, int):
                    _checked_int(key, _child(path, key))
                else:
                    _checked_str(key, _child(path, key))
            return {key: convert(value, _child(path, key), depth + 1)
                    for key, value in obj.items()}
        if isinstance(obj, list):
            return [convert(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(obj)]
        if isinstance(obj, tuple):
            return [_TUPLE_MARK, *(convert(item, f"{path}[{i}]", depth + 1)
                                   for i, item in enumerate(obj))]
        if isinstance(obj, torch.Tensor):
            ext, nbytes = tensor_ext(obj, path, offset)
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
    return packable, offset


def tensor_ext(obj: torch.Tensor, path: str, offset: int) -> tuple[msgpack.ExtType, int]:
    """A tensor's entry in a format-2 structure (extension type 1) and its size in bytes.

    For a caller that packs a structure itself (a message record's short way):
    the entry places the tensor's bytes at ``offset`` in the tensor data. It
    depends only on the tensor's dtype and shape and on ``offset``, so it may
    be kept and reused for tensors of the same dtype and shape. Its payload,
    little-endian: the dtype's code (uint8, its index in `DTYPE_CODES`), the
    number of dimensions (uint8), each dimension (int64), ``offset`` (uint64)
    and the size (uint64): ``18 + 8 * ndim`` bytes.

    Args:
        obj (torch.Tensor): the tensor (any device; only its dtype, layout and
            shape are read).
        path (str): its key path, for the errors (``""``: ``<root>``).
        offset (int): where its bytes start in the tensor data, bytes (>= 0).

    Returns:
        tuple[msgpack.ExtType, int]: the entry, and ``numel * element_size``.

    Raises:
        TypeError: naming ``path``, for a tensor the format cannot hold: a dtype
            it does not name (`DTYPES`), a layout other than strided, no data
            (meta), or more than `MAX_NDIM` dimensions.
    """
    code = _CODE_OF.get(obj.dtype)
    if code is None:
        raise TypeError(f"{path or '<root>'}: unsupported tensor dtype "
                        f"{str(obj.dtype).removeprefix('torch.')}")
    if obj.layout != torch.strided or obj.is_meta:
        raise TypeError(f"{path or '<root>'}: unsupported {obj.layout} tensor "
                        f"on {obj.device} (only strided tensors with data)")
    shape = obj.shape
    ndim = len(shape)
    if ndim > MAX_NDIM:
        raise TypeError(f"{path or '<root>'}: a tensor of {ndim} dimensions "
                        f"has too many for a snapshot file (at most {MAX_NDIM})")
    nbytes = obj.numel() * obj.element_size()
    return msgpack.ExtType(_EXT_TENSOR, _LAYOUTS[ndim].pack(code, ndim, *shape, offset,
                                                            nbytes)), nbytes


def _checked_str(text: str, path: str) -> str:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate: no UTF-8 form, load could not read it
            raise TypeError(f"{path or '<root>'}: a str that is not valid Unicode ({e.reason} "
                            f"at index {e.start})") from None
    return text


def _child(path: str, key: object) -> str:
    # Paths read like Python with the top-level str key bare: nodes['ctrl']['model'].
    return key if not path and isinstance(key, str) else f"{path}[{key!r}]"


def _checked_int(value: int, path: str) -> int:
    if not -(2**63) <= value < 2**64:  # what msgpack can hold
        raise TypeError(f"{path or '<root>'}: int {value} is outside the int64/uint64 range")
    return value




def raw_bytes(tensor: torch.Tensor) -> memoryview:
    """A tensor's bytes as the tensor data holds them: C order, conjugation and negation resolved.

    Args:
        tensor (torch.Tensor): a tensor `tensor_ext` accepts, on any device.

    Returns:
        memoryview: ``tensor.nbytes`` bytes (format ``"B"``): a view of the
        tensor's own memory when it is a contiguous CPU tensor with nothing to
        resolve (its storage then stays unresizable: see `tensor_memory`), else
        of a copy (one tensor at a time, so few copies are alive at once).
    """
    return tensor_memory(tensor.detach().cpu().resolve_conj().resolve_neg().contiguous())


def tensor_memory(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, as a writable view of its memory.

    What a reader fills a tensor that `decode` made with (``readinto``).

    Args:
        t (torch.Tensor): a contiguous tensor on the CPU.

    Returns:
        memoryview: its ``t.nbytes`` bytes (format ``"B"``). Made through
        numpy, which marks the tensor's storage as not resizable for good.
    """
    # A contiguous tensor's elements lie back to back from its storage offset, but its strides
    # may still be odd where they do not matter (empty or size-1 dims); restate them as 1.
    flat = t.as_strided((t.numel(),), (1,))
    return flat.view(torch.uint8).numpy().data



# -- messages: what comes back as it was ---------------------------------------------------

# -- messages: what comes back from a file as it was ------------------------------------

_EXACT = (type(None), bool, int, float, str, bytes, torch.Tensor, list, dict, tuple)
_DTYPE_SET = frozenset(DTYPES.values())


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

    Checks what `encode` checks (cheaply: this runs on every message at every supervisor
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





def is_record_type(cls: type) -> bool:
    """Whether `from_file` puts messages back into ``cls``: a NamedTuple class or a dataclass.

    Args:
        cls (type): a port's declared type (a class).

    Returns:
        bool: True for a NamedTuple class or a dataclass (the class itself).
    """
    return _is_named_tuple(cls) or _is_dataclass_type(cls)


def type_problem(declared: Any) -> str | None:
    """Why messages of a declared type would not come back from the codec as themselves.

    A type comes back as itself when it is ``object`` (any message: each is
    checked on its own, `file_problem`), None's type, ``bool``, ``int``,
    ``float``, ``str``, ``bytes``, ``list``, ``tuple``, ``dict``,
    ``torch.Tensor``, a NamedTuple class or a dataclass (their fields checked
    per message, like a container's items). Any other class does not:
    ``complex`` and classes the codec does not hold, and subclasses of the
    plain types (an ``OrderedDict``, an ``IntEnum``, a Tensor subclass), which
    come back as their base type.

    Args:
        declared (Any): a port's declared message type.

    Returns:
        str | None: the reason in words (``"an OrderedDict (a subclass of dict)
        would come back as a dict; declare dict"``), or None when it comes back.
    """
    if not isinstance(declared, type):
        return f"{declared!r} is not a class"
    if declared is object or declared in _EXACT:
        return None
    if _is_named_tuple(declared) or _is_dataclass_type(declared):
        return None
    base = next((b for b in _EXACT if issubclass(declared, b)), None)
    if base is not None:
        return (f"{_a(declared.__name__)} (a subclass of {base.__name__}) would come back as "
                f"{_a(base.__name__)}; declare {base.__name__}")
    return (f"the snapshot codec does not encode {_a(declared.__name__)} (it holds None, bool, "
            "int, float, str, bytes, list, tuple, dict, torch.Tensor, and NamedTuples and "
            "dataclasses of those)")


# -- a batch of port messages (the data plane's hot path) -----------------------------------

_Tensor = torch.Tensor
# Message types encoded as they are (int and str: checked). Any other type is checked by
# `file_problem` and converted by `_convert`.
_AS_THEY_ARE = frozenset((type(None), bool, float, bytes))


def encode_batch(messages: Sequence[Any], ports: Sequence[int], declared: Sequence[type],
                 tensors: list[tuple[torch.Tensor, int]]) -> bytes:
    """The structure of a batch of port messages: one msgpack array (format 2), one per message.

    Each message is checked against its port's declared type (``declared[ports[i]]``):
    it must come back from `decode_batch` and `from_file` as itself (`file_problem`).
    Runs of plain scalars and tensors, and flat lists, tuples and dicts of them (most
    messages), take a short way to the same bytes as `encode`'s.

    Args:
        messages (Sequence[Any]): the messages, in batch order.
        ports (Sequence[int]): each message's port index into ``declared`` (in range:
            the caller checks).
        declared (Sequence[type]): each port's declared type, by port index.
        tensors (list[tuple[torch.Tensor, int]]): empty; the batch's tensors are
            appended to it with their sizes in bytes, in data order (their bytes
            start at 0).

    Returns:
        bytes: the structure.

    Raises:
        TypeError: a message the codec cannot hold or that would not come back as
            itself; the message names its item, port and key path (``item 3 (port
            7): message['pose']: ...``).
        ValueError: a message nested deeper than `MAX_DEPTH` (named likewise).
    """
    return msgpack.packb(_batch(messages, ports, declared, tensors))


def _batch(ms: Sequence[Any], ps: Sequence[int], declared: Sequence[type],
           tensors: list[tuple[torch.Tensor, int]]) -> list[Any]:
    """The messages made ready for msgpack.

    Runs of leaves (scalars and plain tensors: most messages) go through `_leaves`;
    each other message through `_other`. Appends the tensors to ``tensors``.
    """
    out: list[Any] = []
    n = len(ms)
    try:
        i, offset = _leaves(ms, 0, out, tensors, 0)
        while i < n:
            packable, offset = _other(ms[i], declared[ps[i]], tensors, offset)
            out.append(packable)
            i, offset = _leaves(ms, i + 1, out, tensors, offset)
    except (TypeError, ValueError) as e:
        i = len(out)  # every message before the one that failed is in out
        kind = TypeError if isinstance(e, TypeError) else ValueError
        raise kind(f"item {i} (port {ps[i]}): {reason(e)}") from e
    return out


def _leaves(values: Sequence[Any], start: int, out: list[Any],
            tensors: list[tuple[torch.Tensor, int]], offset: int) -> tuple[int, int]:
    """Packs ``values[start:]`` into ``out`` for as long as they are leaves.

    A leaf is a value of exactly a scalar type or ``torch.Tensor``, which the
    codec writes as it is (a tensor as its extension, its bytes placed
    from ``offset`` on and appended to ``tensors``).

    Returns:
        tuple[int, int]: the index of the first value that is not a leaf
        (``len(values)`` when all are), and the tensor data's offset after them.

    Raises:
        TypeError: a leaf the codec cannot hold (an int beyond int64/uint64, a str
            that is not Unicode, an unsupported tensor); nothing is appended for it.
    """
    append = out.append
    for i in range(start, len(values)):
        m = values[i]
        vt = type(m)
        if vt is _Tensor:
            ext, nbytes = tensor_ext(m, "message", offset)
            tensors.append((m, nbytes))
            offset += nbytes
            m = ext
        elif vt is int:
            _checked_int(m, "message")
        elif vt is str:
            _checked_str(m, "message")
        elif vt not in _AS_THEY_ARE:
            return i, offset
        append(m)
    return len(values), offset


def _other(m: Any, declared: type, tensors: list[tuple[torch.Tensor, int]],
           offset: int) -> tuple[Any, int]:
    """A message that is not a leaf, made ready for msgpack: (packable, offset after).

    A plain list, tuple or dict of leaves (with str or int keys) is packed at once;
    anything else is converted by `_convert` (which names the key
    path of what it cannot hold) and checked with `file_problem` against ``declared``.
    """
    vt = type(m)
    if vt is tuple or vt is list or vt is dict:
        mark = len(tensors)
        packed: list[Any] = [_TUPLE_MARK] if vt is tuple else []
        values = list(m.values()) if vt is dict else m
        try:
            stop, after = _leaves(values, 0, packed, tensors, offset)
            plain = stop == len(values) and (vt is not dict or _plain_keys(m))
        except (TypeError, ValueError):  # the slow path below says what and where
            plain = False
        if plain:
            return (dict(zip(m, packed, strict=True)) if vt is dict else packed), after
        del tensors[mark:]
    packable, offset = _convert(m, tensors, offset, "message")  # what it cannot hold
    problem = file_problem(m, declared)  # what it would not bring back as it was
    if problem is not None:
        raise TypeError(f"message: {problem}")
    return packable, offset


def _plain_keys(m: dict[Any, Any]) -> bool:
    """Whether a dict's keys are all plain strs and ints a file holds (TypeError: one is not)."""
    for key in m:
        kt = type(key)
        if kt is str:
            _checked_str(key, "message")
        elif kt is int:
            _checked_int(key, "message")
        else:
            return False
    return True


# -- decoding ------------------------------------------------------------------------------


def decode(structure: bytes, data_len: int, device: str = "cpu",
           version: int = FORMAT) -> tuple[Any, list[torch.Tensor]]:
    """The tree a structure holds, and its tensors, made but not filled, in data order.

    Decoding never runs code from the bytes (no pickle) and never recurses in
    Python. Format 2 goes through msgpack's C decoder (after a pass that proves
    the structure complete), format 1 through this module's own parser. The
    caller fills each tensor with its bytes of the tensor data, in order
    (`tensor_memory`), or leaves them unfilled (``device="meta"``: dtype and
    shape only).

    Args:
        structure (bytes): the structure, as `encode` made it (any buffer).
        data_len (int): the length of the tensor data, bytes: every tensor's
            bytes must lie within it, back to back from 0, and fill it exactly.
        device (str): the device the tensors are made on: ``"cpu"`` (the
            default) or ``"meta"``.
        version (int): the structure's format, one of `FORMATS` (default
            `FORMAT`, what `encode` writes; a snapshot file's header says).

    Returns:
        tuple[Any, list[torch.Tensor]]: the tree (tuples, lists, int keys,
        dtypes and shapes as encoded) and its tensors (``torch.empty``:
        contiguous, sharing memory with nothing), each once, in data order.

    Raises:
        ValueError: the structure does not decode or is beyond the limits of
            the module docstring (nesting deeper than `MAX_DEPTH`, an unknown
            extension or dtype, a tuple marker out of place, a dict key that is
            not str or int or comes twice, a str that is not UTF-8, tensor
            bytes out of place or not filling ``data_len``, and in format 1
            more decoded memory than `memory_budget`); the message says what,
            and in format 1 at which offset. Also for a ``version`` not in
            `FORMATS`. In format 1 damaged sizes may also make torch raise
            (RuntimeError) as a tensor is made: a caller that reads untrusted
            bytes catches both.
    """
    decoder: _V2Decoder | _Decoder
    if version == 2:
        tree, decoder = _decode_v2(structure, 0, data_len, device)
    elif version == 1:
        decoder = _Decoder(data_len, device)
        tree = decoder.unpack(structure)
    else:
        raise ValueError(f"no codec format {version} (formats {FORMATS[0]} to {FORMATS[-1]})")
    if decoder.offset != data_len:
        raise ValueError(f"tensors of {decoder.offset} bytes, not {data_len}")
    return tree, decoder.tensors


def decode_batch(data: bytes, start: int, count: int, data_len: int,
                 source: TensorSource | None = None) -> tuple[list[Any], list[torch.Tensor]]:
    """A batch's messages from the structure `encode_batch` made, and their tensors, unfilled.

    As `decode` of ``data[start:]`` in format 2 on the CPU (the same checks and
    bounds). The messages come back as the codec holds them: a NamedTuple as a
    tuple, a dataclass as a dict (`from_file` puts them back).

    Args:
        data (bytes): the bytes that hold the structure, from ``start`` to the end.
        start (int): where the structure starts in ``data``, bytes.
        count (int): how many messages the batch holds.
        data_len (int): the length of the batch's tensor data, bytes (as `decode`).
        source (TensorSource | None): asked for each tensor, once its description
            is checked, ``source(index, shape, dtype, nbytes)``: a tensor of that
            shape and dtype whose bytes are already where the caller keeps them
            (a view of shared memory), or None for a new one (``torch.empty``).
            None (the default): every tensor is new.

    Returns:
        tuple[list[Any], list[torch.Tensor]]: the ``count`` messages, and their
        tensors (CPU, contiguous, sharing memory with nothing) in data order.

    Raises:
        ValueError: as `decode`, or the structure is not an array of ``count``
            values.
    """
    messages, decoder = _decode_v2(data, start, data_len, "cpu", source)
    if decoder.offset != data_len:
        raise ValueError(f"tensors of {decoder.offset} bytes, where the frames hold "
                         f"{data_len}")
    if type(messages) is not list or len(messages) != count:
        raise ValueError(f"the messages are not an array of {count} values")
    return messages, decoder.tensors


# -- format 2: msgpack's C decoder, its hooks and the checks it cannot make ----------------


class _TupleMark:
    """What the tuple marker decodes to until its array becomes a tuple (one instance)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<tuple marker>"


_MARK = _TupleMark()
_KEY_TYPES = frozenset((str, int))
_LEAF_TYPES = frozenset((type(None), bool, int, float, str, bytes, torch.Tensor))
_CONTAINER_TYPES = frozenset((list, dict, tuple))
_TREE_TYPES = _LEAF_TYPES | _CONTAINER_TYPES


# Structures shorter than this skip `_check_complete`: whatever their headers claim, msgpack
# allocates at most about 12 KiB for them before it finds them truncated (21 array16 headers
# claiming 63 slots each, or 63 fixarray headers claiming 15), and they cannot nest deeper
# than `MAX_DEPTH` (a level takes a byte). The pass would cost more than it saves.
_SMALL = 64


def _stack_limit_is(limit: int) -> bool:
    """Whether msgpack's decoder refuses a container opened inside ``limit`` open ones, only.

    Its C decoder keeps the containers it has open on a fixed stack of 1024 and refuses a
    container (empty or not) opened when the stack is full; the pure-Python fallback has
    no such stack.
    """
    def passes(data: bytes) -> bool:
        unpacker = msgpack.Unpacker(max_buffer_size=len(data))
        unpacker.feed(data)
        try:
            unpacker.skip()
        except Exception:  # noqa: BLE001 - StackError, or whatever a fallback raises
            return False
        return True

    return passes(b"\x91" * (limit - 1) + b"\x90") and not passes(b"\x91" * limit + b"\x90")


# The depth check, made by msgpack's own stack: the structure is skipped inside this many
# one-item arrays, so that a container at level MAX_DEPTH + 1 is opened on a full stack.
# None (another msgpack): the depth is found by a walk over the decoded tree instead.
_STACK = 1024
_DEPTH_PREFIX = b"\x91" * (_STACK - MAX_DEPTH) if _stack_limit_is(_STACK) else None


def _decode_v2(data: bytes, start: int, data_len: int, device: str,
               source: TensorSource | None = None) -> tuple[Any, _V2Decoder]:
    """The tree of the format-2 structure ``data[start:]`` and the decoder that made its tensors.

    See `decode`. The structure is proven complete and no deeper than `MAX_DEPTH` first
    (`_check_complete`), then decoded by msgpack with `_V2Decoder`'s hooks. What msgpack
    makes outside the format without asking a hook, a timestamp (extension -1), holds a
    0xff byte: only a structure with one has the hooks check the types of every item.
    """
    if type(data) is not bytes:
        data = bytes(data)
    size = len(data) - start
    view = memoryview(data)[start:] if start else data
    if size >= _SMALL:
        _check_complete(view, size)
    decoder = _V2Decoder(data_len, device, source)
    screen = data.find(b"\xff", start) >= 0
    try:
        tree = msgpack.unpackb(
            view, raw=False, strict_map_key=False, ext_hook=decoder.ext,
            list_hook=decoder.screened_array if screen else decoder.array,
            object_pairs_hook=decoder.screened_pairs if screen else decoder.pairs)
    except UnicodeDecodeError as e:
        raise ValueError(f"a str is not valid UTF-8 ({e.reason})") from None
    except msgpack.FormatError:  # only a small structure gets here (and to the two below)
        raise ValueError(f"the structure does not decode ({size} bytes): it holds a byte that "
                         "starts no msgpack value (0xc1)") from None
    except msgpack.ExtraData as e:
        raise ValueError(f"{len(e.extra)} bytes after the tree, from offset "
                         f"{size - len(e.extra)}") from None
    except ValueError as e:
        if str(e).startswith("Unpack failed"):  # msgpack's own words for a small structure
            raise ValueError(f"the structure does not decode ({size} bytes): "
                             f"{reason(e)}") from None
        raise
    if type(tree) not in _TREE_TYPES:
        _check_types({type(tree)})
    if decoder.marks != decoder.tuples:
        _check_types({_TupleMark})
    if _DEPTH_PREFIX is None:
        _check_tree(tree)
    return tree, decoder


def _check_complete(data: bytes | memoryview, size: int) -> None:
    """Refuses a structure that is not one complete value nested at most `MAX_DEPTH` deep.

    msgpack's C decoder allocates each array's item slots at its header, before the
    items are read: on a truncated structure, nested headers claiming as many items as
    there are bytes would take gigabytes before the end is found. Skipping the value
    makes no objects; once it has passed, every header's items are there, and the
    decoded objects take at most `V2_MEMORY_PER_BYTE` per byte. The value is skipped
    inside `_DEPTH_PREFIX`, so that msgpack's stack refuses what nests too deep.
    Raises ValueError saying which.
    """
    prefix = _DEPTH_PREFIX or b""
    unpacker = msgpack.Unpacker(max_buffer_size=len(prefix) + size)
    unpacker.feed(prefix)
    unpacker.feed(data)
    try:
        unpacker.skip()
    except msgpack.OutOfData:
        raise ValueError(f"the structure ends inside a value (it is {size} bytes)") from None
    except msgpack.StackError:
        raise ValueError(f"containers nested deeper than {MAX_DEPTH} levels, the most a "
                         "snapshot holds") from None
    except msgpack.FormatError:
        raise ValueError("the structure holds a byte that starts no msgpack value "
                         "(0xc1)") from None
    except ValueError as e:  # a length past what the bytes could hold
        raise ValueError(f"the structure does not decode: {reason(e)}") from None
    end = unpacker.tell() - len(prefix)
    if end != size:
        raise ValueError(f"{size - end} bytes after the tree, from offset {end}")


class _V2Decoder:
    """msgpack's hooks for format 2: tensors made and checked, tuples, dicts checked.

    msgpack calls `ext` for each extension in the order of the structure (so the
    tensors come in data order), `array` for each array once its items are made and
    `pairs` for each map with its (key, value) pairs. The markers and the tuples are
    counted: a marker that leads no array is one too many. The ``screened_`` hooks
    also refuse an item of a type the format does not make (`_decode_v2` says when).
    """

    __slots__ = ("data_len", "offset", "tensors", "marks", "tuples", "_device", "_source")

    def __init__(self, data_len: int, device: str, source: TensorSource | None = None) -> None:
        self.data_len = data_len
        self.offset = 0
        self.tensors: list[torch.Tensor] = []
        self.marks = self.tuples = 0
        self._device = _CPU if device == "cpu" else torch.device(device)
        self._source = source

    def ext(self, code: int, payload: bytes) -> Any:
        """A tensor (made, not filled) for type 1, the tuple marker for an empty type 2."""
        if code == _EXT_TENSOR:
            return self._tensor(payload)
        if code == _EXT_TUPLE:
            if payload:
                raise ValueError(f"a tuple marker (extension type 2) with a payload of "
                                 f"{len(payload)} bytes")
            self.marks += 1
            return _MARK
        raise ValueError(f"unknown extension type {code}")

    def array(self, items: list[Any]) -> list[Any] | tuple[Any, ...]:
        """The array as a tuple when the marker leads it; else the list itself."""
        if items and items[0] is _MARK:
            self.tuples += 1
            del items[0]
            return tuple(items)
        return items

    def screened_array(self, items: list[Any]) -> list[Any] | tuple[Any, ...]:
        """`array`, refusing an item of a type outside the format (ValueError)."""
        made = self.array(items)
        if not _TREE_TYPES.issuperset(map(type, made)):
            _check_types(set(map(type, made)))
        return made

    @staticmethod
    def pairs(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
        """The map as a dict: its keys str or int, each once (ValueError)."""
        try:
            made = dict(pairs)
        except TypeError:  # an unhashable key (a list, a dict): refused below
            made = {}
        if len(made) != len(pairs) or not _KEY_TYPES.issuperset(map(type, made)):
            # The keys' own types first: a True merged into a 1 is a bool, not a 1 twice.
            for key, _ in pairs:
                if type(key) not in _KEY_TYPES:
                    raise ValueError(f"a dict key is {_a(_type_name(type(key)))}; keys must "
                                     "be str or int")
            raise ValueError(f"a dict holds the key {_first_twice(pairs)!r} twice")
        return made

    def screened_pairs(self, pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
        """`pairs`, refusing a value of a type outside the format (ValueError)."""
        made = self.pairs(pairs)
        if not _TREE_TYPES.issuperset(map(type, made.values())):
            _check_types(set(map(type, made.values())))
        return made

    def _tensor(self, payload: bytes) -> torch.Tensor:
        """The tensor a payload describes: checked, made with ``torch.empty``, not filled."""
        kind = _KINDS.get(payload[:-16])
        if kind is None:
            kind = _tensor_kind(payload)
        dtype, shape, size = kind
        offset, nbytes = _TAIL.unpack_from(payload, len(payload) - 16)
        # Checked before allocating, so damaged sizes can never ask for more than the data.
        if offset != self.offset or nbytes != size or offset + nbytes > self.data_len:
            raise ValueError(f"tensor bytes out of place ({offset=}, {nbytes=})")
        source = self._source
        tensor = None if source is None else source(len(self.tensors), shape, dtype, nbytes)
        if tensor is None:
            tensor = torch.empty(*shape, dtype=dtype, device=self._device) if shape else \
                torch.empty((), dtype=dtype, device=self._device)
        self.offset += nbytes
        self.tensors.append(tensor)
        return tensor


# What the head of a tensor's payload (dtype code, ndim, shape) says: (dtype, shape, nbytes),
# kept for the next tensor of its kind (a state dict's or a batch's tensors repeat a few
# kinds; the checks and the unpacking then cost a dict lookup).
_KINDS: dict[bytes, tuple[torch.dtype, tuple[int, ...], int]] = {}
_TAIL = struct.Struct("<QQ")  # a tensor payload's last 16 bytes: offset, nbytes


def _tensor_kind(payload: bytes) -> tuple[torch.dtype, tuple[int, ...], int]:
    """Checks the head of a tensor's payload; its dtype, shape and size in bytes (ValueError)."""
    ndim = (len(payload) - _LAYOUT_MIN) >> 3
    if len(payload) < _LAYOUT_MIN or payload[1] != ndim or \
            len(payload) != _LAYOUT_MIN + 8 * ndim:
        raise ValueError(f"a tensor's payload of {len(payload)} bytes is not dtype code, "
                         "ndim, shape, offset and nbytes")
    fields = _LAYOUTS[ndim].unpack(payload)
    dtype = _DTYPE_OF[fields[0]]
    if dtype is None:
        raise ValueError(f"unknown tensor dtype code {fields[0]}")
    shape = fields[2:-2]
    if ndim and min(shape) < 0:
        raise ValueError(f"bad tensor shape {list(shape)}")
    try:  # sizes whose strides overflow int64 (with no elements): refused before they are kept
        torch.empty(shape, dtype=dtype, device="meta")
    except RuntimeError as e:
        raise ValueError(f"bad tensor shape {list(shape)}: {reason(e)}") from None
    if len(_KINDS) >= 256:
        _KINDS.clear()
    kind = _KINDS[payload[:-16]] = (dtype, shape, math.prod(shape) * dtype.itemsize)
    return kind


def _first_twice(pairs: list[tuple[Any, Any]]) -> Any:
    """The first key that comes a second time among a map's pairs (there is one)."""
    seen = set()
    for key, _ in pairs:
        if key in seen:
            return key
        seen.add(key)
    raise AssertionError("no key comes twice")


def _check_tree(tree: Any) -> None:
    """Refuses nesting past `MAX_DEPTH` and any object the format does not make (ValueError).

    The depth check for a msgpack whose stack does not make it (`_DEPTH_PREFIX` None).
    Depth first, without recursion: a stack of iterators, one per open container, so
    the walk holds nothing but the path it is on. A container's item types are gathered
    in C (``set(map(type, ...))``), so a container of leaves costs a few nanoseconds an
    item and is not walked.
    """
    if type(tree) not in _CONTAINER_TYPES:
        _check_types({type(tree)})
        return
    path = [iter((tree,))]
    while path:
        for item in path[-1]:
            if type(item) not in _CONTAINER_TYPES:
                continue
            if len(path) > MAX_DEPTH:
                raise ValueError(f"containers nested deeper than {MAX_DEPTH} levels, the "
                                 "most a snapshot holds")
            items = item.values() if type(item) is dict else item
            kinds = set(map(type, items))
            if kinds <= _LEAF_TYPES:
                continue
            _check_types(kinds)
            path.append(iter(items))
            break
        else:
            path.pop()


def _check_types(kinds: set[type]) -> None:
    """Refuses a type msgpack made that the format does not hold (ValueError)."""
    stray = kinds - _TREE_TYPES
    if stray:
        raise ValueError(f"the structure holds {_a(_type_name(next(iter(stray))))}")


def _type_name(kind: type) -> str:
    """A type's name in errors; the objects msgpack makes outside the format by their meaning."""
    if kind is _TupleMark:
        return "tuple marker (extension type 2) that does not lead an array"
    if kind is msgpack.Timestamp:
        return "msgpack timestamp (unknown extension type -1)"
    return kind.__name__


# -- format 1: the module's own parser (files written before format 2) ---------------------


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
    more memory than `memory_budget`, extension types other than tensors and tuples, a tuple
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

        Without a budget given, the decoded objects may take `memory_budget` of the
        structure's length (``len(data) - start``).
        """
        if self.budget is None:
            self.budget = memory_budget(len(data) - start)
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
        dtype = DTYPES.get(dtype_name) if type(dtype_name) is str else None
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
