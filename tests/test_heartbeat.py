"""The heartbeat between machines (distributed/heartbeat.py): the clock filter, losses, returns.

The clock filter is pure and tested with made-up timestamps. The sockets are
tested on loopback, with short periods (a 0.3 s timeout, a 0.05 s period),
plain and authenticated by the run's shared secret (CURVE, as the data
plane: a refusal is seen on the handshake monitors' counts, not guessed from
a silence); every wait is on a condition, with a bound.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from mujou_actors.distributed import secret
from mujou_actors.distributed.heartbeat import (
    MAGIC,
    VERSION,
    Change,
    ClockOffset,
    Monitor,
    Responder,
    Sample,
)
from mujou_actors.errors import HandshakeError

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parent.parent
PERIOD, TIMEOUT = 0.05, 0.3
BOUND = 10.0  # seconds any one condition may take on a loaded machine
CHILD = """\
import os, sys
from mujou_actors.distributed.heartbeat import Responder
responder = Responder(sys.argv[1], sys.argv[2])
print(os.getpid(), flush=True)
sys.stdin.read()  # until the test closes it, or ends
responder.close()
"""


def wait_until(condition: Callable[[], bool], bound: float = BOUND) -> None:
    """Wait for ``condition`` to hold, polling every few ms; fail after ``bound`` s."""
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def next_changes(monitor: Monitor, bound: float = BOUND) -> list[Change]:
    """The next changes the monitor reports, waiting on its file descriptor."""
    deadline = time.monotonic() + bound
    while True:
        changes = monitor.take_changes()
        if changes:
            return changes
        left = deadline - time.monotonic()
        assert left > 0, "no change in time"
        select.select([monitor.fileno()], [], [], left)


@pytest.fixture
def monitor() -> Iterator[Monitor]:
    """A Monitor on loopback with the tests' short period and timeout; no thread left after."""
    before = set(threading.enumerate())
    m = Monitor(period=PERIOD, timeout=TIMEOUT)
    try:
        yield m
    finally:
        m.close()
    assert set(threading.enumerate()) <= before


def answered(monitor: Monitor, name: str, count: int = 3) -> Callable[[], bool]:
    """Whether ``name`` has answered ``count`` pings."""
    return lambda: monitor.members()[name].answers >= count


# --- the clock filter, pure ---

def test_offset_and_delay_of_known_timestamps() -> None:
    clock = ClockOffset(precision_ns=0, drift_ppm=0)

    # the member's clock is 500 ns ahead; 100 ns each way; it takes 100 ns to answer
    sample = clock.add(1_000, 1_600, 1_700, 1_300)

    assert sample == Sample(offset_ns=500, delay_ns=200, rtt_ns=300, at_ns=1_300)
    assert (clock.offset_ns, clock.delay_ns, clock.uncertainty_ns) == (500, 200, 100)
    behind = ClockOffset().add(10_000, 7_050, 7_060, 10_110)  # 3 µs behind, 50 ns each way
    assert (behind.offset_ns, behind.delay_ns) == (-3_000, 100)


