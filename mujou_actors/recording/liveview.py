"""A live Foxglove view of a running net: a WebSocket server of Foxglove's protocol beside it.

``mujou.serve_foxglove(run)`` (``mujou run --foxglove``) serves Foxglove's
WebSocket protocol (``foxglove.sdk.v1``, and the older ``foxglove.websocket.v1``
that other clients offer) and advertises:

* a channel per port, topic its path (``"sim.state"``), JSON encoding, the
  JSON view of its messages (`mujou_actors.recording.view`: a JSON Schema, or
  ``foxglove.RawImage`` for an image port), each message at its send's time
  on the run's timer. A port's watch (``Run.watch``, with time) exists only
  while a client subscribes to its channel, and is cancelled when the last
  one leaves: a port nobody watches costs the senders nothing, and a watched
  one costs each send an append to the watch's queue (nothing is woken);
* ``/mujou/graph``: the net (nodes, their ports with type, shape and dtype,
  the connections) as JSON, sent to each new subscriber; and Foxglove's
  connection graph (each Output published by its node, read by its readers'
  nodes);
* the run's time (``Run.time_ns``, its timer's nanoseconds) every
  `TIME_EVERY` seconds;
* with ``allow_publish=True`` only, client publishing (JSON) to an Input's
  topic: each message becomes ``run.write(input, value)``, the JSON made the
  Input's declared type (`view.from_json`); what the Input refuses is logged
  and counted (`FoxgloveStats.refused`), never raised;
* the run's parameters (`mujou.Param`) in Foxglove's Parameters panel
  (capabilities ``parameters`` and ``parametersSubscribe``, offered when the
  net has parameters; `paramview`): each
  named by its dotted path, read with ``Run.params``; set (``Run.set_param``)
  with ``allow_params=True`` only, else refused with a status message.

Who may connect
---------------
A browser lets any web page open ``ws://127.0.0.1:PORT``, and sends the
page's origin in the handshake's ``Origin`` header; a native client (a Python
program) sends none, an app whose pages are local files (Electron's, as
Foxglove's desktop app) ``file://`` or ``null``. The server answers a handshake whose ``Origin`` is
not allowed (`DEFAULT_ORIGINS`, plus ``origins=``) with HTTP 403, counts it
and logs it (one line per `REFUSAL_LOG_EVERY` seconds at most). ``null``, the
origin of a sandboxed frame of *any* page (and of a local file in Firefox), is
not allowed unless named. Setting parameters is off by default (a
watcher reads them; a set is refused with a status message). Client
publishing is off by default: the
``clientPublish`` capability is not offered, and a client's advertisements and
messages are refused and counted. Each client keeps at most
`MAX_CLIENT_CHANNELS` advertised channels, `BACKLOG` queued messages and
`BACKLOG_BYTES` bytes, logs at most `WARNINGS_PER_CLIENT` warnings (then one
line with how many more), and what it kept goes when it disconnects; at most
`MAX_CLIENTS` are connected at once (HTTP 503 beyond). The server listens on
loopback unless ``allow_remote=True``.

Why a server of our own (on the ``websockets`` package) and not foxglove-sdk's
(Rust): the SDK's server has no hook on the HTTP upgrade (nothing can see the
``Origin``), no way to refuse or forget a client's advertisements, and no
disconnect event. A front door that checks the ``Origin`` and relays to an SDK
server on an internal port would leave that port to any page that scans
localhost, unless the internal link were TLS with a fresh certificate (key
generation, a relay thread pair per client, a frame parser to bound the
advertisements): more parts than the protocol subset a view needs (server
info, advertise, subscribe, message data, time, connection graph, client
advertise and publish, status). ``websockets`` does the HTTP handshake, the
``Origin`` header, the reading, pings and closing; the data messages that
gathered in up to `LINGER` are written as whole binary frames in one write
to the connection's transport (``websockets``' ``send`` would make a system
call and take some 18 us of the GIL per message), so that the loop thread
takes little of the GIL from the net. That write is below ``websockets``' API
(its ``transport``, ``state``; no compression negotiated, so a frame needs no
extension bits): hence the version range in setup.cfg.

The server uses only the host API of `Run`, the same for a run in one
process and a placed one: ``watch`` (with time), ``write``, ``time_ns``,
``running``, ``nodes`` and the ports by path. So a placed run is served as
one process is, from the host: a port of another group reaches the view
through the driver, as any host watch does, and a client's publish to an
Input of another group is a ``write`` that the driver carries to that group.
(One difference is the driver's: once a port was watched, its group goes on
copying its messages to the host after the last client left;
docs/recording.md, "A placed run, live".)

Threads: the senders only append each message of a watched port (a
reference, with its send's time) to the port's watch, a queue of at most
`WATCH_DEPTH` messages (the oldest dropped and counted, in
``run.stats().subscriptions``' ``watch_dropped``, and logged once a port);
the ``mujou-foxglove-take`` thread takes the watches every `FLUSH_S` while a
port is watched (it sleeps otherwise), makes each message's view there from
the message as sent (``take(copy=False)``: the view only reads it) and
queues it for each client that watches the port; the ``mujou-foxglove``
thread runs the server's asyncio loop (the handshakes, each client's
requests and writes, the time), and ends the server when the run ends; the
run's calls that may wait (``watch``, ``write``, ``params``, ``set_param``:
a placed run's wait for the round in progress) run on one
``mujou-foxglove-calls`` thread, so that a slow one holds up only the client
that asked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .._checks import is_int
from ..errors import describe
from ..host import Run, Watch
from ..ports import Input, Output
from .foxlog import LOG_SCHEMA, LOG_SCHEMA_NAME, LOG_TOPIC
from .logview import LogTap
from .paramview import CAPABILITIES, ParamPanel
from .view import Projection, from_json
from .wsserver import (
    CLIENT_DATA,
    DEFAULT_PORT,
    GRAPH_TOPIC,
    JOIN,
    MAX_CLIENT_CHANNELS,
    MESSAGE,
    TIME,
    TIME_EVERY,
    Client,
    SocketServer,
    parse_listen,
    parse_origins,
)

__all__ = ["FoxgloveServer", "FoxgloveStats", "serve_foxglove"]

log = logging.getLogger("mujou_actors")

FLUSH_S = 0.02
"""Wall seconds between two takes of the watched ports' queues.

