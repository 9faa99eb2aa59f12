"""Snapshot files: the state tree on disk, written atomically, read without running code.

A *tree* is nested ``dict`` (keys ``str`` or ``int``), ``list``, ``tuple``,
``None``, ``bool``, ``int`` (within int64/uint64), ``float``, ``str``,
``bytes`` and ``torch.Tensor`` (strided, any device: saved from a CPU copy,
loaded on the CPU). Subclasses are stored as their base type (an
``OrderedDict`` loads as a ``dict``, a ``bytearray`` as ``bytes``, a NamedTuple
as a ``tuple``) and a dataclass instance as a ``dict`` of its fields;
`from_file` puts a message back into the NamedTuple or dataclass its Input
declares.

File format, version 2 (all integers little-endian)::

    offset      size  field
    0           8     magic b"MUJOUSNP"
    8           4     format version, uint32 (2)
    12          8     S: structure length in bytes, uint64
    20          8     D: tensor data length in bytes, uint64
    28          4     CRC-32 of bytes 0..28 (so a damaged header is not taken for truncation)
    32          S     structure: one msgpack object (the tree)
    32+S        D     tensor data: each tensor's raw bytes (C order, native little-endian),
                      back to back, in the order the tensors appear in the structure
    32+S+D      4     CRC-32 of bytes 0..32+S+D, uint32

In the structure, a tuple is a msgpack array led by the tuple marker (extension
type 2, empty payload) and followed by its items; a tensor is extension type 1
whose payload is, little-endian: the dtype's code (uint8, its index in
``codec.DTYPE_CODES``: ``"float32"`` is 11), the number of dimensions ``n``
(uint8), the shape (``n`` int64), the offset of its bytes from the start of
the tensor data (uint64) and their length (uint64). Any other extension type,
a marker that does not lead an array, or an unknown dtype code, cannot be
decoded. The structure and the tensors are the tree codec's
(``mujou_actors.codec``: ``encode``, ``decode``); this module is the file
around them.

Version 1, which ``load`` still reads (``save`` writes version 2), has the same
layout; only the two extensions differ: a tuple is extension type 2 whose
payload is the msgpack array of its items, a tensor extension type 1 whose
payload is the msgpack array ``[dtype name, shape, offset, nbytes]`` (the name
as torch gives it without ``torch.``).

Limits (the codec's), which ``save`` and ``load`` apply alike (``save`` refuses what ``load``
would refuse): containers (dicts, lists, tuples) nest at most `MAX_DEPTH` (100)
levels; dict keys are str or int, each once per dict; a tensor has at most 255
dimensions. A version-2 structure is checked to be one complete msgpack value
before msgpack's C decoder makes anything, so its decoded objects take at most
`V2_MEMORY_PER_BYTE` (128) bytes of memory per byte of structure, whatever it
holds. A version-1 structure is parsed without recursion, its decoded objects
charged by a fixed model of CPython's object sizes and refused past
`MEMORY_PER_BYTE` (32) bytes per byte of structure plus `MEMORY_SLACK` (16 MiB).
No file, however nested, can overflow the stack.

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
import os
import secrets
import struct
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, TYPE_CHECKING, Any

import torch

from .codec import (
    FORMAT,
    MAX_DEPTH,
    MEMORY_PER_BYTE,
    MEMORY_SLACK,
    V2_MEMORY_PER_BYTE,
    decode,
    encode,
    raw_bytes,
    tensor_memory,
)
from .codec import file_problem as file_problem  # importable from here as before
from .codec import from_file as from_file
from .errors import SnapshotError, reason

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

# The functions users import (docs/reference.md) and the limits docs/state.md names (the
# codec's, named here too); the package's own helpers (dumps, loads, inspect_file, assemble,
# and file_problem and from_file, the codec's) stay importable.
__all__ = ["save", "load", "MAX_DEPTH", "MEMORY_PER_BYTE", "MEMORY_SLACK", "V2_MEMORY_PER_BYTE"]

MAGIC = b"MUJOUSNP"
VERSION = FORMAT
"""The format version `save` writes (2); `load` reads this one and every one before it.