def test_the_filter_reports_the_sample_of_least_delay_in_its_window() -> None:
    clock = ClockOffset(window=3, precision_ns=0, drift_ppm=0)
    for t0, delay, offset in [(0, 50, 7), (1000, 10, 3), (2000, 30, 5)]:
        clock.add(t0, t0 + offset + delay // 2, t0 + offset + delay // 2, t0 + delay)

    assert clock.best == clock.samples[1] and clock.offset_ns == 3 and clock.delay_ns == 10
    clock.add(3000, 3000 + 9 + 15, 3000 + 9 + 15, 3030)  # a tie with 30: the newer wins
    clock.add(4000, 4000 + 2 + 20, 4000 + 2 + 20, 4040)  # the 10 ns sample falls out
    assert [s.delay_ns for s in clock.samples] == [30, 30, 40]
    assert clock.best == clock.samples[1] and clock.offset_ns == 9


def test_an_asymmetric_path_moves_the_offset_by_up_to_half_the_delay_the_bound_covers() -> None:
    # true offset 0; 900 ns from leader to member, 100 ns back
    clock = ClockOffset(precision_ns=0, drift_ppm=0)

    clock.add(0, 900, 950, 1_050)

    assert clock.offset_ns == 400 and clock.uncertainty_ns == 500
    one_way = ClockOffset(precision_ns=0, drift_ppm=0)
    one_way.add(0, 1_000, 1_000, 1_000)  # all of it one way: the bound is met exactly
    assert one_way.offset_ns == 500 == one_way.uncertainty_ns


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(true=st.integers(-10**12, 10**12), forward=st.integers(0, 10**9),
       back=st.integers(0, 10**9), busy=st.integers(0, 10**9), start=st.integers(0, 10**15))
def test_the_true_offset_is_always_within_the_uncertainty(true: int, forward: int, back: int,
                                                          busy: int, start: int) -> None:
    clock = ClockOffset(precision_ns=0, drift_ppm=0)
    t1 = start + forward + true

    clock.add(start, t1, t1 + busy, start + forward + busy + back)

    assert abs(clock.offset_ns - true) <= clock.uncertainty_ns <= (forward + back) // 2 + 1


def test_the_uncertainty_counts_the_precision_and_the_drift_over_the_samples_age() -> None:
    clock = ClockOffset(window=4, drift_ppm=100, precision_ns=1_000)
    clock.add(0, 5_000, 5_000, 10_000)  # delay 10 µs, the best
    clock.add(10**9, 10**9 + 30_000, 10**9 + 30_000, 10**9 + 60_000)

    assert clock.estimate(10_000).uncertainty_ns == 5_000 + 1_000 + 1  # type: ignore[union-attr]
    # as of the newest sample, 1 s later: 100 ppm of 1 s more
    assert clock.uncertainty_ns == 5_000 + 1_000 + 1 + 100_005
    assert clock.estimate(2 * 10**9 + 10_000).uncertainty_ns == 5_000 + 1_000 + 200_001  # type: ignore[union-attr]


def test_to_local_puts_a_members_time_on_the_leaders_clock() -> None:
    clock = ClockOffset()
    clock.add(1_000, 1_600, 1_700, 1_300)  # the member is 500 ns ahead

    assert clock.to_local(10_500) == 10_000
    assert clock.estimate().to_local(600) == 100  # type: ignore[union-attr]


def test_no_sample_is_no_estimate_and_impossible_timestamps_are_refused() -> None:
    clock = ClockOffset()

    assert clock.estimate() is None and clock.best is None
    with pytest.raises(LookupError, match="no sample"):
        clock.to_local(0)
    for bad in [(10, 0, 0, 5), (0, 5, 4, 10), (0, 0, 20, 10), (0, 1.0, 2, 3), (0, True, 2, 3)]:
        with pytest.raises(ValueError, match="timestamps"):
            clock.add(*bad)  # type: ignore[arg-type]
    assert clock.samples == ()
    for name, value in [("window", 0), ("window", True), ("drift_ppm", -1),
                        ("drift_ppm", float("nan")), ("precision_ns", -1), ("precision_ns", 1.5)]:
        with pytest.raises(ValueError, match=name):
            ClockOffset(**{name: value})  # type: ignore[arg-type]


# --- the Monitor and the Responder on loopback ---

def test_a_responder_answers_with_a_round_trip_and_no_offset_on_one_machine(
        monitor: Monitor) -> None:
    monitor.watch("robot")

    with Responder(monitor.address, "robot") as responder:
        wait_until(answered(monitor, "robot", 5))
        status = monitor.members()["robot"]

    assert status.rtt_ns is not None and 0 < status.rtt_ns < 10**9 and not status.lost
    offset = status.offset
    assert offset is not None and offset.samples == len(status.samples) >= 5
    assert abs(offset.offset_ns) <= offset.uncertainty_ns  # one clock: the true offset is 0
    assert offset.delay_ns == min(s.delay_ns for s in status.samples)
    stats = monitor.stats()
    assert stats.answers >= 5 and stats.pings >= stats.answers
    assert (stats.garbage, stats.stale, stats.unknown) == (0, 0, 0)
    assert responder.stats().pings >= 5 and responder.last_ping_ns is not None
    # Its frames' bytes, each way: a ping (5 msgpack fields) is about 19 bytes, an answer
    # (8) about 46; it answered each ping it was sent but the last few, maybe.
    assert 15 * status.answers <= status.bytes_sent <= 30 * (status.answers + 10)
    assert 40 * status.answers <= status.bytes_received <= 60 * status.answers


@pytest.mark.slow
def test_a_stopped_responder_is_lost_within_the_timeout_and_back_once_restarted(
        monitor: Monitor) -> None:
    monitor.watch("robot")
    responder = Responder(monitor.address, "robot")
    wait_until(answered(monitor, "robot"))

    stopped = time.monotonic_ns()
    responder.close()
    [lost] = next_changes(monitor)

    assert lost.name == "robot" and lost.lost and not lost.restarted
    assert 0 < lost.at_ns - stopped <= (TIMEOUT + PERIOD) * 1e9, lost.at_ns - stopped
    assert lost.silent_ns > TIMEOUT * 1e9 and monitor.members()["robot"].lost
    with Responder(monitor.address, "robot"):
        [back] = next_changes(monitor)
        assert back.name == "robot" and not back.lost and back.restarted
        assert not monitor.members()["robot"].lost


def test_a_member_that_never_answers_is_lost_a_timeout_after_it_is_watched(
        monitor: Monitor) -> None:
    watched = time.monotonic_ns()
    monitor.watch("nobody")

    [lost] = next_changes(monitor)

    assert lost.name == "nobody" and lost.lost
    assert TIMEOUT * 1e9 < lost.at_ns - watched <= (TIMEOUT + PERIOD) * 1e9
    assert monitor.members()["nobody"].answers == 0 and monitor.members()["nobody"].offset is None
    monitor.unwatch("nobody")
    assert monitor.members() == {}


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_member_whose_process_is_killed_is_lost_within_the_timeout(monitor: Monitor) -> None:
    monitor.watch("robot")
    child = subprocess.Popen([sys.executable, "-c", CHILD, monitor.address, "robot"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout is not None
        pid = int(child.stdout.readline())
        monitor.take_changes()  # lost while it imported torch: fine
        wait_until(lambda: not monitor.members()["robot"].lost, 60)
        wait_until(answered(monitor, "robot"))
        monitor.take_changes()

        killed = time.monotonic_ns()
        os.kill(pid, signal.SIGKILL)
        [lost] = next_changes(monitor)

        assert lost.name == "robot" and lost.lost
        assert 0 < lost.at_ns - killed <= (TIMEOUT + PERIOD) * 1e9, lost.at_ns - killed
        assert child.wait(BOUND) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait(BOUND)
    with Responder(monitor.address, "robot"):  # the machine is back
        [back] = next_changes(monitor)
        assert back.name == "robot" and not back.lost and back.restarted


def test_a_restart_faster_than_the_timeout_is_a_loss_and_a_return() -> None:
    with Monitor(period=PERIOD, timeout=30.0) as monitor:  # no loss by silence here
        monitor.watch("robot")
        with Responder(monitor.address, "robot"):
            wait_until(answered(monitor, "robot"))

        with Responder(monitor.address, "robot"):
            changes = next_changes(monitor)
            if len(changes) == 1:
                changes += next_changes(monitor)

    assert [(c.name, c.lost, c.restarted) for c in changes] == [
        ("robot", True, True), ("robot", False, True)]


def _fake_member(address: str, name: bytes) -> zmq.Socket[Any]:
    """A raw DEALER connected to the Monitor, named ``name``."""
    sock: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, name)
    sock.connect(address)
    return sock


def test_garbage_reaching_the_monitor_is_counted_and_ignored(monitor: Monitor) -> None:
    monitor.watch("robot")
    monitor.watch("ghost")
    garbage = [[b""], [b"\xc1"], [b"GET / HTTP/1.0\r\n\r\n"], [msgpack.packb({"a": 1})],
               [msgpack.packb([MAGIC, VERSION, 1, 1, 2])], [b"\x91" * 100 + b"\xc0"],
               [msgpack.packb([MAGIC, VERSION, True, 1, 2, 3, 4, 5])],
               [msgpack.packb([MAGIC, VERSION, 1, 1, -2, 3, 4, 5])],
               [msgpack.packb([MAGIC, 2, 1, 1, 2, 3, 4, 5])], [b"a", b"b", b"c"]]
    host, port = monitor.address[len("tcp://"):].rsplit(":", 1)
    with Responder(monitor.address, "robot"), socket.create_connection((host, int(port))) as raw:
        raw.sendall(b"GET / HTTP/1.0\r\n\r\n" * 100)  # no ZMTP at all: zmq drops it
        stranger = _fake_member(monitor.address, b"stranger")
        ghost = _fake_member(monitor.address, b"ghost")
        try:
            for frames in garbage:
                stranger.send_multipart(frames)
            wait_until(lambda: monitor.stats().garbage == len(garbage))
            stranger.send(b"x" * 200)  # over MAX_FRAME: not parsed
            wait_until(lambda: monitor.stats().garbage == len(garbage) + 1)
            stranger.send(b"x" * 5000)  # over MAXMSGSIZE: zmq drops the peer
            unknown = _fake_member(monitor.address, b"stranger2")
            unknown.send(msgpack.packb([MAGIC, VERSION, 1, 1, 2, 3, 4, 5]))
            wait_until(lambda: monitor.stats().unknown == 1)
            unknown.close(linger=0)
            assert ghost.poll(int(BOUND * 1000)), "the ghost got no ping"
            nonce, seq = msgpack.unpackb(ghost.recv())[3:]
            ghost.send(msgpack.packb([MAGIC, VERSION, 1, nonce + 1, seq, 3, 4, 5]))  # stale
            ghost.send(msgpack.packb([MAGIC, VERSION, 1, nonce, seq, 9, 4, 5]))  # t2 < t1
            wait_until(lambda: monitor.stats().stale == 1)
            wait_until(lambda: monitor.stats().garbage == len(garbage) + 2)
            ghost.send(msgpack.packb([MAGIC, VERSION, 1, nonce, seq, 3, 4, 5]))  # answered
            ghost.send(msgpack.packb([MAGIC, VERSION, 1, nonce, seq, 3, 4, 5]))  # twice: stale
            wait_until(lambda: monitor.stats().stale == 2)
            assert monitor.members()["ghost"].answers == 1
            before = monitor.members()["robot"].answers
            wait_until(answered(monitor, "robot", before + 3))  # the monitor carries on
        finally:
            stranger.close(linger=0)
            ghost.close(linger=0)
    assert monitor.stats().garbage == len(garbage) + 2


def test_garbage_reaching_a_responder_is_counted_and_ignored() -> None:
    fake: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.ROUTER)
    fake.setsockopt(zmq.LINGER, 0)
    fake.setsockopt(zmq.ROUTER_MANDATORY, 1)
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    try:
        with Responder(f"tcp://127.0.0.1:{port}", "robot") as responder:
            garbage = [b"", b"\xc1", msgpack.packb([MAGIC, VERSION, 1, 1, 2]),
                       msgpack.packb([MAGIC, VERSION, 0, 1, 2, 3])]
            deadline = time.monotonic() + BOUND
            while True:  # ROUTER_MANDATORY: refused until the Responder has connected
                try:
                    fake.send_multipart([b"robot", garbage[0]])
                    break
                except zmq.ZMQError as exc:
                    assert exc.errno == zmq.EHOSTUNREACH and time.monotonic() < deadline
                    fake.poll(10)
            for frame in garbage[1:]:
                fake.send_multipart([b"robot", frame])
            fake.send_multipart([b"robot", b"a", b"b"])
            fake.send_multipart([b"robot", msgpack.packb([MAGIC, VERSION, 0, 7, 8])])

            assert fake.poll(int(BOUND * 1000))
            name, answer = fake.recv_multipart()

            magic, version, kind, nonce, seq, t1, t2, incarnation = msgpack.unpackb(answer)
            assert (name, magic, version, kind, nonce, seq) == (b"robot", MAGIC, VERSION, 1, 7, 8)
            assert t1 <= t2 <= time.monotonic_ns() and incarnation == responder.incarnation
            assert responder.stats().garbage == len(garbage) + 1
            assert responder.stats().pings == 1
    finally:
        fake.close(linger=0)


@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")
def test_configure_sets_up_each_socket_so_curve_can_authenticate_the_heartbeat() -> None:
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    seen: list[tuple[int, bool]] = []

    def server(sock: zmq.Socket[Any], is_server: bool) -> None:
        seen.append((int(sock.type), is_server))
        sock.curve_server = True
        sock.curve_secretkey = server_secret

    def client(sock: zmq.Socket[Any], is_server: bool) -> None:
        seen.append((int(sock.type), is_server))
        sock.curve_serverkey = server_public
        sock.curve_publickey = client_public
        sock.curve_secretkey = client_secret

    with Monitor(period=PERIOD, timeout=TIMEOUT, configure=server) as monitor:
        monitor.watch("robot")
        monitor.watch("plain")
        with Responder(monitor.address, "robot", configure=client), \
                Responder(monitor.address, "plain"):
            wait_until(answered(monitor, "robot"))
            [lost] = next_changes(monitor)  # the one without CURVE is never heard

    assert seen == [(zmq.ROUTER, True), (zmq.DEALER, False)]
    assert lost.name == "plain" and lost.lost


def test_a_failing_configure_is_raised_and_leaves_no_thread() -> None:
    class Refused(Exception):
        pass

    def refuse(sock: zmq.Socket[Any], is_server: bool) -> None:
        raise Refused(is_server)

    before = set(threading.enumerate())

    with pytest.raises(Refused):
        Monitor(configure=refuse)
    with pytest.raises(Refused):
        Responder("tcp://127.0.0.1:1", "robot", configure=refuse)

    assert set(threading.enumerate()) <= before


def test_an_on_change_that_raises_is_raised_by_the_next_take_whatever_it_is() -> None:
    class Nasty(BaseException):
        def __str__(self) -> str:
            raise RuntimeError("no str")

        __repr__ = __str__

    nasty = Nasty()
    called: list[Change] = []

    def on_change(change: Change) -> None:
        called.append(change)
        raise nasty

    monitor = Monitor(period=PERIOD, timeout=TIMEOUT, on_change=on_change)
    try:
        monitor.watch("nobody")
        select.select([monitor.fileno()], [], [], BOUND)
        wait_until(lambda: not monitor._thread.is_alive())

        with pytest.raises(Nasty) as raised:
            monitor.take_changes()

        assert raised.value is nasty and [c.name for c in called] == ["nobody"]
        assert [c.name for c in monitor.take_changes()] == ["nobody"]  # kept for the next call
    finally:
        monitor.close()
    monitor.close()  # idempotent, and raised only once


def test_bad_settings_and_names_are_refused_with_their_name() -> None:
    for kwargs, word in [({"period": 0}, "period"), ({"period": True}, "period"),
                         ({"timeout": 0.05, "period": 0.1}, "timeout"),
                         ({"timeout": float("inf")}, "timeout"), ({"window": 0}, "window")]:
        with pytest.raises(ValueError, match=word):
            Monitor(**kwargs)  # type: ignore[arg-type]
    for name in ["", "\0x", "é" * 200, 3]:
        with pytest.raises(ValueError, match="name"):
            Responder("tcp://127.0.0.1:1", name)  # type: ignore[arg-type]
    with Monitor() as monitor:
        monitor.watch("a")
        with pytest.raises(ValueError, match="already watched"):
            monitor.watch("a")
        with pytest.raises(KeyError):
            monitor.unwatch("b")


def test_close_frees_the_port_and_the_threads() -> None:
    before = set(threading.enumerate())
    monitor = Monitor()
    responder = Responder(monitor.address, "robot")

    responder.close()
    monitor.close()

    assert set(threading.enumerate()) <= before
    again = Monitor(monitor.address)  # the same port binds again: nothing holds it
    again.close()


# --- authenticated by the run's shared secret ---

A = b"the secret of run A, 32 bytes.."
B = b"the secret of run B, 32 bytes.."


def _secured(secret: bytes | None, **kwargs: Any) -> Monitor:
    """A Monitor with the tests' short period and timeout, and ``secret``."""
    return Monitor(period=PERIOD, timeout=TIMEOUT, secret=secret, **kwargs)


def refused(monitor: Monitor, responder: Responder, count: int = 1) -> Callable[[], bool]:
    """Whether both sides counted ``count`` refused handshakes.

    zmq tries again every 0.1 s after a server that hung up (another secret),
    but not after a protocol error of its own (a secret on one side only).
    """
    return lambda: (monitor.stats().refused >= count
                    and responder.stats().refused >= count)


@pytest.mark.slow
@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")
def test_the_same_secret_answers_with_a_round_trip_and_an_offset_as_plain() -> None:
    before = set(threading.enumerate())
    with _secured(A) as monitor:
        monitor.watch("robot")
        with Responder(monitor.address, "robot", secret=A) as responder:
            wait_until(answered(monitor, "robot", 5))
            status = monitor.members()["robot"]
            assert responder.refusal is None and responder.stats().refused == 0

        assert status.rtt_ns is not None and 0 < status.rtt_ns < 10**9 and not status.lost
        offset = status.offset
        assert offset is not None and abs(offset.offset_ns) <= offset.uncertainty_ns
        stats = monitor.stats()
        assert stats.answers >= 5 and (stats.garbage, stats.stale, stats.unknown,
                                       stats.refused) == (0, 0, 0, 0)
        [lost] = next_changes(monitor)
        with Responder(monitor.address, "robot", secret=A):  # let in again: ZAP still checks
            [back] = next_changes(monitor)

        assert lost.lost and not back.lost and back.restarted and monitor.stats().refused == 0
    assert set(threading.enumerate()) <= before  # the ZAP handler's thread too


@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")
def test_another_secret_is_never_heard_and_counted_on_both_sides() -> None:
    with _secured(A, on_change=None) as monitor:
        monitor.watch("robot")
        monitor.watch("intruder")
        with Responder(monitor.address, "robot", secret=A), \
                Responder(monitor.address, "intruder", secret=B) as intruder, \
                Responder(monitor.address, "robot", secret=B) as impostor:
            wait_until(refused(monitor, intruder, 2))  # it tries again, and is refused again
            wait_until(lambda: impostor.stats().refused >= 2)
            [lost] = next_changes(monitor)  # within the timeout of its watch
            before = monitor.members()["robot"].answers
            wait_until(answered(monitor, "robot", before + 3))  # the impostor took no name

            assert lost.name == "intruder" and lost.lost
            assert monitor.members()["intruder"].answers == 0
            assert intruder.stats().pings == impostor.stats().pings == 0
            assert intruder.refusal is not None and "the secrets differ" in intruder.refusal
            assert monitor.take_changes() == []  # robot was neither lost nor restarted
            assert monitor.stats().refused >= 4


@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")
def test_the_zap_check_lasts_as_long_as_the_monitors_socket() -> None:
    # Only someone who learnt the server's public key gets this far; ZAP still says no,
    # after a member got in and long after the Monitor's first handshake.
    with _secured(A) as monitor:
        monitor.watch("robot")
        with Responder(monitor.address, "robot", secret=A):
            wait_until(answered(monitor, "robot"))
        sock: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, b"robot")
        sock.curve_serverkey = secret.derive_keypair(A, secret.SERVER_LABEL)[0]
        sock.curve_publickey, sock.curve_secretkey = secret.derive_keypair(
            B, secret.CLIENT_LABEL)
        watch = secret.Handshake(sock, server=False)
        sock.connect(monitor.address)
        try:
            with pytest.raises(HandshakeError, match="ZAP status 400"):
                watch.wait(BOUND)
            wait_until(lambda: monitor.stats().refused >= 1)
            assert not sock.poll(int(3 * PERIOD * 1000))  # no ping reaches it
        finally:
            watch.close()
            sock.close(linger=0)


