"""A stream of frames between two processes of one machine, on a Unix socket, with no thread.

The peer links between two groups of one machine (`dataplane.PeerLink` on an
``ipc://`` address) run on this. Why not ZeroMQ there, as between machines:

- ZeroMQ moves every frame through an I/O thread in each process, two more
  thread wake-ups on every hop: an 8-byte round trip between two processes of
  the 2-core machine takes 108 µs on a ZeroMQ ``PAIR`` over ``ipc://`` and 49
  µs on a plain Unix socket (docs/performance.md, "The direct hop").
- A ZeroMQ socket must not be used from two threads at once, so a worker
  could not send on it while the group's data-plane thread reads from it; a
  send went through the data-plane thread, a third wake-up.

Here either side may be used by any thread: a worker sends its node's
messages itself (`group.GroupServer`), and the group's data-plane thread or
an idle worker (`idleread`) receives, one at a time. The socket is a plain
file descriptor that a `zmq.Poller` polls beside ZeroMQ sockets (`fileno`).

Frames: each message is its frame count (4 bytes, little-endian), each
frame's length (8 bytes each), then the frames. The bytes come from a socket
of this user's only (the listening end's path is in a private folder, mode
0700) and are checked all the same: at most `MAX_FRAMES` frames and
`MAX_MESSAGE` bytes a message, or the stream is broken (`StreamError`, naming
the path), never an allocation the bytes ask for beyond that.

Connection: the listening end binds the path (`listen`), the other connects
(`connect`, tried again until the listening end is bound, within a bound).
The listening end accepts the connection when it first reads or sends, and
puts it on the listening socket's descriptor (``dup2``), so the number a
poller registered stays the stream's for its whole life.

Sends never wait while holding the lock: a send writes what the socket takes
at once and keeps the rest in order (the *backlog*); then, with the lock let
go, it waits in slices of `SEND_SLICE_S` until the socket has taken the
backlog, calling ``blocked`` between slices (it raises, or ends the process,
to give up): the back-pressure of a reader that does not keep up, as a
ZeroMQ ``PAIR`` blocks at its high-water mark. A send waits likewise while the
connection is not made yet. A reader that waits so (a group's data-plane
thread) reads what comes meanwhile on every stream it reads (``drain(read=True,
also=...)``, up to `INBOX_BYTES` a stream), so groups that send to each other
at once, two of them or a ring, never wait on each other for good; `pending`
then tells its loop that a whole message is in, which no socket says.

A dead peer: its end of the socket closes with its process. Sends then drop
their bytes (the run restores every group from a snapshot: what they carried
belongs to the abandoned timeline) and count them (`lost`); the receive side
reads what the peer sent before it went, then the end of the stream, and goes
quiet (its descriptor made an eventfd that never becomes readable, so a
poller does not spin on it).
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import WireError

__all__ = ["UnixStream", "StreamError", "MAX_FRAMES", "MAX_MESSAGE", "SEND_SLICE_S",
           "CONNECT_S", "INBOX_BYTES"]

MAX_FRAMES = 1 << 16  # frames of one message at most
MAX_MESSAGE = 1 << 31  # bytes of one message at most (its frames together)
SEND_SLICE_S = 0.05  # how long a send waits between asking its ``blocked``
INBOX_BYTES = 64 << 20  # what a waiting reader's `drain` reads ahead at most
CONNECT_S = 10.0  # the default bound on `connect`'s tries
_READ = 1 << 18  # bytes read from the socket at a time
_IOV = 64  # buffers given to one sendmsg
_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")


class StreamError(WireError):
    """The bytes on a stream are not frames of this format (the message names the path)."""


def _quiet_fd() -> int:
    """A descriptor that never becomes readable: an eventfd nobody writes (Linux)."""
    return os.eventfd(0, os.EFD_CLOEXEC)


class UnixStream:
    """One end of a stream of frames between two processes on a Unix socket.

    Make one with `listen` or `connect`. See the module's docstring for the
    frames, the threads and the waits.

    Attributes:
        path (str): the socket's path.
        blocked (Callable[[], None] | None): called between a waiting send's
            slices; raises (or ends the process) to give the send up.
        on_replaced (Callable[[], None] | None): called, from any thread and
            with a lock held (so it must not block), once the descriptor's
            number names another open file: the connection accepted onto the
            listening socket's number, or a quiet descriptor after the peer
            went. Linux's ``poll`` looks a number up as it starts; a thread
            already waiting sleeps on the old file and must be woken to look
            again (`group.GroupServer` wakes its idle reader, `idleread`).
        lost (int): sends dropped because the peer was gone (the bytes in
            flight when it went count as one).
        eof (bool): the peer closed its end (its process ended).
    """

    def __init__(self, path: str, sock: socket.socket, listening: bool) -> None:
        self.path = path
        # The socket object stays the same for the stream's life, and so does its
        # descriptor, the one pollers see: a listening end's connection is put on it.
        self._sock = sock
        self._fd = sock.fileno()
        self._listening = listening  # still the listening socket, not the connection
        # Called (a lock held: it must not block) once the descriptor's number names
        # another open file (`_accept`, `_end_of_stream`): a poll already waiting on the
        # number sleeps on the old file and would miss what the new one reads.
        self.on_replaced: Callable[[], None] | None = None
        self._lock = threading.Lock()  # the send side: the backlog and the socket's writes
        # The receive side: the inbox, read by `receive` (whichever thread of the group reads
        # the links) and by a reader's `drain` reading ahead. Taken before `_lock`.
        self._read_lock = threading.Lock()
        self._backlog: list[memoryview] = []
        self._inbox = bytearray()  # bytes read, not yet a whole message
        self._want = _COUNT.size  # the inbox's length from which a message may be whole
        self.blocked: Callable[[], None] | None = None
        self.lost = 0
        self.eof = False
        self._gone = False  # a write found the peer gone: sends are dropped from then on
        self._closed = False

    @classmethod
    def listen(cls, path: str) -> UnixStream:
        """The listening end: binds ``path`` (a file that must not exist yet).

        Raises:
            OSError: the path cannot be bound (it exists, its folder does not, or
                it is too long for a Unix socket).
        """
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            sock.listen(1)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return cls(path, sock, listening=True)

    @classmethod
    def connect(cls, path: str, timeout: float = CONNECT_S,
                waiting: Callable[[], None] | None = None) -> UnixStream:
        """The connecting end: connects to ``path``, tried again until the listening end
        has bound it.

        Args:
            path (str): the listening end's path.
            timeout (float): seconds to try at most.
            waiting (Callable[[], None] | None): called between tries; raises to give up.

        Raises:
            StreamError: nothing listened at ``path`` within ``timeout`` (names the path).
            OSError: another error of the connection.
        """
        deadline = time.monotonic() + timeout
        pause = 0.0005
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
            except (FileNotFoundError, ConnectionRefusedError, BlockingIOError):
                sock.close()
            except BaseException:
                sock.close()
                raise
            else:
                sock.setblocking(False)
                return cls(path, sock, listening=False)
            if time.monotonic() >= deadline:
                raise StreamError(f"{path}: no peer link listened there within {timeout:g} s")
            if waiting is not None:
                waiting()
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    @property
    def pending(self) -> bool:
        """bool: a whole message was read and waits for `receive` (a poller will not
        see it: its bytes are out of the socket)."""
        with self._read_lock:
            return len(self._inbox) >= self._want and self._head() is not None

    def fileno(self) -> int:
        """int: the descriptor to poll for reading (the same for the stream's life)."""
        return self._fd

    def _accept(self) -> bool:
        """Take the connection if it came, never waiting (the lock held); whether the
        stream is connected."""
        if not self._listening:
            return True
        try:
            conn, _ = self._sock.accept()
        except (BlockingIOError, InterruptedError):
            return False
        conn.setblocking(False)  # O_NONBLOCK is the open file's: dup2 keeps it
        # The connection takes the listening socket's number (which closes the listening
        # socket): pollers keep polling the same descriptor, now the connection's.
        os.dup2(conn.fileno(), self._fd, inheritable=False)
        conn.close()
        self._listening = False
        self._replaced()
        try:
            os.unlink(self.path)  # nothing else is to connect to it
        except OSError:
            pass
        return True

    # -- sending ---------------------------------------------------------------------
    def send(self, frames: Sequence[Any], read: bool = False) -> None:
        """Send one message of ``frames`` (bytes-like): `post` it, then `drain` (``read``
        as there).

        Raises:
            StreamError: as `post`.
            Whatever ``blocked`` raises while the send waits (see `drain`).
        """
        if not self.post(frames):
            self.drain(read)

    def post(self, frames: Sequence[Any]) -> bool:
        """Queue one message of ``frames`` (bytes-like) after every message queued before,
        and write what the socket takes now; never waits. Any thread may post.

        A message to a peer that is gone is dropped and counted in `lost`.

        Returns:
            bool: whether the socket took everything queued; if not, call `drain`
            before the frames' memory is used again (the rest is written from it).

        Raises:
            StreamError: a message of more than `MAX_FRAMES` frames or
                `MAX_MESSAGE` bytes (nothing is queued).
        """
        views = [memoryview(f).cast("B") for f in frames]
        size = sum(v.nbytes for v in views)
        if len(views) > MAX_FRAMES or size > MAX_MESSAGE:
            raise StreamError(f"{self.path}: a message of {len(views)} frames and {size} bytes "
                              f"(at most {MAX_FRAMES} frames and {MAX_MESSAGE} bytes)")
        head = _COUNT.pack(len(views)) + b"".join(_LENGTH.pack(v.nbytes) for v in views)
        with self._lock:
            if self._closed or self.eof or self._gone:
                self.lost += 1
                return True
            self._backlog.append(memoryview(head))
            self._backlog += [v for v in views if v.nbytes]  # (an empty one writes nothing)
            return self._flush()

    def _flush(self) -> bool:
        """Write what the socket takes of the backlog now (the lock held); whether all of
        it is gone (written, or dropped: the peer is gone)."""
        backlog = self._backlog
        if not backlog:
            return True
        if not self._accept():
            return False
        while backlog:
            try:
                n = self._sock.sendmsg(backlog[:_IOV], (), socket.MSG_NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                return False
            except (BrokenPipeError, ConnectionResetError):
                # The peer is gone. What it sent before is still read (to the end of
                # the stream, which makes the descriptor quiet: see `_end_of_stream`).
                self._gone = True
                self.lost += 1
                backlog.clear()
                return True
            while n:
                head = backlog[0]
                if n >= head.nbytes:
                    n -= head.nbytes
                    del backlog[0]
                else:
                    backlog[0] = head[n:]  # a view: its sender waits until it is written
                    n = 0
        return True

    def drain(self, read: bool = False, also: Sequence[UnixStream] = ()) -> None:
        """Wait, the lock let go, until the socket took every message queued so far: in
        slices of `SEND_SLICE_S`, ``blocked`` asked after each slice in which nothing
        was written. Returns at once when nothing waits, the peer is gone, or the stream
        is closed.

        Args:
            read (bool): the caller is the stream's reader: while it waits, it reads
                what comes on this stream and on those of ``also`` (kept for their
                `receive`, up to `INBOX_BYTES` each), so that groups that send to each
                other at once, each from its reading thread, never wait on each
                other for good (two of them, or a ring of several, each waiting for
                the next to read). Default False (another thread: a worker's send).
            also (Sequence[UnixStream]): the other streams this caller reads (its
                group's other links), with ``read``.

        Raises:
            Whatever ``blocked`` raises (the messages still queued are then kept as
            copies, written by a later `post` or `drain`, or dropped at `close`).
        """
        waiter = select.poll()
        while True:
            with self._lock:
                if self._closed or not self._backlog:
                    return
                listening = self._listening
                left = sum(v.nbytes for v in self._backlog)
            events = select.POLLIN if listening else select.POLLOUT
            reading = [x for x in (self, *also) if read and x._can_read_ahead()]
            if self in reading:
                events |= select.POLLIN
            waiter.register(self._fd, events)
            for other in reading:
                if other is not self:
                    waiter.register(other._fd, select.POLLIN)
            ready = dict(waiter.poll(SEND_SLICE_S * 1000))
            for fd in [self._fd, *(o._fd for o in reading if o is not self)]:
                waiter.unregister(fd)
            for other in reading:
                if ready.get(other._fd, 0) & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    with other._read_lock:
                        other._pull()
            with self._lock:
                if self._closed or self._flush():
                    return
                moved = sum(v.nbytes for v in self._backlog) < left
            if not moved and self.blocked is not None:
                try:
                    self.blocked()
                except BaseException:
                    with self._lock:  # its senders' buffers are theirs again: copies wait
                        self._backlog = [memoryview(bytes(v)) for v in self._backlog]
                    raise

    def _can_read_ahead(self) -> bool:
        """Whether a reader's wait may read this stream ahead now (connected, open, and
        its inbox under `INBOX_BYTES`)."""
        return not (self._listening or self.eof or self._closed
                    or len(self._inbox) >= INBOX_BYTES)

    # -- receiving -------------------------------------------------------------------
    def receive(self) -> list[bytes] | None:
        """The next whole message's frames, or None if none is here yet (never waits).

        Any thread may receive (one at a time does, under the receive side's lock);
        messages are whole and in order whichever thread takes each.

        Raises:
            StreamError: the bytes are not frames of this format, or a message
                is over the limits (the stream is broken: it reads nothing more).
        """
        with self._read_lock:
            return self._receive()

    def _receive(self) -> list[bytes] | None:
        got = self._parse()
        if got is not None or self.eof or self._closed:
            return got
        if self._listening:
            with self._lock:
                if not self._accept():
                    return None
        self._pull()
        return self._parse()

    def _pull(self) -> None:
        """Read what the socket holds now into the inbox (the reader's thread), up to
        `INBOX_BYTES` or the message being read, whichever is more: a peer that keeps
        sending cannot make the inbox grow past that (the rest stays in the socket,
        whose fullness is the peer's back-pressure)."""
        limit = max(INBOX_BYTES, self._want)
        while not self.eof and len(self._inbox) < limit:
            try:
                chunk = self._sock.recv(_READ)
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self._end_of_stream()
                return
            self._inbox += chunk
            if len(chunk) < _READ:
                return

    def _head(self) -> tuple[int, tuple[int, ...]] | None:
        """The first message's frame lengths and where its frames start, once the inbox
        holds all of it; None before (`_want` then says from which length to ask again).

        Raises:
            StreamError: a message of no frame, or over `MAX_FRAMES` or `MAX_MESSAGE`.
        """
        inbox = self._inbox
        if len(inbox) < _COUNT.size:
            self._want = _COUNT.size
            return None
        (count,) = _COUNT.unpack_from(inbox)
        if not 0 < count <= MAX_FRAMES:
            self._broken(f"a message of {count} frames (at least 1, at most {MAX_FRAMES})")
        start = _COUNT.size + _LENGTH.size * count
        if len(inbox) < start:
            self._want = start
            return None
        lengths = struct.unpack_from(f"<{count}Q", inbox, _COUNT.size)
        total = sum(lengths)
        if total > MAX_MESSAGE:
            self._broken(f"a message of {total} bytes (at most {MAX_MESSAGE})")
        if len(inbox) < start + total:
            self._want = start + total  # not parsed again before it can be whole
            return None
        return start, lengths

    def _parse(self) -> list[bytes] | None:
        """The first whole message of the bytes read so far, taken out of them; None if
        they hold none yet."""
        if len(self._inbox) < self._want:
            return None
        head = self._head()
        if head is None:
            return None
        pos, lengths = head
        frames = []
        with memoryview(self._inbox) as view:  # released before the bytes are taken out
            for n in lengths:
                frames.append(bytes(view[pos:pos + n]))
                pos += n
        del self._inbox[:pos]
        self._want = _COUNT.size
        return frames

    def _broken(self, why: str) -> None:
        self._inbox.clear()
        self._want = _COUNT.size
        self._end_of_stream()
        raise StreamError(f"{self.path}: the peer link's bytes are not frames: {why}")

    def _end_of_stream(self) -> None:
        """The peer is gone: the descriptor goes quiet (a poller must not spin on it)."""
        with self._lock:
            self.eof = True
            self._backlog.clear()
            if not self._closed:
                quiet = _quiet_fd()
                os.dup2(quiet, self._fd, inheritable=False)
                os.close(quiet)
                self._replaced()

    def _replaced(self) -> None:
        """Tell `on_replaced` that the descriptor's number names another file now."""
        if self.on_replaced is not None:
            self.on_replaced()

    def close(self) -> None:
        """Close the socket (idempotent); a listening end's path is removed. Sends after it
        are dropped, receives find nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._backlog.clear()
            self._sock.close()
            if self._listening:
                try:
                    os.unlink(self.path)
                except OSError:
                    pass
