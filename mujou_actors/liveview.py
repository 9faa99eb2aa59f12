"""A live Foxglove view of a running net: a WebSocket server (foxglove-sdk) beside the run.

``mujou.serve_foxglove(run)`` (``mujou run --foxglove``) starts Foxglove's
WebSocket server (the ``foxglove-sdk`` package, a dependency: its MCAP
writer writes the recordings) and advertises:

* a channel per port, topic its path (``"sim.state"``), JSON encoding, the
  JSON view of its messages (`mujou_actors.view`: a JSON Schema, or
  ``foxglove.RawImage`` for an image port), each message at its send's time
  on the run's timer. A port's subscription (``Run.subscribe``, with time)
  exists only while a client subscribes to its channel, and is cancelled
  when the last one leaves: a port nobody watches costs the senders nothing;
* ``/mujou/graph``: the net (nodes, their ports with type, shape and dtype,
  the connections) as JSON, sent to each new subscriber; and Foxglove's
  connection graph (each Output published by its node, read by its readers'
  nodes);
* the run's time (``Run.time_ns``, its timer's nanoseconds) every
  `TIME_EVERY` seconds;
* client publishing (JSON) to an Input's topic: each message becomes
  ``run.write(input, value)``, the JSON made the Input's declared type
  (`view.from_json`); what the Input refuses is logged as a warning naming
  the port and counted (`FoxgloveServer.refused`), never raised.

The callbacks that send the views run on the run's ``mujou-host`` thread; the
time goes out from the ``mujou-foxglove`` thread, which also stops the server
when the run ends.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
from typing import TYPE_CHECKING, Any

from ._checks import is_int
from .errors import describe
from .ports import Input, Output
from .view import Projection, from_json

if TYPE_CHECKING:
    from .host import Subscription
    from .run import Run

__all__ = ["FoxgloveServer", "serve_foxglove"]

log = logging.getLogger("mujou_actors")

DEFAULT_PORT = 8765
"""The port ``mujou run --foxglove`` listens on without one (Foxglove's default)."""

TIME_EVERY = 0.2
"""Wall seconds between two broadcasts of the run's time."""

GRAPH_TOPIC = "/mujou/graph"
"""The topic of the net's graph (nodes, ports, connections)."""

_JOIN = 2.0  # wall seconds close() waits for the mujou-foxglove thread
_GRAPH_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "mujou.Graph",
    "type": "object",
    "properties": {
        "time_ns": {"type": "integer"},
        "nodes": {"type": "array", "items": {"type": "object", "properties": {
            "path": {"type": "string"}, "class": {"type": "string"},
            "ports": {"type": "array"}}}},
        "connections": {"type": "array", "items": {"type": "array",
                                                   "items": {"type": "string"}}},
    },
}


def _sdk() -> Any:
    """The ``foxglove`` package, or an ImportError that says what to install."""
    try:
        import foxglove
    except ImportError as exc:
        raise ImportError("the live Foxglove view needs the foxglove-sdk package: "
                          "pip install 'mujou_actors[view]' (or foxglove-sdk>=0.30.3)") from exc
    return foxglove


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
    if not allow_remote and not _is_loopback(host):
        raise ValueError(f"serve_foxglove: {host!r} is not a loopback address; the view "
                         "exposes every port's messages and lets a client write to every "
                         "Input: pass allow_remote=True (--allow-remote) on a trusted "
                         "network only")
    return host, int(port_text)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name or "0.0.0.0"'s like: maybe not loopback
        return False


def graph_of(run: Run) -> dict[str, Any]:
    """The net's graph as the ``/mujou/graph`` channel sends it.

    Args:
        run (Run): the run.

    Returns:
        dict: ``{"time_ns", "nodes": [{"path", "class", "ports": [{"name",
        "path", "kind", "type", "shape", "dtype"}]}], "connections": [[output
        path, input path]]}``.
    """
    nodes = []
    for path, node in run.nodes.items():
        ports = []
        for name, port in node._mujou_ports().items():
            ports.append({"name": name, "path": port.path,
                          "kind": "output" if isinstance(port, Output) else "input",
                          "type": _type_name(port.type),
                          "shape": None if port.shape is None else list(port.shape),
                          "dtype": (None if port.dtype is None
                                    else str(port.dtype).removeprefix("torch."))})
        nodes.append({"path": path, "class": _type_name(type(node)), "ports": ports})
    connections = [[path, reader.path] for path, port in run._ports.items()
                   if isinstance(port, Output) for reader in port._readers
                   if isinstance(reader, Input)]
    return {"time_ns": run.time_ns, "nodes": nodes, "connections": connections}


