"""Several machines in one Thespian convention: member actor systems and the leader's view.

A convention is Thespian's way for several actor systems to form one: each
*member* (a ``multiprocTCPBase`` actor system on a machine, with a capability
naming the machine) registers with the *leader* whose address its
``"Convention Address.IPv4"`` capability gives, and the leader's admin then
creates an actor on the member whose capabilities it needs. Here:

* `Member` starts a member on this machine (what ``mujou worker`` runs): its
  own admin (and Thespian's logger), on the given address and admin port,
  processes started with ``spawn``, the capability ``{MEMBER: name}``;
* `leader_admin` gives the settings that make a
  `~mujou_actors.distributed.system.ProcessSystem` (a run's control plane)
  the leader; `Leader` is a leader of its own, with no coordinator (tests,
  tools);
* `members` / `known_members` list the members a leader knows, with their
  capabilities, from any process; `wait_for_members` waits for named ones
  (up to ``join_timeout``) and raises `~mujou_actors.errors.JoinTimeoutError`
  naming those missing and those known;
* an actor lands on a member when it is created with
  ``targetActorRequirements=requirement(name)`` and its class has an
  ``actorSystemCapabilityCheck`` that honours it (as
  `~mujou_actors.distributed.actors.GroupActor` does): the system that cannot
  hold it (the leader) has its admin forward the creation to a member that can.

Either side may start first. A member registers with its leader at its start
and again every `REGISTER_PERIOD` (so a member started first joins within two
periods of the leader's start); Thespian's own periods are minutes (a
member that found no leader would try again only 3 min 22 s later), so the
member's admin is started with ``CONVENTION_REREGISTRATION_PERIOD`` and
``CONVENTION_RESTART_PERIOD`` of one second (Thespian reads them from the
environment; a value the user set wins). The leader's admin gets the same
period and drops a member silent for `LEADER_MISSES` periods (Thespian's
default: 22 minutes); a lost machine is found sooner by mujou's own heartbeat,
not here. A member that ends cleanly deregisters at once.

How the leader's members are listed: the way a Thespian actor follows a
convention (``NotifyOnSystemRegistration``: the leader's admin sends one
``ActorSystemConventionUpdate`` per member it knows, with the capabilities
the member registered), done once, then a ``QueryExists`` to each member; one
that does not answer within the bound (gone, unreachable) is left out. The
requests go from a socket of the caller's own (`_Client`), so no actor
system is started or joined for them.

Security (see docs/security.md): every frame between the admins, actors and
clients of a convention carries an HMAC of the control plane's key, derived
from the ``MUJOU_SECRET`` every machine holds (`convention_key`), and is
checked before anything of it is unpickled (`~mujou_actors.distributed._frames`);
a peer without the secret is refused. Frames are authenticated, not
encrypted. Every socket here is on 127.0.0.1 by default
(`~mujou_actors.distributed._loopback`); a member or leader listens on another
address only when asked with ``allow_remote=True``, else `ValueError`.

Processes: a `Member` or `Leader` is an admin and a logger (Thespian's), in
a process group of their own (the admin's ``setsid``), plus the actors created
on it. Neither imports the package unless an actor class of the package is
created there (then the admin imports its module to call the class's
capability check: `distributed.actors`, without torch, since the package
imports its public names when first used). Each process runs
the watchdog of `~mujou_actors.distributed._loopback`, so a killed owner
(the ``mujou worker`` process) leaves nothing behind; `Member.close` ends them
all, with a bound on every wait.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, Self

from thespian.actors import ActorSystemConventionUpdate
from thespian.system.messages.admin import QueryAck, QueryExists
from thespian.system.messages.convention import NotifyOnSystemRegistration
from thespian.system.transport import (
    ExternalInterfaceTransportInit,
    ReceiveEnvelope,
    SendStatus,
    Thespian__Run_Terminated,
    Thespian__UpdateWork,
    TransmitIntent,
    TransmitOnly,
)
from thespian.system.transport.TCPTransport import TCPTransport

from ..errors import JoinTimeoutError
from ._loopback import (
    ANY,
    LOOPBACK,
    MEMBER_FOLDER_ENV,
    _frames,
    alive,
    remove_folder,
    reserve_listener,
    transport_for,
)
from ._procs import end_all, group_members, reap_starters
from .actors import MEMBER
from .admin import AdminSettings, start_admin

__all__ = [
    "LEADER_MISSES",
    "MEMBER",
    "REGISTER_PERIOD",
    "Leader",
    "Member",
    "MemberInfo",
    "check_listen",
    "check_name",
    "known_members",
    "leader_admin",
    "member_state",
    "members",
    "parse_address",
    "requirement",
    "wait_for_members",
]

log = logging.getLogger("mujou_actors")

CONVENTION_ADDRESS = "Convention Address.IPv4"  # Thespian's capability: the leader's (host, port)
REGISTER_PERIOD = 1.0  # seconds between a member's registrations with its leader
LEADER_MISSES = 10  # registration periods without one before the leader drops a member
LIST_TIMEOUT_S = 2.0  # the default bound of a listing of the members
POLL_S = 0.1  # wait_for_members: seconds between two listings
PORT_WAIT_S = 3.0  # the longest wait for a given port that an ended admin still holds
_PERIOD = f"0:{int(REGISTER_PERIOD):02d}"  # Thespian's "minutes:seconds"
MEMBER_ENVIRONMENT = {"CONVENTION_REREGISTRATION_PERIOD": _PERIOD,
                      "CONVENTION_RESTART_PERIOD": _PERIOD}
LEADER_ENVIRONMENT = {"CONVENTION_REREGISTRATION_PERIOD": _PERIOD,
                      "CONVENTION_REGISTRATION_MISS_MAX": str(LEADER_MISSES)}
_RESERVED = frozenset({"Admin Port", CONVENTION_ADDRESS, "Process Startup Method", MEMBER})


class MemberInfo(NamedTuple):
    """A member a leader knows (`known_members`).

    Attributes:
        name (str): its name (its ``MEMBER`` capability).
        address (str): its admin's address, ``"host:port"``.
        capabilities (dict[str, Any]): its actor system's capabilities
            (Thespian's, ``MEMBER``, ``"mujou.host"`` (the machine's host
            name), ``"mujou.pid"`` (the pid of the process that started it)
            and those it was given).
    """

    name: str
    address: str
    capabilities: dict[str, Any]


def requirement(member: str) -> dict[str, str]:
    """The ``targetActorRequirements`` that create an actor on the member named ``member``.

    Args:
        member (str): the member's name.

    Returns:
        dict[str, str]: ``{MEMBER: member}``.
    """
    return {MEMBER: member}


# --------------------------------------------------------------------------- addresses

def parse_address(text: str, *, default_port: int | None = None,
                  free: bool = False) -> tuple[str, int]:
    """``"HOST:PORT"`` (or ``"HOST"`` with a default port) as ``(host, port)``.

    Args:
        text (str): the address: an IPv4 address or a host name, then
            ``:PORT``.
        default_port (int | None): the port when ``text`` has none; ``None``
            makes the port required.
        free (bool): whether port 0 ("any free port") is allowed.

    Returns:
        tuple[str, int]: the host, as written, and the port.

    Raises:
        ValueError: no host, a port missing or not a number, or out of range
            (1 to 65535; 0 too with ``free``).
    """
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is no address (HOST:PORT)")
    host, colon, port_text = text.strip().rpartition(":")
    if not colon:
        host, port_text = text.strip(), ""
    if not host or any(c.isspace() for c in host) or ":" in host:
        raise ValueError(f"{text!r} is no address: HOST:PORT, with an IPv4 address or a "
                         "host name")
    if not port_text:
        if default_port is None:
            raise ValueError(f"{text!r} has no port: HOST:PORT")
        return host, default_port
    if not port_text.isdigit():
        raise ValueError(f"{text!r}: the port {port_text!r} is not a number")
    port = int(port_text)
    low = 0 if free else 1
    if not low <= port <= 65535:
        raise ValueError(f"{text!r}: the port {port} is out of range ({low} to 65535)")
    return host, port


def _resolve(host: str) -> str:
    """``host`` as an IPv4 address (a name looked up); ``ValueError`` when it is none."""
    try:
        return str(socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    except (OSError, UnicodeError) as exc:
        raise ValueError(f"{host!r} is no IPv4 address or host name known here "
                         f"({exc})") from exc


def _is_loopback(ip: str) -> bool:
    """Whether an IPv4 address is one of the loopback's (127.0.0.0/8)."""
    return ipaddress.ip_address(ip).is_loopback


