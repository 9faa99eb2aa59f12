"""Small nets for the CLI tests (loaded by `mujou run FILE[:NAME]`)."""

from __future__ import annotations

import os
import sys

import torch

import mujou_actors as mujou


class Ticker(mujou.Node):
    """Counts its ticks in a tensor (so the count is state); writes a marker on stop."""

    out = mujou.Output(int)

    def __init__(self, period: float = 0.01) -> None:
        super().__init__(period=period)
        self.count = torch.zeros((), dtype=torch.int64)

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.out.send(int(self.count))

    def on_stop(self) -> None:
        marker = os.environ.get("MUJOU_TEST_STOP_MARKER")
        if marker:
            with open(marker, "w") as f:
                f.write(str(int(self.count)))


class Sink(mujou.Node):
    inp = mujou.Input(int, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.total = 0

    def on_update(self, dt: float) -> None:
        self.total += sum(self.inp.drain())


class Pair(mujou.Node):
    def __init__(self) -> None:
        super().__init__(period=None)
        self.ticker = Ticker()
        self.sink = Sink()
        mujou.connect(self.ticker.out, self.sink.inp)


class Broken(mujou.Node):
    def __init__(self) -> None:
        super().__init__(period=0.01)

    def on_update(self, dt: float) -> None:
        raise ZeroDivisionError("the sensor divided by zero")


net = Pair()


def make_broken() -> mujou.Node:
    return Broken()


not_a_net = 42


class SlowStop(Ticker):
    """Prints ``ready`` at its first update; its ``on_stop`` prints ``stopping`` and
    waits for a line on stdin, so a test can signal the command while it stops."""

    def on_update(self, dt: float) -> None:
        super().on_update(dt)
        if int(self.count) == 1:
            print("ready", flush=True)

    def on_stop(self) -> None:
        print("stopping", flush=True)
        sys.stdin.readline()  # returns at the test's line, or at EOF if the test is gone
        super().on_stop()


def make_slow_stop() -> mujou.Node:
    return SlowStop()


class SlowStart(Ticker):
    """Its ``on_start`` prints ``starting`` and waits for a line on stdin, so a test can
    signal the command while the net starts."""

    def on_start(self) -> None:
        print("starting", flush=True)
        sys.stdin.readline()  # returns at the test's line, or at EOF if the test is gone


def make_slow_start() -> mujou.Node:
    return SlowStart()


class Tags(mujou.Node):
    """From its 15th update on, sends a set: a message no snapshot file can hold."""

    out = mujou.Output(object)

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        if self.count >= 15:
            self.out.send({"left", "right"})


class TagReader(mujou.Node):
    inp = mujou.Input(object, depth=2)

    def __init__(self) -> None:
        super().__init__(period=0.01)


class Unsaveable(mujou.Node):
    def __init__(self) -> None:
        super().__init__(period=None)
        self.tags, self.reader = Tags(), TagReader()
        mujou.connect(self.tags.out, self.reader.inp)


def make_unsaveable() -> mujou.Node:
    return Unsaveable()
