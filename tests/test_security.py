"""Nobody gets in: the control plane's frames, the ports a run listens on, the decode sites.

What the probe of issue 27 did, as a test: code-carrying pickles, random bytes,
length bombs, half-open and slow clients against every port of a one-machine
placed run's control plane and of a convention's member; a wrong and a
missing secret; and a scan of the package for every place that unpickles.
(The live view's Origin and publishing: tests/test_foxglove.py; damaged and
hostile recordings: tests/test_recording_fuzz.py; the data plane's CURVE
links: tests/test_secure_dataplane.py.)
"""

from __future__ import annotations

import ast
import os
import pathlib
import pickle
import random
import socket
import struct
import sys
import time
from typing import Any

import pytest

from mujou_actors.distributed import _frames
from mujou_actors.distributed._loopback import transport_for
from mujou_actors.distributed.system import ProcessSystem
from tests.procs_support import ROOT
from tests.test_system import listening

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "mujou_actors"
TARGET = "tests.procs_support:make"
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads processes and sockets from /proc")


class Evil:
    """A pickle that makes a folder when it is unpickled: proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (os.mkdir, (self.marker,))


def thespian_frame(obj: Any) -> bytes:
    """A frame as stock Thespian sends it: ``<length>>`` and a pickle."""
    body = pickle.dumps(obj)
    return b"%d>" % len(body) + body


def framed(payload: bytes) -> bytes:
    """Thespian's length prefix before a payload."""
    return b"%d>" % len(payload) + payload


# ---------------------------------------------------------------------------- frames

def test_a_frame_round_trips_under_its_key_and_nothing_else_opens_it() -> None:
    auth = _frames.FrameAuth(b"k" * 32)
    other = _frames.FrameAuth(b"o" * 32)
    message = ("address", {"x": [1, 2.5, b"y"]})

    payload = auth.dumps(message)

    assert payload[:4] == b"mjc1" and len(payload) > _frames.HEADER_LEN
    assert auth.loads(payload) == message
    with pytest.raises(_frames.FrameRefused, match="does not hold the run's secret"):
        other.loads(auth.dumps(message))
    assert other.refused == 1


def test_a_changed_replayed_stale_or_stock_frame_is_refused_and_counted() -> None:
    auth = _frames.FrameAuth(b"k" * 32, max_skew=5.0)
    payload = auth.dumps(("a", 1))
    changed = payload[:-1] + bytes([payload[-1] ^ 1])
    fixed = struct.pack(">4s16sQQ", b"mjc1", os.urandom(16), time.time_ns() - 60 * 10**9, 5)
    import hashlib
    import hmac
    head = hmac.digest(b"k" * 32, fixed, hashlib.sha256)
    stale = fixed + head + hmac.digest(b"k" * 32, head + b"abcde", hashlib.sha256) + b"abcde"

    assert auth.loads(payload) == ("a", 1)
    refusals = []
    for bad in (payload, changed, stale, pickle.dumps(("a", 1)), b"", b"mjc1"):
        with pytest.raises(_frames.FrameRefused) as info:
            auth.loads(bad)
        refusals.append(str(info.value))

    assert "received before" in refusals[0]
    assert "body was changed" in refusals[1]
    assert "dated 60.0 s ago" in refusals[2] and "MUJOU_MAX_CLOCK_SKEW" in refusals[2]
    assert all("not a frame" in r for r in refusals[3:5])
    assert auth.refused == 6


def test_thespians_acknowledgements_are_matched_not_unpickled() -> None:
    auth = _frames.FrameAuth(b"k" * 32)

    assert auth.loads(pickle.dumps("ACK")) == "ACK"
    assert auth.loads(pickle.dumps("ACK+DATAERR", 2)) == "ACK+DATAERR"
    with pytest.raises(_frames.FrameRefused):
        auth.loads(pickle.dumps("NAK"))


