"""A recording served to Foxglove: its channels projected, with play, pause, seek and speed.

``mujou.playback.serve_recording("run.mcap")`` (``mujou view run.mcap
--foxglove``) serves Foxglove's WebSocket protocol as the live view does
(`mujou_actors.recording.liveview`: the same handshake rules, loopback unless
``allow_remote``, the same per-client bounds), for a recording instead of a
running net. No node runs: each lossless message is decoded by the bounded
reader (`mujou_actors.recording.mcapfile`) and made JSON by the projection of its
channel (`mujou_actors.recording.recview`), the views ``Recording(view=True)`` writes. It
advertises:

* a channel per recorded Output, topic its path, as the live view's;
* ``/mujou/graph``: the recorded net (``mujou.run``'s ``net`` metadata);
* ``/mujou/log``, when the file has the run's log records
  (``Recording(log=True)``): Foxglove's ``foxglove.Log``, as the live view
  serves it, each record at its recorded time;
* the playback's time (Foxglove's ``time``), and Foxglove's *playback
  control* (``playbackControl``, with the recording's ``dataStartTime`` and
  ``dataEndTime``): the app's play and pause buttons, its speed and its seek
  bar drive the player. After a seek, the newest message of each channel
  before the seek time is sent first, so the panels are not empty.

The player (``mujou-playback`` thread) sends each message at its recorded
time divided by the speed, in the order the run sent them; at the end it
stops (status *ended*) or, with ``loop``, starts again. A message is
projected only for a channel that a client watches.

The wire format of the playback messages is foxglove-sdk's (checked in
tests/test_playback.py against the installed SDK's own server): a client's
request is binary opcode 3 (command u8: 0 play, 1 pause; speed f32; had-seek
u8; seek time u64; request id u32-length string), the server's state binary
opcode 5 (status u8: 0 playing, 1 paused, 2 buffering, 3 ended; current time
u64; speed f32; did-seek u8; request id u32-length string), little-endian.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import struct
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import describe
from . import mcapfile
from .foxlog import LOG_SCHEMA, LOG_SCHEMA_NAME, LOG_TOPIC
from .recview import ChannelView, channel_views, merged
from .wsserver import (
    DEFAULT_PORT,
    GRAPH_TOPIC,
    MESSAGE,
    TIME,
    TIME_EVERY,
    Client,
    SocketServer,
    parse_listen,
    parse_origins,
)

__all__ = ["PlaybackServer", "serve_recording"]

log = logging.getLogger("mujou_actors")

PLAYING, PAUSED, BUFFERING, ENDED = 0, 1, 2, 3
"""The playback statuses of Foxglove's protocol (`PlaybackServer.status`)."""

MIN_SPEED, MAX_SPEED = 0.01, 1000.0
"""The speeds a client may ask for; others are clamped to them."""

_REQUEST = struct.Struct("<BBfBQI")  # opcode 3, command, speed, had seek, seek time, id length
_STATE = struct.Struct("<BBQfBI")  # opcode 5, status, time, speed, did seek, id length
_STATUS_NAMES = {PLAYING: "playing", PAUSED: "paused", BUFFERING: "buffering", ENDED: "ended"}


