"""The control plane of a placed run (mujou_actors.distributed.system): what it costs.

What is measured, per repetition, in one `ProcessSystem`:

* **system start**: ``ProcessSystem()`` until the coordinator answers (the
  Thespian admin and its logger, then the coordinator's process, which imports
  the package, torch included). This script imports the package only inside
  its functions: ``spawn`` imports the main module again in every process of
  the run, and a main module that imports torch at its top adds about 1.4 s
  for the admin and 1.4 s for its logger to this figure;
* **group start**: ``start_group`` of one group (spawn, imports, building a
  trivial server), and **2 groups at once** (``start_groups``);
* **ask RTT p50 / p99**: ``ask`` round trips to a group's trivial ``handle``
  (pickled request and answer, Thespian's transport, one hop), after 20
  unmeasured ones;
* **crash notice p50 / max**: SIGKILL of a group process until the host's
  ``notices`` socket is readable (zmq poll), the group started again each time;
* **stop group**: ``stop_group`` (``close()``, then the process ends);
* **shutdown**: ``shutdown()`` with one group running (its ``close()``, the
  coordinator, the admin, the logger, every process gone).

And, apart from the system, **placed run start**: ``mujou.run`` of
``tests.placed_support:make_net`` placed in two group processes (simulated
time), from the call until it returns a running run, in a fresh host process
whose script imports torch at its top, as most scripts do (the figure issue 30
sets at 5 s: its processes, their imports, the nets built and checked, the
data plane connected).

The group servers are ``tests.procs_support:make`` (an echo server); the
repository's root is put on the groups' ``sys.path``. Figures are the median
over ``--repeat`` repetitions, in seconds unless the name says µs or ms.

Usage::

    python benchmarks/control.py [--quick] [--repeat 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import zmq

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # tests.procs_support, in this process and the groups

TARGET = "tests.procs_support:make"
TIMEOUT_S = 60.0


def pct(xs: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank)."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def one_repetition(rtts: int, kills: int) -> dict[str, float]:
    """Every figure once, in a fresh ProcessSystem."""
    # imported here, not at the top: spawn imports this (main) module again in every
    # process of the run, Thespian's admin and logger included, which would then
    # import torch too (about 1.4 s each, before the admin answers)
    from mujou_actors.distributed.system import ProcessSystem

    out: dict[str, float] = {}
    t0 = time.perf_counter()
    system = ProcessSystem(start_timeout=TIMEOUT_S)
    out["system_start"] = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        system.start_group("a", TARGET, {"name": "a"}, TIMEOUT_S, sys_path=[str(ROOT)])
        out["group_start"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        system.start_groups({g: (TARGET, {"name": g}) for g in ("b", "c")}, TIMEOUT_S,
                            sys_path=[str(ROOT)])
        out["two_groups_start"] = time.perf_counter() - t0
        lat = []
        for i in range(rtts + 20):
            t0 = time.perf_counter_ns()
            system.ask("a", ("echo", i), TIMEOUT_S)
            if i >= 20:
                lat.append((time.perf_counter_ns() - t0) / 1e3)
        out["ask_p50_us"], out["ask_p99_us"] = pct(lat, 50), pct(lat, 99)
        poller = zmq.Poller()
        poller.register(system.notices, zmq.POLLIN)
        notices = []
        for _ in range(kills):
            t0 = time.perf_counter()
            os.kill(system.pid("b"), signal.SIGKILL)
            if not poller.poll(int(TIMEOUT_S * 1000)):
                raise TimeoutError("no crash notice")
            notices.append((time.perf_counter() - t0) * 1e3)
            assert system.take_exits(), "a notice without an exit"
            system.start_group("b", TARGET, {"name": "b"}, TIMEOUT_S, sys_path=[str(ROOT)])
        out["notice_p50_ms"], out["notice_max_ms"] = statistics.median(notices), max(notices)
        t0 = time.perf_counter()
        system.stop_group("b", TIMEOUT_S)
        out["stop_group"] = time.perf_counter() - t0
        system.stop_group("c", TIMEOUT_S)
    finally:
        t0 = time.perf_counter()
        system.shutdown()
        out["shutdown"] = time.perf_counter() - t0
    return out


# A host script as users write them: torch imported at the top, the run under the guard.
PLACED_START_SCRIPT = """
import sys, time
import torch  # noqa: F401 (as most scripts do)

if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    import mujou_actors as mujou
    from tests.placed_support import make_net
    t0 = time.perf_counter()
    run = mujou.run(make_net, placement={"sim": "a", "ctrl": "b"}, timer="simulated")
    took = time.perf_counter() - t0
    run.stop()
    print(took)
"""


def placed_start() -> float:
    """Seconds for ``mujou.run`` of a placed net (2 groups) to return, in a fresh host."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "host.py"
        script.write_text(PLACED_START_SCRIPT)
        done = subprocess.run([sys.executable, str(script), str(ROOT)], capture_output=True,
                              text=True, timeout=TIMEOUT_S * 2, check=True)
    return float(done.stdout.split()[-1])


NAMES = (("placed_start", "placed run start s"), ("system_start", "system start s"),
         ("group_start", "group start s"),
         ("two_groups_start", "2 groups at once s"), ("ask_p50_us", "ask RTT p50 µs"),
         ("ask_p99_us", "ask RTT p99 µs"), ("notice_p50_ms", "crash notice p50 ms"),
         ("notice_max_ms", "crash notice max ms"), ("stop_group", "stop group s"),
         ("shutdown", "shutdown s"))


def main(argv: list[str] | None = None) -> int:
    """Run the repetitions; print the figures; write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rtt", type=int, default=500, help="measured ask round trips")
    parser.add_argument("--kills", type=int, default=3, help="SIGKILLs per repetition")
    parser.add_argument("--quick", action="store_true", help="1 repetition, 100 asks, 1 kill")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/control.json")
    cfg = parser.parse_args(argv)
    if cfg.quick:
        cfg.repeat, cfg.rtt, cfg.kills = 1, 100, 1
    samples: list[dict[str, float]] = []
    for rep in range(cfg.repeat):
        print(f"repetition {rep + 1}/{cfg.repeat}", flush=True)
        samples.append({"placed_start": placed_start(), **one_repetition(cfg.rtt, cfg.kills)})
    results = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    for key, name in NAMES:
        print(f"{name:>22s}  {results[key]:10.3f}")
    cfg.json.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"machine": f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
                           "config": {k: str(v) for k, v in vars(cfg).items()},
                           "results": results, "samples": samples}
    cfg.json.write_text(json.dumps(doc, indent=1))
    print(f"wrote {cfg.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