Why a period and not a wakeup per message: the senders wake nothing, and the
``mujou-foxglove-take`` thread looks at the watches this often instead, so
that while a port is watched the view wakes and takes the GIL from the net 50
times a second, whatever the ports' rates (a subscription woke the host's
thread per message at a sensor's rate). Why 20 ms: a view then reaches a
client at most about 20 ms after its send (plus the time to make the views
and the writer's `wsserver.LINGER`), about one frame of a panel that redraws
at 60 Hz; as ``mujou echo``'s endpoint (`mujou_actors.endpoint.FLUSH_S`)."""

IDLE_S = 0.5
"""Wall seconds the ``mujou-foxglove-take`` thread sleeps when no port is watched.

It is woken at once by the first watch and by `FoxgloveServer.close`; this
bound only keeps its sleep finite."""

WATCH_DEPTH = 1024
"""The most messages a watched port's queue holds between two takes.

A second of slack for a 1 kHz port, 20 ms of a 51 kHz one; beyond, the
oldest are dropped (counted) and the net never waits for the view. As much
as a client's queue keeps (`wsserver.BACKLOG`)."""

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


def graph_of(run: Run) -> dict[str, Any]:
    """The net's graph as the ``/mujou/graph`` channel sends it.

    Args:
        run (Run): the run (a placed run's: the host's copy of the net).

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
    connections = [[path, reader.path] for path, port in run.ports.items()
                   if isinstance(port, Output) for reader in port._readers
                   if isinstance(reader, Input)]
    return {"time_ns": run.time_ns, "nodes": nodes, "connections": connections}


def _type_name(cls: Any) -> str:
    return f"{cls.__module__}:{cls.__qualname__}" if isinstance(cls, type) else str(cls)


@dataclasses.dataclass(frozen=True)
class FoxgloveStats:
    """What a live view has done so far (`FoxgloveServer.stats`).

    Attributes:
        clients (int): clients connected now.
        client_channels (int): channels the clients connected now advertise
            (at most `MAX_CLIENT_CHANNELS` each).
        published (int): client messages written to an Input.
        refused (int): client messages an Input refused (another type or
            shape, not JSON).
        publishes_dropped (int): client messages that reached no Input:
            publishing is off, or their channel was never advertised.
        advertisements_refused (int): client channels refused: publishing is
            off, the topic is no Input, the encoding is not JSON, the client
            has `MAX_CLIENT_CHANNELS` already.
        handshakes_refused (int): connections refused: an ``Origin`` not
            allowed (HTTP 403), `MAX_CLIENTS` connected (HTTP 503).
        dropped (int): messages not sent to a client that fell behind
            (its `BACKLOG`).
        params_set (int): parameter sets that Foxglove clients made
            (``Run.set_param`` accepted them).
        params_refused (int): parameter sets refused: setting is off, no such
            parameter, a read-only one, a value that breaks its rules.
    """

    clients: int
    client_channels: int
    published: int
    refused: int
    publishes_dropped: int
    advertisements_refused: int
    handshakes_refused: int
    dropped: int
    params_set: int
    params_refused: int


class FoxgloveServer(SocketServer):
    """A live Foxglove WebSocket view of one run; made by `serve_foxglove`.

    Use it as a context manager, or call `close`; it also closes itself when
    the run ends. What it serves is in the docs ("Viewing a run in Foxglove").
    """

    def __init__(self, run: Run, host: str, port: int, name: str, *,
                 allow_publish: bool, allow_params: bool,
                 origins: frozenset[str | None]) -> None:
        self._run = run
        self._allow_publish = allow_publish
        self._panel = ParamPanel(run, allow_params, self._call)
        self._lock = threading.Lock()  # the watchers and watches (close() is any thread's)
        self._ports = dict(run.ports)
        self._projections = {path: Projection.of(p) for path, p in self._ports.items()}
        self._watchers: dict[str, int] = {}  # topic -> clients subscribed
        self._subs: dict[str, Watch | LogTap] = {}  # a port's watch, or the log's tap
        # topic -> (client, subscription id) of each subscriber: replaced, never changed
        # in place, so that mujou-foxglove-take (and a LogTap's logging thread) reads it
        # without a lock.
        self._targets: dict[str, tuple[tuple[Client, int], ...]] = {}
        self._warned: set[str] = set()
        self._closing = False
        # Set to wake mujou-foxglove-take: a watch made (it may idle), or the end.
        self._wake = threading.Event()
        self._counts = dict.fromkeys(["published", "refused", "publishes_dropped",
                                      "advertisements_refused", "dropped"], 0)
        self._channel_ids = {path: i for i, path in enumerate([*self._ports, GRAPH_TOPIC,
                                                               LOG_TOPIC], 1)}
        self._topic_of = {i: path for path, i in self._channel_ids.items()}
        self._server_info = self._make_server_info(name)
        self._advertise = self._make_advertise()
        self._connection_graph = self._make_connection_graph()
        self._ops = {"subscribe": self._subscribe, "unsubscribe": self._unsubscribe,
                     "advertise": self._advertised, "unadvertise": self._unadvertised,
                     "subscribeConnectionGraph": self._graph_subscribe,
                     "unsubscribeConnectionGraph": self._graph_unsubscribe, **self._panel.ops}
        # Last: nothing above may leave a socket open.
        super().__init__(host, port, "serve_foxglove", origins)
        # The run's calls that may wait (a placed run's watch and write wait for the
        # round in progress on its driver's thread) run here, not on the loop: a long
        # round then holds up the client that asked, not every client's messages, the
        # time and the handshakes. One thread, so calls are carried out in the order they
        # were asked; each client awaits its call, so at most MAX_CLIENTS calls wait.
        self._calls = ThreadPoolExecutor(1, thread_name_prefix="mujou-foxglove-calls")
        # Made before either starts: the loop's end joins the taker.
        self._taker = threading.Thread(target=self._take_loop, name="mujou-foxglove-take",
                                       daemon=True)
        self._thread = threading.Thread(target=self._serve, name="mujou-foxglove", daemon=True)
        self._taker.start()
        self._thread.start()

    @property
    def published(self) -> int:
        """int: client messages written to an Input (`FoxgloveStats.published`)."""
        return self._counts["published"]

    @property
    def refused(self) -> int:
        """int: client messages an Input refused (`FoxgloveStats.refused`)."""
        return self._counts["refused"]

    def watched(self) -> list[str]:
        """The ports that a client watches now (each has a watch, `Run.watch`).

        Returns:
            list[str]: their paths, in the net's order.
        """
        with self._lock:
            return [p for p in self._ports if p in self._subs]

    def stats(self) -> FoxgloveStats:
        """What the view has done so far: clients, publishing, refusals, drops.

        Returns:
            FoxgloveStats: a frozen record.
        """
        clients = list(self._clients.values())
        counts = dict(self._counts, **self._panel.counts,
                      handshakes_refused=self._handshakes_refused)
        counts["dropped"] += sum(c.dropped for c in clients)
        return FoxgloveStats(clients=len(clients),
                             client_channels=sum(len(c.channels) for c in clients), **counts)

    # -- what every client is told ------------------------------------------------------
    def _make_server_info(self, name: str) -> str:
        capabilities = ["connectionGraph", "time"]
        if self._panel.names:  # a net without parameters: no Parameters panel to offer
            capabilities += CAPABILITIES
        info: dict[str, Any] = {"op": "serverInfo", "name": name,
                                "capabilities": capabilities,
                                "metadata": {"library": "mujou_actors"},
                                "sessionId": str(time.time_ns())}
        if self._allow_publish:
            capabilities.insert(0, "clientPublish")
            info["supportedEncodings"] = ["json"]
        return json.dumps(info)

    def _make_advertise(self) -> str:
        channels = []
        for path, projection in self._projections.items():
            p = self._ports[path]
            meta = {"kind": "output" if isinstance(p, Output) else "input",
                    "type": _type_name(p.type)}
            if p.shape is not None:
                meta["shape"] = json.dumps(list(p.shape))
            if p.dtype is not None:
                meta["dtype"] = str(p.dtype).removeprefix("torch.")
            channels.append({"id": self._channel_ids[path], "topic": path, "encoding": "json",
                             "schemaName": projection.schema_name,
                             "schemaEncoding": "jsonschema",
                             "schema": json.dumps(projection.schema), "metadata": meta})
        channels.append({"id": self._channel_ids[GRAPH_TOPIC], "topic": GRAPH_TOPIC,
                         "encoding": "json", "schemaName": "mujou.Graph",
                         "schemaEncoding": "jsonschema", "schema": json.dumps(_GRAPH_SCHEMA)})
        channels.append({"id": self._channel_ids[LOG_TOPIC], "topic": LOG_TOPIC,
                         "encoding": "json", "schemaName": LOG_SCHEMA_NAME,
                         "schemaEncoding": "jsonschema", "schema": json.dumps(LOG_SCHEMA)})
        return json.dumps({"op": "advertise", "channels": channels})

    def _make_connection_graph(self) -> str:
        published, subscribed = [], []
        for path, port in self._ports.items():
            owner = port.node._mujou_path or "<root>"
            if isinstance(port, Output):
                published.append({"name": path, "publisherIds": [owner]})
                readers = sorted({r.node._mujou_path or "<root>" for r in port._readers
                                  if isinstance(r, Input)})
                if readers:
                    subscribed.append({"name": path, "subscriberIds": readers})
            else:
                subscribed.append({"name": path, "subscriberIds": [owner]})
        return json.dumps({"op": "connectionGraphUpdate", "publishedTopics": published,
                           "subscribedTopics": subscribed, "advertisedServices": [],
                           "removedTopics": [], "removedServices": []})

    # -- the loop (mujou-foxglove) --------------------------------------------------------
    def _serve(self) -> None:
        """``mujou-foxglove``: the server's loop, until the run ends or `close`."""
        try:
            self._loop.run_until_complete(self._main())
        except Exception as exc:  # noqa: BLE001 - logged: the run goes on without its view
            log.warning("foxglove: the live view stopped: %s", describe(exc))
        finally:
            self._cancel_subscriptions()  # and wakes mujou-foxglove-take, which ends
            if self._taker.is_alive():
                self._taker.join(JOIN)
            # Not waited for: a call in progress ends with the run's own bound (a placed
            # run's call waits 60 s at most, and ends at once when the run ends).
            self._calls.shutdown(wait=False, cancel_futures=True)
            self._sock.close()
            self._loop.close()
            self._closed = True

    async def _tick(self) -> None:
        """The run's time to every client every `TIME_EVERY` s; the end when the run ends.

        The parameters' updates go meanwhile, on a task of their own (a look at
        a placed run's values waits for the driver: not the time's business).
        """
        run = self._run
        updates = asyncio.ensure_future(self._panel.poll())
        try:
            while True:
                await asyncio.sleep(TIME_EVERY)
                frame = TIME.pack(2, max(run.time_ns, 0))
                for client in list(self._clients.values()):
                    client.push(frame, b"")
                if not run.running:
                    self._stop.set()
                    return
        finally:
            updates.cancel()

    def _forget(self, client: Client) -> None:
        """A client's end: its unlogged warnings said; its subscriptions, channels and queue go.

        The warnings first: whoever sees the client gone from `stats` (a test, a
        monitor) finds its last line logged already.
        """
        if client.unlogged:
            log.warning("foxglove: client %d (origin %s): %d more warnings not logged",
                        client.number, client.origin or "none", client.unlogged)
        super()._forget(client)
        self._panel.forget(client)
        self._counts["dropped"] += client.dropped
        for topic in list(client.topics):
            self._leave(client, topic)
        client.channels.clear()
        client.take()

    # -- a client's requests --------------------------------------------------------------
    async def _on_text(self, client: Client, text: str) -> None:
        try:
            op = json.loads(text)
        except ValueError:
            op = None
        kind = op.get("op") if isinstance(op, dict) else None
        if not isinstance(kind, str):
            await self._error(client, "a text message that is no JSON object with an op")
            return
        handler = self._ops.get(kind)
        if handler is None:
            await self._error(client, f"an unsupported op {kind[:64]!r}")
            return
        try:
            await handler(client, op)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            await self._error(client, f"a bad {kind}: {describe(exc)}"[:512])

    async def _subscribe(self, client: Client, op: dict[str, Any]) -> None:
        bad = []
        for item in op["subscriptions"]:
            sub, channel = _uint(item, "id"), _uint(item, "channelId")
            topic = self._topic_of.get(channel)
            if topic is None or sub in client.subs or topic in client.topics:
                bad.append(channel)
                continue
            client.subs[sub], client.topics[topic] = topic, sub
            if topic == GRAPH_TOPIC:
                data = json.dumps(graph_of(self._run), allow_nan=False).encode()
                client.push(MESSAGE.pack(1, sub, max(self._run.time_ns, 0)), data)
            else:
                self._targets[topic] = (*self._targets.get(topic, ()), (client, sub))
                await self._call(self._watch, topic)
        if bad:
            await self._error(client, f"subscriptions refused (an unknown channel, or a "
                                      f"subscription id or channel taken): channels {bad[:8]}")

    async def _unsubscribe(self, client: Client, op: dict[str, Any]) -> None:
        for sub in op["subscriptionIds"]:
            topic = client.subs.get(sub)
            if topic is not None:
                self._leave(client, topic)

    async def _graph_subscribe(self, client: Client, op: dict[str, Any]) -> None:
        await client.ws.send(self._connection_graph)  # the graph never changes

    async def _graph_unsubscribe(self, client: Client, op: dict[str, Any]) -> None:
        """Nothing to do: no update follows the first."""

    async def _advertised(self, client: Client, op: dict[str, Any]) -> None:
        channels = op["channels"]
        if not isinstance(channels, list):
            raise TypeError("channels must be a list")
        if not self._allow_publish:
            self._counts["advertisements_refused"] += len(channels)
            await self._error(client, f"{len(channels)} channel(s) advertised to publish on, "
                                      "refused: publishing to Inputs is off "
                                      "(serve_foxglove(allow_publish=True), --foxglove-publish)")
            return
        refused = []
        for item in channels:
            channel, topic = _uint(item, "id"), item.get("topic")
            port = self._ports.get(topic) if isinstance(topic, str) else None
            if channel in client.channels:
                refused.append(f"{channel}: advertised already")
            elif not isinstance(port, Input):
                refused.append(f"{channel}: {str(topic)[:64]!r} is no Input of this run")
            elif item.get("encoding") != "json":
                refused.append(f"{channel}: the encoding must be 'json'")
            elif len(client.channels) >= MAX_CLIENT_CHANNELS:
                refused.append(f"{channel}: at most {MAX_CLIENT_CHANNELS} channels a client")
            else:
                client.channels[channel] = port
        if refused:
            self._counts["advertisements_refused"] += len(refused)
            inputs = [p for p, port in self._ports.items() if isinstance(port, Input)]
            await self._error(client, f"{len(refused)} channel(s) refused ({'; '.join(refused[:3])}"
                                      f"{'; ...' if len(refused) > 3 else ''}); the Inputs: "
                                      f"{', '.join(inputs[:16]) or 'none'}")

    async def _unadvertised(self, client: Client, op: dict[str, Any]) -> None:
        for channel in op["channelIds"]:
            client.channels.pop(channel, None)

    async def _on_binary(self, client: Client, data: bytes) -> None:
        """A client's message data: ``run.write`` to its Input, or refused and counted."""
        if len(data) < CLIENT_DATA.size or data[0] != 1:
            await self._error(client, "an unsupported binary message")
            return
        if not self._allow_publish:
            self._counts["publishes_dropped"] += 1
            await self._error(client, "a message published, dropped: publishing to Inputs is "
                                      "off (serve_foxglove(allow_publish=True), "
                                      "--foxglove-publish)")
            return
        channel = CLIENT_DATA.unpack_from(data)[1]
        port = client.channels.get(channel)
        if port is None:
            self._counts["publishes_dropped"] += 1
            await self._error(client, f"a message on channel {channel}, which it did not "
                                      "advertise: dropped")
            return
        try:
            value = from_json(json.loads(data[CLIENT_DATA.size:]), port.type, port.shape,
                              port.dtype)
            await self._call(self._run.write, port, value)
        except Exception as exc:  # noqa: BLE001 - a client's bad message never stops anything
            self._counts["refused"] += 1
            await self._error(client, f"a message published to {port.path} was refused: "
                                      f"{describe(exc)}"[:512])
            return
        self._counts["published"] += 1

    # -- the ports' watches ------------------------------------------------------------------
    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the ``mujou-foxglove-calls`` thread; its result, once done."""
        return await self._loop.run_in_executor(self._calls, fn, *args)

    def _watch(self, topic: str) -> None:
        """One more client watches a port: watch it (`Run.watch`) if it is the first.

        On ``mujou-foxglove-calls`` (a placed run's watch waits for the driver,
        and is refused from a hook: this thread is none); a client's end or
        `close` may come meanwhile (on the loop, or any thread): what they
        changed is looked at again after the watch is made.
        """
        with self._lock:
            n = self._watchers.get(topic, 0) + 1
            self._watchers[topic] = n
            if n > 1 or self._closing:
                return
        # Outside the lock: in a placed run, watching waits for the driver's round in
        # progress.
        sub: Any
        if topic == LOG_TOPIC:  # the log: a handler on the root logger, while watched
            # (a placed run's driver hands it its groups' records too: logview.forward)
            sub = LogTap(self._log_sender(), lambda: self._run.time_ns)
            sub.attach()
        else:
            try:
                sub = self._run.watch(topic, depth=WATCH_DEPTH, with_time=True)
            except Exception as exc:  # noqa: BLE001 - the run has ended: nothing to send
                log.debug("foxglove: no watch of %s: %s", topic, describe(exc))
                return
        with self._lock:
            keep = self._watchers.get(topic, 0) > 0 and not self._closing \
                and topic not in self._subs
            if keep:
                self._subs[topic] = sub
        if not keep:
            sub.cancel()
        elif isinstance(sub, Watch):
            self._wake.set()  # mujou-foxglove-take may be idle: it takes from now on

    def _leave(self, client: Client, topic: str) -> None:
        """A client stops watching a port: cancel its watch if it was the last."""
        sub_id = client.topics.pop(topic)
        client.subs.pop(sub_id, None)
        if topic == GRAPH_TOPIC:
            return
        self._targets[topic] = tuple(t for t in self._targets.get(topic, ()) if t[0] is not client)
        with self._lock:
            n = self._watchers.get(topic, 0) - 1
            if n > 0:
                self._watchers[topic] = n
                return
            self._watchers.pop(topic, None)
            sub = self._subs.pop(topic, None)
        if sub is not None:
            sub.cancel()

    def _take_loop(self) -> None:
        """``mujou-foxglove-take``: the watches taken every `FLUSH_S`, until the end.

        It sleeps on an event: `IDLE_S` at a time while no port is watched
        (the first watch wakes it), `FLUSH_S` while one is; the end
        (`_cancel_subscriptions`) wakes it, and it returns.
        """
        wake = self._wake
        watches: list[tuple[str, Watch]] = []
        try:
            while True:
                wake.wait(FLUSH_S if watches else IDLE_S)
                wake.clear()  # before the look at _closing: a later set is not lost
                if self._closing:
                    return
                with self._lock:
                    watches = [(topic, sub) for topic, sub in self._subs.items()
                               if isinstance(sub, Watch)]
                if watches and not self._take(watches):
                    return
        except Exception as exc:  # noqa: BLE001 - logged: the run goes on without its views
            log.warning("foxglove: the live view stopped taking the ports' messages: %s",
                        describe(exc))

    def _take(self, watches: list[tuple[str, Watch]]) -> bool:
        """Each watch's queued messages, their views made, to each of its port's watchers.

        Each message is stamped with its send's time (ns of the run's timer; 0 for
        ``on_start``'s), as a recording's: not the time it was taken. Within a
        port the messages go in the order they were sent. A view that cannot be
        made is skipped and warned about, once a port; so is the first time a
        port's watch dropped messages (its queue was full).

        Returns:
            bool: False once the server's loop has ended (nobody to send to).
        """
        targets = self._targets
        for topic, watch in watches:
            # The message as sent, shared with the net's readers (a CUDA one brought to
            # the CPU once its GPU work is done; a placed run's as it came): the view
            # only reads it, so no copy is made.
            try:
                items = watch.take(copy=False)
            except Exception as exc:  # noqa: BLE001 - a view never fails the run
                self._warn(topic, f"foxglove: the messages of {topic} cannot be taken "
                                  f"({describe(exc)})")
                continue
            if not items:
                continue
            drops = f"{topic} dropped"
            if drops not in self._warned and watch.dropped:
                self._warn(drops, f"foxglove: the live view falls behind the messages of "
                                  f"{topic}: dropping the oldest beyond {WATCH_DEPTH} (counted "
                                  f"in run.stats().subscriptions[{topic!r}].watch_dropped)")
            watchers = targets.get(topic)
            if not watchers:
                continue
            encode = self._projections[topic].encode
            for t_ns, message in items:
                t = max(t_ns, 0)
                try:
                    data = encode(message, t)
                except Exception as exc:  # noqa: BLE001 - a view never fails the run
                    self._warn(topic, f"foxglove: the view of a message of {topic} cannot "
                                      f"be made ({describe(exc)})")
                    continue
                try:
                    for client, sub in watchers:
                        client.push(MESSAGE.pack(1, sub, t), data)
                except RuntimeError:  # the server's loop has ended: nobody to send to
                    return False
        return True

    def _log_sender(self) -> Callable[[dict[str, Any]], None]:
        """The `LogTap`'s delivery (on the thread that logged): the entry to each watcher."""
        targets = self._targets

        def send(entry: dict[str, Any]) -> None:
            watchers = targets.get(LOG_TOPIC)
            if not watchers:
                return
            data = json.dumps(entry).encode()
            t = entry["timestamp"]["sec"] * 1_000_000_000 + entry["timestamp"]["nsec"]
            for client, sub in watchers:
                client.push(MESSAGE.pack(1, sub, t), data)  # RuntimeError: the loop ended

        return send

    def _warn(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(text)

    # -- the end --------------------------------------------------------------------------
    def _cancel_subscriptions(self) -> None:
        """Cancel the ports' watches and the log's tap (once); wake mujou-foxglove-take to end."""
        with self._lock:
            self._closing = True
            subs = list(self._subs.values())
            self._subs.clear()
            self._watchers.clear()
        self._wake.set()
        for sub in subs:
            sub.cancel()

    def close(self) -> None:
        """Stop the server: no port left open, no thread left (bounded waits); idempotent."""
        self._cancel_subscriptions()
        self._stop_serving(self._thread, self._taker)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"port {self.port}"
        return f"<FoxgloveServer {state} {len(self._ports)} ports>"


def _uint(item: Any, key: str) -> int:
    """A protocol's uint32 field of a JSON object."""
    value = item[key]
    if not is_int(value) or not 0 <= value < 1 << 32:
        raise ValueError(f"{key} must be an integer 0 to 2**32-1, got {str(value)[:32]!r}")
    return int(value)


def serve_foxglove(run: Run, listen: int | str = DEFAULT_PORT, *,
                   allow_remote: bool = False, allow_publish: bool = False,
                   allow_params: bool = False, origins: Iterable[str] = (),
                   name: str = "mujou") -> FoxgloveServer:
    """Serve a live Foxglove view of a running net over WebSocket.

    Open ``ws://127.0.0.1:8765`` in Foxglove (Open connection, Foxglove
    WebSocket). Every port is a channel (topic its path, the JSON view of
    its messages); ``/mujou/graph`` is the net; the run's time goes out a
    few times a second; with ``allow_publish=True``, a client that publishes
    JSON to an Input's topic writes to it (``Run.write``). A port costs its
    senders something only while a client watches it (in a placed run: from
    the first time a client watches it on, docs/recording.md): each send
    appends the message to the port's `Run.watch`, which the server takes
    every `FLUSH_S` to make the views. The nodes'
    parameters are Foxglove's parameters (the Parameters panel), named by
    their dotted paths: read by any client, set (``Run.set_param``) only with
    ``allow_params=True``.

    A placed run (``placement=``) is served from the host as one process is,
    through the same host API: every port of every group is a channel, and a
    publish to an Input of another group is a ``write`` that reaches that
    group.

    A web page in a browser may open a WebSocket to any port of this machine:
    the server refuses (HTTP 403) a handshake whose ``Origin`` is not allowed:
    by default none (a native client), ``https://app.foxglove.dev`` and
    ``file://`` (`DEFAULT_ORIGINS`).

    The server stops when the run ends, or at `FoxgloveServer.close`
    (leaving a ``with`` block).

    Args:
        run (Run): a running run: of this process, or placed
            (``placement=``; this process is its host).
        listen (int | str): the port on 127.0.0.1, or ``":PORT"``, or
            ``"HOST:PORT"``; 0 takes a free port (`FoxgloveServer.port`).
            Default: 8765.
        allow_remote (bool): let ``listen`` be an address off loopback. Anyone
            who reaches it reads every port (and, with ``allow_publish``,
            writes to every Input; with ``allow_params``, sets every
            parameter): a trusted network only. Default: False.
        allow_publish (bool): let clients publish to the Inputs (Foxglove's
            ``clientPublish``): each message a ``Run.write``. Default: False.
        allow_params (bool): let clients set the nodes' parameters (Foxglove's
            ``setParameters``): each a ``Run.set_param``. Off, a set is
            refused with a status message and changes nothing. Default: False.
        origins (Iterable[str]): ``Origin`` headers allowed besides the
            defaults: ``"SCHEME://HOST[:PORT]"`` of a web app that may
            connect (a self-hosted Foxglove: ``"http://localhost:8080"``), or
            ``"null"`` (a local page in Firefox; but also a sandboxed frame of
            any page). Default: none.
        name (str): the server's name, as Foxglove shows it. Default: ``"mujou"``.

    Returns:
        FoxgloveServer: the server (a context manager).

    Raises:
        ImportError: websockets is not installed (the message says what to install).
        TypeError: ``run`` is not a `Run`, or a bad
            ``allow_remote``, ``allow_publish``, ``allow_params`` or ``origins``.
        ValueError: a bad ``listen``, or one off loopback without
            ``allow_remote``; an origin that is none.
        NotRunningError: the run has ended.
        RuntimeError: the server could not listen (the port is taken).
    """
    from ..errors import NotRunningError

    if not isinstance(run, Run):
        raise TypeError(f"serve_foxglove: run must be what mujou.run returned (a Run), "
                        f"got {type(run).__name__}")
    for flag, value in (("allow_remote", allow_remote), ("allow_publish", allow_publish),
                        ("allow_params", allow_params)):
        if type(value) is not bool:
            raise TypeError(f"serve_foxglove: {flag} must be a bool, got {value!r}")
    host, port = parse_listen(listen, allow_remote)
    allowed = parse_origins(origins)
    if not run.running:
        raise NotRunningError("serve_foxglove: the run has ended")
    return FoxgloveServer(run, host, port, str(name), allow_publish=allow_publish,
                          allow_params=allow_params, origins=allowed)
