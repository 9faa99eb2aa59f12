"""A net that fails deterministically, for the crash capsule tests (and `mujou run`).

A seeded noise source at 100 Hz feeds an integrator at 50 Hz that raises once
the sum of its absolute state passes ``limit``: when that happens depends on
every sample drawn and on the integrator's state, so a rerun from a snapshot
fails at the same time only if the state and the messages are restored bit
for bit.
"""

from __future__ import annotations

from typing import Any

import torch

import mujou_actors as mujou


class Source(mujou.Node):
    """Three Gaussian samples every 10 ms, from its own generator."""

    out = mujou.Output(torch.Tensor, shape=(3,), dtype=torch.float64)

    def __init__(self) -> None:
        super().__init__(period=0.01, seed=5)

    def on_update(self, dt: float) -> None:
        self.out.send(torch.randn(3, generator=self.generator, dtype=torch.float64))


class WindUp(Exception):
    """The integrator's state passed its limit."""


class Integrator(mujou.Node):
    """Sums what comes every 20 ms; sends the norm; raises `WindUp` past ``limit``."""

    inp = mujou.Input(torch.Tensor, shape=(3,), dtype=torch.float64, depth=None)
    total = mujou.Output(float)

    def __init__(self, limit: float) -> None:
        super().__init__(period=0.02)
        self.acc = torch.zeros(3, dtype=torch.float64)
        self.limit = limit

    def on_update(self, dt: float) -> None:
        for x in self.inp.drain():
            self.acc += x
        total = float(self.acc.abs().sum())
        self.total.send(total)
        if total > self.limit:
            raise WindUp(f"integrator wound up: {total:.6f}")

    def state_dict(self) -> dict[str, Any]:
        return {"acc": self.acc.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.acc = state["acc"].clone()


class Net(mujou.Node):
    """The source and the integrator (``src``, ``integ``)."""

    def __init__(self, limit: float = 40.0) -> None:
        super().__init__(period=None)
        self.src, self.integ = Source(), Integrator(limit)
        mujou.connect(self.src.out, self.integ.inp)


def make_net() -> Net:
    """The net that fails at 3.34 s of simulated time with seed 3."""
    return Net()


def make_fixed_net() -> Net:
    """The same net with a limit it never reaches in 4 s."""
    return Net(limit=1e9)
