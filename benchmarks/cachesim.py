"""Cache misses per no-op update, counted by Cachegrind: why 100,000 nodes run slower.

What is measured
----------------
N no-op periodic nodes (period 10 ms, simulated timer, one worker) run for A
and then for B ticks each (by default A = 200,000 / N, at least 2, and B = 2A:
200,000 updates between the two runs), every run under ``valgrind --tool=cachegrind
--cache-sim=yes`` with a last-level cache of ``--ll`` (default 32 MiB,
16-way: the project's reference machine). From Cachegrind's totals:

* **Ir/update**: instructions per update;
* **D1 miss/update**: first-level data cache misses (reads and writes);
* **LL miss/update**: last-level data cache misses, i.e. reads and writes
  that went to main memory in the simulated cache.

Each figure is *marginal*: (run of B ticks - run of A ticks) / (updates of
B - updates of A), so building the net, starting and stopping it cancel out.
The same is done for the **floor** (``common.heap_floor``: a heap of due times
popped in a loop calling the same no-op method), with the same N and ticks.

Cachegrind simulates the caches rather than reading hardware counters: the
counts are exact for its model and the same on every run of the same code,
so they compare commits where wall-clock rates on a shared machine swing by
10 % or more. It does not model the second-level cache, prefetching or
memory-level parallelism, so misses do not translate 1:1 into time. Garbage
collection runs when it falls due, so the marginal counts move by a few per
cent between runs. Under Cachegrind, Python runs about 50 times slower:
100,000 nodes take about 12 minutes for mujou, 3 for the floor.

Usage::

    python benchmarks/cachesim.py [--nodes 1000,100000] [--ticks A,B]
                                  [--ll 33554432,16] [--json PATH]

Needs ``valgrind`` on the PATH (exit status 2 and a message without it).
Writes ``benchmarks/results/cachesim.json`` unless ``--json`` says otherwise.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

PERIOD_NS = 10_000_000
HERE = Path(__file__).resolve().parent

# Cachegrind's summary lines, e.g. "==12== LLd misses:   14,645,407  (...)".
_TOTALS = {
    "ir": re.compile(r"==\d+== I\s+refs:\s+([\d,]+)"),
    "d1": re.compile(r"==\d+== D1\s+misses:\s+([\d,]+)"),
    "ll": re.compile(r"==\d+== LLd misses:\s+([\d,]+)"),
}


def parse_totals(stderr: str) -> dict[str, int]:
    """Instructions, D1 and LL data misses from Cachegrind's summary on stderr.

    Raises:
        ValueError: a total is missing (the run failed, or this is not
            Cachegrind's output); the message names which.
    """
    totals = {}
    for name, pattern in _TOTALS.items():
        found = pattern.search(stderr)
        if found is None:
            raise ValueError(f"cachegrind output has no {name!r} total:\n{stderr[-2000:]}")
        totals[name] = int(found.group(1).replace(",", ""))
    return totals


def child(side: str, n: int, ticks: int) -> int:
    """Run ``n`` no-op nodes (``side`` "mujou") or the floor for ``ticks`` periods.

    Returns the number of updates made.
    """
    sys.path.insert(0, str(HERE))
    from common import NoOp, heap_floor

    if side == "floor":
        return heap_floor([PERIOD_NS] * n, ticks * PERIOD_NS)["updates"]
    import mujou_actors as mujou

    nodes = [NoOp(period=PERIOD_NS / 1e9) for _ in range(n)]
    gc.collect()
    gc.freeze()  # the nodes were built before: no collection should walk them
    # Under Cachegrind stopping 100,000 nodes takes minutes: no stop timeout.
    run = mujou.run(nodes, timer="simulated", duration=ticks * PERIOD_NS / 1e9,
                    workers=1, stop_timeout=3600)
    run.join()
    return sum(s.updates for s in run.stats().nodes.values())


def measure(side: str, n: int, ticks: int, ll: str) -> dict[str, int]:
    """One Cachegrind run of `child`; its totals and ``updates``.

    Raises:
        RuntimeError: the child failed (its stderr's end is in the message).
    """
    size, assoc = ll.split(",")
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", f"--LL={size},{assoc},64",
           "--cachegrind-out-file=/dev/null", sys.executable, str(Path(__file__).resolve()),
           "--child", side, str(n), str(ticks)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{side} with {n} nodes, {ticks} ticks failed "
                           f"(status {done.returncode}):\n{done.stderr[-2000:]}")
    return {**parse_totals(done.stderr), "updates": int(done.stdout.split()[-1])}


def marginal(short: dict[str, int], long: dict[str, int]) -> dict[str, float]:
    """Per update between two runs: ``{"ir", "d1", "ll"}`` and ``updates`` (the difference)."""
    updates = long["updates"] - short["updates"]
    if updates <= 0:
        raise ValueError(f"the longer run made no more updates ({short['updates']} -> "
                         f"{long['updates']}): choose ticks with A < B")
    return {"updates": updates, **{k: (long[k] - short[k]) / updates for k in ("ir", "d1", "ll")}}


def main() -> None:
    """Parse the command line, run every (side, N) pair, print the table, write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="1000,100000", help="node counts, comma-separated")
    ap.add_argument("--ticks", default=None,
                    help="A,B: ticks of the short and the long run (default: see above)")
    ap.add_argument("--ll", default="33554432,16", help="last-level cache: bytes,ways")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "cachesim.json")
    ap.add_argument("--child", nargs=3, metavar=("SIDE", "N", "TICKS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(child(args.child[0], int(args.child[1]), int(args.child[2])))
        return
    if shutil.which("valgrind") is None:
        print("cachesim: valgrind is not on the PATH (apt install valgrind)", file=sys.stderr)
        sys.exit(2)
    rows = []
    for n in (int(x) for x in args.nodes.split(",")):
        if args.ticks:
            a, b = (int(t) for t in args.ticks.split(","))
        else:
            a = max(2, 200_000 // n)
            b = 2 * a
        for side in ("mujou", "floor"):
            row = {"side": side, "nodes": n, "ticks": [a, b],
                   **marginal(measure(side, n, a, args.ll), measure(side, n, b, args.ll))}
            rows.append(row)
            print(f"{side:6s} {n:>8,} nodes  Ir/update {row['ir']:>9,.0f}  "
                  f"D1 miss/update {row['d1']:>7.1f}  LL miss/update {row['ll']:>6.2f}",
                  flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "ll": args.ll, "python": platform.python_version(),
        "machine": platform.machine(), "rows": rows}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