@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")
@pytest.mark.parametrize(("monitor_key", "responder_key"), [(A, None), (None, A)])
def test_a_secret_on_one_side_only_is_refused_on_both(monitor_key: bytes | None,
                                                      responder_key: bytes | None) -> None:
    with _secured(monitor_key) as monitor:
        monitor.watch("robot")
        with Responder(monitor.address, "robot", secret=responder_key) as responder:
            wait_until(refused(monitor, responder))
            [lost] = next_changes(monitor)

            assert lost.name == "robot" and lost.lost and responder.stats().pings == 0
            assert responder.refusal is not None
            if responder_key is None:  # it is told the leader wants a secret
                assert "CURVE" in responder.refusal


@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")
def test_two_monitors_with_different_secrets_do_not_take_each_others_responders() -> None:
    with _secured(A) as first, _secured(B) as second:
        for monitor in (first, second):
            monitor.watch("a")
            monitor.watch("b")
        with Responder(first.address, "a", secret=A), Responder(first.address, "b", secret=B), \
                Responder(second.address, "a", secret=A), \
                Responder(second.address, "b", secret=B):
            wait_until(answered(first, "a"))
            wait_until(answered(second, "b"))
            [lost_first] = next_changes(first)
            [lost_second] = next_changes(second)

            assert (lost_first.name, lost_second.name) == ("b", "a")
            assert first.members()["b"].answers == second.members()["a"].answers == 0
            wait_until(lambda: first.stats().refused >= 1 and second.stats().refused >= 1)


