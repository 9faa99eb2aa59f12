"""Nets with algebraic loops (nodes that trigger one another) for tests/test_loops.py.

Module-level factories: a placed run's processes import them by name.
"""

from __future__ import annotations

import mujou_actors as mujou


class Plant(mujou.Node):
    """Triggered by the command (``period=None``), or periodic; sends its state."""

    command = mujou.Input(float)
    state = mujou.Output(float)

    def __init__(self, period: float | None = None) -> None:
        super().__init__(period=period)
        self.x = 0.0

    def on_start(self) -> None:
        self.state.send(self.x)

    def on_update(self, dt: float) -> None:
        command = self.command.read()
        self.x += 1.0 if command is None else command
        self.state.send(self.x)


class Controller(mujou.Node):
    """Triggered by the state: sends a command on every state, a loop with the plant."""

    state = mujou.Input(float)
    command = mujou.Output(float)

    def __init__(self) -> None:
        super().__init__(period=None)

    def on_update(self, dt: float) -> None:
        self.command.send(-0.5 * self.state.read())


def make_loop(plant_period: float | None = None) -> dict[str, mujou.Node]:
    """A plant and a controller wired in a ring: with ``plant_period=None``, an algebraic loop."""
    plant, ctrl = Plant(plant_period), Controller()
    mujou.connect(plant.state, ctrl.state)
    mujou.connect(ctrl.command, plant.command)
    return {"plant": plant, "ctrl": ctrl}


class Echo(mujou.Node):
    """Triggered by ``x``: sends on ``y`` at every update, and counts its updates."""

    x = mujou.Input(float)
    y = mujou.Output(float)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.updates = 0

    def on_update(self, dt: float) -> None:
        self.updates += 1
        self.x.read()
        self.y.send(1.0)


class Kick(mujou.Node):
    """Periodic: sends 0.0 at every tick."""

    out = mujou.Output(float)

    def __init__(self, period: float = 0.01) -> None:
        super().__init__(period=period)

    def on_update(self, dt: float) -> None:
        self.out.send(0.0)


def make_fed_loop(kick_period: float = 0.001) -> dict[str, mujou.Node]:
    """A ring of two triggered nodes that a periodic node keeps feeding (a new chain per tick)."""
    kick, a, b = Kick(kick_period), Echo(), Echo()
    mujou.connect(kick.out, a.x)
    mujou.connect(a.y, b.x)
    mujou.connect(b.y, a.x)
    return {"kick": kick, "a": a, "b": b}
