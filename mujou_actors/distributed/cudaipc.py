"""CUDA tensors between group processes of one machine: CUDA IPC instead of the host copy.

Without this module, a CUDA tensor in a port message that crosses between
two group processes is copied to the CPU by the data plane's encoder
(`wire`), and the reading kernel puts it back on its device: two trips over
PCIe per message. On one machine the reader can instead open the sender's
device memory itself, as ``torch.multiprocessing`` does (CUDA IPC), and copy
it device to device. This module is that path, for the `wire` encoder and
decoder of a link; `dataplane` carries its two small tables in the header of
each exchange.

The producer (a group's `Exporter`), in `Exporter.prepare`, for each CUDA
tensor of the messages of an outgoing reply, when the tensor may be shared:

1. orders the data-plane thread's stream after the tensor's producing work
   (the message took the device path because its readers outside count as
   readers on the device, `_runtime.build.copier`: the sender's clone comes
   with its *ready* event, which that stream waits for), records an
   interprocess event on that stream and takes its IPC handle;
2. shares the tensor's storage (``UntypedStorage._share_cuda_``, what
   ``torch.multiprocessing.reductions.reduce_tensor`` calls, so torch's own
   reference counter of shared blocks, ``CudaIPCSentData``, applies too);
3. puts a CPU *placeholder* of the tensor's dtype and shape (one element of
   memory) in the message, tagged with what it stands for; the encoder
   (`wire.Encoder`, through `Exporter.export`) writes a *descriptor* in the
   tensor's place, a list of plain ints and bytes, never a pickle, under a
   fresh *export id*;
4. keeps a reference to the tensor until the consumer gives that id back
   (`Exporter.release`), so the caching allocator cannot hand its block to
   other work meanwhile.

The consumer (a group's `Importer`), for each descriptor: opens the handle
(``torch.multiprocessing.reductions.rebuild_cuda_tensor``, given this
process's own classes: nothing from the wire is code), makes its stream wait
for the producer's interprocess event (``torch.cuda.Event.from_ipc_handle``,
``stream.wait_event``: on the GPU, no thread blocks), copies the tensor into
memory of its own on that stream (contiguous, writable, sharing memory with
nothing, as every received tensor is) and records a *done* event. The reader
gets the copy, on the producer's device (the reading kernel moves it to its
own device as for any received message). An export id goes back to the
producer with the next exchange after its done event completed, and the
opened handle is dropped then: a consumer never holds another process's
memory longer than one copy.

Why copy, when IPC could hand the producer's memory itself over: a received
tensor is the reader's own (it may write to it, resize it, keep it for ever),
while the producer's tensor is still the message its local readers share.
Handing memory over would need the reader's last reference to be tracked
across processes; a copy of 4 MiB on the device takes microseconds and makes
the release deterministic: one round trip after the message was decoded,
whatever the reader does with it. It also settles QoS: a message that the
reader's Input drops was copied, and released, all the same.

The host in between. Every message between two groups passes through the
host, which decodes and re-encodes it. The host opens no handle to relay one
(it may not even use CUDA): its `Relay` leaves the decoded tensor as an unfilled CPU
*placeholder* tagged with its descriptor, and the host's `Exporter` puts the
same descriptor (with an export id of its own) on each link the message goes
on: one message read in two groups is two opens and two copies, and the
producer's id goes back once both came back and the host let go of the
placeholder (a weak reference's callback). A message the host drops (the
reply to an abandoned grant after a restart) releases at once for the same
reason. A closed link's `Exporter` (its group died) gives back every forward
it held. Only for the host's own group, whose nodes read relayed messages in
the host's process, does the host open them: its `LocalOpener`, an `Importer`
counted as one more forward.

Falls back to the host path (the tensor's bytes on the wire, as before) when
the link has no CUDA IPC (another machine: a ``tcp://`` link; not Linux;
torch without CUDA), the tensor cannot be shared (empty, conjugate or
negative bits set, memory torch did not allocate), or the producer already
holds `max_in_flight` tensors or `max_bytes` bytes for its consumers (the
bound: a slow or stuck consumer cannot pin the producer's GPU memory without
limit). Each fallback is counted by reason (`Exporter.stats`) and the first
of each reason is logged.

A group that dies: its process's CUDA context goes, and with it every
mapping it opened and every block it exported (the driver frees them). A
surviving consumer holds a dead producer's memory for at most one copy (it
drops the opened handle when the copy is done); one that opens a handle of a
producer already gone gets a ``WireError`` (the run's recovery restarts the
groups from a snapshot, and the abandoned timeline's messages are not
delivered). The host's `Exporter` of a closed link drops its forwards, which
releases them to their producers.

Limits: every process must see the producer's GPU (descriptors name it by
UUID, mapped to this process's ordinal, so ``CUDA_VISIBLE_DEVICES`` may order
them differently, but not hide it); tensors with autograd history cross
detached, as every message does.

The runtime seam: every CUDA call goes through an `IpcRuntime` (`TorchIpc`,
the real one), so the CPU tests put a strict fake behind it
(``tests/fake_cudaipc.py``).
"""

