"""Foxglove's WebSocket protocol, the server's side that the live view and the playback share.

`liveview` serves a running net and `playback` a recording over the same
protocol (``foxglove.sdk.v1``, and ``foxglove.websocket.v1`` that older
clients offer), with the same rules: loopback unless asked (`parse_listen`),
handshakes refused by ``Origin`` (`parse_origins`) and past `MAX_CLIENTS`,
each client's queue bounded (`Client`: `BACKLOG` messages, `BACKLOG_BYTES`
bytes, the oldest dropped and counted) and written many frames per socket
write. `SocketServer` is the part of a server that does not depend on what it
serves: its socket, its asyncio loop, its clients' writers. Nothing here is
public: the names users see are ``mujou.serve_foxglove`` and
``mujou_actors.recording.playback.serve_recording``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import json
import logging
import re
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Self

from .._checks import is_int
from ..errors import describe

if TYPE_CHECKING:
    from ..ports import Input

__all__: list[str] = []

log = logging.getLogger("mujou_actors")

DEFAULT_PORT = 8765
"""The port ``mujou run --foxglove`` listens on without one (Foxglove's default)."""

DEFAULT_ORIGINS: tuple[str | None, ...] = (None, "https://app.foxglove.dev", "file://")
"""The ``Origin`` headers allowed without ``origins=``: none (a native client),
Foxglove's web app, and a local file as Chromium before 92 (and the Electron apps
made with it) names one. Not ``null``: newer browsers name a local file so, but
also a sandboxed frame of any page."""

SUBPROTOCOLS = ("foxglove.sdk.v1", "foxglove.websocket.v1")
"""The WebSocket subprotocols served (Foxglove's protocol, its two names)."""

TIME_EVERY = 0.2
"""Wall seconds between two broadcasts of the run's time."""

GRAPH_TOPIC = "/mujou/graph"
"""The topic of the net's graph (nodes, ports, connections)."""

MAX_CLIENTS = 16
"""The most clients connected at once; a further handshake gets HTTP 503."""

MAX_CLIENT_CHANNELS = 64
"""The most channels one client may advertise (to publish on) at once."""

WARNINGS_PER_CLIENT = 10
"""The warnings logged about one client; the rest are counted, one line at its end."""

BACKLOG = 1024
"""The most messages queued for one client; beyond, the oldest are dropped (counted)."""

BACKLOG_BYTES = 16 << 20
"""The most bytes queued for one client; beyond, the oldest messages are dropped."""

MAX_MESSAGE = 4 << 20
"""The largest message a client may send (bytes); a larger one closes its connection."""

REFUSAL_LOG_EVERY = 10.0
"""Wall seconds between two log lines about refused handshakes (the rest counted)."""

JOIN = 3.0  # wall seconds close() waits for the mujou-foxglove thread
CLOSE_TIMEOUT = 1.0  # wall seconds a client has to answer the closing handshake
WRITE_LIMIT = 1 << 20  # bytes in a socket's buffer beyond which a client's messages wait
FLOW_WAIT = 0.01  # wall seconds between two looks at a full socket buffer
# Wall seconds a client's writer, woken by a message, lets more gather before it writes: at
# most 1/LINGER wake-ups a second take the GIL from the net, whatever the rate (a view
# refreshes at 60 Hz at most).
LINGER = 0.005
MESSAGE = struct.Struct("<BIQ")  # message data: opcode 1, subscription id, time (ns)
TIME = struct.Struct("<BQ")  # time: opcode 2, time (ns)
CLIENT_DATA = struct.Struct("<BI")  # a client's message data: opcode 1, channel id
ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s?#]+")

def websockets_module() -> Any:
    """The ``websockets`` package's asyncio server, or an ImportError that says what to install."""
    try:
        import websockets.asyncio.server as server
    except ImportError as exc:
        raise ImportError("the live Foxglove view needs the websockets package (>=14): "
                          "pip install 'mujou_actors[view]'") from exc
    return server


def parse_listen(listen: int | str, allow_remote: bool) -> tuple[str, int]:
    """Where the server listens: ``PORT``, ``":PORT"`` or ``"HOST:PORT"``.

    Args:
        listen (int | str): the port (on 127.0.0.1), or an address; port 0
            takes a free port.
        allow_remote (bool): allow a host that is not loopback.

    Returns:
        tuple[str, int]: the host and the port.

    Raises:
        ValueError: a bad address, or a host off loopback without ``allow_remote``.
        TypeError: ``listen`` is neither an int nor a str.
    """
    if is_int(listen):
        host, port_text = "127.0.0.1", str(listen)
    elif not isinstance(listen, str):
        raise TypeError(f"serve_foxglove: listen must be a port (int) or 'HOST:PORT', "
                        f"got {listen!r}")
    else:
        host, colon, port_text = listen.strip().rpartition(":")
        if not colon:
            host, port_text = "", listen.strip()
        host = host.strip("[]") or "127.0.0.1"
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"serve_foxglove: {listen!r} is no port or HOST:PORT "
                         "(a port 0 to 65535)")
    if not allow_remote and not is_loopback(host):
        raise ValueError(f"serve_foxglove: {host!r} is not a loopback address; the view "
                         "exposes every port's messages (and, with allow_publish, lets a "
                         "client write to every Input): pass allow_remote=True "
                         "(--allow-remote) on a trusted network only")
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name or "0.0.0.0"'s like: maybe not loopback
        return False


