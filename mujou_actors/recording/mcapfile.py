"""Recordings on disk: the mujou profile of MCAP, written and read record by record.

A recording is an `MCAP <https://mcap.dev>`_ file: foxglove-sdk's MCAP writer
(Rust) writes it, and this module's reader parses it record by record within
bounds (below). Its records follow these rules, format version 2 (`FORMAT`;
the reader also reads format 1, see below):

* **Header**: profile ``"mujou"`` (`PROFILE`); library the SDK's own string
  (``"foxglove-sdk-python/<v> mcap-rust/<v>"``; the package's version is in
  ``mujou.run``). The file is chunked (about 1 MiB a chunk, `CHUNK_SIZE`;
  compression none by default, ``"lz4"`` or ``"zstd"`` on request). Each chunk
  is handed to the operating system as soon as it is closed, so a file cut by
  a crash is readable up to its last complete chunk.
* **One channel per recorded Output**: topic the Output's path (``"sim.state"``),
  message encoding ``"mujou.snapshot"`` (`MESSAGE_ENCODING`); channel metadata
  (all str) ``node`` (the node's path), ``port`` (the port's name),
  ``sender_order`` (the node's order in the net, decimal), ``type`` (the
  declared message type as ``module:qualname``: ``builtins:float``,
  ``torch:Tensor``) and, for a tensor port that declares them, ``shape`` (JSON
  list, ``null`` for a free dimension) and ``dtype`` (``"float32"``). The
  channel record is written with the channel's first message (the SDK's way).
* **A schema per channel** (shared by channels that declare the same): name the
  declared type's ``module:qualname``, encoding ``"mujou.port"``
  (`SCHEMA_ENCODING`), data the UTF-8 JSON ``{"type", "shape", "dtype",
  "fields"}``; ``fields`` lists ``[name, type]`` pairs for a NamedTuple or a
  dataclass, else ``null``.
* **A** ``"mujou.channel"`` **metadata record per channel** (`CHANNEL_METADATA`),
  in the net's order, before any message: the channel's metadata plus
  ``mujou.topic``, ``mujou.message_encoding``, ``mujou.schema_name``,
  ``mujou.schema_encoding`` and ``mujou.schema`` (the schema's data as text).
  It declares the channels that got no message too, which have no channel
  record.
* **A message record per recorded send**: ``log_time`` = ``publish_time`` = the
  send's time on the run's timer (ns), ``sequence`` the writer's count of the
  channel's messages in the file from 1, ``data`` = ``snapshot.dumps([delta,
  sequence, message])`` (`encode_message`: msgpack with raw tensor bytes and a
  CRC, never pickle; a snapshot of version 2 now, of version 1 in files written
  before, which read all the same), ``delta`` the send's delta cycle and ``sequence`` the
  sender's count of its messages on the Output from 0 (a dropped message leaves
  a gap). A send made before the timer started (by ``on_start``, at the
  control key ``(-1, 0)``) is stored with ``log_time`` 0 and ``delta`` -1
  (`CONTROL_DELTA`); the reader gives its key back as ``t_ns=-1, delta=0``.
* **View channels** (``Recording(view=True)``): beside a recorded Output's
  channel, topic ``/view/<path>`` (`VIEW_PREFIX`), message encoding ``"json"``,
  schema encoding ``"jsonschema"`` (or Foxglove's ``foxglove.RawImage``),
  metadata ``mujou.view_of`` (`VIEW_OF`: the Output's path); each message the
  JSON view (`mujou_actors.recording.view`) of the lossless message written just before
  it, at the same time. Readers list them apart (`RecordingInfo.views`) and
  never decode them: they are for Foxglove, not for replay. A channel's metadata
  ``foxglove`` names the Foxglove schema its Output declares
  (``Output(dict, foxglove="foxglove.SceneUpdate")``), which its view takes.
* **The log channel** (``Recording(log=True)``): topic ``/mujou/log``
  (`foxlog.LOG_TOPIC`), message encoding ``"json"``, schema ``foxglove.Log``
  (encoding ``"jsonschema"``), metadata ``mujou.log`` (`LOG_MARK`); each
  message one of the run's log records, a ``foxglove.Log`` object, at its
  time on the run's timer. Readers list it apart (`RecordingInfo.logs`), read
  it with `Reader.logs` (each entry at most `foxlog.MAX_ENTRY_BYTES`, checked
  field by field), and never decode it as a port's message.
* **Metadata** ``"mujou.run"`` (`RUN_METADATA`, written first) and
  ``"mujou.end"`` (`END_METADATA`, written at a clean close, after the last
  chunk): str values, JSON where structured (see ``docs/recording.md`` for the
  keys).
* **Attachments**: the supervisor's snapshots, named ``snapshot-<t_ns>.mujou``,
  media type ``application/x-mujou-snapshot`` (`SNAPSHOT_MEDIA_TYPE`),
  ``log_time`` and ``create_time`` the snapshot's time, data the snapshot
  file's bytes; and each parameter set made on the running net, named
  ``param-<t_ns>-<delta>-<n>.json`` (``n`` the set's number in the file, from
  0, so that no two share a name), media type ``application/json``
  (`PARAM_MEDIA_TYPE`), data ``{"t_ns", "delta", "node", "name", "value"}``:
  the key the set applies from (``t_ns`` -1 before the start; ``log_time``
  then 0), the node's path, the parameter and its value (`attach_param`,
  `read_param`).

Format 1 (the first recordings, written with the ``mcap`` package's writer)
differs in three points: the header's library is ``"mujou_actors <version>"``,
a message's data is ``snapshot.dumps([delta, message])`` with the sender's
sequence (modulo 2**32) in the record's ``sequence``, and there are no
``mujou.channel`` records (every channel has a channel record, in the summary
at least).

Decoding never runs code from the file: messages come back through the
codec's bounded decoder (``mujou_actors.codec``, by way of ``snapshot.loads``),
and a NamedTuple or dataclass message is put back into the type its port
declares only when the reader is told that type (``types=``); otherwise it
comes back as a tuple or a dict, as from a snapshot file. This module
starts no thread and knows nothing of runs.

A file is untrusted (docs/recording.md, "Untrusted files"), and whatever it
holds, a reader raises `RecordingError` and nothing else for one that does
not read. Every length (a record's, a field's, a chunk's records') is checked
against the bytes that hold it before anything is read or allocated; every
CRC the file carries is checked (a chunk's uncompressed records, an
attachment, the data section and the summary; 0: not computed), a closed
file's data section and summary before its first record is given out. A
file that ends with its footer and the MCAP magic is closed, and a record
past its section is damage; one that does not was cut by a crash and reads
up to its last complete record, unless the record the end cuts short
contradicts its own length. One pass decompresses at most `MAX_EXPANSION`
(1000) bytes per byte of the file plus `EXPANSION_SLACK` (64 MiB), each frame
into a buffer of exactly its chunk's declared size; JSON nests at most
`MAX_JSON_DEPTH` (100) levels, found before it is parsed; times, deltas and
sequences are below `TIME_END` (2**63). ``allow_damaged=True`` reads a
damaged file up to its first damaged record instead, as a cut one.
"""

from __future__ import annotations

import ctypes
import dataclasses
import io
import json
import os
import re
import struct
import sys
import typing
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, Any, NamedTuple, TypeAlias

import msgpack
import torch
from mcap.records import Attachment, Channel, Header, Metadata, Schema

from ..codec import encode, from_file, raw_bytes, tensor_ext
from ..errors import RecordingError, SnapshotError, reason
from ..snapshot import assemble, dumps, loads
from .foxlog import LOG_SCHEMA, LOG_SCHEMA_NAME, LOG_TOPIC, MAX_ENTRY_BYTES, LogEntry, parse_entry

Buffer: TypeAlias = "bytes | memoryview | ctypes.Array[ctypes.c_char]"

# The module's own names; none is in the package's top-level namespace (docs/reference.md
# lists them under the module).
__all__ = [
    "ChannelSpec", "Writer", "Record", "ChannelInfo", "AttachmentInfo", "RecordingInfo",
    "Reader", "read", "info", "encode_message", "decode_message", "type_name", "LogEntry",
]

FORMAT = "2"
"""The version of the mujou profile this module writes (metadata ``mujou.run``, ``format``).

The reader reads format 1 as well (the first recordings, written with the ``mcap``
package's writer: the sender's sequence in the MCAP record's ``sequence``, a message's data
``[delta, message]``, no ``mujou.channel`` records) and format 2."""

PROFILE = "mujou"
MESSAGE_ENCODING = "mujou.snapshot"
SCHEMA_ENCODING = "mujou.port"
SNAPSHOT_MEDIA_TYPE = "application/x-mujou-snapshot"
PARAM_MEDIA_TYPE = "application/json"
PARAM_PREFIX = "param-"
VIEW_ENCODING = "json"
VIEW_SCHEMA_ENCODING = "jsonschema"
VIEW_PREFIX = "/view/"
"""A view channel's topic is this and the Output's path (``/view/sim.state``)."""
VIEW_OF = "mujou.view_of"
"""The metadata key of a view channel: the path of the Output it is a view of."""
LOG_MARK = "mujou.log"
"""The metadata key that marks the log channel (``/mujou/log``; its value: the schema's name)."""
FOXGLOVE = "foxglove"
"""The metadata key of a channel whose Output declares a Foxglove schema (its name)."""
RUN_METADATA = "mujou.run"
END_METADATA = "mujou.end"
CHANNEL_METADATA = "mujou.channel"
"""The name of the metadata record that declares a channel (format 2: one per channel)."""
CHUNK_SIZE = 1 << 20
"""Bytes of messages per chunk: a crash loses at most the chunk being filled."""

CONTROL_DELTA = -1
"""The delta stored for a send at the control key ``(-1, 0)`` (``log_time`` 0)."""

# -- limits on what a file may make a reader do (docs/recording.md, "Untrusted files") ------

MAX_EXPANSION = 1000
"""Bytes of decompressed chunk data one pass over a file may make per byte of the file."""

EXPANSION_SLACK = 64 << 20
"""Bytes of decompressed chunk data a pass may make on top of `MAX_EXPANSION` per byte (64 MiB)."""

MAX_JSON_DEPTH = 100
"""How deep a JSON value of a file (metadata, schema, view, capsule facts) may nest."""

TIME_END = 2**63
"""Times (ns), deltas and sequences of a file are below this (the run's int64 keys)."""

# The SDK's MCAPCompression member of each compression (None: chunks left as they are).
_COMPRESSIONS = {"none": None, "lz4": "Lz4", "zstd": "Zstd"}
# The keys of a ``mujou.channel`` record besides the channel's own metadata.
_TOPIC, _ENCODING = "mujou.topic", "mujou.message_encoding"
_SCHEMA_NAME, _SCHEMA_ENCODING, _SCHEMA = "mujou.schema_name", "mujou.schema_encoding", \
    "mujou.schema"
