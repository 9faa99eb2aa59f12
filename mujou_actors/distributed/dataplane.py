"""The data plane of a placed run: grants to groups, their replies, over ZeroMQ.

Between the host (the driver of the global delta cycles, `driver.py`) and
each group process runs one ZeroMQ ``PAIR`` connection over ``ipc://`` in a
private temporary folder (loopback only: nothing listens on a network). The
host sends a `Grant` and waits for the group's `Reply`; a group never sends
unasked. Both carry port messages as *items* ``(t_ns, delta, sender, output,
message)``: a message sent on the Output of index ``output`` (`Routes`) by
the node of order ``sender`` in a hook at ``(t_ns, delta)``. The receiving
group delivers an item to each of its Inputs that read that Output, so one
message crosses once per group, not once per reader.

Frames: a small msgpack header, then the items encoded by `wire` (msgpack
with raw tensor bytes, large tensors through shared memory; never pickle).
No message is acknowledged on its own: the reply to a grant is the only
answer, and it carries back the shared-memory blocks the group has freed.

Between machines the same links run over ``tcp://HOST:PORT`` (the host binds,
the group connects), without shared memory (every tensor inline: a large one
as a frame that views its memory, sent with ``copy=False``), and with the
run's shared secret (`secret`): CURVE encryption and authentication of both
ends on every connection. Call `HostLink.handshake` / `GroupLink.handshake`
before the first grant: a group whose secret the host refused is then an
`errors.HandshakeError` within the bound, not a grant that never arrives. The
host's end listens on the network, where anyone may connect: a connection
that fails the handshake there is counted and logged (`HostLink.refused`),
not an error, and the host waits on for its group.
Plain TCP (no secret) is allowed on loopback addresses only. A `PeerLink`
between two groups takes the same transports: ``ipc://`` with shared memory
between groups of one machine (in the run's private folder on the host's, in
the listening group's on a member's: `peers.LocalFolder`), ``tcp://`` with
the secret's CURVE between machines (the end that binds is the server).

CUDA tensors on one machine (``cuda_ipc``, `cudaipc`): both ends of a link
made with it add two entries to every header, the export ids the sender is
done with and the CUDA IPC descriptors of the batch (`wire.Encoder.take_shared`),
so a CUDA tensor crosses as a handle to the sender's device memory instead of
its bytes. The host relays descriptors without opening them. Both ends of a
link must agree (the run sets both); ``tcp://`` links never have it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import zmq

from .._runtime.keys import Key
from ..node import Node
from ..ports import Input, Output, Port
from . import cudaipc, wire
from . import secret as secure
from ._loopback import Wake  # its home; placed, driver and group name it dataplane.Wake
from .unixstream import UnixStream

__all__ = ["Routes", "Grant", "Segment", "Reply", "GroupLink", "HostLink", "Item", "Wake"]

# (t_ns, delta, sender order, output index, message)
Item = tuple[int, int, int, int, Any]


class Routes:
    """The net's Outputs by index, and which Inputs of this process read each.

    Every process builds the same net, so the sorted Output paths give the
    same index everywhere: an item names its Output by that index.

    Args:
        found: every node of the net with its path (`net.walk`).
        local (Mapping[str, Port]): the ports of this process's kernel.
    """

    def __init__(self, found: list[tuple[str, Node]], local: dict[str, Port]) -> None:
        outputs: dict[str, Output] = {}
        for path, node in found:
            for name, port in node._mujou_ports().items():
                if isinstance(port, Output):
                    outputs[f"{path}.{name}" if path else name] = port
        self.outputs = sorted(outputs)
        self.output_index = {p: i for i, p in enumerate(self.outputs)}
        self.declared: list[type] = [outputs[p]._spec.type for p in self.outputs]
        # In connection order: one process delivers a send to its readers so, and the
        # Inputs of one reader list their pending messages in that order.
        self.readers: list[list[str]] = [[r.path for r in outputs[p].readers]
                                         for p in self.outputs]
        # The readers that a message triggers (the rule of `build.wire`: an
        # Input's own trigger setting, else whether its node has no period).
        self.triggering: list[set[str]] = [
            {r.path for r in outputs[p].readers
             if (r.node._mujou_period_ns is None if r.trigger is None else r.trigger)}
            for p in self.outputs]
        self._local: list[list[str]] = [[r for r in readers if isinstance(local.get(r), Input)]
                                        for readers in self.readers]

    def local_readers(self, output: int) -> list[str]:
        """The paths of this process's Inputs that read the Output of index ``output``."""
        return self._local[output]


