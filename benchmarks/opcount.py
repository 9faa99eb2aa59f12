"""Python bytecodes and calls the framework executes per unit of work: exact, load-independent.

What is measured
----------------
Wall-clock rates on a shared machine swing by 10-40 % between runs; the
number of bytecode instructions the interpreter executes does not. This
script counts them, with ``sys.settrace`` and ``f_trace_opcodes`` on the
run's worker thread (``mujou-worker-*``) only, for each workload:

* **ticks10** / **ticks1000**: 10 or 1,000 no-op periodic nodes (10 ms
  period), simulated timer, one worker; unit: one update.
* **rl**: the shape of an RL loop with trivial hooks: an ``env`` node
  (periodic, 8 ms) sends an observation tensor (11 float32, its own buffer)
  and reads the newest action; a ``policy`` node, triggered by the
  observation, sends an action tensor (3 float32); a ``recorder``,
  triggered by both, drains them. Unit: one RL step (one env update, one
  policy update, two recorder updates, two sends to two readers each).
* **floor**: the heap floor of ``benchmarks/common.py`` (a ``heapq`` of due
  times calling the same no-op method) for the 10-node schedule; unit: one
  update. What a scheduler with no bookkeeping at all executes.

Each workload runs twice, for ``N`` and ``2N`` units; the figures are the
difference divided by ``N``, so starting and stopping the run cancel out.
The worker's bytecodes are grouped by the part of the framework that runs
them (the module; ``hooks`` is the workload's own code) and by function.

Figures: **ops/unit** (bytecode instructions), **calls/unit** (Python
function calls; C functions such as ``Tensor.clone`` are not counted, nor
is their time: read this with the wall-clock benchmarks, never instead of
them). Tracing slows the run about 50-fold; it does not change what runs.

Usage::

    python benchmarks/opcount.py [--only ticks10,rl] [--top 12] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import heapq
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import torch

import mujou_actors as mujou

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import NoOp  # noqa: E402

# The part of the framework each module belongs to (the rest: "other").
PARTS = {
    "dispatcher.py": "dispatcher", "calendar.py": "dispatcher", "policy.py": "dispatcher",
    "actor.py": "actor", "mailbox.py": "actor", "keys.py": "actor",
    "sends.py": "sends", "messages.py": "sends", "devices.py": "sends",
    "ports.py": "ports", "opcount.py": "hooks", "common.py": "hooks",
}


class Env(mujou.Node):
    """Sends its observation buffer every 8 ms; reads the newest action (trivial: no physics)."""

    action = mujou.Input(torch.Tensor, depth=1)
    obs = mujou.Output(torch.Tensor)

    def __init__(self) -> None:
        super().__init__(period=0.008)
        self.buffer = torch.zeros(11)

    def on_start(self) -> None:
        self.obs.send(self.buffer)

    def on_update(self, dt: float) -> None:
        self.action.read()
        self.obs.send(self.buffer)


class Policy(mujou.Node):
    """Triggered by each observation; sends its action buffer (trivial: no network)."""

    obs = mujou.Input(torch.Tensor, depth=1)
    action = mujou.Output(torch.Tensor)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.buffer = torch.zeros(3)

    def on_update(self, dt: float) -> None:
        self.obs.read()
        self.action.send(self.buffer)


class Recorder(mujou.Node):
    """Triggered by both; counts what it drains."""

    obs = mujou.Input(torch.Tensor, depth=None)
    action = mujou.Input(torch.Tensor, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += len(self.obs.drain()) + len(self.action.drain())


class RL(mujou.Node):
    """env -> policy -> env, both recorded."""

    def __init__(self) -> None:
        super().__init__(period=None)
        self.env, self.policy, self.recorder = Env(), Policy(), Recorder()
        mujou.connect(self.env.obs, self.policy.obs)
        mujou.connect(self.policy.action, self.env.action)
        mujou.connect(self.env.obs, self.recorder.obs)
        mujou.connect(self.policy.action, self.recorder.action)


def ticks_net(n: int) -> mujou.Node:
    """``n`` no-op nodes with a 10 ms period under a root without one."""
    root = mujou.Node(period=None)
    for i in range(n):
        setattr(root, f"n{i}", NoOp(period=0.01))
    return root


class Counter:
    """Counts bytecodes and calls by ``(module file, function)`` while enabled."""

    def __init__(self) -> None:
        self.ops: collections.Counter[tuple[str, str]] = collections.Counter()
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()

    def _where(self, frame: FrameType) -> tuple[str, str]:
        return Path(frame.f_code.co_filename).name, frame.f_code.co_name

    def tracer(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        """The global trace function: counts the call, traces the frame's opcodes."""
        frame.f_trace_opcodes = True
        self.calls[self._where(frame)] += 1
        return self._local

    def _local(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        if event == "opcode":
            self.ops[self._where(frame)] += 1
        return self._local


def traced_workers(counter: Counter) -> Callable[[], None]:
    """Trace every ``mujou-worker-*`` thread started from now on; returns the undo."""
    original = threading.Thread.run

    def run(self: threading.Thread) -> None:
        if not self.name.startswith("mujou-worker"):
            original(self)
            return
        sys.settrace(counter.tracer)
        try:
            original(self)
        finally:
            sys.settrace(None)

    threading.Thread.run = run  # type: ignore[method-assign]

    def undo() -> None:
        threading.Thread.run = original  # type: ignore[method-assign]

    return undo


def count_run(make: Callable[[], mujou.Node], duration: float) -> Counter:
    """Run ``make()`` for ``duration`` simulated seconds, counting the worker's bytecodes."""
    counter = Counter()
    undo = traced_workers(counter)
    try:
        run = mujou.run(make(), timer="simulated", duration=duration)
        run.join(timeout=600)
    finally:
        undo()
    return counter


def count_floor(n: int, updates: int) -> Counter:
    """The heap floor (benchmarks/common.py) for ``updates`` updates of ``n`` nodes, traced."""
    nodes = [NoOp(period=0.01) for _ in range(n)]
    counter = Counter()
    period = 10_000_000
    sys.settrace(counter.tracer)
    try:
        _floor(nodes, period, updates)
    finally:
        sys.settrace(None)
    return counter


def _floor(nodes: list[NoOp], period: int, updates: int) -> None:
    heap = [(period, i) for i in range(len(nodes))]
    heapq.heapify(heap)
    last = [0] * len(nodes)
    for _ in range(updates):
        due, i = heap[0]
        nodes[i].on_update((due - last[i]) / 1e9)
        last[i] = due
        heapq.heapreplace(heap, (due + period, i))


WORKLOADS: dict[str, tuple[Callable[[float], Counter], float, float]] = {
    # name: (count(units) -> Counter, units per simulated second (or per unit), base units)
    "ticks10": (lambda units: count_run(lambda: ticks_net(10), units / 1000), 1, 2_000),
    "ticks1000": (lambda units: count_run(lambda: ticks_net(1000), units / 100_000), 1, 20_000),
    "rl": (lambda units: count_run(RL, units * 0.008), 1, 1_000),
    "floor": (lambda units: count_floor(10, int(units)), 1, 2_000),
}


def marginal(short: Counter, long: Counter, units: float) -> dict[str, Any]:
    """Per-unit figures from a run of ``units`` and one of ``2 * units``."""
    keys = set(short.ops) | set(long.ops) | set(long.calls)
    per_fn = {k: ((long.ops[k] - short.ops[k]) / units, (long.calls[k] - short.calls[k]) / units)
              for k in keys}
    parts: dict[str, float] = collections.defaultdict(float)
    for (module, _), (ops, _) in per_fn.items():
        parts[PARTS.get(module, "other")] += ops
    return {
        "ops": sum(ops for ops, _ in per_fn.values()),
        "calls": sum(calls for _, calls in per_fn.values()),
        "parts": dict(sorted(parts.items(), key=lambda kv: -kv[1])),
        "functions": {f"{m}:{f}": {"ops": o, "calls": c}
                      for (m, f), (o, c) in sorted(per_fn.items(), key=lambda kv: -kv[1][0])
                      if abs(o) >= 0.05 or abs(c) >= 0.005},
    }


def main(argv: list[str] | None = None) -> int:
    """Count every workload named, print a table each, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="comma-separated workloads: " + ", ".join(WORKLOADS))
    parser.add_argument("--top", type=int, default=12, help="functions shown per workload")
    parser.add_argument("--quick", action="store_true", help="a tenth of the units")
    parser.add_argument("--json", default=str(HERE / "results" / "opcount.json"))
    args = parser.parse_args(argv)
    names = list(WORKLOADS)
    if args.only is not None:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in WORKLOADS]
        if unknown or not names:
            parser.error(f"--only: no workload {', '.join(unknown)}; choose from "
                         + ", ".join(WORKLOADS) if unknown else "--only: name a workload")
    from rich.console import Console
    from rich.table import Table

    console = Console()
    results = {}
    for name in names:
        count, _, base = WORKLOADS[name]
        units = max(50, int(base / 10)) if args.quick else base
        figures = marginal(count(units), count(2 * units), units)
        results[name] = {"units": units, **figures}
        table = Table(title=f"{name}: {figures['ops']:.0f} bytecodes, "
                            f"{figures['calls']:.2f} calls per unit")
        table.add_column("part / function")
        table.add_column("ops/unit", justify="right")
        table.add_column("calls/unit", justify="right")
        for part, ops in figures["parts"].items():
            table.add_row(f"[b]{part}[/b]", f"{ops:.1f}", "")
        for fn, f in list(figures["functions"].items())[:args.top]:
            table.add_row(f"  {fn}", f"{f['ops']:.1f}", f"{f['calls']:.2f}")
        console.print(table)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"python": sys.version.split()[0], "workloads": results},
                               indent=1))
    console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
