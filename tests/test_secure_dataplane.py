"""The data plane between machines: links over TCP, authenticated with the shared secret.

Both ends run in this process (a host's and a group's link, or two groups'
peer link, over TCP loopback stand in for two machines: CURVE and its
handshake are the same). Every wait
is bounded; a refused handshake is seen on its monitor events, not guessed
from a silence.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import zmq

from mujou_actors.distributed import dataplane, secret
from mujou_actors.errors import HandshakeError, SecretError

A = b"the secret of run A, 32 bytes.."
B = b"the secret of run B, 32 bytes.."
BOUND = 5.0  # seconds: the bound on a handshake's outcome (a healthy one takes a millisecond)
ROUTES: Any = SimpleNamespace(declared=[object, torch.Tensor])  # what a link needs of Routes


def _zap_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "mujou-zap"]


@pytest.fixture
def links() -> Iterator[list[Any]]:
    """Links made by a test, closed at its end whatever happens (no socket, no thread left)."""
    made: list[Any] = []
    yield made
    for link in reversed(made):
        link.close()
    assert _zap_threads() == []


def _host(made: list[Any], key: bytes | None) -> dataplane.HostLink:
    made.append(dataplane.HostLink("tcp://127.0.0.1:0", ROUTES, secret=key))
    return made[-1]  # type: ignore[no-any-return]


def _group(made: list[Any], host: dataplane.HostLink, key: bytes | None) -> dataplane.GroupLink:
    made.append(dataplane.GroupLink(host.endpoint, ROUTES, secret=key))
    return made[-1]  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------
# Carrying grants and replies


@pytest.mark.timeout(30)
def test_the_same_secret_carries_a_grant_and_a_reply_with_tensors_bit_for_bit(links: list[Any]
                                                                              ) -> None:
    host = _host(links, A)
    group = _group(links, host, A)
    big = torch.randn(1 << 18)  # 1 MiB: a frame of its own, a view of its memory
    small = torch.arange(16, dtype=torch.int64)

    host.handshake(BOUND)
    group.handshake(BOUND)
    host.send(dataplane.Grant((5, 1), False, [(5, 0, 2, 1, big), (5, 0, 2, 0, {"n": 3})]))
    grant = group.receive(BOUND)
    assert grant is not None
    group.send(dataplane.Reply((7, 0), 5, [(6, 0, 1, 1, grant.messages[0][4] * 2),
                                           (6, 0, 1, 0, (small, "x"))]))
    reply = host.receive(BOUND)

    assert host.endpoint.startswith("tcp://127.0.0.1:") and not host.endpoint.endswith(":0")
    assert grant.bound == (5, 1) and grant.messages[1] == (5, 0, 2, 0, {"n": 3})
    assert torch.equal(grant.messages[0][4], big)
    assert reply is not None and reply.due == (7, 0) and reply.time_ns == 5
    assert torch.equal(reply.sends[0][4], big * 2)
    assert torch.equal(reply.sends[1][4][0], small) and reply.sends[1][4][1] == "x"
    assert host.encoder.pool_name is None and group.encoder.pool_name is None  # no shm


@pytest.mark.timeout(30)
def test_plain_tcp_on_loopback_carries_a_grant(links: list[Any]) -> None:
    host = _host(links, None)
    group = _group(links, host, None)

    host.handshake(BOUND)  # nothing to wait for without a secret
    host.send(dataplane.Grant(None, True, [(1, 0, 0, 0, b"bytes")]))
    grant = group.receive(BOUND)

    assert grant is not None and grant.take and grant.messages == [(1, 0, 0, 0, b"bytes")]


@pytest.mark.timeout(30)
def test_a_send_to_a_gone_peer_asks_blocked_until_it_gives_up(links: list[Any]) -> None:
    """A PAIR send with no peer connected cannot go: it waits in slices, asking the link's
    ``blocked`` between them (the driver looks for the group's death there), and gives
    up when ``blocked`` raises; a peer that connects meanwhile gets the message."""
    host = _host(links, None)
    group = _group(links, host, None)
    host.send(dataplane.Grant(None, True, [(1, 0, 0, 0, "first")]))
    assert group.receive(BOUND) is not None
    links.remove(group)
    group.close()  # the peer is gone: its connection went with it
    asked: list[float] = []

    def blocked() -> None:
        asked.append(time.monotonic())
        if len(asked) == 3:
            raise RuntimeError("the group is dead")

    host.blocked = blocked
    deadline = time.monotonic() + BOUND
    while host.sock.poll(0, zmq.POLLOUT) and time.monotonic() < deadline:
        time.sleep(0.01)  # until the host's socket has seen the disconnection
    with pytest.raises(RuntimeError, match="dead"):
        host.send(dataplane.Grant(None, True, [(2, 0, 0, 0, "lost")]))
    assert len(asked) == 3
    assert asked[2] - asked[0] >= 2 * dataplane.SEND_SLICE_S * 0.9  # in slices, not a spin

    again = _group(links, host, None)  # a peer that comes back gets what is sent then
    asked.clear()
    host.blocked = lambda: asked.append(time.monotonic())
    host.send(dataplane.Grant(None, True, [(3, 0, 0, 0, "back")]))
    got = again.receive(BOUND)
    assert got is not None and got.messages == [(3, 0, 0, 0, "back")]


# ---------------------------------------------------------------------------
# Refusals


def _refusals(link: dataplane.HostLink, n: int) -> None:
    """Take the host's handshakes until ``n`` connections were refused (bounded: BOUND).

    Waits on the handshake monitor's own socket (readable once an event is
    queued), not on a sleep: each refusal is an event the server has seen.
    """
    deadline = time.monotonic() + BOUND
    while link.refused < n:
        left = deadline - time.monotonic()
        assert left > 0, f"{link.refused} of {n} refusals seen within {BOUND} s"
        events = link._watch.events  # type: ignore[union-attr]
        assert events is not None, "the handshake succeeded: nothing was refused"
        events.poll(max(1, int(left * 1000)))
        link.check_handshake()


def _stranger(made: list[Any], address: str, key: bytes | None) -> zmq.Socket[Any]:
    """A bare zmq PAIR client that never retries: plain ZMTP (None), or CURVE with the
    keys of ``key`` (another secret's: both keys other)."""
    sock: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.PAIR)
    sock.reconnect_ivl = -1  # one connection, one handshake: counts are exact
    if key is not None:
        sock.curve_serverkey = secret.derive_keypair(key, secret.SERVER_LABEL)[0]
        sock.curve_publickey, sock.curve_secretkey = secret.derive_keypair(
            key, secret.CLIENT_LABEL)
    sock.connect(address)
    made.append(SimpleNamespace(close=lambda: sock.close(linger=0)))
    return sock