@dataclasses.dataclass
class Grant:
    """What the host lets a group do next.

    Attributes:
        bound (Key | None): run every delta cycle with a key up to and
            including ``bound``, stopping early after one whose sends reach
            another group; None: run nothing (only deliver ``messages``).
        take (bool): with ``bound`` None, reply with the sends waiting
            (``on_start``'s) without starting the timer.
        messages (list[Item]): messages from other groups, to deliver first.
        settled (Key | None): every delta cycle before this key is over in
            every group and its messages are in this grant or an earlier one
            (`Kernel.settle`); None: say nothing.
        segment (Segment | str | None): peer links (`peers`): run up to
            ``bound`` exchanging messages and next keys with the other groups
            directly (a `Segment`); ``"pause"`` / ``"abort"``: end the segment
            in progress (after a flush / at once); None: a plain grant.
    """

    bound: Key | None
    take: bool = False
    messages: list[Item] = dataclasses.field(default_factory=list)
    settled: Key | None = None
    segment: Segment | str | None = None


@dataclasses.dataclass
class Segment:
    """What a group needs to run a segment of simulated time on its peer links (`peers`).

    Attributes:
        number (int): the segment's number in the run (markers of another are stale).
        generation (int): the mesh's generation: a group whose links are of another
            generation closes them and opens the ones ``mesh`` describes.
        promises (dict[str, Key]): a lower bound of the next send of each group
            that sends to this one, as the host knows it when the segment starts.
        mesh (dict | None): the mesh (`peers.MeshSpec` as plain data), sent with
            the first segment of each generation; None: unchanged.
    """

    number: int
    generation: int
    promises: dict[str, Key]
    mesh: dict[str, Any] | None = None


@dataclasses.dataclass
class Reply:
    """A group's answer to a grant.

    Attributes:
        due (Key | None): its next due key after the grant (None: no work).
        time_ns (int): its kernel's time, ns.
        sends (list[Item]): what its nodes sent to other groups, in stamp order.
        failure (dict | None): a hook's (or the kernel's) failure, as plain
            data (``path``, ``hook``, ``message``, ``traceback``, ``type``).
        published (list[Item]): copies of the messages sent on Outputs the
            host subscribed to (``(0, 0, 0, output, message)``), in send order.
        frontier (Key): the delta cycle its kernel entered last (``(-1, 0)``
            before its timer starts): a host write goes in at the latest
            frontier of all groups.
        marker (bool): real time: the answer to a grant with ``take`` (a
            cut's flush): everything the group sent before is on its way.
        partial (bool): peer links: not the segment's answer, only its
            failure or published copies so far (the segment goes on).
        more_failures (list[dict]): the other hooks that failed in the same
            delta cycle as ``failure``, oldest first (as ``failure``).
    """

    due: Key | None
    time_ns: int
    sends: list[Item]
    failure: dict[str, Any] | None = None
    published: list[Item] = dataclasses.field(default_factory=list)
    frontier: Key = (-1, 0)
    marker: bool = False
    partial: bool = False
    more_failures: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def _pools(prefix: str | None, mine: str, theirs: str) -> tuple[str | None, str | None]:
    """The shared-memory pool names of a link's two ends (None: no shared memory).

    ``prefix`` is unique to the run and the link (``mujou-<run>-<group>-``): a
    run's leftover pools (a killed group's) are removed by that prefix.
    """
    if prefix is None:
        return None, None
    return prefix + mine, prefix + theirs


# From this many bytes a frame is sent without a copy (pyzmq's own copy threshold).
ZERO_COPY_BYTES = zmq.COPY_THRESHOLD
# How long a send that cannot go (no peer connected) waits between asking `blocked`.
SEND_SLICE_S = 0.05


