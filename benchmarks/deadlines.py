"""What budgets and deadlines cost: nothing to a node without one, two clock reads to one with.

What is measured
----------------
Every case runs in a fresh Python process; the cases run alternately,
repetition by repetition, and the table gives their medians.

* **Per update, in a run** (``plain``, ``budget``, ``deadline``): ``--nodes``
  periodic nodes at 1 kHz, each adding to a counter in its ``on_update``,
  simulated time, one worker. A short run first (imports, caches), then a
  run of ``--duration`` simulated seconds and one of twice that, each on a
  fresh net, timed by process CPU time; the difference is the cost of
  ``--duration`` seconds of steady running without what starting and ending
  a run costs. ``plain`` declares nothing; ``budget`` declares
  ``budget=0.5`` (s of CPU: never missed); ``deadline`` declares
  ``deadline=0.0005`` (in simulated time, compared with the update's CPU
  time: never missed). ``budget - plain`` is the guard that measures each
  update (`_runtime.actor.DeadlineGuard`): two reads of the thread's CPU
  clock and the comparisons.
* **Per update, in real time** (``rt-plain``, ``rt-deadline``): the same
  nodes at 1 kHz on the real-time timer for ``--duration`` wall seconds,
  process CPU time per update (the run's timer is read once more per update
  with a deadline, and the run's deadline monitor, `_runtime.overdue`, adds
  a lock per update and its thread's wakeups, counted in the process's CPU
  time); noisier: the machine's load moves the wakeups.

The script imports ``mujou_actors`` from ``sys.path`` in its children: the
tree that runs it (its parent folder) unless ``PYTHONPATH`` says otherwise.

Usage::

    python benchmarks/deadlines.py [--duration 10] [--nodes 10] [--repeat 7]
                                   [--only CASE,...] [--quick] [--json PATH]
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
CASES = ("plain", "budget", "deadline", "rt-plain", "rt-deadline")


def run_child(case: str, duration: float, nodes: int) -> dict[str, Any]:
    """CPU time of ``duration`` s of steady running of the ``nodes``-node net, and its updates."""
    import time

    import torch

    import mujou_actors as mujou

    torch.set_num_threads(1)
    declared: dict[str, Any] = {"plain": {}, "budget": {"budget": 0.5},
                                "deadline": {"deadline": 0.0005}, "rt-plain": {},
                                "rt-deadline": {"deadline": 0.0005}}[case]
    realtime = case.startswith("rt-")

    class Counter(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.001, **declared)
            self.total = 0

        def on_update(self, dt: float) -> None:
            self.total += 1

    def timed(seconds: float) -> tuple[float, int]:
        net = {f"n{i}": Counter() for i in range(nodes)}
        t0 = time.process_time()
        run = mujou.run(net, timer="realtime" if realtime else "simulated", workers=1,
                        duration=seconds, seed=0)
        run.join()
        return time.process_time() - t0, sum(s.updates for s in run.stats().nodes.values())

    timed(0.05)
    cpu1, updates1 = timed(duration)
    cpu2, updates2 = timed(2 * duration)
    return {"cpu": cpu2 - cpu1, "updates": updates2 - updates1, "mujou": mujou.__file__}


def _spawn(case: str, args: argparse.Namespace) -> dict[str, Any]:
    duration = args.duration if not case.startswith("rt-") else args.rt_duration
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"import deadlines; print(json.dumps(deadlines.run_child({case!r}, {duration!r}, "
            f"{args.nodes!r})))")
    env = {**os.environ}
    env.setdefault("PYTHONPATH", str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"case {case} failed:\n{proc.stdout}\n{proc.stderr}")
    found: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


def main() -> None:
    """Run the cases alternately, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0,
                        help="simulated seconds of the timed run (default 10)")
    parser.add_argument("--rt-duration", type=float, default=2.0,
                        help="wall seconds of the real-time cases' timed run (default 2)")
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--only", default=",".join(CASES))
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 0.1 s, 4 nodes, 1 repetition (tests)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.quick:
        args.duration, args.rt_duration, args.nodes, args.repeat = 0.1, 0.1, 4, 1
    cases = [c for c in args.only.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {unknown}; the cases are {list(CASES)}")
    samples: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    for _ in range(args.repeat):
        for case in cases:
            samples[case].append(_spawn(case, args))
    medians = {c: statistics.median(s["cpu"] / s["updates"] * 1e6 for s in samples[c])
               for c in cases}
    print(f"per update, {args.nodes} nodes at 1 kHz, medians of {args.repeat} fresh processes "
          f"({platform.machine()}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f})")
    print(f"{'case':<14}{'µs/update':>12}{'vs plain':>12}")
    for case in cases:
        base = "rt-plain" if case.startswith("rt-") else "plain"
        extra = (f"{medians[case] - medians[base]:+.3f}" if base in medians and case != base
                 else "")
        print(f"{case:<14}{medians[case]:>12.3f}{extra:>12}")
    if args.json:
        Path(args.json).write_text(json.dumps({"samples": samples, "medians": medians,
                                               "args": vars(args)}, indent=1))


if __name__ == "__main__":
    main()
