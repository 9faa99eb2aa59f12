"""Where the framework's time in one RL step goes: controlled variants of one net.

What is measured
----------------
The net of ``benchmarks/opcount.py``'s ``rl`` workload (an ``env`` node every
8 ms sending an observation, a ``policy`` node triggered by it sending an
action, a ``recorder`` triggered by both; trivial hooks) runs ``S`` steps
under the simulated timer, one worker. Each variant changes one thing, so
the difference between two rows is what that thing costs:

* **full**: as a user writes it: statistics on, float32 tensors of shapes
  (11,) and (3,) sent from buffers the senders keep (so each send copies).
* **temporaries**: the senders send a fresh tensor (``torch.tanh(buffer)``),
  which nothing but the send holds: the framework hands it over without a
  copy (see docs/nodes-and-ports.md). The row includes the hook's own
  ``tanh``, which costs about what the clone it saves does.
* **no stats**: ``stats=False``: no clock reads around the hooks.
* **floats**: the messages are Python floats (no tensor check, no copy: an
  immutable value is shared as it is).
* **no recorder**: the recorder is not connected: two updates and two
  one-reader sends per step instead of four updates and two two-reader sends.
* **plain**: the same trivial calls in a ``for`` loop (no framework at all).

Figure: **µs/step** = wall time of ``run.join()`` / ``S`` (the run's start
excluded; its stop, about a millisecond, included), minimum over the
repetitions (the variants alternate within each repetition; the minimum is
the least disturbed by other load on the machine), median beside it.

The table's title and the JSON name the kernel's build
(``mujou_actors._runtime.BUILD``: compiled or pure Python, and why).
``benchmarks/builds.py`` runs this script under both builds side by side.

Usage::

    python benchmarks/rlstep.py [--steps 20000] [--repeat 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import mujou_actors as mujou
from mujou_actors import _runtime

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import cpu_s  # noqa: E402


def make_net(kind: type, temporaries: bool, recorder: bool) -> mujou.Node:
    """The three-node net with messages of ``kind`` (torch.Tensor or float)."""
    tensor = kind is torch.Tensor

    class Env(mujou.Node):
        action = mujou.Input(kind, depth=1)
        obs = mujou.Output(kind)

        def __init__(self) -> None:
            super().__init__(period=0.008)
            self.buffer: Any = torch.zeros(11) if tensor else 0.0

        def on_start(self) -> None:
            self.obs.send(self.buffer)

        def on_update(self, dt: float) -> None:
            self.action.read()
            self.obs.send(torch.tanh(self.buffer) if temporaries else self.buffer)

    class Policy(mujou.Node):
        obs = mujou.Input(kind, depth=1)
        action = mujou.Output(kind)

        def __init__(self) -> None:
            super().__init__(period=None)
            self.buffer: Any = torch.zeros(3) if tensor else 0.0

        def on_update(self, dt: float) -> None:
            self.obs.read()
            self.action.send(torch.tanh(self.buffer) if temporaries else self.buffer)

    class Recorder(mujou.Node):
        obs = mujou.Input(kind, depth=None)
        action = mujou.Input(kind, depth=None)

        def __init__(self) -> None:
            super().__init__(period=None)
            self.count = 0

        def on_update(self, dt: float) -> None:
            self.count += len(self.obs.drain()) + len(self.action.drain())

    root = mujou.Node(period=None)
    root.env, root.policy = Env(), Policy()
    mujou.connect(root.env.obs, root.policy.obs)
    mujou.connect(root.policy.action, root.env.action)
    if recorder:
        root.recorder = Recorder()
        mujou.connect(root.env.obs, root.recorder.obs)
        mujou.connect(root.policy.action, root.recorder.action)
    return root


def time_net(steps: int, *, kind: type = torch.Tensor, temporaries: bool = False,
             recorder: bool = True, stats: bool = True,
             cpu: list[float] | None = None) -> float:
    """µs per step of the net for ``steps`` steps (wall time of join).

    ``cpu``, if given, gets the process's CPU µs per step over the same window
    appended (``common.cpu_s``; benchmarks/targets.py shows it).
    """
    net = make_net(kind, temporaries, recorder)
    run = mujou.run(net, timer="simulated", duration=steps * 0.008, stats=stats)
    c0 = cpu_s()
    t0 = time.perf_counter()
    run.join(timeout=600)
    t1 = time.perf_counter()
    if cpu is not None:
        cpu.append((cpu_s() - c0) / steps * 1e6)
    if run.running:
        run.stop()
        raise TimeoutError(f"the RL net of {steps} steps did not finish within 600 s")
    return (t1 - t0) / steps * 1e6


def time_plain(steps: int, cpu: list[float] | None = None) -> float:
    """µs per step of the same trivial calls in a loop (``cpu``: as for `time_net`)."""
    obs, action = torch.zeros(11), torch.zeros(3)
    kept_obs: list[Any] = [obs.clone()]
    kept_action: list[Any] = []
    c0 = cpu_s()
    t0 = time.perf_counter()
    for _ in range(steps):
        kept_action.append(action.clone())
        kept_obs.append(obs.clone())
    t1 = time.perf_counter()
    if cpu is not None:
        cpu.append((cpu_s() - c0) / steps * 1e6)
    return (t1 - t0) / steps * 1e6


VARIANTS: dict[str, Callable[[int], float]] = {
    "full": lambda s: time_net(s),
    "temporaries": lambda s: time_net(s, temporaries=True),
    "no stats": lambda s: time_net(s, stats=False),
    "floats": lambda s: time_net(s, kind=float),
    "no recorder": lambda s: time_net(s, recorder=False),
    "plain": time_plain,
}


def main(argv: list[str] | None = None) -> int:
    """Time every variant, interleaved, and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", default=str(HERE / "results" / "rlstep.json"))
    args = parser.parse_args(argv)
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for fn in VARIANTS.values():  # warm-up: first calls, imports
        fn(500)
    for _ in range(args.repeat):
        for name, fn in VARIANTS.items():
            samples[name].append(fn(args.steps))
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"one RL step, trivial hooks: {args.steps} steps, {args.repeat} reps; "
                        f"kernel: {_runtime.BUILD}")
    for col in ("variant", "µs/step (min)", "median", "full - this"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    full = min(samples["full"])
    for name, xs in samples.items():
        table.add_row(name, f"{min(xs):.2f}", f"{statistics.median(xs):.2f}",
                      "" if name == "full" else f"{full - min(xs):+.2f}")
    Console().print(table)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"steps": args.steps, "build": str(_runtime.BUILD),
                                "samples": samples}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
