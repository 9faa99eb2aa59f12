"""The cost of one ``send`` inside a running hook, per kind of message.

What is measured
----------------
One periodic sender node (simulated time, one worker) whose update makes
``--sends`` sends of one kind to one reader (an ``Input`` with ``depth=1`` on a
periodic node, so no send triggers it), for ``--ticks`` updates. In the same
update, a reference loop makes the same values without sending them (for a
temporary tensor: the ``torch.tanh`` alone). Per case:

* **ns/send** = (time of the send loop - time of the reference loop) / sends,
  the median over the updates, in CPU time of the hook's thread
  (``time.thread_time_ns`` around each loop: on a shared machine, the time
  the thread waits for a CPU is not the send's).
  What it holds is the send: the check that the caller is the port's hook,
  the type check, the copy (or the hand-over of a temporary), the stamp, the
  delivery and the host's view.
* **ops/send**: Python bytecodes per send (``sys.settrace`` with
  ``f_trace_opcodes`` on the hook's thread, send loop minus reference loop,
  one extra update); exact, whatever the machine's load, but blind to the
  time spent in C (a tensor's clone is one call).
* **calls/send**: Python function calls per send (``sys.setprofile`` counts
  ``call`` events, the same way), and **C calls/send** the same for
  ``c_call`` events (builtins and torch's methods).

Cases: ``int`` (an ``int`` on ``Output(int)``), ``held`` (a tensor the node
keeps, ``self.out.send(self.t)``, on ``Output(torch.Tensor, shape=(17,),
dtype=torch.float32)``), ``held-any`` (the same on an untyped
``Output(torch.Tensor)``), ``temp`` (``self.out.send(torch.tanh(self.x))``:
a temporary nothing but the send holds) and ``tuple`` (a temporary tuple
``(torch.tanh(self.x), 1.0)`` on ``Output(object)``).

The script imports ``mujou_actors`` from ``sys.path``: set ``PYTHONPATH`` to
the tree to measure, and run two trees alternately to compare commits.

Usage::

    python benchmarks/sends.py [--sends 1000] [--ticks 30] [--repeat 5]
                               [--only temp,held] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import mujou_actors as mujou

CASES = ("int", "held", "held-any", "temp", "tuple")
SHAPE = (17,)


def _port(case: str) -> tuple[Any, Any]:
    """The Output and Input of a case."""
    if case == "int":
        return mujou.Output(int), mujou.Input(int)
    if case == "held":
        return (mujou.Output(torch.Tensor, shape=SHAPE, dtype=torch.float32),
                mujou.Input(torch.Tensor, shape=SHAPE, dtype=torch.float32))
    if case == "held-any":
        return mujou.Output(torch.Tensor), mujou.Input(torch.Tensor)
    if case == "temp":
        return (mujou.Output(torch.Tensor, shape=SHAPE, dtype=torch.float32),
                mujou.Input(torch.Tensor, shape=SHAPE, dtype=torch.float32))
    return mujou.Output(object), mujou.Input(object)


class Sender(mujou.Node):
    """Makes ``n`` sends of one case per update, and the reference loop beside them."""

    def __init__(self, case: str, n: int, ticks: int) -> None:
        super().__init__(period=0.001)
        self.case, self.n, self.ticks = case, n, ticks
        self.out, _ = _port(case)
        self.t = torch.rand(SHAPE)
        self.x = torch.rand(SHAPE)
        self.ns: list[float] = []
        self.calls: tuple[Any, Any] = ((0, 0, 0), (0, 0, 0))
        self.done = 0

    def _loops(self) -> tuple[Callable[[], None], Callable[[], None]]:
        """The send loop and the reference loop of the case."""
        out, n, x, tanh = self.out, self.n, self.x, torch.tanh
        case = self.case
        if case == "int":
            def sends() -> None:
                for k in range(n):
                    out.send(k)

            def ref() -> None:
                for _k in range(n):
                    pass
        elif case in ("held", "held-any"):
            def sends() -> None:
                for _ in range(n):
                    out.send(self.t)

            def ref() -> None:
                for _ in range(n):
                    self.t  # noqa: B018 - the same attribute read as the send loop
        elif case == "temp":
            def sends() -> None:
                for _ in range(n):
                    out.send(tanh(x))

            def ref() -> None:
                for _ in range(n):
                    tanh(x)
        else:
            def sends() -> None:
                for _ in range(n):
                    out.send((tanh(x), 1.0))

            def ref() -> None:
                for _ in range(n):
                    (tanh(x), 1.0)  # noqa: B018 - the same tuple, unsent
        return sends, ref

    def on_update(self, dt: float) -> None:
        if self.done >= self.ticks:
            return
        self.done += 1
        sends, ref = self._loops()
        clock = time.thread_time_ns
        t0 = clock()
        ref()
        t1 = clock()
        sends()
        t2 = clock()
        self.ns.append(((t2 - t1) - (t1 - t0)) / self.n)
        if self.done == self.ticks:  # one more pass, counting the calls
            self.calls = (_count(sends), _count(ref))


def _count(fn: Callable[[], None]) -> tuple[int, int, int]:
    """Bytecodes, Python calls and C calls of one call of ``fn``, on this thread."""
    counts = {"opcode": 0, "call": 0, "c_call": 0}

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event in counts:
            counts[event] += 1

    def trace(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            counts["opcode"] += 1
        return trace

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(None)
    return counts["opcode"], counts["call"], counts["c_call"]


class Reader(mujou.Node):
    """The one reader: a periodic node, so that no send triggers it."""

    def __init__(self, case: str) -> None:
        super().__init__(period=0.001)
        _, self.inp = _port(case)

    def on_update(self, dt: float) -> None:
        self.inp.read()


def measure(case: str, n: int, ticks: int) -> dict[str, float]:
    """One run of one case: ns per send (median of the updates), calls per send."""
    sender, reader = Sender(case, n, ticks), Reader(case)
    mujou.connect(sender.out, reader.inp)
    gc.collect()
    run = mujou.run([sender, reader], timer="simulated", workers=1,
                    duration=(ticks + 2) * 0.001)
    run.join()
    (ops, calls, c_calls), (ref_ops, ref_calls, ref_c_calls) = sender.calls
    return {"ns": statistics.median(sender.ns[1:] or sender.ns), "ops": (ops - ref_ops) / n,
            "calls": (calls - ref_calls) / n, "c_calls": (c_calls - ref_c_calls) / n}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sends", type=int, default=1000)
    parser.add_argument("--ticks", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", default=",".join(CASES))
    parser.add_argument("--quick", action="store_true", help="100 sends, 5 ticks, 1 repeat")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.sends, args.ticks, args.repeat = 100, 5, 1
    torch.set_num_threads(1)
    cases = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases:
        parser.error(f"--only: choose from {', '.join(CASES)}")
    samples: dict[str, list[dict[str, float]]] = {c: [] for c in cases}
    for _ in range(args.repeat):  # the cases interleaved, repetition by repetition
        for case in cases:
            samples[case].append(measure(case, args.sends, args.ticks))
    print(f"mujou_actors {mujou.__file__}")
    print(f"{'case':9s} {'ns/send median (min-max)':>28s} {'ops/send':>9s} {'calls/send':>10s} "
          f"{'C calls/send':>12s}")
    for case in cases:
        ns = [s["ns"] for s in samples[case]]
        print(f"{case:9s} {statistics.median(ns):12.0f} ({min(ns):6.0f}-{max(ns):6.0f})"
              f"      {samples[case][-1]['ops']:9.1f} {samples[case][-1]['calls']:10.2f}"
              f" {samples[case][-1]['c_calls']:12.2f}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "python": platform.python_version(), "torch": torch.__version__,
            "sends": args.sends, "ticks": args.ticks, "samples": samples}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