def _secure(sock: zmq.Socket[Any], address: str, prefix: str | None, secret: bytes | None,
            server: bool) -> secure.Handshake | None:
    """Sets a link's socket up for its address: CURVE with a secret, checks for TCP.

    Raises:
        ValueError: a shared-memory ``prefix`` with a ``tcp://`` address (it
            does not cross machines), or no secret for a TCP address off
            loopback.
    """
    if address.startswith("tcp://"):
        if prefix is not None:
            raise ValueError(f"{address}: no shared memory over tcp:// (it does not cross "
                             f"machines): prefix must be None, got {prefix!r}")
        if secret is None and not secure.is_loopback(address):
            raise ValueError(f"{address} is not a loopback address: the data plane between "
                             "machines needs the run's secret (secret.load_secret)")
    if secret is None:
        return None
    return secure.configure_server(sock, secret) if server else secure.configure_client(
        sock, secret)


def _check_ipc(address: str, on: bool) -> None:
    """CUDA IPC is for one machine: refused on a ``tcp://`` link."""
    if on and not address.startswith("ipc://"):
        raise ValueError(f"{address}: CUDA IPC needs both ends on one machine (ipc://)")


def _key(value: Any) -> Key | None:
    return None if value is None else (value[0], value[1])


class _Link:
    """One end of a ``PAIR`` connection, with its codec and traffic counts."""

    def __init__(self, sock: zmq.Socket[Any] | UnixStream, declared: Sequence[type],
                 mine: str | None, theirs: str | None,
                 watch: secure.Handshake | None = None, zero_copy: bool = False) -> None:
        # What a poller polls: the ZeroMQ socket, or the Unix stream (its descriptor).
        self.sock = sock
        self._stream = sock if isinstance(sock, UnixStream) else None
        self._watch = watch  # CURVE's handshakes (a link with a secret), until closed
        # A stream's sends may come from several threads (workers: `post`): the codec's
        # send side, the ids to give back and the order of the frames, under this lock.
        self._lock = threading.Lock()
        self._freed: list[int] = []  # the decoder's freed blocks, for the next frame out
        # The other streams its reader reads (its group's other peer links): read ahead
        # too while the reader's own send waits (`drain`), so no ring of groups deadlocks.
        self.also: list[UnixStream] = []
        self.declared = declared
        # Large tensors go through this end's shared-memory pool (named ``mine``);
        # the other end's pool is mapped only under its own name (``theirs``).
        self.encoder = wire.Encoder(mine)
        # ``zero_copy``: a tensor from the other end's pool is a view of its block,
        # whose id goes back once the tensor is gone (`wire.Decoder`).
        self.decoder = wire.Decoder(theirs, zero_copy=zero_copy)
        self.messages_in = self.messages_out = 0
        self.bytes_in = self.bytes_out = 0
        # Called while a send cannot go; raises (or ends the process) to give up.
        self.blocked: Callable[[], None] | None = None
        # CUDA IPC: (this end's Exporter, its Importer or Relay); None: the host path only.
        self.ipc: tuple[cudaipc.Exporter, cudaipc.Importer | cudaipc.Relay] | None = None

    def _share_cuda(self, exporter: cudaipc.Exporter,
                    receiver: cudaipc.Importer | cudaipc.Relay) -> None:
        """Turn CUDA IPC on for this end (both ends of a link, before the first message)."""
        self.ipc = (exporter, receiver)
        self.encoder.shared = exporter
        self.decoder.shared = receiver

    @property
    def ipc_stats(self) -> dict[str, Any] | None:
        """dict | None: this end's `cudaipc.Exporter.stats`; None without CUDA IPC."""
        return None if self.ipc is None else self.ipc[0].stats()

    def _send(self, header: list[Any], items: list[Item], messages: int | None = None) -> None:
        """Send a header and items; ``messages`` of them count as port messages (all)."""
        if self._post(header, items, messages):
            self.drain(read=True)

    def _post(self, header: list[Any], items: list[Item], messages: int | None = None) -> bool:
        """Encode and queue a frame in order with every other (a stream's: from any
        thread); whether a wait for the socket to take it is left (`drain`)."""
        with self._lock:
            freed, self._freed = self._freed, []
            try:
                frames: list[Any] = [b""]
                frames += self.encoder.encode(items, self.declared)
            except BaseException:
                self._freed = freed + self._freed  # they go with the next frame
                raise
            # Blocks freed since: a view's go whenever its tensor goes, on any thread.
            header.append(freed + self.decoder.take_freed())
            if self.ipc is not None:  # after encode: this batch's descriptors
                header.append(self.ipc[1].take_released())
                header.append(self.encoder.take_shared())
            frames[0] = msgpack.packb(header)
            if self._stream is not None:
                try:
                    flushed = self._stream.post(frames)
                except BaseException:  # over the stream's bounds: nothing was sent
                    self.encoder.discard(frames)
                    self._freed = freed + self._freed
                    raise
            self.messages_out += len(items) if messages is None else messages
            self.bytes_out += sum(len(f) for f in frames)
            if self._stream is not None:
                return not flushed
        # Small frames are copied (half the cost of zmq's zero-copy frames for them);
        # a large one (a tensor inline) goes as a view of its memory.
        copy = max(map(len, frames)) < ZERO_COPY_BYTES
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK, copy=copy)  # type: ignore[union-attr]
        except zmq.Again:
            self._send_blocked(frames, copy)
        return False

    def drain(self, read: bool = False) -> None:
        """Wait until the socket took every frame queued so far (a stream's; see
        `unixstream.UnixStream.drain`), asking `blocked` while it waits.

        Args:
            read (bool): the caller is the link's reader (the data-plane thread):
                what comes meanwhile is read ahead, so two groups that send to each
                other at once never wait on each other. Default False.
        """
        if self._stream is not None:
            self._stream.blocked = self.blocked
            self._stream.drain(read, self.also)

    @property
    def direct(self) -> bool:
        """bool: any thread may `post` on this link (a Unix stream); a ZeroMQ link is for
        one thread only."""
        return self._stream is not None

    @property
    def pending(self) -> bool:
        """bool: frames were read ahead (by a reader's `drain`) and wait for `receive`:
        the socket will not say so."""
        return self._stream is not None and self._stream.pending

    def _send_blocked(self, frames: list[Any], copy: bool) -> None:
        """Send once the peer takes it; `blocked` is asked every `SEND_SLICE_S` meanwhile.

        A ``PAIR`` socket blocks a send while no peer is connected: the peer
        died (its TCP or ipc connection went with it) or is reconnecting. A
        plain blocking send would never return for a dead peer, and the one
        waiting could not see the death it waits on; `blocked` looks for it
        (and a link without one waits, as before, for the peer to connect).
        """
        sock = self.sock
        assert not isinstance(sock, UnixStream)
        while True:
            if sock.poll(int(SEND_SLICE_S * 1000), zmq.POLLOUT):
                try:
                    sock.send_multipart(frames, zmq.NOBLOCK, copy=copy)
                    return
                except zmq.Again:  # the room went again meanwhile: wait on
                    pass
            if self.blocked is not None:
                self.blocked()

    def _receive(self, timeout: float) -> tuple[list[Any], list[Item]] | None:
        stream = self._stream
        frames: list[Any] | None
        if stream is not None:  # never waits (peer links are polled)
            frames = stream.receive()
            if frames is None:
                return None
        else:
            sock = self.sock
            assert not isinstance(sock, UnixStream)
            if not sock.poll(int(timeout * 1000)):
                return None
            frames = [f.buffer for f in sock.recv_multipart(copy=False)]
        header = msgpack.unpackb(frames[0])
        shared = None
        if self.ipc is not None:
            shared = header.pop()
            self.ipc[0].release(header.pop())
        given_back = header.pop()
        items = self.decoder.decode(frames[1:], self.declared, shared)
        with self._lock:
            self.encoder.release(given_back)
        self.messages_in += len(items)
        self.bytes_in += sum(len(f) for f in frames)
        return header, items

    @property
    def endpoint(self) -> str:
        """str: the socket's endpoint (the port chosen for a ``tcp://HOST:0`` bind)."""
        if self._stream is not None:
            return "ipc://" + self._stream.path
        return secure.endpoint(self.sock)  # type: ignore[arg-type]

    def handshake(self, timeout: float) -> None:
        """Wait until the peer is in (CURVE); at once without a secret.

        The host's end (the server: anyone may connect to its port) counts,
        logs and outlives connections that fail the handshake (`refused`),
        and waits on for the peer that holds the secret.

        Args:
            timeout (float): seconds to wait at most.

        Raises:
            HandshakeError: the group's end: the host refused it (another
                secret, or no CURVE); either end: no handshake succeeded within
                ``timeout`` (the host's message says how many connections it
                refused, and why). The message names the address.
        """
        if self._watch is not None:
            self._watch.wait(timeout)

    def check_handshake(self) -> bool:
        """Take the handshakes that ended so far (`secret.Handshake.check`); never waits.

        For the host while the group starts: its refusals are counted and
        logged as they come.

        Returns:
            bool: True once the peer is in, or without a secret.

        Raises:
            HandshakeError: the group's end: the host refused it (see `handshake`).
        """
        return self._watch is None or self._watch.check()

    @property
    def refused(self) -> int:
        """int: connections that failed the handshake so far (`secret.Handshake.refused`):
        at the host's end, peers without the secret refused; 0 without a secret."""
        return 0 if self._watch is None else self._watch.refused

    def close(self) -> None:
        if self.ipc is not None:
            self.ipc[0].close()  # the peer is gone or going: its forwards released
            self.ipc[1].close()
        self.encoder.close()
        self.decoder.close()
        if self._watch is not None:
            self._watch.close()  # before the socket: it stops the socket's monitor
        if self._stream is not None:
            self._stream.close()
        else:
            self.sock.close(linger=0)  # type: ignore[call-arg]


