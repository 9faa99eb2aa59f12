"""Port messages between group processes: the encoding of the data plane.

A *batch* is a list of *items* ``(t_ns, delta, sender, port, message)``: the
time and delta cycle of the sending hook, the sender's order in the net, the
index of the port the message is for (an index both sides agree on, into the
``declared`` sequence of the port types) and the message. `Encoder.encode`
turns a batch into the frames of one ZeroMQ multipart message;
`Decoder.decode` turns them back into the batch, each message as the type its
port declares and bit for bit as it was sent. Messages are encoded with the
tree codec (``mujou_actors.codec``: msgpack, tensors as raw bytes, never
pickle; `codec.encode_batch`, `codec.decode_batch`), as a snapshot file holds
them but without its header and checksum, so what crosses is what a snapshot
file holds: None, bool, int (int64/uint64), float, str, bytes, list, tuple,
dict (str and int keys) and ``torch.Tensor`` (strided, every dtype the format
names), nested at most ``codec.MAX_DEPTH`` levels, and a NamedTuple or
dataclass of those where the port declares exactly that class.
`crossing_problem` says, at connect time, whether a port's declared type can
cross at all; `Encoder.encode` refuses a message that would not come back as
itself (a subclass, a NamedTuple inside a list, an ``OrderedDict``).

Frames (all integers little-endian)::

    frame 0       offset      size  field
                  0           4     magic b"MJW2" (the wire format, version 2)
                  4           4     n: items, uint32
                  8           4     k: tensors in shared memory, uint32
                  12          2     a: length of the shared-memory pool's name, uint16
                  14          a     the pool's name, ASCII (a file in /dev/shm; empty if k == 0)
                  14+a        32n   t_ns[n], delta[n], sender[n], port[n]: int64 each
                  14+a+32n    32k   per tensor in shared memory: its index among the
                                    batch's tensors, its block's id, the block's offset
                                    in the pool and the tensor's nbytes: int64 each
                  14+a+32n+32k      the n messages: one msgpack array, in the codec's
                                    format 2 (a snapshot file's version 2: tensors as its
                                    extension 1, tuples led by extension 2)
    frames 1...                     the other tensors' raw bytes (C order), in the order of
                                    the tensors: consecutive small ones joined in one frame,
                                    each of at least `OWN_FRAME` bytes in a frame of its own

A tensor's bytes are copied once on each side: the encoder copies small ones
into a joined frame, or a large one into a shared-memory block, and hands a
large inline one over as a view of its memory (`dataplane` sends a batch with
``copy=False`` when one of its frames reaches pyzmq's ``COPY_THRESHOLD``, and
copies the small ones, which costs less than zero-copy frames); the decoder copies each
into a tensor of its own (``torch.empty``: contiguous, writable, resizable,
sharing memory with nothing), but a ``zero_copy`` decoder makes a tensor in
shared memory a view of its block instead (contiguous, writable, not
resizable: the block is the reader's until the tensor is gone). A tensor on
a CUDA device is copied to the CPU by the encoder; the receiving kernel puts
it on its own device. A
non-contiguous tensor comes back contiguous, with the same elements.

Shared memory (one machine): an `Encoder` given a ``prefix`` owns a pool of
``pool_bytes`` (default `POOL_BYTES`, 64 MiB) in one file of ``/dev/shm``
named ``<prefix><pid>-<random>``, made on first use; a tensor of at least
``shm_threshold`` bytes (default `SHM_THRESHOLD`, 64 KiB) goes into a block of
it, and frame 0 carries the block's descriptor. The `Decoder` maps the pool
(read only), copies the tensor out and records the block as free; a
``zero_copy`` one maps it read-write, makes the tensor a view of the block
(``torch.frombuffer`` over a slice of the mapping, the tensor's storage its
only holder) and records the block as free when a weak reference to that
slice says the storage is gone, on whichever thread let it go. The caller
carries `Decoder.take_freed`'s ids back to the sender (on its own reply path;
no acknowledgement per message; `Decoder.on_freed` tells a reader that never
answers when to give them back anyway) and gives them to `Encoder.release`.
A pool whose sender restarted is let go of, and stays mapped until its last
view goes; its blocks' ids are never given to the new pool. When the
pool has no room, the tensor goes inline: `Encoder.encode` never blocks and
never drops. Pages are reserved (``posix_fallocate``) before they are written,
so a full ``/dev/shm`` sends tensors inline instead of killing the sender with
SIGBUS. The pool is a plain file, mapped with ``mmap``: no
``multiprocessing.resource_tracker`` is involved. `Encoder.close` unlinks it;
a sender killed before that leaves it behind, and `remove_blocks` removes every
pool of a prefix. Without ``/dev/shm`` (not Linux), everything goes inline.

CUDA IPC (one machine, `cudaipc`): an Encoder whose ``shared`` is a
`cudaipc.Exporter` writes no bytes for the placeholders that
`cudaipc.Exporter.prepare` put in CUDA tensors' places; `Encoder.take_shared`
gives their descriptors, which the link carries beside the frames, and a
Decoder whose ``shared`` is a `cudaipc.Importer` (or the host's
`cudaipc.Relay`) takes them as ``decode(..., shared)``. The frames' format is
unchanged: such a tensor is in the messages and has no data.

Decoding takes untrusted bytes and is bounded: the messages are decoded by
msgpack's C decoder once they are proven one complete value
(`codec.decode_batch`: at most ``codec.MAX_DEPTH`` levels, decoded objects of
at most ``codec.V2_MEMORY_PER_BYTE`` bytes per byte of the msgpack part), and
tensors are allocated only for bytes that are there:
at most the data frames' total length plus the mapped pool's size (the
tensors in shared memory of one batch take at most the pool). Frames that do
not decode raise `WireError` naming what was wrong. There is no checksum (the
transport delivers whole frames): damage that leaves a valid batch, a flipped
bit inside a number or a tensor's data, is not seen.

Neither class is thread-safe: each is used by one thread at a time, but
`Decoder.take_freed` may be called from another thread than `Decoder.decode`
(a link's sends and reads come from any thread), and views are freed from any.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import secrets
import stat
import struct
import sys
import threading
import weakref
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..codec import (
    TensorSource,
    decode_batch,
    encode_batch,
    from_file,
    is_record_type,
    raw_bytes,
    type_problem,
)
from ..errors import WireError, reason

__all__ = ["Encoder", "Decoder", "crossing_problem", "remove_blocks", "Item",
           "SHM_THRESHOLD", "POOL_BYTES", "OWN_FRAME", "MAGIC"]

Item = tuple[int, int, int, int, Any]
"""One message of a batch: ``(t_ns, delta, sender, port, message)``."""

MAGIC = b"MJW2"
"""The first bytes of frame 0: the wire format, version 2 (processes of one install)."""

SHM_THRESHOLD = 64 << 10
"""Bytes from which a tensor goes through shared memory (when the pool has room)."""

POOL_BYTES = 64 << 20
"""Default size of an Encoder's shared-memory pool, bytes."""