def test_even_an_authenticated_frame_cannot_call_a_function(tmp_path: pathlib.Path) -> None:
    auth = _frames.FrameAuth(b"k" * 32)
    marker = tmp_path / "ran"

    for evil in (Evil(str(marker)), [1, Evil(str(marker))], {"k": Evil(str(marker))}):
        with pytest.raises(pickle.UnpicklingError, match="posix.mkdir is not admitted"):
            auth.loads(auth.dumps(evil))
    for module, name in (("builtins", "eval"), ("builtins", "getattr"), ("os", "system"),
                         ("mujou_actors.distributed.system", "os"),
                         ("mujou_actors.cli", "main"), ("subprocess", "Popen"),
                         ("thespian.system.utilis", "thesplog"),
                         ("mujou_actors.distributed.actors", "Call.__init__")):
        with pytest.raises(pickle.UnpicklingError):
            _frames.RestrictedUnpickler(pathlib.Path(os.devnull).open("rb")).find_class(
                module, name)

    assert not marker.exists()


def test_the_control_planes_own_messages_are_admitted() -> None:
    from datetime import timedelta

    from thespian.actors import ActorExitRequest

    from mujou_actors.distributed import actors

    auth = _frames.FrameAuth(b"k" * 32)
    messages = [actors.Call(3, "a", b"\x80\x04request"), actors.Failure.of(ValueError("bad")),
                ActorExitRequest(), timedelta(seconds=2), {1, 2}, ValueError("x")]

    decoded = [auth.loads(auth.dumps(m)) for m in messages]

    assert decoded[:2] == messages[:2]
    assert isinstance(decoded[2], ActorExitRequest)
    assert decoded[3:5] == messages[3:5] and decoded[5].args == ("x",)


def test_a_strangers_connection_costs_a_header_whatever_length_it_declares() -> None:
    auth = _frames.FrameAuth(b"k" * 32)
    bomb = _frames.AuthReceiveBuffer(auth)
    huge = _frames.AuthReceiveBuffer(auth)
    digits = _frames.AuthReceiveBuffer(auth)
    good = _frames.AuthReceiveBuffer(auth)
    payload = auth.dumps(("me", list(range(1000))))

    bomb.addMore(b"33554432>")
    asked = [bomb.remainingAmount()]
    bomb.addMore(b"mjc1" + os.urandom(96))  # a header, but not the run's
    huge.addMore(b"99999999999>")
    digits.addMore(b"1" * 40)
    good.addMore(framed(payload)[:200])
    asked.append(good.remainingAmount())
    good.addMore(framed(payload)[200:])

    assert asked[0] == _frames.UNTRUSTED_READ  # never asks for the declared 32 MiB first
    assert bomb.isDone() and bomb.completed() is None and not bomb.trusted
    assert huge.isDone() and huge.completed() is None  # past MAX_FRAME: refused at once
    assert digits.isDone() and digits.completed() is None
    assert good.trusted and asked[1] == len(payload) - 200 + len(b"%d>" % len(payload))
    assert good.completed() == (("me", list(range(1000))), b"")
    assert good.completed() == (("me", list(range(1000))), b"")  # asked twice: decoded once
    assert auth.refused == 3


def test_the_transport_class_carries_its_key_only_into_a_spawn_pipe() -> None:
    cls = transport_for("127.0.0.1", b"s" * 32)
    auth = _frames.FrameAuth(b"s" * 32)

    pickled = pickle.dumps(cls)  # as multiprocessing's spawn pipe carries it

    assert b"s" * 32 in pickled
    with pytest.raises(pickle.PicklingError, match="never travels in a frame"):
        auth.dumps(("sender", cls))


def test_every_function_of_thespians_transport_that_frames_reads_the_runs_frames() -> None:
    import thespian.system.transport.TCPTransport as tcp

    cls = transport_for("127.0.0.1", b"s" * 32)
    framing = {"serializer", "ReceiveBuffer", "TCPIncoming", "TCPIncomingPersistent", "pickle"}
    thespian_base = cls.__mro__[2]
    incoming = {c for c in [tcp.TCPIncoming_Common] if framing & set(c.__init__.__code__.co_names)}

    for name, value in vars(tcp.TCPTransport).items():
        fn = getattr(value, "__func__", value)
        if callable(fn) and hasattr(fn, "__code__") and framing & set(fn.__code__.co_names):
            mine = getattr(thespian_base.__dict__[name], "__func__", thespian_base.__dict__[name])
            assert mine.__globals__["serializer"] is cls.auth, name
    namespace = thespian_base.__dict__["_acceptNewIncoming"].__globals__
    assert incoming and namespace["TCPIncoming"].__init__.__globals__ is not vars(tcp)
    assert tcp.serializer is pickle  # Thespian's own module is left as it is


# ----------------------------------------------------------------- a placed run's ports