NO_CURVE = "the peer does not use CURVE (it is not a mujou socket with a secret)"
DIFFER = "its handshake does not decrypt: the secrets differ"


@pytest.mark.timeout(30)
def test_a_listener_refuses_strangers_and_waits_on_for_the_peer_holding_the_secret(
        links: list[Any], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain ZMTP client and one with another secret reach the host's port first: each
    is refused, counted and logged, and the group holding the secret gets in after them."""
    monkeypatch.setattr(secret, "REFUSAL_LOG_S", 3600.0)  # one line, then folded
    caplog.set_level("WARNING", logger="mujou_actors")
    host = _host(links, A)
    _stranger(links, host.endpoint, None)
    _refusals(host, 1)
    _stranger(links, host.endpoint, B)
    _refusals(host, 2)

    group = _group(links, host, A)
    host.handshake(BOUND)
    group.handshake(BOUND)
    host.send(dataplane.Grant(None, True, [(1, 0, 0, 0, "for the group")]))
    grant = group.receive(BOUND)

    assert grant is not None and grant.messages == [(1, 0, 0, 0, "for the group")]
    assert host.refused == 2 and group.refused == 0
    assert host._watch is not None and host._watch.refusals == {NO_CURVE: 1, DIFFER: 1}
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"listening on {host.endpoint}: refused a connection that failed the handshake "
        f"({NO_CURVE})",
        f"listening on {host.endpoint}: the peer holding the secret is in, after refusing 2 "
        f"connections (1: {NO_CURVE}; 1: {DIFFER})"]
    assert host.check_handshake() is True  # a success stays one


@pytest.mark.timeout(30)
def test_a_listener_that_only_refused_raises_after_its_timeout_naming_the_refusals(
        links: list[Any], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secret, "REFUSAL_LOG_S", 3600.0)
    caplog.set_level("WARNING", logger="mujou_actors")
    host = _host(links, A)
    _stranger(links, host.endpoint, None)
    _stranger(links, host.endpoint, B)
    _refusals(host, 2)

    started = time.monotonic()
    with pytest.raises(HandshakeError) as alone:
        host.handshake(0.2)
    took = time.monotonic() - started
    address = host.endpoint
    links.remove(host)
    host.close()

    assert took >= 0.19  # not at the first refusal: at the end of the wait (ms polls)
    assert alone.value.server and alone.value.address == address
    assert alone.value.reason.startswith(
        "no CURVE handshake within 0.2 s (no peer holding the secret connected, refusing 2 "
        "connections (1: ")
    assert NO_CURVE in alone.value.reason and DIFFER in alone.value.reason
    assert "group" not in str(alone.value)  # nobody's fault but the strangers'
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "refused a connection that failed the handshake" in lines[0]
    assert lines[1].startswith(f"listening on {address}: closed after refusing 2 ")


@pytest.mark.timeout(30)
def test_refusals_are_logged_at_most_once_per_interval_and_folded_into_the_next_line(
        links: list[Any], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level("WARNING", logger="mujou_actors")
    monkeypatch.setattr(secret, "REFUSAL_LOG_S", 3600.0)
    host = _host(links, A)
    for n in range(1, 6):
        _stranger(links, host.endpoint, None)
        _refusals(host, n)
    monkeypatch.setattr(secret, "REFUSAL_LOG_S", 0.0)  # the interval has passed
    assert host._watch is not None
    host._watch._next_log = 0.0
    _stranger(links, host.endpoint, B)
    _refusals(host, 6)

    lines = [r.getMessage() for r in caplog.records]
    assert host.refused == 6 and len(lines) == 2
    assert lines[1] == (f"listening on {host.endpoint}: refused a connection that failed the "
                        f"handshake ({DIFFER}); 4 more since the last such line (6 in all)")


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("host_key", "group_key"), [(A, B), (B, A)])
def test_another_secret_fails_the_group_at_once_and_is_a_refusal_at_the_host(
        links: list[Any], host_key: bytes, group_key: bytes) -> None:
    host = _host(links, host_key)
    group = _group(links, host, group_key)
    group.send(dataplane.Reply(None, 0, [(1, 0, 0, 0, "leaked?")]))  # queued on the group

    started = time.monotonic()
    with pytest.raises(HandshakeError) as at_group:
        group.handshake(BOUND)
    took = time.monotonic() - started
    _refusals(host, 1)
    with pytest.raises(HandshakeError, match="refusing [0-9]+ connections? .*the secrets "
                                             "differ") as at_host:
        host.handshake(0.05)

    assert took < BOUND
    assert at_host.value.server and not at_group.value.server
    assert "the secrets differ" in str(at_group.value)
    for err in (at_host.value, at_group.value):
        assert err.address == host.endpoint and host.endpoint in str(err)
    # The server never let the client in: nothing it sent can have arrived.
    assert host.receive(0.0) is None


@pytest.mark.timeout(30)
def test_check_handshake_never_waits_and_counts_what_the_server_refused(
        links: list[Any]) -> None:
    """The host's take while a group starts: each call takes the events so far."""
    host = _host(links, A)
    assert host.check_handshake() is False  # nobody connected yet: nothing to say
    _stranger(links, host.endpoint, B)
    deadline = time.monotonic() + BOUND
    while host.refused == 0 and time.monotonic() < deadline:
        started = time.monotonic()
        assert host.check_handshake() is False  # a refusal is no error
        assert time.monotonic() - started < 0.5  # it never waits
        host._watch.events.poll(100)  # type: ignore[union-attr]  # until an event waits
    assert host.refused == 1
    _group(links, host, A)
    host.handshake(BOUND)
    assert host.check_handshake() is True  # a success stays one
    plain = _host(links, None)
    assert plain.check_handshake() is True and plain.refused == 0  # nothing to check


@pytest.mark.timeout(30)
def test_a_client_without_curve_is_refused(links: list[Any]) -> None:
    host = _host(links, A)
    group = _group(links, host, None)  # plain TCP, on loopback: the group accepts to try
    group.send(dataplane.Reply(None, 0, [(1, 0, 0, 0, "leaked?")]))

    _refusals(host, 1)
    with pytest.raises(HandshakeError, match="does not use CURVE") as refused:
        host.handshake(0.05)

    assert refused.value.address == host.endpoint
    assert host.receive(0.0) is None


@pytest.mark.timeout(30)
def test_a_curve_client_of_a_plain_server_is_refused(links: list[Any]) -> None:
    host = _host(links, None)
    group = _group(links, host, A)

    with pytest.raises(HandshakeError, match="does not use CURVE"):
        group.handshake(BOUND)


@pytest.mark.timeout(30)
def test_a_client_with_the_servers_key_but_another_client_key_is_refused_by_zap(
        links: list[Any]) -> None:
    # Only someone who learnt the server's public key gets this far; ZAP still says no.
    host = _host(links, A)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.PAIR)
    sock.curve_serverkey = secret.derive_keypair(A, secret.SERVER_LABEL)[0]
    sock.curve_publickey, sock.curve_secretkey = secret.derive_keypair(B, secret.CLIENT_LABEL)
    watch = secret.Handshake(sock, server=False)
    sock.connect(host.endpoint)
    try:
        with pytest.raises(HandshakeError, match="refused this client's key"):
            watch.wait(BOUND)
        _refusals(host, 1)
        with pytest.raises(HandshakeError, match="ZAP status 400"):
            host.handshake(0.05)
        assert watch.refused == 1
    finally:
        watch.close()
        sock.close(linger=0)