A file's version is its structure's codec format (``codec.FORMAT``): the header and the
checksums have not changed since version 1."""

_HEAD = struct.Struct("<8sIQQ")  # magic, version, S, D
_CRC = struct.Struct("<I")
_HEADER_LEN = _HEAD.size + _CRC.size  # 32
_MIN_LEN = _HEADER_LEN + _CRC.size  # header and trailer
_CHUNK = 4 << 20  # read/write and CRC in pieces that stay in the CPU cache



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
            deeper than `MAX_DEPTH`. Nothing is written.
        OSError: the file cannot be written (the message names ``path``, also
            for a full disk); an existing file is left as it was.
    """
    structure, tensors = encode(tree)  # every TypeError is raised before the disk is touched
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
    what = exc.strerror or reason(exc)
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
    structure, tensors = encode(tree)
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
        size, version, structure_len, data_len, crc = _read_header(f, name)
        structure = f.read(structure_len)
        _check_rest(f, zlib.crc32(structure, crc), data_len, name)
        tree, tensors = _decode(structure, data_len, "meta", name, version)
    return {"version": version, "size": size, "structure_bytes": structure_len,
            "tensors": len(tensors), "tensor_bytes": data_len, "tree": tree}


# -- writing ------------------------------------------------------------------------------


def assemble(structure: bytes, data: Sequence[ReadableBuffer] = (), data_len: int = 0) -> bytes:
    """A snapshot file's bytes, from a structure and its tensor data already in memory.

    What `dumps` makes, for a caller that encoded the tree itself (``codec.encode``,
    or a structure packed its own way) and holds its tensors' bytes: the
    header, the structure, the data and the checksum joined once, with no
    file-like buffer (a recording's message records).

    Args:
        structure (bytes): the structure (one msgpack object, as ``codec.encode``
            makes it).
        data (Sequence): the tensor data, in pieces (``bytes``, ``memoryview``, a
            ctypes array: anything with the buffer protocol), in order. Default:
            none.
        data_len (int): the pieces' total length, bytes (the caller knows it;
            not checked here). Default 0.

    Returns:
        bytes: the file's bytes, which `loads` reads.
    """
    head = _header(len(structure), data_len)
    if not data:  # the short way: a recording's scalar messages
        body = head + structure
        return body + _CRC.pack(zlib.crc32(body))
    crc = zlib.crc32(structure, zlib.crc32(head))
    for part in data:
        crc = zlib.crc32(part, crc)
    return b"".join((head, structure, *data, _CRC.pack(crc)))


def _header(structure_len: int, data_len: int) -> bytes:
    """The 32 bytes of a file's header: magic, version, S, D and their CRC."""
    head = _HEAD.pack(MAGIC, VERSION, structure_len, data_len)
    return head + _CRC.pack(zlib.crc32(head))


def _write(f: IO[bytes], structure: bytes, tensors: list[tuple[torch.Tensor, int]]) -> None:
    data_len = sum(n for _, n in tensors)
    head = _header(len(structure), data_len)
    f.write(head)
    f.write(structure)
    crc = _stream(f.write, _tensor_chunks(tensors), zlib.crc32(structure, zlib.crc32(head)),
                  data_len)
    f.write(_CRC.pack(crc))


def _tensor_chunks(tensors: list[tuple[torch.Tensor, int]]) -> Iterator[memoryview]:
    for tensor, nbytes in tensors:
        data = raw_bytes(tensor)  # made only when reached: few tensor copies alive at a time
        if data.nbytes != nbytes:
            raise RuntimeError("a tensor was resized while it was being saved")
        yield from _split(data)




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


