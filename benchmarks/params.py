"""What runtime parameters cost: nothing to a node without one, a little per update to one with.

What is measured
----------------
Every case runs in a fresh Python process; the cases run alternately,
repetition by repetition, and the table gives their medians.

* **Per update, in a run** (``plain``, ``declared``): ``--nodes`` periodic
  nodes at 1 kHz, each adding a plain attribute to a counter in its
  ``on_update``, simulated time, one worker. A short run first (imports,
  caches), then a run of ``--duration`` simulated seconds and one of twice
  that, each on a fresh net, timed by process CPU time; the difference is
  the cost of ``--duration`` seconds of steady running without what starting
  and ending a run costs. In ``plain`` the node class declares no parameter;
  in ``declared`` it declares one (``mujou.Param(0.01, range=(0.0, 1.0))``)
  that is never set nor read: ``declared - plain`` is the guard that applies
  due sets before each update, when none is queued. With ``--baseline PATH``
  (a checkout of another commit, for instance the one before parameters
  existed), ``plain`` also runs on that tree: ``plain@baseline`` beside
  ``plain`` is what the feature costs a net that does not use it.
* **Reading and writing** (``access``), ns per operation, the best of 5
  loops of ``--ops`` each: reading a plain attribute of a node, a parameter
  never set (its default), a parameter once set; writing a plain attribute
  and a parameter (a node's own write, checked against the range). And the
  guard alone, on the node's real update wrapper (`params.guard_params`) with
  a stand-in actor: an update with no set queued, less the bare update; and
  one set queued then applied (``ParamState.add``, the slot's write, the
  default ``on_param``) per update, less an update with none.
* **A host call** (``write``, ``set_param``, ``set_param+record``,
  ``placed-write``, ``placed``): a real-time run of one node with a parameter
  (period 50 ms) and an Input; the host makes ``--calls`` calls in a row,
  each timed (``time.perf_counter``): ``run.write`` of a float (for
  comparison), ``run.set_param`` (checked, queued on the node), the same
  with the run recorded (each set kept as an attachment: the writer thread's
  share is in **CPU µs/call**, the process's CPU time per call), and
  ``run.write`` and ``run.set_param`` on a placed run whose node runs in a
  group process (``--calls`` / 10 calls each: a round trip to the group).

The script imports ``mujou_actors`` from ``sys.path`` in its children: the
tree that runs it (its parent folder) unless ``PYTHONPATH`` says otherwise.

Usage::

    python benchmarks/params.py [--duration 20] [--nodes 10] [--ops 200000]
                                [--calls 2000] [--repeat 7] [--baseline PATH]
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
RUNS = ("plain", "declared")
HOST = ("write", "set_param", "set_param+record", "placed-write", "placed")
CASES = (*RUNS, "access", *HOST)
# The figures of the access case, in the table's order: (key, what it is)
ACCESS = (("read_plain", "read a plain attribute"),
          ("read_default", "read a parameter never set"),
          ("read_set", "read a parameter once set"),
          ("write_plain", "write a plain attribute"),
          ("write_param", "write a parameter (checked)"),
          ("guard", "guard, no set queued (per update)"),
          ("apply", "queue + apply one set (per update)"))


def run_child(case: str, duration: float, nodes: int) -> dict[str, Any]:
    """CPU time of ``duration`` s of steady running of the ``nodes``-node net, and its updates."""
    import time

    import torch

    import mujou_actors as mujou

    torch.set_num_threads(1)

    class Plain(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.001)
            self.gain = 0.01
            self.total = 0.0

        def on_update(self, dt: float) -> None:
            self.total += self.gain

    cls: type = Plain
    if case == "declared":
        class Declared(Plain):
            noise = mujou.Param(0.01, range=(0.0, 1.0), description="never set nor read")

        cls = Declared

    def timed(seconds: float) -> tuple[float, int]:
        net = {f"n{i}": cls() for i in range(nodes)}
        t0 = time.process_time()
        run = mujou.run(net, timer="simulated", workers=1, duration=seconds, seed=0)
        run.join()
        return time.process_time() - t0, sum(s.updates for s in run.stats().nodes.values())

    timed(0.05)
    cpu1, updates1 = timed(duration)
    cpu2, updates2 = timed(2 * duration)
    return {"cpu": cpu2 - cpu1, "updates": updates2 - updates1, "mujou": mujou.__file__}


def access_child(ops: int) -> dict[str, Any]:
    """ns per read, write, guarded update and applied set (the best of 5 loops each)."""
    import time
    from types import SimpleNamespace

    import mujou_actors as mujou
    from mujou_actors.params import ParamState, guard_params

    class Sensor(mujou.Node):
        noise = mujou.Param(0.01, range=(0.0, 1.0))

        def __init__(self) -> None:
            super().__init__(period=0.001)
            self.plain = 0.01

    unset, once = Sensor(), Sensor()
    once.noise = 0.02

    def best(loop: Any, *args: Any) -> float:
        times = []
        for _ in range(5):
            t0 = time.perf_counter_ns()
            loop(*args)
            times.append(time.perf_counter_ns() - t0)
        return min(times) / ops

    # Each loop is the same Python around one operation; an empty loop's time is taken off.
    def empty(node: Any) -> None:
        for _ in range(ops):
            pass

    def read_plain(node: Any) -> None:
        for _ in range(ops):
            node.plain  # noqa: B018

    def read_param(node: Any) -> None:
        for _ in range(ops):
            node.noise  # noqa: B018

    def write_plain(node: Any) -> None:
        for _ in range(ops):
            node.plain = 0.03

    def write_param(node: Any) -> None:
        for _ in range(ops):
            node.noise = 0.03

    floor = best(empty, unset)
    found = {"read_plain": best(read_plain, unset) - floor,
             "read_default": best(read_param, unset) - floor,
             "read_set": best(read_param, once) - floor,
             "write_plain": best(write_plain, once) - floor,
             "write_param": best(write_param, once) - floor}

    # The guard as a run installs it, on a stand-in for the node's actor: an update
    # function, the flight record whose stamp is the update's key, the node.
    def bare_update(node: Any, dt: float) -> None:
        pass

    node = Sensor()
    sets = ParamState()
    actor = SimpleNamespace(node=node, update=bare_update, flight=[None, (1_000_000, 0)])
    guard_params(actor, sets)
    guarded = actor.update

    def updates(update: Any) -> None:
        for _ in range(ops):
            update(node, 0.001)

    def set_each(update: Any) -> None:
        add = sets.add
        for _ in range(ops):
            add(1_000_000, 0, "noise", 0.02)
            update(node, 0.001)

    plain = best(updates, bare_update)
    guard = best(updates, guarded)
    found["guard"] = guard - plain
    found["apply"] = best(set_each, guarded) - guard
    found["mujou"] = mujou.__file__
    return found


def host_child(case: str, calls: int) -> dict[str, Any]:
    """Per call of the host's ``run.write`` or ``run.set_param``: wall µs (median, p99), CPU µs."""
    import tempfile
    import time

    import _placed_nets as nets  # (by this name: a placed run's group imports it too)

    import mujou_actors as mujou

    kwargs: dict[str, Any] = {"timer": "realtime"}
    folder = tempfile.TemporaryDirectory()
    if case == "set_param+record":
        kwargs["record"] = os.path.join(folder.name, "params.mcap")
    if case.startswith("placed"):
        calls = max(10, calls // 10)
        run = mujou.run(nets.make_tuned, placement={"tuned": "g"}, **kwargs)
    else:
        run = mujou.run(nets.make_tuned(), **kwargs)
    try:
        if case.endswith("write"):
            def call(i: int) -> None:
                run.write("tuned.level", 0.5)
        else:
            def call(i: int) -> None:
                run.set_param("tuned.noise", 0.01 + 1e-6 * (i % 100))
        for i in range(min(50, calls)):  # first calls: caches, the group's first request
            call(i)
        walls = []
        cpu0 = time.process_time()
        for i in range(calls):
            t0 = time.perf_counter()
            call(i)
            walls.append(time.perf_counter() - t0)
        cpu = time.process_time() - cpu0
    finally:
        run.stop()
        run.join()
        folder.cleanup()
    walls.sort()
    return {"calls": calls, "wall_us": 1e6 * statistics.median(walls),
            "p99_us": 1e6 * walls[min(len(walls) - 1, round(0.99 * len(walls)))],
            "cpu_us": 1e6 * cpu / calls, "mujou": mujou.__file__}


def spawn(case: str, args: argparse.Namespace, tree: Path) -> dict[str, Any]:
    """One case in a fresh Python process, importing ``mujou_actors`` from ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [sys.executable, __file__, "--child", case, "--duration", str(args.duration),
               "--nodes", str(args.nodes), "--ops", str(args.ops), "--calls", str(args.calls)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True,
                         timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=20.0, help="simulated seconds")
    parser.add_argument("--nodes", type=int, default=10, help="nodes of the run's net")
    parser.add_argument("--ops", type=int, default=200_000, help="operations per loop")
    parser.add_argument("--calls", type=int, default=2000, help="host calls per case")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout: its plain net runs beside this tree's")
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 repeat")
    parser.add_argument("--only", default=None,
                        help=f"comma-separated cases to run (default: all of {','.join(CASES)})")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child in RUNS:
        print(json.dumps(run_child(args.child, args.duration, args.nodes)))
        return 0
    if args.child == "access":
        print(json.dumps(access_child(args.ops)))
        return 0
    if args.child:
        print(json.dumps(host_child(args.child, args.calls)))
        return 0
    if args.quick:
        args.duration, args.nodes, args.ops, args.calls, args.repeat = 0.1, 4, 20_000, 200, 1
    only = CASES if args.only is None else tuple(args.only.split(","))
    unknown = [case for case in only if case not in CASES]
    if unknown or not only:
        parser.error(f"--only: no case {', '.join(unknown)}; choose from {', '.join(CASES)}")
    here = Path(os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or ROOT).resolve()
    rows = [(case, here) for case in CASES if case in only]
    if args.baseline is not None and "plain" in only:
        rows.insert(1, ("plain@baseline", args.baseline.resolve()))
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in rows}
    for _ in range(args.repeat):  # alternately, repetition by repetition
        for name, tree in rows:
            samples[name].append(spawn(name.split("@")[0], args, tree))

    from mujou_actors import _runtime  # (this tree's: the children import the same)

    print(f"mujou_actors {here}" + (f" (baseline {args.baseline})" if args.baseline else ""))
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"kernel {_runtime.BUILD}; medians of {args.repeat} fresh processes")
    medians: dict[str, dict[str, float]] = {}
    runs = [name for name in samples if name.split("@")[0] in RUNS]
    for name in runs:
        cpus = [s["cpu"] for s in samples[name]]
        updates = max(1, samples[name][-1]["updates"])
        medians[name] = {"cpu": statistics.median(cpus),
                         "us_per_update": 1e6 * statistics.median(cpus) / updates,
                         "us_per_update_min": 1e6 * min(cpus) / updates}
    if runs:
        print(f"\nper update: {args.nodes} nodes at 1 kHz, {args.duration:g} s simulated, "
              "1 worker")
        print(f"{'case':16s} {'CPU s (min-max)':>24s} {'updates':>8s} {'µs/update':>10s} "
              f"{'(best)':>8s} {'vs plain':>9s}")
    for name in runs:
        cpus = [s["cpu"] for s in samples[name]]
        m = medians[name]
        more = (f"{m['us_per_update'] - medians['plain']['us_per_update']:+9.3f}"
                if "plain" in medians else "")
        print(f"{name:16s} {m['cpu']:9.3f} ({min(cpus):6.3f}-{max(cpus):6.3f}) "
              f"{samples[name][-1]['updates']:8d} {m['us_per_update']:10.3f} "
              f"{m['us_per_update_min']:8.3f} {more:>9s}")
    if "access" in samples:
        print(f"\nreading and writing: ns per operation, best of 5 loops of {args.ops}")
        medians["access"] = {key: _median(samples["access"], key) for key, _ in ACCESS}
        for key, what in ACCESS:
            values = [s[key] for s in samples["access"]]
            print(f"  {what:36s} {medians['access'][key]:8.1f} "
                  f"({min(values):.1f}-{max(values):.1f})")
    hosts = [name for name in HOST if name in samples]
    if hosts:
        print(f"\na host call: µs per call, real time, {args.calls} calls in a row "
              f"({max(10, args.calls // 10)} placed)")
        print(f"{'case':18s} {'wall µs':>9s} {'p99 µs':>9s} {'CPU µs/call':>12s}")
    for name in hosts:
        medians[name] = {key: _median(samples[name], key)
                         for key in ("wall_us", "p99_us", "cpu_us")}
        m = medians[name]
        print(f"{name:18s} {m['wall_us']:9.1f} {m['p99_us']:9.1f} {m['cpu_us']:12.1f}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "benchmark": "params", "machine": platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "build": str(_runtime.BUILD),
            "duration": args.duration, "nodes": args.nodes, "ops": args.ops,
            "calls": args.calls, "repeat": args.repeat, "medians": medians,
            "samples": samples}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