def _is_local(ip: str) -> bool:
    """Whether an IPv4 address is one of this machine's (a socket may be bound to it)."""
    with socket.socket() as probe:
        try:
            probe.bind((ip, 0))
        except OSError:
            return False
    return True


def check_listen(host: str, allow_remote: bool, what: str) -> str:
    """The address to bind to for ``host``: checked, looked up (`ANY` for 0.0.0.0).

    Args:
        host (str): an IPv4 address or a host name of this machine, or ``0.0.0.0``.
        allow_remote (bool): whether an address that is not a loopback one is allowed.
        what (str): who would listen, for the message (``"member 'robot'"``).

    Returns:
        str: the IPv4 address (`~mujou_actors.distributed._loopback.ANY` for every
        interface).

    Raises:
        ValueError: not an address of this machine, or not a loopback one
            without ``allow_remote`` (the message says why that is refused).
    """
    ip = _resolve(host)
    if not _is_loopback(ip) and not allow_remote:
        raise ValueError(
            f"{what} would listen on {host} ({ip}), which is not a loopback address: "
            "refused without allow_remote=True (--allow-remote). The control plane's "
            "frames are authenticated with MUJOU_SECRET but not encrypted, so listen "
            "beyond this machine only on a network you choose to")
    if ip == ANY:
        return ANY
    if not _is_local(ip):
        raise ValueError(f"{what} cannot listen on {host} ({ip}): not an address of "
                         "this machine")
    return ip


