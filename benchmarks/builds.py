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

``--cython`` adds a third build, for the comparison issue 29 asked for: the
same kernel modules (``compiled.MODULES``) compiled by Cython instead of
mypyc, in Cython's pure-Python mode (the ``.py`` files as they are,
``language_level=3``, annotations read as types), in a copy of the package in
a temporary folder with the manifest the import guard reads. Its children
run that copy (``PYTHONPATH``) and must report a ``cython`` build. Needs
Cython (the ``bench`` extra installs it) and a C compiler; the build takes
about two minutes on the 2-core reference machine. The project's build
stays mypyc's: see docs/performance.md, "Cython against mypyc".

Every figure is the process's CPU time (``time.process_time``: every thread,
user and system) across ``run.join()``, not its wall time: on a loaded
machine a thread that waits for a CPU is not charged for it. The table gives
the median over the repetitions of each build (min-max beside it) and
**pure/compiled**, the pure build's median over the compiled one's (above 1:
the compiled build is faster). Every child's figures and build go to the
JSON (``--json``, default ``results/builds.json``).

Usage::

    python benchmarks/builds.py [--repeat 7] [--inner 3] [--steps 20000] [--cython]
                                [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE_DIR = HERE.parent / "mujou_actors"
DEFAULT_JSON = HERE / "results" / "builds.json"
BUILDS = ("compiled", "python")
CYTHON_BUILD_TIMEOUT_S = 1800.0  # bound on the Cython build (C compile of six modules)
# Run in the copy by a fresh interpreter: cythonize the kernel's modules in place.
_CYTHON_SETUP = """
import sys
from Cython.Build import cythonize
from setuptools import Extension, setup
modules = sys.argv[1].split(",")
exts = [Extension("mujou_actors._runtime." + m, ["mujou_actors/_runtime/" + m + ".py"])
        for m in modules]
setup(name="mujou_cython_trial", script_args=["build_ext", "--inplace"],
      ext_modules=cythonize(exts, compiler_directives={"language_level": 3}, quiet=True))
"""
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


def build_cython(into: Path) -> str:
    """Copy the package into ``into`` and compile its kernel modules there with Cython.

    The copy leaves out this tree's extension modules and manifest; the
    modules of ``compiled.MODULES`` are compiled next to their sources and a
    manifest in the format of ``setup.py``'s records their source hashes, so
    that the copy's import guard runs them (``BUILD``: ``compiled (cython
    X.Y.Z: ...)``).

    Args:
        into (Path): an empty folder; the package goes to ``into/mujou_actors``.

    Returns:
        str: the compiler, as the manifest names it (``cython 3.3.1``).

    Raises:
        RuntimeError: Cython is not installed, or the build failed (its output).
    """
    try:
        import Cython
    except ImportError:
        raise RuntimeError("--cython needs Cython: pip install -e '.[bench]'") from None
    # The guard's module, by path (standard library only), as setup.py loads it.
    spec = importlib.util.spec_from_file_location("_mujou_compiled",
                                                  PACKAGE_DIR / "_runtime" / "compiled.py")
    assert spec is not None and spec.loader is not None
    compiled = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = compiled  # its dataclasses look their module up
    spec.loader.exec_module(compiled)
    shutil.copytree(PACKAGE_DIR, into / "mujou_actors",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", compiled.MANIFEST,
                                                  "__pycache__"))
    done = subprocess.run([sys.executable, "-c", _CYTHON_SETUP, ",".join(compiled.MODULES)],
                          cwd=into, capture_output=True, text=True,
                          timeout=CYTHON_BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the Cython build failed:\n{done.stdout}\n{done.stderr}")
    runtime = into / "mujou_actors" / "_runtime"
    compiler = f"cython {Cython.__version__}"
    compiled.write_manifest(runtime, runtime, compiler)
    return compiler


def _environ(build: str, trees: dict[str, Path]) -> dict[str, str]:
    """The environment of a child under ``build``.

    compiled: as installed; python: ``MUJOU_PURE=1``; a build in ``trees``
    (cython): its copy of the package first on ``PYTHONPATH``.
    """
    env = {k: v for k, v in os.environ.items() if k != "MUJOU_PURE"}
    if build == "python":
        env["MUJOU_PURE"] = "1"
    if build in trees:
        env["PYTHONPATH"] = os.pathsep.join([str(trees[build])] + (
            [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _ran(build: str, result: dict) -> bool:
    """Whether a child's reported build is ``build`` (a Cython build says so in its name)."""
    kind, name = result["build"]
    if build == "cython":
        return kind == "compiled" and "cython" in name
    return kind == build and "cython" not in name


def run_child(build: str, steps: int, inner: int, trees: dict[str, Path]) -> dict:
    """One child process under ``build``: its figures and the build it ran."""
    done = subprocess.run([sys.executable, __file__, "--child", "--steps", str(steps),
                           "--inner", str(inner)], env=_environ(build, trees),
                          capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {build} child failed:\n{done.stderr}")
    result = json.loads(done.stdout.splitlines()[-1])
    if not _ran(build, result):  # the build changed under the script
        raise RuntimeError(f"the {build} child ran {result['build'][1]}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Alternate the builds' children, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="children per build")
    parser.add_argument("--inner", type=int, default=3, help="runs of each work per child")
    parser.add_argument("--steps", type=int, default=20_000, help="RL steps per run")
    parser.add_argument("--cython", action="store_true",
                        help="add the kernel compiled by Cython (built in a temporary copy)")
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
                           text=True, timeout=300, check=True, env=_environ("compiled", {}))
    kind, build = json.loads(probe.stdout.splitlines()[-1])
    if kind != "compiled":
        print(f"no compiled build to compare with: this tree runs {build}; build it first "
              "with `pip install -e .` (a C compiler and mypy needed)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="mujou-cython-") as tmp:
        trees: dict[str, Path] = {}
        if args.cython:
            t0 = time.perf_counter()
            compiler = build_cython(Path(tmp))
            trees["cython"] = Path(tmp)
            print(f"built the kernel with {compiler} in {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr)
        builds = BUILDS + tuple(trees)
        runs = _alternate(builds, args, trees)
    _print_table(builds, runs)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"benchmark": "builds", "repeat": args.repeat,
                                     "inner": args.inner, "steps": args.steps,
                                     "clock": "process CPU", "units": UNITS, "runs": runs},
                                    indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


def _alternate(builds: tuple[str, ...], args: argparse.Namespace,
               trees: dict[str, Path]) -> dict[str, list[dict]]:
    """``args.repeat`` children per build, the order rotated each repetition."""
    runs: dict[str, list[dict]] = {build: [] for build in builds}
    for rep in range(args.repeat):
        shift = rep % len(builds)
        for build in builds[shift:] + builds[:shift]:
            runs[build].append(run_child(build, args.steps, args.inner, trees))
            print(f"repetition {rep + 1}/{args.repeat}: {build} done", file=sys.stderr)
    return runs


def _print_table(builds: tuple[str, ...], runs: dict[str, list[dict]]) -> None:
    """Median (min-max) per build and work, and each other build's median over compiled's."""
    print("; ".join(f"{build}: {runs[build][0]['build'][1]}" for build in builds))
    others = [b for b in builds if b != "compiled"]
    print(f"{'work':<11} {'unit':<10}" + "".join(f" {b + ' (median, min-max)':>28}"
                                                 for b in builds)
          + "".join(f" {b + '/compiled':>16}" for b in others))
    for name in UNITS:
        xs = {b: [r["figures"][name] for r in runs[b]] for b in builds}
        cells = "".join(f" {f'{statistics.median(v):.3g} ({min(v):.3g}-{max(v):.3g})':>28}"
                        for v in xs.values())
        ratios = "".join(f" {statistics.median(xs[b]) / statistics.median(xs['compiled']):>16.2f}"
                         for b in others)
        print(f"{name:<11} {UNITS[name]:<10}{cells}{ratios}")


if __name__ == "__main__":
    sys.exit(main())