def _open(address: str, prefix: str | None, secret: bytes | None,
          server: bool) -> tuple[zmq.Socket[Any], secure.Handshake | None]:
    """A link's ``PAIR`` socket, bound (server) or connected, with its handshake watch."""
    sock: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.PAIR)
    watch = None
    try:
        watch = _secure(sock, address, prefix, secret, server)
        if server:
            sock.bind(address)
        else:
            sock.connect(address)
    except BaseException:
        if watch is not None:
            watch.close()
        sock.close(linger=0)
        raise
    return sock, watch


class GroupLink(_Link):
    """The group's end: connects to the host's endpoint, receives grants, sends replies.

    Every reply carries the *epoch* of the last grant received (see `HostLink`).

    Args: as `HostLink` (``address`` is the host's endpoint to connect to),
    but ``cuda_ipc`` is the `cudaipc.IpcRuntime` that shares and opens CUDA
    memory (`cudaipc.TorchIpc`; a test's fake), or None (the default): no
    CUDA IPC.
    """

    def __init__(self, address: str, routes: Routes, prefix: str | None = None,
                 secret: bytes | None = None,
                 cuda_ipc: cudaipc.IpcRuntime | None = None) -> None:
        _check_ipc(address, cuda_ipc is not None)
        sock, watch = _open(address, prefix, secret, server=False)
        super().__init__(sock, routes.declared, *_pools(prefix, "g", "h"), watch)
        self.epoch = 0
        self._unread: tuple[Grant, int] | None = None  # put back: the next `receive`'s
        if cuda_ipc is not None:
            self._share_cuda(cudaipc.Exporter(cuda_ipc), cudaipc.Importer(cuda_ipc))

    def put_back(self, grant: Grant, epoch: int) -> None:
        """Keep ``grant``, just received, for the next `receive`; ``epoch`` is the link's
        until then (the one before it: replies sent meanwhile answer the earlier grant).

        A segment in progress that reads a grant of a restore's epoch ends, and leaves
        the grant to the group's loop (`peers._Segment.host_says`).
        """
        self._unread = (grant, self.epoch)
        self.epoch = epoch

    def receive(self, timeout: float) -> Grant | None:
        """The next grant (one put back first), or None after ``timeout`` seconds without
        one."""
        if self._unread is not None:
            grant, self.epoch = self._unread
            self._unread = None
            return grant
        got = self._receive(timeout)
        if got is None:
            return None
        (bound, take, epoch, settled, segment), items = got
        self.epoch = epoch
        if isinstance(segment, list):
            number, generation, promises, mesh = segment
            segment = Segment(number, generation, {g: (k[0], k[1]) for g, k in promises.items()},
                              mesh)
        return Grant(_key(bound), take, items, _key(settled), segment)

    def send(self, reply: Reply) -> None:
        """Send the reply to the grant just run."""
        # The host's copies of subscribed messages are not port messages between groups.
        items = reply.sends + reply.published
        if self.ipc is not None:  # device-path messages unwrapped; the host's copies on the CPU
            items = self.ipc[0].prepare(items, len(reply.sends))
        else:  # a CUDA sender with a reader on its device here gives device-path messages
            items = cudaipc.host_items(items)
        self._send([reply.due, reply.time_ns, reply.failure, len(reply.sends),
                    reply.frontier, reply.marker, reply.partial, self.epoch,
                    reply.more_failures], items,
                   len(reply.sends))


