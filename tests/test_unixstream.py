"""The Unix stream of the peer links within one machine (distributed/unixstream.py)."""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mujou_actors.distributed import unixstream
from mujou_actors.distributed.unixstream import StreamError, UnixStream

pytestmark = pytest.mark.timeout(30)
BOUND_MS = 5000


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[UnixStream, UnixStream]]:
    """A listening end and the end connected to it, both closed after the test."""
    path = str(tmp_path / "s")
    listening = UnixStream.listen(path)
    connected = UnixStream.connect(path, timeout=5)
    yield listening, connected
    listening.close()
    connected.close()


def _next(stream: UnixStream) -> list[bytes]:
    """The next message, waited for on the stream's descriptor (bounded)."""
    waiter = select.poll()
    waiter.register(stream.fileno(), select.POLLIN)
    while (got := stream.receive()) is None:
        assert waiter.poll(BOUND_MS), "no message within the bound"
    return got


def test_messages_cross_whole_and_in_order_both_ways(pair: tuple[UnixStream, UnixStream]) -> None:
    a, b = pair
    a.send([b"head", memoryview(b"x" * 10_000), bytearray(b"")])
    a.send([b"second"])
    b.send([b"back"])
    assert _next(b) == [b"head", b"x" * 10_000, b""]
    assert _next(b) == [b"second"]
    assert b.receive() is None
    assert _next(a) == [b"back"]


def test_the_listening_ends_descriptor_is_the_connections_once_accepted(
        pair: tuple[UnixStream, UnixStream], tmp_path: Path) -> None:
    """A poller registers the descriptor once: after the accept it is the connection's."""
    a, b = pair
    fd = a.fileno()
    waiter = select.poll()
    waiter.register(fd, select.POLLIN)
    assert a.receive() is None  # accepts: nothing sent yet
    assert a.fileno() == fd
    assert not os.path.exists(tmp_path / "s")  # nobody else is to connect
    b.send([b"one"])
    assert waiter.poll(BOUND_MS) != []
    assert a.receive() == [b"one"]


def test_a_full_socket_keeps_the_rest_in_order_and_drain_waits_for_the_reader(
        pair: tuple[UnixStream, UnixStream]) -> None:
    a, b = pair
    payload = b"y" * 65536
    sent = 0
    while a.post([struct.pack("<I", sent), payload]):  # until the socket is full
        sent += 1
    sent += 1
    for i in range(sent, sent + 10):  # queued behind, never waiting
        assert not a.post([struct.pack("<I", i), payload])
    sent += 10
    asked = []
    a.blocked = lambda: asked.append(1)
    drained = threading.Event()

    def drain() -> None:
        a.drain()
        drained.set()

    thread = threading.Thread(target=drain)
    thread.start()
    got = [struct.unpack("<I", _next(b)[0])[0] for _ in range(sent)]
    thread.join(10)
    assert drained.is_set()
    assert got == list(range(sent))
    assert a.post([b"after"]) is True and _next(b) == [b"after"]


def test_a_dead_peer_ends_the_stream_quietly_and_later_sends_are_counted_lost(
        pair: tuple[UnixStream, UnixStream]) -> None:
    a, b = pair
    b.send([b"last"])
    b.close()
    assert _next(a) == [b"last"]
    waiter = select.poll()
    waiter.register(a.fileno(), select.POLLIN)
    assert waiter.poll(BOUND_MS) != []  # the end of the stream
    assert a.receive() is None and a.eof
    assert waiter.poll(50) == []  # quiet now: a poller does not spin on it
    a.send([b"to nobody"])
    a.send([b"again"])
    assert a.lost == 2