# encode_message's short way: the scalars a snapshot stores as msgpack stores them.
_SCALAR_TYPES = frozenset((type(None), bool, int, float, str, bytes))
_INT_MIN, _INT_END = -(2**63), 2**64
_packb = msgpack.packb
# A lone tensor's extension in the structure (meta, nbytes) by (dtype, shape): a channel's
# tensors mostly share both. At most 256 kept; mutated by one thread at a time (a writer).
_TENSOR_EXTS: dict[tuple[torch.dtype, torch.Size], tuple[msgpack.ExtType, int]] = {}


def _lazy_checks() -> Callable[[torch.Tensor], bool]:
    """Whether a tensor's memory does not hold its values (a lazy conjugate or negation).

    Read from the bits of those dispatch keys in the tensor's key set, which keeps the
    GIL; a torch without that API (private: torch._C) gets its own checks, which let it go.
    """
    try:
        keys = torch._C._dispatch_keys
        bits = (torch._C.DispatchKeySet(torch._C.DispatchKey.Negative)
                | torch._C.DispatchKeySet(torch._C.DispatchKey.Conjugate)).raw_repr()
    except AttributeError:
        return lambda t: t.is_conj() or t.is_neg()
    return lambda t: bool(keys(t).raw_repr() & bits)


_is_lazy = _lazy_checks()
# ctypes array types by size (the views _tensor_bytes makes); at most 256 kept.
_ARRAYS: dict[int, Any] = {}


def type_name(cls: Any) -> str:
    """A type as a recording names it: ``module:qualname`` (``builtins:float``).

    Args:
        cls (Any): a class; anything else (an annotation written as a string)
            is named by its ``str``.

    Returns:
        str: the name.
    """
    if isinstance(cls, type):
        return f"{cls.__module__}:{cls.__qualname__}"
    return str(cls)


def _fields(cls: type) -> list[list[str]] | None:
    """``[name, type]`` of a NamedTuple's or a dataclass's fields; None for other types.

    Annotations written as strings (``from __future__ import annotations``) are
    resolved as `typing.get_type_hints` does (in the class's module, which is
    already imported: this runs when a run is recorded, never on reading); one
    that does not resolve is named as written.
    """
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        names = list(cls._fields)
    elif dataclasses.is_dataclass(cls):
        names = [f.name for f in dataclasses.fields(cls)]
    else:
        return None
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - a name the annotation uses is missing: as written
        hints = dict(getattr(cls, "__annotations__", {}))
    return [[name, type_name(hints.get(name, "typing:Any"))] for name in names]


@dataclasses.dataclass(frozen=True)
class ChannelSpec:
    """What a recording says of one recorded Output (its channel and schema).

    Args:
        topic (str): the Output's path, ``"sim.state"``.
        node (str): the node's path, ``"sim"`` (``""`` for the root node).
        port (str): the port's name, ``"state"``.
        sender_order (int): the node's order in the net (what orders the sends
            of one instant).
        type (type): the declared message type.
        shape (tuple[int | None, ...] | None): a tensor port's declared shape.
        dtype (str | None): a tensor port's declared dtype (``"float32"``).
        foxglove (str | None): the Foxglove schema the Output declares for its
            view (``"foxglove.SceneUpdate"``), None if none.
    """

    topic: str
    node: str
    port: str
    sender_order: int
    type: type
    shape: tuple[int | None, ...] | None = None
    dtype: str | None = None
    foxglove: str | None = None

    @classmethod
    def of(cls, output: Any, node_path: str, order: int) -> ChannelSpec:
        """The spec of a bound Output (a `mujou_actors.Output` of a running net).

        Args:
            output (Output): the Output.
            node_path (str): its node's path.
            order (int): its node's order in the net.

        Returns:
            ChannelSpec: its channel.
        """
        dtype = None if output.dtype is None else str(output.dtype).removeprefix("torch.")
        return cls(output.path, node_path, output.name, order, output.type,
                   output.shape, dtype, getattr(output, "foxglove", None))

    def schema(self) -> dict[str, Any]:
        """The schema's JSON object: ``type``, ``shape``, ``dtype``, ``fields``."""
        return {"type": type_name(self.type),
                "shape": None if self.shape is None else list(self.shape),
                "dtype": self.dtype, "fields": _fields(self.type)}

    def metadata(self) -> dict[str, str]:
        """The channel's metadata (str to str), as the format defines it."""
        meta = {"node": self.node, "port": self.port, "sender_order": str(self.sender_order),
                "type": type_name(self.type)}
        if self.shape is not None:
            meta["shape"] = json.dumps(list(self.shape))
        if self.dtype is not None:
            meta["dtype"] = self.dtype
        if self.foxglove is not None:
            meta[FOXGLOVE] = self.foxglove
        return meta


def encode_message(delta: int, sequence: int, message: Any) -> bytes:
    """The data of a message record: the bytes of ``snapshot.dumps([delta, sequence, message])``.

    Made without `snapshot.dumps`'s file-like buffer: the header, the
    structure, each tensor's bytes (straight from its memory) and the checksum
    are joined once. A scalar or a lone plain tensor takes a shorter way still,
    to the same bytes.

    Args:
        delta (int): the send's delta cycle (`CONTROL_DELTA` for the control key).
        sequence (int): the sender's count of the message on its Output, from 0.
        message (Any): the message, as its readers got it (tensors on any device:
            a CPU copy is written).

    Returns:
        bytes: the record's data.

    Raises:
        TypeError: the message holds something a snapshot file cannot (its key
            path is named).
        ValueError: the message is beyond a snapshot file's limits.
    """
    mt = type(message)
    try:
        if mt in _SCALAR_TYPES and (mt is not int or _INT_MIN <= message < _INT_END):
            return assemble(_packb([delta, sequence, message]))
        if mt is torch.Tensor and message.layout == torch.strided and not message.is_meta:
            key = (message.dtype, message.shape)
            known = _TENSOR_EXTS.get(key)
            if known is None:
                if len(_TENSOR_EXTS) >= 256:
                    _TENSOR_EXTS.clear()
                known = _TENSOR_EXTS[key] = tensor_ext(message, "[2]", 0)
            return _assemble_tensor(_packb([delta, sequence, known[0]]), message, known[1])
    except (TypeError, ValueError, UnicodeEncodeError, OverflowError):
        pass  # the general way below raises what dumps raises, naming the key path
    try:
        structure, tensors = encode([delta, sequence, message])
    except (TypeError, ValueError) as e:
        # The codec names the key path in [delta, sequence, message]: say it of the message.
        text = str(e)
        if text.startswith("[2]"):
            raise type(e)("the message" + text[3:]) from None
        raise
    return _assemble(structure, tensors)


def _tensor_bytes(tensor: torch.Tensor) -> Buffer:
    """A tensor's bytes in C order: a view of a plain CPU tensor's memory, else a copy's.

    The view is only valid while ``tensor`` lives (the caller holds it).
    """
    # Every call here keeps the GIL. torch's own ways (detach(), numpy(), is_conj(),
    # is_neg()) let it go and take it back, and each time a sender waiting for it gets it,
    # then waits for it back: on the recorder's thread that was a GIL hand-off per tensor,
    # 1.5 us of each sender's CPU per message (benchmarks/recording.py). The dispatch keys
    # say whether the memory holds the values (no lazy conjugate or negative bit).
    if tensor.is_cpu and tensor.is_contiguous() and not _is_lazy(tensor):
        n = tensor.nbytes
        array = _ARRAYS.get(n)
        if array is None:
            if len(_ARRAYS) >= 256:
                _ARRAYS.clear()
            array = _ARRAYS[n] = ctypes.c_char * n
        return array.from_address(tensor.data_ptr()) if n else b""
    return raw_bytes(tensor)


def _assemble(structure: bytes, tensors: Iterable[tuple[torch.Tensor, int]]) -> bytes:
    """A snapshot's bytes from its structure and tensors (`snapshot.assemble` of their bytes)."""
    parts: list[Buffer] = []
    data_len = 0
    for tensor, nbytes in tensors:
        raw = _tensor_bytes(tensor)
        if memoryview(raw).nbytes != nbytes:
            raise RuntimeError("a tensor was resized while it was being recorded")
        parts.append(raw)
        data_len += nbytes
    return assemble(structure, parts, data_len)


def _assemble_tensor(structure: bytes, tensor: torch.Tensor, nbytes: int) -> bytes:
    """`_assemble` of one tensor, by fewer steps (the writer's hot path for a tensor)."""
    raw = _tensor_bytes(tensor)
    if tensor.nbytes != nbytes:
        raise RuntimeError("a tensor was resized while it was being recorded")
    return assemble(structure, (raw,), nbytes)


def decode_message(data: bytes, declared: type | None = None
                   ) -> tuple[int, int | None, Any]:
    """A message record's delta cycle, sequence and message (`encode_message` undone).

    Args:
        data (bytes): the record's data (format 2's ``[delta, sequence,
            message]`` or format 1's ``[delta, message]``).
        declared (type | None): the port's declared type: a NamedTuple or a
            dataclass message is put back into it (as ``codec.from_file``
            does); None leaves it a tuple or a dict.

    Returns:
        tuple[int, int | None, Any]: ``(delta, sequence, message)``, the
        message bit-identical to what was sent; sequence None for format 1
        (its MCAP record holds it).

    Raises:
        SnapshotError: the data is not a message record's (damaged, or another
            encoding), or its delta or sequence is out of range.
    """
    value = loads(data)
    if (type(value) is not list or len(value) not in (2, 3) or type(value[0]) is not int
            or (len(value) == 3 and type(value[1]) is not int)):
        raise SnapshotError("not a mujou message record (expected [delta, sequence, message])")
    if not CONTROL_DELTA <= value[0] < TIME_END:
        raise SnapshotError(f"delta {value[0]} is not in [-1, 2**63)")
    if len(value) == 3 and not 0 <= value[1] < TIME_END:
        raise SnapshotError(f"sequence {value[1]} is not in [0, 2**63)")
    if len(value) == 2:
        delta, message = value
        sequence = None
    else:
        delta, sequence, message = value
    return delta, sequence, (message if declared is None else from_file(message, declared))


# -- writing ------------------------------------------------------------------------------


