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
