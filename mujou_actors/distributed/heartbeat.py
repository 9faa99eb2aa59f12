"""A heartbeat of our own between machines, and each machine's clock offset, NTP-style.

Thespian drops a convention member that stopped answering only after minutes;
a placed run across machines must know within about a second. The leader runs
one `Monitor`: a thread with a zmq ``ROUTER`` socket bound where the caller
says, which pings every watched member every ``period`` (0.1 s) and declares a
member lost once ``timeout`` (1.0 s) has passed since it was sent the newest
ping it answered. Each member runs a `Responder`: a thread with a zmq
``DEALER`` socket connected to the Monitor, its routing id the member's name,
which answers every ping with the member's receive and send times.

One exchange is NTP's on-wire protocol (RFC 5905, section 8) with the four
timestamps in integer nanoseconds of each side's ``time.monotonic_ns()``:
``t0`` the Monitor sends the ping, ``t1`` the Responder receives it, ``t2`` the
Responder sends its answer, ``t3`` the Monitor receives it. `ClockOffset`
turns them into each member's clock offset and its uncertainty (pure: no I/O,
tested with made-up timestamps).

The frames (one msgpack array a message, at most `MAX_FRAME` bytes)::

    ping   [b"mjhb", 1, 0, nonce, seq]
    answer [b"mjhb", 1, 1, nonce, seq, t1, t2, incarnation]

``nonce`` is the Monitor's random number (an answer to another Monitor's ping
is stale), ``seq`` the ping's number (the Monitor keeps each ping's ``t0``
itself, so a peer cannot make up the leader's times), ``incarnation`` the
Responder's random number: a new one means the member restarted (its groups
are gone, and after a reboot its clock too). Anything else that reaches a
socket (another protocol, a damaged frame, more frames, an unknown member, a
stale answer) is decoded with bounds (a frame over `MAX_FRAME` bytes is not
parsed), counted and ignored; zmq itself drops a peer that sends a frame over
`MAX_WIRE` bytes (``MAXMSGSIZE``) or that does not speak ZMTP.

How a change reaches the caller: `Monitor.take_changes` (thread-safe) returns
the `Change` records, lost and back in the order they happened;
`Monitor.fileno` is readable while some wait (for a ``zmq.Poller`` or
``select``); the optional ``on_change`` callback is called with each on the
Monitor's thread, never under a lock. A member is ``back`` once it answers a
ping sent after it was declared lost (or answers as a new incarnation, which
is reported as a loss and a return at once), so the supervisor can restart its
groups there.

Authentication: given the run's shared secret (``secret=``, `secret.load_secret`),
the Monitor's ROUTER is a CURVE server and each Responder's DEALER a CURVE
client, with the data plane's keys and ZAP check (`secret.configure_server`,
`secret.configure_client`): every connection and reconnection proves both
ends hold the secret, and every ping and answer is encrypted and
authenticated. A peer with another secret, or without CURVE, fails the
handshake: it is never heard (a watched member is lost after ``timeout``),
and both sides count the refusal (`MonitorStats.refused`,
`ResponderStats.refused`; `Responder.refusal` says why, in words). Without a
secret the heartbeat is plain ZMTP, allowed on a loopback ``tcp://`` address,
``ipc://`` or ``inproc://`` only (`secret.is_loopback`, as the data plane):
anything else is a ValueError before the bind or the connect. Each socket's
handshakes are watched, with a secret or without (a CURVE peer of a plain
socket is refused too), through a `secret.Handshake` whose monitor socket the
thread polls with its own.

Sockets: every option is set, then CURVE's (with a secret), then the
caller's ``configure(socket, server)`` (``server`` True for the Monitor's
ROUTER, False for a Responder's DEALER), then the bind or the connect. Each
has a zmq context of its own; the thread that uses it closes it with linger
0, then closes its `secret.Handshake` (the monitor, and the Monitor's ZAP
registration: its handler's thread ends and closes its sockets, which are on
that context), then terminates the context, which so has no socket left to
wait for; the port is free once ``close`` has returned. The ZAP registration
lives as long as the Monitor's socket (members reconnect after a restart of
theirs), and only the Monitor's: each Monitor has its own handler, in its own
context. Every wait is bounded: a thread polls its socket, its handshake
monitor and a stop pipe, and ``close`` joins it within its timeout. Threads
are started inside `_loopback.signals_blocked` (a group process's signals
must reach its main thread: see ``system.py``), the ZAP handler's too.

Nothing of this module is a public API.
"""

from __future__ import annotations

import collections
import fractions
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Self

import msgpack
import zmq

from .._checks import is_int, is_number
from . import secret as secure
from ._loopback import Wake, signals_blocked

__all__ = ["Change", "ClockOffset", "Estimate", "MemberStatus", "Monitor", "MonitorStats",
           "Responder", "ResponderStats", "Sample"]