def test_bytes_that_are_not_frames_break_the_stream_with_its_path(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    a = UnixStream.listen(path)
    raw = socket.socket(socket.AF_UNIX)
    raw.connect(path)
    try:
        raw.sendall(struct.pack("<I", unixstream.MAX_FRAMES + 1))
        waiter = select.poll()
        waiter.register(a.fileno(), select.POLLIN)
        assert waiter.poll(BOUND_MS) != []
        with pytest.raises(StreamError, match=f"{path}.*frames"):
            a.receive()
        assert a.receive() is None and a.eof  # reads nothing more
        raw2 = UnixStream.listen(str(tmp_path / "t"))
        other = UnixStream.connect(str(tmp_path / "t"), timeout=5)
        lengths = struct.pack("<I", 1) + struct.pack("<Q", unixstream.MAX_MESSAGE + 1)
        os.write(other.fileno(), lengths)
        raw2_waiter = select.poll()
        raw2_waiter.register(raw2.fileno(), select.POLLIN)
        assert raw2_waiter.poll(BOUND_MS) != []  # the connection, its bytes behind it
        with pytest.raises(StreamError, match="bytes"):
            raw2.receive()
        other.close()
        raw2.close()
    finally:
        raw.close()
        a.close()


def test_a_message_over_the_limits_is_refused_before_anything_is_queued(
        pair: tuple[UnixStream, UnixStream]) -> None:
    a, b = pair
    with pytest.raises(StreamError, match="frames"):
        a.post([b""] * (unixstream.MAX_FRAMES + 1))
    a.send([b"fine"])
    assert _next(b) == [b"fine"]


def test_connect_waits_for_the_listener_within_its_bound_and_can_be_given_up(
        tmp_path: Path) -> None:
    path = str(tmp_path / "late")
    with pytest.raises(StreamError, match="late"):
        UnixStream.connect(path, timeout=0.05)
    tries = []

    def waiting() -> None:
        tries.append(1)
        if len(tries) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        UnixStream.connect(path, timeout=5, waiting=waiting)
    assert len(tries) == 3
    ready: list[UnixStream] = []

    def listen_later() -> None:  # the connect tries again until this one listens
        if not ready:
            ready.append(UnixStream.listen(path))

    b = UnixStream.connect(path, timeout=5, waiting=listen_later)
    try:
        b.send([b"hello"])
        assert _next(ready[0]) == [b"hello"]
    finally:
        b.close()
        ready[0].close()


def test_a_send_with_no_peer_connected_waits_and_asks_blocked(tmp_path: Path) -> None:
    """A listening end sends before its peer connects: the send waits (as a ZeroMQ PAIR
    with no peer), asking ``blocked`` between slices, which gives it up."""
    a = UnixStream.listen(str(tmp_path / "s"))
    asked = []

    def blocked() -> None:
        asked.append(1)
        if len(asked) == 2:
            raise TimeoutError("given up")

    a.blocked = blocked
    try:
        with pytest.raises(TimeoutError):
            a.send([b"early"])
        assert len(asked) == 2
        b = UnixStream.connect(str(tmp_path / "s"), timeout=5)
        a.drain()  # the peer is here: the kept copy goes
        assert _next(b) == [b"early"]
        b.close()
    finally:
        a.close()
    assert not os.path.exists(tmp_path / "s")


def test_two_readers_that_send_to_each_other_at_once_read_ahead_and_both_finish(
        pair: tuple[UnixStream, UnixStream]) -> None:
    """Each end sends more than the socket holds from its reading thread, then reads (a
    data-plane thread's loop): each `drain` reads what comes meanwhile, so neither waits
    on the other for good."""
    a, b = pair
    big = [b"z" * (4 << 20)]
    got: dict[str, list[bytes]] = {}

    def loop(name: str, end: UnixStream) -> None:
        end.send(big, read=True)  # the reader's own send
        got[name] = _next(end)

    other = threading.Thread(target=loop, args=("b", b))
    other.start()
    loop("a", a)
    other.join(10)
    assert not other.is_alive()
    assert got == {"a": big, "b": big}


def test_a_write_that_finds_the_peer_gone_still_reads_what_it_sent_then_goes_quiet(
        pair: tuple[UnixStream, UnixStream]) -> None:
    """EPIPE on a send drops the sends, not the frames the peer sent before it went: the
    reader reads them, then the end of the stream quiets the descriptor (no spin)."""
    a, b = pair
    assert a.receive() is None  # accepted
    b.send([b"before it went"])
    b.close()
    a.send([b"x"])  # may still go into the socket's buffer...
    for _ in range(5):
        a.send([b"y" * 1000])  # ...but not for long: EPIPE, dropped and counted
    assert a.lost >= 1
    assert _next(a) == [b"before it went"]
    waiter = select.poll()
    waiter.register(a.fileno(), select.POLLIN)
    waiter.poll(BOUND_MS)
    assert a.receive() is None and a.eof
    assert waiter.poll(50) == []


def test_pending_means_a_whole_message_was_read_ahead(tmp_path: Path) -> None:
    """`pending` (what a reader's loop checks before it polls) is true only for a whole
    message: half of one leaves it false, so the loop waits on the socket, not spins."""
    path = str(tmp_path / "s")
    a = UnixStream.listen(path)
    raw = socket.socket(socket.AF_UNIX)
    raw.connect(path)
    try:
        message = struct.pack("<I", 1) + struct.pack("<Q", 5) + b"hello"
        raw.sendall(message[:9])
        waiter = select.poll()
        waiter.register(a.fileno(), select.POLLIN)
        assert waiter.poll(BOUND_MS) != []
        assert a.receive() is None and not a.pending  # half of it is in
        raw.sendall(message[9:] + message)  # the rest, and a second whole one
        assert waiter.poll(BOUND_MS) != []
        assert a.receive() == [b"hello"]
        assert a.pending  # the second, read with the first: no socket says so
        assert a.receive() == [b"hello"] and not a.pending
        raw.sendall(struct.pack("<I", 0))  # a message of no frame
        assert waiter.poll(BOUND_MS) != []
        with pytest.raises(StreamError, match="0 frames"):
            a.receive()
    finally:
        raw.close()
        a.close()


def test_a_ring_of_three_readers_sending_at_once_reads_ahead_on_every_link(
        tmp_path: Path) -> None:
    """x -> y -> z -> x, each sending more than a socket holds from its reading thread:
    each one's wait reads ahead on its other link too (``also``), so the ring does not
    wait on itself."""
    names = ["x", "y", "z"]
    ends: dict[tuple[str, str], UnixStream] = {}
    for i, me in enumerate(names):  # one stream per pair; the first name listens
        for other in names[i + 1:]:
            path = str(tmp_path / f"{me}{other}")
            ends[me, other] = UnixStream.listen(path)
            ends[other, me] = UnixStream.connect(path, timeout=5)
    big = [b"r" * (2 << 20)]
    got: dict[str, list[bytes]] = {}

    def group(me: str, to: str, came_from: str) -> None:
        out, inp = ends[me, to], ends[me, came_from]
        if not out.post(big):
            out.drain(read=True, also=[inp])
        got[me] = _next(inp)

    threads = [threading.Thread(target=group, args=(me, names[(i + 1) % 3], names[i - 1]))
               for i, me in enumerate(names)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert not any(t.is_alive() for t in threads)
        assert got == {"x": big, "y": big, "z": big}
    finally:
        for end in ends.values():
            end.close()