def parse_origins(origins: Iterable[str]) -> frozenset[str | None]:
    """The ``Origin`` headers allowed: `DEFAULT_ORIGINS` and ``origins``.

    Args:
        origins (Iterable[str]): more origins, each ``"SCHEME://HOST[:PORT]"``
            (``"http://localhost:8080"``), ``"file://"`` or ``"null"``.

    Returns:
        frozenset: the allowed values, lower case (``None``: no header).

    Raises:
        TypeError: ``origins`` is a str, or holds something else than str.
        ValueError: an origin with a path, or without a scheme.
    """
    if isinstance(origins, str | bytes):
        raise TypeError(f"serve_foxglove: origins must be a list of origins, got {origins!r}")
    allowed: set[str | None] = set(DEFAULT_ORIGINS)
    for origin in origins:
        if not isinstance(origin, str):
            raise TypeError(f"serve_foxglove: origins must hold str, got {origin!r}")
        text = normal_origin(origin)
        if text not in ("null", "file://") and not ORIGIN.fullmatch(text):
            raise ValueError(f"serve_foxglove: {origin!r} is no origin: write "
                             "SCHEME://HOST[:PORT] (as 'https://app.foxglove.dev'), "
                             "'file://' or 'null'")
        allowed.add(text)
    return frozenset(allowed)


def normal_origin(origin: str) -> str:
    text = origin.strip().lower()
    return text[:-1] if text.endswith("/") and not text.endswith("://") else text


def frame_header(n: int) -> bytes:
    """The header of an unfragmented, unmasked binary WebSocket frame of ``n`` bytes."""
    if n < 126:
        return bytes((0x82, n))
    if n < 1 << 16:
        return struct.pack("!BBH", 0x82, 126, n)
    return struct.pack("!BBQ", 0x82, 127, n)