from __future__ import annotations

import itertools
import logging
import secrets
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from ..devices import DeviceMessage
from ..errors import WireError, reason
from ..messages import map_tensors, tensors_in

__all__ = ["IpcRuntime", "TorchIpc", "Exporter", "Importer", "Relay", "LocalOpener", "swap",
           "host_items", "to_host_without_cuda", "check_rows",
           "MAX_IN_FLIGHT", "MAX_BYTES", "MAX_ROWS", "MAX_BATCH_BYTES"]

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64
"""Default bound of an `Exporter`: tensors shared and not yet released."""

MAX_BYTES = 1 << 30
"""Default bound of an `Exporter`: bytes of tensors shared and not yet released (1 GiB)."""

MAX_ROWS = 4096
"""Most descriptors a decoder takes in one batch (the host relays several producers')."""

MAX_BATCH_BYTES = 1 << 38
"""Most bytes the descriptors of one batch may claim (the placeholders are made that big)."""

# A descriptor: [index, export id, device uuid, handle, storage bytes, storage offset bytes,
#                ref counter handle, ref counter offset, torch event handle, torch event needed,
#                tensor offset (elements), strides, nbytes, interprocess event handle]
_FIELDS = 14
_HANDLE_BYTES = 256  # CUDA's IPC handles are 64 bytes; torch's counter names are short
_INT64 = 1 << 63


# ---------------------------------------------------------------------------
# The runtime seam


