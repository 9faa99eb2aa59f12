"""The shared secret of the data plane between machines, and ZeroMQ CURVE from it.

Between processes of one machine the data plane runs over ``ipc://`` sockets
in a folder only the user can open. Between machines it runs over TCP, and
every connection is authenticated and encrypted with ZeroMQ's CURVE
mechanism (CurveZMQ: Curve25519 keys, each message boxed with
XSalsa20-Poly1305). Its keys come from one *shared secret* that every machine
of a run holds:

- `load_secret` reads it from ``MUJOU_SECRET`` (the secret itself) or from
  the file ``MUJOU_SECRET_FILE`` names (or a path given), refusing a file that
  its group or others may open (as ssh does for keys) and a secret shorter
  than `MIN_SECRET_BYTES`.
- `derive_keypair` turns it into a CURVE key pair per *label*: BLAKE2b of the
  secret, personalised with the label, is the 32-byte secret key
  (``zmq.curve_public`` gives its public key). Both ends derive the same
  server pair (`SERVER_LABEL`) and client pair (`CLIENT_LABEL`): nothing but
  the secret needs to be handed out, and a peer with another secret derives
  other keys and fails the handshake.
- `configure_server` and `configure_client` set a socket up (before it binds
  or connects). A CURVE server on its own accepts any client that knows its
  public key; the server here also checks the client's: a ZAP handler (the
  ZeroMQ Authentication Protocol, RFC 27) allows exactly the client key the
  secret derives, under a ZAP domain named after that key.
- Each returns a `Handshake`, which watches the socket's events
  (``zmq_socket_monitor``) so that a wrong secret is a clear error
  (`errors.HandshakeError`) within a bound instead of a silent wait:
  `Handshake.wait`; or, for a socket that serves or reaches peers for its
  whole life (the heartbeat's), `Handshake.take` reports each handshake's
  outcome without waiting and goes on watching.
- A listener (the server side) is open to anyone who can reach its port: a
  connection that fails the handshake is someone else's (a scanner, a stale
  peer, an impostor), not the awaited peer's. The server's `Handshake`
  counts it (`Handshake.refused`, and why: `Handshake.refusals`), logs it
  (at most one line every `REFUSAL_LOG_S` seconds, so a flood of them does
  not flood the log) and goes on waiting for the peer that holds the secret,
  until its timeout: only then is it a `HandshakeError`, which says how many
  were refused and why. A client's failed handshake is its own: the server
  refused this end's secret, an error at once.
- `is_loopback` tells a loopback ``tcp://`` address, the only kind on which
  a socket may go without the secret.

What a failed handshake looks like (libzmq 4.3, ZMTP 3.1, measured by
``tests/test_secure_dataplane.py``)::

    the client has                    server sees                       client sees
    another secret (both keys other)  HANDSHAKE_FAILED_PROTOCOL         HANDSHAKE_FAILED_NO_DETAIL
                                      (ZMTP_CRYPTOGRAPHIC: the HELLO    (the server closed the
                                      box does not open)                connection), then retries
    the server's public key, another  HANDSHAKE_FAILED_AUTH (400,       HANDSHAKE_FAILED_AUTH (400,
    client key                        the ZAP handler's refusal)        the server's ERROR command)
    no CURVE at all (NULL)            HANDSHAKE_FAILED_PROTOCOL         HANDSHAKE_FAILED_PROTOCOL
                                      (ZMTP_MECHANISM_MISMATCH)         (ZMTP_MECHANISM_MISMATCH)

and ``HANDSHAKE_SUCCEEDED`` on both sides when the secrets agree. A client
whose server has another secret never learns more than that the server hung
up: the server does not answer a HELLO it cannot open.

The ZAP handler is pyzmq's ``zmq.auth.thread.ThreadAuthenticator``, one thread
per ZeroMQ context (libzmq asks ZAP requests of whatever is bound at
``inproc://zeromq.zap.01`` in the socket's context, so there can be only one),
with one ``configure_curve_callback`` domain per secret: started by the first
`configure_server` of a context,
ended (joined, bounded) when the last `Handshake` of a server of that context
is closed. Each secret has its own domain, so two runs of one process with
different secrets do not accept each other's clients. The handler's sockets
belong to the context: a context is terminated only after its last
`Handshake` is closed (``term`` waits for every socket of the context).
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import ipaddress
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from ..errors import HandshakeError, SecretError

__all__ = ["load_secret", "derive_keypair", "configure_server", "configure_client",
           "Handshake", "endpoint", "is_loopback", "ENV_SECRET", "ENV_SECRET_FILE",
           "MIN_SECRET_BYTES", "SERVER_LABEL", "CLIENT_LABEL", "REFUSAL_LOG_S"]

log = logging.getLogger("mujou_actors")

ENV_SECRET = "MUJOU_SECRET"
"""The environment variable holding the secret itself."""

ENV_SECRET_FILE = "MUJOU_SECRET_FILE"
"""The environment variable naming a file that holds the secret."""

MIN_SECRET_BYTES = 16
"""The shortest secret accepted, bytes (after surrounding whitespace is removed)."""

SERVER_LABEL = "server"
"""The label of the server's key pair (the side that binds)."""

