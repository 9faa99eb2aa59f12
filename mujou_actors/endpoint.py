"""Every run's local endpoint: the run's side of ``mujou ls``, ``echo``, ``hz``, ``top``...

`open_endpoint` (called by `mujou.run` once the run has started) opens the
run's Unix socket and facts file in the runtime folder, and the
``mujou-attach`` thread answers each connection through the `Run` API only.
Where the files are, who may connect and how frames are made is
`mujou_actors.attach`, which the clients use.

Cost. Unwatched, the endpoint is one thread (``mujou-attach``) that waits on
its sockets and looks whether the run still goes every `IDLE_S`; no port is
watched. A watched port has a `Run.watch` only while a client watches it
(cancelled when that client goes): on the sending thread, that appends a
reference to the message (or, for ``hz``, only its send time) to the watch's
bounded queue (at most ``depth``: the oldest dropped, counted) and wakes
nothing. The ``mujou-attach`` thread takes the queues every `FLUSH_S` (sooner
while a queue fills past half, down to `MIN_FLUSH_S`), on its own schedule,
makes each message's view there from the message as sent (``view.project``:
tensors summarised; ``full``: every value; ``stamps``: only the send's time,
for ``hz``), without a copy, and writes it. A batch
of plain tensors of one dtype and shape (a sensor's port) goes instead as
one ``column`` (`columns`): the tensors stacked, their raw bytes sent, the
views made by the watcher (`attach.column_items`), so the watched process
pays a stack and a copy per batch rather than a view per message. A client
that reads slower than the port sends has at most `OUT_LIMIT` bytes waiting
for it: beyond that its queue is not taken, so the oldest messages are
dropped on the run's side (counted and reported with each batch), and the
net never waits for a watcher.

Parameters. ``params`` answers `Run.describe_params` (or one parameter's);
``set_param`` takes a value's text, parses it here by the parameter's type
(`Param.parse`, as ``mujou run --param`` does) and sets it with
`Run.set_param`. A set is refused (no such parameter, a read-only one, a text
that is no value of its type or breaks its rules) with the `ParamError`'s
words and ``"refused": True``, so the client can tell the user's mistake from
a run that went away. Whoever may connect (this user's processes only) may
set; ``MUJOU_ATTACH=0`` opens no endpoint at all.
"""

from __future__ import annotations

import atexit
import dataclasses
import difflib
import inspect
import json
import logging
import os
import secrets
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import msgpack
import torch

from .attach import (
    COLUMN_CODES,
    COLUMN_ELEMENTS,
    COLUMN_RANK,
    LENGTH,
    MAX_FRAME,
    MAX_REQUEST,
    PROTOCOL,
    cells,
    enabled,
    frame,
    runtime_dir,
    unpack,
)
from .errors import AttachError, ParamError, describe
from .host import Run, Watch
from .params import RunParams, join
from .ports import Input, Output, Port
from .recording.view import MAX_ELEMENTS, finite, project

__all__: list[str] = []  # nothing public: mujou.run opens it

log = logging.getLogger("mujou_actors")


VIEW_DEPTH = 64
"""The default bound of an ``echo`` watch's queue, messages (a person reads them)."""


_MODES = ("view", "full", "stamps")


IDLE_S = 0.25
"""Wall seconds between two looks at whether the run still goes, when nothing is watched."""


FLUSH_S = 0.1
"""The longest wall seconds between two takes of the watched ports' queues.

Each take wakes the ``mujou-attach`` thread, whose fixed cost (a cold cache:
about 100 us of CPU in the main job) is most of what a watcher costs the
watched process; a person reads a batch every 0.1 s as live. A watch whose
queue is more than half full at a take is taken sooner next time (down to
`MIN_FLUSH_S`), so a fast port does not lose messages to a slow take.
"""


MIN_FLUSH_S = 0.01
"""The shortest wall seconds between two takes (a port that fills its queue this fast loses)."""