class HostLink(_Link):
    """The host's end for one group: binds its endpoint, sends grants, receives replies.

    The driver raises ``epoch`` when it restores every group from a snapshot
    (a restart); a reply of an earlier epoch (to a grant that the restart
    interrupted, from the kernel before it) is dropped unread, so nothing of
    the abandoned timeline reaches the restored kernels.

    Args:
        address (str): ``ipc://PATH``, or ``tcp://HOST:PORT`` between machines
            (port 0: one the system picks, then read `endpoint`).
        routes (Routes): the net's Outputs and their readers.
        prefix (str | None): the run's and the link's shared-memory prefix;
            None: no shared memory (always so over TCP). Default None.
        secret (bytes | None): the run's shared secret: CURVE on the socket
            (this end is the server); None: none, which TCP allows on loopback
            only. Default None.
        cuda_ipc (bool): CUDA tensors cross as CUDA IPC descriptors, which
            this end relays (`cudaipc.Relay`); the group's end is then made
            with a runtime (``GroupLink(..., cuda_ipc=cudaipc.TorchIpc())``).
            ``ipc://`` addresses only. Default False.

    Raises:
        ValueError: a ``prefix`` or ``cuda_ipc`` over TCP, or TCP off loopback
            without a secret.
        zmq.ZMQError: the address cannot be bound (the socket is closed).
    """

    def __init__(self, address: str, routes: Routes, prefix: str | None = None,
                 secret: bytes | None = None, cuda_ipc: bool = False) -> None:
        _check_ipc(address, cuda_ipc)
        sock, watch = _open(address, prefix, secret, server=True)
        super().__init__(sock, routes.declared, *_pools(prefix, "h", "g"), watch)
        self.epoch = 0
        if cuda_ipc:  # the host forwards descriptors; it opens none
            self._share_cuda(cudaipc.Exporter(None), cudaipc.Relay())

    def send(self, grant: Grant) -> None:
        """Send a grant."""
        seg = grant.segment
        if isinstance(seg, Segment):
            seg = [seg.number, seg.generation, seg.promises, seg.mesh]  # type: ignore[assignment]
        self._send([grant.bound, grant.take, self.epoch, grant.settled, seg], grant.messages)

    def receive(self, timeout: float) -> Reply | None:
        """The group's reply, or None after ``timeout`` seconds without one (or a stale one)."""
        got = self._receive(timeout)
        if got is None:
            return None
        (due, time_ns, failure, n, frontier, marker, partial, epoch, more), items = got
        if epoch != self.epoch:
            return None  # its shared-memory blocks are freed all the same (decoded)
        return Reply(_key(due), time_ns, items[:n], failure, items[n:],
                     (frontier[0], frontier[1]), marker, partial, more)