def _check_port_free(host: str, port: int, what: str) -> None:
    """Refuse a port that something listens on; wait (briefly) for one still in use.

    An admin listening there would be joined, not started, by Thespian. A
    port whose listener just ended may still be held, for some milliseconds,
    by the connections it never accepted, or by its process's last threads;
    Thespian's admin could not bind it then (and its start would wait 5 s), so
    this waits up to `PORT_WAIT_S` for the port to be free.

    Raises:
        ValueError: something listens there, or the port stays in use.
    """
    peer = LOOPBACK if host == ANY else host
    deadline = time.monotonic() + PORT_WAIT_S
    while True:
        try:
            with socket.create_connection((peer, port), timeout=1.0) as conn:
                # Linux may pick the port itself as the connection's own, when nothing
                # listens there: the connection then reaches itself.
                listening = conn.getsockname() != conn.getpeername()
        except OSError:
            listening = False  # refused: nothing listens there, as it should be
        if listening and time.monotonic() >= deadline:
            raise ValueError(f"{what}: something listens on port {port} of {peer} already; "
                             "give another port, or none for a free one")
        if not listening:
            with socket.socket() as probe:
                # SO_REUSEADDR, as Thespian's own sockets: closed connections in TIME_WAIT
                # do not stand in the way, those still open do.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("" if host == ANY else host, port))
                    return
                except OSError as exc:
                    if time.monotonic() >= deadline:
                        raise ValueError(f"{what}: port {port} on {host} is in use "
                                         f"({exc.strerror}); give another, or none for a "
                                         "free one") from exc
        time.sleep(0.02)


def _claim_port(host: str, port: int, what: str) -> tuple[int, socket.socket | None]:
    """The admin's port on ``host``, and the socket holding it when the system picked it.

    Port 0: a free one, held by a listening socket until the admin has it
    (`_loopback.reserve_listener`); any other is checked (`_check_port_free`)
    and returned with ``None``.

    Raises:
        ValueError: something listens on the port given, or it stays in use.
    """
    if port != 0:
        _check_port_free(host, port, what)
        return port, None
    listener = reserve_listener(host)
    return int(listener.getsockname()[1]), listener


def _address_text(address: Any) -> str:
    """A Thespian TCP address as ``"host:port"`` (its ``str()`` where it is no such one)."""
    details = getattr(address, "addressDetails", None)
    sockname = getattr(details, "sockname", None)
    if isinstance(sockname, tuple) and len(sockname) >= 2:
        return f"{sockname[0]}:{sockname[1]}"
    return str(address)


def _leader_address(leader: str | tuple[str, int]) -> tuple[str, int]:
    """A leader's address as ``(IPv4 address, port)``, from ``"host:port"`` or a tuple."""
    host, port = parse_address(f"{leader[0]}:{leader[1]}" if isinstance(leader, tuple)
                               else leader)
    return _resolve(host), port


def convention_key() -> bytes:
    """The control plane's key of a convention: `_frames.control_key` of ``MUJOU_SECRET``.

    Every admin, actor and client of a convention (its leader, its members,
    a run's processes on them) authenticates its frames with it, so every
    machine must hold the same secret.

    Returns:
        bytes: the key (32 bytes).

    Raises:
        SecretError: no usable secret is set (the message says how to set one).
    """
    from .secret import load_secret

    secret = load_secret()
    assert secret is not None  # required=True: raised otherwise
    return bytes(_frames.control_key(secret))


# --------------------------------------------------------------------------- requests

