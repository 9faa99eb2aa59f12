"""The live Foxglove view, driven by a real WebSocket client (Foxglove's protocol).

The net runs on the simulated timer with no periodic node: it idles until the
client's publish writes to an Input, so every message the test waits for is
caused by the test. Waits are bounded (the client's ``recv`` timeouts, `_until`).
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

import mujou_actors as mujou

websockets_sync = pytest.importorskip("websockets.sync.client")

pytestmark = pytest.mark.timeout(60)

SUBPROTOCOLS = ["foxglove.sdk.v1", "foxglove.websocket.v1"]


class Echo(mujou.Node):
    """Doubles what it is given; scales a 2-vector by its gain."""

    cmd = mujou.Input(float, trigger=True, depth=None)
    out = mujou.Output(float)
    gain = mujou.Input(torch.Tensor, shape=(2,), dtype=torch.float32, trigger=True,
                       depth=None)
    scaled = mujou.Output(torch.Tensor, shape=(2,), dtype=torch.float32)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.got: list[Any] = []

    def on_update(self, dt: float) -> None:
        for value in self.cmd.drain():
            self.got.append(value)
            self.out.send(value * 2)
        for g in self.gain.drain():
            self.got.append(g)
            self.scaled.send(g * 3)


def _until(condition: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


class Client:
    """A Foxglove WebSocket client: the JSON ops and binary frames of the protocol."""

    def __init__(self, port: int, **connect: Any) -> None:
        self.ws = websockets_sync.connect(f"ws://127.0.0.1:{port}", subprotocols=SUBPROTOCOLS,
                                          open_timeout=10, **connect).__enter__()
        self.channels: dict[str, dict[str, Any]] = {}
        self.info: dict[str, Any] = {}
        self.statuses: list[str] = []
        self.data: list[tuple[int, int, Any]] = []  # (subscription id, timestamp, JSON)
        self.times: list[int] = []
        self.graph_updates: list[dict[str, Any]] = []

    def recv(self) -> None:
        frame = self.ws.recv(timeout=10)
        if isinstance(frame, str):
            op = json.loads(frame)
            if op["op"] == "serverInfo":
                self.info = op
            elif op["op"] == "advertise":
                self.channels.update({c["topic"]: c for c in op["channels"]})
            elif op["op"] == "connectionGraphUpdate":
                self.graph_updates.append(op)
            elif op["op"] == "status":
                self.statuses.append(op["message"])
        elif frame[0] == 0x01:  # message data: sub id u32, timestamp u64, payload
            sub, ts = struct.unpack_from("<IQ", frame, 1)
            self.data.append((sub, ts, json.loads(frame[13:])))
        elif frame[0] == 0x02:  # time: u64
            self.times.append(struct.unpack_from("<Q", frame, 1)[0])

    def recv_until(self, condition: Callable[[], Any], what: str) -> Any:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            self.recv()
        raise AssertionError(f"timed out waiting for {what}: {self.data}")

    def send(self, op: dict[str, Any]) -> None:
        self.ws.send(json.dumps(op))

    def publish(self, channel_id: int, value: Any) -> None:
        self.ws.send(b"\x01" + struct.pack("<I", channel_id) + json.dumps(value).encode())

    def of(self, sub: int) -> list[Any]:
        return [payload for s, _, payload in self.data if s == sub]

    def unsubscribe_and_close(self, sub: int) -> None:
        """Unsubscribe from a busy channel, read what the server queued before, close.

        A client that stops reading while messages come leaves the server's close frame
        behind them, unread, and its close waits out its 10 s close timeout. The server
        handles a client's requests in order and queues its messages in order: once the
        graph (subscribed after the unsubscribe) is in, what came before it is read.
        """
        self.send({"op": "unsubscribe", "subscriptionIds": [sub]})
        self.send({"op": "subscribe", "subscriptions": [
            {"id": 999_999, "channelId": self.channels["/mujou/graph"]["id"]}]})
        self.recv_until(lambda: self.of(999_999), "the graph after the unsubscribe")
        self.ws.close()


@pytest.fixture
def served() -> Any:
    echo = Echo()
    run = mujou.run({"echo": echo}, timer="simulated")
    server = mujou.serve_foxglove(run, 0, allow_publish=True)
    try:
        yield run, server, echo
    finally:
        server.close()
        run.stop()
        run.join(timeout=20)


def test_a_client_sees_every_port_subscribes_receives_and_publishes(served: Any) -> None:
    run, server, echo = served
    client = Client(server.port)

    client.recv_until(lambda: {"echo.cmd", "echo.out", "echo.gain", "echo.scaled",
                               "/mujou/graph"} <= set(client.channels), "every port advertised")
    assert {"clientPublish", "time", "connectionGraph"} <= set(client.info["capabilities"])
    assert server.watched() == []  # nobody watches: no subscription on any port
    out = client.channels["echo.out"]
    assert (out["encoding"], out["schemaEncoding"], out["metadata"]["kind"]) == (
        "json", "jsonschema", "output")
    client.send({"op": "subscribe", "subscriptions": [{"id": 7, "channelId": out["id"]}]})
    _until(lambda: server.watched() == ["echo.out"], "the subscription to echo.out")
    client.send({"op": "advertise", "channels": [
        {"id": 3, "topic": "echo.cmd", "encoding": "json", "schemaName": "cmd"}]})
    client.publish(3, {"value": 4.5})
    client.publish(3, 1)

    client.recv_until(lambda: len(client.of(7)) == 2, "two messages of echo.out")
    assert client.of(7) == [{"value": 9.0}, {"value": 2.0}]
    assert echo.got == [4.5, 1.0]
    assert run.read("echo.out") == 2.0
    assert server.published == 2
    client.send({"op": "unsubscribe", "subscriptionIds": [7]})
    _until(lambda: server.watched() == [], "the subscription's end")
    client.ws.close()


def test_the_graph_channel_and_the_connection_graph_describe_the_net(served: Any) -> None:
    run, server, _ = served
    client = Client(server.port)
    client.recv_until(lambda: "/mujou/graph" in client.channels, "the graph's channel")

    client.send({"op": "subscribe", "subscriptions": [
        {"id": 1, "channelId": client.channels["/mujou/graph"]["id"]}]})
    client.send({"op": "subscribeConnectionGraph"})
    client.recv_until(lambda: client.of(1) and client.graph_updates, "the graphs")

    graph = client.of(1)[0]
    (node,) = graph["nodes"]
    assert node["path"] == "echo" and node["class"].endswith(":Echo")
    gain = next(p for p in node["ports"] if p["name"] == "gain")
    assert gain == {"name": "gain", "path": "echo.gain", "kind": "input",
                    "type": "torch:Tensor", "shape": [2], "dtype": "float32"}
    update = client.graph_updates[0]
    assert {"name": "echo.out", "publisherIds": ["echo"]} in update["publishedTopics"]
    client.ws.close()


def test_the_run_time_is_broadcast(served: Any) -> None:
    run, server, _ = served
    client = Client(server.port)

    client.recv_until(lambda: client.times, "a time broadcast")

    assert client.times[0] == run.time_ns == 0  # the simulated timer waits for a write
    client.ws.close()


def test_a_message_an_input_refuses_is_a_warning_naming_it_and_the_run_goes_on(
        served: Any, caplog: pytest.LogCaptureFixture) -> None:
    run, server, echo = served
    client = Client(server.port)
    client.recv_until(lambda: "echo.scaled" in client.channels, "the advertise")
    client.send({"op": "subscribe", "subscriptions": [
        {"id": 2, "channelId": client.channels["echo.scaled"]["id"]}]})
    _until(lambda: server.watched() == ["echo.scaled"], "the subscription")
    client.send({"op": "advertise", "channels": [
        {"id": 5, "topic": "echo.gain", "encoding": "json", "schemaName": "gain"}]})

    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        client.publish(5, [1.0, 2.0, 3.0])  # the wrong shape
        client.ws.send(b"\x01" + struct.pack("<I", 5) + b"{not json")
        client.publish(5, {"data": [1.0, 2.0]})
        client.recv_until(lambda: client.of(2), "echo.scaled")

    assert client.of(2) == [{"shape": [2], "dtype": "float32", "data": [3.0, 6.0]}]
    assert server.refused == 2 and server.published == 1 and run.running
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 2 and all("echo.gain" in text for text in refusals)
    assert "shape" in refusals[0]
    client.ws.close()


def test_the_server_stops_with_the_run_and_leaves_no_thread_nor_port() -> None:
    run = mujou.run({"echo": Echo()}, timer="simulated")
    server = mujou.serve_foxglove(run, 0)
    port = server.port

    run.stop()
    run.join(timeout=20)

    _until(lambda: server.closed, "the server's end")
    _until(lambda: not any(t.name == "mujou-foxglove" for t in threading.enumerate()),
           "the mujou-foxglove thread's end")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    server.close()  # idempotent


def test_a_host_off_loopback_needs_allow_remote_and_what_is_no_run_is_refused() -> None:
    run = mujou.run({"echo": Echo()}, timer="simulated")
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(RuntimeError, match="cannot listen on 127.0.0.1"):
            mujou.serve_foxglove(run, taken.getsockname()[1])
        with pytest.raises(ValueError, match="allow_remote"):
            mujou.serve_foxglove(run, "0.0.0.0:0")
        with pytest.raises(ValueError, match="no port"):
            mujou.serve_foxglove(run, "localhost:http")
        with pytest.raises(TypeError, match=r"what mujou.run returned \(a Run\), got object"):
            mujou.serve_foxglove(object(), 0)  # type: ignore[arg-type]
    finally:
        taken.close()
        run.stop()
        run.join(timeout=20)
    with pytest.raises(mujou.NotRunningError):
        mujou.serve_foxglove(run, 0)


@pytest.mark.slow
def test_each_message_is_stamped_with_its_sends_time() -> None:
    from tests.conftest import Source

    run = mujou.run({"src": Source(period=0.01)}, timer="simulated")  # runs ahead freely
    server = mujou.serve_foxglove(run, 0)
    try:
        client = Client(server.port)
        client.recv_until(lambda: "src.out" in client.channels, "the advertise")
        client.send({"op": "subscribe", "subscriptions": [
            {"id": 4, "channelId": client.channels["src.out"]["id"]}]})
        client.recv_until(lambda: len(client.of(4)) >= 5, "five messages")
        client.unsubscribe_and_close(4)
    finally:
        server.close()
        run.stop()
        run.join(timeout=20)

    # Source sends its n-th count at n * 10 ms of the run's timer: the message's
    # timestamp is that, not the time the host thread passed it on.
    stamped = [(t, payload["value"]) for s, t, payload in client.data if s == 4]
    assert len(stamped) >= 5
    assert all(t == n * 10_000_000 for t, n in stamped), stamped[:5]


# -- how a port is watched: Run.watch, taken by mujou-foxglove-take ------------------------


def test_a_watched_port_has_a_watch_not_a_subscription_and_wakes_no_host_thread(
        served: Any) -> None:
    run, server, echo = served
    client = Client(server.port)
    client.recv_until(lambda: "echo.out" in client.channels, "the advertise")
    client.send({"op": "subscribe", "subscriptions": [
        {"id": 7, "channelId": client.channels["echo.out"]["id"]}]})
    _until(lambda: server.watched() == ["echo.out"], "the watch of echo.out")

    for value in (1.0, 2.0, 3.0):
        run.write("echo.cmd", value)
    client.recv_until(lambda: len(client.of(7)) == 3, "three messages of echo.out")

    assert client.of(7) == [{"value": 2.0}, {"value": 4.0}, {"value": 6.0}]
    watched = run.stats().subscriptions["echo.out"]
    assert (watched.subscriptions, watched.watches) == (0, 1)
    assert (watched.watch_taken, watched.watch_dropped) == (3, 0)
    # No mujou-host thread was ever started: nothing but the watch serves the view.
    assert run._host.thread is None
    client.unsubscribe_and_close(7)
    _until(lambda: server.watched() == [], "the watch's end")
    assert run.stats().subscriptions["echo.out"].watches == 1  # the count stays


class _Stuck:
    """A port's projection whose first view waits for ``go``: the view behind, on purpose."""

    def __init__(self, projection: Any) -> None:
        self.projection = projection
        self.entered = threading.Event()
        self.go = threading.Event()

    def encode(self, message: Any, t_ns: int) -> bytes:
        if not self.entered.is_set():
            self.entered.set()
            assert self.go.wait(30), "the test never let the view go on"
        return self.projection.encode(message, t_ns)