OUT_LIMIT = 1024 * 1024
"""Bytes written to a client and not yet read by it beyond which its queue is left to drop."""


STAMP_DEPTH = 65536
"""The default bound of an ``hz`` watch's queue, send times."""


MAX_DEPTH = 1 << 20
"""The largest ``depth`` a client may ask for."""


MAX_CLIENTS = 32
"""Connections served at once; more are closed as they come."""


MAX_FULL_ELEMENTS = 1 << 20
"""The most elements of a tensor that ``full`` sends the values of (else statistics)."""


def _type_name(cls: Any) -> str:
    if not isinstance(cls, type):
        return str(cls)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def node_rows(run: Run) -> list[dict[str, Any]]:
    """The ``nodes`` answer: each node's path, class, period, group and port names.

    Args:
        run (Run): the run (a placed run's: the host's copies of the nodes).

    Returns:
        list[dict]: ``{"path", "class", "period" (seconds or None), "group",
        "inputs", "outputs"}`` per node, parents first.
    """
    group_of = {path: name for name, paths in run.groups.items() for path in paths}
    rows = []
    for path, node in run.nodes.items():
        ports = node._mujou_ports()
        rows.append({"path": path, "class": _type_name(type(node)), "period": node.period,
                     "group": group_of.get(path, "host"),
                     "inputs": [n for n, p in ports.items() if isinstance(p, Input)],
                     "outputs": [n for n, p in ports.items() if isinstance(p, Output)]})
    return rows


def port_row(port: Port) -> dict[str, Any]:
    """One port as the ``ports`` answer has it.

    Returns:
        dict: ``{"path", "node", "name", "direction" ("in"/"out"), "type",
        "shape", "dtype", "connections" (the other ends' paths), "depth"
        (an Input's QoS depth, None: unbounded; None for an Output),
        "trigger"}``.
    """
    if isinstance(port, Output):
        direction, ends = "out", [r.path for r in port._readers if isinstance(r, Input)]
        depth, trigger = None, None
    else:
        assert isinstance(port, Input)
        direction, ends = "in", [s.path for s in port._sources]
        depth, trigger = port.depth, port.trigger
    return {"path": port.path, "node": port.node._mujou_path, "name": port.name,
            "direction": direction, "type": _type_name(port.type),
            "shape": None if port.shape is None else list(port.shape),
            "dtype": None if port.dtype is None else str(port.dtype).removeprefix("torch."),
            "connections": ends, "depth": depth, "trigger": trigger}


def plain(value: Any) -> Any:
    """A stats record (`RunStats` and the records in it) as plain dicts, lists and scalars."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def full(value: Any, depth: int = 0) -> Any:
    """A message's JSON value with every tensor's values (``echo --full``).

    As `view.project`, but a tensor of up to `MAX_FULL_ELEMENTS` elements
    keeps all its values (non-finite floats ``None``), whatever its size.
    """
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.numel() > MAX_FULL_ELEMENTS or t.is_complex():
            return project(t)
        if t.device.type != "cpu":
            t = t.cpu()
        data = t.tolist()
        if t.is_floating_point():
            data = _nulls(data)
        return {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                "data": data}
    if depth < 32 and isinstance(value, dict):
        return {str(k): full(v, depth + 1) for k, v in value.items()}
    if depth < 32 and isinstance(value, tuple) and hasattr(value, "_fields"):
        return {k: full(v, depth + 1) for k, v in zip(value._fields, value, strict=False)}
    if depth < 32 and dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: full(getattr(value, f.name), depth + 1)
                for f in dataclasses.fields(value)}
    if depth < 32 and isinstance(value, (list, tuple)):
        return [full(v, depth + 1) for v in value]
    return project(value)


def _nulls(values: Any) -> Any:
    if isinstance(values, list):
        return [_nulls(v) for v in values]
    return finite(values) if isinstance(values, float) else values


class _Watch:
    """One client's watch of a port: its mode and its `Run.watch`, which the thread takes."""

    __slots__ = ("port", "mode", "depth", "sent", "watch")

    def __init__(self, port: str, mode: str, depth: int, watch: Watch) -> None:
        self.port = port
        self.mode = mode
        self.depth = depth
        self.sent = 0
        self.watch = watch

    def take(self) -> list[Any]:
        """Everything queued, oldest first: ``(t_ns, message)``, or ``t_ns`` (``stamps``).

        The messages are not copied: the views only read them.
        """
        return self.watch.take(copy=False)

    def lost(self) -> int:
        """Messages dropped on the run's side for this watch (its full queue's oldest)."""
        return self.watch.dropped


