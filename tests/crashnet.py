"""A small net for the crash tests: run in a subprocess that dies mid-run.

Usage: python -m tests.crashnet SNAPSHOT_DIR CRASH_AT_SECONDS
"""

from __future__ import annotations

import os
import sys
import time

import torch

import mujou_actors as mujou
from mujou_actors.supervisor import snapshot_name


class Walker(mujou.Node):
    """A random walk from its own generator, sent every period."""

    out = mujou.Output(torch.Tensor, shape=(2,))

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.position = torch.zeros(2)

    def on_update(self, dt: float) -> None:
        self.position += torch.randn(2, generator=self.generator) * dt
        self.out.send(self.position)


class Tracker(mujou.Node):
    """Reads every third tick; kills the whole process at ``crash_at`` seconds."""

    inp = mujou.Input(torch.Tensor, shape=(2,), depth=None)

    def __init__(self, crash_at: float | None = None) -> None:
        super().__init__(period=0.03)
        self.crash_at = crash_at
        self.elapsed = 0.0
        self.path_length = torch.zeros(())
        self.count = torch.zeros((), dtype=torch.int64)

    def on_update(self, dt: float) -> None:
        self.elapsed += dt
        for m in self.inp.drain():
            self.path_length += m.norm()
            self.count += 1
        if self.crash_at is not None and self.elapsed >= self.crash_at:
            wait_for_file(self.crash_at)
            os._exit(137)  # a crash: no on_stop, no flush, no cleanup


def wait_for_file(crash_at: float) -> None:
    """Let the snapshot of the last whole 0.1 s before the crash reach the disk.

    Simulated time runs far ahead of the background writer; the test is about
    what happens after a file is on disk, so the crash waits for it (bounded).
    """
    folder = sys.argv[1]
    want = snapshot_name(int(crash_at * 10) * 100_000_000)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with open(os.path.join(folder, "latest")) as f:
                if f.read().strip() >= want:
                    return
        except FileNotFoundError:
            pass
        time.sleep(0.005)


class Net(mujou.Node):
    def __init__(self, crash_at: float | None = None) -> None:
        super().__init__(period=None)
        self.walker = Walker()
        self.tracker = Tracker(crash_at)
        mujou.connect(self.walker.out, self.tracker.inp)


if __name__ == "__main__":
    folder, crash_at = sys.argv[1], float(sys.argv[2])
    supervisor = mujou.Supervisor(snapshot_every=0.1, snapshot_dir=folder, keep=50)
    mujou.run(Net(crash_at), timer="simulated", duration=10.0, seed=4,
              supervisor=supervisor).join()
