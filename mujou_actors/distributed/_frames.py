"""Authenticated control-plane frames: Thespian's pickles behind an HMAC of the run's secret.

Thespian's TCP transport frames each message as ``b"<length>>" + pickle`` and
unpickles whatever a connection sends: anyone who can connect could run code
in the process. Every process of a placed run therefore wraps the pickle in a
frame that proves its sender holds the run's secret, and checks that proof
before a single byte of the pickle is decoded (`FrameAuth`). The layout of a
frame's payload (what Thespian puts after ``<length>>``)::

    offset  size  field
         0     4  magic  b"mjc1" (the format's version)
         4    16  nonce  random, never reused (os.urandom)
        20     8  time   the sender's wall clock, ns since the epoch, big-endian
        28     8  size   the body's length in bytes, big-endian
        36    32  head   HMAC-SHA256(key, bytes 0..35)
        68    32  mac    HMAC-SHA256(key, head + body)
       100     -  body   the pickle (Thespian's ``(sender address, message)``)

The head MAC lets a receiver refuse a stranger as soon as `HEADER_LEN` bytes
are in, having read at most `UNTRUSTED_READ` (64 KiB), never the body whose
length the stranger declared (`AuthReceiveBuffer`); the body MAC covers the
rest. A frame is refused when either MAC is wrong, its time is more than
`max_skew` seconds away from the receiver's clock, or its nonce was seen before
within that window (a replayed frame; `ReplayCache`). Only then is the body unpickled, and by
`RestrictedUnpickler`, which admits the classes of Thespian, of this package
and a short list of plain standard-library types, never a function that a
pickle could call (defence in depth: a holder of the secret can already ask a
group to run its code).

Thespian's two acknowledgements (``"ACK"`` and ``"ACK+DATAERR"``) stay
Thespian's own constant frames: they carry no data, and `FrameAuth.loads`
matches their exact bytes without unpickling them.

The key: a one-machine run uses a fresh random secret of the host's
(`new_key`), handed to the processes it starts through their spawn pipes,
never on a command line, in the environment or in a file; a run across
machines uses `control_key` of the ``MUJOU_SECRET`` every machine holds (a key
of its own, so that the control plane's HMAC and the data plane's CURVE keys
are independent).

This file imports only the standard library: it is loaded by path in
Thespian's admin and logger processes, which do not import the package (see
`mujou_actors.distributed._loopback`). Nothing of it is a public API.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import io
import logging
import os
import pickle
import struct
import threading
import time
from typing import Any

__all__ = ["FrameAuth", "FrameRefused", "AuthReceiveBuffer", "RestrictedUnpickler",
           "control_key", "new_key", "HEADER_LEN", "MAX_FRAME", "MAX_SKEW_S", "UNTRUSTED_READ",
           "ENV_MAX_SKEW", "on_the_wire"]

log = logging.getLogger("mujou_actors.security")

MAGIC = b"mjc1"
_FIXED = struct.Struct(">4s16sQQ")  # magic, nonce, time (ns), body size
MAC_LEN = 32
HEADER_LEN = _FIXED.size + 2 * MAC_LEN  # 100 bytes before the body
MAX_FRAME = 1 << 34  # 16 GiB: the largest frame an authenticated peer may send
MAX_LENGTH_DIGITS = 12  # Thespian's "<length>>" prefix: at most this many digits
UNTRUSTED_READ = 1 << 16  # bytes read at most before a frame's header is checked
MAX_SKEW_S = 300.0  # default: how far a frame's time may be from the receiver's clock
ENV_MAX_SKEW = "MUJOU_MAX_CLOCK_SKEW"  # seconds, to allow machines whose clocks differ more
REPLAY_CAPACITY = 1 << 18  # nonces remembered at most (oldest forgotten first)
_LOG_FIRST = 10  # refusals logged one by one; then every power of ten

# Thespian's acknowledgements as its stock transport pickles them (streamBuffer's
# ackMsg), for every protocol a peer's Python may default to: matched, not unpickled.
_ACKS = {pickle.dumps(text, protocol): text
         for text in ("ACK", "ACK+DATAERR") for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1)}
_ACK_MAX = max(len(raw) for raw in _ACKS)

_wire = threading.local()  # set while this thread pickles a frame (on_the_wire)


class FrameRefused(Exception):
    """A control-plane frame failed its check (not the run's secret, replayed, too big)."""


def new_key() -> bytes:
    """A fresh random 32-byte key, for the control plane of one run on one machine."""
    return os.urandom(32)


def control_key(secret: bytes) -> bytes:
    """The control plane's HMAC key of a shared secret (``MUJOU_SECRET``).

    BLAKE2b of the secret, personalised for this use, so that it is
    independent of the data plane's CURVE keys derived from the same secret.

    Args:
        secret (bytes): the shared secret (at least 32 bytes, checked by
            ``secret.load_secret``).

    Returns:
        bytes: 32 bytes.
    """
    return hashlib.blake2b(secret, digest_size=32, person=b"mujou-control-1").digest()


def on_the_wire() -> bool:
    """Whether this thread is pickling a frame now (a secret must not be pickled then)."""
    return bool(getattr(_wire, "active", False))


def _max_skew() -> float:
    """`MAX_SKEW_S`, or the user's ``MUJOU_MAX_CLOCK_SKEW`` (seconds, > 0)."""
    raw = os.environ.get(ENV_MAX_SKEW)
    if raw is None:
        return MAX_SKEW_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value != value or value == float("inf"):
        log.warning("%s=%r is not a number of seconds > 0; %s s is used",
                    ENV_MAX_SKEW, raw, MAX_SKEW_S)
        return MAX_SKEW_S
    return value


class ReplayCache:
    """The nonces of the frames accepted within the freshness window (bounded).

    A nonce is kept for twice the window (a frame is accepted up to the
    window away from the receiver's clock, either way) and at most
    `REPLAY_CAPACITY` of them: past that, the oldest is forgotten first.

    Args:
        window_s (float): the freshness window, seconds.
        capacity (int): the most nonces kept.
    """

    def __init__(self, window_s: float, capacity: int = REPLAY_CAPACITY) -> None:
        self._keep_ns = int(2 * window_s * 1e9)
        self._capacity = capacity
        self._seen: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self._lock = threading.Lock()

    def add(self, nonce: bytes, now_ns: int) -> bool:
        """Remember ``nonce``; ``False`` if it was seen already (a replay)."""
        with self._lock:
            seen = self._seen
            while seen:
                oldest, when = next(iter(seen.items()))
                if now_ns - when <= self._keep_ns and len(seen) < self._capacity:
                    break
                del seen[oldest]
            if nonce in seen:
                return False
            seen[nonce] = now_ns
            return True


class FrameAuth:
    """The frames of one secret: `dumps` makes them, `loads` checks and decodes them.

    Stands in for Thespian's ``serializer`` (the ``pickle`` module) in the
    transport of every process of a run (see
    `mujou_actors.distributed._loopback`). Safe to use from several threads.

    Args:
        key (bytes): the HMAC key (`new_key` or `control_key`), 32 bytes.
        max_skew (float | None): seconds a frame's time may differ from this
            clock; ``None`` for `MAX_SKEW_S` or ``MUJOU_MAX_CLOCK_SKEW``.

    Attributes:
        refused (int): frames and connections refused so far in this process.
    """

    def __init__(self, key: bytes, max_skew: float | None = None) -> None:
        if not isinstance(key, bytes) or len(key) < 16:
            raise ValueError("a control-plane key is at least 16 bytes")
        self._key = key
        self._skew_ns = int((max_skew if max_skew is not None else _max_skew()) * 1e9)
        self._replays = ReplayCache(self._skew_ns / 1e9)
        self.refused = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ sending

    def dumps(self, obj: Any) -> bytes:
        """A frame's payload for ``obj``: header, MACs, the pickle (Thespian's protocol).

        Args:
            obj (Any): what Thespian sends, ``(sender address, message)``.

        Returns:
            bytes: the payload (Thespian prefixes its length).

        Raises:
            pickle.PicklingError: as ``pickle.dumps`` does; also when the
                transport's class (which carries the secret) is in ``obj``.
        """
        _wire.active = True
        try:
            body = pickle.dumps(obj)
        finally:
            _wire.active = False
        fixed = _FIXED.pack(MAGIC, os.urandom(16), time.time_ns(), len(body))
        head = hmac.digest(self._key, fixed, "sha256")
        mac = hmac.digest(self._key, head + body, "sha256")
        return b"".join((fixed, head, mac, body))

    # ---------------------------------------------------------------- receiving

    def check_header(self, payload: bytes, size: int) -> None:
        """Check a frame's first `HEADER_LEN` bytes: magic, head MAC, size, time.

        Args:
            payload (bytes): at least the first `HEADER_LEN` bytes of the payload.
            size (int): the payload's length as Thespian's prefix declared it.

        Raises:
            FrameRefused: any of them is wrong.
        """
        magic, _nonce, sent_ns, body_size = _FIXED.unpack_from(payload)
        if magic != MAGIC:
            raise FrameRefused("not a frame of this run's control plane")
        head = payload[_FIXED.size:_FIXED.size + MAC_LEN]
        if not hmac.compare_digest(head, hmac.digest(self._key, payload[:_FIXED.size],
                                                     "sha256")):
            raise FrameRefused("its sender does not hold the run's secret")
        if body_size != size - HEADER_LEN:
            raise FrameRefused("its declared size disagrees with its length")
        off = sent_ns - time.time_ns()
        if abs(off) > self._skew_ns:
            when = f"{-off / 1e9:.1f} s ago" if off < 0 else f"{off / 1e9:.1f} s ahead"
            raise FrameRefused(
                f"it is dated {when} by this machine's clock (more than "
                f"{self._skew_ns / 1e9:g} s: a replay, or the machines' clocks differ; "
                f"synchronise them or set {ENV_MAX_SKEW})")

    def loads(self, payload: bytes) -> Any:
        """Check a whole frame and decode its body (`RestrictedUnpickler`).

        Args:
            payload (bytes): the frame's payload, as Thespian received it.

        Returns:
            Any: what the sender pickled; or ``"ACK"`` / ``"ACK+DATAERR"`` for
            Thespian's constant acknowledgements.

        Raises:
            FrameRefused: the frame fails a check (counted and logged).
            pickle.UnpicklingError: the body names a class that is not admitted.
        """
        payload = bytes(payload)
        if not payload.startswith(MAGIC):
            ack = _ACKS.get(payload)
            if ack is None:
                raise self.refuse("not a frame of this run's control plane")
            return ack
        if len(payload) < HEADER_LEN:
            raise self.refuse("it is shorter than a frame's header")
        try:
            self.check_header(payload, len(payload))
        except FrameRefused as exc:
            raise self.refuse(str(exc)) from None
        head = payload[_FIXED.size:_FIXED.size + MAC_LEN]
        mac = payload[_FIXED.size + MAC_LEN:HEADER_LEN]
        body = memoryview(payload)[HEADER_LEN:]
        if not hmac.compare_digest(mac, hmac.digest(self._key, head + body, "sha256")):
            raise self.refuse("its body was changed, or its sender does not hold the secret")
        if not self._replays.add(payload[4:20], time.time_ns()):
            raise self.refuse("it was received before (a replayed frame)")
        return RestrictedUnpickler(io.BytesIO(body)).load()

    def refuse(self, why: str) -> FrameRefused:
        """Count a refusal and log it (the first ten, then every power of ten).

        Args:
            why (str): what was wrong.

        Returns:
            FrameRefused: the error to raise.
        """
        with self._lock:
            self.refused += 1
            count = self.refused
        if count <= _LOG_FIRST or _is_power_of_ten(count):
            log.warning("control plane (pid %d): refused a frame or connection: %s "
                        "(%d refused so far)", os.getpid(), why, count)
        return FrameRefused(why)


def _is_power_of_ten(n: int) -> bool:
    """Whether ``n`` is 1, 10, 100, 1000, ..."""
    return str(n).rstrip("0") == "1"


class AuthReceiveBuffer:
    """Thespian's ``ReceiveBuffer`` for authenticated frames: bounded before it trusts.

    Reads Thespian's ``<length>>`` prefix (at most `MAX_LENGTH_DIGITS`
    digits) and at most `UNTRUSTED_READ` bytes of the frame until
    `FrameAuth.check_header` accepts its first `HEADER_LEN` bytes, and only
    then the rest of the frame (at most `MAX_FRAME` bytes). A stranger's
    connection therefore costs the receiver at most 64 KiB, whatever length it
    declares, and is refused as soon as its header is here. (A control message
    is a few hundred bytes: it is read whole in one ``recv``, as Thespian's own
    buffer reads it in two.) A frame that fails a check marks the
    buffer bad: it reports itself done and `completed` returns ``None``, which
    Thespian treats as a corrupt frame (the connection is closed); nothing is
    raised into Thespian's loop.

    Args:
        auth (FrameAuth): the run's frames.

    Attributes:
        trusted (bool): the frame's header passed its check.
    """

    def __init__(self, auth: FrameAuth) -> None:
        self._auth = auth
        self._buf = bytearray()
        self._size: int | None = None
        self._extra = b""
        self._bad = False
        self._decoded: tuple[Any] | None = None
        self.trusted = False

    def addMore(self, buf: bytes) -> None:  # noqa: N802 (Thespian's name)
        """Add bytes read from the socket (Thespian's method).

        Raises:
            TypeError: ``buf`` is not bytes (as Thespian's buffer does; its
                caller treats that as bad trailing data).
        """
        if not isinstance(buf, (bytes, bytearray)):
            raise TypeError("received data is not bytes")
        if self._bad:
            return
        if self._size is None:
            self._buf += buf
            mark = self._buf.find(b">")
            if mark < 0:
                if len(self._buf) > MAX_LENGTH_DIGITS:
                    self._fail("its length prefix is not a number")
                return
            digits = bytes(self._buf[:mark])
            if not digits.isdigit() or len(digits) > MAX_LENGTH_DIGITS:
                self._fail("its length prefix is not a number")
                return
            size = int(digits)
            if size > MAX_FRAME:
                self._fail(f"it declares {size} bytes (at most {MAX_FRAME})")
                return
            self._size = size
            rest = bytes(self._buf[mark + 1:])
            self._buf = bytearray()
            buf = rest
        want = self._size - len(self._buf)
        self._buf += buf[:want]
        if len(buf) > want:
            self._extra += buf[want:]
        self._check()

    def _check(self) -> None:
        """Check the header as soon as it is here (or an acknowledgement's size)."""
        if self.trusted or self._bad:
            return
        size = self._size or 0
        if size <= _ACK_MAX and not self._buf.startswith(MAGIC[:len(self._buf)]):
            return  # an acknowledgement, perhaps: matched whole by FrameAuth.loads
        if not self._buf.startswith(MAGIC[:len(self._buf)]):
            self._fail("not a frame of this run's control plane")
        elif size < HEADER_LEN:
            if len(self._buf) >= size:
                self._fail("it is shorter than a frame's header")
        elif len(self._buf) >= HEADER_LEN:
            try:
                self._auth.check_header(bytes(self._buf[:HEADER_LEN]), size)
            except FrameRefused as exc:
                self._fail(str(exc))
            else:
                self.trusted = True

    def _fail(self, why: str) -> None:
        """Mark the frame bad (counted and logged once)."""
        self._bad = True
        self._buf = bytearray()
        self._extra = b""
        self._auth.refuse(why)

    def is_empty(self) -> bool:
        """Whether nothing was received yet (Thespian's method)."""
        return not self._buf and self._size is None and not self._bad

    def remainingAmount(self) -> int:  # noqa: N802 (Thespian's name)
        """How many bytes to read next: at most `UNTRUSTED_READ` until the header checks."""
        if self._bad:
            return 0
        if self._size is None:
            return MAX_LENGTH_DIGITS + 1 + UNTRUSTED_READ - len(self._buf)
        if not self.trusted:
            return max(min(self._size, UNTRUSTED_READ) - len(self._buf), 1)
        return self._size - len(self._buf)

    def isDone(self) -> bool:  # noqa: N802 (Thespian's name)
        """Whether to stop reading: the frame is whole, or bad."""
        return self._bad or (self._size is not None and len(self._buf) == self._size)

    def removeExtra(self) -> None:  # noqa: N802 (Thespian's name)
        """Forget bytes read past the frame (Thespian's method)."""
        self._extra = b""

    def completed(self) -> tuple[Any, bytes] | None:
        """The decoded frame and the bytes read past it; ``None`` if bad or not whole.

        A frame that fails `FrameAuth.loads` is ``None`` too (never an
        exception into Thespian's loop, which does not catch one here).
        Thespian asks twice for a frame that came as the answer to a send (once
        to tell an acknowledgement, once to deliver it): it is decoded once,
        and its nonce recorded once.
        """
        if self._bad or self._size is None or len(self._buf) != self._size:
            return None
        if self._decoded is None:
            try:
                self._decoded = (self._auth.loads(bytes(self._buf)),)
            except FrameRefused:
                self._bad = True
                return None
            except Exception as exc:  # noqa: BLE001 (a refused class, a broken pickle)
                self._bad = True
                self._auth.refuse(f"its body does not decode: {type(exc).__name__}: {exc}")
                return None
        return self._decoded[0], self._extra


# --------------------------------------------------------------------------- unpickling

# Plain standard-library types a Thespian message holds (addresses, timers, logs).
_STDLIB = {
    "builtins": {"set", "frozenset", "bytearray", "complex", "slice", "range", "object",
                 "list", "dict", "tuple", "str", "bytes", "int", "float", "bool"},
    "collections": {"OrderedDict", "deque", "defaultdict"},
    "copyreg": {"_reconstructor"},
    "_codecs": {"encode"},
    "datetime": {"datetime", "timedelta", "date", "time", "timezone"},
    "socket": {"AddressFamily", "SocketKind"},
    "logging": {"LogRecord"},
}
_PACKAGES = ("thespian", "mujou_actors")  # their classes are admitted (classes only)


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that admits only the classes a control-plane message holds.

    Admitted: classes of Thespian and of this package (by the module that
    defines them, so a name imported into one of their modules does not
    pass), the built-in exception classes, and the plain standard-library
    types of ``_STDLIB``. Nothing else: no function (but ``copyreg``'s
    object reconstructor and ``_codecs.encode``, which only build objects of
    admitted classes and bytes), no module, no dotted path through an object.

    Args:
        file (io.BytesIO): the pickle.
    """

    def find_class(self, module: str, name: str) -> Any:
        """The admitted class ``module.name``.

        Raises:
            pickle.UnpicklingError: it is not admitted.
        """
        allowed = _STDLIB.get(module)
        if allowed is not None:
            if name in allowed:
                return super().find_class(module, name)
        elif module == "builtins" or module.split(".")[0] in _PACKAGES:
            pass
        else:
            raise pickle.UnpicklingError(f"{module}.{name} is not admitted on the control plane")
        if "." in name:
            raise pickle.UnpicklingError(f"{module}.{name} is not admitted on the control plane")
        obj = super().find_class(module, name)
        if not isinstance(obj, type):
            raise pickle.UnpicklingError(f"{module}.{name} is not a class")
        if module == "builtins":
            if not issubclass(obj, BaseException):
                raise pickle.UnpicklingError(f"builtins.{name} is not admitted")
        elif (obj.__module__ or "").split(".")[0] not in _PACKAGES:
            raise pickle.UnpicklingError(f"{module}.{name} is not a class of {module}")
        return obj