PERIOD_S = 0.1  # seconds between two pings of a member: ten answers a timeout
TIMEOUT_S = 1.0  # seconds without an answer to a newer ping before a member is lost
WINDOW = 8  # samples the clock filter keeps (NTP's eight-stage register, RFC 5905 10)
DRIFT_PPM = 100.0  # bound on two machines' monotonic clocks' relative rate error (see Estimate)
PRECISION_NS = 1_000  # bound on the error of reading both clocks (see Estimate)
CLOSE_S = 1.0  # how long close() waits for the thread by default
MAGIC = b"mjhb"
VERSION = 1
PING, ANSWER = 0, 1
MAX_FRAME = 128  # bytes of a frame we parse; an answer is about 50
MAX_WIRE = 4096  # bytes of a frame zmq takes (MAXMSGSIZE): CURVE's handshake is over 128
_BATCH = 512  # frames a thread reads before it looks at the clock again
_HWM = 64  # messages zmq queues a peer, each way
_TOP = 1 << 64  # every integer of a frame is in [0, 2**64)

Configure = Callable[[zmq.Socket[Any], bool], None]


class Sample(NamedTuple):
    """One exchange's result (RFC 5905, section 8), in nanoseconds.

    Attributes:
        offset_ns (int): the member's clock minus the leader's,
            ``((t1 - t0) + (t2 - t3)) // 2``.
        delay_ns (int): the round trip without the member's own time,
            ``(t3 - t0) - (t2 - t1)``; the true offset is within half of it.
        rtt_ns (int): the round trip as the leader saw it, ``t3 - t0``.
        at_ns (int): ``t3``, the leader's time the sample was taken.
    """

    offset_ns: int
    delay_ns: int
    rtt_ns: int
    at_ns: int


class Estimate(NamedTuple):
    """A member's clock offset, as the clock filter reports it (RFC 5905, section 10).

    The member's monotonic clock reads ``offset_ns`` more than the leader's, to
    within ``uncertainty_ns``: NTP's synchronization distance of the sample of
    least delay, ``delay / 2 + precision + drift * (delay + age)``. Half the
    delay bounds the error whatever the split of the round trip between the
    two ways (section 8: the true offset lies in ``offset ± delay / 2``, the
    times the member spent between ``t1`` and ``t2`` excluded, and so the
    Responder's own wake-up). ``precision`` (`PRECISION_NS`, 1 µs) bounds the
    error of the four clock readings themselves. ``drift`` (`DRIFT_PPM`, 100
    ppm) bounds how fast two monotonic clocks may move apart: NTP's own PHI is
    15 ppm for clocks it disciplines; two free-running quartz clocks are
    within about ±50 ppm each, so 100 ppm apart; it is charged over the
    exchange and over the sample's age, the time since it was taken (section
    10's dispersion growth). Clocks slewed faster than that (a large
    correction of chrony's) break the bound.

    Attributes:
        offset_ns (int): the member's clock minus the leader's, nanoseconds.
        uncertainty_ns (int): the bound on the error of ``offset_ns``, nanoseconds.
        delay_ns (int): the chosen sample's delay, nanoseconds.
        at_ns (int): the leader's time the chosen sample was taken.
        samples (int): the samples the filter chose from.
    """

    offset_ns: int
    uncertainty_ns: int
    delay_ns: int
    at_ns: int
    samples: int

    def to_local(self, t_ns: int) -> int:
        """A time of the member's monotonic clock, on the leader's.

        Args:
            t_ns (int): the member's ``time.monotonic_ns()`` reading.

        Returns:
            int: the leader's ``time.monotonic_ns()`` at that moment, to within
            ``uncertainty_ns`` (plus ``drift`` times its distance from ``at_ns``).
        """
        return t_ns - self.offset_ns