@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")
def test_close_with_a_secret_frees_the_port_and_the_threads_at_once() -> None:
    before = set(threading.enumerate())
    monitor = _secured(A)
    monitor.watch("robot")
    responder = Responder(monitor.address, "robot", secret=A)
    wrong = Responder(monitor.address, "robot", secret=B)
    wait_until(answered(monitor, "robot"))
    wait_until(refused(monitor, wrong))

    started = time.monotonic()
    wrong.close()
    responder.close()
    monitor.close()

    assert time.monotonic() - started < BOUND
    assert set(threading.enumerate()) <= before  # no heartbeat thread, no ZAP handler
    again = Monitor(monitor.address, secret=B)  # the same port binds again: nothing holds it
    again.close()
    assert set(threading.enumerate()) <= before


def test_without_a_secret_only_loopback_or_ipc_and_refused_before_binding(
        tmp_path: Path) -> None:
    before = set(threading.enumerate())
    for address in ["tcp://0.0.0.0:*", "tcp://*:*", "tcp://192.0.2.1:5555", "tcp://lo:5555",
                    "tcp://example.com:5555", "udp://127.0.0.1:5555"]:
        with pytest.raises(ValueError, match="needs the run's secret"):
            Monitor(address)
        with pytest.raises(ValueError, match="needs the run's secret"):
            Responder(address, "robot")
    with pytest.raises(TypeError, match="secret must be bytes"):
        Monitor(secret="a str")  # type: ignore[arg-type]
    assert set(threading.enumerate()) <= before
    with Monitor(f"ipc://{tmp_path}/hb", period=PERIOD, timeout=TIMEOUT) as monitor:
        monitor.watch("robot")
        with Responder(monitor.address, "robot"), Responder("tcp://localhost:1", "x"), \
                Responder("tcp://127.0.0.2:1", "y"), Responder("tcp://[::1]:1", "z"):
            wait_until(answered(monitor, "robot"))
