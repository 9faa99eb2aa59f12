"""A small net for the recording views (`mujou cat`, `export-view`, `view`): every kind of port.

On the simulated timer with a period of 10 ms, the source sends at t = k * 10 ms
(k = 0, 1, ...): ``count`` the float k, ``pair`` the tensor [k, 2k],
``wide`` 40 values k + i / 100, ``command`` Command(k / 2, k), ``image`` a
4x4 grey image of value k; the sink logs one INFO record per update and one
WARNING at k == 2.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch

import mujou_actors as mujou

log = logging.getLogger("view_nets")


class Command(NamedTuple):
    """A command: a force and a step."""

    force: float
    step: int


class Source(mujou.Node):
    """Sends one message on each port every tick."""

    count = mujou.Output(float)
    pair = mujou.Output(torch.Tensor, shape=(2,), dtype=torch.float64)
    wide = mujou.Output(torch.Tensor, shape=(40,), dtype=torch.float64)
    command = mujou.Output(Command)
    image = mujou.Output(torch.Tensor, shape=(4, 4), dtype=torch.uint8)

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.k = 0

    def on_update(self, dt: float) -> None:
        k = self.k
        self.count.send(float(k))
        self.pair.send(torch.tensor([k, 2 * k], dtype=torch.float64))
        self.wide.send(k + torch.arange(40, dtype=torch.float64) / 100)
        self.command.send(Command(k / 2, k))
        self.image.send(torch.full((4, 4), k, dtype=torch.uint8))
        self.k += 1


class Sink(mujou.Node):
    """Reads the count; logs each one (INFO) and a warning at 2."""

    count = mujou.Input(float, trigger=True, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)

    def on_update(self, dt: float) -> None:
        for value in self.count.drain():
            log.info("got %s", value)
            if value == 2.0:
                log.warning("two reached")


def make_net() -> dict[str, mujou.Node]:
    """The source and the sink, connected by ``count``."""
    src, sink = Source(), Sink()
    mujou.connect(src.count, sink.count)
    return {"src": src, "sink": sink}