CLIENT_LABEL = "client"
"""The label of the client's key pair (the side that connects)."""

REFUSAL_LOG_S = 10.0
"""Seconds between two log lines of one listener about the connections it refused."""

_HOW = (f"set {ENV_SECRET} to a random string of at least {MIN_SECRET_BYTES} bytes, the same on "
        f"every machine of the run (for example `export {ENV_SECRET}=$(python -c \"import "
        f"secrets; print(secrets.token_hex(32))\")`), or put it in a file that only you can "
        f"read (chmod 600) and set {ENV_SECRET_FILE} to its path")
_PERSON = b"mujou."  # BLAKE2b's personalisation (16 bytes at most, the label's included)
_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
           zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_WATCHED = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
            | zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED)
_PROTOCOL_REASONS: dict[int, str] = {
    zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC: "its handshake does not decrypt",
    zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH: "the peer does not use CURVE",
}


# ---------------------------------------------------------------------------
# The secret


def load_secret(path: str | os.PathLike[str] | None = None, *,
                environ: Mapping[str, str] | None = None,
                required: bool = True) -> bytes | None:
    """The shared secret: from ``path``, else ``MUJOU_SECRET``, else ``MUJOU_SECRET_FILE``.

    A file's content, or the variable's value (UTF-8), is the secret, with
    surrounding whitespace (a final newline) removed. A file must be a regular
    file that neither its group nor others may read, write or run (mode 0600
    or 0400, as ssh asks of a private key).

    Args:
        path (str | PathLike | None): a file holding the secret; None: look in
            the environment. Default None.
        environ (Mapping[str, str] | None): the environment to read; None:
            ``os.environ``. Default None.
        required (bool): without any secret, raise (True) or return None
            (False: the caller decides, e.g. a run on loopback only).
            Default True.

    Returns:
        bytes | None: the secret, at least `MIN_SECRET_BYTES` long; None only
        when ``required`` is False and no secret is set.

    Raises:
        SecretError: both variables are set; the file is missing, unreadable,
            not a regular file, or open to its group or others (the message
            says which and gives the ``chmod``); the secret is shorter than
            `MIN_SECRET_BYTES` or not UTF-8 text in the variable; no secret is
            set and ``required`` (the message says how to set one).
    """
    env = os.environ if environ is None else environ
    if path is not None:
        return _checked(_read_file(os.fspath(path), "the secret file"), f"the file {path}")
    value = env.get(ENV_SECRET)
    named = env.get(ENV_SECRET_FILE)
    if value is not None and named is not None:
        raise SecretError(f"both {ENV_SECRET} and {ENV_SECRET_FILE} are set: set only one "
                          "(which one holds the secret would be a guess)")
    if value is not None:
        try:
            raw = value.encode("utf-8")
        except UnicodeEncodeError:
            raise SecretError(f"{ENV_SECRET} is not UTF-8 text") from None
        return _checked(raw, ENV_SECRET)
    if named is not None:
        if not named.strip():
            raise SecretError(f"{ENV_SECRET_FILE} is set but empty: it names the file holding "
                              "the secret")
        return _checked(_read_file(named, f"the file {ENV_SECRET_FILE} names"),
                        f"the file {named} ({ENV_SECRET_FILE})")
    if required:
        raise SecretError(f"no secret for the data plane between machines: {_HOW}")
    return None