OWN_FRAME = 16 << 10
"""Bytes from which an inline tensor gets a frame of its own (a view of its memory)."""

_HEAD = struct.Struct("<4sIIH")  # magic, n, k, a
_ROW = 4 * 8  # bytes per item of the envelope, and per row of the shared-memory table
_ALIGN = 4096  # blocks start on a page: whole pages reserved, copies aligned
_SHM_DIR = "/dev/shm"
# A pool's name, and a prefix of one: more than "mujou-" (one run's pools, not every run's),
# no "/" (a file of /dev/shm itself).
_NAME = re.compile(r"mujou-[A-Za-z0-9._-]+\Z")
_BIG = sys.byteorder == "big"
_memmove = ctypes.memmove
_string_at = ctypes.string_at


# ---------------------------------------------------------------------------
# Which port types cross


def crossing_problem(declared: type, path: str) -> str | None:
    """Why the messages of a port declared with ``declared`` cannot cross processes.

    A port crosses when its declared type is one the codec brings back as
    itself (`codec.type_problem`): ``object`` (any message: each is checked as it is
    encoded), None's type, ``bool``, ``int``, ``float``, ``str``, ``bytes``,
    ``list``, ``tuple``, ``dict``, ``torch.Tensor``, a NamedTuple class or a
    dataclass (their fields checked per message, like a container's items).
    Any other class cannot: ``complex`` and classes the codec does not hold,
    and subclasses of the plain types (an ``OrderedDict``, an ``IntEnum``, a
    Tensor subclass), which would come back as their base type.

    Args:
        declared (type): the port's declared message type (``Input(type_)``).
        path (str): the port's dotted path, for the message.

    Returns:
        str | None: the reason in words, naming the port (``port 'ctrl.gain'
        (declared complex): ...``), or None when its messages can cross.
    """
    why = type_problem(declared)
    if why is None:
        return None
    name = getattr(declared, "__qualname__", None) or repr(declared)
    return (f"port {path!r} (declared {name}): its messages cannot cross between group "
            f"processes: {why}")


# ---------------------------------------------------------------------------
# Encoding