class ClockOffset:
    """The clock filter of one member: its last samples, the one of least delay.

    Pure: it is given the four timestamps of each exchange and reads no clock.
    The sample of least delay is the one whose offset is bounded closest
    (RFC 5905, section 10: the samples are sorted by delay and the first
    taken; its distance grows with its age). A tie goes to the newer sample.

    Args:
        window (int, optional): samples kept, the newest. Default: `WINDOW` (8).
        drift_ppm (float, optional): bound on the clocks' relative rate error,
            parts per million. Default: `DRIFT_PPM` (100).
        precision_ns (int, optional): bound on the error of the clock readings
            of one exchange, nanoseconds. Default: `PRECISION_NS` (1,000).

    Raises:
        ValueError: ``window`` is not a positive int, ``drift_ppm`` not a
            number >= 0, or ``precision_ns`` not an int >= 0.
    """

    def __init__(self, window: int = WINDOW, *, drift_ppm: float = DRIFT_PPM,
                 precision_ns: int = PRECISION_NS) -> None:
        if not is_int(window) or window < 1:
            raise ValueError(f"window must be an int >= 1, not {window!r}")
        if not is_number(drift_ppm) or not drift_ppm >= 0 or math.isinf(drift_ppm):
            raise ValueError(f"drift_ppm must be a finite number >= 0, not {drift_ppm!r}")
        if not is_int(precision_ns) or precision_ns < 0:
            raise ValueError(f"precision_ns must be an int >= 0, not {precision_ns!r}")
        self._samples: collections.deque[Sample] = collections.deque(maxlen=window)
        self._drift = fractions.Fraction(drift_ppm) / 1_000_000  # exact: no rounding up by 1
        self._precision = precision_ns

    def add(self, t0: int, t1: int, t2: int, t3: int) -> Sample:
        """Take one exchange's four timestamps (RFC 5905, section 8).

        Args:
            t0 (int): the leader sent the ping (leader's clock, ns).
            t1 (int): the member received it (member's clock, ns).
            t2 (int): the member sent its answer (member's clock, ns).
            t3 (int): the leader received the answer (leader's clock, ns).

        Returns:
            Sample: the exchange's offset, delay, round trip and time.

        Raises:
            ValueError: a timestamp is not an int, ``t3 < t0``, ``t2 < t1``, or
                the member's time exceeds the round trip (a negative delay:
                the timestamps are not of one exchange).
        """
        if not all(is_int(t) for t in (t0, t1, t2, t3)):
            raise ValueError(f"timestamps must be ints, not {(t0, t1, t2, t3)!r}")
        delay = (t3 - t0) - (t2 - t1)
        if t3 < t0 or t2 < t1 or delay < 0:
            raise ValueError(f"not the timestamps of one exchange: t0={t0}, t1={t1}, t2={t2}, "
                             f"t3={t3} (need t0 <= t3, t1 <= t2, t2 - t1 <= t3 - t0)")
        sample = Sample(((t1 - t0) + (t2 - t3)) // 2, delay, t3 - t0, t3)
        self._samples.append(sample)
        return sample

    def clear(self) -> None:
        """Forget every sample (the member's clock is another one: it restarted)."""
        self._samples.clear()

    @property
    def samples(self) -> tuple[Sample, ...]:
        """tuple[Sample, ...]: the samples kept, oldest first."""
        return tuple(self._samples)

    @property
    def best(self) -> Sample | None:
        """Sample | None: the kept sample of least delay (the newer of a tie), None if none."""
        best = None
        for s in self._samples:  # oldest first: `<=` lets a newer tie win
            if best is None or s.delay_ns <= best.delay_ns:
                best = s
        return best

    def estimate(self, at_ns: int | None = None) -> Estimate | None:
        """The offset and its uncertainty at a time of the leader's clock.

        Args:
            at_ns (int | None, optional): the leader's time the offset is used
                at, which ages the sample; None for the newest sample's time.
                Default: None.

        Returns:
            Estimate | None: the best sample's offset and its bound (see
            `Estimate`); None before the first sample.
        """
        best = self.best
        if best is None:
            return None
        at = self._samples[-1].at_ns if at_ns is None else at_ns
        age = max(0, at - best.at_ns)
        # ceil(delay / 2) also covers the half nanosecond that offset_ns's floor drops:
        # (t1 - t0) + (t2 - t3) and the delay differ by 2 * (t2 - t3), an even number
        uncertainty = ((best.delay_ns + 1) // 2 + self._precision
                       + math.ceil(self._drift * (best.delay_ns + age)))
        return Estimate(best.offset_ns, uncertainty, best.delay_ns, best.at_ns,
                        len(self._samples))

    def _required(self) -> Estimate:
        """The estimate as of the newest sample; LookupError before the first."""
        estimate = self.estimate()
        if estimate is None:
            raise LookupError("no sample yet: the member has not answered")
        return estimate

    @property
    def offset_ns(self) -> int:
        """int: the member's clock minus the leader's (ns). Raises LookupError before a sample."""
        return self._required().offset_ns

    @property
    def uncertainty_ns(self) -> int:
        """int: `offset_ns`'s error bound as of the newest sample (ns); LookupError if none."""
        return self._required().uncertainty_ns

    @property
    def delay_ns(self) -> int:
        """int: the delay of the sample of least delay (ns). Raises LookupError before a sample."""
        return self._required().delay_ns

    def to_local(self, t_ns: int) -> int:
        """A time of the member's monotonic clock, on the leader's (`Estimate.to_local`).

        Args:
            t_ns (int): the member's ``time.monotonic_ns()`` reading.

        Returns:
            int: ``t_ns - offset_ns``.

        Raises:
            LookupError: no sample yet.
        """
        return t_ns - self.offset_ns


class Change(NamedTuple):
    """A member declared lost, or back (`Monitor.take_changes`).

    Attributes:
        name (str): the member.
        lost (bool): True: lost; False: back, it answers again.
        at_ns (int): the leader's ``time.monotonic_ns()`` when it was decided.
        silent_ns (int): how long it had not answered (lost: since the newest
            ping it answered was sent; back: since it was declared lost).
        restarted (bool): a new incarnation of the member answered: a loss
            found so (then a return at once), or a return of a member that
            restarted while lost; its clock filter started anew.
    """

    name: str
    lost: bool
    at_ns: int
    silent_ns: int
    restarted: bool = False


@dataclass(frozen=True)
class MemberStatus:
    """What the Monitor knows of one member (`Monitor.members`).

    Attributes:
        name (str): the member.
        lost (bool): declared lost and not back.
        answers (int): the answers taken from it.
        heard_ns (int): the leader's time of the newest evidence it was alive
            (the newest answered ping's sending, or when it was watched).
        rtt_ns (int | None): the last answer's round trip, ns; None before one.
        offset (Estimate | None): its clock offset now; None before an answer.
        samples (tuple[Sample, ...]): the clock filter's samples, oldest first.
        bytes_sent (int): the frames of the pings sent to it since it was
            watched, bytes (msgpack; not ZeroMQ's or CURVE's own bytes).
        bytes_received (int): the frames of the answers taken from it, bytes.
    """

    name: str
    lost: bool
    answers: int
    heard_ns: int
    rtt_ns: int | None
    offset: Estimate | None
    samples: tuple[Sample, ...]
    bytes_sent: int = 0
    bytes_received: int = 0


@dataclass(frozen=True)
class MonitorStats:
    """The Monitor's counters (`Monitor.stats`).

    Attributes:
        pings (int): pings sent (to every watched member, lost or not).
        answers (int): answers taken.
        garbage (int): frames that were no message of this protocol, ignored.
        stale (int): answers to another Monitor's ping or to a ping already
            answered or forgotten, ignored.
        unknown (int): answers from a peer that is not watched, ignored.
        refused (int): handshakes that failed: a peer with another secret,
            without CURVE where the Monitor has a secret, or with CURVE where
            it has none (each try of such a peer is one more: see
            `ResponderStats.refused`).
    """

    pings: int
    answers: int
    garbage: int
    stale: int
    unknown: int
    refused: int = 0


@dataclass(frozen=True)
class ResponderStats:
    """A Responder's counters (`Responder.stats`).

    Attributes:
        pings (int): pings received (each answered, or its answer dropped).
        garbage (int): frames that were no ping of this protocol, ignored.
        dropped (int): answers zmq could not queue (no connection), dropped.
        refused (int): handshakes with the Monitor that failed (another secret,
            or a secret on one side only; `Responder.refusal` says why). zmq
            tries again every 0.1 s after a Monitor that hung up (another
            secret), each try one more; not after a protocol error of its own
            (a secret on one side only): one or two, then silence.
    """

    pings: int
    garbage: int
    dropped: int
    refused: int = 0


def _check_plain(address: object, secret: bytes | None) -> None:
    """Refuse an address that may leave the machine for a socket without the secret.

    Plain ZMTP is allowed on a loopback ``tcp://`` address (`secret.is_loopback`),
    ``ipc://`` and ``inproc://`` (both on this machine): as the data plane.
    """
    if not isinstance(address, str):
        raise ValueError(f"address must be a zmq endpoint str, not {address!r}")
    if secret is None and not (address.startswith(("ipc://", "inproc://"))
                               or secure.is_loopback(address)):
        raise ValueError(f"{address} is not a loopback address: a heartbeat between machines "
                         "needs the run's secret (secret=, secret.load_secret)")


def _socket(kind: int, options: dict[int, int | bytes], configure: Configure | None,
            server: bool, secret: bytes | None
            ) -> tuple[zmq.Socket[Any], secure.Handshake]:
    """A zmq socket in a context of its own, with its options, CURVE's and ``configure``'s.

    Returns the socket and the `secret.Handshake` that watches it: CURVE's
    (`secret.configure_server` / `configure_client`) with a ``secret``, else
    a plain watch. Its own context: terminating it once the socket is closed
    returns when zmq has closed the socket's file descriptors too, so the
    port is free when ``close`` returns (`_end`). The socket, the watch and
    the context are ended if an option or ``configure`` raises, and the
    exception goes on to the caller.
    """
    sock: zmq.Socket[Any] = zmq.Context().socket(kind)
    watch = None
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_WIRE)  # zmq drops a peer that sends more
        sock.setsockopt(zmq.SNDHWM, _HWM)
        sock.setsockopt(zmq.RCVHWM, _HWM)
        for option, value in options.items():
            sock.setsockopt(option, value)
        if secret is None:
            watch = secure.Handshake(sock, server=server)
        elif server:
            watch = secure.configure_server(sock, secret)
        else:
            watch = secure.configure_client(sock, secret)
        if configure is not None:
            configure(sock, server)
    except BaseException:
        _end(sock, watch)
        raise
    return sock, watch