def test_a_groups_own_refusal_crosses_to_the_host_naming_the_group_and_its_machine() -> None:
    """The group's HandshakeError (its server refused it) pickles, and the host's start
    names the group and its machine; a refusal at the host's end blames no group."""
    import pickle

    from mujou_actors.distributed import placed
    from mujou_actors.errors import RemoteError

    own = HandshakeError("tcp://10.0.0.1:5000", "the server closed the connection during the "
                         "handshake: the secrets differ", server=False)
    crossed = pickle.loads(pickle.dumps(own))
    remote = RemoteError("group 'physics': start: ...", group="physics",
                         type_name="mujou_actors.errors.HandshakeError", remote_traceback="",
                         exception=crossed)

    named = placed._refused_member(remote, {"physics": "robot"})

    assert isinstance(named, HandshakeError) and not named.server
    assert named.address == own.address
    assert named.reason == (f"{own.reason} (group 'physics' on machine 'robot', which must "
                            "hold the host's MUJOU_SECRET)")
    assert placed._refused_member(remote, {}) is None  # not a member's
    assert placed._refused_member(TimeoutError("x"), {"physics": "robot"}) is None


@pytest.mark.timeout(30)
def test_no_peer_within_the_bound_is_an_error_naming_the_address(links: list[Any]) -> None:
    host = _host(links, A)

    with pytest.raises(HandshakeError, match="no client connected") as alone:
        host.handshake(0.05)

    assert alone.value.address == host.endpoint


