"""A recording served to Foxglove (`mujou view`): projected channels, play, pause, seek.

A real WebSocket client (the `websockets` package, speaking Foxglove's protocol as
tests/test_foxglove.py does) reads what the server sends; the playback messages'
wire format is checked against foxglove-sdk's own server. The recording is the
net of tests/nets/view_nets.py, 30 ms of simulated time: ``src.count`` sends
0.0, 1.0, 2.0 at 10, 20 and 30 ms.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from typing import Any

import pytest

import mujou_actors as mujou
from mujou_actors.recording.playback import parse_request, serve_recording, state_frame
from tests.nets.view_nets import make_net

websockets_sync = pytest.importorskip("websockets.sync.client")

pytestmark = pytest.mark.timeout(60)

MS = 1_000_000


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("playback") / "run.mcap")
    mujou.run(make_net(), timer="simulated", duration=0.03, record=path).join()
    return path


def _client(port: int) -> Any:
    from tests.test_foxglove import Client

    class PlaybackClient(Client):
        """The test's Foxglove client, which also keeps the playback states (opcode 5)."""

        def __init__(self, port: int) -> None:
            super().__init__(port)
            self.states: list[tuple[int, int, float, bool, str]] = []

        def recv(self) -> None:
            frame = self.ws.recv(timeout=10)
            if isinstance(frame, bytes) and frame[0] == 0x05:
                _, status, t, speed, seek, n = struct.unpack_from("<BBQfBI", frame)
                self.states.append((status, t, speed, bool(seek), frame[19:19 + n].decode()))
                return
            self.ws_frame = frame
            self._handle(frame)

        def _handle(self, frame: Any) -> None:
            keep = self.ws.recv
            self.ws.recv = lambda timeout=None: frame  # type: ignore[method-assign]
            try:
                Client.recv(self)
            finally:
                self.ws.recv = keep  # type: ignore[method-assign]

        def request(self, play: bool, speed: float, seek: int | None, rid: str) -> None:
            self.ws.send(b"\x03" + struct.pack("<BfBQI", 0 if play else 1, speed,
                                               seek is not None, seek or 0, len(rid))
                         + rid.encode())

        def subscribe(self, topic: str, sub: int) -> None:
            self.send({"op": "subscribe", "subscriptions": [
                {"id": sub, "channelId": self.channels[topic]["id"]}]})

    client = PlaybackClient(port)
    client.recv_until(lambda: client.info and client.channels, "serverInfo and advertise")
    return client


def test_the_playback_wire_format_is_foxglove_sdks() -> None:
    foxglove = pytest.importorskip("foxglove")
    ws = pytest.importorskip("foxglove.websocket")
    if not hasattr(ws, "PlaybackControlRequest"):
        pytest.skip("this foxglove-sdk has no playback control")
    got: list[tuple[Any, float, int | None, str]] = []

    class Listener(ws.ServerListener):  # type: ignore[misc, name-defined]
        def on_playback_control_request(self, request: Any) -> Any:
            got.append((request.playback_command, request.playback_speed, request.seek_time,
                        request.request_id))
            return ws.PlaybackState(ws.PlaybackStatus.Ended, 4242, 0.5, True,
                                    request.request_id)

    server = foxglove.start_server(port=0, server_listener=Listener(),
                                   playback_time_range=(100, 5000))
    try:
        with websockets_sync.connect(f"ws://127.0.0.1:{server.port}",
                                     subprotocols=["foxglove.sdk.v1"], open_timeout=10) as c:
            info = json.loads(c.recv(timeout=10))
            ours = b"\x03" + struct.pack("<BfBQI", 1, 2.5, 1, 777, 3) + b"abc"
            c.send(ours)
            theirs = c.recv(timeout=10)  # the state the listener returned, answering it
    finally:
        server.stop()

    assert "playbackControl" in info["capabilities"]
    assert info["dataStartTime"] == {"sec": 0, "nsec": 100}
    assert got == [(ws.PlaybackCommand.Pause, 2.5, 777, "abc")]
    assert parse_request(ours) == (False, 2.5, 777, "abc")
    assert theirs == state_frame(3, 4242, 0.5, True, "abc")


