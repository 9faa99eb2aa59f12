"""Nets and a control plane in one process for the placed-run tests.

`InProcessSystem` stands in for `mujou_actors.distributed.system.ProcessSystem`:
it runs each group's server in this process (its data plane still goes over
ZeroMQ ipc sockets), so the driver's protocol is tested without the cost of
starting processes; `across_machines` makes its groups stand in for machines
(their peer links TCP with CURVE, as between machines). The net factories are
module-level, as placement needs.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

import mujou_actors as mujou
from mujou_actors.distributed import peers
from mujou_actors.distributed.actors import Failure
from mujou_actors.distributed.placement import load_factory
from mujou_actors.distributed.system import remote_error


class InProcessSystem:
    """The control plane's interface, with every group server in this process.

    What a server's ``handle`` raises reaches the caller as ProcessSystem's
    does: a ``RemoteError`` naming the group, the exception as its ``exception``.
    """

    notices = None

    def __init__(self, start_timeout: float = 30.0) -> None:
        self.servers: dict[str, Any] = {}

    def start_group(self, group: str, target: str, kwargs: dict[str, Any],
                    timeout: float) -> int:
        self.servers[group] = load_factory(target)(**pickle.loads(pickle.dumps(kwargs)))
        return os.getpid()

    def ask(self, group: str, request: Any, timeout: float) -> Any:
        try:
            reply = self.servers[group].handle(pickle.loads(pickle.dumps(request)))
        except Exception as exc:  # noqa: BLE001 - crosses as ProcessSystem.ask's does
            failure = Failure.of(exc)
        else:
            return pickle.loads(pickle.dumps(reply))
        raise remote_error(group, f"handle({type(request).__name__}) raised", failure)

    def take_exits(self) -> list[Any]:
        return []

    def shutdown(self, timeout: float = 10.0) -> None:
        for server in self.servers.values():
            server.close(timeout)


MACHINES_SECRET = "a test secret of the run, long enough"


@contextlib.contextmanager
def across_machines(machines: dict[str, str] | None = None) -> Iterator[None]:
    """The groups of this process stand in for machines (`peers.machine_of`): each on the
    machine ``machines`` names (``""``: the host's; default: every group on one of its
    own), so the peer links with an end off the host's machine are TCP on loopback with
    the run's secret (CURVE), every tensor inline, exactly as between machines."""
    before = peers.machine_of, os.environ.get("MUJOU_SECRET")
    peers.machine_of = ((lambda g: g.name) if machines is None
                        else (lambda g: machines.get(g.name, "")))
    os.environ["MUJOU_SECRET"] = MACHINES_SECRET
    try:
        yield
    finally:
        peers.machine_of = before[0]
        if before[1] is None:
            del os.environ["MUJOU_SECRET"]
        else:
            os.environ["MUJOU_SECRET"] = before[1]


class Sim(mujou.Node):
    """A periodic source: a noisy random walk from its generator."""

    out = mujou.Output(torch.Tensor)

    def __init__(self, period: float = 0.01) -> None:
        super().__init__(period=period)
        self.x = torch.zeros(3)

    def on_update(self, dt: float) -> None:
        self.x = self.x + torch.randn(3, generator=self.generator) * dt
        self.out.send(self.x)


class Ctrl(mujou.Node):
    """Triggered by each observation: a command from it and its own count."""

    obs = mujou.Input(torch.Tensor, depth=4)
    cmd = mujou.Output(torch.Tensor)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.n = 0

    def on_update(self, dt: float) -> None:
        for x in self.obs.drain():
            self.n += 1
            self.cmd.send(torch.tanh(x) * self.n)

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