class _Client:
    """A Thespian endpoint of this process's own, for requests to admins.

    A transport socket (bound to 127.0.0.1 toward a loopback peer, else to the
    address this machine reaches ``toward`` from), closed by `close`. No actor
    system is started or joined: the requests go straight to the admins' ports.
    Driven by one thread.

    Args:
        toward (str): the IPv4 address of the admins asked (the leader's).
        key (bytes | None): the control plane's key; ``None`` for `convention_key`.
    """

    def __init__(self, toward: str, key: bytes | None = None) -> None:
        host = LOOPBACK if _is_loopback(toward) else _outward_address(toward)
        capabilities = {"Admin Port": 1}  # unused here: every request names its admin
        self._transport = transport_for(host, key if key is not None else convention_key())(
            ExternalInterfaceTransportInit(), capabilities, None, None)
        self._failed: list[Any] = []  # the targets of sends that failed, in order
        self._refused: list[Any] = []  # those whose admin answered "bad frame" (ACK+DATAERR)

    def convention(self, admin: Any, timeout: float) -> list[tuple[Any, dict[str, Any]]] | None:
        """The convention members an admin knows, with their capabilities, as it registered them.

        Thespian's way for an actor to follow a convention, done once: the
        client asks the admin for its registration updates
        (``NotifyOnSystemRegistration``), which the admin answers at once with
        one ``ActorSystemConventionUpdate`` per member it knows, then sends a
        ``QueryExists``, whose ``QueryAck`` comes after them (the admin answers
        in order, one sender's messages go out in order), and ends the
        notifications. (Not ``Thespian_StatusReq``: once an admin refused to
        create an actor, its status holds an address that does not pickle and
        the status is never sent.)

        Args:
            admin (Any): the admin's Thespian address, or ``(host, port)``.
            timeout (float): seconds.

        Returns:
            list[tuple[Any, dict[str, Any]]] | None: (admin address, capabilities)
            of each member, or ``None`` when the admin did not answer in time
            (nothing listens there, or it is not a Thespian admin).
        """
        admin = self._address(admin)
        deadline = time.monotonic() + timeout
        self._failed.clear()
        self._send(admin, NotifyOnSystemRegistration(None, True))
        self._send(admin, QueryExists())
        found: dict[str, tuple[Any, dict[str, Any]]] = {}
        try:
            while True:
                envelope = self._receive(deadline, lambda: admin in self._failed)
                if envelope is None:
                    return None
                msg = envelope.message
                if isinstance(msg, ActorSystemConventionUpdate):
                    key = _address_text(msg.remoteAdminAddress)
                    if msg.remoteAdded:
                        found[key] = (msg.remoteAdminAddress, dict(msg.remoteCapabilities or {}))
                    else:
                        found.pop(key, None)
                elif isinstance(msg, QueryAck) and envelope.sender == admin:
                    return list(found.values())
        finally:
            self._send(admin, NotifyOnSystemRegistration(None, False))
            self._flush(min(max(deadline - time.monotonic(), 0.0), 0.5) + 0.05)

    def answering(self, admins: list[Any], timeout: float) -> list[Any]:
        """The admins of ``admins`` that answer a ``QueryExists`` within ``timeout``.

        Args:
            admins (list[Any]): Thespian addresses.
            timeout (float): seconds for all of them (asked at once).

        Returns:
            list[Any]: those that answered, in the order given.
        """
        deadline = time.monotonic() + timeout
        self._failed.clear()
        for admin in admins:
            self._send(admin, QueryExists())
        answered: list[Any] = []

        def done() -> bool:
            return len(answered) + len(self._failed) >= len(admins)

        while not done():
            envelope = self._receive(deadline, done)
            if envelope is None:
                break
            if isinstance(envelope.message, QueryAck) and envelope.sender in admins and (
                    envelope.sender not in answered):
                answered.append(envelope.sender)
        return [admin for admin in admins if admin in answered]

    def members(self, leader: tuple[str, int], timeout: float) -> list[MemberInfo] | None:
        """The members the leader knows that answer; ``None`` when the leader does not answer.

        Args:
            leader (tuple[str, int]): the leader's admin address.
            timeout (float): seconds for all the requests.

        Returns:
            list[MemberInfo] | None: sorted by name, then address.
        """
        deadline = time.monotonic() + timeout
        known = self.convention(leader, timeout)
        if known is None:
            return None
        named = [(address, caps) for address, caps in known if isinstance(caps.get(MEMBER), str)]
        up = self.answering([address for address, _ in named], deadline - time.monotonic())
        found = [MemberInfo(caps[MEMBER], _address_text(address), caps)
                 for address, caps in named if address in up]
        for address, _ in named:
            if address not in up:
                log.debug("convention member %s does not answer; left out", address)
        return sorted(found, key=lambda m: (m.name, m.address))

    @property
    def failed(self) -> list[Any]:
        """The admins whose sends failed in the last request (a refused connection)."""
        return list(self._failed)

    def _address(self, address: Any) -> Any:
        """A Thespian address from ``(host, port)`` (or the address itself)."""
        if isinstance(address, tuple):
            return TCPTransport.getAddressFromString(address)
        return address

    def refuses(self, admin: Any, timeout: float) -> bool:
        """Whether ``admin`` refuses this client's frames (another ``MUJOU_SECRET``).

        An admin that cannot check a frame's HMAC answers Thespian's
        ``ACK+DATAERR``; one that is not there refuses the connection (not
        this). Asks with a ``QueryExists``.

        Args:
            admin (Any): the admin's Thespian address, or ``(host, port)``.
            timeout (float): seconds.

        Returns:
            bool: ``True`` when it answered that the frame was bad.
        """
        admin = self._address(admin)
        self._refused.clear()
        self.answering([admin], timeout)
        return admin in self._refused

    def _send(self, to: Any, msg: Any) -> None:
        """Queue a message to an admin (sent while the transport runs)."""
        def failed(result: Any, intent: Any) -> None:
            self._failed.append(intent.targetAddr)
            if result == SendStatus.BadPacket:
                self._refused.append(intent.targetAddr)
            self._transport.abort_run()  # wake the wait: that answer will not come

        self._transport.scheduleTransmit(None, TransmitIntent(to, msg, onError=failed))

    def _receive(self, deadline: float, done: Callable[[], bool]) -> Any:
        """The next message that reaches the client before ``deadline``, or ``None``.

        ``None`` also as soon as ``done()`` (checked again after a failed send).
        """
        while True:
            if done():
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            result = self._transport.run(None, left)
            if isinstance(result, ReceiveEnvelope):
                return result
            if not isinstance(result, (Thespian__UpdateWork, Thespian__Run_Terminated)):
                return None  # expired

    def _flush(self, timeout: float) -> None:
        """Run the transport until the queued sends are out, at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._transport.run(TransmitOnly, deadline - time.monotonic()):
                return  # all sent

    def close(self) -> None:
        """Close the socket (and drop any send still pending)."""
        self._transport.close()

    def __enter__(self) -> Self:
        """The client itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """`close`."""
        self.close()