def test_a_recording_is_served_projected_at_its_recorded_times(recording: str) -> None:
    with serve_recording(recording, 0, speed=0.5, paused=True) as server:
        client = _client(server.port)
        client.subscribe("src.count", 1)
        client.subscribe("src.command", 2)
        client.subscribe("/mujou/graph", 3)
        client.recv_until(lambda: client.of(3), "the graph")
        started = time.monotonic()
        client.request(True, 0.5, None, "go")
        client.recv_until(lambda: len(client.of(1)) == 3 and len(client.of(2)) == 3,
                          "every message")
        took = time.monotonic() - started
        client.recv_until(lambda: any(s[0] == 3 for s in client.states), "the end")
        client.ws.close()

    assert "playbackControl" in client.info["capabilities"]
    assert client.info["dataStartTime"] == {"sec": 0, "nsec": 10 * MS}
    assert client.info["dataEndTime"] == {"sec": 0, "nsec": 30 * MS}
    assert client.channels["src.count"]["schemaName"] == "mujou.view.builtins.float"
    assert client.channels["src.image"]["schemaName"] == "foxglove.RawImage"
    assert client.of(1) == [{"value": 0.0}, {"value": 1.0}, {"value": 2.0}]
    assert client.of(2)[2] == {"force": 1.0, "step": 2}
    assert [ts for s, ts, _ in client.data if s == 1] == [10 * MS, 20 * MS, 30 * MS]
    assert [n["path"] for n in client.of(3)[0]["nodes"]] == ["src", "sink"]
    assert took >= 0.03  # 20 ms of recording at half speed, at least
    assert client.states[0][:2] == (1, 10 * MS)  # paused at the start when it connected
    assert (0, "go") == (client.states[1][0], client.states[1][4])
    assert client.states[-1][:2] == (3, 30 * MS)


def test_a_seek_sends_each_channels_newest_message_then_plays_from_there(
        recording: str) -> None:
    with serve_recording(recording, 0, paused=True) as server:
        client = _client(server.port)
        client.subscribe("src.count", 1)
        client.request(False, 1.0, 25 * MS, "seek")
        client.recv_until(lambda: client.of(1), "the message before the seek")
        client.recv_until(lambda: any(s[4] == "seek" for s in client.states), "its state")
        time.sleep(0.1)
        before_play = list(client.of(1))
        client.request(True, 1.0, None, "play")
        client.recv_until(lambda: len(client.of(1)) == 2, "the message after the seek")
        client.ws.close()
        position = server.position_ns

    assert before_play == [{"value": 1.0}]  # paused: only the newest before 25 ms
    assert next(s for s in client.states if s[4] == "seek")[:4] == (1, 25 * MS, 1.0, True)
    assert client.of(1) == [{"value": 1.0}, {"value": 2.0}]
    assert position == 30 * MS


@pytest.mark.slow
def test_mujou_view_serves_until_interrupted_and_refuses_what_is_no_recording(
        recording: str, tmp_path: Any) -> None:
    bad = tmp_path / "notes.mcap"
    bad.write_text("not a recording")
    refused = subprocess.run([sys.executable, "-m", "mujou_actors", "view", str(bad)],
                             capture_output=True, text=True, timeout=60)
    proc = subprocess.Popen([sys.executable, "-m", "mujou_actors", "view", recording,
                             "--foxglove=:0", "--loop", "--speed", "4"],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline() if proc.stderr else ""
        port = int(line.split("ws://127.0.0.1:")[1].split(" ")[0])
        client = _client(port)
        client.subscribe("src.pair", 1)
        client.recv_until(lambda: len(client.of(1)) >= 4, "looped messages")
        client.ws.close()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)

    assert refused.returncode == 2
    assert refused.stderr.startswith(f"error: RecordingError: {bad}: not an MCAP file")
    assert "Traceback" not in refused.stderr
    assert line.startswith(f"foxglove: recording view of {recording} at ws://127.0.0.1:")
    got = [m["data"] for m in client.of(1)[:4]]
    cycle = [[0.0, 0.0], [1.0, 2.0], [2.0, 4.0]]  # the recording, again and again
    assert got == [cycle[(cycle.index(got[0]) + i) % 3] for i in range(4)]
    assert code == 0