def _type_name(cls: Any) -> str:
    return f"{cls.__module__}:{cls.__qualname__}" if isinstance(cls, type) else str(cls)


class FoxgloveServer:
    """A live Foxglove WebSocket view of one run; made by `serve_foxglove`.

    Use it as a context manager, or call `close`; it also closes itself when
    the run ends. What it serves is in the docs ("Viewing a run in Foxglove").
    """

    def __init__(self, run: Run, host: str, port: int, name: str) -> None:
        foxglove = _sdk()
        from foxglove.websocket import Capability

        self._run = run
        self._lock = threading.Lock()  # the watchers and client channels below
        self._ports = dict(run._ports)
        self._projections = {path: Projection.of(p) for path, p in self._ports.items()}
        self._watchers: dict[str, int] = {}  # topic -> clients subscribed
        self._subs: dict[str, Subscription] = {}
        self._client_topics: dict[tuple[int, int], str] = {}  # (client, channel) -> topic
        self._warned: set[str] = set()
        self._closed = False
        self.published = 0
        self.refused = 0
        self._context = foxglove.Context()
        self._channels: dict[str, Any] = {}
        for path, projection in self._projections.items():
            p = self._ports[path]
            meta = {"kind": "output" if isinstance(p, Output) else "input",
                    "type": _type_name(p.type)}
            if p.shape is not None:
                meta["shape"] = json.dumps(list(p.shape))
            if p.dtype is not None:
                meta["dtype"] = str(p.dtype).removeprefix("torch.")
            # The context's own constructor (as mcapfile.Writer): a foxglove.Channel
            # would stay in the SDK's module-level table for the process's life.
            self._channels[path] = self._context._create_channel(
                path, schema=foxglove.Schema(name=projection.schema_name, encoding="jsonschema",
                                             data=json.dumps(projection.schema).encode()),
                message_encoding="json", metadata=meta)
        self._graph = self._context._create_channel(
            GRAPH_TOPIC, schema=foxglove.Schema(name="mujou.Graph", encoding="jsonschema",
                                                data=json.dumps(_GRAPH_SCHEMA).encode()),
            message_encoding="json")
        try:
            self._server = foxglove.start_server(
                name=name, host=host, port=port, context=self._context,
                capabilities=[Capability.ClientPublish, Capability.ConnectionGraph,
                              Capability.Time],
                supported_encodings=["json"], server_listener=_Listener(self))
        except Exception as exc:
            self._close_channels()
            raise RuntimeError(f"serve_foxglove: cannot listen on {host}:{port} "
                               f"({describe(exc)})") from exc
        self._publish_connection_graph(foxglove)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="mujou-foxglove", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        """int: the port the server listens on (the one taken, for port 0)."""
        return int(self._server.port)

    @property
    def closed(self) -> bool:
        """bool: True once the server is stopped."""
        return self._closed

    def watched(self) -> list[str]:
        """The ports that a client watches now (each has a subscription).

        Returns:
            list[str]: their paths, in the net's order.
        """
        with self._lock:
            return [p for p in self._ports if p in self._subs]

    # -- the server's callbacks (its own threads) ---------------------------------------
    def _subscribed(self, topic: str) -> None:
        if topic == GRAPH_TOPIC:
            self._send_graph()
            return
        if topic not in self._ports:
            return
        with self._lock:
            n = self._watchers.get(topic, 0) + 1
            self._watchers[topic] = n
            if n > 1 or self._closed:
                return
        # Outside the lock: subscribing may start the mujou-host thread (a wait for it).
        try:
            sub = self._run.subscribe(topic, self._sender(topic), with_time=True)
        except Exception as exc:  # noqa: BLE001 - the run has ended: nothing to send
            log.debug("foxglove: no subscription to %s: %s", topic, describe(exc))
            return
        with self._lock:
            # Still watched, and no subscription made meanwhile by a later first watcher.
            keep = self._watchers.get(topic, 0) > 0 and not self._closed \
                and topic not in self._subs
            if keep:
                self._subs[topic] = sub
        if not keep:
            sub.cancel()

    def _unsubscribed(self, topic: str) -> None:
        with self._lock:
            n = self._watchers.get(topic, 0) - 1
            if n > 0:
                self._watchers[topic] = n
                return
            self._watchers.pop(topic, None)
            sub = self._subs.pop(topic, None)
        if sub is not None:
            sub.cancel()

    def _sender(self, topic: str) -> Any:
        """The callback of a watched port (on ``mujou-host``): its view to the channel.

        Each message is logged at its send's time (ns of the run's timer; 0 for
        ``on_start``'s), as a recording's: not the time the host passed it on.
        """
        channel = self._channels[topic]
        encode = self._projections[topic].encode

        def send(t_ns: int, message: Any) -> None:
            t = max(t_ns, 0)
            try:
                data = encode(message, t)
            except Exception as exc:  # noqa: BLE001 - a view never fails the run
                self._warn(topic, f"foxglove: the view of a message of {topic} cannot be "
                                  f"made ({describe(exc)})")
                return
            channel.log(data, t, None)

        return send

    def _advertised(self, client: int, channel: int, topic: str) -> None:
        if not isinstance(self._ports.get(topic), Input):
            inputs = [p for p, port in self._ports.items() if isinstance(port, Input)]
            self._warn(topic, f"foxglove: a client publishes to {topic!r}, which is no Input "
                              f"of this run (Inputs: {', '.join(inputs) or 'none'}); its "
                              "messages are ignored")
        with self._lock:
            self._client_topics[(client, channel)] = topic

    def _unadvertised(self, client: int, channel: int) -> None:
        with self._lock:
            self._client_topics.pop((client, channel), None)

    def _message(self, client: int, channel: int, data: bytes) -> None:
        """A client's message: ``run.write`` to its Input, or a warning naming the port."""
        with self._lock:
            topic = self._client_topics.get((client, channel))
        port = self._ports.get(topic or "")
        if not isinstance(port, Input):
            return  # warned at its advertise
        try:
            value = from_json(json.loads(data), port.type, port.shape, port.dtype)
            self._run.write(port, value)
        except Exception as exc:  # noqa: BLE001 - a client's bad message never stops anything
            self.refused += 1
            log.warning("foxglove: a message published to %s was refused: %s", topic,
                        describe(exc))
            return
        self.published += 1

    # -- the graph and the time ---------------------------------------------------------
    def _send_graph(self) -> None:
        data = json.dumps(graph_of(self._run), allow_nan=False).encode()
        self._graph.log(data, max(self._run.time_ns, 0), None)

    def _publish_connection_graph(self, foxglove: Any) -> None:
        graph = foxglove.ConnectionGraph()
        for path, port in self._ports.items():
            owner = port.node._mujou_path or "<root>"
            if isinstance(port, Output):
                graph.set_published_topic(path, [owner])
                readers = sorted({r.node._mujou_path or "<root>" for r in port._readers
                                  if isinstance(r, Input)})
                if readers:
                    graph.set_subscribed_topic(path, readers)
            else:
                graph.set_subscribed_topic(path, [owner])
        self._server.publish_connection_graph(graph)

    def _serve(self) -> None:
        """``mujou-foxglove``: the time every `TIME_EVERY` s; the end when the run ends."""
        run = self._run
        while not self._stop.wait(TIME_EVERY):
            self._server.broadcast_time(max(run.time_ns, 0))
            if not run.running:
                break
        self._shutdown()

    def _warn(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(text)

    # -- the end --------------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Cancel the subscriptions, stop the server, close the channels (once)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            subs = list(self._subs.values())
            self._subs.clear()
            self._watchers.clear()
        for sub in subs:
            sub.cancel()
        self._server.stop()
        self._close_channels()

    def _close_channels(self) -> None:
        """Close this server's channels (made by its context: nothing else keeps them)."""
        for channel in [*self._channels.values(), self._graph]:
            channel.close()

    def close(self) -> None:
        """Stop the server: no port left open, no thread left (bounded waits); idempotent."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(_JOIN)
        self._shutdown()

    def __enter__(self) -> FoxgloveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"port {self.port}"
        return f"<FoxgloveServer {state} {len(self._ports)} ports>"


class _Listener:
    """The foxglove-sdk server's listener: hands each event to the `FoxgloveServer`."""

    def __init__(self, view: FoxgloveServer) -> None:
        self._view = view

    def on_subscribe(self, client: Any, channel: Any) -> None:
        self._view._subscribed(channel.topic)

    def on_unsubscribe(self, client: Any, channel: Any) -> None:
        self._view._unsubscribed(channel.topic)

    def on_client_advertise(self, client: Any, channel: Any) -> None:
        self._view._advertised(client.id, channel.id, channel.topic)

    def on_client_unadvertise(self, client: Any, client_channel_id: int) -> None:
        self._view._unadvertised(client.id, client_channel_id)

    def on_message_data(self, client: Any, client_channel_id: int, data: bytes) -> None:
        self._view._message(client.id, client_channel_id, data)

    def on_connection_graph_subscribe(self) -> None:
        """Nothing to do: the SDK sends the graph published at the start."""

    def on_connection_graph_unsubscribe(self) -> None:
        """Nothing to do."""


def serve_foxglove(run: Run, listen: int | str = DEFAULT_PORT, *, allow_remote: bool = False,
                   name: str = "mujou") -> FoxgloveServer:
    """Serve a live Foxglove view of a running net over WebSocket.

    Open ``ws://127.0.0.1:8765`` in Foxglove (Open connection, Foxglove
    WebSocket). Every port is a channel (topic its path, the JSON view of
    its messages); ``/mujou/graph`` is the net; the run's time goes out a
    few times a second; a client that publishes JSON to an Input's topic
    writes to it (``Run.write``). A port costs its senders something only
    while a client watches it. Runs on the ``foxglove-sdk`` package (a
    dependency of mujou_actors).

    The server stops when the run ends, or at `FoxgloveServer.close`
    (leaving a ``with`` block).

    Args:
        run (Run): a running run in this process (a placed run, with
            ``placement=``, is refused).
        listen (int | str): the port on 127.0.0.1, or ``":PORT"``, or
            ``"HOST:PORT"``; 0 takes a free port (`FoxgloveServer.port`).
            Default: 8765.
        allow_remote (bool): let ``listen`` be an address off loopback. Anyone
            who reaches it reads every port and writes to every Input: a
            trusted network only. Default: False.
        name (str): the server's name, as Foxglove shows it. Default: ``"mujou"``.

    Returns:
        FoxgloveServer: the server (a context manager).

    Raises:
        ImportError: foxglove-sdk is not installed (the message says what to install).
        TypeError: ``run`` is not a `Run` of this process (a placed run).
        ValueError: a bad ``listen``, or one off loopback without ``allow_remote``.
        NotRunningError: the run has ended.
        RuntimeError: the server could not listen (the port is taken).
    """
    from .errors import NotRunningError
    from .run import Run

    if not isinstance(run, Run):
        raise TypeError(f"serve_foxglove: run must be a mujou.Run of this process, got "
                        f"{type(run).__name__} (a placed run, placement=, is not supported: "
                        "docs/recording.md, 'Viewing a run in Foxglove')")
    if type(allow_remote) is not bool:
        raise TypeError(f"serve_foxglove: allow_remote must be a bool, got {allow_remote!r}")
    host, port = parse_listen(listen, allow_remote)
    if not run.running:
        raise NotRunningError("serve_foxglove: the run has ended")
    return FoxgloveServer(run, host, port, str(name))