class Client:
    """One connection: what it subscribed and advertised, its queue, its warnings."""

    def __init__(self, number: int, ws: Any, origin: str | None,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.number, self.ws, self.origin, self.loop = number, ws, origin, loop
        self.subs: dict[int, str] = {}  # subscription id -> topic
        self.topics: dict[str, int] = {}  # topic -> subscription id
        self.channels: dict[int, Input] = {}  # advertised channel id -> Input
        self.warnings = 0  # logged
        self.unlogged = 0  # not logged: beyond WARNINGS_PER_CLIENT
        self.dropped = 0
        self.wake = asyncio.Event()
        self._lock = threading.Lock()  # the queue: filled on mujou-host, emptied on the loop
        self._queue: deque[tuple[bytes, bytes]] = deque()
        self._bytes = 0
        self._woken = False

    def push(self, head: bytes, data: bytes) -> None:
        """Queue a binary message (any thread); wake the writer if it sleeps.

        Raises:
            RuntimeError: the server's loop has ended.
        """
        with self._lock:
            self._queue.append((head, data))
            self._bytes += len(head) + len(data)
            while len(self._queue) > BACKLOG or (self._bytes > BACKLOG_BYTES
                                                 and len(self._queue) > 1):
                old_head, old_data = self._queue.popleft()
                self._bytes -= len(old_head) + len(old_data)
                self.dropped += 1
            if self._woken:
                return
            self._woken = True
        self.loop.call_soon_threadsafe(self.wake.set)

    def take(self) -> deque[tuple[bytes, bytes]]:
        """Everything queued (on the loop), the queue left empty."""
        with self._lock:
            queue, self._queue = self._queue, deque()
            self._bytes, self._woken = 0, False
        return queue

    def warn(self, text: str) -> bool:
        """Log a warning about this client, unless it had its share; True if logged."""
        if self.warnings >= WARNINGS_PER_CLIENT:
            self.unlogged += 1
            return False
        self.warnings += 1
        log.warning("foxglove: client %d (origin %s): %s", self.number,
                    self.origin or "none", text)
        return True


class WarningsOnly(logging.LoggerAdapter):
    """The ``websockets`` package's log, its warnings and errors only, on mujou_actors's.

    It says "connection open" and "rejected" at INFO for every handshake; the
    server counts those itself.
    """

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 - logging's name
        return level >= logging.WARNING and self.logger.isEnabledFor(level)



class SocketServer:
    """What a Foxglove WebSocket server holds whatever it serves: a socket, a loop, clients.

    A subclass serves: it sets ``_server_info`` and ``_advertise`` (the first
    two messages a client gets), defines ``_on_text`` and ``_on_binary`` (a
    client's messages), ``_tick`` (the periodic broadcast) and, if it keeps
    more of a client, ``_welcome`` and ``_forget``; and runs `_main` on its own
    thread (``self._loop.run_until_complete(self._main())``) until
    ``self._stop`` is set.

    Args:
        host (str): the address to listen on (checked by `parse_listen`).
        port (int): the port; 0 takes a free one.
        who (str): the function that serves, named in errors and refusals
            (``"serve_foxglove"``).
        origins (frozenset[str | None]): the ``Origin`` headers a handshake may
            carry (`parse_origins`).

    Raises:
        ImportError: ``websockets`` is not installed (says what to install).
        RuntimeError: the address cannot be listened on (names it and why).
    """

    def __init__(self, host: str, port: int, who: str, origins: frozenset[str | None]) -> None:
        self._ws_server = websockets_module()
        from websockets.exceptions import ConnectionClosed
        from websockets.protocol import State

        self._open, self._connection_closed = State.OPEN, ConnectionClosed
        self._clients: dict[int, Client] = {}
        self._numbers = itertools.count(1)
        self._closed = False
        self._who = who
        self._origins = origins
        self._handshakes_refused = 0  # an Origin not allowed (403), a client too many (503)
        self._refusals_logged = 0
        self._next_refusal_log = 0.0
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._sock = socket.create_server((host, port), family=family)
        except OSError as exc:
            raise RuntimeError(f"{who}: cannot listen on {host}:{port} "
                               f"({describe(exc)})") from exc
        self._address: tuple[str, int] = self._sock.getsockname()[:2]
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()

    @property
    def port(self) -> int:
        """int: the port the server listens on (the one taken, for port 0)."""
        return self._address[1]

    @property
    def address(self) -> tuple[str, int]:
        """tuple[str, int]: the address the server listens on, ``(host, port)``."""
        return self._address

    @property
    def closed(self) -> bool:
        """bool: True once the server is stopped."""
        return self._closed

    def close(self) -> None:
        """Stop serving (the subclass's own end first); idempotent."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        """The server itself: ``with serve_...(...) as server:`` closes it at the end."""
        return self

    def __exit__(self, *exc: object) -> None:
        """`close` it."""
        self.close()

    def _stop_serving(self, *threads: threading.Thread) -> None:
        """Ask the loop to stop (from any thread) and wait for ``threads``, `JOIN` s each."""
        try:
            self._loop.call_soon_threadsafe(self._stop.set)
        except RuntimeError:  # the loop has ended already
            pass
        for thread in threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(JOIN)

    async def _main(self) -> None:
        """Serve until ``_stop`` is set, broadcasting with ``_tick`` meanwhile."""
        server = self._ws_server.serve(
            self._handle, sock=self._sock, subprotocols=list(SUBPROTOCOLS),
            process_request=self._check_handshake, compression=None, max_size=MAX_MESSAGE,
            close_timeout=CLOSE_TIMEOUT, server_header="mujou_actors",
            logger=WarningsOnly(log, {}))
        async with server:
            ticker = asyncio.ensure_future(self._tick())
            await self._stop.wait()
            ticker.cancel()

    _server_info: str
    _advertise: str

    def _check_handshake(self, connection: Any, request: Any) -> Any:
        """Refuse an ``Origin`` not allowed (403) and a client too many (503).

        ``websockets``' ``process_request``: None accepts the handshake.
        """
        origins = request.headers.get_all("Origin")
        origin = normal_origin(origins[0]) if len(origins) == 1 else None
        if len(origins) > 1 or origin not in self._origins:
            self._refused_handshake(", ".join(origins)[:128])
            return connection.respond(HTTPStatus.FORBIDDEN, "This Origin may not connect "
                                      f"({self._who}(origins=...), --foxglove-origin).\n")
        if len(self._clients) >= MAX_CLIENTS:
            self._refused_handshake(None)
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE,
                                      f"At most {MAX_CLIENTS} clients at once.\n")
        return None

    def _refused_handshake(self, origin: str | None) -> None:
        """Count a refused handshake; log it unless a line was logged recently."""
        self._handshakes_refused += 1
        now = time.monotonic()
        if now < self._next_refusal_log:
            return
        more = self._handshakes_refused - self._refusals_logged - 1
        self._refusals_logged = self._handshakes_refused
        self._next_refusal_log = now + REFUSAL_LOG_EVERY
        if origin is None:
            why = f"{MAX_CLIENTS} clients are connected"
        elif origin.strip().lower() == "null":
            why = ("the Origin 'null' is not allowed: a local file (the Foxglove desktop app, "
                   "a local page), but also a sandboxed frame of any web page; allow it "
                   f"({self._who}(origins=['null']), --foxglove-origin null) only if that "
                   "risk is acceptable")
        else:
            why = (f"a web page's Origin {origin!r} is not allowed ({self._who}(origins=...), "
                   "--foxglove-origin)")
        log.warning("foxglove: refused a connection: %s%s", why,
                    f"; {more} more refused since the last such line" if more else "")

    async def _handle(self, ws: Any) -> None:
        """One client, from its handshake to its end."""
        client = Client(next(self._numbers), ws, ws.request.headers.get("Origin"), self._loop)
        writer = None
        try:
            await ws.send(self._server_info)  # first, as the protocol says
            await ws.send(self._advertise)
            self._clients[client.number] = client  # from here on, broadcasts go to it
            self._welcome(client)
            writer = asyncio.ensure_future(self._write(client))
            async for message in ws:
                if isinstance(message, str):
                    await self._on_text(client, message)
                else:
                    await self._on_binary(client, message)
        except self._connection_closed:
            pass
        finally:
            if writer is not None:
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writer
            self._forget(client)

    def _welcome(self, client: Client) -> None:
        """What a new client is sent after the advertisement (nothing by default)."""

    def _forget(self, client: Client) -> None:
        """A client's end: it is no longer sent anything."""
        self._clients.pop(client.number, None)

    async def _on_text(self, client: Client, text: str) -> None:
        raise NotImplementedError

    async def _on_binary(self, client: Client, data: bytes) -> None:
        raise NotImplementedError

    async def _tick(self) -> None:
        raise NotImplementedError

    async def _write(self, client: Client) -> None:
        """Write what is queued for a client, many whole frames per socket write."""
        ws = client.ws
        transport = ws.transport
        while True:
            await client.wake.wait()
            await asyncio.sleep(LINGER)
            client.wake.clear()
            # A client that reads slower than its messages come: let them gather
            # (the oldest dropped beyond BACKLOG) rather than fill the socket's buffer.
            while transport.get_write_buffer_size() > WRITE_LIMIT and ws.state is self._open:
                await asyncio.sleep(FLOW_WAIT)
            queue = client.take()
            if ws.state is not self._open:
                return
            parts: list[bytes] = []
            for head, data in queue:
                parts += (frame_header(len(head) + len(data)), head, data)
            transport.writelines(parts)

    async def _error(self, client: Client, text: str) -> None:
        """Tell a client (a status message) and the log, within the client's share."""
        if client.warn(text):
            await client.ws.send(json.dumps({"op": "status", "level": 2, "message": text}))