def _rss_kb(pid: int) -> int:
    """A process's resident memory (kB), 0 if gone."""
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _attack(port: int, marker: pathlib.Path, rng: random.Random) -> list[socket.socket]:
    """What the probe sent to one port; returns the connections it leaves open (slow clients)."""
    wrong = _frames.FrameAuth(b"w" * 32)
    frames = [thespian_frame(("x", Evil(str(marker)))),               # stock Thespian
              framed(wrong.dumps(("x", Evil(str(marker))))),          # another secret
              framed(b"mjc1" + os.urandom(200)),                      # a forged header
              rng.randbytes(4096),                                    # random bytes
              b"34359738368>" + rng.randbytes(1 << 16),               # 32 GiB declared
              b"33554432>mjc1" + rng.randbytes(1 << 20)]              # 32 MiB declared
    for frame in frames:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            try:
                s.sendall(frame)
                s.settimeout(5)
                s.recv(64)  # the peer answers or closes; it never waits for more
            except OSError:
                pass  # closed while we sent: as refused
    slow = []
    for i in range(40):  # half-open and slow clients
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"1234"[: i % 4])
        slow.append(s)
    return slow


def _readable(files: list[Any], timeout: float) -> list[Any]:
    """Those of ``files`` readable within ``timeout`` s (``selectors``: any fd number;
    ``select`` refuses fds past 1023, which a long test session reaches)."""
    import selectors

    with selectors.DefaultSelector() as sel:
        for f in files:
            sel.register(f, selectors.EVENT_READ)
        return [key.fileobj for key, _ in sel.select(max(timeout, 0.0))]


def _server_end(client: socket.socket, roles: dict[int, str]) -> dict[str, Any]:
    """Where ``client``'s connection ends on the server's side (/proc): for a failure's message.

    Names the process listening on the port (``roles``: pid -> name), the
    state of the server's socket (01: established), the bytes waiting in it,
    and whether a process holds it (``accepted``; 0 as inode: still in the
    listening socket's queue).
    """
    port, mine = client.getpeername()[1], client.getsockname()[1]
    owners = {pid: _links(pid) for pid in roles}
    end: dict[str, Any] = {"port": port, "listener": [
        name for pid, name in roles.items() if ("127.0.0.1", port) in listening([pid])]}
    for line in pathlib.Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and int(fields[2].split(":")[1], 16) == mine:
            inode = fields[9]
            end.update(state=fields[3], rx_queue=int(fields[4].split(":")[1], 16), inode=inode,
                       accepted=[roles[pid] for pid, links in owners.items()
                                 if f"socket:[{inode}]" in links])
    return end