class _Client:
    """One connection: what it sent and not yet handled, what waits to be written, its watch."""

    __slots__ = ("sock", "inbox", "out", "watch", "writing")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbox = bytearray()
        self.out = bytearray()
        self.watch: _Watch | None = None
        self.writing = False  # registered for EVENT_WRITE


class Endpoint:
    """A run's local endpoint: the socket, its facts file, the ``mujou-attach`` thread.

    Made by `open_endpoint`; it closes itself when the run ends.

    Args:
        run (Run): the started run it serves.
        folder (str): the checked runtime folder.
        facts (dict): what its ``<id>.json`` holds (``id`` names the files).

    Raises:
        OSError: the socket cannot be made or bound.
    """

    def __init__(self, run: Run, folder: str, facts: dict[str, Any]) -> None:
        self._run = run
        self.facts = facts
        self.socket_path = os.path.join(folder, f"{facts['id']}.sock")
        self.facts_path = os.path.join(folder, f"{facts['id']}.json")
        self._pid = os.getpid()
        self._clients: dict[int, _Client] = {}
        self._closed = threading.Event()
        self._declared: RunParams | None = None  # the parameters' declarations, when first asked
        self._flush_s = FLUSH_S  # the wait for the next take: shorter while queues fill
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.socket_path)
            os.chmod(self.socket_path, 0o600)  # the folder is 0700 already: twice locked
            listener.listen(8)
            listener.setblocking(False)
            _write_facts(self.facts_path, facts)
        except BaseException:
            listener.close()
            self._remove_files()
            raise
        self._listener = listener
        atexit.register(self._remove_files)  # a process that exits with the run going
        self._thread = threading.Thread(target=self._serve, name="mujou-attach", daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        """bool: the endpoint has closed (the run ended, or `close` was called)."""
        return self._closed.is_set()

    def close(self, timeout: float = 5.0) -> None:
        """Close the endpoint now: clients told, subscriptions cancelled, files removed.

        Args:
            timeout (float): wall seconds to wait for the thread. Default: 5.
        """
        self._closed.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # -- the thread -----------------------------------------------------------------------
    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, None)
        try:
            while not self._closed.is_set() and self._run.running:
                watching = any(c.watch is not None for c in self._clients.values())
                for key, events in sel.select(self._flush_s if watching else IDLE_S):
                    if key.data is None:
                        self._accept(sel)
                        continue
                    client = key.data
                    if events & selectors.EVENT_READ:
                        self._read(sel, client)
                    if events & selectors.EVENT_WRITE and client.sock.fileno() >= 0:
                        self._flush_out(sel, client)
                if watching:
                    self._take(sel)
        except BaseException:  # noqa: BLE001 - the endpoint ends; the run goes on
            log.exception("the run's attach endpoint failed; `mujou echo` and the other "
                          "commands cannot reach this run any more")
        finally:
            self._finish(sel)

    def _finish(self, sel: selectors.BaseSelector) -> None:
        """The end: take what is left, tell the watchers, close everything, remove the files."""
        try:
            self._remove_files()
            self._take(sel)
            failure = self._run.failure if not self._run.running else None
            for client in list(self._clients.values()):
                if client.watch is not None:
                    self._send(sel, client, {"end": True, "lost": client.watch.lost(),
                                             "failure": None if failure is None
                                             else describe(failure)})
            deadline = time.monotonic() + 2.0  # the last frames, if the clients read them
            while any(c.out for c in self._clients.values()) and time.monotonic() < deadline:
                for key, events in sel.select(0.05):
                    if key.data is not None and events & selectors.EVENT_WRITE:
                        self._flush_out(sel, key.data)
        finally:
            for client in list(self._clients.values()):
                self._drop(sel, client)
            self._listener.close()
            sel.close()
            self._closed.set()
            atexit.unregister(self._remove_files)

    def _remove_files(self) -> None:
        if os.getpid() != self._pid:
            return  # a forked child: the files are its parent's
        for path in (self.facts_path, self.socket_path):
            try:
                os.unlink(path)
            except OSError:
                pass

    def _accept(self, sel: selectors.BaseSelector) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        if len(self._clients) >= MAX_CLIENTS or not _same_user(sock):
            sock.close()
            return
        sock.setblocking(False)
        client = _Client(sock)
        self._clients[sock.fileno()] = client
        sel.register(sock, selectors.EVENT_READ, client)

    def _drop(self, sel: selectors.BaseSelector, client: _Client) -> None:
        """Forget a connection: its watch's subscription is cancelled."""
        watch = client.watch
        client.watch = None
        if watch is not None:
            watch.watch.cancel()
        fd = client.sock.fileno()
        if fd >= 0:
            try:
                sel.unregister(client.sock)
            except (KeyError, ValueError):
                pass
            self._clients.pop(fd, None)
        client.sock.close()

    def _read(self, sel: selectors.BaseSelector, client: _Client) -> None:
        try:
            data = client.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sel, client)
            return
        inbox = client.inbox
        inbox += data
        while len(inbox) >= 4 and client.sock.fileno() >= 0:
            (n,) = LENGTH.unpack_from(inbox)
            if n > MAX_REQUEST:
                self._drop(sel, client)
                return
            if len(inbox) < 4 + n:
                return
            body = bytes(inbox[4:4 + n])
            del inbox[:4 + n]
            self._answer(sel, client, body)

    def _answer(self, sel: selectors.BaseSelector, client: _Client, body: bytes) -> None:
        try:
            request = unpack(body, MAX_REQUEST)
            if not isinstance(request, dict) or not isinstance(request.get("op"), str):
                raise AttachError("a request is a map with an 'op'")
            if client.watch is not None:
                raise AttachError("this connection watches a port: open another for requests")
            answer = self._handle(client, request)
        except AttachError as exc:
            answer = {"ok": False, "error": str(exc)}
        except ParamError as exc:  # the asker's mistake, in the parameter's own words
            answer = {"ok": False, "error": str(exc), "refused": True}
        except Exception as exc:  # noqa: BLE001 - a request's failure is the client's answer
            answer = {"ok": False, "error": describe(exc)}
        self._send(sel, client, answer)

    def _handle(self, client: _Client, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        run = self._run
        if op == "hello":
            return {"ok": True, "protocol": PROTOCOL, **self.facts, "time": run.time,
                    "running": run.running}
        if op == "nodes":
            return {"ok": True, "nodes": node_rows(run)}
        if op == "ports":
            return {"ok": True, "ports": [port_row(p) for p in run.ports.values()]}
        if op == "stats":
            return {"ok": True, "stats": plain(run.stats())}
        if op == "params":
            return self._params(request)
        if op == "set_param":
            return self._set_param(request)
        if op == "watch":
            return self._watch(client, request)
        raise AttachError(f"no request {op!r} (hello, nodes, ports, stats, params, set_param, "
                          f"watch)")

    def _declarations(self) -> RunParams:
        """The run's parameters as its nodes declare them (a placed run's host copies too)."""
        if self._declared is None:
            self._declared = RunParams(self._run.nodes.items())
        return self._declared

    def _params(self, request: dict[str, Any]) -> dict[str, Any]:
        """``params``: every parameter's declaration and value; with ``path``, that one's.

        Raises:
            ParamError: ``path`` names no parameter (the words list those there are).
        """
        path = request.get("path")
        if path is not None:
            self._declarations().resolve(path)
        described = self._run.describe_params()
        if path is None:
            return {"ok": True, "params": described}
        return {"ok": True, "path": path, **described[path]}

    def _set_param(self, request: dict[str, Any]) -> dict[str, Any]:
        """``set_param``: ``value``, a text, parsed by the parameter's type and set.

        Answers the value set, the one it replaces (applied now) and the key it
        applies from (``[t_ns, delta]``: the node's first update at or after it).

        Raises:
            AttachError: ``value`` is not a str.
            ParamError: no such parameter, a read-only one, a text that is no
                value of its type, a value that breaks its rules.
        """
        asked, text = request.get("path"), request.get("value")
        if not isinstance(text, str):
            raise AttachError(f"set_param: value must be the value's text (a str), got "
                              f"{type(text).__name__}")
        node_path, name, param = self._declarations().resolve(asked)
        path = join(node_path, name)  # what was asked, now known to be a parameter's path
        value = param.parse(text, f"parameter {path!r}")
        old = self._run.params().get(path)
        t_ns, delta = self._run.set_param(path, value)
        return {"ok": True, "path": path, "value": value, "old": old, "key": [t_ns, delta]}

    def _watch(self, client: _Client, request: dict[str, Any]) -> dict[str, Any]:
        path, mode = request.get("port"), request.get("mode", "view")
        if mode not in _MODES:
            raise AttachError(f"watch: mode must be one of {', '.join(_MODES)}, got {mode!r}")
        depth = request.get("depth") or (STAMP_DEPTH if mode == "stamps" else VIEW_DEPTH)
        if type(depth) is not int or not 1 <= depth <= MAX_DEPTH:
            raise AttachError(f"watch: depth must be an int in 1..{MAX_DEPTH}, got {depth!r}")
        ports = self._run.ports
        if not isinstance(path, str) or path not in ports:
            raise AttachError(no_port(path, list(ports)))
        # The senders only append to the watch's queue (nothing is woken: this thread
        # takes it every FLUSH_S); ``stamps`` keeps the send times only.
        watch = _Watch(path, mode, depth, self._run.watch(
            path, depth=depth, with_time=True, messages=mode != "stamps"))
        client.watch = watch
        port = ports[path]
        return {"ok": True, "port": path, "mode": mode, "depth": depth,
                "direction": "out" if isinstance(port, Output) else "in",
                "type": _type_name(port.type), "timer_ns": self._run.time_ns}

    def _take(self, sel: selectors.BaseSelector) -> None:
        """Each watching client's queued messages, their views made, as batches.

        Sets the wait for the next take: halved while a queue was more than
        half full, doubled back (up to `FLUSH_S`) while none was a quarter full.
        """
        fill = 0.0
        for client in list(self._clients.values()):
            watch = client.watch
            if watch is None or len(client.out) >= OUT_LIMIT:
                continue  # a client behind: its queue drops its oldest meanwhile
            items = watch.take()
            if items:
                fill = max(fill, len(items) / watch.depth)
                self._send_items(sel, client, watch, items)
        if fill > 0.5:
            self._flush_s = max(MIN_FLUSH_S, self._flush_s / 2)
        elif fill < 0.25:
            self._flush_s = min(FLUSH_S, self._flush_s * 2)

    def _send_items(self, sel: selectors.BaseSelector, client: _Client, watch: _Watch,
                    items: list[Any]) -> None:
        """A take's items to its client: send times, columns of tensors, or a view each."""
        if watch.mode == "stamps":
            watch.sent += len(items)
            self._send(sel, client, {"stamps": items, "lost": watch.lost()})
            return
        tensors = columns(items, watch.mode == "full")
        if tensors is not None:
            watch.sent += len(items)
            for column in tensors:
                self._send(sel, client, {"column": column, "lost": watch.lost()})
            return
        make = full if watch.mode == "full" else project
        batch: list[Any] = []
        size = 0
        for t_ns, message in items:
            item = _item(make, t_ns, message)
            batch.append(item)
            size += len(item[1]) if isinstance(item[1], bytes) else 0
            if size > MAX_FRAME // 4:
                self._send_batch(sel, client, watch, batch)
                batch, size = [], 0
        if batch:
            self._send_batch(sel, client, watch, batch)

    def _send_batch(self, sel: selectors.BaseSelector, client: _Client, watch: _Watch,
                    batch: list[Any]) -> None:
        watch.sent += len(batch)
        # Each view packed already (`_item`): the frame carries them as bytes.
        self._send(sel, client, {"items": batch, "lost": watch.lost()})

    def _send(self, sel: selectors.BaseSelector, client: _Client, value: Any) -> None:
        if client.sock.fileno() < 0:
            return
        try:
            data = frame(value)
        except (ValueError, TypeError, OverflowError) as exc:
            data = frame({"ok": False, "error": f"the answer cannot be sent: {describe(exc)}"})
        client.out += data
        self._flush_out(sel, client)

    def _flush_out(self, sel: selectors.BaseSelector, client: _Client) -> None:
        out = client.out
        try:
            while out:
                sent = client.sock.send(out)
                del out[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._drop(sel, client)
            return
        want = bool(out)
        if want != client.writing:
            client.writing = want
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
            sel.modify(client.sock, events, client)

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Endpoint {self.facts['id']} {state} {self.socket_path}>"


def columns(items: list[Any], full_values: bool) -> list[dict[str, Any]] | None:
    """Taken ``(t_ns, message)`` items as ``column`` batches, when a column can carry them.

    It can when every message is a plain strided tensor (not a subclass) of
    one dtype that `attach.COLUMN_CODES` names and one shape of at most
    `attach.COLUMN_RANK` dimensions and at most `MAX_ELEMENTS` elements
    (`MAX_FULL_ELEMENTS` for ``full_values``): the tensors of each column are
    stacked (on their device: a CUDA port's batch is copied to the CPU once)
    and sent as raw bytes, whose views the watcher makes (`attach.column_items`,
    the same views as `view.project_tensor` or `full`). Columns hold at most
    `attach.COLUMN_ELEMENTS` cells each.

    Returns:
        list[dict] | None: the columns, oldest first; None when the messages
        need a view each, made here (a mix of types, shapes or devices, a
        larger tensor that a view summarises, a dtype a column cannot hold).
    """
    first = items[0][1]
    if type(first) is not torch.Tensor or first.layout is not torch.strided:
        return None
    dtype, shape = first.dtype, first.shape
    name = str(dtype).removeprefix("torch.")
    limit = MAX_FULL_ELEMENTS if full_values else MAX_ELEMENTS
    if (name not in COLUMN_CODES or len(shape) > COLUMN_RANK or first.numel() > limit
            or cells(shape) > COLUMN_ELEMENTS):
        return None
    for _, message in items:
        if type(message) is not torch.Tensor or message.dtype is not dtype \
                or message.shape != shape:
            return None
    rows = max(1, COLUMN_ELEMENTS // cells(shape))
    out: list[dict[str, Any]] = []
    for i in range(0, len(items), rows):
        chunk = items[i:i + rows]
        try:
            stacked = torch.stack([m for _, m in chunk]).detach()
            if stacked.device.type != "cpu":
                stacked = stacked.cpu()
            data = stacked.numpy().tobytes()
        except Exception:  # noqa: BLE001 - devices or layouts that mix: a view each instead
            return None
        out.append({"t_ns": [t for t, _ in chunk], "dtype": name, "shape": list(shape),
                    "data": data, "flat": not full_values})
    return out


def _item(make: Any, t_ns: int, message: Any) -> list[Any]:
    """``[t_ns, view]``, the view as its own msgpack bytes (so one bad view spoils no batch)."""
    try:
        data = msgpack.packb(make(message), use_bin_type=True)
    except Exception as exc:  # noqa: BLE001 - a view never fails the endpoint
        data = msgpack.packb({"unviewable": describe(exc)[:256]})
    if len(data) > MAX_FRAME // 2:
        data = msgpack.packb({"unviewable": f"its view has {len(data)} bytes (at most "
                                            f"{MAX_FRAME // 2}): ask without --full"})
    return [t_ns, data]


def no_port(path: Any, ports: list[str]) -> str:
    """The error of a port path that the run has not, with the likeliest and the ports."""
    close = difflib.get_close_matches(str(path), ports, n=3)
    shown = ", ".join(sorted(ports)[:30]) + (", ..." if len(ports) > 30 else "")
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"no port {path!r} in this run{hint} (ports: {shown})"


def _same_user(sock: socket.socket) -> bool:
    """Whether the peer of a Unix socket is this process's user (Linux: ``SO_PEERCRED``)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return True  # the folder's 0700 and the socket's 0600 alone
    try:
        _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option,
                                                        struct.calcsize("3i")))
    except OSError:
        return False
    return uid == os.getuid()


def _write_facts(path: str, facts: dict[str, Any]) -> None:
    """Write the facts file (0600) under a temporary name, then rename it: always whole."""
    tmp = f"{path}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(facts, f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def script() -> str:
    """The file the run comes from, as a person would name it.

    ``mujou run FILE[:NAME]`` and ``mujou replay REC FILE``: FILE; ``python
    script.py``: the script; else the program's name (``python -c``: ``-c``).
    """
    argv = sys.argv
    if argv and os.path.basename(argv[0]) in ("mujou", "__main__.py") and len(argv) > 2:
        for arg in argv[2:]:
            if not arg.startswith("-") and arg.partition(":")[0].endswith(".py"):
                return arg.partition(":")[0]
    return argv[0] if argv and argv[0] else "-"


def open_endpoint(run: Run, *, simulated: bool, net: Any = None) -> Endpoint | None:
    """Open a started run's endpoint (unless ``MUJOU_ATTACH=0``): what `mujou.run` does.

    A folder or socket that cannot be used is logged as a warning and the run
    goes on without an endpoint: watching it is not worth failing it.

    Args:
        run (Run): the run, started.
        simulated (bool): whether its timer is the simulated one.
        net (Any): what `mujou.run` was given (named in the facts: a
            placed run's ``"FILE:NAME"``, or the root node's class).

    Returns:
        Endpoint | None: the endpoint, None when off or not possible.
    """
    if not enabled() or not hasattr(socket, "AF_UNIX"):
        return None
    try:
        folder = runtime_dir()
        facts = {"id": f"{os.getpid()}-{secrets.token_hex(3)}", "pid": os.getpid(),
                 "uid": os.getuid(), "file": script(), "net": _net_name(net),
                 "cwd": os.getcwd(), "started": time.time(),
                 "timer": "simulated" if simulated else "realtime",
                 "nodes": len(run.nodes), "groups": len(run.groups)}
        return Endpoint(run, folder, facts)
    except Exception as exc:  # noqa: BLE001 - watching it is not worth failing the run
        log.warning("this run cannot be watched from another process (mujou ls, echo...): "
                    "%s", exc if isinstance(exc, AttachError) else describe(exc))
        return None


def _net_name(net: Any) -> str:
    if isinstance(net, str):
        return net
    if isinstance(net, (list, tuple, dict)):
        return f"{type(net).__name__} of {len(net)} nodes"
    named = net if isinstance(net, type) or inspect.isfunction(net) else type(net)
    return f"{getattr(named, '__module__', '?')}.{getattr(named, '__qualname__', '?')}"
