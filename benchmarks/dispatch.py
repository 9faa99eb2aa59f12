"""Dispatch overhead of mujou_actors: no-op periodic updates per second.

What is measured
----------------
N (default 1,000) ``mujou.Node`` subclasses whose ``on_update(self, dt)`` does
nothing run under the simulated timer with ``workers=1`` for ``--duration``
seconds of simulated time. Since the hooks do no work, everything measured is
framework cost: the ready heap, the lock hand-over, the simulated-time
frontier, ``dt`` and statistics bookkeeping, the per-node context.

* **mujou updates/s** = total ``updates`` from ``run.stats()`` divided by the
  wall time of ``run.join()`` (timer running to the end of the run, including
  the stop phase). Building the nodes is excluded; the time ``mujou.run(...)``
  takes to return (validation, threads, every ``on_start``) is reported
  separately as "start".
* **floor updates/s**: a bare loop doing the same schedule with ``heapq`` over
  ``(due_ns, index)`` on plain Python objects: peek the earliest, compute
  ``dt``, call the same no-op ``on_update(dt)``, replace it with its next due
  time. Same updates, same order, nothing else: the cost of the bare minimum.
* **ratio** = mujou / floor, per repetition (1.0 would mean zero overhead
  beyond a heap; 0.1 means the dispatcher spends 10x the floor per update).
* **mujou CPU kupd/s** = the same updates over the process's CPU time
  (``time.process_time``, every thread) across the same ``run.join()``: on a
  loaded machine, a thread that waits for a CPU is not charged for it, so
  this one moves less than the wall-time rate. In the JSON, ``mujou_cpu``.

The table's title and the JSON (``build``) name the kernel's build
(``mujou_actors._runtime.BUILD``: compiled or pure Python, and why);
``benchmarks/builds.py`` runs this script under both builds side by side.

Two cases: ``uniform`` (every node period 10 ms: each time step releases all N
nodes at once, ties broken by net order) and ``spread`` (periods spread over
1..10 ms: the heap order really matters and each time step has few nodes).
Both sides run exactly the same number of updates (asserted).

How to read it: absolute rates depend on the CPU and the Python build; compare
the ratio across commits on one machine. ``--profile`` prints where the worker
thread's time goes (cProfile inflates small Python calls, so read it for
shares, not for absolute rates).

``--trace`` adds a third run to every repetition, with ``trace=`` a
``mujou.Tracer`` (default capacity, a temporary file): the row "with
tracing" next to each case, and the **tracing overhead** = 1 - traced rate /
untraced rate, per repetition. The traced rate counts the same wall time as
the untraced one (recording included); writing the JSON file after the run
is excluded from it and reported apart as "trace write s".

Usage::

    python benchmarks/dispatch.py [--nodes 1000] [--duration 2.0] [--repeat 5]
                                  [--json PATH] [--quick] [--profile] [--trace]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import platform
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import NoOp, heap_floor, summary

import mujou_actors as mujou
from mujou_actors import _runtime

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "dispatch.json"


def periods_ns(case: str, n: int) -> list[int]:
    if case == "uniform":
        return [10_000_000] * n
    # 1..10 ms in whole microseconds, spread evenly over the nodes.
    return [(1000 + 9000 * i // max(1, n - 1)) * 1000 for i in range(n)]


class TimedTracer(mujou.Tracer):
    """A Tracer that also times the writing of its file, to leave it out of the rate."""

    write_s = 0.0

    def _write(self, *args, **kwargs) -> None:
        t0 = time.perf_counter()
        super()._write(*args, **kwargs)
        self.write_s = time.perf_counter() - t0


def run_mujou(periods: list[int], end_ns: int, traced: bool = False, stats: bool = True) -> dict:
    nodes = [NoOp(period=p / 1e9) for p in periods]  # build: not timed
    with tempfile.TemporaryDirectory() as folder:
        tracer = TimedTracer(Path(folder) / "trace.json") if traced else None
        gc.collect()
        t0 = time.perf_counter()
        run = mujou.run(nodes, workers=1, timer="simulated", duration=end_ns / 1e9,
                        trace=tracer, stats=stats)
        t1 = time.perf_counter()
        c1 = time.process_time()
        run.join()
        c2 = time.process_time()
        t2 = time.perf_counter()
    write_s = tracer.write_s if tracer is not None else 0.0
    updates = sum(s.updates for s in run.stats().nodes.values())
    return {"updates": updates, "start_s": t1 - t0, "join_s": t2 - t1 - write_s,
            "write_s": write_s, "rate": updates / (t2 - t1 - write_s),
            "cpu_rate": updates / (c2 - c1 - write_s)}


def bench_case(case: str, n: int, end_ns: int, repeat: int, trace: bool = False,
               stats_off: bool = False) -> dict:
    periods = periods_ns(case, n)
    expected = sum(end_ns // p for p in periods)
    mj, fl, tr, ns = [], [], [], []
    for _ in range(repeat):  # interleaved, so drifts in machine load hit both sides
        m, f = run_mujou(periods, end_ns), heap_floor(periods, end_ns)
        assert m["updates"] == f["updates"] == expected, (case, m["updates"], f["updates"],
                                                          expected)
        mj.append(m)
        fl.append(f)
        if trace:
            t = run_mujou(periods, end_ns, traced=True)
            assert t["updates"] == expected, (case, t["updates"], expected)
            tr.append(t)
        if stats_off:
            q = run_mujou(periods, end_ns, stats=False)
            assert q["updates"] == expected, (case, q["updates"], expected)
            ns.append(q)
    result = {
        "nodes": n, "updates": expected,
        "mujou": summary([m["rate"] for m in mj]),
        "mujou_cpu": summary([m["cpu_rate"] for m in mj]),
        "floor": summary([f["rate"] for f in fl]),
        "ratio": summary([m["rate"] / f["rate"] for m, f in zip(mj, fl, strict=False)]),
        "start_s": summary([m["start_s"] for m in mj]),
        "join_s": summary([m["join_s"] for m in mj]),
    }
    if trace:
        result["traced"] = {
            "mujou": summary([t["rate"] for t in tr]),
            "ratio": summary([t["rate"] / f["rate"] for t, f in zip(tr, fl, strict=False)]),
            "overhead": summary([1 - t["rate"] / m["rate"]
                                 for t, m in zip(tr, mj, strict=False)]),
            "start_s": summary([t["start_s"] for t in tr]),
            "join_s": summary([t["join_s"] for t in tr]),
            "write_s": summary([t["write_s"] for t in tr]),
        }
    if stats_off:
        result["no_stats"] = {
            "mujou": summary([q["rate"] for q in ns]),
            "ratio": summary([q["rate"] / f["rate"] for q, f in zip(ns, fl, strict=False)]),
            "overhead": summary([1 - m["rate"] / q["rate"]
                                 for m, q in zip(mj, ns, strict=False)]),
            "start_s": summary([q["start_s"] for q in ns]),
        }
    return result


def profile_one(n: int, end_ns: int, top: int = 25) -> None:
    """cProfile the worker thread of one mujou repetition (uniform case); print top by tottime.

    Only ``mujou-worker-*`` threads are profiled: the host and the run's
    coordinator spend the run blocked in a lock, which would swamp the table.
    """
    profiles: list[cProfile.Profile] = []

    def boot(frame, event, arg):  # first profile event of each thread started meanwhile
        sys.setprofile(None)
        if threading.current_thread().name.startswith("mujou-worker-"):
            prof = cProfile.Profile()
            profiles.append(prof)
            prof.enable()

    threading.setprofile(boot)
    try:
        result = run_mujou(periods_ns("uniform", n), end_ns)
    finally:
        threading.setprofile(None)
    stats = pstats.Stats(profiles[0])
    for prof in profiles[1:]:
        stats.add(prof)
    print(f"\nprofile of the worker thread: {result['updates']:,} updates, "
          f"{result['rate']:,.0f} updates/s under the profiler")
    stats.sort_stats("tottime").print_stats(top)


def cell(s: dict, scale: float, fmt: str, sep: str) -> str:
    """``median<sep>min–max``."""
    med, lo, hi = (format(s[k] / scale, fmt) for k in ("median", "min", "max"))
    return f"{med}{sep}{lo}–{hi}"


def print_table(results: dict, title: str) -> None:
    header = ["case", "updates/rep", "mujou kupd/s", "floor kupd/s", "mujou/floor",
              "start s", "mujou CPU kupd/s"]

    def rows(sep: str) -> list[list[str]]:
        out = []
        for case, r in results.items():
            out.append([case, f"{r['updates']:,}", cell(r["mujou"], 1e3, ",.0f", sep),
                        cell(r["floor"], 1e3, ",.0f", sep), cell(r["ratio"], 1, ".3f", sep),
                        f"{r['start_s']['median']:.3f}",
                        cell(r["mujou_cpu"], 1e3, ",.0f", sep)])
            for key, label in (("traced", "with tracing"), ("no_stats", "without stats")):
                t = r.get(key)
                if t is not None:
                    out.append([f"{case} {label}", f"{r['updates']:,}",
                                cell(t["mujou"], 1e3, ",.0f", sep), "",
                                cell(t["ratio"], 1, ".3f", sep),
                                f"{t['start_s']['median']:.3f}", ""])
        return out

    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        plain = [header, *rows(" | ")]
        widths = [max(len(x) for x in col) for col in zip(*plain, strict=False)]
        print(f"{title}\n(median | min–max over repetitions)")
        for row in plain:
            print("  ".join(x.ljust(w) if i == 0 else x.rjust(w)
                            for i, (x, w) in enumerate(zip(row, widths, strict=False))))
        return
    table = Table(title=title, caption="median, then min–max over repetitions")
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in rows("\n"):
        table.add_row(*row)
    Console().print(table)


def print_overhead(results: dict) -> None:
    """One line per case: the tracing overhead and the time to write the file."""
    for case, r in results.items():
        q = r.get("no_stats")
        if q is not None:
            print(f"stats overhead, {case}: {cell(q['overhead'], 0.01, '.1f', '% | ')}% "
                  "(1 - rate with stats / rate without)")
        t = r.get("traced")
        if t is not None:
            print(f"tracing overhead, {case}: {cell(t['overhead'], 0.01, '.1f', '% | ')}% "
                  f"(1 - traced/untraced rate); trace write s: "
                  f"{cell(t['write_s'], 1, '.2f', ' | ')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds of simulated time per repetition (default 2.0; quick 0.2)")
    ap.add_argument("--repeat", type=int, default=None, help="default 5; quick 2")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    ap.add_argument("--quick", action="store_true", help="a few seconds, for CI smoke runs")
    ap.add_argument("--profile", action="store_true",
                    help="also cProfile one mujou repetition; print the top 25 by tottime")
    ap.add_argument("--stats", action="store_true",
                    help="also run each repetition with stats=False and report what the "
                         "statistics cost")
    ap.add_argument("--trace", action="store_true",
                    help="also run each repetition with trace= (a mujou.Tracer) and report "
                         "the overhead of tracing")
    args = ap.parse_args()
    duration = args.duration if args.duration is not None else (0.2 if args.quick else 2.0)
    repeat = args.repeat if args.repeat is not None else (2 if args.quick else 5)
    if args.nodes < 1 or repeat < 1 or duration <= 0:
        ap.error("--nodes and --repeat must be >= 1, --duration > 0")
    end_ns = round(duration * 1e9)

    results = {case: bench_case(case, args.nodes, end_ns, repeat, trace=args.trace,
                                stats_off=args.stats)
               for case in ("uniform", "spread")}
    title = (f"dispatch: {args.nodes} no-op nodes, simulated timer, workers=1, "
             f"{duration:g} s sim, {repeat} reps; kernel: {_runtime.BUILD}")
    print_table(results, title)
    print_overhead(results)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "dispatch", "nodes": args.nodes, "duration_s": duration,
           "repeat": repeat, "quick": args.quick, "trace": args.trace, "stats": args.stats,
           "python": platform.python_version(),
           "platform": platform.platform(), "mujou_version": mujou.__version__,
           "build": str(_runtime.BUILD),
           "cases": results}
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.json}")
    if args.profile:
        profile_one(args.nodes, end_ns)


if __name__ == "__main__":
    main()
