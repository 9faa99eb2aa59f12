"""The nets of benchmarks/processes.py, machines.py, params.py: factories a group imports.

Every group process imports this module by name (``_placed_nets``): the
benchmark runs as ``python benchmarks/processes.py``, so this folder is on
``sys.path``, and a spawned group process gets the host's ``sys.path``. A
group on another machine (a ``mujou worker``) gets that machine's: machines.py
starts its workers with this folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

import mujou_actors as mujou


def payload(kind: str) -> Any:
    """The message of a ping-pong: ``"int"`` (a Python int) or ``"1MB"`` (a 1 MiB tensor)."""
    if kind == "int":
        return 7
    return torch.ones(256 * 1024)  # 256 Ki float32: 1 MiB


class Ping(mujou.Node):
    """Sends a message, times the echo, sends the next: ``n`` round trips (wall clock)."""

    echo = mujou.Input(object, depth=None)
    out = mujou.Output(object)
    done = mujou.Output(int)

    def __init__(self, n: int, kind: str) -> None:
        super().__init__(period=None)
        self.n = n
        self.kind = kind
        self.rtts: list[int] = []
        self.t0 = 0

    def on_start(self) -> None:
        self.message = payload(self.kind)

    def on_update(self, dt: float) -> None:
        got = self.echo.drain()
        now = time.perf_counter_ns()
        if got and self.t0:
            self.rtts.append(now - self.t0)
        if len(self.rtts) >= self.n:
            self.done.send(len(self.rtts))
            return
        self.t0 = time.perf_counter_ns()
        self.out.send(self.message)

    def state_dict(self) -> dict[str, Any]:
        return {"rtts": list(self.rtts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rtts = list(state["rtts"])


class Kick(mujou.Node):
    """Starts the ping-pong: one message at its first tick (after every timer runs)."""

    out = mujou.Output(object)

    def __init__(self) -> None:
        super().__init__(period=0.001)
        self.sent = False

    def on_update(self, dt: float) -> None:
        if not self.sent:
            self.sent = True
            self.out.send(0)


class Pong(mujou.Node):
    """Echoes every message."""

    inp = mujou.Input(object, depth=None)
    out = mujou.Output(object)

    def __init__(self) -> None:
        super().__init__(period=None)

    def on_update(self, dt: float) -> None:
        for m in self.inp.drain():
            self.out.send(m)


def make_pingpong(n: int = 1000, kind: str = "int") -> dict[str, mujou.Node]:
    """kick -> ping <-> pong: ``n`` timed round trips of ``kind`` messages."""
    net = {"kick": Kick(), "ping": Ping(n, kind), "pong": Pong()}
    mujou.connect(net["kick"].out, net["ping"].echo)
    mujou.connect(net["ping"].out, net["pong"].inp)
    mujou.connect(net["pong"].out, net["ping"].echo)
    return net


class Burst(mujou.Node):
    """Sends ``per_tick`` small messages at every tick of 1 ms, ``ticks`` times."""

    out = mujou.Output(float)

    def __init__(self, per_tick: int, ticks: int) -> None:
        super().__init__(period=0.001)
        self.per_tick = per_tick
        self.ticks = ticks
        self.n = 0

    def on_update(self, dt: float) -> None:
        if self.n >= self.ticks:
            return
        self.n += 1
        send = self.out.send
        for i in range(self.per_tick):
            send(float(i))


class Sink(mujou.Node):
    """Counts what arrives; says when ``expect`` messages have come."""

    inp = mujou.Input(float, depth=None)
    done = mujou.Output(int)

    def __init__(self, expect: int) -> None:
        super().__init__(period=None)
        self.expect = expect
        self.count = 0
        self.first = 0
        self.last = 0

    def on_update(self, dt: float) -> None:
        n = len(self.inp.drain())
        if n and not self.first:
            self.first = time.perf_counter_ns()
        self.count += n
        if self.count >= self.expect and not self.last:
            self.last = time.perf_counter_ns()
            self.done.send(self.count)

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "first": self.first, "last": self.last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count, self.first, self.last = state["count"], state["first"], state["last"]


def make_stream(per_tick: int = 1000, ticks: int = 100) -> dict[str, mujou.Node]:
    """burst -> sink: ``per_tick * ticks`` small messages, as fast as they go."""
    net = {"burst": Burst(per_tick, ticks), "sink": Sink(per_tick * ticks)}
    mujou.connect(net["burst"].out, net["sink"].inp)
    return net


class Peer(mujou.Node):
    """A periodic node that sends its tick count to its peer and keeps what it got."""

    inp = mujou.Input(int, depth=4)
    out = mujou.Output(int)

    def __init__(self, period: float) -> None:
        super().__init__(period=period)
        self.n = 0
        self.got = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        for v in self.inp.drain():
            self.got += v
        self.out.send(self.n)

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n, "got": self.got}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n, self.got = state["n"], state["got"]


def make_exchange(period: float = 0.001) -> dict[str, mujou.Node]:
    """a <-> b: two periodic nodes that message each other at every tick (simulated steps)."""
    net = {"a": Peer(period), "b": Peer(period)}
    mujou.connect(net["a"].out, net["b"].inp)
    mujou.connect(net["b"].out, net["a"].inp)
    return net


def make_ring(groups: int = 4, period: float = 0.001) -> dict[str, mujou.Node]:
    """p0 -> p1 -> ... -> p0: periodic peers, each messaging the next at every tick."""
    net = {f"p{i}": Peer(period) for i in range(groups)}
    for i in range(groups):
        mujou.connect(net[f"p{i}"].out, net[f"p{(i + 1) % groups}"].inp)
    return net


class Spin(mujou.Node):
    """CPU-bound Python: ``work`` iterations of integer arithmetic per update."""

    def __init__(self, work: int, period: float) -> None:
        super().__init__(period=period)
        self.work = work
        self.acc = 0

    def on_update(self, dt: float) -> None:
        acc = self.acc
        for i in range(self.work):
            acc = (acc * 31 + i) % 1_000_003
        self.acc = acc

    def state_dict(self) -> dict[str, Any]:
        return {"acc": self.acc}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.acc = state["acc"]


def make_spin(work: int = 100_000, period: float = 0.01) -> dict[str, mujou.Node]:
    """Two CPU-bound nodes, unconnected, at the same period: what processes are for."""
    return {"a": Spin(work, period), "b": Spin(work, period)}



# --------------------------------------------------------------------------- benchmarks/params.py

class Tuned(mujou.Node):
    """A node with a parameter and an Input, every 50 ms: what the host sets and writes."""

    level = mujou.Input(float, trigger=False, depth=1)
    noise = mujou.Param(0.01, range=(0.0, 1.0), description="what the host sets")

    def __init__(self) -> None:
        super().__init__(period=0.05)
        self.total = 0.0

    def on_update(self, dt: float) -> None:
        self.total += self.noise + (self.level.read() or 0.0)


def make_tuned() -> dict[str, mujou.Node]:
    """One `Tuned` node, ``"tuned"``: placed alone in a group, or run in one process."""
    return {"tuned": Tuned()}

# --------------------------------------------------------------------------- benchmarks/machines.py

MiB = 1 << 20


def numbered(kind: str, seq: int) -> Any:
    """Message ``seq`` of a stream: the int itself (``"int"``), or a 1 MiB float32 tensor
    filled with it (``"1MiB"``), so that the reader can check the order of either."""
    if kind == "int":
        return seq
    return torch.full((MiB // 4,), float(seq))


class Pinger(mujou.Node):
    """Round trips started by the host: a write of ``(kind, n)`` to ``go`` starts ``n``
    timed round trips of ``kind`` messages (``"int"`` or ``"1MiB"``, as `payload` makes
    them), one at a time; ``done`` then says ``(kind, n)``. Each round trip is timed
    with ``time.perf_counter_ns`` in this node's hooks, on its own machine's clock; the
    round trips of each kind are kept apart (``state_dict()["rtts"][kind]``, ns)."""

    go = mujou.Input(object, depth=None)
    echo = mujou.Input(object, depth=None)
    out = mujou.Output(object)
    done = mujou.Output(object)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.by_kind: dict[str, list[int]] = {}
        self.kind = "int"
        self.left = 0
        self.t0 = 0  # when the message now out was sent; 0: none is out
        self.message: Any = None

    def on_update(self, dt: float) -> None:
        now = time.perf_counter_ns()
        if self.echo.drain() and self.t0:
            self.by_kind[self.kind].append(now - self.t0)
            self.t0 = 0
            self.left -= 1
            if not self.left:
                self.done.send((self.kind, len(self.by_kind[self.kind])))
        for kind, n in self.go.drain():
            self.kind, self.left = kind, n
            self.message = payload("int" if kind == "int" else "1MB")
            self.by_kind.setdefault(kind, [])
        if self.left and not self.t0:
            self.t0 = time.perf_counter_ns()
            self.out.send(self.message)

    def state_dict(self) -> dict[str, Any]:
        return {"rtts": {k: list(v) for k, v in self.by_kind.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.by_kind = {k: list(v) for k, v in state["rtts"].items()}


class Source(mujou.Node):
    """Streams numbered messages (`numbered`) when the host writes ``(kind, n, per_tick)``
    to ``go``: ``per_tick`` of them every 1 ms tick until ``n`` are out, numbered from 0.
    Its state holds when each kind's first message was sent (``time.monotonic_ns``)."""

    go = mujou.Input(object, depth=None)
    out = mujou.Output(object)

    def __init__(self) -> None:
        super().__init__(period=0.001)
        self.kind, self.left, self.per_tick, self.seq = "int", 0, 0, 0
        self.started: dict[str, int] = {}

    def on_update(self, dt: float) -> None:
        for kind, n, per_tick in self.go.drain():
            self.kind, self.left, self.per_tick, self.seq = kind, n, per_tick, 0
            self.started[kind] = time.monotonic_ns()
        send, kind = self.out.send, self.kind
        for _ in range(min(self.left, self.per_tick)):
            send(numbered(kind, self.seq))
            self.seq += 1
            self.left -= 1

    def state_dict(self) -> dict[str, Any]:
        return {"started": dict(self.started)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.started = dict(state["started"])


class Checker(mujou.Node):
    """Counts a `Source`'s stream of each kind and checks that every message comes, in
    order: message ``i`` of a kind must be the ``i``-th to arrive (`numbered`). Says
    ``(kind, count)`` on ``done`` once ``expect[kind]`` have come. The state holds, per
    kind, the count, the first message out of place (None: none), and when the last
    arrived (``time.monotonic_ns``).
    """

    inp = mujou.Input(object, depth=None)
    done = mujou.Output(object)

    def __init__(self, expect: dict[str, int]) -> None:
        super().__init__(period=None)
        self.expect = dict(expect)
        self.streams: dict[str, dict[str, Any]] = {}

    def on_update(self, dt: float) -> None:
        got = self.inp.drain()
        now = time.monotonic_ns()
        for m in got:
            kind = "int" if isinstance(m, int) else "1MiB"
            s = self.streams.setdefault(kind, {"count": 0, "wrong": None, "last": now})
            if kind == "int":
                ok = m == s["count"]
            else:
                ok = m.numel() == MiB // 4 and m[0].item() == s["count"] == m[-1].item()
            if not ok and s["wrong"] is None:  # the first message out of place
                s["wrong"] = f"message {s['count']} was {m if kind == 'int' else m[0].item()}"
            s["count"] += 1
            s["last"] = now
            if s["count"] == self.expect.get(kind):
                self.done.send((kind, s["count"]))

    def state_dict(self) -> dict[str, Any]:
        return {"streams": {k: dict(v) for k, v in self.streams.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streams = {k: dict(v) for k, v in state["streams"].items()}


class Beacon(mujou.Node):
    """Sends its tick count every ``period``: what shows that its group serves."""

    out = mujou.Output(int)

    def __init__(self, period: float) -> None:
        super().__init__(period=period)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.out.send(self.n)

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n = state["n"]


def make_machines(ints: int = 64_000, tensors: int = 128,
                  beacon: float = 0.005) -> dict[str, mujou.Node]:
    """benchmarks/machines.py's net: ``ping <-> pong`` (round trips, started by writes to
    ``ping.go``), ``source -> checker`` (streams of ``ints`` ints and ``tensors`` 1 MiB
    tensors, started by writes to ``source.go``) and a `Beacon` every ``beacon`` seconds
    (that its group serves: the host subscribes to it)."""
    net = {"ping": Pinger(), "pong": Pong(), "source": Source(),
           "checker": Checker({"int": ints, "1MiB": tensors}), "beacon": Beacon(beacon)}
    mujou.connect(net["ping"].out, net["pong"].inp)
    mujou.connect(net["pong"].out, net["ping"].echo)
    mujou.connect(net["source"].out, net["checker"].inp)
    return net