class Encoder:
    """Encodes batches of port messages into frames, large tensors through shared memory.

    Args:
        prefix (str | None): the start of the shared-memory pool's name, e.g.
            ``"mujou-<run id>-<group>-"`` (``mujou-`` then at least one letter,
            digit, ``.``, ``_`` or ``-``); None (the default): no shared memory,
            every tensor inline.
        shm_threshold (int): bytes from which a tensor goes through shared
            memory. Default `SHM_THRESHOLD` (64 KiB).
        pool_bytes (int): size of the pool, bytes (0: no shared memory).
            Default `POOL_BYTES` (64 MiB). Memory is taken only as blocks are
            first used, and stays with the pool until `close`.

    Raises:
        ValueError: a prefix that is not of that form, or a negative size.
    """

    def __init__(self, prefix: str | None = None, *, shm_threshold: int = SHM_THRESHOLD,
                 pool_bytes: int = POOL_BYTES) -> None:
        if prefix is not None and (type(prefix) is not str or not _NAME.match(prefix)
                                   or len(prefix) > 200):
            raise ValueError(f"Encoder: prefix must be 'mujou-' followed by letters, digits, "
                             f"'.', '_' or '-' (1 to 194 of them), got {prefix!r}")
        if type(shm_threshold) is not int or shm_threshold < 1:
            raise ValueError(f"Encoder: shm_threshold must be an int >= 1, got {shm_threshold!r}")
        if type(pool_bytes) is not int or pool_bytes < 0:
            raise ValueError(f"Encoder: pool_bytes must be an int >= 0, got {pool_bytes!r}")
        self._prefix = prefix
        self._threshold = shm_threshold
        # No pool (yet): one is made at the first tensor that wants one, if it can be.
        self._pool: _Pool | None = None
        self._want_pool = prefix is not None and pool_bytes >= _ALIGN and os.path.isdir(_SHM_DIR)
        self._pool_bytes = pool_bytes - pool_bytes % _ALIGN
        self._closed = False
        # CUDA IPC (`cudaipc.Exporter`, set by the link on one machine): None, the host path.
        self.shared: Any = None
        self._shared_rows: list[list[Any]] = []

    @property
    def pool_name(self) -> str | None:
        """str | None: the pool's file name in ``/dev/shm``; None while there is none."""
        return None if self._pool is None else self._pool.name

    @property
    def shm_in_use(self) -> int:
        """int: bytes of the pool in blocks not released yet (whole pages)."""
        return 0 if self._pool is None else self._pool.in_use

    @property
    def shm_blocks(self) -> int:
        """int: blocks of the pool not released yet."""
        return 0 if self._pool is None else len(self._pool.live)

    def encode(self, items: Sequence[Item], declared: Sequence[type]) -> list[bytes | memoryview]:
        """The frames of one batch: frame 0 as bytes, then the inline tensors' bytes.

        Frames of at least `OWN_FRAME` bytes may be views of the messages'
        tensors (those on the CPU and contiguous, sent inline): with
        ``send_multipart(frames, copy=False)`` zmq reads them after the call
        returns, so those tensors must not be written until the message is
        out, which holds for messages (readers treat them as read-only). A
        tensor that goes through shared memory is copied here; the blocks of
        a batch that is not sent after all come back with `discard`.

        Args:
            items (Sequence[Item]): the batch, ``(t_ns, delta, sender, port,
                message)`` each; the four numbers are ints within int64.
            declared (Sequence[type]): each port's declared type, by port index
                (the receiver decodes with the same sequence). A top-level
                NamedTuple or dataclass message crosses only to a port that
                declares exactly its class.

        Returns:
            list[bytes | memoryview]: the frames, for ``send_multipart``.

        Raises:
            TypeError: an item is not five values, its numbers are not ints
                within int64, or a message cannot cross or would not come back
                as itself; the message names the item, its port and the key
                path (``item 3 (port 7): message['pose']: ...``).
            ValueError: a port index outside ``declared``, or a message nested
                deeper than ``codec.MAX_DEPTH``.
            RuntimeError: the encoder is closed.
        """
        if self._closed:
            raise RuntimeError("Encoder.encode: the encoder is closed")
        n = len(items)
        envelope = array("q")
        if n:
            try:
                ts, ds, ss, ps, ms = zip(*items, strict=True)
            except ValueError:
                bad = next(i for i, item in enumerate(items) if len(item) != 5)
                raise TypeError(f"item {bad} of the batch is not (t_ns, delta, sender, port, "
                                f"message): {len(items[bad])} values") from None
            try:
                envelope.extend(ts)
                envelope.extend(ds)
                envelope.extend(ss)
                envelope.extend(ps)
            except (TypeError, OverflowError):
                raise TypeError("the items' t_ns, delta, sender and port must be ints within "
                                "int64") from None
            if min(ps) < 0 or max(ps) >= len(declared):
                bad = next(i for i, p in enumerate(ps) if not 0 <= p < len(declared))
                raise ValueError(f"item {bad}: port {ps[bad]} is not an index of the "
                                 f"{len(declared)} declared port types")
        else:
            ps = ms = ()
        tensors: list[tuple[torch.Tensor, int]] = []
        body = encode_batch(ms, ps, declared, tensors)
        frames: list[bytes | memoryview] = [b""]
        rows = self._place(tensors, frames) if tensors else None
        if _BIG:
            envelope.byteswap()
        if rows is None:
            head = _HEAD.pack(MAGIC, n, 0, 0)
            frames[0] = b"".join((head, envelope.tobytes(), body))
        else:
            assert self._pool is not None
            name = self._pool.name.encode()
            if _BIG:
                rows.byteswap()
            head = _HEAD.pack(MAGIC, n, len(rows) // 4, len(name))
            frames[0] = b"".join((head, name, envelope.tobytes(), rows.tobytes(), body))
        return frames

    def _place(self, tensors: list[tuple[torch.Tensor, int]],
               frames: list[bytes | memoryview]) -> array[int] | None:
        """Puts each tensor's bytes into shared memory or the frames; the shared-memory rows.

        Returns the rows of the shared-memory table (index, block id, offset, nbytes,
        flat), or None when no tensor went there. A failure gives the blocks taken back.
        """
        rows = array("q")
        run: list[bytes] = []  # consecutive small tensors' bytes, joined into one frame
        threshold = self._threshold
        shared = self.shared
        try:
            for j, (t, nbytes) in enumerate(tensors):
                if shared is not None and self._share(shared, t, nbytes, j):
                    continue
                data = None
                if nbytes >= threshold and self._want_pool:
                    data = _bytes_of(t, nbytes)
                    pool = self._pool if self._pool is not None else self._make_pool()
                    block = None if pool is None else pool.put(data)
                    if block is not None:
                        rows.extend((j, block[0], block[1], nbytes))
                        continue
                if nbytes < OWN_FRAME:
                    if nbytes:
                        run.append(_small_bytes(t, nbytes) if data is None else bytes(data))
                    continue
                if run:
                    frames.append(b"".join(run))
                    run = []
                frames.append(_bytes_of(t, nbytes) if data is None else data)
        except BaseException:
            self.release(rows[1::4])
            if shared is not None:
                shared.cancel(self.take_shared())
            raise
        if run:
            frames.append(b"".join(run))
        return rows or None

    def _share(self, shared: Any, t: torch.Tensor, nbytes: int, j: int) -> bool:
        """Whether tensor ``j`` crosses by CUDA IPC: its descriptor kept for `take_shared`."""
        if not hasattr(t, "_mujou_shared"):  # only `cudaipc.Exporter.prepare`'s placeholders
            return False
        row = shared.export(t, nbytes, j)
        if row is None:
            return False  # the host path: its bytes go as any tensor's
        self._shared_rows.append(row)
        return True

    def take_shared(self) -> list[list[Any]]:
        """The CUDA IPC descriptors of the batches encoded since the last call.

        The link carries them beside the frames (`dataplane`); the peer's
        `Decoder.decode` takes them as ``shared``. Empty without `shared`.

        Returns:
            list[list]: one descriptor per tensor that crossed by CUDA IPC
            (plain ints and bytes: `cudaipc.Exporter.export`).
        """
        rows, self._shared_rows = self._shared_rows, []
        return rows

    def _make_pool(self) -> _Pool | None:
        """The pool, made now; None (and no more tries) when the system refuses one."""
        assert self._prefix is not None
        try:
            self._pool = _Pool(f"{self._prefix}{os.getpid()}-{secrets.token_hex(4)}",
                               self._pool_bytes)
        except OSError:
            self._want_pool = False
        return self._pool

    def release(self, ids: Sequence[int]) -> None:
        """Returns blocks to the pool: the ids a `Decoder` reported with `Decoder.take_freed`.

        An id that names no block in use (released already, from before a
        restart, or damaged) is ignored.

        Args:
            ids (Sequence[int]): block ids.
        """
        if self._pool is not None:
            for block in ids:
                self._pool.give(block)

    def discard(self, frames: Sequence[Any]) -> None:
        """Returns the blocks of a batch this encoder made that will not be sent after all.

        Args:
            frames (Sequence): the batch's frames, as `encode` returned them
                (frame 0 is enough).
        """
        head = bytes(frames[0])
        _, n, k, a = _HEAD.unpack_from(head)
        start = _HEAD.size + a + _ROW * n
        rows = array("q")
        rows.frombytes(head[start : start + _ROW * k])
        if _BIG:
            rows.byteswap()
        self.release(rows[1::4])

    def close(self) -> None:
        """Unlinks the pool and releases its memory; idempotent. Later `encode` calls raise.

        A receiver that mapped the pool keeps its mapping (and may still copy
        blocks it was sent); one that had not yet cannot map it any more.
        """
        self._closed = True
        self._want_pool = False
        if self._pool is not None:
            self._pool.close()


def _small_bytes(t: torch.Tensor, nbytes: int) -> bytes:
    """A small tensor's bytes in C order, read at once from its memory when it is plain."""
    if t.is_cpu and t.is_contiguous() and not t.is_conj() and not t.is_neg():
        # A contiguous CPU tensor's ``nbytes`` bytes lie back to back from data_ptr.
        return _string_at(t.data_ptr(), nbytes)
    return bytes(_bytes_of(t, nbytes))


def _bytes_of(t: torch.Tensor, nbytes: int) -> memoryview:
    """The tensor's bytes in C order: a view of a plain CPU tensor's memory, else of a copy.

    A copy is made by `codec.raw_bytes` (on the CPU, conjugation and negation resolved,
    contiguous); a plain tensor is viewed with `_view`, which, unlike `codec.raw_bytes`,
    leaves its storage resizable (the message may still be read here).
    """
    if t.is_cpu and t.is_contiguous() and not t.is_conj() and not t.is_neg():
        return _view(t, nbytes)
    data = raw_bytes(t)
    if data.nbytes != nbytes:
        raise RuntimeError("a tensor was resized while it was being encoded")
    return data


def _view(t: torch.Tensor, nbytes: int) -> memoryview:
    """A writable view of the ``nbytes`` bytes of a contiguous CPU tensor, keeping it alive.

    Made with ctypes rather than numpy: ``Tensor.numpy()`` marks the storage as not
    resizable for good, which a received message must not be (`messages.sole_tensor`
    hands only resizable tensors over uncopied) nor a sent one become.
    """
    raw = (ctypes.c_char * nbytes).from_address(t.data_ptr())
    raw.tensor = t  # type: ignore[attr-defined]  # the view holds raw, raw holds the tensor
    return memoryview(raw).cast("B")


class _Pool:
    """An Encoder's shared-memory pool: one file in /dev/shm, mapped, cut into blocks.

    Blocks are whole pages, taken first-fit from a list of free extents
    (coalesced as they come back), each with an id that is never reused, so a
    late or repeated release is harmless. Pages are reserved with
    ``posix_fallocate`` before their first write.

    Args:
        name (str): the file's name in /dev/shm (created; it must not exist).
        size (int): the pool's size, bytes (a multiple of `_ALIGN`).

    Raises:
        OSError: the file cannot be made or mapped.
    """

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.path = os.path.join(_SHM_DIR, name)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(self.fd, size)
            self.map = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            os.unlink(self.path)
            raise
        self.view = memoryview(self.map)
        self.size = size
        self.reserved = 0  # bytes from 0 reserved with posix_fallocate
        self.free: list[list[int]] = [[0, size]]  # [offset, size] extents, by offset
        self.live: dict[int, tuple[int, int]] = {}  # block id -> (offset, size)
        self.next_id = 1
        self.in_use = 0

    def put(self, data: memoryview) -> tuple[int, int] | None:
        """Copies bytes into a new block; (block id, offset), or None without room."""
        nbytes = data.nbytes
        need = -(-nbytes // _ALIGN) * _ALIGN
        free = self.free
        k = 0
        while k < len(free) and free[k][1] < need:  # first fit
            k += 1
        if k == len(free):
            return None
        extent = free[k]
        offset = extent[0]
        end = offset + need
        if end > self.reserved:
            try:
                os.posix_fallocate(self.fd, self.reserved, end - self.reserved)
            except OSError:  # /dev/shm is full: this tensor goes inline
                return None
            self.reserved = end
        if extent[1] == need:
            del free[k]
        else:
            extent[0] += need
            extent[1] -= need
        block = self.next_id
        self.next_id += 1
        self.live[block] = (offset, need)
        self.in_use += need
        self.view[offset : offset + nbytes] = data
        return block, offset

    def give(self, block: int) -> None:
        """Frees a block (an unknown id is ignored), merging it with free neighbours."""
        got = self.live.pop(block, None) if type(block) is int else None
        if got is None:
            return
        offset, size = got
        self.in_use -= size
        free = self.free
        k = bisect_left(free, [offset, 0])
        if k < len(free) and free[k][0] == offset + size:  # merge the next extent
            size += free[k][1]
            del free[k]
        if k and free[k - 1][0] + free[k - 1][1] == offset:  # into the previous one
            free[k - 1][1] += size
        else:
            free.insert(k, [offset, size])

    def close(self) -> None:
        """Unmaps and unlinks the pool; idempotent."""
        if self.fd < 0:
            return
        self.view.release()
        self.map.close()
        os.close(self.fd)
        self.fd = -1
        try:
            os.unlink(self.path)
        except FileNotFoundError:  # remove_blocks got there first
            pass


def remove_blocks(prefix: str) -> int:
    """Removes every shared-memory pool whose name starts with ``prefix``.

    For the end of a run: a sender killed before `Encoder.close` leaves its
    pool behind. Mappings other processes still hold stay valid until they
    close them.

    Args:
        prefix (str): the prefix given to the run's Encoders (``mujou-`` and
            more: it never matches files of other programs).

    Returns:
        int: how many files were removed (0 without ``/dev/shm``).

    Raises:
        ValueError: the prefix is not of the form `Encoder` takes.
    """
    if type(prefix) is not str or not _NAME.match(prefix) or len(prefix) > 200:
        raise ValueError(f"remove_blocks: not a prefix of mujou's pools: {prefix!r}")
    try:
        names = os.listdir(_SHM_DIR)
    except OSError:
        return 0
    removed = 0
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(_SHM_DIR, name))
            except FileNotFoundError:
                continue
            removed += 1
    return removed


# ---------------------------------------------------------------------------
# Decoding


class Decoder:
    """Decodes the frames of `Encoder.encode` into the batch; shared memory copied or viewed.

    Args:
        prefix (str | None): when given, the only shared-memory pools this
            decoder maps are those whose names start with it (the sender's
            `Encoder` prefix); None: any pool of mujou's (``mujou-...``).
        zero_copy (bool): a tensor that came through shared memory is a view
            of its block (mapped read-write), not a copy: its block is freed
            (`take_freed`) once the tensor's storage is gone, every view of it
            included. Default False: copied out, the block freed at once.

    Raises:
        ValueError: a prefix that is not of the form `Encoder` takes.
    """

    def __init__(self, prefix: str | None = None, *, zero_copy: bool = False) -> None:
        if prefix is not None and (type(prefix) is not str or not _NAME.match(prefix)):
            raise ValueError(f"Decoder: not a prefix of mujou's pools: {prefix!r}")
        self._prefix = prefix or "mujou-"
        self._zero_copy = bool(zero_copy)
        self._pool: _Mapping | None = None  # the one mapped
        self._on_freed: Any = None
        self._restores: dict[type, bool] = {}  # declared type -> from_file puts it back
        # CUDA IPC (`cudaipc.Importer` in a group, `cudaipc.Relay` in the host), set by the
        # link on one machine; None: a batch with descriptors is refused.
        self.shared: Any = None

    def decode(self, frames: Sequence[Any], declared: Sequence[type],
               shared: Any = None) -> list[Item]:
        """The batch that ``frames`` hold, each message as its port's declared type.

        Args:
            frames (Sequence): the frames of one multipart message: ``bytes``,
                ``memoryview``, ``zmq.Frame`` or anything with the buffer
                protocol.
            declared (Sequence[type]): each port's declared type, by port index
                (the sequence the sender encoded with).
            shared (list | None): the CUDA IPC descriptors the sender's
                `Encoder.take_shared` gave for this batch (see `cudaipc`);
                None or empty: none.

        Returns:
            list[Item]: the items, in the order they were encoded. Tensors are
            on the CPU, contiguous, writable, and no other object's: a copy
            (resizable), or with ``zero_copy`` a view of its shared-memory
            block, which the sender writes again only after `take_freed` gave
            it back (not resizable); one that crossed by CUDA IPC is on its
            CUDA device (contiguous, of its own), or, in the host
            (`cudaipc.Relay`), an unfilled CPU placeholder that the host's
            encoder forwards.

        Raises:
            WireError: the frames are not a batch of this format, are truncated
                or damaged (the message says what and where), name a port
                outside ``declared`` or a message that is not of its port's
                type, or name a shared-memory pool that is gone.
        """
        if not frames:
            raise WireError("no frames: a batch has at least its frame 0")
        head = frames[0]
        if type(head) is not bytes:
            head = bytes(head)
        if len(head) < _HEAD.size or head[:4] != MAGIC:
            raise WireError(f"frame 0 is not a batch of port messages (it starts with "
                            f"{head[:8]!r}; a batch starts with {MAGIC!r})")
        _, n, k, a = _HEAD.unpack_from(head)
        pos = _HEAD.size + a
        start = pos + _ROW * (n + k)
        if len(head) < start:
            raise WireError(f"frame 0 is truncated: {len(head)} bytes, its header says at least "
                            f"{start} ({n} items, {k} tensors in shared memory)")
        numbers = array("q")
        numbers.frombytes(head[pos:start])
        if _BIG:
            numbers.byteswap()
        values = numbers.tolist()
        rows = values[4 * n:]
        data = [f if type(f) is bytes else _byte_view(f) for f in frames[1:]]
        inline = sum(len(f) for f in data)
        pool = self._rows(head[_HEAD.size:pos], rows) if k else None
        # Blocks not viewed yet: whatever happens next, they are freed at the end (a
        # view's block is freed when its tensor goes), never read again.
        unviewed = dict(zip(rows[1::4], rows[3::4], strict=True)) if pool is not None else None
        ipc = None
        source = None
        if unviewed and self._zero_copy:
            assert pool is not None
            source = pool.source(rows, unviewed)
        try:
            shm_bytes = sum(rows[3::4])
            ipc = self._shared_rows(shared) if shared else None
            if ipc:
                shm_bytes += sum(row[12] for row in ipc.values())
            try:
                messages, tensors = decode_batch(head, start, n, inline + shm_bytes, source)
            except Exception as e:  # noqa: BLE001 - anything the bytes make the parser raise
                raise WireError(f"frame 0: the messages do not decode: {reason(e)}") from None
            if tensors:
                self._fill(tensors, data, rows, pool, ipc, unviewed)
        finally:
            if unviewed:
                assert pool is not None
                for block, nbytes in unviewed.items():
                    pool.free(block, nbytes)
        if ipc:
            messages = self._open_shared(messages, tensors, ipc)
        return self._items(values, n, messages, declared)

    def _shared_rows(self, shared: Any) -> dict[int, list[Any]]:
        """The CUDA IPC descriptors by tensor index, checked (`cudaipc.check_rows`)."""
        if self.shared is None:
            raise WireError("a batch with CUDA IPC descriptors on a link without CUDA IPC")
        from .cudaipc import check_rows  # only links with CUDA IPC get here

        return check_rows(shared)

    def _open_shared(self, messages: list[Any], tensors: list[torch.Tensor],
                     ipc: dict[int, list[Any]]) -> list[Any]:
        """The messages with each shared tensor's placeholder opened (or tagged, the host)."""
        if max(ipc) >= len(tensors):
            raise WireError(f"a CUDA IPC descriptor names tensor {max(ipc)} of {len(tensors)}")
        got = self.shared.take(tensors, ipc)
        if not got:
            return messages
        from .cudaipc import swap

        return swap(messages, got)

    def _rows(self, name: bytes, rows: list[int]) -> _Mapping:
        """Checks the shared-memory table against the pool it names; the pool's mapping."""
        pool = self._map(name)
        view = pool.view
        total = 0
        last = -1
        for r in range(0, len(rows), 4):
            index, block, offset, nbytes = rows[r : r + 4]
            if index <= last or nbytes < 1 or offset < 0 or offset + nbytes > len(view):
                raise WireError(f"frame 0: shared-memory row {r // 4} is out of place "
                                f"(tensor {index}, offset {offset}, {nbytes} bytes, in a pool "
                                f"of {len(view)})")
            last = index
            total += nbytes
        if total > len(view):
            raise WireError(f"frame 0: {total} bytes of tensors in shared memory, more than the "
                            f"pool's {len(view)}")
        if len(rows) > 4:  # two tensors in one block, or in blocks that overlap: refused
            spans = sorted(zip(rows[2::4], rows[3::4], rows[1::4], strict=True))
            if len({block for _, _, block in spans}) < len(spans) or any(
                    a[0] + a[1] > b[0] for a, b in zip(spans, spans[1:], strict=False)):
                raise WireError("frame 0: two tensors in shared memory share a block or "
                                "overlap (a view of one would write the other)")
        return pool

    def _map(self, raw: bytes) -> _Mapping:
        """The pool named ``raw``, mapped now if it is a new one (its sender restarted:
        the old one is not read again; views of it keep it mapped until they go)."""
        try:
            name = raw.decode("ascii")
        except UnicodeDecodeError:
            name = ""
        if self._pool is not None and self._pool.name == name:
            return self._pool
        if not _NAME.match(name) or not name.startswith(self._prefix):
            raise WireError(f"frame 0 names the shared-memory pool {raw!r}, not one of "
                            f"{self._prefix!r}")
        writable = self._zero_copy  # a view's tensor is writable, as a copy is
        try:
            fd = os.open(os.path.join(_SHM_DIR, name), os.O_RDWR if writable else os.O_RDONLY)
        except OSError as e:
            raise WireError(f"the shared-memory pool {name} cannot be opened ({reason(e)}): "
                            "its sender is gone?") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
                raise WireError(f"the shared-memory pool {name} is not a pool")
            mapped = mmap.mmap(fd, info.st_size,
                               access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self._unmap()  # a new pool: its sender restarted; the old one is not used again
        self._pool = _Mapping(name, mapped, self._on_freed)
        return self._pool

    def _fill(self, tensors: list[torch.Tensor], data: list[Any], rows: list[int],
              pool: _Mapping | None, ipc: dict[int, list[Any]] | None = None,
              unviewed: dict[int, int] | None = None) -> None:
        """Puts each tensor's bytes in: copied from its shared-memory block (unless the
        tensor is a view of it already, its block no more in ``unviewed``) or from the
        next frame.

        The tensors in ``ipc`` (CUDA IPC descriptors by index) have no bytes here.
        """
        shm = {rows[r]: (rows[r + 1], rows[r + 2], rows[r + 3]) for r in range(0, len(rows), 4)}
        if shm and max(shm) >= len(tensors):
            raise WireError(f"frame 0: a shared-memory row names tensor {max(shm)} of "
                            f"{len(tensors)}")
        frame = -1
        src: Any = b""
        at = end = 0
        for j, t in enumerate(tensors):
            nbytes = t.nbytes
            if j in shm:
                block, offset, size = shm[j]
                if size != nbytes:
                    raise WireError(f"frame 0: tensor {j} has {nbytes} bytes, its shared-memory "
                                    f"row says {size}")
                assert pool is not None and unviewed is not None
                if block in unviewed:  # else made a view of it already (`_Mapping.source`)
                    _view(t, nbytes)[:] = pool.view[offset : offset + nbytes]
                continue
            if ipc and j in ipc:
                if ipc[j][12] != nbytes:
                    raise WireError(f"tensor {j} has {nbytes} bytes, its CUDA IPC descriptor "
                                    f"says {ipc[j][12]}")
                continue
            if not nbytes:
                continue
            while at == end and frame + 1 < len(data):
                frame += 1
                src = data[frame]
                at, end = 0, len(src)
            if at + nbytes > end:
                raise WireError(f"tensor {j} ({nbytes} bytes) runs past the end of frame "
                                f"{frame + 1} ({end} bytes)")
            if type(src) is bytes and nbytes < OWN_FRAME:
                # A fresh contiguous tensor of exactly nbytes, from a slice of exactly nbytes.
                _memmove(t.data_ptr(), src[at : at + nbytes], nbytes)
            else:
                _view(t, nbytes)[:] = memoryview(src)[at : at + nbytes]
            at += nbytes
        if at != end or frame + 1 != len(data):
            raise WireError(f"the data frames hold {end - at} bytes after the last tensor in "
                            f"frame {frame + 1}, and {len(data) - frame - 1} more frames")

    def _items(self, values: list[int], n: int, messages: list[Any],
               declared: Sequence[type]) -> list[Item]:
        """The items, each message checked against its port's type (put back into it)."""
        restores = self._restores
        ports = values[3 * n : 4 * n]
        count = len(declared)
        for i, p in enumerate(ports):
            if not 0 <= p < count:
                raise WireError(f"item {i}: port {p} is not an index of the {count} declared "
                                "port types")
            kind = declared[p]
            if kind is object:
                continue
            again = restores.get(kind)
            if again is None:
                again = restores[kind] = is_record_type(kind)
            if again:
                messages[i] = from_file(messages[i], kind)
            if not isinstance(messages[i], kind):
                raise WireError(f"item {i}: a {type(messages[i]).__name__} for port {p}, which "
                                f"declares {kind.__name__}")
        # All n long (checked): zip's strict check would cost more than the rest of an item.
        return list(zip(values[:n], values[n : 2 * n], values[2 * n : 3 * n], ports, messages,
                        strict=False))

    def take_freed(self) -> list[int]:
        """The ids of the blocks freed since the last call, for the sender's `Encoder.release`.

        A copied tensor's block is freed as it is decoded; a view's (``zero_copy``)
        once its storage is gone. Blocks of a pool mapped before the current one
        are never given: their ids mean nothing to the sender's new pool.
        Safe to call while other threads free views.

        Returns:
            list[int]: block ids (empty when none).
        """
        return [] if self._pool is None else self._pool.take()

    @property
    def on_freed(self) -> Callable[[], None] | None:
        """Callable | None: called, from the thread that frees them, once the blocks
        freed and not taken reach an eighth of the sender's pool (then not again
        until `take_freed`): the link's owner gives them back then rather than
        with its next frame, which a reader that never answers its sender does
        not send. None (the default): not called."""
        return self._on_freed

    @on_freed.setter
    def on_freed(self, notify: Callable[[], None] | None) -> None:
        self._on_freed = notify
        if self._pool is not None:
            self._pool.notify = notify

    @property
    def freed_due(self) -> bool:
        """bool: the blocks freed and not taken reach an eighth of the sender's pool (the
        link gives them back now, not with its next frame: `on_freed`)."""
        return self._pool is not None and self._pool.due()

    def _unmap(self) -> None:
        """Lets go of the pool's mapping, if any: unmapped now, or as its last view goes."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.close()

    def close(self) -> None:
        """Unmaps the shared-memory pool; idempotent. The decoder can still be used."""
        self._unmap()


class _Mapping:
    """A sender's pool as a `Decoder` maps it, and the blocks freed that it has not given.

    A tensor viewing a block (`place`) holds a slice of the mapping; a weak
    reference to that slice reports the block freed once the tensor's storage
    (the only holder of the slice) is gone, on whichever thread drops it. The
    mapping stays open while any slice lives (``mmap.close`` refuses then), so a
    view never outlives its memory.

    Args:
        name (str): the pool's file name.
        mapped (mmap.mmap): the pool, mapped.
        notify (Callable | None): called (from the freeing thread) once the freed
            bytes not taken reach an eighth of the pool, then not again until `take`.
    """

    def __init__(self, name: str, mapped: mmap.mmap, notify: Any) -> None:
        self.name = name
        self.map = mapped
        self.view = memoryview(mapped)
        self.notify = notify
        self.threshold = max(len(mapped) // 8, 1)
        self.freed: deque[int] = deque()
        self.pending = 0  # bytes freed and not taken
        self.told = False  # notify was called since the last take
        # pending, told: frees come from any thread, and from within a take or a free
        # of this one (a garbage collection run by an allocation there frees a tensor).
        self.lock = threading.RLock()
        self.views: dict[int, tuple[weakref.ref[memoryview], int, int]] = {}
        self.closed = False  # let go of by its decoder

    def source(self, rows: list[int], unviewed: dict[int, int]) -> TensorSource:
        """What `codec.decode_batch` asks for each tensor: a view of its block if it has
        one here (its block taken out of ``unviewed``), else None (a new tensor)."""
        where = {rows[r]: (rows[r + 1], rows[r + 2], rows[r + 3])
                 for r in range(0, len(rows), 4)}

        def view_of(index: int, shape: Sequence[int], dtype: torch.dtype,
                    nbytes: int) -> torch.Tensor | None:
            got = where.get(index)
            if got is None or got[2] != nbytes:  # no block, or the wrong size: `_fill` says
                return None
            block, offset, _ = got
            del unviewed[block]
            return self.place(shape, dtype, block, offset, nbytes)

        return view_of

    def place(self, shape: Sequence[int], dtype: torch.dtype, block: int, offset: int,
              nbytes: int) -> torch.Tensor:
        """A tensor (contiguous) viewing ``block``, which is freed as the tensor goes."""
        piece = self.view[offset : offset + nbytes]
        ref = weakref.ref(piece, self._gone)
        self.views[id(ref)] = (ref, block, nbytes)
        return torch.frombuffer(piece, dtype=dtype).reshape(shape)

    def _gone(self, ref: weakref.ref[memoryview]) -> None:
        """A view's slice is gone: its block is free (and a closed pool's last view ends
        its mapping; were that missed in a race with `close`, the collector ends it)."""
        _, block, nbytes = self.views.pop(id(ref))
        self.free(block, nbytes)
        if self.closed and not self.views:
            self.close()

    def free(self, block: int, nbytes: int) -> None:
        """Reports ``block`` (``nbytes``) freed, from any thread."""
        with self.lock:
            self.freed.append(block)
            self.pending += nbytes
            tell = self.notify is not None and not self.told and self.pending >= self.threshold
            if tell:
                self.told = True
        if tell:
            self.notify()

    def due(self) -> bool:
        """Whether the bytes freed and not taken reach the threshold."""
        return self.pending >= self.threshold

    def take(self) -> list[int]:
        """The blocks freed since the last take."""
        freed = self.freed
        taken = []
        with self.lock:
            while freed:
                taken.append(freed.popleft())
            self.pending = 0
            self.told = False
        return taken

    def close(self) -> None:
        """Unmaps the pool now if no view holds it; else as the last view goes."""
        self.closed = True
        self.view.release()
        try:
            self.map.close()
        except BufferError:  # views of it live: the mapping goes with the last of them
            pass


def _byte_view(frame: Any) -> Any:
    """A data frame as something to slice bytes from: small ones as bytes, big ones viewed."""
    view = memoryview(frame)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if len(view) < 4 * OWN_FRAME:
        return bytes(view)  # one copy of a few KiB, so that small tensors copy out at once
    return view