def test_a_view_that_falls_behind_loses_the_oldest_counted_and_the_net_does_not_wait(
        served: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from mujou_actors.recording import liveview

    run, server, echo = served
    monkeypatch.setattr(liveview, "WATCH_DEPTH", 4)  # read when the watch is made
    stuck = _Stuck(server._projections["echo.out"])
    server._projections["echo.out"] = stuck
    client = Client(server.port)
    client.recv_until(lambda: "echo.out" in client.channels, "the advertise")
    client.send({"op": "subscribe", "subscriptions": [
        {"id": 1, "channelId": client.channels["echo.out"]["id"]}]})
    _until(lambda: server.watched() == ["echo.out"], "the watch of echo.out")

    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        try:
            run.write("echo.cmd", 0.0)
            assert stuck.entered.wait(10), "the first message's view was never begun"
            # The taker waits inside the first view; the net goes on: 100 more sends,
            # of which the watch keeps the newest 4.
            for value in range(1, 101):
                run.write("echo.cmd", float(value))
            _until(lambda: len(echo.got) == 101, "the net's 101 updates, the view stuck")
            assert run.stats().subscriptions["echo.out"].watch_dropped == 100 - 4
        finally:
            stuck.go.set()
        client.recv_until(lambda: len(client.of(1)) == 5, "the first and the newest four")

    assert client.of(1) == [{"value": 2.0 * v} for v in (0, 97, 98, 99, 100)]
    watched = run.stats().subscriptions["echo.out"]
    assert (watched.watch_taken, watched.watch_dropped) == (5, 96)
    assert server.stats().dropped == 0  # the client kept up: the view was behind
    lines = [r.getMessage() for r in caplog.records if "falls behind" in r.getMessage()]
    assert len(lines) == 1 and "echo.out" in lines[0] and "watch_dropped" in lines[0]
    client.unsubscribe_and_close(1)


def test_a_client_that_reads_nothing_loses_messages_counted_and_the_net_does_not_wait(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from mujou_actors.recording import wsserver

    run, server, echo = served
    client = Client(server.port)
    client.recv_until(lambda: "echo.out" in client.channels, "the advertise")
    client.send({"op": "subscribe", "subscriptions": [
        {"id": 1, "channelId": client.channels["echo.out"]["id"]}]})
    _until(lambda: server.watched() == ["echo.out"], "the watch of echo.out")
    # The client's writer now finds its socket full for good: nothing more is written to
    # it, and its queue keeps the newest 8 of what comes (the time broadcasts included).
    monkeypatch.setattr(wsserver, "WRITE_LIMIT", -1)
    monkeypatch.setattr(wsserver, "BACKLOG", 8)
    t0 = time.monotonic()

    for value in range(200):
        run.write("echo.cmd", float(value))
    _until(lambda: len(echo.got) == 200, "the net's 200 updates")
    _until(lambda: run.stats().subscriptions["echo.out"].watch_taken == 200,
           "the view's take of the 200 messages")

    _until(lambda: server.stats().dropped >= 200 - 8, "the client's drops")
    stats = server.stats()
    broadcasts = (time.monotonic() - t0) / wsserver.TIME_EVERY + 2  # the run's time
    assert run.stats().subscriptions["echo.out"].watch_dropped == 0  # the view kept up
    assert stats.dropped <= 200 + broadcasts  # nothing counted twice
    client.ws.close()
    _until(lambda: server.stats().clients == 0, "the client's end")
    assert server.stats().dropped >= 200 - 8  # counted after its end too


def test_close_ends_the_taking_thread_at_once_watched_or_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mujou_actors.recording import liveview

    monkeypatch.setattr(liveview, "IDLE_S", 3600.0)  # only a wakeup ends its sleep
    monkeypatch.setattr(liveview, "FLUSH_S", 3600.0)
    run = mujou.run({"echo": Echo()}, timer="simulated")
    try:
        idle = mujou.serve_foxglove(run, 0)
        assert idle._taker.name == "mujou-foxglove-take" and idle._taker.is_alive()
        t0 = time.monotonic()
        idle.close()
        idle_s = time.monotonic() - t0
        assert not idle._taker.is_alive()

        watching = mujou.serve_foxglove(run, 0)
        client = Client(watching.port)
        client.recv_until(lambda: "echo.out" in client.channels, "the advertise")
        client.send({"op": "subscribe", "subscriptions": [
            {"id": 1, "channelId": client.channels["echo.out"]["id"]}]})
        _until(lambda: watching.watched() == ["echo.out"], "the watch of echo.out")
        t0 = time.monotonic()
        watching.close()
        watching_s = time.monotonic() - t0
        assert not watching._taker.is_alive()
        assert run.stats().subscriptions["echo.out"].watches == 1
        client.ws.close()
    finally:
        run.stop()
        run.join(timeout=20)

    # close() joins the thread for 3 s at most (wsserver.JOIN): woken, it ends well before.
    assert idle_s < 2.5 and watching_s < 2.5, (idle_s, watching_s)


def test_a_cuda_ports_views_are_made_from_its_host_copy_at_the_take() -> None:
    """A CUDA node's Output read on its GPU: the watch queues the device message, and the
    take (copy=False) brings it to the CPU once its GPU work is done (the fake runtime
    raises on a read before then)."""
    from tests import fake_cuda
    from tests.test_devices import GPU0, Reader, Sender, _on

    rt, _, start = fake_cuda.fakes()
    sender, reader = _on(Sender(rt), GPU0), _on(Reader(rt), GPU0)  # the device path
    mujou.connect(sender.out, reader.inp)
    run = start({"s": sender, "r": reader}, timer="simulated", duration=None)
    try:
        with mujou.serve_foxglove(run, 0) as server:
            client = Client(server.port)
            client.recv_until(lambda: "s.out" in client.channels, "the advertise")
            client.send({"op": "subscribe", "subscriptions": [
                {"id": 1, "channelId": client.channels["s.out"]["id"]}]})
            client.recv_until(lambda: len(client.of(1)) >= 3, "three views of s.out")
            client.unsubscribe_and_close(1)
    finally:
        run.stop()
    run.join(timeout=20)

    assert all(view == {"shape": [3], "dtype": "float32", "data": [0.0, 1.0, 2.0]}
               for view in client.of(1)), client.of(1)[:3]
    assert any(e[0] == "to_host" and e[2] == "default@cuda:0" for e in rt.log)


# -- who may connect, and what a client may do -------------------------------------------


def _refusal(port: int, **connect: Any) -> int:
    """The HTTP status of a refused handshake."""
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as refused:
        Client(port, **connect)
    return refused.value.response.status_code


def _foxglove_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("foxglove:")]


def test_a_web_page_of_another_origin_is_refused_with_403_and_writes_nothing(
        served: Any, caplog: pytest.LogCaptureFixture) -> None:
    run, server, echo = served  # publishing on: only the Origin keeps the page out

    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        statuses = [_refusal(server.port, origin="https://evil.example") for _ in range(3)]
        second = [_refusal(server.port, additional_headers=[
            ("Origin", "https://app.foxglove.dev"), ("Origin", "https://evil.example")])]

    assert statuses + second == [403, 403, 403, 403]
    stats = server.stats()
    assert (stats.handshakes_refused, stats.clients, stats.published) == (4, 0, 0)
    assert echo.got == [] and run.running
    lines = _foxglove_lines(caplog)  # one line, however many came within REFUSAL_LOG_EVERY
    assert len(lines) == 1 and "'https://evil.example' is not allowed" in lines[0]


def test_native_clients_foxglove_and_local_files_connect_and_other_origins_when_named() -> None:
    run = mujou.run({"echo": Echo()}, timer="simulated")
    try:
        with mujou.serve_foxglove(run, 0) as server:
            allowed = {}
            for origin in [None, "https://app.foxglove.dev", "file://"]:
                client = Client(server.port, origin=origin)
                client.recv_until(lambda c=client: c.info, "the server info")
                allowed[origin] = client.info["capabilities"]
                client.ws.close()
            refused = [_refusal(server.port, origin=o)
                       for o in ["null", "http://localhost:8080", "https://app.foxglove.dev.evil.example"]]
        with mujou.serve_foxglove(run, 0, origins=["null", "http://LOCALHOST:8080/"]) as server:
            for origin in ["null", "http://localhost:8080"]:
                Client(server.port, origin=origin).ws.close()
            assert _refusal(server.port, origin="http://localhost:8081") == 403
    finally:
        run.stop()
        run.join(timeout=20)

    assert list(allowed.values()) == [["connectionGraph", "time"]] * 3  # no clientPublish
    assert refused == [403, 403, 403]


def test_publishing_is_refused_unless_allowed() -> None:
    echo = Echo()
    run = mujou.run({"echo": echo}, timer="simulated")
    try:
        with mujou.serve_foxglove(run, 0) as server:
            client = Client(server.port)
            client.recv_until(lambda: "echo.out" in client.channels, "the advertise")
            client.send({"op": "advertise", "channels": [
                {"id": 3, "topic": "echo.cmd", "encoding": "json", "schemaName": "cmd"}]})
            client.publish(3, {"value": 4.5})
            client.recv_until(lambda: len(client.statuses) == 2, "two refusals")
            stats = server.stats()
            client.ws.close()
    finally:
        run.stop()
        run.join(timeout=20)

    assert "clientPublish" not in client.info["capabilities"]
    assert all("publishing to Inputs is off" in text for text in client.statuses)
    assert (stats.advertisements_refused, stats.publishes_dropped, stats.published) == (1, 1, 0)
    assert stats.client_channels == 0
    assert echo.got == [] and run.read("echo.out") is None


def test_ten_thousand_bogus_advertisements_keep_a_bounded_state_and_log(
        served: Any, caplog: pytest.LogCaptureFixture) -> None:
    from mujou_actors.recording import wsserver

    run, server, echo = served
    client = Client(server.port)
    client.recv_until(lambda: "/mujou/graph" in client.channels, "the advertise")

    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        for first in range(0, 10_000, 100):  # half of them on an Input, half on no port
            client.send({"op": "advertise", "channels": [
                {"id": i, "topic": "echo.cmd" if i % 2 == 0 else f"bogus/{i}",
                 "encoding": "json", "schemaName": "x"} for i in range(first, first + 100)]})
        client.publish(126, {"value": 1.5})  # the 64th channel on echo.cmd: kept
        client.publish(128, {"value": 2.5})  # the 65th: refused, so dropped
        # The requests are handled in order: once the graph comes, all the above were.
        client.send({"op": "subscribe", "subscriptions": [
            {"id": 1, "channelId": client.channels["/mujou/graph"]["id"]}]})
        client.recv_until(lambda: client.of(1), "the graph")
        during = server.stats()
        lines_during = len(_foxglove_lines(caplog))
        client.ws.close()
        _until(lambda: server.stats().clients == 0, "the client's end")
        after = server.stats()

    assert during.client_channels == wsserver.MAX_CLIENT_CHANNELS == 64
    assert during.advertisements_refused == 10_000 - 64
    assert (during.published, during.publishes_dropped) == (1, 1)
    assert lines_during == wsserver.WARNINGS_PER_CLIENT
    lines = _foxglove_lines(caplog)
    assert len(lines) == wsserver.WARNINGS_PER_CLIENT + 1  # and one line at the client's end
    assert lines[-1].endswith(f"{100 + 1 - wsserver.WARNINGS_PER_CLIENT} more warnings not logged")
    assert (after.clients, after.client_channels) == (0, 0)
    _until(lambda: echo.got == [1.5], "the one kept channel's message")


def test_a_clients_end_cancels_its_subscriptions() -> None:
    run = mujou.run({"echo": Echo()}, timer="simulated")
    try:
        with mujou.serve_foxglove(run, 0) as server:
            client = Client(server.port)
            client.recv_until(lambda: "echo.out" in client.channels, "the advertise")
            client.send({"op": "subscribe", "subscriptions": [
                {"id": 1, "channelId": client.channels["echo.out"]["id"]}]})
            _until(lambda: server.watched() == ["echo.out"], "the subscription")

            client.ws.close()

            _until(lambda: server.watched() == [] and server.stats().clients == 0,
                   "the subscription's end")
    finally:
        run.stop()
        run.join(timeout=20)


def test_clients_beyond_max_clients_get_503(monkeypatch: pytest.MonkeyPatch) -> None:
    from mujou_actors.recording import wsserver

    monkeypatch.setattr(wsserver, "MAX_CLIENTS", 1)
    run = mujou.run({"echo": Echo()}, timer="simulated")
    try:
        with mujou.serve_foxglove(run, 0) as server:
            first = Client(server.port)
            first.recv_until(lambda: first.info, "the server info")
            status = _refusal(server.port)
            stats = server.stats()
            first.ws.close()
    finally:
        run.stop()
        run.join(timeout=20)

    assert status == 503
    assert (stats.clients, stats.handshakes_refused) == (1, 1)


def test_the_server_binds_loopback_unless_allow_remote() -> None:
    run = mujou.run({"echo": Echo()}, timer="simulated")
    try:
        with mujou.serve_foxglove(run, 0) as server:
            default = server.address
        with mujou.serve_foxglove(run, "localhost:0") as server:
            named = server.address
        with mujou.serve_foxglove(run, "0.0.0.0:0", allow_remote=True) as server:
            everywhere = server.address
    finally:
        run.stop()
        run.join(timeout=20)

    assert default[0] == "127.0.0.1" and default[1] > 0
    assert named[0] == "127.0.0.1"
    assert everywhere[0] == "0.0.0.0"


@pytest.mark.parametrize(("kwargs", "error", "text"), [
    ({"origins": "https://app.example"}, TypeError, "list of origins"),
    ({"origins": ["app.example"]}, ValueError, "is no origin"),
    ({"origins": ["https://app.example/page"]}, ValueError, "is no origin"),
    ({"origins": [None]}, TypeError, "must hold str"),
    ({"allow_publish": 1}, TypeError, "allow_publish must be a bool"),
])
def test_bad_settings_are_refused_naming_them(kwargs: dict[str, Any], error: type,
                                               text: str) -> None:
    run = mujou.run({"echo": Echo()}, timer="simulated")
    try:
        with pytest.raises(error, match=text):
            mujou.serve_foxglove(run, 0, **kwargs)
    finally:
        run.stop()
        run.join(timeout=20)


def test_a_clients_queue_keeps_the_newest_within_its_backlog_and_bytes() -> None:
    import asyncio

    from mujou_actors.recording import wsserver

    loop = asyncio.new_event_loop()  # not running: a wake-up waits in its queue
    try:
        client = wsserver.Client(1, None, None, loop)
        for i in range(wsserver.BACKLOG + 6):
            client.push(b"h", str(i).encode())
        kept = client.take()
        big = b"x" * (wsserver.BACKLOG_BYTES * 5 // 16)  # three fit, not four
        for _ in range(4):
            client.push(b"h", big)
        kept_big = client.take()
    finally:
        loop.close()

    assert client.dropped == 6 + 1
    assert len(kept) == wsserver.BACKLOG and kept[0] == (b"h", b"6")
    assert len(kept_big) == 3


# -- a placed run, served from its host ----------------------------------------------------


@pytest.fixture
def placed_served() -> Any:
    """make_echo placed: echo in group "a" (its server in this process, the data plane
    over ZeroMQ), count in the host's group; served with publishing on."""
    from tests.placed_support import make_echo
    from tests.test_placed import placed_run

    run = placed_run({"echo": "a"}, None, factory=make_echo)
    try:
        server = mujou.serve_foxglove(run, 0, allow_publish=True)
    except BaseException:
        run.stop()
        raise
    try:
        yield run, server
    finally:
        server.close()
        run.stop()
        run.join(timeout=20)


def test_a_placed_run_is_served_from_its_host_and_a_publish_reaches_another_group(
        placed_served: Any, caplog: pytest.LogCaptureFixture) -> None:
    run, server = placed_served
    assert run.groups == {"a": ["echo"], "host": ["count"]}
    client = Client(server.port)
    client.recv_until(lambda: {"echo.inp", "echo.out", "count.inp"} <= set(client.channels),
                      "every group's ports advertised")
    client.send({"op": "subscribe", "subscriptions": [
        {"id": 1, "channelId": client.channels["echo.out"]["id"]},    # an Output of group a
        {"id": 2, "channelId": client.channels["count.inp"]["id"]}]})  # the host's, fed by a
    _until(lambda: server.watched() == ["echo.out", "count.inp"], "both subscriptions")
    client.send({"op": "advertise", "channels": [
        {"id": 3, "topic": "echo.inp", "encoding": "json", "schemaName": "inp"}]})

    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        for value in (1, {"value": 2}, 3, "four", 5):  # "four": no int, refused
            client.publish(3, value)
        client.recv_until(lambda: len(client.of(1)) == 4 and len(client.of(2)) == 4,
                          "four doubled values on each channel")

    doubled = [{"value": v} for v in (2, 4, 6, 10)]
    assert client.of(1) == doubled and client.of(2) == doubled
    # the simulated timer waits for the host's writes: every send at time 0
    assert {t for _, t, _ in client.data} == {0} and run.time_ns == 0
    stats = server.stats()
    assert (stats.published, stats.refused, stats.dropped) == (4, 1, 0)
    for path in ("echo.out", "count.inp"):  # watched through the driver, not subscribed
        watched = run.stats().subscriptions[path]
        assert (watched.subscriptions, watched.watches, watched.watch_taken) == (0, 1, 4)
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and "echo.inp" in refusals[0]
    tree = run.state_dict(timeout=20)
    assert tree["nodes"]["echo"]["n"] == 4  # in group a: what the client published
    assert tree["nodes"]["count"]["got"] == [2, 4, 6, 10]
    client.ws.close()
    _until(lambda: server.watched() == [], "the subscriptions' end")


def test_a_placed_runs_graph_is_the_whole_net(placed_served: Any) -> None:
    run, server = placed_served
    client = Client(server.port)
    client.recv_until(lambda: "/mujou/graph" in client.channels, "the graph's channel")

    client.send({"op": "subscribe", "subscriptions": [
        {"id": 1, "channelId": client.channels["/mujou/graph"]["id"]}]})
    client.send({"op": "subscribeConnectionGraph"})
    client.recv_until(lambda: client.of(1) and client.graph_updates, "the graphs")

    graph = client.of(1)[0]
    assert [n["path"] for n in graph["nodes"]] == ["echo", "count"]
    assert graph["connections"] == [["echo.out", "count.inp"]]
    update = client.graph_updates[0]
    assert {"name": "echo.out", "publisherIds": ["echo"]} in update["publishedTopics"]
    assert {"name": "echo.out", "subscriberIds": ["count"]} in update["subscribedTopics"]
    client.ws.close()


def test_a_placed_ports_messages_carry_their_values_and_their_sends_time() -> None:
    from tests.test_placed import placed_run

    run = placed_run({"sim": "a", "ctrl": "b"}, None)  # sim runs ahead freely, in group a
    try:
        with mujou.serve_foxglove(run, 0) as server:
            client = Client(server.port)
            client.recv_until(lambda: "sim.out" in client.channels, "the advertise")
            client.send({"op": "subscribe", "subscriptions": [
                {"id": 4, "channelId": client.channels["sim.out"]["id"]}]})
            client.recv_until(lambda: len(client.of(4)) >= 5, "five messages")
            client.unsubscribe_and_close(4)
    finally:
        run.stop()
    run.join(timeout=20)

    # sim sends its k-th position (k from 1) at k * 10 ms; log, in the host's group,
    # keeps every one: each message the client got is the one sent at its timestamp.
    seen = [x for kind, x in run.state_dict()["nodes"]["log"]["seen"] if kind == "obs"]
    stamped = [(t, payload) for s, t, payload in client.data if s == 4]
    assert len(stamped) >= 5
    for t, payload in stamped:
        assert t > 0 and t % 10_000_000 == 0, t
        assert payload == {"shape": [3], "dtype": "float32",
                           "data": seen[t // 10_000_000 - 1]}, t


def test_the_server_stops_with_a_placed_run_and_leaves_no_thread_nor_port(
        placed_served: Any) -> None:
    run, server = placed_served
    client = Client(server.port)
    client.recv_until(lambda: "echo.out" in client.channels, "the advertise")
    client.send({"op": "subscribe", "subscriptions": [
        {"id": 1, "channelId": client.channels["echo.out"]["id"]}]})
    _until(lambda: server.watched() == ["echo.out"], "the subscription")

    run.stop()
    run.join(timeout=20)

    _until(lambda: server.closed, "the server's end")
    _until(lambda: not any(t.name.startswith("mujou-foxglove") for t in threading.enumerate()),
           "the mujou-foxglove threads' end")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
    assert server.watched() == []


class Talker(mujou.Node):
    """Logs each command it is given, from inside its hook."""

    cmd = mujou.Input(float, trigger=True, depth=None)

    def on_update(self, dt: float) -> None:
        for value in self.cmd.drain():
            logging.getLogger("talker.code").warning("got %s", value)


def test_the_log_channel_carries_records_named_after_the_node_that_logged_them() -> None:
    from mujou_actors.recording.logview import LogTap

    run = mujou.run({"talk": Talker()}, timer="simulated")
    server = mujou.serve_foxglove(run, 0)
    try:
        client = Client(server.port)
        client.recv_until(lambda: "/mujou/log" in client.channels, "the log's channel")
        channel = client.channels["/mujou/log"]
        assert (channel["schemaName"], channel["encoding"]) == ("foxglove.Log", "json")
        assert not any(isinstance(h, LogTap) for h in logging.getLogger().handlers)
        client.send({"op": "subscribe", "subscriptions": [{"id": 5, "channelId": channel["id"]}]})
        _until(lambda: any(isinstance(h, LogTap) for h in logging.getLogger().handlers),
               "the log's handler")

        run.write("talk.cmd", 3.0)
        logging.getLogger("outside").error("not in a node")
        client.recv_until(lambda: len([e for e in client.of(5) if e["name"] in (
            "talk", "outside")]) == 2, "the two records")

        # (the hook runs on a worker after the write: the two lines come in either order)
        mine = sorted((e for e in client.of(5) if e["name"] in ("talk", "outside")),
                      key=lambda e: e["name"], reverse=True)
        assert [(e["name"], e["level"], e["message"]) for e in mine] == [
            ("talk", 3, "got 3.0"), ("outside", 4, "not in a node")]
        assert mine[0]["file"].endswith("test_foxglove.py") and mine[0]["line"] > 0
        assert set(mine[0]["timestamp"]) == {"sec", "nsec"}
        client.unsubscribe_and_close(5)
        _until(lambda: not any(isinstance(h, LogTap) for h in logging.getLogger().handlers),
               "the handler's removal with the last watcher")
    finally:
        server.close()
        run.stop()
        run.join(timeout=20)