def _read(f: io.BufferedReader | io.BytesIO, name: str) -> Any:
    """The tree of the open snapshot file ``f`` (``name`` for the messages): see `load`."""
    _, version, structure_len, data_len, crc = _read_header(f, name)
    structure = f.read(structure_len)
    crc = zlib.crc32(structure, crc)
    tree, tensors = _decode(structure, data_len, "cpu", name, version,
                            lambda: _rest_matches(f, crc, data_len))
    # Read straight into each tensor's memory: no extra copy.
    chunks = (chunk for tensor in tensors for chunk in _split(tensor_memory(tensor)))
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


def _not_a_snapshot(f: IO[bytes], head: bytes, size: int) -> str:
    """Why a file whose start is not the magic is no snapshot, in words.

    A supervisor's snapshot folder holds a ``latest`` file that names its newest
    snapshot (``snapshot-<time_ns>.mujou``, `supervisor.latest_snapshot`): loading
    it is a likely slip, told as such.
    """
    if size <= 256:
        f.seek(0)
        text = f.read().decode("ascii", "replace").strip()
        if text.startswith("snapshot-") and text.endswith(".mujou") and "/" not in text:
            return (f"not a mujou snapshot but a snapshot folder's pointer to its newest "
                    f"snapshot, {text}: load that file of the folder (its path is "
                    f"mujou.latest_snapshot(folder))")
    return f"not a mujou snapshot (starts with {head[:8]!r})"


def _read_header(f: IO[bytes], name: str) -> tuple[int, int, int, int, int]:
    """Checks the header against the file size; returns (size, version, S, D, header CRC)."""
    size = f.seek(0, io.SEEK_END)
    f.seek(0)
    head = f.read(_HEADER_LEN)
    if head[:8] != MAGIC[: len(head)]:
        raise SnapshotError(f"{name}: {_not_a_snapshot(f, head, size)}")
    # The version comes before anything else: a newer format may lay out the rest differently.
    version = struct.unpack_from("<I", head, 8)[0] if len(head) >= 12 else 0
    if version > VERSION and len(head) >= _HEADER_LEN and _damaged_version(head) is not None:
        raise SnapshotError(f"{name}: corrupted (header checksum mismatch; its version field "
                            f"reads {version}, a damaged {_damaged_version(head)})")
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
    return size, version, structure_len, data_len, zlib.crc32(head)


def _damaged_version(head: bytes) -> int | None:
    """The version a header whose version reads newer had before that field was damaged.

    Its checksum then fits the header once the version reads that one (1 to `VERSION`)
    again, and not as it is: a flipped bit there must not pass for a file from a newer
    mujou_actors. None when no known version fits.
    """
    stored = _CRC.unpack_from(head, _HEAD.size)[0]
    if zlib.crc32(head[: _HEAD.size]) == stored:
        return None  # the header is as it was written: a newer format's (or its look-alike)
    for known in range(1, VERSION + 1):
        repaired = head[:8] + struct.pack("<I", known) + head[12 : _HEAD.size]
        if zlib.crc32(repaired) == stored:
            return known
    return None


def _decode(structure: bytes, data_len: int, device: str, name: str, version: int,
            checksum_ok: Callable[[], bool] | None = None) -> tuple[Any, list[torch.Tensor]]:
    """Decodes the structure (`codec.decode`); a failure is a checksum mismatch when it is one.

    ``checksum_ok`` (reading the rest of the file) is asked only when the structure does not
    decode: a damaged file is then reported as damaged, not as the first oddity its damage made.
    """
    try:
        return decode(structure, data_len, device, version)
    except Exception as e:  # anything the bytes can make the parser or torch raise
        if checksum_ok is not None and not checksum_ok():
            raise SnapshotError(f"{name}: corrupted (checksum mismatch)") from None
        raise SnapshotError(f"{name}: corrupted: cannot decode the structure: "
                            f"{reason(e)}") from e