def _links(pid: int) -> list[str]:
    """What the open file descriptors of ``pid`` name ([] once it is gone)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []  # gone
    links = []
    for fd in fds:
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass  # closed meanwhile
    return links


def _closed_by_peers(slow: list[socket.socket], timeout: float,
                     meanwhile: Any) -> list[socket.socket]:
    """Those of ``slow`` their peers left open for ``timeout`` s; ``meanwhile()`` between looks.

    (The host's own socket is served only while the host runs Thespian's
    loop, in a request: ``meanwhile`` makes one.)
    """
    open_ = set(slow)
    deadline = time.monotonic() + timeout
    while open_ and time.monotonic() < deadline:
        readable = _readable(list(open_), 0.5)
        for s in readable:
            try:
                data = s.recv(64)
            except OSError:
                data = b""
            if not data:
                open_.discard(s)
        meanwhile()
    return list(open_)


@pytest.mark.timeout(30)
def test_a_stranger_is_closed_when_thespians_timer_says_its_time_is_up() -> None:
    """An untrusted connection is closed as soon as Thespian's own timer reads as run out.

    Thespian reads a connection's timer as a ``timedelta`` (whole microseconds):
    with less than half a microsecond left it takes no more wake-up time from
    that connection, so a silent one closed only by another clock's reading
    could stay open, unread, until something else woke the process.
    """
    from datetime import timedelta

    from thespian.system.timing import currentTime
    from thespian.system.transport import TCPTransport as _tcp

    from mujou_actors.distributed._loopback import _incoming_class, _RunTransport

    auth = _frames.FrameAuth(_frames.new_key())
    incoming = _incoming_class(_tcp.TCPIncoming, {**vars(_tcp), "serializer": auth})
    refused: list[str] = []

    class Thespians:  # what Thespian does with a connection still in its time: keeps it
        def _handlePossibleIncoming(self, inc: Any, fileno: int) -> Any:  # noqa: N802
            return inc

    class Transport(_RunTransport, Thespians):
        def __init__(self) -> None:  # no sockets: only the two methods are called
            self.auth = type("Auth", (), {"refuse": staticmethod(refused.append)})()

    transport = Transport()
    ours, theirs = socket.socketpair()
    with theirs:
        inc = incoming(None, ours, _frames.AuthReceiveBuffer(auth))
        assert inc.trusted is False and inc.delay()  # just opened: ten seconds to go
        kept = transport._handlePossibleIncoming(inc, -1)
        assert kept is inc and inc.socket is ours and refused == []

        inc._expires._time_to_quit = currentTime() + 2e-7  # Thespian reads that as none left
        assert not inc._expires.view().remaining()
        # Thespian's loop leaves a zero delay out of its wait: the stranger's never is, so
        # the loop wakes for it once more (it ran out between two readings: kept for good).
        assert inc.delay() == timedelta(microseconds=1)
        closed = transport._handlePossibleIncoming(inc, -1)
        theirs.settimeout(5)
        assert closed is None and inc.socket is None and theirs.recv(1) == b""
        assert refused == ["no valid frame within 10 s"]

    trusted = incoming(None, socket.socket(), _frames.AuthReceiveBuffer(auth))
    trusted.trusted = True  # a frame's header passed: Thespian's own delays from then on
    trusted._expires._time_to_quit = currentTime() - 1.0
    assert trusted.delay() == timedelta(0)
    trusted.socket.close()


@pytest.mark.slow
@linux_only
@pytest.mark.timeout(180)
def test_no_port_of_a_placed_run_decodes_a_strangers_pickle_or_falls_over(
        tmp_path: pathlib.Path) -> None:
    rng = random.Random(27)
    marker = tmp_path / "code-ran"
    host_sockets = set(listening([os.getpid()]))
    with ProcessSystem() as system:
        system.start_groups({"a": (TARGET, {"name": "a"}), "b": (TARGET, {"name": "b"})},
                            60, sys_path=[ROOT])
        before = system.ask("a", ("echo", [1, 2]), 20), system.ask("b", ("echo", "x"), 20)
        run = system.run_pids()
        host_ports = {p for _, p in set(listening([os.getpid()])) - host_sockets}
        ports = sorted({p for _, p in listening(run)} | host_ports)
        rss = {pid: _rss_kb(pid) for pid in run}

        assert len(ports) == 6  # admin, logger, coordinator, two groups, the host's own
        assert all(addr == "127.0.0.1" for addr, _ in listening(run))
        slow = [s for port in ports for s in _attack(port, marker, rng)]
        after = system.ask("a", ("echo", [1, 2]), 20), system.ask("b", ("echo", "x"), 20)
        left = _closed_by_peers(slow, 40.0,  # UNTRUSTED_PERIOD: 10 s
                                lambda: system.ask("a", ("echo", 0), 20))
        # Which process kept a stranger, and the server's end of it (the host's
        # port is served in requests).
        roles = {os.getpid(): "host", system._admin_pid: "admin",
                 system._coordinator.pid: "coordinator",
                 system.pid("a"): "group a", system.pid("b"): "group b"}
        kept = [_server_end(s, {pid: roles.get(pid, "logger") for pid in [*run, os.getpid()]})
                for s in left]
        for s in slow:
            s.close()
        final = system.ask("a", ("pid", None), 20) == system.pid("a")
        grown = {pid: _rss_kb(pid) - rss[pid] for pid in run if _rss_kb(pid)}

    assert not marker.exists()
    assert before == after == (("a", [1, 2]), ("b", "x")) and final
    assert len(slow) == 40 * 6
    assert kept == [], "\n".join(map(str, kept))
    assert max(grown.values()) < 16 * 1024, grown  # kB: flat, whatever was declared


# --------------------------------------------------------------------- a convention

def _worker(leader: tuple[str, int], name: str, secret: str) -> Any:
    """A ``mujou worker`` process joining ``leader`` with ``secret``, in a session of its own."""
    import subprocess

    return subprocess.Popen(
        [sys.executable, "-m", "mujou_actors", "worker", "--join", f"{leader[0]}:{leader[1]}",
         "--name", name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": ROOT, "MUJOU_SECRET": secret},
        start_new_session=True)


def _worker_pids(worker: Any) -> list[int]:
    """The processes of a ``mujou worker``: itself, its admin and its admin's group (/proc)."""
    import re

    from mujou_actors.distributed._loopback import stat_fields
    from tests.test_system import listeners

    said = _line(worker.stdout, "listening on", 60)
    port = int(re.search(r"listening on \S+:(\d+)", said)[1])  # type: ignore[index]
    (admin,) = listeners(port)
    group = stat_fields(admin)[2]  # type: ignore[index]
    found = [int(p) for p in os.listdir("/proc")
             if p.isdigit() and (stat_fields(int(p)) or ["", "", ""])[2] == group]
    return [worker.pid, *found]