def test_tcp_takes_no_shared_memory_and_off_loopback_a_secret() -> None:
    with pytest.raises(ValueError, match="no shared memory over tcp"):
        dataplane.HostLink("tcp://127.0.0.1:0", ROUTES, "mujou-test-")
    with pytest.raises(ValueError, match="needs the run's secret"):
        dataplane.HostLink("tcp://0.0.0.0:0", ROUTES)
    with pytest.raises(ValueError, match="needs the run's secret"):
        dataplane.GroupLink("tcp://192.0.2.1:5555", ROUTES)
    assert _zap_threads() == []


# ---------------------------------------------------------------------------
# Peer links between machines: the same CURVE, group to group


def _peer(made: list[Any], address: str, key: bytes | None, *,
          server: bool) -> dataplane.PeerLink:
    made.append(dataplane.PeerLink(address, ROUTES.declared, server=server, mine=None,
                                   theirs=None, secret=key))
    return made[-1]  # type: ignore[no-any-return]


def _frame(link: dataplane.PeerLink) -> Any:
    """The next frame on a peer link, waited for on its socket (bounded: BOUND)."""
    assert link.sock.poll(int(BOUND * 1000)), f"no frame within {BOUND} s"
    return link.receive()


@pytest.mark.timeout(30)
def test_a_peer_link_between_machines_carries_items_promises_and_markers_bit_for_bit(
        links: list[Any]) -> None:
    listening = _peer(links, "tcp://127.0.0.1:0", A, server=True)
    connecting = _peer(links, listening.endpoint, A, server=False)
    big = torch.randn(1 << 18)  # 1 MiB: inline, a frame that views its memory
    listening.handshake(BOUND)
    connecting.handshake(BOUND)

    connecting.send(dataplane.PEER_ITEMS, 3, 7, (5, 2), [(5, 1, 2, 1, big),
                                                        (5, 1, 2, 0, {"n": 3})])
    got = _frame(listening)
    listening.send(dataplane.PEER_MARKER, 3, 7, (6, 0), [])
    marker = _frame(connecting)

    kind, generation, segment, promise, items = got
    assert (kind, generation, segment, promise) == (dataplane.PEER_ITEMS, 3, 7, (5, 2))
    assert torch.equal(items[0][4], big) and items[1] == (5, 1, 2, 0, {"n": 3})
    assert items[0][4].data_ptr() != big.data_ptr()  # the reader's own tensor
    assert marker == (dataplane.PEER_MARKER, 3, 7, (6, 0), [])
    for link in (listening, connecting):  # encrypted and authenticated, no shared memory
        assert link.sock.getsockopt(zmq.MECHANISM) == zmq.CURVE
        assert link.encoder.pool_name is None and link.refused == 0
    assert listening.sock.curve_server and not connecting.sock.curve_server
    assert listening.bytes_in == connecting.bytes_out > big.numel() * 4