def _end(sock: zmq.Socket[Any], watch: secure.Handshake | None) -> None:
    """Close a socket of `_socket` (linger 0), then its watch, and terminate its context.

    In this order: once the socket is closed no handshake can reach a
    context whose ZAP handler is gone (libzmq lets one through unchecked
    then); the watch's close ends the handler's thread, which closes the
    handler's sockets, and closes the monitor's; ``term`` then has no socket
    to wait for, and returns at once. If the watch's close raises (a ZAP
    thread that did not end), the context is left, not terminated: ``term``
    would wait for that thread's sockets for ever.
    """
    sock.close(linger=0)
    if watch is not None:
        watch.close()
    sock.context.term()


def _waiting(sock: zmq.Socket[Any]) -> bool:
    """Whether a message waits on ``sock``: asked before each read, since the
    ``zmq.Again`` of an empty socket's read costs tens of microseconds to raise."""
    return bool(int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)


def _recv(sock: zmq.Socket[Any], frames: int) -> list[bytes] | None:
    """One message's frames without blocking; None if it has more than ``frames``.

    Raises ``zmq.Again`` when nothing waits (`_waiting` tells beforehand). The
    frames of a message arrive together, so only the first read may find
    nothing; the extra frames of an oversized message are read and dropped.
    """
    got: list[bytes] = []
    too_many = False
    while True:
        frame = sock.recv(zmq.NOBLOCK)
        if len(got) < frames:
            got.append(frame)
        else:
            too_many = True
        if not sock.getsockopt(zmq.RCVMORE):
            return None if too_many else got