def _outward_address(toward: str) -> str:
    """The address of this machine that packets to ``toward`` leave from (none are sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((toward, 9))
            return str(probe.getsockname()[0])
        except OSError as exc:
            raise ConnectionError(f"no route from this machine to {toward}: {exc}") from exc


def known_members(leader: str | tuple[str, int],
                  timeout: float = LIST_TIMEOUT_S) -> list[MemberInfo]:
    """Every member the leader knows that answers, with its capabilities.

    Two members may have the same name here (see `members`); actor systems
    without a ``MEMBER`` capability (not started by `Member`) are left out.

    Args:
        leader (str | tuple[str, int]): the leader's admin address,
            ``"host:port"`` or ``(host, port)``.
        timeout (float): seconds for all the requests (one to the leader, one
            to each member it knows); a member that has not answered by then is
            left out.

    Returns:
        list[MemberInfo]: sorted by name, then address.

    Raises:
        ValueError: a malformed address.
        ConnectionError: no convention leader answers at that address.
    """
    host, port = _leader_address(leader)
    with _Client(host) as client:
        found = client.members((host, port), timeout)
    if found is None:
        raise ConnectionError(f"no Thespian admin answers at {host}:{port} (refused, or "
                              f"no answer within {timeout:g} s)")
    return found


def members(leader: str | tuple[str, int],
            timeout: float = LIST_TIMEOUT_S) -> dict[str, dict[str, Any]]:
    """The members the leader knows that answer: name -> capabilities.

    Args:
        leader (str | tuple[str, int]): the leader's admin address,
            ``"host:port"`` or ``(host, port)``.
        timeout (float): seconds for all the requests (see `known_members`).

    Returns:
        dict[str, dict[str, Any]]: their capabilities by name, names sorted.

    Raises:
        ValueError: a malformed address, or two members have the same name
            (Thespian would place an actor for that name on either).
        ConnectionError: no convention leader answers at that address.
    """
    return _by_name(known_members(leader, timeout), None)


def member_state(leader: str | tuple[str, int], name: str,
                 timeout: float = LIST_TIMEOUT_S) -> bool | None:
    """Whether the member ``name`` answers now, telling a gone one from a silent one.

    Args:
        leader (str | tuple[str, int]): the leader's admin address.
        name (str): the member's name.
        timeout (float): seconds for the requests (one to the leader, one to
            each member of that name).

    Returns:
        bool | None: True: it answered. False: it is gone (the leader does not
        list it, or its admin refused the connection: nothing listens on its
        port, so its process is dead). None: no answer within ``timeout`` (a
        busy admin, e.g. importing the package for a capability check, or a
        machine that cannot be reached).

    Raises:
        ConnectionError: the leader did not answer.
    """
    host, port = _leader_address(leader)
    deadline = time.monotonic() + timeout
    with _Client(host) as client:
        known = client.convention((host, port), timeout)
        if known is None:
            raise ConnectionError(f"no Thespian admin answers at {host}:{port} (refused, "
                                  f"or no answer within {timeout:g} s)")
        admins = [address for address, caps in known if caps.get(MEMBER) == name]
        if not admins:
            return False
        up = client.answering(admins, max(deadline - time.monotonic(), 0.0))
        if up:
            return True
        return False if all(a in client.failed for a in admins) else None


def _by_name(found: list[MemberInfo], names: Iterable[str] | None) -> dict[str, dict[str, Any]]:
    """Name -> capabilities; ``ValueError`` for a name (of ``names``, or any) held twice."""
    result: dict[str, dict[str, Any]] = {}
    where: dict[str, list[str]] = {}
    for member in found:
        result.setdefault(member.name, member.capabilities)
        where.setdefault(member.name, []).append(member.address)
    checked = set(where) if names is None else set(names)
    twice = sorted(name for name in checked if len(where.get(name, ())) > 1)
    if twice:
        raise ValueError("; ".join(f"two members are named {name!r} (at "
                                   f"{' and '.join(where[name])})" for name in twice)
                         + ": Thespian would place a group for that name on either; stop "
                           "all but one")
    return result


def wait_for_members(leader: str | tuple[str, int], names: Iterable[str],
                     join_timeout: float = 30.0) -> dict[str, dict[str, Any]]:
    """Wait until a member of each name has joined the leader; its members then.

    Lists the leader's members (as `members` does) every `POLL_S` seconds
    until every name is there.

    Args:
        leader (str | tuple[str, int]): the leader's admin address.
        names (Iterable[str]): the names of the members wanted.
        join_timeout (float): seconds to wait for them (a member started before
            the leader registers within two `REGISTER_PERIOD` of the leader's start).

    Returns:
        dict[str, dict[str, Any]]: every member known then, name -> capabilities.

    Raises:
        JoinTimeoutError: some names had no member by then; it names them and
            the members known (a note says so if the leader did not answer).
        ValueError: a malformed address or name, or two members have a name wanted.
    """
    wanted = sorted(set(names))
    for name in wanted:
        check_name(name)
    host, port = _leader_address(leader)
    deadline = time.monotonic() + join_timeout
    known: dict[str, dict[str, Any]] = {}
    answered = False
    with _Client(host) as client:
        while True:
            left = deadline - time.monotonic()
            found = client.members((host, port), min(max(left, POLL_S), LIST_TIMEOUT_S))
            if found is not None:
                answered = True
                known = _by_name(found, wanted)
                if all(name in known for name in wanted):
                    return known
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(POLL_S, left))
    error = JoinTimeoutError(tuple(n for n in wanted if n not in known), known,
                             f"{host}:{port}", join_timeout)
    if answered:
        error.add_note("A machine whose MUJOU_SECRET is not this one's cannot join: the "
                       "leader refuses its frames (its `mujou worker` says so).")
    else:
        error.add_note(f"No Thespian admin answered at {host}:{port}: is the leader up, "
                       "and is this its address?")
    raise error


def check_name(name: Any) -> None:
    """Refuse a member name that a placement (``"member:group"``) could not write.

    Args:
        name (Any): the name.

    Raises:
        ValueError: not a non-empty str, or it holds ``:`` or white space.
    """
    if not isinstance(name, str) or not name or ":" in name or any(
            c.isspace() for c in name):
        raise ValueError(f"a member's name is a non-empty str without ':' or spaces, "
                         f"not {name!r}")


# --------------------------------------------------------------------------- actor systems

class _System:
    """An actor system of this process's own: Thespian's admin and logger, and their end.

    Args:
        what (str): how errors and logs name it (``"member 'robot'"``).
        host (str): the address its sockets are bound to (or `ANY`).
        port (int): its admin's port.
        capabilities (dict[str, Any]): its capabilities.
        environment (Mapping[str, str]): variables set while the admin starts.
        start_timeout (float): seconds for the admin to answer.
        listener (socket.socket | None): a socket listening on ``port`` already
            (`_loopback.reserve_listener`), handed to the admin (closed here).

    Raises:
        SecretError: no usable ``MUJOU_SECRET`` (`convention_key`).
        TimeoutError: the admin did not answer in time (all of it is ended first).
    """

    def __init__(self, what: str, host: str, port: int, capabilities: dict[str, Any],
                 environment: Mapping[str, str], start_timeout: float,
                 listener: socket.socket | None = None) -> None:
        try:
            self._key = convention_key()  # before anything starts: no secret, nothing to end
        except BaseException:
            if listener is not None:
                listener.close()
            raise
        self._what = what
        self._host = host
        self.port = port
        self._lock = threading.Lock()  # Thespian's ActorSystem is not thread-safe
        self._asys: Any = None
        self._starters: set[int] = set()  # our children that started the admin: to reap
        self._closed = False
        self._ended = False  # close() is done: every process of it is gone
        self._folder = tempfile.mkdtemp(prefix="mujou-convention-")
        try:
            self._start(capabilities, environment, start_timeout, listener)
        except BaseException:
            if listener is not None:
                listener.close()  # start_admin was not reached
            self.close(timeout=5.0)
            raise

    def _start(self, capabilities: dict[str, Any], environment: Mapping[str, str],
               timeout: float, listener: socket.socket | None = None) -> None:
        """Start the admin (`admin.start_admin`: Thespian's log in the private folder)."""
        self._asys = start_admin(self._host, self._key, capabilities, environment,
                                 self._folder, timeout, self._starters,
                                 f"the admin of {self._what} (port {self.port})", listener)
        reap_starters(self._starters)

    @property
    def actor_system(self) -> Any:
        """Any: the Thespian ``ActorSystem`` (``createActor``, ``ask``; not thread-safe).

        Raises:
            RuntimeError: it is closed.
        """
        if self._asys is None:
            raise RuntimeError(f"{self._what} is closed")
        return self._asys

    def pids(self) -> list[int]:
        """The processes of the actor system still running: admin, logger, its actors.

        Returns:
            list[int]: the pids, in increasing order (the members of its process
            group, `_procs.group_members`; empty once `close` is done: the
            group's id may then be another's).
        """
        if self._ended:
            return []
        return sorted(p for p in group_members(self._starters)
                      if p != os.getpid() and alive(p))

    def running(self) -> bool:
        """Whether its admin still runs.

        Returns:
            bool: ``True`` while a process of it (the admin or another) runs.
        """
        return self._asys is not None and bool(self.pids())

    def _own_address(self) -> tuple[str, int]:
        """Where this process reaches the admin."""
        return (LOOPBACK if self._host == ANY else self._host), self.port

    def close(self, timeout: float = 10.0) -> None:
        """End the actor system: its actors, its admin and logger; idempotent.

        Thespian's shutdown first (the admin ends its actors and, a member,
        deregisters from its leader; Thespian bounds it by 10 s); any process
        of it still there after ``timeout`` is killed (then up to
        `~mujou_actors.distributed._procs.KILL_WAIT_S` more). Afterwards no
        process of it is left and nothing listens on its port.

        Args:
            timeout (float): seconds for the graceful part.
        """
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        try:
            if self._asys is not None:
                with self._lock:
                    self._asys.shutdown()
        finally:
            self._asys = None
            end_all(self.pids, None, max(deadline - time.monotonic(), 0.0))
            reap_starters(self._starters)  # their pids stay: each is the group of `pids`
            self._ended = True
            remove_folder(self._folder)  # with what a killed group's peer links left

    def __enter__(self) -> Self:
        """The system itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """`close`, with its default timeout."""
        self.close()


class Member(_System):
    """A member actor system of a convention, on this machine (what ``mujou worker`` runs).

    Started at once: its admin on ``listen`` (a free port unless one is
    given), ``{"Convention Address.IPv4": leader}``, processes started with
    ``spawn``, the capabilities ``{MEMBER: name, "mujou.host": <this host's
    name>, "mujou.pid": <this pid>}`` and those given. It keeps registering
    with the leader every `REGISTER_PERIOD` seconds whether the leader is up
    or not, so either may start first. Ends with `close` (or ``with``).

    Args:
        name (str): the member's name (the machine's), no ``:`` or spaces;
            placements name it.
        leader (str | tuple[str, int]): the leader's admin address,
            ``"host:port"`` or ``(host, port)``.
        listen (str): ``"HOST"`` or ``"HOST:PORT"`` to listen on: a loopback
            address (127.0.0.1 by default) unless ``allow_remote``; port 0 or
            none for a free one. The admin's port is ``port``; every other
            socket of it (its logger, each actor) is on the same address, on an
            ephemeral port.
        allow_remote (bool): allow a non-loopback ``listen`` (for a trusted
            network of your choice: frames are authenticated with ``MUJOU_SECRET``,
            not encrypted).
        capabilities (Mapping[str, Any] | None): more capabilities (plain data),
            e.g. ``{"gpu": True}``; Thespian's and ``MEMBER`` may not be set.
        start_timeout (float): seconds for the admin to answer.

    Raises:
        ValueError: a bad name or address, a non-loopback ``listen`` without
            ``allow_remote``, a port taken, a leader on another machine while
            this member listens on the loopback (it could not reach it), or a
            reserved capability.
        SecretError: no usable ``MUJOU_SECRET`` (`convention_key`).
        TimeoutError: the admin did not answer in time (all of it is ended first).
    """

    def __init__(self, name: str, leader: str | tuple[str, int], *, listen: str = LOOPBACK,
                 allow_remote: bool = False, capabilities: Mapping[str, Any] | None = None,
                 start_timeout: float = 30.0) -> None:
        check_name(name)
        what = f"member {name!r}"
        leader_host, leader_port = _leader_address(leader)
        host_text, port = parse_address(listen, default_port=0, free=True)
        host = check_listen(host_text, allow_remote, what)
        if (host != ANY and _is_loopback(host) and not _is_loopback(leader_host)
                and not _is_local(leader_host)):
            raise ValueError(f"{what} listens on {host}, but its leader {leader_host} is on "
                             "another machine, which could not reach it: listen on an address "
                             "of this machine that the leader reaches (with allow_remote=True)")
        extra = dict(capabilities or {})
        reserved = sorted(set(extra) & _RESERVED)
        if reserved:
            raise ValueError(f"{what}: the capabilities {reserved} are set by Member itself")
        port, listener = _claim_port(host, port, what)
        self.name = name
        self.leader = (leader_host, leader_port)
        caps = {**extra, "Admin Port": port, CONVENTION_ADDRESS: (leader_host, leader_port),
                "Process Startup Method": "spawn", MEMBER: name,
                "mujou.host": socket.gethostname(), "mujou.pid": os.getpid()}
        super().__init__(what, host, port, caps, MEMBER_ENVIRONMENT, start_timeout, listener)

    def _start(self, capabilities: dict[str, Any], environment: Mapping[str, str],
               timeout: float, listener: socket.socket | None = None) -> None:
        """`_System._start`, its processes told the member's private folder
        (`_loopback.MEMBER_FOLDER_ENV`): a run's groups here make the folders of their
        peer links on this machine in it (`peers.LocalFolder`)."""
        super()._start(capabilities, {**environment, MEMBER_FOLDER_ENV: self._folder},
                       timeout, listener)

    @property
    def address(self) -> tuple[str, int]:
        """tuple[str, int]: where its admin listens (``"0.0.0.0"`` for every interface)."""
        return self._host, self.port

    def joined(self, timeout: float = LIST_TIMEOUT_S) -> bool:
        """Whether the member is in its leader's convention now (as its own admin knows).

        Args:
            timeout (float): seconds for the admin's answer.

        Returns:
            bool: ``True`` once the leader answered its registration (until the
            leader deregisters, or three registrations in a row fail);
            ``False`` before, or if the admin did not answer.
        """
        return self._membership(timeout) is True

    def _membership(self, timeout: float) -> bool | None:
        """`joined`, with None when the admin did not answer within ``timeout`` (busy)."""
        leader = TCPTransport.getAddressFromString(self.leader)
        with _Client(self._own_address()[0], self._key) as client:
            known = client.convention(self._own_address(), timeout)
        return None if known is None else any(address == leader for address, _ in known)

    def refused(self, timeout: float = LIST_TIMEOUT_S) -> bool:
        """Whether the leader refuses this member's frames: its ``MUJOU_SECRET`` is another.

        Args:
            timeout (float): seconds for the leader's answer.

        Returns:
            bool: ``True`` when the leader answered that this member's frame
            did not check; ``False`` when it answered, or did not (gone).
        """
        with _Client(self.leader[0], self._key) as client:
            return client.refuses(self.leader, timeout)

    def serve(self, stop: threading.Event, *, poll: float = 0.5,
              on_change: Callable[[bool], None] | None = None,
              on_refused: Callable[[], None] | None = None) -> None:
        """Serve until ``stop`` is set (a signal handler, another thread); then return.

        Checks every ``poll`` seconds that the admin still runs and, with
        ``on_change``, whether the member is in the convention. It does not
        close the member (`close` does).

        Args:
            stop (threading.Event): set to return.
            poll (float): seconds between two checks.
            on_change (Callable[[bool], None] | None): called with `joined`'s
                value when it changes (first when the member joins); what it
                raises propagates.
            on_refused (Callable[[], None] | None): called once, while the
                member has not joined, when the leader refuses its frames
                (`refused`: the machines' secrets differ); what it raises
                propagates.

        Raises:
            RuntimeError: the admin ended without being asked (killed).
        """
        was = False
        misses = 0  # answers in a row that the leader is not known
        polls = 0
        while not stop.wait(poll):
            if not self.running():
                raise RuntimeError(f"the actor system of {self._what} ended unasked "
                                   f"(its admin on port {self.port} is gone)")
            polls += 1
            if (on_refused is not None and not was and polls % REFUSED_EVERY == 1
                    and self.refused(min(poll, LIST_TIMEOUT_S))):
                on_refused()
                on_refused = None
            if on_change is None:
                continue
            now = self._membership(min(poll, LIST_TIMEOUT_S))
            if now is None:
                continue  # the admin is busy (a run's processes start): no news
            # Joining is news at once; a leader gone only once its absence lasts
            # (a registration in flight, a loaded leader, misses a round or two).
            misses = 0 if now else misses + 1
            if now != was and (now or misses >= GONE_AFTER):
                was = now
                on_change(now)


GONE_AFTER = 3
"""Checks in a row (`Member.serve`'s polls) without the leader before it is said to be gone."""

REFUSED_EVERY = 4
"""`Member.serve` asks whether the leader refuses its frames every this many polls."""


def leader_admin(listen: str = LOOPBACK, *, allow_remote: bool = False,
                 name: str | None = None) -> AdminSettings:
    """The settings that make a `~mujou_actors.distributed.system.ProcessSystem` a leader.

    ``ProcessSystem(admin=leader_admin("127.0.0.1:1900"))`` starts a run's
    control plane whose admin is the convention's leader on that address.

    Args:
        listen (str): ``"HOST"`` or ``"HOST:PORT"``: a loopback address
            (127.0.0.1 by default) unless ``allow_remote``; port 0 or none for
            a free one. Members join ``HOST:PORT`` (for ``0.0.0.0``: one of
            this machine's addresses).
        allow_remote (bool): allow a non-loopback ``listen`` (for a trusted
            network of your choice: frames are authenticated with ``MUJOU_SECRET``,
            not encrypted).
        name (str | None): a member name for the leader's own system too (an
            actor required on that member is then created on the leader).

    Returns:
        AdminSettings: port, address, capabilities and environment.

    Raises:
        ValueError: a bad address or name, a non-loopback ``listen`` without
            ``allow_remote``, or a port taken.
        SecretError: no usable ``MUJOU_SECRET`` (`convention_key`).
    """
    host_text, port = parse_address(listen, default_port=0, free=True)
    host = check_listen(host_text, allow_remote, "the convention's leader")
    port, listener = _claim_port(host, port, "the convention's leader")
    capabilities: dict[str, Any] = {CONVENTION_ADDRESS: ("" if host == ANY else host, port),
                                    "mujou.leader": True}
    if name is not None:
        check_name(name)
        capabilities[MEMBER] = name
    try:
        key = convention_key()
    except BaseException:
        if listener is not None:
            listener.close()
        raise
    return AdminSettings(port, host, capabilities, LEADER_ENVIRONMENT, key, listener)


class Leader(_System):
    """A convention's leader of its own: an admin and a logger, no coordinator.

    (A run's leader is its `~mujou_actors.distributed.system.ProcessSystem`,
    made with `leader_admin`; this one serves tests and tools.)

    Args:
        listen (str): see `leader_admin`.
        allow_remote (bool): see `leader_admin`.
        name (str | None): see `leader_admin`.
        start_timeout (float): seconds for the admin to answer.

    Raises:
        ValueError: see `leader_admin`.
        TimeoutError: the admin did not answer in time (all of it is ended first).
    """

    def __init__(self, listen: str = LOOPBACK, *, allow_remote: bool = False,
                 name: str | None = None, start_timeout: float = 30.0) -> None:
        settings = leader_admin(listen, allow_remote=allow_remote, name=name)
        capabilities = {"Admin Port": settings.port, "Process Startup Method": "spawn",
                        **settings.capabilities}
        super().__init__("the convention's leader", settings.host, settings.port,
                         capabilities, settings.environment, start_timeout, settings.listener)

    @property
    def address(self) -> tuple[str, int]:
        """tuple[str, int]: where members reach its admin from this machine."""
        return self._own_address()

    def members(self, timeout: float = LIST_TIMEOUT_S) -> dict[str, dict[str, Any]]:
        """`members` of this leader.

        Args:
            timeout (float): seconds for all the requests.

        Returns:
            dict[str, dict[str, Any]]: name -> capabilities.
        """
        return members(self.address, timeout)

    def wait_for_members(self, names: Iterable[str],
                         join_timeout: float = 30.0) -> dict[str, dict[str, Any]]:
        """`wait_for_members` of this leader.

        Args:
            names (Iterable[str]): the names wanted.
            join_timeout (float): seconds to wait.

        Returns:
            dict[str, dict[str, Any]]: every member known then.
        """
        return wait_for_members(self.address, names, join_timeout)
