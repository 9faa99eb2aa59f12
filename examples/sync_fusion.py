"""Fuse a camera and an IMU: the messages that belong together, with ``mujou.ApproximateTime``.

The net, in simulated time::

    Camera (30 Hz) --frame--> Fusion, Late <--reading-- Imu (200 Hz)

* ``Camera`` sends each `Frame` 12 ms after capturing it (its readout); the
  frame carries its capture time, ``stamp``, as a ROS header does.
* ``Imu`` sends a `Reading` of the angular rate every 5 ms, stamped with
  the time it was taken, which is when it is sent.
* ``Fusion`` declares ``ApproximateTime(self.frame, self.reading, slop=0.003,
  stamp=lambda m: m.stamp, callback=self.on_pair)``: each frame meets the
  reading taken closest to its capture (within 3 ms), and ``on_pair`` gets
  the two, in the node's hook, before its ``on_update``.
* ``Late`` matches the same messages by their send times (no ``stamp=``):
  each frame then meets the reading sent with it, 12 ms after the capture.
  Its sets are as close in send time, and off by the readout from what the
  camera saw.

Most IMU readings match no frame: 170 of its 200 a second are dropped, by design, and
counted (``run.stats().nodes["fusion"].drops``).

Run it from the repository root::

    python examples/sync_fusion.py                  # 2 s simulated
    python examples/sync_fusion.py --duration 10 --workers 2
"""

from __future__ import annotations

import argparse
import sys
from typing import NamedTuple

import torch

import mujou_actors as mujou

READOUT_S = 0.012  # from a frame's capture to its send


class Frame(NamedTuple):
    """An image and the time it was captured (seconds of the run's timer)."""

    stamp: float
    image: torch.Tensor  # (3, 24, 32) uint8


class Reading(NamedTuple):
    """The angular rate (rad/s) and the time it was measured."""

    stamp: float
    rate: torch.Tensor  # (3,)


class Clocked(mujou.Node):
    """A periodic node that counts its own time from ``dt`` (a node sees no clock)."""

    def __init__(self, period: float) -> None:
        super().__init__(period=period)
        self.now_ns = 0

    def on_update(self, dt: float) -> None:
        self.now_ns += round(dt * 1e9)  # dt is a whole number of ns in simulated time
        self.tick(self.now_ns / 1e9)

    def tick(self, now: float) -> None:
        raise NotImplementedError


class Camera(Clocked):
    frame = mujou.Output(Frame)

    def __init__(self) -> None:
        super().__init__(period=1 / 30)

    def tick(self, now: float) -> None:
        image = torch.randint(0, 256, (3, 24, 32), dtype=torch.uint8, generator=self.generator)
        self.frame.send(Frame(now - READOUT_S, image))


class Imu(Clocked):
    reading = mujou.Output(Reading)

    def __init__(self) -> None:
        super().__init__(period=0.005)

    def tick(self, now: float) -> None:
        rate = torch.tensor([0.0, 0.0, 0.5]) + 0.01 * torch.randn(3, generator=self.generator)
        self.reading.send(Reading(now, rate))


class Fusion(mujou.Node):
    """Pairs each frame with the reading taken closest to its capture."""

    frame = mujou.Input(Frame)
    reading = mujou.Input(Reading)

    def __init__(self, by_capture: bool = True) -> None:
        super().__init__(period=None)  # updates as messages come
        self.sync = mujou.ApproximateTime(
            self.frame, self.reading, slop=0.003, queue=10,
            stamp=(lambda m: m.stamp) if by_capture else None, callback=self.on_pair)
        self.offsets: list[float] = []  # |frame's capture - reading's time|, seconds

    def on_pair(self, frame: Frame, reading: Reading) -> None:
        self.offsets.append(abs(frame.stamp - reading.stamp))


def make_net() -> mujou.Node:
    rig = mujou.Node(period=None)
    rig.camera, rig.imu = Camera(), Imu()
    rig.fusion, rig.late = Fusion(by_capture=True), Fusion(by_capture=False)
    for fusion in (rig.fusion, rig.late):
        mujou.connect(rig.camera.frame, fusion.frame)
        mujou.connect(rig.imu.reading, fusion.reading)
    return rig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=2.0, help="simulated seconds")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    rig = make_net()
    run = mujou.run(rig, timer="simulated", duration=args.duration, seed=0,
                    workers=args.workers)
    run.join()
    stats = run.stats()
    print(f"camera and IMU fused: {args.duration:g} s simulated")
    for name, fusion in (("fusion", rig.fusion), ("late", rig.late)):
        drops = stats.nodes[name].drops
        offsets = fusion.offsets
        print(f"  {name:7s} by {'capture' if fusion is rig.fusion else 'send time':9s} "
              f"{len(offsets):4d} pairs, offset from capture mean "
              f"{1e3 * sum(offsets) / max(1, len(offsets)):5.2f} ms, max "
              f"{1e3 * max(offsets, default=0):5.2f} ms; dropped {drops['frame']} frames, "
              f"{drops['reading']} readings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