def _line(stream: Any, want: str, timeout: float) -> str:
    """The first line of a child's pipe that holds ``want`` (within ``timeout`` s), or ''."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = _readable([stream], deadline - time.monotonic())
        line = stream.readline() if ready else ""
        if want in line:
            return str(line)
        if ready and not line:
            return ""  # closed
    return ""


@pytest.mark.slow
@linux_only
@pytest.mark.timeout(240)
def test_mujou_worker_refuses_strangers_and_a_machine_with_another_secret_is_told(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    from mujou_actors.distributed.convention import REGISTER_PERIOD, Leader, Member
    from mujou_actors.errors import JoinTimeoutError, SecretError

    marker = tmp_path / "code-ran"
    rng = random.Random(28)
    secret = os.environ["MUJOU_SECRET"]
    with Leader() as leader:
        robot = _worker(leader.address, "robot", secret)
        intruder = _worker(leader.address, "intruder", "another secret, thirty-two bytes!!")
        try:
            known = leader.wait_for_members(["robot"], join_timeout=90)
            told = _line(intruder.stderr, "refuses this machine's frames", 60)
            with pytest.raises(JoinTimeoutError, match="intruder") as late:
                leader.wait_for_members(["intruder"], join_timeout=2 * REGISTER_PERIOD)
            run = _worker_pids(robot) + leader.pids()
            sockets = listening(run)
            slow = [s for port in sorted({p for _, p in sockets})
                    for s in _attack(port, marker, rng)]
            for s in slow:
                s.close()
            again = leader.wait_for_members(["robot"], join_timeout=30)
            alive = robot.poll() is None
        finally:
            for proc in (robot, intruder):
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
        with monkeypatch.context() as env:
            env.delenv("MUJOU_SECRET", raising=False)
            with pytest.raises(SecretError, match="MUJOU_SECRET"):
                Member("nobody", leader.address)

    assert sorted(known) == ["robot"] and sorted(again) == ["robot"] and alive
    assert "MUJOU_SECRET is not this machine's" in told
    assert "MUJOU_SECRET" in "".join(late.value.__notes__)
    assert len(sockets) >= 4 and all(addr == "127.0.0.1" for addr, _ in sockets), sockets
    assert not marker.exists()


# ------------------------------------------------------------------ the decode sites

# Every place in the package that decodes bytes into objects that may run code,
# with what authenticated those bytes. A new one fails this test until it is
# listed here with its reason (and docs/security.md says the same).
DECODE_SITES = {
    ("distributed/_frames.py", "FrameAuth.loads", "RestrictedUnpickler"):
        "after both HMACs of the run's key, the time and the nonce are checked; "
        "admits Thespian's and the package's classes only",
    ("distributed/system.py", "ProcessSystem.ask", "pickle.loads"):
        "a group's answer, inside a control-plane frame whose HMAC was checked",
    ("distributed/_starts.py", "remote_error", "pickle.loads"):
        "a group's exception, inside a control-plane frame whose HMAC was checked",
    ("distributed/actors.py", "GroupActor._call", "pickle.loads"):
        "the host's request, inside a control-plane frame whose HMAC was checked",
    ("distributed/actors.py", "GroupActor._build", "pickle.loads"):
        "the host's keyword arguments of the group's target, inside a control-plane frame "
        "whose HMAC was checked",
}
_DECODERS = {"pickle.loads", "pickle.load", "pickle.Unpickler", "RestrictedUnpickler",
             "torch.load", "marshal.loads", "marshal.load", "eval", "exec", "yaml.load",
             "shelve.open", "dill.loads", "cloudpickle.loads", "jsonpickle.decode"}


def _call_name(node: ast.AST) -> str:
    """``a.b.c`` of a call's function, or its plain name."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_call_name(node.value)}.{node.attr}"
    return "?"


