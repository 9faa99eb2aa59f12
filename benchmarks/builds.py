"""The compiled build against the pure-Python one, side by side: fresh processes, alternating.

What is measured
----------------
Each repetition starts one child process per build, in alternating order
(compiled first in even repetitions, pure first in odd ones): the compiled
build as it is installed (``pip install --no-build-isolation
-e .``), the pure one in the same tree with ``MUJOU_PURE=1``, which loads
every compiled module from its source. Each child runs a short warm-up, then
``--inner`` runs of each work and reports their median:

* **rl** -- the trivial RL step of ``benchmarks/rlstep.py`` (``full``: an
  ``env`` node every 8 ms, a ``policy`` triggered by it, a ``recorder``
  triggered by both; float32 tensors sent from buffers the senders keep, so
  each send copies; statistics on), ``--steps`` steps; **rl floats**, the
  same net sending Python floats (no tensor copy: what is left is the
  framework). Figure: µs per step.
* **ticks10**, **ticks1000** -- 10 and 1,000 no-op nodes (``common.NoOp``,
  10 ms period, simulated timer, ``workers=1``, as ``benchmarks/dispatch.py``'s
  *uniform* case), about 100,000 updates. Figure: ns per update.

Every figure is the process's CPU time (``time.process_time``: every thread,
user and system) across ``run.join()``, not its wall time: on a loaded
machine a thread that waits for a CPU is not charged for it. The table gives
the median over the repetitions of each build (min-max beside it) and
**pure/compiled**, the pure build's median over the compiled one's (above 1:
the compiled build is faster). Every child's figures and build go to the
JSON (``--json``, default ``results/builds.json``).

Usage::

    python benchmarks/builds.py [--repeat 7] [--inner 3] [--steps 20000] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "builds.json"
BUILDS = ("compiled", "python")
# (nodes, simulated seconds): about 100,000 updates of 10 ms nodes each.
TICKS = {"ticks10": (10, 100.0), "ticks1000": (1000, 1.0)}
UNITS = {"rl": "µs/step", "rl floats": "µs/step", "ticks10": "ns/update",
         "ticks1000": "ns/update"}


def _rl_us(steps: int, kind: type) -> float:
    """CPU µs per step of rlstep.py's net (full, or with ``kind`` messages)."""
    import rlstep

    run = rlstep.mujou.run(rlstep.make_net(kind, False, True), timer="simulated",
                           duration=steps * 0.008)
    c0 = time.process_time()
    run.join(timeout=600)
    return (time.process_time() - c0) / steps * 1e6


def _ticks_ns(nodes: int, seconds: float) -> float:
    """CPU ns per no-op update of ``nodes`` nodes over ``seconds`` of simulated time."""
    import dispatch

    result = dispatch.run_mujou(dispatch.periods_ns("uniform", nodes), round(seconds * 1e9))
    return 1e9 / result["cpu_rate"]


def child(steps: int, inner: int) -> dict:
    """Measure every work in this process (one build); the figures and the build."""
    sys.path.insert(0, str(HERE))
    import torch

    from mujou_actors import _runtime

    def work(name: str, scale: float) -> float:
        if name.startswith("rl"):
            return _rl_us(round(steps * scale), float if name == "rl floats" else torch.Tensor)
        nodes, seconds = TICKS[name]
        return _ticks_ns(nodes, seconds * scale)

    for name in UNITS:  # warm-up: imports, first calls
        work(name, 0.05)
    figures: dict[str, list[float]] = {name: [] for name in UNITS}
    for _ in range(inner):  # alternated, so that a slow spell hits every work
        for name in UNITS:
            figures[name].append(work(name, 1.0))
    return {"build": [_runtime.BUILD.kind, str(_runtime.BUILD)],
            "figures": {name: statistics.median(xs) for name, xs in figures.items()}}


def _environ(build: str) -> dict[str, str]:
    """The environment of a child under ``build`` (compiled: as built; python: MUJOU_PURE=1)."""
    env = {k: v for k, v in os.environ.items() if k != "MUJOU_PURE"}
    if build == "python":
        env["MUJOU_PURE"] = "1"
    return env


def run_child(build: str, steps: int, inner: int) -> dict:
    """One child process under ``build``: its figures and the build it ran."""
    done = subprocess.run([sys.executable, __file__, "--child", "--steps", str(steps),
                           "--inner", str(inner)], env=_environ(build), capture_output=True,
                          text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {build} child failed:\n{done.stderr}")
    result = json.loads(done.stdout.splitlines()[-1])
    if result["build"][0] != build:  # the build changed under the script
        raise RuntimeError(f"the {build} child ran {result['build'][1]}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Alternate the builds' children, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="children per build")
    parser.add_argument("--inner", type=int, default=3, help="runs of each work per child")
    parser.add_argument("--steps", type=int, default=20_000, help="RL steps per run")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.steps, args.inner)))
        return 0
    if args.probe:
        from mujou_actors import _runtime

        print(json.dumps([_runtime.BUILD.kind, str(_runtime.BUILD)]))
        return 0
    probe = subprocess.run([sys.executable, __file__, "--probe"], capture_output=True,
                           text=True, timeout=300, check=True, env=_environ("compiled"))
    kind, build = json.loads(probe.stdout.splitlines()[-1])
    if kind != "compiled":
        print(f"no compiled build to compare with: this tree runs {build}; build it first "
              "with `pip install -e .` (a C compiler and mypy needed)", file=sys.stderr)
        return 2
    runs: dict[str, list[dict]] = {build: [] for build in BUILDS}
    for rep in range(args.repeat):
        for build in (BUILDS if rep % 2 == 0 else BUILDS[::-1]):
            runs[build].append(run_child(build, args.steps, args.inner))
            print(f"repetition {rep + 1}/{args.repeat}: {build} done", file=sys.stderr)
    names = list(UNITS)
    medians = {build: {name: [r["figures"][name] for r in runs[build]] for name in names}
               for build in BUILDS}
    print(f"compiled: {runs['compiled'][0]['build'][1]}")
    print(f"{'work':<11} {'unit':<10} {'compiled (median, min-max)':>28} "
          f"{'python (median, min-max)':>28} {'pure/compiled':>14}")
    for name in names:
        cells = []
        for build in BUILDS:
            xs = medians[build][name]
            cells.append(f"{statistics.median(xs):.3g} ({min(xs):.3g}-{max(xs):.3g})")
        ratio = statistics.median(medians["python"][name]) / statistics.median(
            medians["compiled"][name])
        print(f"{name:<11} {UNITS[name]:<10} {cells[0]:>28} {cells[1]:>28} {ratio:>14.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"benchmark": "builds", "repeat": args.repeat,
                                     "inner": args.inner, "steps": args.steps,
                                     "clock": "process CPU", "units": UNITS, "runs": runs},
                                    indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