class IpcRuntime:
    """The CUDA calls of the IPC path; `TorchIpc` makes them, a test's fake stands in.

    Every method is one step of the path, so a fake can check the order (event
    recorded before the handle is taken, the wait before the copy).
    """

    def available(self) -> bool:
        """bool: whether this process can share CUDA memory with another one."""
        raise NotImplementedError

    def device_uuid(self, index: int) -> bytes:
        """bytes: the UUID of this process's CUDA device ``index``."""
        raise NotImplementedError

    def local_index(self, uuid: bytes) -> int | None:
        """int | None: this process's ordinal of the device with ``uuid``; None: not seen."""
        raise NotImplementedError

    def current_stream(self, device: torch.device) -> Any:
        """The calling thread's current stream of ``device``."""
        raise NotImplementedError

    def wait_event(self, stream: Any, event: Any) -> None:
        """Make ``stream`` wait (on the GPU) for ``event``."""
        raise NotImplementedError

    def ipc_event(self, stream: Any) -> tuple[Any, bytes]:
        """A new interprocess event recorded on ``stream``, and its IPC handle."""
        raise NotImplementedError

    def share(self, tensor: torch.Tensor, stream: Any) -> list[Any]:
        """The plain fields that open ``tensor``'s storage in another process.

        ``[handle, storage bytes, storage offset bytes, ref counter handle,
        ref counter offset, torch event handle, torch event needed]``: what
        ``UntypedStorage._share_cuda_`` gives, taken with ``stream`` current.

        Raises:
            RuntimeError: the storage cannot be shared.
        """
        raise NotImplementedError

    def open(self, index: int, fields: list[Any], dtype: torch.dtype, shape: Sequence[int],
             offset: int, strides: Sequence[int]) -> torch.Tensor:
        """The producer's tensor, opened in this process (sharing its memory)."""
        raise NotImplementedError

    def event_from_handle(self, index: int, handle: bytes) -> Any:
        """The producer's interprocess event, opened on device ``index``."""
        raise NotImplementedError

    def copy_on(self, stream: Any, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of ``tensor`` of this process's own, queued on ``stream``."""
        raise NotImplementedError

    def done_event(self, stream: Any) -> Any:
        """A new (not interprocess) event recorded on ``stream``."""
        raise NotImplementedError

    def to_cpu(self, stream: Any, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` copied to the CPU on ``stream`` (the calling thread waits)."""
        raise NotImplementedError

    def query(self, event: Any) -> bool:
        """bool: whether the work before ``event`` is done (never waits)."""
        raise NotImplementedError

    def synchronize(self, event: Any) -> None:
        """Wait (the calling thread) until the work before ``event`` is done."""
        raise NotImplementedError


class TorchIpc(IpcRuntime):
    """`IpcRuntime` on ``torch.cuda`` and ``torch.multiprocessing.reductions``."""

    def available(self) -> bool:
        return sys.platform.startswith("linux") and torch.cuda.is_available()

    def device_uuid(self, index: int) -> bytes:
        return str(torch.cuda.get_device_properties(index).uuid).encode()

    def local_index(self, uuid: bytes) -> int | None:
        for i in range(torch.cuda.device_count()):
            if self.device_uuid(i) == uuid:
                return i
        return None

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def wait_event(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def ipc_event(self, stream: Any) -> tuple[Any, bytes]:
        event = torch.cuda.Event(interprocess=True)
        event.record(stream)
        return event, bytes(event.ipc_handle())

    def share(self, tensor: torch.Tensor, stream: Any) -> list[Any]:
        with torch.cuda.stream(stream):  # torch records its own event on the current stream
            (_, handle, size, offset, counter, counter_offset, event,
             needed) = tensor.untyped_storage()._share_cuda_()
        return [bytes(handle), int(size), int(offset), bytes(counter), int(counter_offset),
                None if event is None else bytes(event), bool(needed)]

    def open(self, index: int, fields: list[Any], dtype: torch.dtype, shape: Sequence[int],
             offset: int, strides: Sequence[int]) -> torch.Tensor:
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        handle, size, storage_offset, counter, counter_offset, event, needed = fields
        # This process's own classes, never ones named by the bytes.
        return rebuild_cuda_tensor(torch.Tensor, torch.Size(shape), tuple(strides), offset,
                                   torch.UntypedStorage, dtype, index, handle, size,
                                   storage_offset, False, counter, counter_offset, event,
                                   needed)

    def event_from_handle(self, index: int, handle: bytes) -> Any:
        return torch.cuda.Event.from_ipc_handle(index, handle)

    def copy_on(self, stream: Any, tensor: torch.Tensor) -> torch.Tensor:
        with torch.cuda.stream(stream):
            out = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
            out.copy_(tensor)
        return out

    def done_event(self, stream: Any) -> Any:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def to_cpu(self, stream: Any, tensor: torch.Tensor) -> torch.Tensor:
        with torch.cuda.stream(stream):
            return tensor.cpu()

    def query(self, event: Any) -> bool:
        return bool(event.query())

    def synchronize(self, event: Any) -> None:
        event.synchronize()


# ---------------------------------------------------------------------------
# The producer's side (and the host's forwards)


class _Shared:
    """A tensor this process shares: kept alive by its placeholder and its export ids.

    ``row`` is its descriptor without the index and the export id.
    """

    __slots__ = ("tensor", "event", "nbytes", "row")

    def __init__(self, tensor: torch.Tensor, event: Any, nbytes: int, row: list[Any]) -> None:
        self.tensor = tensor
        self.event = event  # the interprocess event: kept until released, as its handle is
        self.nbytes = nbytes
        self.row = row


class _Lease:
    """A descriptor held in the host: released to its producer when nobody needs it.

    ``count`` forwards are out (each given back by its consumer), and ``alive``
    while the host's placeholder tensor exists (it may still be forwarded).
    """

    __slots__ = ("row", "origin", "count", "alive", "__weakref__")

    def __init__(self, row: list[Any], origin: Relay) -> None:
        self.row = row
        self.origin = origin
        self.count = 0
        self.alive = True

    def drop(self) -> None:
        """The placeholder is gone: no more forwards."""
        self.alive = False
        self._check()

    def give(self) -> None:
        """A consumer gave one forward back."""
        self.count -= 1
        self._check()

    def _check(self) -> None:
        if not self.alive and self.count <= 0:
            self.origin.released(self.row[1])


def _placeholder(tensor: torch.Tensor, tag: Any) -> torch.Tensor:
    """A CPU tensor of ``tensor``'s dtype and shape, one element of memory, tagged.

    What the codec encodes in the shared tensor's place (it reads only dtype and
    shape); the encoder finds the tag and writes the descriptor instead of bytes.
    """
    out = torch.empty(1, dtype=tensor.dtype).expand(tensor.shape)
    out._mujou_shared = tag  # type: ignore[attr-defined]
    return out


class Exporter:
    """The producer's end of CUDA IPC on one link (a group's, or the host's forwards).

    A group's exporter shares its CUDA tensors in `prepare` and hands each
    descriptor to the encoder (`export`); the host's (``rt`` None) forwards
    the descriptors its `Relay` decoded.

    Args:
        rt (IpcRuntime | None): the CUDA calls; None: this end shares nothing
            of its own and only forwards (the host).
        max_in_flight (int): export ids given out and not released, at most;
            past it a tensor takes the host path. Default `MAX_IN_FLIGHT`.
        max_bytes (int): their tensors' bytes, at most. Default `MAX_BYTES`.

    Raises:
        ValueError: a bound below 1.

    Not thread-safe: used by the link's one thread (as `wire.Encoder`).
    """

    def __init__(self, rt: IpcRuntime | None, *, max_in_flight: int = MAX_IN_FLIGHT,
                 max_bytes: int = MAX_BYTES) -> None:
        if type(max_in_flight) is not int or max_in_flight < 1:
            raise ValueError(f"Exporter: max_in_flight must be an int >= 1, got {max_in_flight!r}")
        if type(max_bytes) is not int or max_bytes < 1:
            raise ValueError(f"Exporter: max_bytes must be an int >= 1, got {max_bytes!r}")
        self.rt = rt
        self.can_share = rt is not None and rt.available()
        self.max_in_flight = max_in_flight
        self.max_bytes = max_bytes
        # Ids never repeat, across restarts too: a late release of a former process's
        # id cannot free a tensor of this one.
        self._ids = itertools.count(secrets.randbits(62))
        self._held: dict[int, _Shared] = {}
        self._forwards: dict[int, _Lease] = {}
        self._bytes = 0
        # Shared by the prepare in progress, not exported yet: tensors, bytes.
        self._pending = self._pending_bytes = 0
        self._uuids: dict[int, bytes] = {}
        self.exported = self.forwarded = self.released_count = 0
        self.fallbacks: dict[str, int] = {}

    @property
    def in_flight(self) -> int:
        """int: export ids of this end's own tensors not released yet (forwards not counted)."""
        return len(self._held)

    @property
    def bytes_in_flight(self) -> int:
        """int: their bytes (a tensor sent twice counts twice)."""
        return self._bytes

    def stats(self) -> dict[str, Any]:
        """dict: ``exported``, ``forwarded``, ``released``, ``in_flight``, ``bytes_in_flight``
        and ``fallbacks`` (reason -> count: ``"bound"``, ``"not shareable"``,
        ``"unavailable"``)."""
        return {"exported": self.exported, "forwarded": self.forwarded,
                "released": self.released_count, "in_flight": len(self._held),
                "bytes_in_flight": self._bytes, "fallbacks": dict(self.fallbacks)}

    def prepare(self, items: list[Any], shared: int) -> list[Any]:
        """The items of a group's reply made ready to encode: CUDA tensors shared or copied.

        A message that took the device path (a `devices.DeviceMessage`: the
        sender's clone, with its ready event) is unwrapped, and the calling
        thread's current stream of its device waits for the ready event, so
        that what follows on that stream comes after the clone. Then each CUDA
        tensor of the first ``shared`` items is shared when it can be (an
        interprocess event recorded on that stream, the storage's IPC handle
        taken; the message gets a tagged placeholder that the encoder turns
        into the descriptor, `export`) and copied to the CPU on that stream
        otherwise (the host path, counted in `fallbacks`). The items from
        ``shared`` on are the host's copies of subscribed messages, which the
        host reads itself: their CUDA tensors are copied to the CPU.

        Args:
            items (list): ``(t_ns, delta, sender, port, message)`` each.
            shared (int): how many items, from the first, may share CUDA memory.

        Returns:
            list: the items, the same list when nothing needed a change.
        """
        out = None
        self._pending = self._pending_bytes = 0
        for i, item in enumerate(items):
            message = item[4]
            if type(message) is DeviceMessage:
                if self.rt is not None:
                    self.rt.wait_event(self.rt.current_stream(message.device), message.event)
                    message = message.value
                else:  # no IPC here: the host copy, ordered after the ready event
                    message = _host_copy(message)
            if _has_cuda(message):
                message = map_tensors(message, self._share if i < shared else _cpu_of)
            elif message is item[4]:
                continue
            if out is None:
                out = list(items)
            out[i] = (*item[:4], message)
        return items if out is None else out

    def _share(self, tensor: torch.Tensor) -> torch.Tensor:
        """A CUDA tensor's tagged placeholder, or its host copy (a fallback)."""
        if tensor.device.type != "cuda":
            return tensor
        nbytes = tensor.numel() * tensor.element_size()
        why = self._problem(tensor, nbytes)
        if why is not None:
            self._fallback(why)
            return _cpu_of(tensor)
        rt = self.rt
        assert rt is not None
        index = tensor.device.index or 0
        uuid = self._uuids.get(index)
        if uuid is None:
            uuid = self._uuids[index] = rt.device_uuid(index)
        stream = rt.current_stream(tensor.device)
        # The event first: the consumer's copy waits for everything queued before it on
        # this stream, the wait for the sender's ready event (above) included.
        event, event_handle = rt.ipc_event(stream)
        try:
            fields = rt.share(tensor, stream)
        except RuntimeError as e:  # memory torch's allocator did not make, and the like
            self._fallback("not shareable", reason(e))
            return _cpu_of(tensor)
        self._pending += 1
        self._pending_bytes += nbytes
        row = [uuid, *fields, tensor.storage_offset(), list(tensor.stride()), nbytes,
               event_handle]
        return _placeholder(tensor, _Shared(tensor, event, nbytes, row))

    def export(self, tensor: torch.Tensor, nbytes: int, index: int) -> list[Any] | None:
        """The descriptor of a tensor of the batch being encoded; None: its bytes go.

        Called by `wire.Encoder` for each tensor. A placeholder of `prepare` or
        of the host's `Relay` gets a fresh export id (each occurrence its own,
        so each is released on its own); any other tensor takes the host path.

        Args:
            tensor (torch.Tensor): a tensor of the batch.
            nbytes (int): its bytes (the codec's count).
            index (int): its index among the batch's tensors.

        Returns:
            list | None: the descriptor (plain ints and bytes), or None.
        """
        tag = getattr(tensor, "_mujou_shared", None)
        if tag is None:
            return None
        eid = next(self._ids)
        if type(tag) is _Lease:
            self._forwards[eid] = tag
            tag.count += 1
            self.forwarded += 1
            return [index, eid, *tag.row[2:]]
        self._held[eid] = tag
        self._bytes += tag.nbytes
        self.exported += 1
        return [index, eid, *tag.row]

    def _problem(self, tensor: torch.Tensor, nbytes: int) -> str | None:
        if not self.can_share:
            return "unavailable"
        if nbytes == 0 or tensor.is_conj() or tensor.is_neg() or tensor.layout != torch.strided:
            return "not shareable"
        if len(self._held) + self._pending >= self.max_in_flight \
                or self._bytes + self._pending_bytes + nbytes > self.max_bytes:
            return "bound"
        return None

    def _fallback(self, why: str, detail: str = "") -> None:
        count = self.fallbacks[why] = self.fallbacks.get(why, 0) + 1
        if count == 1:
            extra = f" ({detail})" if detail else ""
            log.info("CUDA IPC: a CUDA tensor crosses by the host copy: %s%s (logged once per "
                     "reason; Exporter.stats counts them)", why, extra)

    def release(self, ids: Sequence[int]) -> None:
        """The consumer is done with these export ids (unknown ones are ignored).

        Args:
            ids (Sequence[int]): ids from the peer's `Importer.take_released` or
                `Relay.take_released`.
        """
        for eid in ids:
            if type(eid) is not int:
                continue
            held = self._held.pop(eid, None)
            if held is not None:
                self._bytes -= held.nbytes
                self.released_count += 1
                continue
            lease = self._forwards.pop(eid, None)
            if lease is not None:
                self.released_count += 1
                lease.give()

    def cancel(self, rows: Sequence[list[Any]]) -> None:
        """Takes back the descriptors of a batch that is not sent after all."""
        self.release([row[1] for row in rows])

    def close(self) -> None:
        """Drops every export and forward: the peer is gone or the link ends.

        A dead consumer's mappings went with its process; the forwards it held
        are released to their producers.
        """
        self.release(list(self._held) + list(self._forwards))


def _has_cuda(message: Any) -> bool:
    if type(message) is torch.Tensor:
        return message.device.type == "cuda"
    return any(t.device.type == "cuda" for t in tensors_in(message))


def _cpu_of(t: torch.Tensor) -> torch.Tensor:
    return t.cpu() if t.device.type == "cuda" else t


def host_items(items: list[Any], rt: IpcRuntime | None = None) -> list[Any]:
    """The items with every device-path message copied to the CPU (a link without IPC).

    A group's CUDA sender whose Output has a reader on its own device in the
    group hands its outbox the device path's `devices.DeviceMessage`, which
    the wire cannot encode: its tensors are copied to the CPU here, on the
    calling thread's current stream after it waited for the ready event.

    Args:
        items (list): ``(t_ns, delta, sender, port, message)`` each.
        rt (IpcRuntime | None): the stream calls (a test's fake); None: torch's.

    Returns:
        list: the items, the same list when none held a device-path message.
    """
    out = None
    for i, item in enumerate(items):
        message = item[4]
        if type(message) is not DeviceMessage:
            continue
        if rt is not None:
            rt.wait_event(rt.current_stream(message.device), message.event)
            copied = map_tensors(message.value, _cpu_of)
        else:
            copied = _host_copy(message)
        if out is None:
            out = list(items)
        out[i] = (*item[:4], copied)
    return items if out is None else out


def _host_copy(message: DeviceMessage) -> Any:
    """A device-path message on the CPU, without a runtime: torch orders it itself.

    ``.cpu()`` runs on the current stream of the tensor's device after the
    ready event is waited for on it.
    """
    event = message.event
    stream = torch.cuda.current_stream(message.device)
    stream.wait_event(event)
    return map_tensors(message.value, _cpu_of)


# ---------------------------------------------------------------------------
# The consumer's side, and the host's


def _check_row(row: Any) -> tuple[int, int, int]:
    """(index, export id, nbytes) of a descriptor whose form is right; WireError otherwise."""
    if type(row) is not list or len(row) != _FIELDS:
        raise WireError(f"a CUDA IPC descriptor is not a list of {_FIELDS} fields: "
                        f"{type(row).__name__}")
    (index, eid, uuid, handle, size, offset, counter, counter_offset, event, needed, t_offset,
     strides, nbytes, ipc_event) = row
    ints = (index, eid, size, offset, counter_offset, t_offset, nbytes)
    if any(type(v) is not int or not 0 <= v < _INT64 for v in ints):
        raise WireError("a CUDA IPC descriptor has a number out of range")
    blobs = (uuid, handle, counter, ipc_event) + (() if event is None else (event,))
    if any(type(b) is not bytes or len(b) > _HANDLE_BYTES for b in blobs):
        raise WireError(f"a CUDA IPC descriptor has a handle that is not bytes (at most "
                        f"{_HANDLE_BYTES})")
    if type(needed) is not bool or type(strides) is not list or len(strides) > 64 \
            or any(type(s) is not int or not 0 <= s < _INT64 for s in strides):
        raise WireError("a CUDA IPC descriptor has bad strides or flags")
    # Not nbytes <= size: an expanded tensor (stride 0) views fewer bytes than it holds.
    # Whether the view fits its storage is torch's check when the handle is opened.
    if nbytes < 1 or size < 1:
        raise WireError(f"a CUDA IPC descriptor of {nbytes} bytes in a storage of {size}")
    return index, eid, nbytes


def check_rows(rows: Any) -> dict[int, list[Any]]:
    """The descriptors of a batch by tensor index, checked for form and bounds.

    Each index is checked against the decoded batch's tensors later
    (`wire.Decoder`), and each descriptor against its tensor's placeholder
    by `Importer.take`.

    Args:
        rows: what the link's header carried (a list of descriptors).

    Returns:
        dict[int, list]: index -> descriptor.

    Raises:
        WireError: not a list, more than `MAX_ROWS`, a descriptor of the wrong
            form, two for one index, or more than `MAX_BATCH_BYTES` in all.
    """
    if type(rows) is not list or len(rows) > MAX_ROWS:
        raise WireError(f"the CUDA IPC descriptors are not a list of at most {MAX_ROWS}")
    out: dict[int, list[Any]] = {}
    total = 0
    for row in rows:
        index, _, nbytes = _check_row(row)
        if index in out:
            raise WireError(f"two CUDA IPC descriptors for tensor {index}")
        out[index] = row
        total += nbytes
    if total > MAX_BATCH_BYTES:
        raise WireError(f"the CUDA IPC descriptors claim {total} bytes, more than "
                        f"{MAX_BATCH_BYTES}")
    return out


class Importer:
    """The consumer's end of CUDA IPC on one link: opens, copies, gives the ids back.

    Args:
        rt (IpcRuntime): the CUDA calls.

    Attributes:
        to_host (bool): give the readers CPU tensors (copied on the same
            stream, after the device copy): for a group without CUDA nodes,
            whose kernel would hand a CUDA tensor to a CPU node as it is. A
            group with CUDA nodes leaves it False: its kernel's delivery puts
            each received tensor on its reader's device (`Kernel.deliver`'s
            copy, on this thread's stream, waited for). Default False.

    Not thread-safe: used by the link's one thread (as `wire.Decoder`).
    """

    def __init__(self, rt: IpcRuntime) -> None:
        self.rt = rt
        self.to_host = False
        # (export id, done event, the opened tensor) per copy not known done
        self._pending: list[tuple[int, Any, torch.Tensor | None]] = []
        self._released: list[int] = []

    def take(self, tensors: list[torch.Tensor], rows: dict[int, list[Any]]) -> dict[int, Any]:
        """Opens each descriptor's tensor: {id of the placeholder: the received tensor}.

        Args:
            tensors (list[torch.Tensor]): the batch's decoded tensors (the
                placeholders of the shared ones among them, unfilled).
            rows (dict[int, list]): `check_rows`'s result.

        Returns:
            dict[int, torch.Tensor]: ``id(placeholder)`` -> the tensor on the
            producer's device, of this process's own, for `swap`.

        Raises:
            WireError: a descriptor that does not fit its placeholder, a device
                this process does not see, or a handle that does not open (its
                producer is gone?).
        """
        rt = self.rt
        out: dict[int, Any] = {}
        for index, row in rows.items():
            (_, eid, uuid, handle, size, offset, counter, counter_offset, event, needed,
             t_offset, strides, nbytes, ipc_event) = row
            placeholder = tensors[index]
            if len(strides) != placeholder.dim():
                raise WireError(f"CUDA IPC descriptor of tensor {index}: {len(strides)} strides "
                                f"for {placeholder.dim()} dimensions")
            device_index = rt.local_index(uuid)
            if device_index is None:
                raise WireError(f"tensor {index} is on a CUDA device this process does not see "
                                f"(uuid {uuid!r}): CUDA IPC needs every group to see the "
                                "producer's GPU")
            device = torch.device("cuda", device_index)
            stream = rt.current_stream(device)
            try:
                ready = rt.event_from_handle(device_index, ipc_event)
                rt.wait_event(stream, ready)  # before anything reads the memory
                source = rt.open(device_index, [handle, size, offset, counter, counter_offset,
                                                event, needed],
                                 placeholder.dtype, placeholder.shape, t_offset, strides)
                mine = rt.copy_on(stream, source)
            except (RuntimeError, ValueError, TypeError) as e:
                raise WireError(f"tensor {index}: its CUDA IPC handle does not open "
                                f"({reason(e)}): its producer is gone?") from None
            self._pending.append((eid, rt.done_event(stream), source))
            out[id(placeholder)] = rt.to_cpu(stream, mine) if self.to_host else mine
        return out

    def take_released(self) -> list[int]:
        """The export ids whose copies are done, for the producer's `Exporter.release`.

        The opened handles of those are dropped here. Never waits: a copy not
        done yet is given back with a later call.
        """
        pending = self._pending
        if pending:
            keep = []
            for entry in pending:
                if self.rt.query(entry[1]):
                    self._released.append(entry[0])
                else:
                    keep.append(entry)
            self._pending = keep
        released, self._released = self._released, []
        return released

    def close(self) -> None:
        """Waits for the copies in flight and drops every opened handle; idempotent."""
        for _, event, _ in self._pending:
            try:
                self.rt.synchronize(event)
            except RuntimeError:  # the context is going: nothing left to wait for
                pass
        self._pending = []


def to_host_without_cuda(receiver: Any, actors: Sequence[Any]) -> None:
    """Set an `Importer`'s ``to_host`` when none of the kernel's actors is on CUDA.

    Args:
        receiver: the link's `Importer` (a `Relay` is left alone).
        actors (Sequence): the kernel's actors (``device`` each).
    """
    if isinstance(receiver, Importer):
        receiver.to_host = not any(a.device.type == "cuda" for a in actors)


class Relay:
    """The host's decoder side: descriptors kept on placeholders, to be forwarded.

    The host opens no handle: each shared tensor stays the unfilled CPU
    placeholder that the codec made, tagged with its descriptor (a `_Lease`).
    The host's `Exporter` of each link the message goes on forwards it; the
    producer's id comes back to it (`take_released`) once every forward was
    given back and the placeholder is gone.
    """

    def __init__(self) -> None:
        self._released: list[int] = []
        self._lock = threading.Lock()  # weakref callbacks run where the last reference goes

    def take(self, tensors: list[torch.Tensor], rows: dict[int, list[Any]]) -> dict[int, Any]:
        """Tags each shared tensor's placeholder with its descriptor, to be forwarded.

        Args:
            tensors (list[torch.Tensor]): the batch's decoded tensors.
            rows (dict[int, list]): `check_rows`'s result.

        Returns:
            dict: empty: the placeholders stay in the messages (CPU tensors of
            the right dtype and shape, unfilled: never read their values).
        """
        for index, row in rows.items():
            placeholder = tensors[index]
            lease = _Lease(row, self)
            placeholder._mujou_shared = lease  # type: ignore[attr-defined]
            weakref.finalize(placeholder, lease.drop)
        return {}

    def released(self, eid: int) -> None:
        """A lease's producer id is free (called by `_Lease`)."""
        with self._lock:
            self._released.append(eid)

    def take_released(self) -> list[int]:
        """The producer's ids that nobody here needs any more."""
        with self._lock:
            released, self._released = self._released, []
        return released

    def close(self) -> None:
        """Nothing to let go of: placeholders hold no device memory."""


class LocalOpener:
    """The host's own group's end: relayed descriptors opened in the host's process.

    The host's own group reads relayed messages as Python objects, not
    through a socket, so a shared tensor reaches it as the `Relay`'s
    placeholder; this opens each (an `Importer`, counted as one more forward
    of its descriptor) before the messages are delivered.

    Args:
        rt (IpcRuntime): the CUDA calls.
    """

    def __init__(self, rt: IpcRuntime) -> None:
        self.importer = Importer(rt)
        self._leases: dict[int, _Lease] = {}
        self._ids = itertools.count(1)

    def open(self, items: list[Any]) -> list[Any]:
        """The items with every placeholder replaced by the tensor it stands for.

        Args:
            items (list): ``(t_ns, delta, sender, output, message)`` each, as relayed.

        Returns:
            list: the items (the same list when no message holds a placeholder).

        Raises:
            WireError: a descriptor that does not open (see `Importer.take`).
        """
        self.poll()
        out = None
        for i, item in enumerate(items):
            tagged = [t for t in tensors_in(item[4]) if hasattr(t, "_mujou_shared")]
            if not tagged:
                continue
            rows: dict[int, list[Any]] = {}
            for j, t in enumerate(tagged):
                lease = t._mujou_shared
                eid = next(self._ids)
                self._leases[eid] = lease
                lease.count += 1
                rows[j] = [j, eid, *lease.row[2:]]
            got = self.importer.take(tagged, rows)
            if out is None:
                out = list(items)
            out[i] = (*item[:4], map_tensors(item[4], _replacer(got)))
        return items if out is None else out

    def poll(self) -> None:
        """Gives back the descriptors whose copies are done (never waits)."""
        for eid in self.importer.take_released():
            lease = self._leases.pop(eid, None)
            if lease is not None:
                lease.give()

    def close(self) -> None:
        """Waits for the copies in flight and gives every descriptor back."""
        self.importer.close()
        for lease in self._leases.values():
            lease.give()
        self._leases = {}


def _replacer(mapping: dict[int, Any]) -> Any:
    """``fn(t)``: the replacement of placeholder ``t`` (by identity), else ``t`` itself."""
    return lambda t: mapping.get(id(t), t)


def swap(messages: list[Any], mapping: dict[int, Any]) -> list[Any]:
    """The messages with each placeholder tensor replaced by its received tensor.

    Containers (lists, tuples, dicts: what the codec decodes, before records
    are put back) that hold one are rebuilt; the others are kept. Depth is
    bounded by the codec's ``MAX_DEPTH``, so the recursion is too.

    Args:
        messages (list): a decoded batch's messages.
        mapping (dict[int, Any]): ``id(placeholder)`` -> its replacement.

    Returns:
        list: the messages (the same list object, its entries replaced).
    """
    def fix(value: Any) -> Any:
        vt = type(value)
        if vt is torch.Tensor:
            return mapping.get(id(value), value)
        if vt is list:
            return [fix(v) for v in value]
        if vt is tuple:
            return tuple(fix(v) for v in value)
        if vt is dict:
            return {k: fix(v) for k, v in value.items()}
        return value

    for i, m in enumerate(messages):
        messages[i] = fix(m)
    return messages