class Log(mujou.Node):
    """Records every command and observation in the order it saw them."""

    cmd = mujou.Input(torch.Tensor, depth=None)
    obs = mujou.Input(torch.Tensor, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.seen: list[tuple[str, list[float]]] = []

    def on_update(self, dt: float) -> None:
        for x in self.obs.drain():
            self.seen.append(("obs", x.tolist()))
        for c in self.cmd.drain():
            self.seen.append(("cmd", c.tolist()))

    def state_dict(self) -> dict:
        return {"seen": [[k, v] for k, v in self.seen]}

    def load_state_dict(self, state: dict) -> None:
        self.seen = [(k, v) for k, v in state["seen"]]


def make_net(period: float = 0.01) -> dict[str, mujou.Node]:
    """sim -> ctrl -> log, and sim -> log."""
    net = {"sim": Sim(period), "ctrl": Ctrl(), "log": Log()}
    mujou.connect(net["sim"].out, net["ctrl"].obs)
    mujou.connect(net["sim"].out, net["log"].obs)
    mujou.connect(net["ctrl"].cmd, net["log"].cmd)
    return net


class Flaky(mujou.Node):
    """Counts its ticks; raises once, at the tick ``fail_at``, in the whole test session
    (the count of failures is process-wide, so a restart does not fail again)."""

    failures = 0
    out = mujou.Output(int)

    def __init__(self, fail_at: int = 5) -> None:
        super().__init__(period=0.01)
        self.n = 0
        self.fail_at = fail_at

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == self.fail_at and Flaky.failures == 0:
            Flaky.failures += 1
            raise RuntimeError(f"flaky at tick {self.n}")
        self.out.send(self.n)

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


class Count(mujou.Node):
    """Sums what it receives."""

    inp = mujou.Input(int, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.total = 0
        self.got: list[int] = []

    def on_update(self, dt: float) -> None:
        for v in self.inp.drain():
            self.total += v
            self.got.append(v)

    def state_dict(self) -> dict:
        return {"total": self.total, "got": list(self.got)}

    def load_state_dict(self, state: dict) -> None:
        self.total = state["total"]
        self.got = list(state["got"])


def make_flaky(fail_at: int = 5) -> dict[str, mujou.Node]:
    """sim -> ctrl -> log, and flaky -> count."""
    net = make_net()
    net["flaky"] = Flaky(fail_at)
    net["count"] = Count()
    mujou.connect(net["flaky"].out, net["count"].inp)
    return net


class Refuses(mujou.Node):
    """A periodic counter whose hook ``refuse`` raises: ``"on_start"``,
    ``"load_state_dict"``, ``"state_dict"`` or ``"on_stop"`` (``""``: none)."""

    def __init__(self, refuse: str = "") -> None:
        super().__init__(period=0.01)
        self.refuse = refuse
        self.n = 0

    def _refused(self, hook: str) -> None:
        if hook == self.refuse:
            raise ValueError(f"{hook} refused")

    def on_start(self) -> None:
        self._refused("on_start")

    def on_update(self, dt: float) -> None:
        self.n += 1

    def on_stop(self) -> None:
        self._refused("on_stop")

    def state_dict(self) -> dict:
        self._refused("state_dict")
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self._refused("load_state_dict")
        self.n = state["n"]


def make_refusing(refuse: str = "") -> dict[str, mujou.Node]:
    """sim -> ctrl -> log, and snk, whose hook ``refuse`` raises (`Refuses`)."""
    net = make_net()
    net["snk"] = Refuses(refuse)
    return net


# Released by the test that used `Stalls` (its groups are served in the test's process).
STALL = threading.Event()


class Stalls(mujou.Node):
    """Its ``on_start`` waits for `STALL` (at most 30 s): a start that does not end."""

    def on_start(self) -> None:
        STALL.wait(30)


def make_stalling() -> dict[str, mujou.Node]:
    """sim -> ctrl -> log, and slow, whose ``on_start`` waits for `STALL`."""
    net = make_net()
    net["slow"] = Stalls(period=0.01)
    return net


class Crasher(mujou.Node):
    """Kills its own process (SIGKILL, or os._exit) at tick ``at``, once: a marker file
    says it has crashed before, so the restored group goes on."""

    out = mujou.Output(int)

    def __init__(self, marker: str, at: int = 5, how: str = "kill") -> None:
        super().__init__(period=0.01)
        self.marker = marker
        self.at = at
        self.how = how
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == self.at and self.marker and not os.path.exists(self.marker):
            with open(self.marker, "w") as f:
                f.write(str(os.getpid()))
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(7)
        self.out.send(self.n)

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


def make_crashing(marker: str = "", at: int = 5, how: str = "kill") -> dict[str, mujou.Node]:
    """sim -> ctrl -> log, and crasher -> count (the crasher dies once at tick ``at``)."""
    net = make_net()
    net["crasher"] = Crasher(marker, at, how)
    net["count"] = Count()
    mujou.connect(net["crasher"].out, net["count"].inp)
    return net


class Stuck(mujou.Node):
    """Blocks in its third update until its process ends (a hook that never returns)."""

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == 3:
            threading.Event().wait(3600)


def make_stuck() -> dict[str, mujou.Node]:
    return {"stuck": Stuck(), **make_net()}


class Blocks(mujou.Node):
    """Blocks in its update ``at`` until the file ``release`` exists, having made the file
    ``entered``: an event across processes, set by the test (a hook that does not return
    until then). Without ``release``, it never blocks (a restored run goes on)."""

    def __init__(self, entered: str = "", release: str = "", at: int = 3) -> None:
        super().__init__(period=0.01)
        self.entered, self.release, self.at = entered, release, at
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == self.at and self.release:
            open(self.entered, "w").close()
            while not os.path.exists(self.release):
                time.sleep(0.005)

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


def make_blocking(entered: str = "", release: str = "", at: int = 3) -> dict[str, mujou.Node]:
    """`make_net` and a node ``b`` that blocks in its update ``at`` (`Blocks`)."""
    return {"b": Blocks(entered, release, at), **make_net()}


# What each `Gated` node waits for, by its name: set by the test (groups in this
# process: InProcessSystem).
GATES: dict[str, threading.Event] = {}


class Gated(mujou.Node):
    """Waits for ``GATES[name]`` in its update ``at`` (a hook that does not return until
    the test sets it)."""

    def __init__(self, name: str, at: int = 3) -> None:
        super().__init__(period=0.01)
        self.gate, self.at, self.n = name, at, 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == self.at:
            assert GATES[self.gate].wait(60), "the test never opened the gate"


def make_gated() -> dict[str, mujou.Node]:
    """`make_net` and two `Gated` nodes, ``ga`` and ``gh``, for two groups."""
    return {"ga": Gated("ga"), "gh": Gated("gh"), **make_net()}


def make_net_by_machine() -> dict[str, mujou.Node]:
    """`make_net`, with one node more where ``MUJOU_TEST_EXTRA_NODE`` is set: a machine
    whose copy of the code builds another net (tests/test_machines.py)."""
    net = make_net()
    if os.environ.get("MUJOU_TEST_EXTRA_NODE"):
        net["extra"] = Sim()
    return net


class Echo(mujou.Node):
    """Triggered by the host's writes: sends each value doubled, and draws from its
    generator at each update (its state holds the draws: a restore must go on with them)."""

    inp = mujou.Input(int, depth=None)
    out = mujou.Output(int)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.n = 0
        self.draws: list[int] = []

    def on_update(self, dt: float) -> None:
        for v in self.inp.drain():
            self.n += 1
            self.draws.append(int(torch.randint(0, 1 << 30, (1,), generator=self.generator)))
            self.out.send(2 * v)

    def state_dict(self) -> dict:
        return {"n": self.n, "draws": list(self.draws)}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]
        self.draws = list(state["draws"])


def make_echo() -> dict[str, mujou.Node]:
    """echo -> count: nothing is due until the host writes to ``echo.inp``."""
    net = {"echo": Echo(), "count": Count()}
    mujou.connect(net["echo"].out, net["count"].inp)
    return net


STRIDE = 1_000_000  # a message is sender * STRIDE + its number


class Counter(mujou.Node):
    """Sends ``burst`` numbered ints per tick (``which * STRIDE + n``)."""

    out = mujou.Output(int)

    def __init__(self, which: int, period: float = 0.002, burst: int = 3) -> None:
        super().__init__(period=period)
        self.which, self.burst, self.sent = which, burst, 0

    def on_update(self, dt: float) -> None:
        for _ in range(self.burst):
            self.out.send(self.which * STRIDE + self.sent)
            self.sent += 1

    def state_dict(self) -> dict:
        return {"sent": self.sent}

    def load_state_dict(self, state: dict) -> None:
        self.sent = state["sent"]


class Checker(mujou.Node):
    """Triggered by both counters; keeps every number it took, in the order it took them."""

    a = mujou.Input(int, depth=16)
    b = mujou.Input(int, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.seen: list[int] = []

    def on_update(self, dt: float) -> None:
        self.seen += self.a.drain()
        self.seen += self.b.drain()

    def state_dict(self) -> dict:
        return {"seen": list(self.seen)}

    def load_state_dict(self, state: dict) -> None:
        self.seen = list(state["seen"])


def make_counters() -> dict[str, mujou.Node]:
    """c1 -> k.a and c2 -> k.b (placed in three groups by `COUNTERS`)."""
    net: dict[str, mujou.Node] = {"c1": Counter(1), "c2": Counter(2), "k": Checker()}
    mujou.connect(net["c1"].out, net["k"].a)
    mujou.connect(net["c2"].out, net["k"].b)
    return net


def in_order_once(tree: dict, drops: int) -> None:
    """Each counter's numbers reached the checker once, in order, from 0 to what it sent:
    taken, pending, or (Input ``a`` only, depth 16) dropped as the oldest."""
    for which, port in ((1, "k.a"), (2, "k.b")):
        taken = [v - which * STRIDE for v in tree["nodes"]["k"]["seen"]
                 if v // STRIDE == which]
        pending = [v - which * STRIDE for v in tree["pending"].get(port, [])]
        got = taken + pending
        sent = tree["nodes"][f"c{which}"]["sent"]
        assert got == sorted(set(got)), f"{port}: out of order or twice"
        if which == 2:
            assert got == list(range(sent)), port
        else:  # the oldest are dropped when 16 wait: whatever is missing is counted
            assert got[-1] == sent - 1 and len(got) + drops == sent, (len(got), drops, sent)


class TorchProbe(mujou.Node):
    """Keeps the torch settings of the process it runs in, seen by its hook."""

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.seen: dict = {}
        self.made = torch.zeros(1)  # the default dtype when the net was built

    def on_update(self, dt: float) -> None:
        from mujou_actors.devices import torch_settings
        self.seen = {k: list(v) if isinstance(v, tuple) else v
                     for k, v in torch_settings().items()}
        self.seen["made"] = str(self.made.dtype)

    def state_dict(self) -> dict:
        return {"seen": dict(self.seen)}

    def load_state_dict(self, state: dict) -> None:
        self.seen = dict(state["seen"])


def make_probe() -> dict[str, mujou.Node]:
    """One `TorchProbe` ``probe`` beside the usual ``sim -> ctrl -> log``."""
    net = make_net()
    net["probe"] = TorchProbe()
    return net