class _Stream:
    """The file behind a `Writer`, unbuffered: every write goes to the OS at once.

    The MCAP writer (foxglove-sdk's, in Rust) is given this object rather than
    the path for three reasons. It keeps the chunk being filled in memory and
    hands each record (a closed chunk, a metadata record, an attachment) over
    in a few calls, so writing through without a buffer costs a few system
    calls a chunk and leaves nothing of a closed chunk in the process when it
    dies. A failed write is kept in `error`: the SDK only logs a failure of
    a message's write, so the `Writer` raises it from here. And `abandon`
    makes the rest of the file vanish, as a crash would.

    The SDK is told not to seek (``disable_seeking``): it asks only where it is.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        self._pos = 0
        self._gone = False  # abandoned: later writes are discarded
        self.error: OSError | None = None  # the first failed write, naming the file
        self.writes = 0  # the writes done whole (a Writer's sign that a chunk is in the file)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Write all of ``data`` at the end of the file; returns its length.

        Raises:
            OSError: the write failed, naming the file (also kept in `error`).
        """
        if self._gone:
            return len(data)
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fd, view)
                self._pos += n
                view = view[n:]
        except OSError as e:
            if self.error is None:  # os.write's error names no file: this one does
                self.error = OSError(e.errno, e.strerror, self.path)
                self.error.__cause__ = e
            raise self.error from e
        self.writes += 1
        return len(data)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Where the file ends; the only seeks a writer that does not seek makes.

        Raises:
            io.UnsupportedOperation: any other seek.
        """
        if offset == (0 if whence == os.SEEK_CUR else self._pos) and whence in (
                os.SEEK_CUR, os.SEEK_SET):
            return self._pos
        raise io.UnsupportedOperation(f"{self.path}: a recording is written without seeking")

    def tell(self) -> int:
        """Bytes written so far (the file's size)."""
        return self._pos

    def flush(self) -> None:
        """Nothing to do: every write is already the OS's."""

    def abandon(self) -> None:
        """Discard every later write: the file stays as a crash now would leave it."""
        self._gone = True

    def close(self) -> None:
        """Close the file (once)."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


def _sdk() -> Any:
    """foxglove-sdk's module, imported on the first recording (37 ms; nothing else needs it)."""
    import foxglove
    import foxglove.mcap

    return foxglove


class Writer:
    """Writes one recording (see the module docstring for the format).

    The MCAP records are written by foxglove-sdk's MCAP writer (Rust): about
    0.3 us a message here, against 3 us for the ``mcap`` package's
    pure-Python one. Not thread-safe: one thread
    (a recorder's writer thread) calls it. Each closed chunk is written to the
    file at once; `flush` closes the chunk in progress early (a writer that
    sees few messages calls it now and then, so that a crash loses little).

    Args:
        path (str | os.PathLike): the file to write; replaced if it exists.
        chunk_size (int): bytes of messages per chunk, >= 1. Default: `CHUNK_SIZE`.
        compression (str): ``"none"``, ``"lz4"`` or ``"zstd"``. Default: none.

    Raises:
        TypeError: a chunk size that is not an int.
        ValueError: an unknown compression, or a chunk size below 1.
        OSError: the file cannot be created.
    """

    def __init__(self, path: str | os.PathLike[str], *, chunk_size: int = CHUNK_SIZE,
                 compression: str = "none") -> None:
        self._params_attached = 0  # parameter sets attached: each one's number
        if compression not in _COMPRESSIONS:
            raise ValueError(f"compression must be one of {sorted(_COMPRESSIONS)}, "
                             f"got {compression!r}")
        if type(chunk_size) is not int:
            raise TypeError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
        fox = _sdk()
        self.path = os.fspath(path)
        self._stream = _Stream(self.path)
        kind = _COMPRESSIONS[compression]
        options = fox.mcap.MCAPWriteOptions(
            compression=None if kind is None else getattr(fox.mcap.MCAPCompression, kind),
            # No size of the SDK's: this writer closes each chunk itself (`_filled`), so
            # that it knows which messages a closed chunk holds (`durable`).
            profile=PROFILE, chunk_size=None, disable_seeking=True,
            compression_threads=0)  # zstd on the writer's thread: no pool of its own
        # A context of the file's own: its channels reach this file and nothing else
        # (the live view's server has another).
        self._context = fox.Context()
        self._schema = fox.Schema
        self._channels: list[Any] = []  # the SDK's BaseChannel, by our channel id
        self._logs: list[Callable[[bytes, int, None], None]] = []  # their log
        self._chunk_size = chunk_size
        self._filled = 0  # bytes of message data in the chunk in progress
        # Per channel id: the messages written and their data's bytes, and the same at the
        # last chunk closed: what is surely in the file (`durable`).
        self._logged: list[list[int]] = []
        self._durable: list[tuple[int, int]] = []
        self._closed = False
        try:
            self._mcap = fox.open_mcap(self._stream, context=self._context,
                                       writer_options=options)
        except BaseException:
            self._stream.close()
            raise

    def write_run(self, metadata: Mapping[str, str]) -> None:
        """Write the ``mujou.run`` metadata record (once, before the messages).

        Args:
            metadata (Mapping[str, str]): its keys and values (see docs/recording.md).

        Raises:
            OSError: the file cannot be written.
        """
        self._call(self._mcap.write_metadata, RUN_METADATA, dict(metadata))

    def add_channel(self, spec: ChannelSpec) -> int:
        """Register the channel (and its schema) of one recorded Output.

        Writes its ``mujou.channel`` metadata record at once: the channel
        record itself is written with the channel's first message.

        Args:
            spec (ChannelSpec): the Output.

        Returns:
            int: the channel's id, for `write_message`.

        Raises:
            OSError: the file cannot be written.
        """
        return self._channel(spec.topic, MESSAGE_ENCODING, type_name(spec.type),
                             SCHEMA_ENCODING, json.dumps(spec.schema(), sort_keys=True),
                             spec.metadata())

    def add_view_channel(self, of: str, schema_name: str, schema: Mapping[str, Any]) -> int:
        """Register the view channel of a recorded Output (``/view/<path>``, JSON).

        Args:
            of (str): the Output's path.
            schema_name (str): the schema's name (``foxglove.RawImage`` for an image).
            schema (Mapping[str, Any]): its JSON Schema.

        Returns:
            int: the channel's id, for `write`.

        Raises:
            OSError: the file cannot be written.
        """
        return self._channel(VIEW_PREFIX + of, VIEW_ENCODING, schema_name,
                             VIEW_SCHEMA_ENCODING, json.dumps(schema, sort_keys=True),
                             {VIEW_OF: of})

    def add_log_channel(self) -> int:
        """Register the log channel (``/mujou/log``, JSON, Foxglove's ``foxglove.Log``).

        Returns:
            int: the channel's id, for `write` (each message a ``foxglove.Log``
            object's JSON, at its time).

        Raises:
            OSError: the file cannot be written.
        """
        return self._channel(LOG_TOPIC, VIEW_ENCODING, LOG_SCHEMA_NAME, VIEW_SCHEMA_ENCODING,
                             json.dumps(LOG_SCHEMA, sort_keys=True),
                             {LOG_MARK: LOG_SCHEMA_NAME})

    def _channel(self, topic: str, encoding: str, schema_name: str, schema_encoding: str,
                 schema: str, metadata: dict[str, str]) -> int:
        """Declare a channel (its ``mujou.channel`` record) and make it; returns its id."""
        self._call(self._mcap.write_metadata, CHANNEL_METADATA, {
            **metadata, _TOPIC: topic, _ENCODING: encoding, _SCHEMA_NAME: schema_name,
            _SCHEMA_ENCODING: schema_encoding, _SCHEMA: schema})
        # The context's own constructor, which foxglove.Channel calls: a foxglove.Channel
        # also stays in a module-level table of the SDK for the process's life (one per
        # channel of every file written), and its log() checks cost 0.2 us a message.
        channel = self._context._create_channel(
            topic, message_encoding=encoding, metadata=metadata,
            schema=self._schema(name=schema_name, encoding=schema_encoding,
                                data=schema.encode()))
        self._channels.append(channel)
        self._logs.append(channel.log)
        self._logged.append([0, 0])
        self._durable.append((0, 0))
        return len(self._logs) - 1

    def write(self, channel_id: int, t_ns: int, data: bytes) -> None:
        """Write one message record of already encoded data (a view's or a log entry's JSON).

        Args:
            channel_id (int): from `add_channel`, `add_view_channel` or `add_log_channel`.
            t_ns (int): its time, ns (>= 0).
            data (bytes): its data.

        Raises:
            OSError: the file cannot be written.
        """
        self._logs[channel_id](data, t_ns, None)
        if self._stream.error is not None:
            raise self._stream.error
        counts = self._logged[channel_id]
        counts[0] += 1
        counts[1] += len(data)
        self._filled += len(data)
        if self._filled >= self._chunk_size:
            self.flush()

    def write_message(self, channel_id: int, seq: int, t_ns: int, delta: int,
                      message: Any) -> int:
        """Encode and write one message sent at ``(t_ns, delta)`` (the control key too).

        Args:
            channel_id (int): from `add_channel`.
            seq (int): the sender's count of this message on its Output, from 0.
            t_ns (int): the send's time, ns; -1 for the control key.
            delta (int): the send's delta cycle.
            message (Any): the message.

        Returns:
            int: the bytes of the record's data.

        Raises:
            TypeError, ValueError: as `encode_message`; nothing is written.
            OSError: the file cannot be written.
        """
        if t_ns < 0:
            t_ns, delta = 0, CONTROL_DELTA
        data = encode_message(delta, seq, message)
        self._logs[channel_id](data, t_ns, None)
        if self._stream.error is not None:
            raise self._stream.error
        n = len(data)
        counts = self._logged[channel_id]
        counts[0] += 1
        counts[1] += n
        self._filled += n
        if self._filled >= self._chunk_size:
            self.flush()
        return n

    def attach(self, name: str, t_ns: int, data: bytes,
               media_type: str = SNAPSHOT_MEDIA_TYPE) -> None:
        """Write an attachment (a supervisor snapshot by default).

        Args:
            name (str): its name (``snapshot-<t_ns>.mujou`` for a snapshot).
            t_ns (int): its time on the run's timer, ns (>= 0).
            data (bytes): its bytes (for a snapshot: ``snapshot.dumps(tree)``).
            media_type (str): its media type. Default: `SNAPSHOT_MEDIA_TYPE`.

        Raises:
            OSError: the file cannot be written.
        """
        t = max(t_ns, 0)
        self._call(self._mcap.attach, log_time=t, create_time=t, name=name,
                   media_type=media_type, data=data)

    def attach_snapshot(self, t_ns: int, tree: Any) -> None:
        """Attach a supervisor snapshot's tree, named ``snapshot-<t_ns>.mujou``.

        Args:
            t_ns (int): the snapshot's time, ns.
            tree (Any): the state tree (``snapshot.dumps`` encodes it).

        Raises:
            OSError: the file cannot be written.
        """
        self.attach(f"snapshot-{t_ns}.mujou", t_ns, dumps(tree))

    def attach_param(self, t_ns: int, delta: int, node: str, name: str, value: Any) -> None:
        """Attach a parameter set: the key it applies from, its node, name and value.

        Args:
            t_ns (int): the key's time, ns of the run's timer (-1: before the start).
            delta (int): the key's delta cycle.
            node (str): the node's dotted path.
            name (str): the parameter's name.
            value (bool | int | float | str): the value set.

        Raises:
            OSError: the file cannot be written.
        """
        data = json.dumps({"t_ns": t_ns, "delta": delta, "node": node, "name": name,
                           "value": value}, sort_keys=True).encode()
        n = self._params_attached
        self._params_attached = n + 1
        self.attach(f"{PARAM_PREFIX}{t_ns}-{delta}-{n}.json", t_ns, data, PARAM_MEDIA_TYPE)

    def flush(self) -> None:
        """Close the chunk in progress, so that its messages are in the file now.

        Called by the writer itself once a chunk holds ``chunk_size`` bytes.

        Raises:
            OSError: the file cannot be written.
        """
        self._call(self._mcap.flush)
        self._filled = 0
        self._durable = [(n, b) for n, b in self._logged]

    def durable(self, channel_id: int) -> tuple[int, int]:
        """The messages of a channel surely in the file, and their data's bytes.

        Those of the chunks closed so far (`write_message` counts the rest):
        after a failed write, what the file kept; the rest was lost with the
        chunk in progress.

        Args:
            channel_id (int): from `add_channel`.

        Returns:
            tuple[int, int]: ``(messages, bytes)``.
        """
        return self._durable[channel_id]

    def close(self, end: Mapping[str, str] | None = None) -> None:
        """Write the ``mujou.end`` metadata (if given), the summary and the footer; close.

        Args:
            end (Mapping[str, str] | None): the ``mujou.end`` record's keys and
                values; None writes none (a run that did not end cleanly).

        Raises:
            OSError: the file cannot be written (it is closed all the same).
        """
        if self._closed:
            return
        self._closed = True
        try:
            # The last chunk first: a file cut before its end record must not read as
            # a run that ended cleanly with messages missing.
            self.flush()
            if end is not None:
                self._call(self._mcap.write_metadata, END_METADATA, dict(end))
            self._call(self._mcap.close)
        finally:
            self._release()

    def abandon(self) -> None:
        """Close the file as it is, without a summary: what a crash leaves.

        The recorder calls it when writing failed; the tests, to make a crash's file.
        """
        if self._closed:
            return
        self._closed = True
        self._stream.abandon()
        try:
            self._mcap.close()  # writes only to the abandoned stream
        except RuntimeError:
            pass  # the SDK's writer had failed already: nothing more to close
        finally:
            self._release()

    def _release(self) -> None:
        """Close the channels (the SDK keeps closed ones out of its sinks) and the file."""
        for channel in self._channels:
            channel.close()
        self._stream.close()

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call one of the SDK writer's methods; a failed write comes out as its OSError.

        The SDK reports a write that failed as a RuntimeError without its cause,
        and every later write as "attempted another write after a write
        method failed": the stream kept the OSError (naming what went wrong).
        """
        try:
            return method(*args, **kwargs)
        except RuntimeError as e:
            if self._stream.error is not None:
                raise self._stream.error from e
            raise


def package_version() -> str:
    """The package's version, ``mujou_actors.__version__``.

    Read when a file is written, once the package is imported: this module is
    imported by the package's ``__init__`` (through the run), before the
    version is set.

    Returns:
        str: the version (``"unknown"`` if the package is not imported).
    """
    package = sys.modules.get((__package__ or "mujou_actors").split(".")[0])
    return str(getattr(package, "__version__", "unknown"))


# -- reading ------------------------------------------------------------------------------


class Record(NamedTuple):
    """One recorded message, decoded.

    Attributes:
        topic (str): the Output's path.
        sequence (int): the channel's count of it, from 0.
        t_ns (int): the send's time on the run's timer, ns (-1: the control key,
            a send of ``on_start`` before the timer started).
        delta (int): the send's delta cycle.
        message (Any): the message, bit-identical to what was sent.
    """

    topic: str
    sequence: int
    t_ns: int
    delta: int
    message: Any


@dataclasses.dataclass
class ChannelInfo:
    """One channel of a recording and what the file holds of it.

    Attributes:
        id (int): the channel's id in the file; -1 for a channel of format 2
            that got no message (its channel record comes with its first).
        topic (str): the Output's path.
        node (str): the node's path.
        port (str): the port's name.
        sender_order (int): the node's order in the net.
        type (str): the declared type, ``module:qualname``.
        shape (list[int | None] | None): a tensor port's declared shape.
        dtype (str | None): a tensor port's declared dtype.
        schema (dict): the schema's JSON object (``type``, ``shape``,
            ``dtype``, ``fields``).
        count (int): messages in the file.
        bytes (int): their data's total size, bytes.
        first_ns (int | None): the first message's log time, ns (None: none).
        last_ns (int | None): the last message's log time, ns.
        view_of (str | None): for a view channel (`RecordingInfo.views`), the
            path of the Output it is a view of; None for a recorded Output's.
        log (bool): the log channel (`RecordingInfo.logs`).
        foxglove (str | None): the Foxglove schema its Output declares for its
            view (``Output(..., foxglove=...)``), None if none.
    """

    id: int
    topic: str
    node: str
    port: str
    sender_order: int
    type: str
    shape: list[int | None] | None
    dtype: str | None
    schema: dict[str, Any]
    count: int = 0
    bytes: int = 0
    first_ns: int | None = None
    last_ns: int | None = None
    view_of: str | None = None
    log: bool = False
    foxglove: str | None = None


@dataclasses.dataclass(frozen=True)
class AttachmentInfo:
    """An attachment of a recording (without its data).

    Attributes:
        name (str): its name (``snapshot-<t_ns>.mujou``).
        media_type (str): its media type.
        t_ns (int): its log time, ns.
        size (int): its data's size, bytes.
    """

    name: str
    media_type: str
    t_ns: int
    size: int


@dataclasses.dataclass
class RecordingInfo:
    """What `info` finds in a recording (``mujou inspect`` shows it).

    Attributes:
        path (str): the file.
        size (int): its size, bytes.
        library (str): the header's library string.
        complete (bool): the file ends with its footer (the recording was closed).
        cut_at (int | None): for a file that is not complete, the offset (bytes)
            after its last complete record: what is read of it ends there.
        damage (str | None): read with ``allow_damaged``: what was found
            damaged, and where (reading stopped at ``cut_at``, if it did);
            None: nothing.
        channels (list[ChannelInfo]): in the order of their ids.
        messages (int): messages in the file.
        start_ns (int | None): the earliest message's log time, ns.
        end_ns (int | None): the latest message's log time, ns.
        run (dict[str, str]): the ``mujou.run`` metadata ({} if missing).
        end (dict[str, str] | None): the ``mujou.end`` metadata (None: the run
            did not end cleanly, or the file was cut).
        drops (dict[str, int]): messages dropped per channel (from ``mujou.end``).
        seeds (dict[str, int]): each node's seed (from ``mujou.run``).
        attachments (list[AttachmentInfo]): in file order.
        views (list[ChannelInfo]): the view channels (``Recording(view=True)``), in
            the order of their ids; their messages are not in ``messages``,
            ``start_ns`` or ``end_ns`` (``sender_order`` -1, ``type`` the
            schema's name).
        logs (list[ChannelInfo]): the log channel (``Recording(log=True)``:
            ``/mujou/log``, type ``foxglove.Log``), if the file has one; its
            messages, the run's log records (`Reader.logs`), are not in
            ``messages``, ``start_ns`` or ``end_ns``.
        log_dropped (int): log records the run's recorder dropped (its queue
            was full; from ``mujou.end``).
    """

    path: str
    size: int
    library: str
    complete: bool = False
    cut_at: int | None = None
    damage: str | None = None
    channels: list[ChannelInfo] = dataclasses.field(default_factory=list)
    messages: int = 0
    start_ns: int | None = None
    end_ns: int | None = None
    run: dict[str, str] = dataclasses.field(default_factory=dict)
    end: dict[str, str] | None = None
    drops: dict[str, int] = dataclasses.field(default_factory=dict)
    seeds: dict[str, int] = dataclasses.field(default_factory=dict)
    attachments: list[AttachmentInfo] = dataclasses.field(default_factory=list)
    views: list[ChannelInfo] = dataclasses.field(default_factory=list)
    logs: list[ChannelInfo] = dataclasses.field(default_factory=list)
    log_dropped: int = 0


def _is_log(channel: Channel) -> bool:
    """Whether a channel record is the log channel (JSON, marked by its ``mujou.log``)."""
    return channel.message_encoding == VIEW_ENCODING and LOG_MARK in channel.metadata


def _is_view(channel: Channel) -> bool:
    """Whether a channel record is a view channel (JSON, named by its ``mujou.view_of``)."""
    return channel.message_encoding == VIEW_ENCODING and VIEW_OF in channel.metadata


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_JSON_BRACKETS = re.compile(r"[\[\]{}]")


def parse_json(text: str | bytes) -> Any:
    """A JSON value of a file, nested at most `MAX_JSON_DEPTH` levels (``json.loads`` else).

    The depth is found before ``json.loads`` runs (its decoder recurses once a
    level): from the brackets outside strings, and only for a text that holds
    more than `MAX_JSON_DEPTH` of them.

    Args:
        text (str | bytes): the JSON (bytes: UTF-8).

    Returns:
        Any: the value.

    Raises:
        ValueError: not JSON, not UTF-8, or nested deeper than `MAX_JSON_DEPTH`.
    """
    if not isinstance(text, str):
        text = bytes(text).decode()
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH:
        depth = deepest = 0
        for bracket in _JSON_BRACKETS.findall(_JSON_STRING.sub("", text)):
            depth += 1 if bracket in "[{" else -1
            deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            raise ValueError(f"JSON nested {deepest} levels deep, past the {MAX_JSON_DEPTH} "
                             "a file may hold")
    return json.loads(text)


def _view_info(channel: Channel, schemas: dict[int, Schema], path: str) -> ChannelInfo:
    """The `ChannelInfo` of a view channel record, or of the log channel's (counts zero)."""
    schema = schemas.get(channel.schema_id)
    log = _is_log(channel)
    try:
        data = parse_json(schema.data) if schema is not None else {}
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
    except ValueError as e:
        raise RecordingError(path, f"{'log' if log else 'view'} channel {channel.topic!r}: "
                             f"bad schema ({reason(e)})") from e
    return ChannelInfo(channel.id, channel.topic, "", "", -1,
                       schema.name if schema is not None else "", None, None, data,
                       view_of=None if log else channel.metadata[VIEW_OF], log=log)


