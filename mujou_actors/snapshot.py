"""Snapshot files: the state tree on disk, written atomically, read without running code.

A *tree* is nested ``dict`` (keys ``str`` or ``int``), ``list``, ``tuple``,
``None``, ``bool``, ``int`` (within int64/uint64), ``float``, ``str``,
``bytes`` and ``torch.Tensor`` (strided, any device: saved from a CPU copy,
loaded on the CPU). Subclasses are stored as their base type (an
``OrderedDict`` loads as a ``dict``, a ``bytearray`` as ``bytes``).

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

import io
import math
import os
import secrets
import struct
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any

import msgpack
import torch

from .errors import SnapshotError

__all__ = ["save", "load", "dumps", "loads", "inspect_file", "MAGIC", "VERSION"]

MAGIC = b"MUJOUSNP"
VERSION = 1

_HEAD = struct.Struct("<8sIQQ")  # magic, version, S, D
_CRC = struct.Struct("<I")
_HEADER_LEN = _HEAD.size + _CRC.size  # 32
_MIN_LEN = _HEADER_LEN + _CRC.size  # header and trailer
_EXT_TENSOR = 1
_EXT_TUPLE = 2
_CHUNK = 4 << 20  # read/write and CRC in pieces that stay in the CPU cache

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
        OSError: the file cannot be written; an existing file is left as it was.
    """
    structure, tensors = _encode(tree)  # every TypeError is raised before the disk is touched
    target = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(target))
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
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
            format version, is truncated or is corrupted (checksum mismatch or
            undecodable structure); the message names the file and which.
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
    """Packs the structure; returns it and the tensors with their byte sizes, in file order."""
    tensors: list[tuple[torch.Tensor, int]] = []
    offset = 0

    def convert(obj: Any, path: str) -> Any:
        nonlocal offset
        if obj is None or isinstance(obj, (bool, float, str, bytes)):
            return obj
        if isinstance(obj, int):
            return _checked_int(obj, path)
        if isinstance(obj, bytearray):
            return bytes(obj)
        if isinstance(obj, dict):
            for key in obj:
                if isinstance(key, bool) or not isinstance(key, (str, int)):
                    raise TypeError(f"{_child(path, key)}: unsupported key type "
                                    f"{type(key).__name__} (keys must be str or int)")
                if isinstance(key, int):
                    _checked_int(key, _child(path, key))
            return {key: convert(value, _child(path, key)) for key, value in obj.items()}
        if isinstance(obj, list):
            return [convert(item, f"{path}[{i}]") for i, item in enumerate(obj)]
        if isinstance(obj, tuple):
            items = [convert(item, f"{path}[{i}]") for i, item in enumerate(obj)]
            return msgpack.ExtType(_EXT_TUPLE, msgpack.packb(items))
        if isinstance(obj, torch.Tensor):
            name = str(obj.dtype).removeprefix("torch.")
            if name not in _DTYPES:
                raise TypeError(f"{path or '<root>'}: unsupported tensor dtype {name}")
            if obj.layout != torch.strided or obj.is_meta:
                raise TypeError(f"{path or '<root>'}: unsupported {obj.layout} tensor "
                                f"on {obj.device} (only strided tensors with data)")
            nbytes = obj.numel() * obj.element_size()
            meta = [name, list(obj.shape), offset, nbytes]
            tensors.append((obj, nbytes))
            offset += nbytes
            return msgpack.ExtType(_EXT_TENSOR, msgpack.packb(meta))
        raise TypeError(f"{path or '<root>'}: unsupported type {type(obj).__name__}")

    return msgpack.packb(convert(tree, "")), tensors


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
    return memoryview(flat.view(torch.uint8).numpy())


def _fsync_folder(folder: str) -> None:
    # Makes the rename itself durable. Windows cannot open a folder; its rename is durable enough.
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def _read(f: IO[bytes], name: str) -> Any:
    _, structure_len, data_len, crc = _read_header(f, name)
    structure = f.read(structure_len)
    crc = zlib.crc32(structure, crc)
    decoder = _Decoder(data_len, device="cpu")
    tree = _decode(decoder, structure, name)
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


def _read_header(f: IO[bytes], name: str) -> tuple[int, int, int, int]:
    """Checks the header against the file size; returns (size, S, D, CRC of the header)."""
    size = f.seek(0, io.SEEK_END)
    f.seek(0)
    head = f.read(_HEADER_LEN)
    if head[:8] != MAGIC[: len(head)]:
        raise SnapshotError(f"{name}: not a mujou snapshot (starts with {head[:8]!r})")
    # The version comes before anything else: a newer format may lay out the rest differently.
    version = struct.unpack_from("<I", head, 8)[0] if len(head) >= 12 else 0
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


def _decode(decoder: _Decoder, structure: bytes, name: str) -> Any:
    try:
        tree = decoder.unpack(structure)
        if decoder.offset != decoder.data_len:
            raise ValueError(f"tensors of {decoder.offset} bytes, not {decoder.data_len}")
    except Exception as e:  # anything the bytes can make msgpack or torch raise
        raise SnapshotError(f"{name}: corrupted: cannot decode the structure ({e})") from e
    return tree


class _Decoder:
    """Rebuilds the tree from the structure, making (not yet filling) each tensor."""

    def __init__(self, data_len: int, device: str) -> None:
        self.data_len = data_len
        self.device = device
        self.offset = 0
        self.tensors: list[torch.Tensor] = []

    def unpack(self, data: bytes) -> Any:
        # strict_map_key=False: int keys are part of the tree.
        return msgpack.unpackb(data, ext_hook=self._ext, strict_map_key=False)

    def _ext(self, code: int, payload: bytes) -> Any:
        if code == _EXT_TUPLE:
            return tuple(self.unpack(payload))
        if code != _EXT_TENSOR:
            raise ValueError(f"unknown extension type {code}")
        dtype_name, shape, offset, nbytes = msgpack.unpackb(payload)
        dtype = _DTYPES.get(dtype_name)
        if dtype is None:
            raise ValueError(f"unknown tensor dtype {dtype_name!r}")
        if not isinstance(shape, list) or any(type(n) is not int or n < 0 for n in shape):
            raise ValueError(f"bad tensor shape {shape!r}")
        # Checked before allocating, so damaged sizes can never ask for more than the file holds.
        if (offset != self.offset or nbytes != math.prod(shape) * dtype.itemsize
                or offset + nbytes > self.data_len):
            raise ValueError(f"tensor bytes out of place ({offset=}, {nbytes=})")
        self.offset += nbytes
        tensor = torch.empty(shape, dtype=dtype, device=self.device)
        self.tensors.append(tensor)
        return tensor