def _stamp(t_ns: int) -> dict[str, int]:
    return {"sec": t_ns // 1_000_000_000, "nsec": t_ns % 1_000_000_000}


def state_frame(status: int, t_ns: int, speed: float, did_seek: bool,
                request_id: str | None) -> bytes:
    """A PlaybackState message as the server sends it (binary opcode 5).

    Args:
        status (int): `PLAYING`, `PAUSED`, `BUFFERING` or `ENDED`.
        t_ns (int): the playback's time, ns (>= 0).
        speed (float): the playback's speed, a factor of real time.
        did_seek (bool): a seek made this state.
        request_id (str | None): the request it answers (None: none).

    Returns:
        bytes: the message.
    """
    rid = (request_id or "").encode()
    return _STATE.pack(5, status, max(t_ns, 0), speed, int(did_seek), len(rid)) + rid


def parse_request(data: bytes) -> tuple[bool, float, int | None, str]:
    """A client's PlaybackControlRequest (binary opcode 3).

    Args:
        data (bytes): the message, opcode included.

    Returns:
        tuple[bool, float, int | None, str]: ``(play, speed, seek_ns,
        request_id)``: play True for *play*, False for *pause*; seek None when
        none was asked.

    Raises:
        ValueError: not such a message (short, another command, a length
            that lies, a request id that is not UTF-8).
    """
    if len(data) < _REQUEST.size or data[0] != 3:
        raise ValueError("a playback request is at least 19 bytes, opcode 3")
    _, command, speed, had_seek, seek, n = _REQUEST.unpack_from(data)
    if command not in (0, 1) or had_seek not in (0, 1):
        raise ValueError(f"a playback command is 0 or 1, got {command}")
    if len(data) != _REQUEST.size + n:
        raise ValueError(f"a request id of {n} bytes, but {len(data) - _REQUEST.size} follow")
    return command == 0, speed, seek if had_seek else None, data[_REQUEST.size:].decode()


class PlaybackServer(SocketServer):
    """A recording served to Foxglove with playback controls; made by `serve_recording`.

    Use it as a context manager, or call `close`. What it serves is in the
    module's docstring and in docs/recording.md ("A recording in Foxglove").
    """

    def __init__(self, path: str, host: str, port: int, name: str, *,
                 origins: frozenset[str | None], speed: float, loop: bool, paused: bool,
                 allow_damaged: bool) -> None:
        self.path = path
        self._allow_damaged = allow_damaged
        found = mcapfile.info(path, allow_damaged=allow_damaged)
        self._views: dict[str, ChannelView] = channel_views(found)
        self._logs = bool(found.logs)
        # The span the seek bar covers: the log's records too (a record after the last
        # message is played, not left past the end).
        firsts = [found.start_ns, *(c.first_ns for c in found.logs)]
        lasts = [found.end_ns, *(c.last_ns for c in found.logs)]
        self.start_ns = max(min((t for t in firsts if t is not None), default=0), 0)
        self.end_ns = max(max((t for t in lasts if t is not None), default=0), self.start_ns)
        self._graph = self._make_graph(found)
        self._loop_at_end = loop
        self._cond = threading.Condition()
        self._playing = not paused
        self._ended = False
        self._speed = speed
        self._seek: int | None = None
        self._position = self.start_ns
        self._closing = False
        self._sent = 0
        self._targets: dict[str, tuple[tuple[Client, int], ...]] = {}
        self._channel_ids = {t: i for i, t in enumerate(
            [*self._views, GRAPH_TOPIC, *([LOG_TOPIC] if self._logs else [])], 1)}
        self._topic_of = {i: t for t, i in self._channel_ids.items()}
        self._server_info = json.dumps({
            "op": "serverInfo", "name": name, "capabilities": ["time", "playbackControl"],
            "metadata": {"library": "mujou_actors", "recording": os.path.basename(path)},
            "sessionId": str(time.time_ns()), "dataStartTime": _stamp(self.start_ns),
            "dataEndTime": _stamp(self.end_ns)})
        self._advertise = self._make_advertise()
        # Last: nothing above may leave a socket open.
        super().__init__(host, port, "serve_recording", origins)
        self._thread = threading.Thread(target=self._serve, name="mujou-foxglove", daemon=True)
        self._player = threading.Thread(target=self._play, name="mujou-playback", daemon=True)
        self._thread.start()
        self._player.start()

    # -- what it says of itself ---------------------------------------------------------
    @property
    def position_ns(self) -> int:
        """int: the playback's time, ns of the recording's timer."""
        return self._position

    @property
    def status(self) -> str:
        """str: ``"playing"``, ``"paused"`` or ``"ended"``."""
        with self._cond:
            return _STATUS_NAMES[self._status()]

    @property
    def sent(self) -> int:
        """int: messages sent to clients so far (a message to two clients counts twice)."""
        return self._sent

    def play(self, speed: float | None = None) -> None:
        """Play from the current time (as Foxglove's play button does).

        Args:
            speed (float | None): a new speed, a factor of real time
                (clamped to `MIN_SPEED`..`MAX_SPEED`); None: unchanged.
        """
        self._control(True, speed, None, None)

    def pause(self) -> None:
        """Pause (as Foxglove's pause button does)."""
        self._control(False, None, None, None)

    def seek(self, t_ns: int) -> None:
        """Go to a time of the recording (ns); playing or paused as before.

        Args:
            t_ns (int): the time, clamped to the recording's span.
        """
        with self._cond:
            playing = self._playing
        self._control(playing, None, t_ns, None)

    def close(self) -> None:
        """Stop the server and the player: no port left open, no thread left; idempotent."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._stop_serving(self._thread, self._player)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"port {self.port}"
        return f"<PlaybackServer {self.path} {state} {len(self._views)} channels>"

    # -- what every client is told ------------------------------------------------------
    def _make_graph(self, found: mcapfile.RecordingInfo) -> bytes:
        net: Any = {}
        if found.run.get("net"):
            try:
                net = mcapfile.parse_json(found.run["net"])
            except ValueError:
                net = {}
        if not isinstance(net, dict):
            net = {}
        return json.dumps({"time_ns": self.start_ns, **net}, allow_nan=False).encode()

    def _make_advertise(self) -> str:
        channels = []
        for topic, view in self._views.items():
            c = view.channel
            meta = {"kind": "output", "type": c.type}
            if c.shape is not None:
                meta["shape"] = json.dumps(c.shape)
            if c.dtype is not None:
                meta["dtype"] = c.dtype
            channels.append({"id": self._channel_ids[topic], "topic": topic, "encoding": "json",
                             "schemaName": view.projection.schema_name,
                             "schemaEncoding": "jsonschema",
                             "schema": json.dumps(view.projection.schema), "metadata": meta})
        channels.append({"id": self._channel_ids[GRAPH_TOPIC], "topic": GRAPH_TOPIC,
                         "encoding": "json", "schemaName": "mujou.Graph",
                         "schemaEncoding": "jsonschema", "schema": json.dumps({"type": "object"})})
        if self._logs:
            channels.append({"id": self._channel_ids[LOG_TOPIC], "topic": LOG_TOPIC,
                             "encoding": "json", "schemaName": LOG_SCHEMA_NAME,
                             "schemaEncoding": "jsonschema", "schema": json.dumps(LOG_SCHEMA)})
        return json.dumps({"op": "advertise", "channels": channels})

    # -- the player (mujou-playback) --------------------------------------------------------
    def _status(self) -> int:
        return ENDED if self._ended else PLAYING if self._playing else PAUSED

    def _control(self, play: bool, speed: float | None, seek: int | None,
                 request_id: str | None) -> None:
        """A play, pause, speed or seek request (a client's or a method's); tells every client."""
        with self._cond:
            if speed is not None and math.isfinite(speed):
                self._speed = min(max(speed, MIN_SPEED), MAX_SPEED)
            self._playing = play
            if seek is not None:
                self._seek = min(max(seek, self.start_ns), self.end_ns)
                self._position = self._seek
            elif play and self._ended:  # play at the end: from the start again
                self._seek = self.start_ns
            self._cond.notify_all()
            frame = state_frame(self._status() if seek is None else
                                (PLAYING if play else PAUSED), self._position, self._speed,
                                seek is not None, request_id)
        self._broadcast(frame)

    def _broadcast(self, frame: bytes) -> None:
        for client in list(self._clients.values()):
            with contextlib.suppress(RuntimeError):  # the loop has ended
                client.push(frame, b"")

    def _messages(self) -> Iterator[mcapfile.Record]:
        """The messages, and the log's records as Records of ``/mujou/log``, by time."""
        items = merged(self.path, mcapfile.read(self.path, allow_damaged=self._allow_damaged),
                       self._allow_damaged, with_logs=self._logs)
        for item in items:
            if isinstance(item, mcapfile.LogEntry):
                yield mcapfile.Record(LOG_TOPIC, 0, item.t_ns, 0, item.to_json())
            else:
                yield item

    def _play(self) -> None:
        """``mujou-playback``: send the messages at their times, as the controls say."""
        try:
            self._play_loop()
        except Exception as exc:  # noqa: BLE001 - logged: the server goes on, playing nothing
            log.warning("foxglove: the playback of %s stopped: %s", self.path, describe(exc))

    def _play_loop(self) -> None:
        cond = self._cond
        reader: Iterator[mcapfile.Record] | None = None
        pending: mcapfile.Record | None = None
        anchor: tuple[float, int] | None = None  # (wall time, playback time) of one instant
        while True:
            with cond:
                while not self._closing and self._seek is None and (
                        not self._playing or self._ended):
                    cond.wait()
                    anchor = None
                if self._closing:
                    return
                seek, self._seek = self._seek, None
                speed = self._speed
            if seek is not None:
                reader, pending = self._seek_to(seek)
                with cond:
                    self._ended = False
                    self._position = seek
                anchor = None
                continue
            if reader is None:
                reader = self._messages()
            if pending is None:
                pending = next(reader, None)
            if pending is None:
                if self._loop_at_end:
                    self._control(True, None, self.start_ns, None)
                    continue
                with cond:
                    self._ended = True
                    self._position = self.end_ns
                self._broadcast(state_frame(ENDED, self.end_ns, speed, False, None))
                continue
            t = max(pending.t_ns, 0)
            now = time.monotonic()
            if anchor is None:
                anchor = (now, self._position)
            due = anchor[0] + (t - anchor[1]) / 1e9 / speed
            if due > now:
                with cond:
                    self._position = max(self._position,
                                         min(t, anchor[1] + int((now - anchor[0]) * speed * 1e9)))
                    if self._seek is None and self._playing and not self._closing:
                        cond.wait(min(due - now, TIME_EVERY))
                    if self._seek is not None or not self._playing or speed != self._speed:
                        anchor = None
                continue
            self._send(pending)
            with cond:
                if self._seek is None:
                    self._position = max(self._position, t)
            pending = None

    def _seek_to(self, t_ns: int) -> tuple[Iterator[mcapfile.Record], mcapfile.Record | None]:
        """Read up to ``t_ns``; send each channel's newest message before it; the rest to come."""
        reader = self._messages()
        newest: dict[str, mcapfile.Record] = {}
        for record in reader:
            if max(record.t_ns, 0) >= t_ns:
                for old in newest.values():
                    self._send(old)
                return reader, record
            newest[record.topic] = record
        for old in newest.values():
            self._send(old)
        return reader, None

    def _send(self, record: mcapfile.Record) -> None:
        """A message's view to each client that watches its channel."""
        watchers = self._targets.get(record.topic)
        if not watchers:
            return
        t = max(record.t_ns, 0)
        try:
            data = (json.dumps(record.message).encode() if record.topic == LOG_TOPIC
                    else self._views[record.topic].encode(record.message, t))
        except Exception as exc:  # noqa: BLE001 - a view never stops the playback
            log.debug("foxglove: no view of a message of %s: %s", record.topic, describe(exc))
            return
        for client, sub in watchers:
            try:
                client.push(MESSAGE.pack(1, sub, t), data)
            except RuntimeError:  # the loop has ended
                return
            self._sent += 1

    def _welcome(self, client: Client) -> None:
        """The playback's state, so the client's controls show it at once."""
        with self._cond:
            frame = state_frame(self._status(), self._position, self._speed, False, None)
        client.push(frame, b"")

    def _forget(self, client: Client) -> None:
        """A client's end: its subscriptions go."""
        super()._forget(client)
        for topic in list(client.topics):
            self._leave(client, topic)

    # -- the loop (mujou-foxglove) --------------------------------------------------------
    def _serve(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        except Exception as exc:  # noqa: BLE001 - logged
            log.warning("foxglove: the recording's view stopped: %s", describe(exc))
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            self._sock.close()
            self._loop.close()
            self._closed = True

    async def _tick(self) -> None:
        """The playback's time to every client every `TIME_EVERY` s."""
        while True:
            await asyncio.sleep(TIME_EVERY)
            self._broadcast(TIME.pack(2, self._position))

    async def _on_text(self, client: Client, text: str) -> None:
        try:
            op = json.loads(text)
            kind = op.get("op") if isinstance(op, dict) else None
            if kind == "subscribe":
                await self._subscribe(client, op["subscriptions"])
            elif kind == "unsubscribe":
                for sub in op["subscriptionIds"]:
                    topic = client.subs.get(sub)
                    if topic is not None:
                        self._leave(client, topic)
            elif kind in ("subscribeConnectionGraph", "unsubscribeConnectionGraph"):
                pass
            else:
                await self._error(client, f"an unsupported op {str(kind)[:64]!r} (a recording's "
                                          "view: subscribe, unsubscribe and playback control)")
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            await self._error(client, f"a bad request: {describe(exc)}"[:512])

    async def _subscribe(self, client: Client, items: Iterable[Any]) -> None:
        bad = []
        for item in items:
            sub, channel = int(item["id"]), int(item["channelId"])
            topic = self._topic_of.get(channel)
            if topic is None or sub in client.subs or topic in client.topics:
                bad.append(channel)
                continue
            client.subs[sub], client.topics[topic] = topic, sub
            if topic == GRAPH_TOPIC:
                client.push(MESSAGE.pack(1, sub, self.start_ns), self._graph)
            else:
                self._targets[topic] = (*self._targets.get(topic, ()), (client, sub))
        if bad:
            await self._error(client, f"subscriptions refused (an unknown channel, or a "
                                      f"subscription id or channel taken): channels {bad[:8]}")

    def _leave(self, client: Client, topic: str) -> None:
        sub = client.topics.pop(topic)
        client.subs.pop(sub, None)
        self._targets[topic] = tuple(t for t in self._targets.get(topic, ())
                                     if t[0] is not client)

    async def _on_binary(self, client: Client, data: bytes) -> None:
        if data[:1] != b"\x03":
            await self._error(client, "a binary message that is no playback request: a "
                                      "recording takes no published messages")
            return
        try:
            play, speed, seek, request_id = parse_request(data)
        except (ValueError, UnicodeDecodeError) as exc:
            await self._error(client, f"a bad playback request: {describe(exc)}"[:512])
            return
        self._control(play, speed, seek, request_id)


def serve_recording(path: str | os.PathLike[str], listen: int | str = DEFAULT_PORT, *,
                    allow_remote: bool = False, origins: Iterable[str] = (),
                    speed: float = 1.0, loop: bool = False, paused: bool = False,
                    allow_damaged: bool = False, name: str = "mujou") -> PlaybackServer:
    """Serve a recording to Foxglove over WebSocket, with its playback controls.

    Open ``ws://127.0.0.1:8765`` in Foxglove (Open connection, Foxglove
    WebSocket): every recorded Output is a channel (the JSON view that the live
    view and ``Recording(view=True)`` give), ``/mujou/graph`` the recorded net; the
    app's play, pause, speed and seek bar drive the playback. Nothing in the
    file is imported or run.

    Args:
        path (str | os.PathLike): a recording (``mujou.run(record=...)``).
        listen (int | str): the port on 127.0.0.1, or ``":PORT"``, or
            ``"HOST:PORT"``; 0 takes a free port. Default: 8765.
        allow_remote (bool): let ``listen`` be an address off loopback (anyone
            who reaches it reads the recording). Default: False.
        origins (Iterable[str]): web pages' ``Origin`` headers allowed besides
            the live view's defaults (see `mujou.serve_foxglove`). Default: none.
        speed (float): the playback's speed, a factor of the recorded rate
            (> 0). Default: 1.
        loop (bool): start again at the end. Default: False (stop, *ended*).
        paused (bool): start paused. Default: False (playing).
        allow_damaged (bool): serve a damaged recording up to its first
            damaged record. Default: False.
        name (str): the server's name, as Foxglove shows it. Default: ``"mujou"``.

    Returns:
        PlaybackServer: the server (a context manager).

    Raises:
        ImportError: websockets is not installed.
        ValueError: a bad ``listen`` (or one off loopback without
            ``allow_remote``), a bad origin, a speed that is not > 0.
        FileNotFoundError: no such file.
        RecordingError: the file is not a mujou recording, or is damaged.
        RuntimeError: the server could not listen (the port is taken).
    """
    if not (isinstance(speed, (int, float)) and math.isfinite(speed) and speed > 0):
        raise ValueError(f"serve_recording: speed must be a number > 0, got {speed!r}")
    host, port = parse_listen(listen, allow_remote)
    allowed = parse_origins(origins)
    return PlaybackServer(os.fspath(path), host, port, str(name), origins=allowed,
                          speed=float(speed), loop=bool(loop), paused=bool(paused),
                          allow_damaged=bool(allow_damaged))