_SCHEMA_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:[./][A-Za-z_][A-Za-z0-9_]*)*")


def _channel_info(channel: Channel, schemas: dict[int, Schema], path: str) -> ChannelInfo:
    """The `ChannelInfo` of a channel record (counts zero); RecordingError if not mujou's."""
    meta = channel.metadata
    if channel.message_encoding != MESSAGE_ENCODING:
        raise RecordingError(path, f"channel {channel.topic!r} has message encoding "
                             f"{channel.message_encoding!r}, not {MESSAGE_ENCODING!r}")
    try:
        schema = parse_json(schemas[channel.schema_id].data) if channel.schema_id else {}
        _check_schema(schema)
        shape = parse_json(meta["shape"]) if "shape" in meta else None
        if shape is not None and not (type(shape) is list and all(
                size is None or type(size) is int and 0 <= size < TIME_END for size in shape)):
            raise ValueError(f"shape {meta['shape'][:80]!r} is not a list of sizes")
        order = int(meta["sender_order"])
        if not -TIME_END <= order < TIME_END:
            raise ValueError(f"sender_order {order} is past 2**63")
        foxglove = meta.get(FOXGLOVE)
        if foxglove is not None and not (len(foxglove) <= 256
                                         and _SCHEMA_NAME_RE.fullmatch(foxglove)):
            raise ValueError(f"foxglove {foxglove[:80]!r} is not a schema's name")
    except KeyError as e:
        raise RecordingError(path, f"channel {channel.topic!r}: no {e} in its metadata or "
                             "schemas") from e
    except ValueError as e:
        raise RecordingError(path, f"channel {channel.topic!r}: bad schema or metadata "
                             f"({reason(e)})") from e
    return ChannelInfo(channel.id, channel.topic, meta.get("node", ""), meta.get("port", ""),
                       order, meta.get("type", ""), shape, meta.get("dtype"), schema,
                       foxglove=foxglove)


