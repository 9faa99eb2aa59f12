"""How fast a recording replays: the pendulum with its physics replaced, against its plain run.

What is measured
----------------
The inverted pendulum of ``examples/inverted_pendulum.py`` (MuJoCo physics at
500 Hz, a sensor at 250 Hz, an LQR controller at 100 Hz, a triggered recorder)
is recorded once for ``--duration`` seconds (simulated timer, seed 0,
``mujou.run(record=...)``). Then, interleaved, ``--repeat`` times each:

* **plain**: the net as recorded, simulated timer, one worker;
* **replay**: the same net with ``physics`` replaced by the recording
  (``replay=mujou.Replay(path, replace=["physics"])``: what ``mujou replay --speed 0``
  runs): MuJoCo does not run, its stand-in reads and decodes its recorded
  states as it sends them.

Per run: **x real time** = simulated seconds / wall seconds of ``mujou.run``
to ``join`` (the issue's target: the 60 s pendulum at ``--speed 0`` at least
10x faster than real time), the same per CPU second of the process
(``time.process_time``: every thread; on a loaded shared machine the wall
rate drops, this one less), and the stand-in's hook time (the reading and
decoding of its messages). Every replay's recorder ends with the recorded
run's fingerprint (checked: a replay that differs fails the benchmark).

* **real time**: one replay at ``--speed`` N on the real-time timer (the
  recording's first ``--realtime-s`` seconds, N times faster): its wall time
  against the expected ``seconds / N``, and the stand-in's lateness p99.

The script imports ``mujou_actors`` from ``sys.path``: set ``PYTHONPATH`` to
the tree to measure.

Usage::

    python benchmarks/replay.py [--duration 60] [--repeat 3] [--speed 10]
                                [--realtime-s 10] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import inverted_pendulum as ip  # noqa: E402

import mujou_actors as mujou  # noqa: E402

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "replay.json"
SEED = 0


def one(kind: str, path: str, duration: float) -> dict[str, Any]:
    """One simulated run, plain or replayed; its rates and fingerprint."""
    net = ip.make_net(seed=SEED)
    kwargs: dict[str, Any] = {"timer": "simulated", "duration": duration, "workers": 1}
    if kind == "replay":
        kwargs.update(replay=mujou.Replay(path, replace=["physics"]))
    else:
        kwargs.update(seed=SEED)
    cpu, wall = time.process_time(), time.perf_counter()
    run = mujou.run(net, **kwargs)
    run.join()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    physics = run.stats().nodes["physics"]
    return {"wall_s": wall, "cpu_s": cpu, "x_real_time": duration / wall,
            "x_real_time_cpu": duration / cpu, "physics_hook_s": physics.hook_time,
            "physics_updates": physics.updates,
            "fingerprint": ip.fingerprint(net.recorder.trajectory())}


def realtime(path: str, seconds: float, speed: float) -> dict[str, Any]:
    """A real-time replay of the first ``seconds`` of the recording, ``speed`` times faster."""
    net = ip.make_net(seed=SEED)
    wall = time.perf_counter()
    run = mujou.run(net, timer="realtime", duration=seconds / speed, workers=1,
                    replay=mujou.Replay(path, replace=["physics"], speed=speed))
    run.join()
    wall = time.perf_counter() - wall
    physics = run.stats().nodes["physics"]
    return {"seconds": seconds, "speed": speed, "expected_wall_s": seconds / speed,
            "wall_s": wall, "physics_updates": physics.updates,
            "lateness_p99_ms": physics.lateness_p99 * 1e3}


def summary(values: list[float]) -> dict[str, float]:
    """Median, min and max of ``values``."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    """Record, then measure plain and replayed runs interleaved; print and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0,
                        help="seconds of the recording (default: 60, the issue's)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--speed", type=float, default=10.0,
                        help="the real-time replay's speed (default: 10)")
    parser.add_argument("--realtime-s", type=float, default=10.0,
                        help="seconds of recording the real-time replay covers (default: 10)")
    parser.add_argument("--quick", action="store_true",
                        help="5 s, one repetition, a 2 s real-time replay (a smoke run)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.repeat, args.realtime_s = 5.0, 1, 2.0

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "pendulum.mcap")
        net = ip.make_net(seed=SEED)
        started = time.perf_counter()
        run = mujou.run(net, timer="simulated", duration=args.duration, seed=SEED, workers=1,
                        record=path)
        run.join()
        recorded_s = time.perf_counter() - started
        fingerprint = ip.fingerprint(net.recorder.trajectory())
        size = os.path.getsize(path)
        rows: dict[str, list[dict[str, Any]]] = {"plain": [], "replay": []}
        for _ in range(args.repeat):
            for kind in rows:
                rows[kind].append(one(kind, path, args.duration))
        rt = realtime(path, min(args.realtime_s, args.duration), args.speed)
    identical = all(r["fingerprint"] == fingerprint for r in rows["replay"] + rows["plain"])
    doc = {
        "benchmark": "replay", "python": platform.python_version(),
        "mujou_actors": mujou.__file__, "duration_s": args.duration, "repeat": args.repeat,
        "recording": {"bytes": size, "wall_s": recorded_s},
        "identical": identical,
        "results": {kind: {key: summary([r[key] for r in runs])
                           for key in ("wall_s", "cpu_s", "x_real_time", "x_real_time_cpu",
                                       "physics_hook_s")}
                    for kind, runs in rows.items()},
        "realtime": rt,
        "target": {"what": "the pendulum at --speed 0 at least 10x faster than real time",
                   "met": statistics.median(r["x_real_time"] for r in rows["replay"]) >= 10},
    }
    print(f"mujou_actors {mujou.__file__}")
    print(f"recorded {args.duration:g} s of the pendulum: {size:,} bytes, "
          f"{recorded_s:.2f} s wall")
    print(f"{'run':<8}{'x real time':>13}{'(min-max)':>16}{'per CPU s':>11}"
          f"{'physics hook s':>16}")
    for kind, res in doc["results"].items():
        x, c, h = res["x_real_time"], res["x_real_time_cpu"], res["physics_hook_s"]
        print(f"{kind:<8}{x['median']:>13.1f}{x['min']:>8.1f}-{x['max']:<7.1f}"
              f"{c['median']:>11.1f}{h['median']:>16.2f}")
    print(f"replays bit-identical to the recording: {identical}; target (>= 10x real time "
          f"at --speed 0) {'met' if doc['target']['met'] else 'NOT met'}")
    print(f"real time at speed {rt['speed']:g}: {rt['seconds']:g} s of recording in "
          f"{rt['wall_s']:.2f} s wall (expected {rt['expected_wall_s']:.2f} s), stand-in "
          f"lateness p99 {rt['lateness_p99_ms']:.2f} ms")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2))
    print(f"wrote {args.json}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