def _decode_sites() -> set[tuple[str, str, str]]:
    """(file, Class.function, decoder) of every call to a decoder in the package."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        scopes: list[tuple[ast.AST, str]] = [(tree, "")]
        while scopes:
            node, where = scopes.pop()
            for child in ast.iter_child_nodes(node):
                name = where
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{where}.{child.name}" if where else child.name
                if isinstance(child, ast.Call) and _call_name(child.func) in _DECODERS:
                    found.add((str(path.relative_to(PACKAGE)), name, _call_name(child.func)))
                if isinstance(child, ast.ClassDef) and any(
                        _call_name(b).endswith("Unpickler") for b in child.bases):
                    found.add((str(path.relative_to(PACKAGE)), name, "Unpickler subclass"))
                scopes.append((child, name))
    return found


@pytest.mark.slow
def test_every_decode_of_code_bearing_data_is_listed_with_its_authentication() -> None:
    found = _decode_sites()
    found.discard(("distributed/_frames.py", "RestrictedUnpickler", "Unpickler subclass"))

    assert found == set(DECODE_SITES), "a decode site changed: list it with its authentication"


# ------------------------------------------------------------------------ the live view

@pytest.mark.slow
@linux_only
@pytest.mark.timeout(180)
def test_the_live_view_survives_the_probe_and_a_web_page_cannot_write_to_the_net(
        tmp_path: pathlib.Path) -> None:
    import websockets.sync.client as ws_client

    import mujou_actors as mujou
    from tests.test_foxglove import Echo

    marker = tmp_path / "code-ran"
    rng = random.Random(29)
    echo = Echo()
    run = mujou.run({"echo": echo}, timer="simulated")
    server = mujou.serve_foxglove(run, 0)
    try:
        sockets = listening([os.getpid()])
        rss = _rss_kb(os.getpid())
        slow = _attack(server.port, marker, rng)
        refused = []
        for origin in ("https://evil.example", "null", "http://127.0.0.1:8000"):
            try:
                ws_client.connect(f"ws://127.0.0.1:{server.port}", origin=origin,
                                  subprotocols=["foxglove.websocket.v1"], open_timeout=10)
            except websockets_error() as exc:
                refused.append(getattr(getattr(exc, "response", None), "status_code", None))
        with ws_client.connect(f"ws://127.0.0.1:{server.port}", open_timeout=10,
                               subprotocols=["foxglove.websocket.v1"]) as native:
            native.send('{"op": "advertise", "channels": [{"id": 1, "topic": "echo.cmd", '
                        '"encoding": "json", "schemaName": "float"}]}')
            native.send(b"\x01" + struct.pack("<I", 1) + b"5.0")
            native.send(rng.randbytes(2048))
        run.write("echo.cmd", 1.5)
        deadline = time.monotonic() + 20
        while run.read("echo.out") is None and time.monotonic() < deadline:
            time.sleep(0.01)
        closed = sum(1 for s in slow if _peer_closed(s, 20.0))
        for s in slow:
            s.close()
        stats = server.stats()
        grown = _rss_kb(os.getpid()) - rss
    finally:
        server.close()
        run.stop()
        run.join(timeout=20)

    assert not marker.exists()
    assert refused == [403, 403, 403]
    assert echo.got == [1.5] and run.read("echo.out") == 3.0  # nothing a client sent arrived
    assert stats.handshakes_refused >= 3
    assert closed == len(slow) == 40
    assert grown < 64 * 1024, grown  # kB
    assert all(addr == "127.0.0.1" for addr, port in sockets if port == server.port)


def websockets_error() -> tuple[type[BaseException], ...]:
    """What a refused WebSocket handshake raises."""
    import websockets.exceptions as wse

    return (wse.InvalidStatus, wse.InvalidHandshake, OSError)


def _peer_closed(s: socket.socket, timeout: float) -> bool:
    """Whether the peer closes ``s`` within ``timeout`` seconds (reading what it sends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            if s.recv(4096) == b"":
                return True
        except TimeoutError:
            return False
        except OSError:
            return True
    return False