def _check_schema(schema: Any) -> None:
    """ValueError unless a channel's schema is an object whose ``fields`` are ``[name, type]``."""
    if not isinstance(schema, dict):
        raise ValueError(f"its schema is a JSON {type(schema).__name__}, not an object")
    fields = schema.get("fields")
    if fields is not None and not (type(fields) is list and all(
            type(f) is list and len(f) == 2 and all(type(x) is str for x in f) for f in fields)):
        raise ValueError("its schema's fields are not [name, type] pairs")


def _declaration(record: Metadata, path: str) -> tuple[Channel, Schema]:
    """The channel and schema records a ``mujou.channel`` record declares (ids -1: no record)."""
    meta = dict(record.metadata)
    try:
        topic, encoding = meta.pop(_TOPIC), meta.pop(_ENCODING)
        schema = Schema(id=-1, name=meta.pop(_SCHEMA_NAME),
                        encoding=meta.pop(_SCHEMA_ENCODING), data=meta.pop(_SCHEMA).encode())
    except KeyError as e:
        raise RecordingError(path, f"a {CHANNEL_METADATA!r} record without {e}") from None
    return Channel(id=-1, schema_id=-1, topic=topic, message_encoding=encoding,
                   metadata=meta), schema


class _Channels:
    """A recording's channels as its records declare them, by topic and by id in the file.

    Format 2 declares every channel in a ``mujou.channel`` record before any
    message (the channel record itself comes with its first message, so a
    channel without messages has none); format 1 has channel records only.
    Records are fed in file order (`take`); a channel keeps the first
    description met of it.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.schemas: dict[int, Schema] = {}
        self.by_topic: dict[str, ChannelInfo] = {}  # in the order met
        self.by_id: dict[int, ChannelInfo] = {}
        self.declared = False  # a mujou.channel record was met: format 2
        self.first = 0  # the MCAP sequence of a channel's first message (the SDK's is 1)

    def take(self, record: _Record) -> bool:
        """Take a schema, channel or ``mujou.channel`` record; False for any other record."""
        if isinstance(record, Schema):
            self.schemas.setdefault(record.id, record)
        elif isinstance(record, Channel):
            if record.id not in self.by_id:  # the summary repeats those of the data
                known = self.by_topic.get(record.topic)
                if known is None:
                    known = self.by_topic[record.topic] = self._info(record, self.schemas)
                known.id = record.id
                self.by_id[record.id] = known
        elif isinstance(record, Metadata) and record.name == CHANNEL_METADATA:
            channel, schema = _declaration(record, self.path)
            self.declared, self.first = True, 1
            if channel.topic not in self.by_topic:
                self.by_topic[channel.topic] = self._info(channel, {-1: schema})
        else:
            return False
        return True

    def _info(self, channel: Channel, schemas: dict[int, Schema]) -> ChannelInfo:
        if _is_log(channel) or _is_view(channel):
            return _view_info(channel, schemas, self.path)
        return _channel_info(channel, schemas, self.path)

    def of(self, channel_id: int) -> ChannelInfo:
        """The channel of a message record; RecordingError if no channel record defines it."""
        channel = self.by_id.get(channel_id)
        if channel is None:
            raise RecordingError(self.path, f"a message on channel {channel_id}, which no "
                                 "channel record defines")
        return channel

    def ordered(self) -> tuple[list[ChannelInfo], list[ChannelInfo], list[ChannelInfo]]:
        """The recorded Outputs' channels, the view channels and the log's, in the net's order.

        Format 2: the order of the declarations (the net's); format 1: of the
        channel ids (given in the net's order).
        """
        infos = list(self.by_topic.values())
        if not self.declared:
            infos.sort(key=lambda c: c.id)
        return ([c for c in infos if c.view_of is None and not c.log],
                [c for c in infos if c.view_of], [c for c in infos if c.log])


# -- the MCAP records, parsed within their bounds ----------------------------------------------

_MCAP_MAGIC = b"\x89MCAP0\r\n"
_RECORD = struct.Struct("<BQ")  # opcode, content length
_MESSAGE = struct.Struct("<BQHIQQ")  # and a message's channel, sequence, log and publish time
_FOOTER = struct.Struct("<BQQQI")  # opcode, length, summary start and offset start, CRC
_DATA_END = struct.Struct("<BQI")  # opcode, length, data section CRC
_U16, _U32, _U64 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")
_HEADER_OP, _FOOTER_OP, _SCHEMA_OP, _CHANNEL_OP, _MESSAGE_OP, _CHUNK_OP = 1, 2, 3, 4, 5, 6
_ATTACHMENT_OP, _METADATA_OP, _DATA_END_OP = 9, 12, 15
_KINDS = {1: "header", 2: "footer", 3: "schema", 4: "channel", 5: "message", 6: "chunk",
          7: "message index", 8: "chunk index", 9: "attachment", 10: "attachment index",
          11: "statistics", 12: "metadata", 13: "metadata index", 14: "summary offset",
          15: "data end"}
# The records each section may hold (the summary's schemas and channels are read, the rest
# skipped); anything else there is damage.
_DATA_OPS = frozenset((3, 4, 5, 6, 7, 9, 12, 15))
_SUMMARY_OPS = frozenset((2, 3, 4, 8, 10, 11, 13, 14))
_MESSAGE_HEAD = 22  # a message record's fields before its data
_CUT_PREFIX = 4096  # bytes of a record cut by the file's end read to check its lengths


class _Damage(Exception):  # noqa: N818 - never leaves this module: a RecordingError, or a stop
    """A record that does not read: what is wrong and the offset of the record."""

    def __init__(self, reason: str, offset: int | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.offset = offset


class _Short(_Damage):  # noqa: N818
    """A field that runs past the bytes at hand (of a record, or of a cut record's start)."""


class _Message(NamedTuple):
    """A message record (the MCAP package's fields, made without its slower reader)."""

    channel_id: int
    sequence: int
    log_time: int
    publish_time: int
    data: bytes


_Record: TypeAlias = "_Message | Schema | Channel | Metadata | Attachment"


class _Fields:
    """Reads the fields of one record's content, never past its end (`_Short` if one would)."""

    __slots__ = ("buf", "pos", "end", "kind", "at")

    def __init__(self, buf: bytes, kind: str, at: int, pos: int = 0,
                 end: int | None = None) -> None:
        self.buf, self.kind, self.at = buf, kind, at
        self.pos = pos
        self.end = len(buf) if end is None else end

    def take(self, n: int) -> int:
        """Skip ``n`` bytes; returns where they start."""
        start = self.pos
        if n > self.end - start:
            raise _Short(f"damaged {self.kind} record: a field of {n} bytes runs past its end "
                         f"({self.end - start} bytes left)", self.at)
        self.pos = start + n
        return start

    def u16(self) -> int:
        return int(_U16.unpack_from(self.buf, self.take(2))[0])

    def u32(self) -> int:
        return int(_U32.unpack_from(self.buf, self.take(4))[0])

    def u64(self) -> int:
        return int(_U64.unpack_from(self.buf, self.take(8))[0])

    def blob(self, n: int) -> bytes:
        start = self.take(n)
        return self.buf[start:start + n]

    def text(self) -> str:
        data = self.blob(self.u32())
        try:
            return data.decode()
        except UnicodeDecodeError as e:
            raise _Damage(f"damaged {self.kind} record: a string that is not UTF-8 "
                          f"({reason(e)})", self.at) from None

    def pairs(self) -> dict[str, str]:
        """A map of str to str (its byte length first)."""
        n = self.u32()
        inner = _Fields(self.buf, self.kind, self.at, self.take(n), self.pos)
        out = {}
        while inner.pos < inner.end:
            key = inner.text()
            out[key] = inner.text()
        return out

    def done(self) -> None:
        """`_Damage` unless every byte of the record was read (its length says no more)."""
        if self.pos != self.end:
            raise _Damage(f"damaged {self.kind} record: {self.end - self.pos} bytes after its "
                          "last field (its length field is wrong)", self.at)


def _header(content: bytes, at: int) -> Header:
    f = _Fields(content, "header", at)
    profile, library = f.text(), f.text()
    f.done()
    return Header(profile=profile, library=library)


def _schema(buf: bytes, at: int, pos: int = 0, end: int | None = None) -> Schema:
    f = _Fields(buf, "schema", at, pos, end)
    id_, name, encoding = f.u16(), f.text(), f.text()
    data = f.blob(f.u32())
    f.done()
    return Schema(id=id_, name=name, encoding=encoding, data=data)


def _channel(buf: bytes, at: int, pos: int = 0, end: int | None = None) -> Channel:
    f = _Fields(buf, "channel", at, pos, end)
    id_, schema_id, topic, encoding = f.u16(), f.u16(), f.text(), f.text()
    metadata = f.pairs()
    f.done()
    return Channel(id=id_, schema_id=schema_id, topic=topic, message_encoding=encoding,
                   metadata=metadata)


def _metadata(content: bytes, at: int) -> Metadata:
    f = _Fields(content, "metadata", at)
    name = f.text()
    metadata = f.pairs()
    f.done()
    return Metadata(name=name, metadata=metadata)


def _attachment(content: bytes, at: int) -> Attachment:
    f = _Fields(content, "attachment", at)
    log_time, create_time = f.u64(), f.u64()
    name, media_type = f.text(), f.text()
    data = f.blob(f.u64())
    covered = f.pos
    crc = f.u32()
    f.done()
    if log_time >= TIME_END:
        raise _Damage(f"attachment {name!r}: log time {log_time} ns is past 2**63", at)
    if crc and zlib.crc32(memoryview(content)[:covered]) != crc:
        raise _Damage(f"attachment {name!r}: its checksum does not match (damaged)", at)
    return Attachment(log_time=log_time, create_time=create_time, name=name,
                      media_type=media_type, data=data)


def _message(buf: bytes, at: int, start: int, end: int) -> _Message:
    """A message record whose content is ``buf[start + 9:end]`` (its opcode at ``start``)."""
    if end - start - 9 < _MESSAGE_HEAD:
        raise _Damage(f"damaged message record: {end - start - 9} bytes, fewer than its "
                      f"fields' {_MESSAGE_HEAD}", at)
    _, _, channel, sequence, log_time, publish_time = _MESSAGE.unpack_from(buf, start)
    if log_time >= TIME_END:
        raise _Damage(f"a message on channel {channel} at log time {log_time} ns, past 2**63",
                      at)
    return _Message(channel, sequence, log_time, publish_time,
                    buf[start + 9 + _MESSAGE_HEAD:end])


def _implied_length(opcode: int, prefix: bytes) -> int | None:
    """The content length a record's first bytes imply (None: they do not say, or too few).

    For a record that the file's end cuts: a length field that its own fields
    contradict is damage, not a cut.
    """
    f = _Fields(prefix, "", 0)
    try:
        if opcode == _CHUNK_OP:
            f.take(28)
            f.take(f.u32())
            return f.pos + 8 + f.u64()
        if opcode == _ATTACHMENT_OP:
            f.take(16)
            f.take(f.u32())
            f.take(f.u32())
            return f.pos + 8 + f.u64() + 4
        if opcode == _METADATA_OP:
            f.take(f.u32())
            return f.pos + 4 + f.u32()
        if opcode == _SCHEMA_OP:
            f.take(2)
            f.take(f.u32())
            f.take(f.u32())
            return f.pos + 4 + f.u32()
        if opcode == _HEADER_OP:
            f.take(f.u32())
            return f.pos + 4 + f.u32()
        return {_FOOTER_OP: 20, _DATA_END_OP: 4}.get(opcode)
    except _Short:
        return None


def _decompress(compression: str, data: memoryview, size: int, at: int) -> bytes:
    """A compressed chunk's records, decompressed to exactly ``size`` bytes and never more."""
    try:
        if compression == "zstd":
            out = _unzstd(data, size, at)
        elif compression == "lz4":
            import lz4.frame  # type: ignore[import-untyped]

            unpack = lz4.frame.LZ4FrameDecompressor()
            out = unpack.decompress(data, max_length=size)
            if not unpack.eof or unpack.unused_data:
                raise _Damage(f"damaged chunk: its lz4 frame does not end after {size} bytes "
                              "(its uncompressed size)", at)
        else:
            raise _Damage(f"a chunk of unknown compression {compression!r}", at)
    except ImportError as e:
        raise _Damage(f"a {compression} chunk, and the {e.name} package is not installed",
                      at) from None
    except (RuntimeError, ValueError, MemoryError) as e:  # lz4's, and zstandard's ZstdError
        raise _Damage(f"damaged chunk: {compression} does not decompress it ({reason(e)})",
                      at) from None
    if len(out) != size:
        raise _Damage(f"damaged chunk: it decompresses to {len(out)} bytes, its uncompressed "
                      f"size says {size}", at)
    return out


def _unzstd(data: memoryview, size: int, at: int) -> bytes:
    """A zstd frame decompressed into a buffer of ``size`` bytes (a frame that holds more fails).

    A frame that declares its content size is decompressed into a buffer of
    that size (zstandard's way, whatever it is told): it must be ``size``.
    """
    import zstandard

    unpack = zstandard.ZstdDecompressor()
    try:
        declared = zstandard.get_frame_parameters(data).content_size
        if declared not in (size, zstandard.CONTENTSIZE_UNKNOWN):
            raise _Damage(f"damaged chunk: its zstd frame holds {declared:,} bytes, its "
                          f"uncompressed size says {size:,}", at)
        try:
            out = unpack.decompress(data, max_output_size=max(size, 1), allow_extra_data=False)
        except TypeError:  # zstandard < 0.20: bytes after the frame are not looked at
            out = unpack.decompress(data, max_output_size=max(size, 1))
    except zstandard.ZstdError as e:
        raise _Damage(f"damaged chunk: zstd does not decompress it ({reason(e)})",
                      at) from None
    return bytes(out)


def _chunk_records(data: bytes, pos: int, end_of: int, at: int) -> Iterator[_Record]:
    """The records of a chunk's data, ``data[pos:end_of]``: messages, schemas and channels."""
    unpack = _RECORD.unpack_from
    while pos < end_of:
        if end_of - pos < 9:
            raise _Damage(f"damaged chunk: {end_of - pos} bytes after its last record", at)
        opcode, length = unpack(data, pos)
        end = pos + 9 + length
        if end > end_of:
            raise _Damage(f"damaged chunk: a record of {length:,} bytes runs past the end of "
                          "the chunk", at)
        if opcode == _MESSAGE_OP:
            yield _message(data, at, pos, end)
        elif opcode == _SCHEMA_OP:
            yield _schema(data, at, pos + 9, end)
        elif opcode == _CHANNEL_OP:
            yield _channel(data, at, pos + 9, end)
        else:
            raise _Damage(f"damaged chunk: a record of opcode 0x{opcode:02x} in it (a chunk "
                          "holds messages, schemas and channels)", at)
        pos = end


def _crc(f: IO[bytes], start: int, end: int) -> int:
    """The CRC-32 of the file's bytes ``[start, end)``, read 4 MiB at a time."""
    f.seek(start)
    crc = 0
    while start < end:
        block = f.read(min(4 << 20, end - start))
        if not block:
            break
        crc = zlib.crc32(block, crc)
        start += len(block)
    return crc


class _Scan:
    """One pass over a recording's records, in file order, telling a cut from damage.

    Iterating yields the records (chunks broken up into their messages,
    schemas and channels; of the summary only the schemas and channels, which
    hold those of channels that got no message, whose chunk the writer leaves
    out). Every length is checked against the bytes that hold it before
    anything is read or allocated, every CRC the file carries (a chunk's,
    an attachment's, the data section's and the summary's; 0 means none) is
    checked, and a compressed chunk is decompressed into a buffer of the size
    it declares, within the pass's budget (`MAX_EXPANSION`, `EXPANSION_SLACK`).

    A file that ends with its footer and the MCAP magic is *closed*: its data
    section's and summary's CRCs are checked before the first record is
    yielded, and every record must lie within its section. A file that does
    not end so is *cut* (a crash): it reads up to its last complete record,
    and `cut_at` says where that ends; a record that the end cuts short but
    whose own fields contradict its length is damage all the same. Damage
    raises `RecordingError` naming the file and the record's offset; with
    ``allow_damaged`` it ends the pass as a cut would (`damage` says what it
    was, `cut_at` where).
    """

    def __init__(self, path: str | os.PathLike[str], allow_damaged: bool = False) -> None:
        self.path = os.fspath(path)
        self.allow_damaged = allow_damaged
        self.size = 0
        self.header: Header | None = None
        self.complete = False
        self.cut_at: int | None = None
        self.damage: str | None = None

    def __iter__(self) -> Iterator[_Record]:
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed by the finally below
        except FileNotFoundError:
            raise
        except OSError as e:
            raise RecordingError(self.path, f"cannot be read: {reason(e)}") from e
        try:
            yield from self._records(f)
        except _Damage as e:
            self._damaged(e)
            self.complete, self.cut_at = False, e.offset
        finally:
            f.close()

    def _damaged(self, e: _Damage) -> None:
        """Raise the damage as a RecordingError, or (``allow_damaged``) note it."""
        if not self.allow_damaged:
            raise RecordingError(self.path, e.reason, offset=e.offset) from None
        where = "" if e.offset is None else f" (the record at byte {e.offset})"
        self.damage = (self.damage + "; " if self.damage else "") + e.reason + where

    def _records(self, f: IO[bytes]) -> Iterator[_Record]:
        size = self.size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if head != _MCAP_MAGIC:
            if head and _MCAP_MAGIC.startswith(head) and len(head) == size:
                self.cut_at = 0  # cut inside the magic
                return
            raise RecordingError(self.path, f"not an MCAP file (starts with {head!r}, {size} "
                                 "bytes)", offset=0)
        sections = self._closed(f, size)
        budget = MAX_EXPANSION * size + EXPANSION_SLACK
        pos, limit = 8, (sections[0] if sections else size)
        summary = False  # past the data section: the summary repeats what was read
        f.seek(pos)
        while True:
            if sections and pos == limit:
                if summary:
                    self.complete = self.damage is None
                    return
                summary, pos, limit = True, sections[1], sections[2]  # its data end checked
                f.seek(pos)
                continue
            head = f.read(9)
            if len(head) < 9:
                if sections:
                    raise _Damage("the file changed while it was read", pos)
                self.cut_at = pos  # the file ends at or inside a record's opcode and length
                return
            opcode, length = _RECORD.unpack(head)
            kind = _KINDS.get(opcode)
            if kind is None or opcode not in (_SUMMARY_OPS if summary else _DATA_OPS) and not (
                    self.header is None and opcode == _HEADER_OP):
                what = f"opcode 0x{opcode:02x}" if kind is None else kind
                raise _Damage(f"damaged: a record of {what} in the "
                              f"{'summary' if summary else 'data section'}", pos)
            room = limit - pos - 9
            if length > room:
                self._cut(f, opcode, kind, length, room, pos, sections)
                return
            content = f.read(length)
            if len(content) != length:
                raise _Damage("the file changed while it was read", pos)
            at, pos = pos, pos + 9 + length
            if self.header is None:
                if opcode != _HEADER_OP:
                    raise _Damage(f"damaged: the first record is a {kind}, not a header", at)
                self.header = _header(content, at)
                if self.header.profile != PROFILE:
                    raise RecordingError(self.path, f"an MCAP file of profile "
                                         f"{self.header.profile!r}, not a mujou recording "
                                         f"(profile {PROFILE!r})", offset=at)
            elif opcode == _CHUNK_OP:
                data, start, end, crc = self._chunk(content, at, budget)
                budget -= end - start
                if crc and zlib.crc32(memoryview(data)[start:end]) != crc:
                    raise _Damage("damaged chunk: its checksum does not match", at)
                yield from _chunk_records(data, start, end, at)
            elif opcode == _MESSAGE_OP:
                yield _message(head + content, at, 0, 9 + length)
            elif opcode == _METADATA_OP:
                yield _metadata(content, at)
            elif opcode == _SCHEMA_OP:
                yield _schema(content, at)
            elif opcode == _CHANNEL_OP:
                yield _channel(content, at)
            elif opcode == _ATTACHMENT_OP:
                yield _attachment(content, at)
            elif opcode in (_DATA_END_OP, _FOOTER_OP) and sections:
                raise _Damage(f"damaged: a second {kind} record", at)
            elif opcode == _DATA_END_OP:
                self._data_end(f, content, at)  # of a file without its footer (cut after it)
                f.seek(pos)
                summary = True
            elif opcode == _FOOTER_OP:
                self._after_footer(f, pos)
                return

    def _chunk(self, content: bytes, at: int, budget: int) -> tuple[bytes, int, int, int]:
        """A chunk's records, decompressed within ``budget`` bytes: ``(data, start, end, crc)``.

        The records are ``data[start:end]``: of the record's own bytes when
        the chunk is not compressed, else of a buffer of the size it declares.
        """
        f = _Fields(content, "chunk", at)
        f.take(16)  # the times of its first and last messages
        size, crc, compression = f.u64(), f.u32(), f.text()
        n = f.u64()
        start = f.take(n)
        f.done()
        if compression == "":
            if n != size:
                raise _Damage(f"damaged chunk: {n:,} bytes of records, but its uncompressed "
                              f"size says {size:,}", at)
            return content, start, start + n, crc
        if size > budget:
            raise _Damage(f"a chunk that decompresses to {size:,} bytes: past the "
                          f"{MAX_EXPANSION} bytes per byte of the file (and "
                          f"{EXPANSION_SLACK >> 20} MiB) that a reader decompresses "
                          f"({budget:,} bytes left of this file's)", at)
        return _decompress(compression, memoryview(content)[start:start + n], size, at), \
            0, size, crc

    def _cut(self, f: IO[bytes], opcode: int, kind: str, length: int, room: int, at: int,
             sections: tuple[int, int, int] | None) -> None:
        """A record that runs past its section: the file's cut, or (closed, or lying) damage."""
        if sections:
            raise _Damage(f"damaged: a {kind} record of {length:,} bytes runs past the end of "
                          f"its section ({room:,} bytes left)", at)
        implied = _implied_length(opcode, f.read(min(room, _CUT_PREFIX)))
        if implied is not None and implied != length:
            raise _Damage(f"damaged: a {kind} record whose length field says {length:,} "
                          f"bytes and whose fields say {implied:,}", at)
        self.cut_at = at

    def _closed(self, f: IO[bytes], size: int) -> tuple[int, int, int] | None:
        """Where the data end, the summary and the footer of a closed file are; None: cut.

        A file that ends with the MCAP magic is closed: its footer must read,
        and its summary's and data section's CRCs match. With
        ``allow_damaged``, a closed file that fails those is read as a cut one
        (its damage noted).
        """
        if size < 16 + _FOOTER.size:
            return None
        f.seek(size - 8)
        if f.read(8) != _MCAP_MAGIC:
            return None
        footer = size - 8 - _FOOTER.size
        f.seek(footer)
        try:
            opcode, length, summary, _, summary_crc = _FOOTER.unpack(f.read(_FOOTER.size))
            if opcode != _FOOTER_OP or length != 20:
                raise _Damage("damaged: the file ends with the MCAP magic but not after a "
                              "footer", footer)
            start = summary or footer
            if not 8 + _DATA_END.size <= start <= footer:
                raise _Damage(f"damaged footer: its summary start {summary} is not within "
                              "the file", footer)
            if summary_crc and _crc(f, start, footer + _FOOTER.size - 4) != summary_crc:
                raise _Damage("damaged: the summary's checksum does not match", footer)
            data_end = start - _DATA_END.size
            f.seek(data_end)
            self._data_end(f, f.read(_DATA_END.size), data_end, whole=True)
        except _Damage as e:
            self._damaged(e)
            return None
        return data_end, start, footer

    def _data_end(self, f: IO[bytes], record: bytes, at: int, whole: bool = False) -> None:
        """Check a data end record (``whole``: with its opcode and length) and its CRC."""
        if whole:
            opcode, length, crc = _DATA_END.unpack(record)
            if opcode != _DATA_END_OP or length != 4:
                raise _Damage("damaged: no data end record before the summary", at)
        elif len(record) != 4:
            raise _Damage(f"damaged data end record: {len(record)} bytes, not 4", at)
        else:
            crc = _U32.unpack(record)[0]
        try:
            if crc and _crc(f, 0, at) != crc:
                raise _Damage("damaged: the data section's checksum does not match", at)
        except _Damage as e:
            if not whole:
                raise
            self._damaged(e)  # allowed: read what reads

    def _after_footer(self, f: IO[bytes], at: int) -> None:
        """A footer met in a file that does not end with the magic: a cut in it, or damage."""
        f.seek(at)
        rest = f.read(9)
        if len(rest) < 8 and _MCAP_MAGIC.startswith(rest):
            self.cut_at = at
        elif rest == _MCAP_MAGIC and self.damage is not None:
            self.cut_at = at  # a closed file with a damaged summary, read as far as it goes
        else:
            raise _Damage("damaged: bytes after the footer that are not the MCAP magic", at)


class Reader:
    """Reads one recording: its channels and metadata, its messages, its attachments.

    Each method makes its own pass over the file (nothing is kept open between
    calls). A file cut by a crash reads up to its last complete record; `info`
    says where it was cut. A damaged file (a checksum that does not match, a
    record that contradicts its length or lies past its section, a value past
    the format's or the reader's limits: see docs/recording.md, "Untrusted
    files") raises `RecordingError`, unless ``allow_damaged``.

    Args:
        path (str | os.PathLike): the recording.
        types (Mapping[str, type] | None): the declared type of some topics
            (Output paths): their NamedTuple and dataclass messages are put back
            into it. `messages` raises ValueError for a type whose fields are
            not the recorded ones (by name, in order), and, at its end, for a
            topic the file has no channel of. Default: none (such messages
            come back as tuples and dicts).
        allow_damaged (bool): read a damaged file up to its first damaged
            record, as if it were cut there (`RecordingInfo.damage` says what
            and where), rather than raise. What is read must still decode: a
            bad message, metadata or schema is an error all the same.
            Default: False.

    Example:
        ```python
        for record in Reader("run.mcap").messages():
            print(record.topic, record.t_ns, record.message)
        ```
    """

    def __init__(self, path: str | os.PathLike[str],
                 types: Mapping[str, type] | None = None, *,
                 allow_damaged: bool = False) -> None:
        self.path = os.fspath(path)
        self.types = dict(types or {})
        self.allow_damaged = bool(allow_damaged)

    def _scan(self) -> _Scan:
        return _Scan(self.path, self.allow_damaged)

    def info(self) -> RecordingInfo:
        """Channels, counts, time span, metadata and attachments, without decoding messages.

        Returns:
            RecordingInfo: what the file holds.

        Raises:
            FileNotFoundError: there is no such file.
            RecordingError: the file is not a mujou recording, or is damaged.
        """
        scan = self._scan()
        table = _Channels(self.path)
        result = RecordingInfo(self.path, 0, "")
        for record in scan:
            if type(record) is _Message:
                channel = table.of(record.channel_id)
                channel.count += 1
                channel.bytes += len(record.data)
                t = record.log_time
                channel.first_ns = t if channel.first_ns is None else min(channel.first_ns, t)
                channel.last_ns = t if channel.last_ns is None else max(channel.last_ns, t)
            elif table.take(record):
                pass
            elif isinstance(record, Metadata):
                if record.name == RUN_METADATA:
                    result.run = dict(record.metadata)
                elif record.name == END_METADATA:
                    result.end = dict(record.metadata)
            elif isinstance(record, Attachment):
                result.attachments.append(AttachmentInfo(
                    record.name, record.media_type, record.log_time, len(record.data)))
        result.size, result.complete, result.cut_at = scan.size, scan.complete, scan.cut_at
        result.damage = scan.damage
        result.library = scan.header.library if scan.header else ""
        result.channels, result.views, result.logs = table.ordered()
        result.messages = sum(c.count for c in result.channels)
        firsts = [c.first_ns for c in result.channels if c.first_ns is not None]
        lasts = [c.last_ns for c in result.channels if c.last_ns is not None]
        result.start_ns = min(firsts) if firsts else None
        result.end_ns = max(lasts) if lasts else None
        result.drops = _json_counts(result.end, "drops", self.path, TIME_END)
        result.seeds = _json_counts(result.run, "seeds", self.path, 2**64)
        result.log_dropped = _json_counts(result.end, "log", self.path, TIME_END).get(
            "dropped", 0)
        _check_times(result, self.path)
        return result

    def messages(self, topics: Callable[[str], bool] | None = None) -> Iterator[Record]:
        """The recorded messages, decoded, in the order the run sent them.

        Messages of one instant's delta cycle (one key ``(t_ns, delta)``) come in
        the order of their senders' order in the net, each sender's in the order
        it sent them, so a simulated-time recording comes in ``(t_ns, delta,
        sender order)`` order: the order its readers took them in, whatever the
        worker count. Between keys, the file's order is kept (a simulated run's
        keys only grow, unless a restart took the net back in time; a real-time
        run's threads interleave as they sent).

        Args:
            topics (Callable[[str], bool] | None): which topics to decode (a
                predicate on the Output path); None: all.

        Yields:
            Record: each message.

        Raises:
            FileNotFoundError: there is no such file.
            RecordingError: the file is not a mujou recording, is damaged, or a
                message does not decode (the message names its topic and index).
            ValueError: ``types`` does not fit the file (see `Reader`).
        """
        table = _Channels(self.path)
        checked: set[str] = set()  # the topics of types= checked against their schema
        group: list[tuple[int, Record]] = []
        key: tuple[int, int] | None = None
        for record in self._scan():
            if type(record) is _Message:
                channel = table.of(record.channel_id)
                if channel.view_of is not None or channel.log:
                    continue  # for Foxglove (a view, the log), never decoded here
                if topics is not None and not topics(channel.topic):
                    continue
                if channel.topic in self.types and channel.topic not in checked:
                    _check_declared(channel, self.types[channel.topic])
                    checked.add(channel.topic)
                decoded = self._decode(record, channel, table.first)
                here = (decoded.t_ns, decoded.delta)
                if here != key:
                    yield from _in_order(group)
                    group, key = [], here
                group.append((channel.sender_order, decoded))
            else:
                table.take(record)
        yield from _in_order(group)
        unknown = sorted(set(self.types) - set(table.by_topic))
        if unknown:
            raise ValueError(f"{self.path}: types= names {', '.join(map(repr, unknown))}, "
                             f"which the file has no channel of (it has: "
                             f"{', '.join(table.by_topic) or 'none'})")

    def _decode(self, record: _Message, channel: ChannelInfo, first: int) -> Record:
        """The `Record` of a message record of ``channel``; RecordingError if it does not decode.

        ``first`` is the MCAP sequence of a channel's first message (0 or 1):
        what tells a message's index in the file, named by the error.
        """
        try:
            delta, sequence, message = decode_message(record.data,
                                                       self.types.get(channel.topic))
        except SnapshotError as e:
            raise RecordingError(self.path, f"message {record.sequence - first} of "
                                 f"{channel.topic!r} (t={record.log_time} ns) does not decode: "
                                 f"{str(e).removeprefix('<bytes>: ')}") from e
        t = record.log_time
        if delta == CONTROL_DELTA:
            t, delta = -1, 0
        return Record(channel.topic, record.sequence if sequence is None else sequence, t,
                      delta, message)

    def views(self) -> Iterator[tuple[str, int, int, Any]]:
        """The messages of the view channels (``Recording(view=True)``), parsed, in file order.

        Yields:
            tuple[str, int, int, Any]: ``(view_of, index, t_ns, value)``: the
            Output's path, the view message's count on its channel from 0 (the
            sequence of the lossless message it shows, unless some of the
            Output's messages were dropped or could not be viewed: pair by time
            then), its log time (ns; 0 for a send of ``on_start``) and the JSON
            value.

        Raises:
            FileNotFoundError: there is no such file.
            RecordingError: the file is not a mujou recording, is damaged, or a
                view message is not JSON.
        """
        table = _Channels(self.path)
        for record in self._scan():
            if type(record) is not _Message:
                table.take(record)
                continue
            of = table.of(record.channel_id).view_of
            if of is None:
                continue
            index = record.sequence - table.first
            try:
                value = parse_json(record.data)
            except ValueError as e:
                raise RecordingError(self.path, f"view message {index} of {of!r} is not JSON "
                                     f"({reason(e)})") from e
            yield of, index, record.log_time, value

    def logs(self) -> Iterator[LogEntry]:
        """The run's log records (``Recording(log=True)``), checked, in file order.

        Each message of the log channel must be a ``foxglove.Log`` object of at
        most `foxlog.MAX_ENTRY_BYTES` bytes (see `foxlog.parse_entry` for its
        fields). A file without a log channel yields nothing.

        Yields:
            LogEntry: each record: its time on the run's timer (ns), level,
            message, name (the node's path, else the logger's), file and line.

        Raises:
            FileNotFoundError: there is no such file.
            RecordingError: the file is not a mujou recording, is damaged, or a
                log message is too long, not JSON, or not a ``foxglove.Log``
                (the error names its index).
        """
        table = _Channels(self.path)
        for record in self._scan():
            if type(record) is not _Message:
                table.take(record)
                continue
            if not table.of(record.channel_id).log:
                continue
            index = record.sequence - table.first
            try:
                if len(record.data) > MAX_ENTRY_BYTES:
                    raise ValueError(f"{len(record.data)} bytes, more than the "
                                     f"{MAX_ENTRY_BYTES} of a log entry")
                found = parse_entry(parse_json(record.data))
            except ValueError as e:
                raise RecordingError(self.path, f"log message {index} of {LOG_TOPIC!r} is not "
                                     f"a foxglove.Log entry ({reason(e)})") from e
            yield found

    def attachments(self) -> Iterator[tuple[AttachmentInfo, bytes]]:
        """The attachments, with their data, in file order.

        Yields:
            tuple[AttachmentInfo, bytes]: each attachment and its bytes (for a
            snapshot: ``mujou_actors.snapshot.loads`` gives its tree).

        Raises:
            FileNotFoundError: there is no such file.
            RecordingError: the file is not a mujou recording, or is damaged.
        """
        for record in self._scan():
            if isinstance(record, Attachment):
                yield (AttachmentInfo(record.name, record.media_type, record.log_time,
                                      len(record.data)), record.data)


def is_param(attachment: AttachmentInfo) -> bool:
    """Whether an attachment is a parameter set (`Writer.attach_param`)."""
    return (attachment.name.startswith(PARAM_PREFIX)
            and attachment.media_type == PARAM_MEDIA_TYPE)


# A set's JSON is a few fields and a str parameter's value (params.MAX_STR characters).
_MAX_PARAM_BYTES = 64 * 1024


def read_param(path: str, attachment: AttachmentInfo, data: bytes
               ) -> tuple[int, int, str, str, bool | int | float | str]:
    """A parameter set attachment's ``(t_ns, delta, node, name, value)``, checked.

    Args:
        path (str): the file, for errors.
        attachment (AttachmentInfo): the attachment (`is_param` holds).
        data (bytes): its bytes.

    Raises:
        RecordingError: bigger than 64 KiB, not JSON, or not the fields of a
            set (ints for the key, strs for the node and name, a bool, int,
            float or str value); names the attachment.
    """
    where = f"parameter set {attachment.name!r}"
    if len(data) > _MAX_PARAM_BYTES:
        raise RecordingError(path, f"{where} is {len(data)} bytes, more than a set's "
                             f"{_MAX_PARAM_BYTES}")
    try:
        found = parse_json(data)
    except ValueError as exc:
        raise RecordingError(path, f"{where} is not JSON: {exc}") from None
    fields = ("delta", "name", "node", "t_ns", "value")
    if not isinstance(found, dict) or sorted(found) != list(fields):
        raise RecordingError(path, f"{where} must hold exactly the fields {list(fields)}")
    t_ns, delta, node, name, value = (found[k] for k in ("t_ns", "delta", "node", "name",
                                                          "value"))
    if type(t_ns) is not int or type(delta) is not int or not -1 <= t_ns < 2**63 \
            or not 0 <= delta < 2**31:
        raise RecordingError(path, f"{where}: t_ns and delta must be the ints of a key")
    if type(node) is not str or type(name) is not str \
            or type(value) not in (bool, int, float, str):
        raise RecordingError(path, f"{where}: node and name must be str, value a bool, int, "
                             "float or str")
    return t_ns, delta, node, name, value


def _check_declared(channel: ChannelInfo, declared: type) -> None:
    """ValueError unless ``declared`` fits the recorded messages of ``channel`` (types=).

    A NamedTuple or dataclass given for a channel must have the fields its schema
    records, by name and in order: its messages are rebuilt from their values.
    Another type is not used to rebuild anything, and passes.
    """
    recorded = channel.schema.get("fields")
    own = _fields(declared) if isinstance(declared, type) else None
    if own is None:
        return  # another type (float, torch.Tensor): nothing is rebuilt into it
    if recorded is None:
        raise ValueError(f"types=: {channel.topic!r} holds {channel.type} messages, not a "
                         f"NamedTuple's or a dataclass's: {type_name(declared)} does not apply")
    names, had = [name for name, _ in own], [name for name, _ in recorded]
    if names != had:
        raise ValueError(f"types=: {type_name(declared)} has the fields {names}, but "
                         f"{channel.topic!r} recorded {channel.type} with {had}")


def _in_order(group: list[tuple[int, Record]]) -> Iterator[Record]:
    """One key's records by their senders' order (stable: each sender's as it sent them)."""
    if len(group) > 1:
        group.sort(key=lambda item: item[0])
    return (record for _, record in group)


def _json_counts(meta: Mapping[str, str] | None, key: str, path: str,
                 end: int) -> dict[str, int]:
    """A JSON object of ints in ``[0, end)`` in a metadata record ({} if absent).

    Raises:
        RecordingError: it is not such an object.
    """
    if not meta or not meta.get(key):
        return {}
    try:
        value = parse_json(meta[key])
        if not isinstance(value, dict) or not all(
                type(v) is int and 0 <= v < end for v in value.values()):
            raise ValueError(f"not an object of ints in [0, {end:#x})")
    except ValueError as e:
        raise RecordingError(path, f"bad {key!r} in its metadata ({reason(e)})") from e
    return value


def _check_times(found: RecordingInfo, path: str) -> None:
    """RecordingError unless the run's seed and end time, where given, are in range."""
    for meta, key, end in ((found.run, "seed", 2**64), (found.end, "time_ns", TIME_END)):
        text = (meta or {}).get(key, "")
        if text == "":
            continue
        try:
            if not (text.isascii() and text.isdigit() and 0 <= int(text) < end):
                raise ValueError
        except ValueError:
            raise RecordingError(path, f"bad {key!r} in its metadata: {text[:40]!r} is not "
                                 f"an int in [0, {end:#x})") from None


def read(path: str | os.PathLike[str], types: Mapping[str, type] | None = None, *,
         allow_damaged: bool = False) -> Iterator[Record]:
    """The messages of a recording, decoded (``Reader(path, types).messages()``).

    Args:
        path (str | os.PathLike): the recording.
        types (Mapping[str, type] | None): declared types by topic (see `Reader`).
        allow_damaged (bool): read a damaged file up to its damage (see
            `Reader`). Default: False.

    Returns:
        Iterator[Record]: the messages, in the order `Reader.messages` gives.

    Raises:
        FileNotFoundError, RecordingError: as `Reader.messages` (when iterated).
    """
    return Reader(path, types, allow_damaged=allow_damaged).messages()


def info(path: str | os.PathLike[str], *, allow_damaged: bool = False) -> RecordingInfo:
    """What a recording holds (``Reader(path).info()``).

    Args:
        path (str | os.PathLike): the recording.
        allow_damaged (bool): read a damaged file up to its damage (see
            `Reader`; `RecordingInfo.damage` says what). Default: False.

    Returns:
        RecordingInfo: channels, counts, time span, metadata, attachments.

    Raises:
        FileNotFoundError: there is no such file.
        RecordingError: the file is not a mujou recording, or is damaged.
    """
    return Reader(path, allow_damaged=allow_damaged).info()