@pytest.mark.timeout(30)
def test_a_peer_links_listener_refuses_another_secret_and_plain_zmtp_and_delivers_nothing(
        links: list[Any]) -> None:
    """What reaches a group's listening end without the run's secret is refused, counted
    and never decoded: a peer link with another secret (its own end fails at once, naming
    the secrets), a plain ZMTP client that sends a frame; the peer holding it gets in after,
    and its frame is the first one delivered."""
    listening = _peer(links, "tcp://127.0.0.1:0", A, server=True)
    other = _peer(links, listening.endpoint, B, server=False)
    with pytest.raises(HandshakeError, match="secrets differ") as refused:
        other.handshake(BOUND)
    assert not refused.value.server and refused.value.address == listening.endpoint
    _refusals(listening, 1)  # type: ignore[arg-type]
    links.remove(other)
    other.close()  # (it would try again, and be refused again)
    plain = _stranger(links, listening.endpoint, None)
    plain.send_multipart([b"\x00", b"not a frame of the run"], zmq.NOBLOCK)
    _refusals(listening, 2)  # type: ignore[arg-type]
    assert listening.receive() is None

    peer = _peer(links, listening.endpoint, A, server=False)
    peer.handshake(BOUND)
    listening.handshake(BOUND)
    peer.send(dataplane.PEER_ITEMS, 1, 1, (0, 0), [(0, 0, 0, 0, "from the peer")])
    got = _frame(listening)

    assert got == (dataplane.PEER_ITEMS, 1, 1, (0, 0), [(0, 0, 0, 0, "from the peer")])
    assert listening.refused == 2 and listening.messages_in == 1
    assert listening._watch is not None and listening._watch.refusals == {DIFFER: 1,
                                                                          NO_CURVE: 1}


