"""Small nets for the replay tests (tests/test_replay.py), light enough for `mujou replay`."""

from __future__ import annotations

from typing import Any

import torch

import mujou_actors as mujou

F64 = torch.float64


class Plant(mujou.Node):
    """An inverted pendulum, ``[theta, omega]``, stepped every 2 ms (semi-implicit Euler)."""

    command = mujou.Input(torch.Tensor, shape=(1,), dtype=F64, depth=1)
    state = mujou.Output(torch.Tensor, shape=(2,), dtype=F64)

    def __init__(self) -> None:
        super().__init__(period=0.002)
        self.x = torch.zeros(2, dtype=F64)
        self.calls: list[str] = []

    def on_start(self) -> None:
        self.calls.append("on_start")
        self.x = 0.1 * torch.randn(2, generator=self.generator, dtype=F64)
        self.state.send(self.x)

    def on_update(self, dt: float) -> None:
        self.calls.append("on_update")
        u = self.command.read()
        accel = 9.81 * torch.sin(self.x[0]) + (0.0 if u is None else u[0])
        omega = self.x[1] + dt * accel
        self.x = torch.stack([self.x[0] + dt * omega, omega])
        self.state.send(self.x)

    def on_stop(self) -> None:
        self.calls.append("on_stop")


class Sensor(mujou.Node):
    """Samples the newest state every 4 ms, with noise from its generator."""

    state = mujou.Input(torch.Tensor, shape=(2,), dtype=F64, depth=1)
    measurement = mujou.Output(torch.Tensor, shape=(2,), dtype=F64)

    def __init__(self) -> None:
        super().__init__(period=0.004)

    def on_update(self, dt: float) -> None:
        x = self.state.read()
        if x is not None:
            noise = 0.001 * torch.randn(2, generator=self.generator, dtype=F64)
            self.measurement.send(x + noise)


class Controller(mujou.Node):
    """``u = -K m`` every 10 ms; ``stop_after``: sends only its first that many commands."""

    measurement = mujou.Input(torch.Tensor, shape=(2,), dtype=F64, depth=1)
    command = mujou.Output(torch.Tensor, shape=(1,), dtype=F64)

    def __init__(self, gain: tuple[float, float] = (40.0, 8.0),
                 stop_after: int | None = None) -> None:
        super().__init__(period=0.01)
        self.gain = torch.tensor([gain], dtype=F64)
        self.stop_after = stop_after
        self.sent = 0

    def on_update(self, dt: float) -> None:
        m = self.measurement.read()
        if m is not None and (self.stop_after is None or self.sent < self.stop_after):
            self.command.send(-(self.gain @ m))
            self.sent += 1


class Log(mujou.Node):
    """Keeps every state and command with the time it came (triggered by each)."""

    state = mujou.Input(torch.Tensor, shape=(2,), dtype=F64, depth=None)
    command = mujou.Input(torch.Tensor, shape=(1,), dtype=F64, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.t_ns = 0
        self.seen: list[tuple[int, str, list[float]]] = []

    def on_update(self, dt: float) -> None:
        self.t_ns += round(dt * 1e9)
        for s in self.state.drain():
            self.seen.append((self.t_ns, "state", s.tolist()))
        for u in self.command.drain():
            self.seen.append((self.t_ns, "command", u.tolist()))


class Pendulum(mujou.Node):
    """plant -> sensor -> controller -> plant; the log reads the state and the command."""

    def __init__(self, **controller: Any) -> None:
        super().__init__(period=None)
        self.plant = Plant()
        self.sensor = Sensor()
        self.controller = Controller(**controller)
        self.log = Log()
        mujou.connect(self.plant.state, self.sensor.state)
        mujou.connect(self.sensor.measurement, self.controller.measurement)
        mujou.connect(self.controller.command, self.plant.command)
        mujou.connect(self.plant.state, self.log.state)
        mujou.connect(self.controller.command, self.log.command)


class Source(mujou.Node):
    """Sends its tick count every 10 ms; the echo's messages wake it too (it sends nothing then)."""

    back = mujou.Input(int, depth=2, trigger=True)
    out = mujou.Output(int)

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.n = 0
        self.updates = 0

    def on_update(self, dt: float) -> None:
        self.updates += 1
        if dt > 0:  # a tick (a message that wakes it comes within the same instant)
            self.n += 1
            self.out.send(self.n)


class Echo(mujou.Node):
    """Triggered by each message; sends it back doubled."""

    inp = mujou.Input(int, depth=None)
    out = mujou.Output(int)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.got: list[int] = []

    def on_update(self, dt: float) -> None:
        for v in self.inp.drain():
            self.got.append(v)
            self.out.send(2 * v)


def loop_net() -> dict[str, mujou.Node]:
    net = {"source": Source(), "echo": Echo()}
    mujou.connect(net["source"].out, net["echo"].inp)
    mujou.connect(net["echo"].out, net["source"].back)
    return net
