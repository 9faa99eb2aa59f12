"""Nets with runtime parameters for the tests of their surfaces: Foxglove, `mujou param`,
`mujou run --param` (loaded by path, and as a placed run's factory)."""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import mujou_actors as mujou


class Sensor(mujou.Node):
    """One parameter of each type and rule; each applied set is noted and signalled.

    ``applied`` is set when ``on_param`` has run; ``changes`` holds ``(name,
    old, new)`` of each set applied. ``reading`` sends the parameters' values
    at every update, so a placed run's tests read them from another group;
    ``on_stop`` writes them as JSON to ``$MUJOU_TEST_PARAMS_OUT`` when set (the
    CLI's tests, whose run is in another process).
    """

    noise = mujou.Param(0.01, range=(0.0, 1.0), description="std of the noise, m")
    mode = mujou.Param("fast", choices=("fast", "slow"), description="how it samples")
    samples = mujou.Param(3, range=(1, 100), read_only=True, description="per update")
    enabled = mujou.Param(True)
    reading = mujou.Output(dict)

    def __init__(self, period: float | None = 0.02) -> None:
        super().__init__(period=period)
        self.changes: list[tuple[str, Any, Any]] = []
        self.applied = threading.Event()

    def on_param(self, name: str, old: Any, new: Any) -> None:
        self.changes.append((name, old, new))
        self.applied.set()

    def values(self) -> dict[str, Any]:
        """The parameters' values now, by name."""
        return {"noise": self.noise, "mode": self.mode, "samples": self.samples,
                "enabled": self.enabled}

    def on_update(self, dt: float) -> None:
        self.reading.send(self.values())

    def on_stop(self) -> None:
        out = os.environ.get("MUJOU_TEST_PARAMS_OUT")
        if out:
            with open(out, "w") as f:
                json.dump(self.values(), f)


class Idle(mujou.Node):
    """A node without parameters (the runs' other node)."""

    def __init__(self) -> None:
        super().__init__(period=None)


def make_net(period: float | None = 0.02) -> dict[str, mujou.Node]:
    """``sensor`` (parameters) and ``idle`` (none)."""
    return {"sensor": Sensor(period), "idle": Idle()}


net = make_net()