@pytest.mark.timeout(30)
def test_a_peer_link_over_tcp_takes_no_shared_memory_and_off_loopback_a_secret() -> None:
    with pytest.raises(ValueError, match="no shared memory over tcp://"):
        dataplane.PeerLink("tcp://127.0.0.1:0", [int], server=True, mine="mujou-x-p1.0",
                           theirs=None, secret=A)
    with pytest.raises(ValueError, match="not a loopback address"):
        dataplane.PeerLink("tcp://10.1.2.3:0", [int], server=True, mine=None, theirs=None)


# ---------------------------------------------------------------------------
# The secret and its keys


def test_keys_are_deterministic_and_distinct_per_label_and_secret() -> None:
    server = secret.derive_keypair(A, secret.SERVER_LABEL)
    client = secret.derive_keypair(A, secret.CLIENT_LABEL)

    assert server == secret.derive_keypair(A, secret.SERVER_LABEL)
    assert len({server, client, secret.derive_keypair(B, secret.SERVER_LABEL)}) == 3
    assert zmq.curve_public(server[1]) == server[0] and len(server[0]) == 40
    with pytest.raises(ValueError, match="label"):
        secret.derive_keypair(A, "a label too long")


def _file(tmp_path: Path, content: bytes, mode: int) -> Path:
    path = tmp_path / "secret"
    path.write_bytes(content)
    path.chmod(mode)
    return path


def test_load_secret_reads_the_variable_or_the_file_without_surrounding_whitespace(
        tmp_path: Path) -> None:
    path = _file(tmp_path, A + b"\n", 0o600)

    assert secret.load_secret(environ={"MUJOU_SECRET": f" {A.decode()}\n"}) == A
    assert secret.load_secret(environ={"MUJOU_SECRET_FILE": str(path)}) == A
    assert secret.load_secret(path, environ={"MUJOU_SECRET": B.decode()}) == A
    assert secret.load_secret(environ={}, required=False) is None


def test_load_secret_without_one_says_how_to_set_one() -> None:
    with pytest.raises(SecretError, match="MUJOU_SECRET.*MUJOU_SECRET_FILE"):
        secret.load_secret(environ={})


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620])
def test_load_secret_refuses_a_file_its_group_or_others_may_open(tmp_path: Path,
                                                                 mode: int) -> None:
    path = _file(tmp_path, A, mode)

    with pytest.raises(SecretError, match=rf"{mode:04o}.*chmod 600") as refused:
        secret.load_secret(environ={"MUJOU_SECRET_FILE": str(path)})

    assert str(path) in str(refused.value) and "MUJOU_SECRET_FILE" in str(refused.value)
    assert stat.S_IMODE(path.stat().st_mode) == mode  # not "fixed" behind the user's back


def test_load_secret_refuses_a_short_secret_naming_where_it_came_from(tmp_path: Path) -> None:
    path = _file(tmp_path, b"short\n", 0o600)

    with pytest.raises(SecretError, match=r"MUJOU_SECRET is 5 bytes long: at least 16"):
        secret.load_secret(environ={"MUJOU_SECRET": "short"})
    with pytest.raises(SecretError, match=rf"{path}.* 5 bytes long"):
        secret.load_secret(path)


def test_load_secret_refuses_a_missing_file_a_folder_and_both_variables(tmp_path: Path) -> None:
    with pytest.raises(SecretError, match="does not exist"):
        secret.load_secret(environ={"MUJOU_SECRET_FILE": str(tmp_path / "nothing")})
    with pytest.raises(SecretError, match="not a regular file"):
        secret.load_secret(tmp_path)
    with pytest.raises(SecretError, match="set only one"):
        secret.load_secret(environ={"MUJOU_SECRET": A.decode(), "MUJOU_SECRET_FILE": "x"})