# The kinds of frame on a peer link (`PeerLink`).
PEER_ITEMS = 0  # port messages (maybe none) and the sender's promise
PEER_MARKER = 1  # a paused segment's flush: everything sent before it has arrived


class PeerLink(_Link):
    """One end of the link between two groups (peer links, `peers`).

    Port messages go from group to group on it, each frame with the sender's
    *promise* (no send of its will come at a key below it) and the numbers of
    the mesh generation and segment it belongs to; a frame of another
    generation is stale (a restore reopened the mesh) and dropped unread.

    The transport is the link's address, as for a link to the host: between
    two groups of one machine, ``ipc://`` in a private folder (the run's on the
    host's machine, the listening group's on a member's: `peers.LocalFolder`),
    large tensors through this end's shared-memory pool (the blocks the other
    end has freed come back on the frames it sends); between machines,
    ``tcp://`` with the run's secret: CURVE encrypts and authenticates every
    frame, the end that binds is the CURVE server and lets in exactly the
    client key the secret derives, and every tensor goes inline (no shared
    memory crosses machines). Everything above the socket (frames, codec,
    promises, markers, generations) is the same on both.

    Args:
        address (str): ``ipc://PATH`` in a private folder, or
            ``tcp://HOST:PORT`` between machines (a server's port 0: one the
            system picks, then read `endpoint`).
        declared (Sequence[type]): the declared type of every Output (`Routes.declared`).
        server (bool): this end binds the address (the other connects).
        mine (str | None): this end's shared-memory pool name; None: inline
            (always so over TCP).
        theirs (str | None): the other end's pool name (the only one decoded).
        secret (bytes | None): the run's shared secret: CURVE on the socket
            (this end is the server if it binds); None: none, which TCP allows
            on loopback only. Default None.

    Raises:
        ValueError: a pool over TCP, or TCP off loopback without a secret.
        zmq.ZMQError: the address cannot be bound (the socket is closed).
    """

    def __init__(self, address: str, declared: Sequence[type], server: bool,
                 mine: str | None, theirs: str | None, secret: bytes | None = None,
                 waiting: Callable[[], None] | None = None) -> None:
        if address.startswith("tcp://") and (mine is not None or theirs is not None):
            raise ValueError(f"{address}: no shared memory over tcp:// (it does not cross "
                             f"machines): the pools must be None, got {mine!r}, {theirs!r}")
        if address.startswith("ipc://"):
            if secret is not None:
                raise ValueError(f"{address}: an ipc:// link is this user's own (a private "
                                 "folder): it takes no secret")
            path = address[len("ipc://"):]
            stream = (UnixStream.listen(path) if server
                      else UnixStream.connect(path, waiting=waiting))
            # A large tensor is read where its sender put it (`wire.Decoder`'s zero_copy).
            super().__init__(stream, declared, mine, theirs, zero_copy=True)
        else:
            sock, watch = _open(address, None, secret, server)
            super().__init__(sock, declared, mine, theirs, watch)
        self.server = server

    def send(self, kind: int, generation: int, segment: int, promise: Key,
             items: list[Item]) -> None:
        """Send a frame: ``items`` (maybe none) and the promise, or a marker (from the
        link's reader: see `drain`)."""
        if self.post(kind, generation, segment, promise, items):
            self.drain(read=True)

    def post(self, kind: int, generation: int, segment: int, promise: Key,
             items: list[Item]) -> bool:
        """Queue a frame as `send` does, without waiting (an ``ipc://`` link's may come
        from any thread); whether a `drain` is left to do before ``items`` are used
        again."""
        # Counted by the mesh, once per message (a message may cross to several groups).
        return self._post([kind, generation, segment, promise], cudaipc.host_items(items), 0)

    def give_back(self, generation: int) -> bool:
        """Queue a frame of no messages that carries the freed blocks back to the other
        end (for a reader that sends nothing to its sender: `wire.Decoder.on_freed`);
        as `post`, whether a `drain` is left to do."""
        return self.post(PEER_ITEMS, generation, 0, (-1, 0), [])

    def receive(self) -> tuple[int, int, int, Key, list[Item]] | None:
        """The next frame if one is here (never waits): kind, generation, segment,
        promise, items."""
        got = self._receive(0)
        if got is None:
            return None
        (kind, generation, segment, promise), items = got
        return kind, generation, segment, (promise[0], promise[1]), items
