"""What an input synchronizer costs per matched set, and that a net without one pays nothing.

What is measured
----------------
A camera and an IMU node (periodic, each sending an ``int`` every update) and a
fusion node that both trigger (``period=None``), run in simulated time on one
worker. Per case, in a fresh Python process: a short run first (imports,
caches), then a run of ``--duration`` simulated seconds and one of twice that,
each on a fresh net, timed by process CPU time (``time.process_time`` around
``mujou.run`` and ``join``). The difference of the two is the cost of
``--duration`` seconds of steady running, without what starting and ending a
run costs. The cases run alternately, repetition by repetition, and the table
gives their medians.

* ``plain``: the fusion node has two plain Inputs (``depth=None``) and drains
  both in its update. No synchronizer anywhere: the net every user had before.
* ``exact``: the same Inputs under ``ExactTime``; both sensors at 1 kHz on the
  same ticks, so every instant makes one set, which the update drains.
* ``approximate``: the same under ``ApproximateTime`` (every set of size 0,
  handed over at once).
* ``plain-10:1`` and ``approx-10:1``: ``plain`` and ``approximate`` with the
  camera at 100 Hz and the IMU at 1 kHz: one set per camera frame, nine IMU
  messages of ten dropped.

**µs/update** is the CPU time per update of the fusion node; **µs/set more**
is, for a synchronizer's case, its CPU time less its plain twin's (same tree,
same rates), per matched set: what stamping, matching (dropping included) and
handing over a set adds. With
``--baseline PATH`` (a checkout of another commit, for instance the one before
synchronizers existed), ``plain`` also runs on that tree: ``plain@baseline``
beside ``plain`` is the cost of the feature to a net that does not use it.

The script imports ``mujou_actors`` from ``sys.path`` in its children: the tree
that runs it (its parent folder) unless ``PYTHONPATH`` says otherwise.

Usage::

    python benchmarks/sync.py [--duration 5] [--repeat 7] [--baseline PATH]
                              [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# case -> (the camera's period, s; its synchronizer, None for plain Inputs)
CASES = {"plain": (0.001, None), "exact": (0.001, "exact"),
         "approximate": (0.001, "approximate"), "plain-10:1": (0.01, None),
         "approx-10:1": (0.01, "approximate")}
TWIN = {"exact": "plain", "approximate": "plain", "approx-10:1": "plain-10:1"}


def child(case: str, duration: float) -> dict[str, Any]:
    """One run of one case in this process: CPU seconds, the fusion node's updates and sets."""
    import time

    import torch

    import mujou_actors as mujou

    torch.set_num_threads(1)
    camera_period, policy = CASES[case]

    class Sensor(mujou.Node):
        out = mujou.Output(int)

        def __init__(self, period: float) -> None:
            super().__init__(period=period)
            self.n = 0

        def on_update(self, dt: float) -> None:
            self.n += 1
            self.out.send(self.n)

    class Fuse(mujou.Node):
        camera = mujou.Input(int, depth=None)
        imu = mujou.Input(int, depth=None)

        def __init__(self) -> None:
            super().__init__(period=None)
            self.sets = 0
            if policy == "exact":
                self.sync: Any = mujou.ExactTime(self.camera, self.imu)
            elif policy == "approximate":
                self.sync = mujou.ApproximateTime(self.camera, self.imu)

        def on_update(self, dt: float) -> None:
            if policy is None:  # as many "sets" as camera messages
                self.sets += len(self.camera.drain())
                self.imu.drain()
            else:
                self.sets += len(self.sync.drain())

    def timed(seconds: float) -> tuple[float, int, int]:
        camera = Sensor(camera_period)
        imu, fuse = Sensor(0.001), Fuse()
        mujou.connect(camera.out, fuse.camera)
        mujou.connect(imu.out, fuse.imu)
        t0 = time.process_time()
        run = mujou.run({"camera": camera, "imu": imu, "fuse": fuse}, timer="simulated",
                        workers=1, duration=seconds, seed=0)
        run.join()
        return time.process_time() - t0, run.stats().nodes["fuse"].updates, fuse.sets

    timed(0.05)
    cpu1, updates1, sets1 = timed(duration)
    cpu2, updates2, sets2 = timed(2 * duration)
    # The marginal cost: the run of N and the run of 2N, their difference. Each run's own
    # CPU time is kept too (the difference of a quick run can be noise, even below zero).
    return {"cpu": cpu2 - cpu1, "updates": updates2 - updates1, "sets": sets2 - sets1,
            "cpu_runs": [cpu1, cpu2], "mujou": mujou.__file__}


def spawn(case: str, duration: float, tree: Path) -> dict[str, Any]:
    """`child` in a fresh Python process, importing ``mujou_actors`` from ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, __file__, "--child", case, "--duration",
                          str(duration)], env=env, capture_output=True, text=True,
                         check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="simulated seconds")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout: its plain net runs beside this tree's")
    parser.add_argument("--quick", action="store_true", help="0.2 s, 1 repeat")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", choices=list(CASES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.duration)))
        return 0
    if args.quick:
        args.duration, args.repeat = 0.2, 1
    here = Path(os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or ROOT).resolve()
    rows = [(case, here) for case in CASES]
    if args.baseline is not None:
        rows.insert(1, ("plain@baseline", args.baseline.resolve()))
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in rows}
    for _ in range(args.repeat):  # alternately, repetition by repetition
        for name, tree in rows:
            samples[name].append(spawn(name.split("@")[0], args.duration, tree))
    medians = {name: statistics.median(s["cpu"] for s in runs) for name, runs in samples.items()}
    print(f"mujou_actors {here}" + (f" (baseline {args.baseline})" if args.baseline else ""))
    print(f"{args.duration:g} s simulated, 1 worker, medians of {args.repeat} fresh processes")
    print(f"{'case':15s} {'CPU s (min-max)':>24s} {'updates':>8s} {'sets':>7s} "
          f"{'µs/update':>10s} {'µs/set more':>12s}")
    for name, runs in samples.items():
        cpus = [s["cpu"] for s in runs]
        last = runs[-1]
        more = ""
        if name in TWIN:
            more = f"{1e6 * (medians[name] - medians[TWIN[name]]) / last['sets']:12.2f}"
        print(f"{name:15s} {medians[name]:9.3f} ({min(cpus):6.3f}-{max(cpus):6.3f}) "
              f"{last['updates']:8d} {last['sets']:7d} "
              f"{1e6 * medians[name] / max(1, last['updates']):10.2f} {more:>12s}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "benchmark": "sync", "python": platform.python_version(),
            "duration": args.duration, "repeat": args.repeat, "medians": medians,
            "samples": samples}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