def _decode(frame: bytes, kind: int, length: int) -> tuple[int, ...] | None:
    """The integers of a ping or an answer frame; None for anything else.

    Bounded: a frame over `MAX_FRAME` bytes is not parsed, msgpack may make
    no string, map or extension and no array over 8 items, and each item
    after the header must be an int in ``[0, 2**64)``.
    """
    if len(frame) > MAX_FRAME:
        return None
    try:
        items = msgpack.unpackb(frame, use_list=False, max_str_len=0, max_bin_len=8,
                                max_array_len=8, max_map_len=0, max_ext_len=0)
    except Exception:  # noqa: BLE001 - whatever the bytes make msgpack raise
        return None
    if type(items) is not tuple or len(items) != length or items[0] != MAGIC:
        return None
    if not all(is_int(v) and 0 <= v < _TOP for v in items[1:]) or items[1:3] != (VERSION, kind):
        return None
    return items[3:]


def _check_name(name: object) -> bytes:
    """A member's name as its zmq routing id; ValueError naming the problem."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a member's name must be a non-empty str, not {name!r}")
    raw = name.encode()
    if len(raw) > 255 or raw[0] == 0:
        raise ValueError(f"a member's name must be at most 255 bytes of UTF-8 and not begin "
                         f"with NUL (a zmq routing id), not {name!r}")
    return raw


class _Member:
    """The Monitor's record of one watched member (its lock guards it)."""

    def __init__(self, name: str, now: int, window: int, drift_ppm: float,
                 precision_ns: int, pending_max: int) -> None:
        self.name = name
        self.lost = False
        self.lost_at = 0
        self.heard = now
        self.answers = 0
        self.rtt: int | None = None
        self.bytes_sent = self.bytes_received = 0  # its frames' bytes (MemberStatus)
        self.incarnation: int | None = None
        self.restarted = False  # a new incarnation answered since it was found lost
        self.clock = ClockOffset(window, drift_ppm=drift_ppm, precision_ns=precision_ns)
        self.pending: dict[int, int] = {}  # seq -> t0 of the pings not yet answered
        self.pending_max = pending_max

    def sent(self, seq: int, t0: int, size: int) -> None:
        """Note a ping of ``size`` bytes sent; forget the oldest beyond `pending_max`
        (a silent member)."""
        self.pending[seq] = t0
        self.bytes_sent += size
        if len(self.pending) > self.pending_max:
            del self.pending[next(iter(self.pending))]

    def status(self, at_ns: int) -> MemberStatus:
        """The frozen record of this member, its offset aged to ``at_ns``."""
        return MemberStatus(self.name, self.lost, self.answers, self.heard, self.rtt,
                            self.clock.estimate(at_ns), self.clock.samples, self.bytes_sent,
                            self.bytes_received)


class _Side:
    """What a `Monitor` and a `Responder` share: a socket (`_socket`) and its handshake
    watch, the thread that polls them with a stop pipe, and the thread's end.

    The thread's first failure is kept (`_fail`) and raised by `close` (and a Monitor's
    `Monitor.take_changes`). A subclass gives `_due` (how long to poll), `_read` (what
    waits on the socket) and `_refusals` (the handshakes that ended).
    """

    _thread_name = ""  # the thread's name
    _what = ""  # how `close`'s error names the thread
    _notice: Wake | None = None  # set when the thread fails (a Monitor's notice of changes)

    def _open(self, kind: int, options: dict[int, int | bytes], configure: Configure | None,
              server: bool, secret: bytes | None, address: str) -> None:
        """Make the socket (`_socket`), then bind it (``server``) or connect it to ``address``.

        Raises:
            Exception: what `_socket`, the bind or the connect raises (all of it ended).
        """
        self._lock = threading.Lock()
        self._failure: BaseException | None = None
        self._closed = False
        with signals_blocked():  # a secret's ZAP handler starts a thread
            self._sock, self._watch = _socket(kind, options, configure, server, secret)
        try:
            if server:
                self._sock.bind(address)
            else:
                self._sock.connect(address)
        except BaseException:
            _end(self._sock, self._watch)
            raise

    def _run(self) -> None:
        """Start the thread (``_thread_name``), with every signal blocked."""
        self._stop = Wake()
        self._thread = threading.Thread(target=self._loop, name=self._thread_name, daemon=True)
        with signals_blocked():
            self._thread.start()

    def close(self, timeout: float = CLOSE_S) -> None:
        """Stop the thread and close the socket; idempotent.

        Args:
            timeout (float, optional): seconds to wait for the thread. Default: 1.0.

        Raises:
            TimeoutError: the thread did not end in time (a Monitor's stuck in
                ``on_change``); it closes the socket when it ends.
            BaseException: what the thread failed with (a Monitor's ``on_change``
                raised), if not raised yet.
        """
        if not self._closed:
            self._stop.set()
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"{self._what} did not end in {timeout} s")
            self._closed = True
            self._stop.close()
            if self._notice is not None:
                self._notice.close()
        with self._lock:
            failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def __enter__(self) -> Self:
        """Returns: itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close it (`close`)."""
        self.close()

    def _loop(self) -> None:
        """The thread: poll, read what came, note each handshake; close the socket at the end."""
        sock, watch = self._sock, self._watch
        events = watch.events  # None: not polled (the watch has stopped)
        poller = zmq.Poller()
        for polled in (sock, self._stop.fileno(), events):
            if polled is not None:
                poller.register(polled, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll(self._due()))
                if self._stop.fileno() in ready:
                    return
                if sock in ready:
                    self._read(sock)
                if events in ready:
                    self._refusals(watch.take(_BATCH))
        except BaseException as exc:  # noqa: BLE001 - kept and raised by close (take_changes)
            self._fail(exc)
        finally:
            try:
                _end(sock, watch)
            except BaseException as exc:  # noqa: BLE001 - kept and raised by close
                self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """Keep the thread's first failure for `close` (or `Monitor.take_changes`), and wake
        the caller's poller (a Monitor's notice)."""
        with self._lock:
            if self._failure is None:
                self._failure = exc
        if self._notice is not None:
            self._notice.set()

    def _due(self) -> int:
        """Do what is due now; the milliseconds to poll before the next."""
        raise NotImplementedError

    def _read(self, sock: zmq.Socket[Any]) -> None:
        """Take what waits on the socket."""
        raise NotImplementedError

    def _refusals(self, outcomes: list[str | None]) -> None:
        """Count the handshakes that ended (`secret.Handshake.take`; None: one succeeded)."""
        raise NotImplementedError