def _read_file(path: str, what: str) -> bytes:
    """The bytes of a secret file, after checking that only its owner may open it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise SecretError(f"{what}, {path}, does not exist") from None
    except OSError as e:
        raise SecretError(f"{what}, {path}, cannot be opened: {e.strerror}") from None
    try:
        info = os.fstat(fd)  # the file opened, not one swapped in after a check by name
        if not stat.S_ISREG(info.st_mode):
            raise SecretError(f"{what}, {path}, is not a regular file")
        if os.name == "posix" and info.st_mode & 0o077:
            raise SecretError(f"{what}, {path}, has permissions {stat.S_IMODE(info.st_mode):04o}:"
                              f" its group or others may open it; a secret must be readable by "
                              f"its owner only (chmod 600 {path})")
        data = b""
        while chunk := os.read(fd, 1 << 16):
            data += chunk
            if len(data) > 1 << 20:
                raise SecretError(f"{what}, {path}, is over 1 MiB: not a secret")
        return data
    except OSError as e:
        raise SecretError(f"{what}, {path}, cannot be read: {e.strerror}") from None
    finally:
        os.close(fd)


def _checked(raw: bytes, where: str) -> bytes:
    """The secret without surrounding whitespace, if long enough."""
    secret = raw.strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise SecretError(f"the secret in {where} is {len(secret)} bytes long: at least "
                          f"{MIN_SECRET_BYTES} are needed (for example the 64 hex digits of "
                          "`python -c \"import secrets; print(secrets.token_hex(32))\"`)")
    return secret


# ---------------------------------------------------------------------------
# Keys


def derive_keypair(secret: bytes, label: str) -> tuple[bytes, bytes]:
    """The CURVE key pair that ``secret`` gives for ``label``, the same on every machine.

    The secret key is BLAKE2b-256 of the secret, personalised with
    ``b"mujou." + label`` (so each label gives an unrelated pair); the
    public key is its Curve25519 public key (``zmq.curve_public``).

    Args:
        secret (bytes): the shared secret (`load_secret`'s).
        label (str): which pair: `SERVER_LABEL` or `CLIENT_LABEL` (any 1 to
            10 ASCII characters).

    Returns:
        tuple[bytes, bytes]: (public key, secret key), Z85-encoded (40 bytes
        each), as ZeroMQ's ``curve_*key`` socket options take them.

    Raises:
        TypeError: ``secret`` is not bytes.
        ValueError: ``label`` is not 1 to 10 ASCII characters.
    """
    if not isinstance(secret, bytes):
        raise TypeError(f"derive_keypair: secret must be bytes, got {type(secret).__name__}")
    person = _PERSON + label.encode("ascii", "replace")
    if not label or len(person) > hashlib.blake2b.PERSON_SIZE or not label.isascii():
        raise ValueError(f"derive_keypair: label must be 1 to "
                         f"{hashlib.blake2b.PERSON_SIZE - len(_PERSON)} ASCII characters, "
                         f"got {label!r}")
    private = z85.encode(hashlib.blake2b(secret, digest_size=32, person=person).digest())
    return zmq.curve_public(private), private


def _domain(client_public: bytes) -> bytes:
    """The ZAP domain of one secret: named after its client key (so secrets do not mix)."""
    return b"mujou." + binascii.hexlify(hashlib.blake2b(client_public, digest_size=8).digest())


# ---------------------------------------------------------------------------
# Sockets


def configure_server(sock: zmq.Socket[Any], secret: bytes) -> Handshake:
    """Make ``sock`` a CURVE server that accepts only clients holding ``secret``.

    Call it before ``sock`` binds (or connects: the server is the side that
    holds the server key, whichever way the connection goes). It sets the
    server key pair, registers the client's public key with the context's ZAP
    handler (started if it is the context's first), and watches the socket's
    handshakes.

    Args:
        sock (zmq.Socket): a socket not bound nor connected yet.
        secret (bytes): the shared secret.

    Returns:
        Handshake: its `Handshake.wait` says whether a client got in; close
        it before the socket (it ends the ZAP registration).

    Raises:
        TypeError: ``secret`` is not bytes.
    """
    public, private = derive_keypair(secret, SERVER_LABEL)
    client_public, _ = derive_keypair(secret, CLIENT_LABEL)
    domain = _domain(client_public)
    zap = _Zap.acquire(sock.context, domain, client_public)
    try:
        sock.curve_server = True
        sock.curve_publickey = public
        sock.curve_secretkey = private
        sock.zap_domain = domain
        return Handshake(sock, server=True, release=lambda: zap.release(domain))
    except BaseException:
        zap.release(domain)
        raise


def configure_client(sock: zmq.Socket[Any], secret: bytes) -> Handshake:
    """Make ``sock`` a CURVE client of a server holding ``secret``.

    Call it before ``sock`` connects (or binds).

    Args:
        sock (zmq.Socket): a socket not bound nor connected yet.
        secret (bytes): the shared secret.

    Returns:
        Handshake: its `Handshake.wait` says whether the server let it in;
        close it before the socket.

    Raises:
        TypeError: ``secret`` is not bytes.
    """
    server_public, _ = derive_keypair(secret, SERVER_LABEL)
    public, private = derive_keypair(secret, CLIENT_LABEL)
    sock.curve_serverkey = server_public
    sock.curve_publickey = public
    sock.curve_secretkey = private
    return Handshake(sock, server=False, release=None)


def is_loopback(address: str) -> bool:
    """Whether ``address`` is a ``tcp://HOST:PORT`` address on loopback.

    Loopback: 127.0.0.0/8, ``::1`` (``[::1]``) and ``localhost``. Anything
    else is not: another transport, an interface name, ``*``, a host name
    (it might resolve off the machine).

    Args:
        address (str): a zmq endpoint.

    Returns:
        bool: True only for a ``tcp://`` address whose host is on loopback.
    """
    if not address.startswith("tcp://"):
        return False
    host = address[len("tcp://"):].rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # an interface name, "*", a host name: maybe not loopback
        return False


def endpoint(sock: zmq.Socket[Any]) -> str:
    """The endpoint ``sock`` bound or connected last (with the port a ``:0`` bind got).

    Args:
        sock (zmq.Socket): a socket.

    Returns:
        str: e.g. ``"tcp://127.0.0.1:40125"``; empty before any bind or connect.
    """
    value = sock.getsockopt(zmq.LAST_ENDPOINT)
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class Handshake:
    """The handshakes of one socket, watched through a ZeroMQ socket monitor.

    Made by `configure_server` and `configure_client` (before the socket
    binds or connects, so no event is missed), or directly for a socket
    without CURVE (to see a CURVE peer refused). Costs nothing per message:
    the monitor reports connections only, and stops with `wait`'s success
    (`take` leaves it running).

    On the server side a failed handshake is a connection refused, not an
    error: anyone who reaches the port can try one. It is counted
    (`refused`, `refusals`) and logged, at most one line every
    `REFUSAL_LOG_S` seconds (the lines between are folded into the next
    one's count, and `close` logs what is left), and `wait` goes on waiting
    for a peer that holds the secret. On the client side a failed handshake
    is this end's own: `wait` and `check` raise it.

    Args:
        sock (zmq.Socket): the socket watched.
        server (bool): whether it is the server side (the CURVE server, if CURVE).
        release (Callable[[], None] | None): called once by `close` (the ZAP
            registration's end).

    Attributes:
        refused (int): handshakes that failed so far, as far as they were
            taken (by `wait`, `check` or `take`): on the server side, the
            connections refused.
        refusals (dict[str, int]): the same by reason, in words, in the order
            first seen.
        succeeded (bool): whether a handshake succeeded.
    """

    def __init__(self, sock: zmq.Socket[Any], *, server: bool,
                 release: Callable[[], None] | None = None) -> None:
        self._sock = sock
        self.server = server
        self._release = release
        self._curve = False
        self._uses_curve()  # read again while open: CURVE may be set after this
        self._monitor: zmq.Socket[Any] | None = sock.get_monitor_socket(_WATCHED)
        self.succeeded = False
        self._connected = False  # a peer connected (or was accepted) at least once
        self.refused = 0
        self.refusals: dict[str, int] = {}
        self._where = ""  # the endpoint named in log lines (the first one used)
        self._logged = 0  # refusals logged so far (the others: since the last line)
        self._next_log = 0.0  # time.monotonic() from which the next line may go out

    @property
    def events(self) -> zmq.Socket[Any] | None:
        """zmq.Socket | None: the monitor's socket, readable while events wait (for a
        ``zmq.Poller``, read by `take`); None once stopped (`wait`'s success, `close`)."""
        return self._monitor

    def take(self, limit: int = 64) -> list[str | None]:
        """The outcomes of the handshakes that ended since the last call, without waiting.

        Unlike `wait`, a success does not stop the monitor: for a socket that
        serves or reaches peers for its whole life (a ROUTER and its DEALERs),
        whose every connection and reconnection has a handshake. A failure is
        counted (and logged, on the server side) as `wait` does.

        Args:
            limit (int, optional): events read at most; the rest wait for the
                next call (`events` stays readable). Default: 64.

        Returns:
            list[str | None]: oldest first, one an ended handshake: None if it
            succeeded, else why it failed, in words (as a `HandshakeError`'s
            ``reason``). Empty once stopped.
        """
        outcomes: list[str | None] = []
        mon = self._monitor
        if mon is None:
            return outcomes
        for _ in range(limit):
            if not int(mon.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                break  # looked first: an empty read's zmq.Again costs more
            try:
                event = parse_monitor_message(mon.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
            kind = event["event"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.succeeded = True
                outcomes.append(None)
            elif kind in _FAILED:
                reason = self._failure(kind, event["value"])
                self._count(reason, self._named(None))
                outcomes.append(reason)
        return outcomes

    def wait(self, timeout: float, address: str | None = None) -> None:
        """Return once a peer completed the CURVE handshake; a client raises if its own failed.

        A server (a listener: anyone may connect) counts and logs each
        connection whose handshake fails, and goes on waiting for one that
        succeeds until ``timeout``. A client raises at its first failed
        handshake: the server refused this end (another secret, or no CURVE).
        Returns at once after an earlier success.

        Args:
            timeout (float): seconds to wait at most.
            address (str | None): the endpoint to name in the error and the
                log; None: the socket's last bound or connected endpoint.

        Raises:
            HandshakeError: a client's handshake failed (``reason`` says how:
                the secrets differ, or the peer does not use CURVE); or none
                succeeded within ``timeout`` (the message says whether a peer
                connected at all and, on the server side, how many
                connections were refused and why).
        """
        if self.succeeded:
            return
        if self._monitor is None:
            raise RuntimeError("Handshake.wait: closed")
        where = self._named(address)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._monitor.poll(max(1, int(left * 1000))):
                break
            if self._on_event(where):
                return
        raise HandshakeError(where, f"no CURVE handshake within {timeout:g} s "
                             f"({self._why_none()})", server=self.server)

    def check(self, address: str | None = None) -> bool:
        """`wait` without waiting: the handshakes that ended so far, taken now.

        For a caller that waits on something else meanwhile (the start of the
        group at the other end): a server's refusals are counted and logged
        as they come (and its monitor's queue does not fill up meanwhile); a
        client's failure is an error as soon as it is seen.

        Args:
            address (str | None): the endpoint to name in the error and the
                log; None: the socket's last bound or connected endpoint.

        Returns:
            bool: True once a peer completed the handshake; False while none has.

        Raises:
            HandshakeError: a client's handshake failed (see `wait`).
        """
        if self.succeeded:
            return True
        if self._monitor is None:
            raise RuntimeError("Handshake.check: closed")
        where = self._named(address)
        while self._monitor is not None and self._monitor.poll(0):
            if self._on_event(where):
                return True
        return False

    def _named(self, address: str | None) -> str:
        """The endpoint to name: ``address``, else the socket's; the first is kept for logs."""
        where = address or endpoint(self._sock)
        if not self._where:
            self._where = where
        return where

    def _on_event(self, where: str) -> bool:
        """Read one monitor event: True for a success (the monitor stops); a failed
        handshake is counted (a server) or raised (a client); False for any other."""
        assert self._monitor is not None
        event = parse_monitor_message(self._monitor.recv_multipart())
        kind, value = event["event"], event["value"]
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.succeeded = True
            self._stop_monitor()
            if self.refused and self.server:
                log.warning("listening on %s: the peer holding the secret is in, after %s",
                            where, self._refused_text())
                self._logged = self.refused
            return True
        if kind in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED):
            self._connected = True
            return False
        reason = self._failure(kind, value)
        self._count(reason, where)
        if self.server:
            return False
        raise HandshakeError(where, reason, server=self.server)

    def _count(self, reason: str, where: str) -> None:
        """Count a failed handshake; a server logs it, at most once per `REFUSAL_LOG_S`."""
        self.refused += 1
        self.refusals[reason] = self.refusals.get(reason, 0) + 1
        if not self.server:
            return
        now = time.monotonic()
        if now < self._next_log:
            return  # folded into the next line's count
        self._next_log = now + REFUSAL_LOG_S
        since = self.refused - self._logged
        self._logged = self.refused
        log.warning("listening on %s: refused a connection that failed the handshake (%s)%s",
                    where, reason, f"; {since - 1} more since the last such line "
                    f"({self.refused} in all)" if since > 1 else "")

    def _refused_text(self) -> str:
        """``"refusing 2 connections (1: why; 1: why)"``, the count and its reasons."""
        n = self.refused
        reasons = "; ".join(f"{count}: {why}" for why, count in self.refusals.items())
        return f"refusing {n} connection{'s' if n != 1 else ''} ({reasons})"

    def _why_none(self) -> str:
        """Why no handshake succeeded, in words, for the timeout's error."""
        if not self.server:
            return ("connected but the handshake did not finish" if self._connected else
                    "nothing accepted the connection")
        if self.refused:
            return f"no peer holding the secret connected, {self._refused_text()}"
        return ("a client connected but its handshake did not finish" if self._connected else
                "no client connected")

    def _uses_curve(self) -> bool:
        """Whether the socket uses CURVE (as last seen, once it is closed)."""
        if not self._sock.closed:
            self._curve = self._sock.getsockopt(zmq.MECHANISM) == zmq.CURVE
        return self._curve

    def _failure(self, kind: int, value: int) -> str:
        """The reason, in words, of a failed handshake event."""
        curve = self._uses_curve()
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return (f"the peer's key was refused (ZAP status {value}): the secrets differ"
                    if self.server else
                    f"the server refused this client's key (ZAP status {value}): the secrets "
                    "differ")
        if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            why = _PROTOCOL_REASONS.get(value, f"ZMTP protocol error {value:#x}")
            if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                if not curve:
                    return "the peer uses CURVE (it has a secret) and this end does not"
                return f"{why} (it is not a mujou socket with a secret)"
            return f"{why}: the secrets differ"
        if not curve:
            return ("the peer closed the connection during the handshake (it may use CURVE: "
                    "a secret this end has not)")
        return ("the server closed the connection during the handshake: the secrets differ "
                "(or the address is not a mujou socket with a secret)")

    def _stop_monitor(self) -> None:
        """Stop and close the monitor (idempotent; the socket may be closed already)."""
        mon, self._monitor = self._monitor, None
        if mon is None:
            return
        if not self._sock.closed:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass  # the socket's context is gone: the monitor is too
        mon.close(linger=0)

    def close(self) -> None:
        """Stop watching, end the ZAP registration; idempotent.

        Call it before or after closing the socket (after: no handshake of
        the still open socket meets a context whose ZAP handler is gone,
        which libzmq would let through unchecked), and before terminating
        the socket's context (the handler's sockets are on it).
        """
        self._stop_monitor()
        if self.server and self.refused > self._logged:
            log.warning("listening on %s: closed after %s", self._where or "?",
                        self._refused_text())
            self._logged = self.refused
        release, self._release = self._release, None
        if release is not None:
            release()


class _OneKey:
    """pyzmq's credentials provider for one ZAP domain: it allows exactly one client key."""

    def __init__(self, client_key: bytes) -> None:
        self._key = client_key  # Z85, as pyzmq hands keys to ``callback``

    def callback(self, domain: str, key: bytes) -> bool:
        """Whether ``key`` (Z85) is the domain's client key (pyzmq's callback API)."""
        return hmac.compare_digest(key, self._key)


class _Zap:
    """A context's ZAP handler: pyzmq's `ThreadAuthenticator`, shared and refcounted.

    pyzmq answers the ZAP requests (RFC 27) in a thread of its own: a CURVE
    request is allowed when its domain is registered (``configure_curve_callback``)
    and its client key the one registered for that domain; anything else gets
    status 400 ("Unknown domain", "Unknown key", "Invalid credentials"). Only a
    socket with a ZAP domain asks, and only `configure_server` sets one, on a
    CURVE server: so pyzmq's leniency for NULL and GSSAPI requests (allowed
    unless an address list says no) never meets a socket of ours. What pyzmq
    leaves to its user is kept here: libzmq allows one handler per context, so
    every server socket of the context shares it (refcounted per domain), the
    first registration starts it, the last one's release ends it, bounded.
    """

    _lock = threading.Lock()
    _by_context: dict[int, _Zap] = {}

    def __init__(self, ctx: zmq.Context[Any], auth: ThreadAuthenticator) -> None:
        self._ctx = ctx
        self._auth = auth
        self._users: dict[bytes, int] = {}  # domain -> registrations

    @classmethod
    def acquire(cls, ctx: zmq.Context[Any], domain: bytes, client_key: bytes) -> _Zap:
        """The context's handler (started if none), with ``domain`` allowing ``client_key``.

        Args:
            ctx (zmq.Context): the server socket's context.
            domain (bytes): the ZAP domain (`_domain`).
            client_key (bytes): the client's public key, Z85.

        Raises:
            zmq.ZMQError: the ZAP endpoint stays taken for 10 s (another ZAP
                handler than ours is bound in this context).
        """
        deadline = time.monotonic() + 10.0
        while True:
            with cls._lock:
                zap = cls._by_context.get(id(ctx))
                if zap is None:
                    auth = ThreadAuthenticator(ctx)
                    try:
                        auth.start()
                    except zmq.ZMQError as e:
                        auth.stop()  # closes the ZAP socket whose bind failed
                        # The last handler's socket is closed but not yet reaped (libzmq
                        # unbinds an inproc endpoint on its reaper thread): try again.
                        if e.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                            raise
                    else:
                        auth.thread.name = "mujou-zap"  # ours among a process's threads
                        zap = cls._by_context[id(ctx)] = cls(ctx, auth)
                if zap is not None:
                    users = zap._users.get(domain, 0)
                    if not users:
                        zap._auth.configure_curve_callback(domain.decode("ascii"),
                                                           credentials_provider=_OneKey(
                                                               client_key))
                    zap._users[domain] = users + 1
                    return zap
            time.sleep(0.005)  # outside the lock

    def release(self, domain: bytes) -> None:
        """One registration of ``domain`` ended; the last of the context ends the thread.

        Raises:
            RuntimeError: the handler's thread did not end within 10 s.
        """
        with self._lock:
            users = self._users[domain]
            if users > 1:
                self._users[domain] = users - 1
                return
            del self._users[domain]
            # Read by pyzmq's thread for each request: a dict's pop is atomic.
            self._auth.credentials_providers.pop(domain.decode("ascii"), None)
            if self._users:
                return
            del self._by_context[id(self._ctx)]
        # pyzmq's stop joins its thread without a bound; the wait for it is bounded here.
        stopper = threading.Thread(target=self._auth.stop, name="mujou-zap-stop", daemon=True)
        stopper.start()
        stopper.join(10.0)
        if stopper.is_alive():  # its thread waits only in poll, which TERMINATE ends: not seen
            raise RuntimeError("the ZAP handler thread did not end within 10 s")
