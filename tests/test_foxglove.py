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
pytest.importorskip("foxglove")

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

    def __init__(self, port: int) -> None:
        self.ws = websockets_sync.connect(f"ws://127.0.0.1:{port}", subprotocols=SUBPROTOCOLS,
                                          open_timeout=10).__enter__()
        self.channels: dict[str, dict[str, Any]] = {}
        self.info: dict[str, Any] = {}
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


@pytest.fixture
def served() -> Any:
    echo = Echo()
    run = mujou.run({"echo": echo}, timer="simulated")
    server = mujou.serve_foxglove(run, 0)
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


def test_a_host_off_loopback_needs_allow_remote_and_a_placed_run_is_refused() -> None:
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
        with pytest.raises(TypeError, match="placed run"):
            mujou.serve_foxglove(object(), 0)  # type: ignore[arg-type]
    finally:
        taken.close()
        run.stop()
        run.join(timeout=20)
    with pytest.raises(mujou.NotRunningError):
        mujou.serve_foxglove(run, 0)


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
        client.ws.close()
    finally:
        server.close()
        run.stop()
        run.join(timeout=20)

    # Source sends its n-th count at n * 10 ms of the run's timer: the message's
    # timestamp is that, not the time the host thread passed it on.
    stamped = [(t, payload["value"]) for s, t, payload in client.data if s == 4]
    assert len(stamped) >= 5
    assert all(t == n * 10_000_000 for t, n in stamped), stamped[:5]