class Monitor(_Side):
    """The leader's side: pings the watched members, tells who is lost and who is back.

    Binds a zmq ROUTER socket at ``address`` and starts its thread
    (``mujou-heartbeat``) at once. Every ``period`` it pings every watched
    member (lost ones too: so it sees them come back); a member is declared
    lost once ``timeout`` has passed since it was sent the newest ping it
    answered (or since it was watched, if it never answered). A member that
    dies is so found lost between ``timeout - period`` and ``timeout`` after
    its death, plus the thread's wake-up; one that lives must answer each ping
    within about ``timeout - period``.

    Args:
        address (str, optional): where to bind: a zmq endpoint; ``*`` for the
            port picks a free one (`address` tells which). Default:
            ``"tcp://127.0.0.1:*"``.
        period (float, optional): seconds between two pings of a member.
            Default: `PERIOD_S` (0.1).
        timeout (float, optional): seconds, more than ``period``. Default:
            `TIMEOUT_S` (1.0).
        window (int, optional): samples of each member's clock filter.
            Default: `WINDOW` (8).
        configure (Callable[[zmq.Socket, bool], None] | None, optional): called
            with the socket and ``True`` (the server side) before the bind,
            after the options ``secret`` sets. Default: None.
        secret (bytes | None, optional): the run's shared secret
            (`secret.load_secret`): the socket is a CURVE server that lets in
            only Responders holding it. None: plain, on loopback (or
            ``ipc://``) only. Default: None.
        on_change (Callable[[Change], None] | None, optional): called with each
            `Change` on the Monitor's thread, with no lock held; it should be
            quick (no ping leaves while it runs) and not call `close`. If it
            raises, the Monitor stops and the exception is raised by the next
            `take_changes` or `close`. Default: None.
        drift_ppm (float, optional): see `ClockOffset`. Default: 100.
        precision_ns (int, optional): see `ClockOffset`. Default: 1,000.

    Raises:
        ValueError: a bad setting, named; an address off loopback without a
            ``secret`` (before the bind).
        TypeError: ``secret`` is not bytes.
        zmq.ZMQError: the bind failed (the address is taken or not valid).
        Exception: whatever ``configure`` raises (the socket is closed).
    """

    _thread_name = "mujou-heartbeat"
    _what = "the heartbeat monitor's thread"
    _notice: Wake  # readable while changes wait (`fileno`), or the thread failed

    def __init__(self, address: str = "tcp://127.0.0.1:*", *, period: float = PERIOD_S,
                 timeout: float = TIMEOUT_S, window: int = WINDOW,
                 configure: Configure | None = None, secret: bytes | None = None,
                 on_change: Callable[[Change], None] | None = None,
                 drift_ppm: float = DRIFT_PPM, precision_ns: int = PRECISION_NS) -> None:
        if not is_number(period) or not 0 < period < math.inf:
            raise ValueError(f"period must be a number of seconds > 0, not {period!r}")
        if not is_number(timeout) or not period < timeout < math.inf:
            raise ValueError(f"timeout must be a number of seconds > period ({period}), "
                             f"not {timeout!r}")
        ClockOffset(window, drift_ppm=drift_ppm, precision_ns=precision_ns)  # checks them
        _check_plain(address, secret)
        self._period = round(period * 1e9)
        self._timeout = round(timeout * 1e9)
        self._filter = (window, drift_ppm, precision_ns,
                        2 * math.ceil(timeout / period) + 4)
        self._on_change = on_change
        self._nonce = secrets.randbits(63)
        self._seq = 0
        self._members: dict[str, _Member] = {}
        self._changes: list[Change] = []
        self._counts = {"pings": 0, "answers": 0, "garbage": 0, "stale": 0, "unknown": 0,
                        "refused": 0}
        # ROUTER_HANDOVER: a restarted member takes its name from a connection not yet
        # dropped (only one that passed the handshake: a wrong secret takes no name).
        self._open(zmq.ROUTER, {zmq.ROUTER_HANDOVER: 1}, configure, True, secret, address)
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._notice = Wake()
        self._next_ping = self._next_loss = time.monotonic_ns()
        self._run()

    def watch(self, name: str) -> None:
        """Ping ``name`` from now on; it has ``timeout`` from now to answer.

        Args:
            name (str): the member's name (its Responder's).

        Raises:
            ValueError: not a valid name, or already watched.
        """
        _check_name(name)
        now = time.monotonic_ns()
        with self._lock:
            if name in self._members:
                raise ValueError(f"member {name!r} is already watched")
            window, drift, precision, pending = self._filter
            self._members[name] = _Member(name, now, window, drift, precision, pending)

    def unwatch(self, name: str) -> None:
        """Stop pinging ``name`` and forget it; its later answers count as unknown.

        Args:
            name (str): a watched member.

        Raises:
            KeyError: ``name`` is not watched.
        """
        with self._lock:
            del self._members[name]

    def members(self) -> dict[str, MemberStatus]:
        """What is known of each watched member now.

        Returns:
            dict[str, MemberStatus]: by name, in the order they were watched.
        """
        now = time.monotonic_ns()
        with self._lock:
            return {name: m.status(now) for name, m in self._members.items()}

    def stats(self) -> MonitorStats:
        """The counters of pings, answers, what was ignored and the refused handshakes.

        Returns:
            MonitorStats: a frozen copy.
        """
        with self._lock:
            return MonitorStats(**self._counts)

    def fileno(self) -> int:
        """The file descriptor readable while changes wait (or the Monitor failed).

        Returns:
            int: for ``zmq.Poller.register`` or ``select``; `take_changes` empties it.
        """
        return self._notice.fileno()

    def take_changes(self) -> list[Change]:
        """The members declared lost or back since the last call, in order.

        Returns:
            list[Change]: oldest first; empty if none.

        Raises:
            BaseException: what ``on_change`` (or the Monitor's thread) raised,
                once; the Monitor has stopped.
        """
        self._notice.clear()
        with self._lock:
            failure, self._failure = self._failure, None
            if failure is None:
                changes, self._changes = self._changes, []
        if failure is not None:
            raise failure  # the changes stay for the next call
        return changes

    def _due(self) -> int:
        """Ping on time, declare losses; the milliseconds until the next of them."""
        now = time.monotonic_ns()
        if now >= self._next_ping:
            self._ping_all()
            # a stalled thread pings once, not once for each period it missed
            self._next_ping = max(self._next_ping + self._period, now + 1)
        if now >= self._next_loss:
            # Only then: answers only move the deadlines later, and a member
            # watched since has its deadline after this one.
            self._next_loss = self._losses(now)
        wait_ms = max(0, math.ceil((min(self._next_ping, self._next_loss) - now) / 1e6))
        return min(wait_ms, self._period // 1_000_000 + 1)

    def _refusals(self, outcomes: list[str | None]) -> None:
        """Count the refused handshakes (`MonitorStats.refused`)."""
        refused = sum(outcome is not None for outcome in outcomes)
        if refused:
            with self._lock:
                self._counts["refused"] += refused

    def _ping_all(self) -> None:
        """Send one ping to every watched member (a vanished one's is dropped by zmq)."""
        with self._lock:
            names = list(self._members)
        sent = []
        for name in names:
            self._seq += 1
            frame = msgpack.packb([MAGIC, VERSION, PING, self._nonce, self._seq])
            t0 = time.monotonic_ns()
            size = len(frame)
            try:
                self._sock.send_multipart([name.encode(), frame], zmq.NOBLOCK)
            except zmq.Again:
                size = 0  # its queue is full: a silent member, found by its silence
            sent.append((name, self._seq, t0, size))
        with self._lock:  # the answers are read on this thread: none is read before this
            for name, seq, t0, size in sent:
                member = self._members.get(name)
                if member is not None:
                    member.sent(seq, t0, size)
                    self._counts["pings"] += 1

    def _read(self, sock: zmq.Socket[Any]) -> None:
        """Take up to `_BATCH` waiting messages: answers, and garbage counted."""
        changes: list[Change] = []
        for _ in range(_BATCH):
            if not _waiting(sock):
                break
            try:
                frames = _recv(sock, 2)
            except zmq.Again:
                break
            t3 = time.monotonic_ns()
            values = (_decode(frames[1], ANSWER, 8) if frames is not None and len(frames) == 2
                      else None)
            with self._lock:
                if values is None or frames is None:
                    self._counts["garbage"] += 1
                else:
                    self._answer(frames[0], values, t3, changes, len(frames[1]))
        self._report(changes)

    def _answer(self, routing_id: bytes, values: tuple[int, ...], t3: int,
                changes: list[Change], size: int = 0) -> None:
        """Take one answer of ``size`` bytes (under the lock): the sample, the evidence,
        a return."""
        nonce, seq, t1, t2, incarnation = values
        member = self._members.get(routing_id.decode(errors="replace"))
        if member is None:
            self._counts["unknown"] += 1
            return
        t0 = member.pending.get(seq) if nonce == self._nonce else None
        if t0 is None:
            self._counts["stale"] += 1
            return
        if t2 < t1 or (t3 - t0) - (t2 - t1) < 0:
            self._counts["garbage"] += 1  # not the times of one exchange: the ping stays
            return
        for older in [s for s in member.pending if s <= seq]:
            del member.pending[older]  # answers come in order: the older ones will not
        self._counts["answers"] += 1
        if member.incarnation is not None and incarnation != member.incarnation:
            member.clock.clear()  # another process, maybe another boot: another clock
            member.restarted = True
            if not member.lost:
                changes.append(Change(member.name, True, t3, t3 - member.heard, True))
                member.lost, member.lost_at = True, t0
        member.incarnation = incarnation
        member.clock.add(t0, t1, t2, t3)
        member.answers += 1
        member.bytes_received += size
        member.rtt = t3 - t0
        member.heard = max(member.heard, t0)
        if member.lost and t0 >= member.lost_at:  # a ping sent since it was found lost
            changes.append(Change(member.name, False, t3, t3 - member.lost_at, member.restarted))
            member.lost = member.restarted = False

    def _losses(self, now: int) -> int:
        """Declare lost who has been silent past the timeout; the next time one may be."""
        changes = []
        deadline = now + self._timeout
        with self._lock:
            for m in self._members.values():
                if m.lost:
                    continue
                if now - m.heard > self._timeout:
                    m.lost, m.lost_at = True, now
                    changes.append(Change(m.name, True, now, now - m.heard))
                else:
                    deadline = min(deadline, m.heard + self._timeout + 1)
        self._report(changes)
        return deadline

    def _report(self, changes: list[Change]) -> None:
        """Queue the changes, wake the poller, then call ``on_change`` with no lock held."""
        if not changes:
            return
        with self._lock:
            self._changes.extend(changes)
        self._notice.set()
        if self._on_change is not None:
            for change in changes:
                self._on_change(change)


class Responder(_Side):
    """A member's side: answers the Monitor's pings with its receive and send times.

    Connects a zmq DEALER socket (routing id: ``name``) to the Monitor's
    ``address`` and starts its thread (``mujou-heartbeat-responder``) at once.
    zmq connects in the background and again after the Monitor restarts, so
    either side may start first. Start it on a group process's main thread
    or anywhere: its thread is started with every signal blocked.

    With a ``secret``, its socket is a CURVE client of a Monitor holding the
    same one. A Monitor that refuses the handshake (another secret, or a
    secret on one side only) never gets an answer; the Responder counts each
    refused try (`ResponderStats.refused`) and `refusal` says why, so that a
    member can report that the leader refused its secret.

    Args:
        address (str): the Monitor's endpoint (`Monitor.address`).
        name (str): the member's name, as the Monitor watches it.
        configure (Callable[[zmq.Socket, bool], None] | None, optional):
            called with the socket and ``False`` (the client side) before the
            connect, after the options ``secret`` sets. Default: None.
        secret (bytes | None, optional): the run's shared secret: CURVE, as
            the Monitor's. None: plain, on loopback (or ``ipc://``) only.
            Default: None.

    Raises:
        ValueError: ``name`` is empty, over 255 bytes of UTF-8 or begins with
            NUL; an address off loopback without a ``secret`` (before the
            connect).
        TypeError: ``secret`` is not bytes.
        zmq.ZMQError: the address is not valid.
        Exception: whatever ``configure`` raises (the socket is closed).
    """

    _thread_name = "mujou-heartbeat-responder"
    _what = "the heartbeat responder's thread"

    def __init__(self, address: str, name: str, *, configure: Configure | None = None,
                 secret: bytes | None = None) -> None:
        routing_id = _check_name(name)
        _check_plain(address, secret)
        self.name = name
        self.address = address
        self.incarnation = secrets.randbits(63)
        self._counts = {"pings": 0, "garbage": 0, "dropped": 0, "refused": 0}
        self._refusal: str | None = None
        self._last_ping: int | None = None
        # IMMEDIATE: no answer is queued for a Monitor not connected
        self._open(zmq.DEALER, {zmq.ROUTING_ID: routing_id, zmq.IMMEDIATE: 1}, configure,
                   False, secret, address)
        self._run()

    @property
    def last_ping_ns(self) -> int | None:
        """int | None: this machine's ``time.monotonic_ns()`` at the last ping; None before one."""
        return self._last_ping

    @property
    def refusal(self) -> str | None:
        """str | None: why the Monitor refused the last handshake, in words (``... the
        secrets differ``); None before one ended, or when the last one succeeded."""
        return self._refusal

    def stats(self) -> ResponderStats:
        """The counters of pings, what was ignored and the refused handshakes.

        Returns:
            ResponderStats: a copy.
        """
        return ResponderStats(**self._counts)

    def _due(self) -> int:
        """Nothing is due: it only answers; the stop pipe wakes its poll at once."""
        return 1000

    def _refusals(self, outcomes: list[str | None]) -> None:
        """Count the refused handshakes; keep the last one's reason (`refusal`)."""
        if outcomes:
            self._counts["refused"] += sum(o is not None for o in outcomes)
            self._refusal = outcomes[-1]

    def _read(self, sock: zmq.Socket[Any]) -> None:
        """Answer up to `_BATCH` waiting pings; count the rest of what came."""
        for _ in range(_BATCH):
            if not _waiting(sock):
                return
            try:
                frames = _recv(sock, 1)
            except zmq.Again:
                return
            t1 = time.monotonic_ns()
            values = _decode(frames[0], PING, 5) if frames is not None else None
            if values is None:
                self._counts["garbage"] += 1
                continue
            nonce, seq = values
            self._last_ping = t1
            self._counts["pings"] += 1
            t2 = time.monotonic_ns()
            frame = msgpack.packb([MAGIC, VERSION, ANSWER, nonce, seq, t1, t2,
                                   self.incarnation])
            try:
                sock.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                self._counts["dropped"] += 1
