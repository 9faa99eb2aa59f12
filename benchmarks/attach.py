"""What watching a running net from another process costs it: ``mujou echo`` and ``mujou hz``.

What is measured
----------------
The main job (``examples/inverted_pendulum.py``: physics at 500 Hz, sensor at
250 Hz, controller at 100 Hz) runs in real time in a fresh process per trial,
in one of three modes: **none** (nobody watches), **echo** (``mujou echo PID
physics.state`` in a second process, its output thrown away) and **hz**
(``mujou hz PID physics.state``). The modes alternate (none, echo, hz, none,
...), ``--repeat`` times each; every figure is the median over a mode's trials.
Each trial measures ``--seconds`` of wall time once the watcher's watch
(`Run.watch`) is up (the run's ``stats().subscriptions`` shows it), after
``--warmup`` seconds:

* **send ns/msg**: the CPU time of the sending thread per message of
  ``physics.state`` (``time.thread_time_ns`` around each ``send``, the 500 Hz
  port watched): what a watcher costs the sender is this minus the
  unwatched figure. The timing's own cost is in every mode alike.
* **process cpu %**: the watched process's CPU time (user + system, every
  thread: the net, the ``mujou-host`` and ``mujou-attach`` threads) over the
  wall time, in % of one core; the watch's cost is this minus the unwatched
  figure.
* **serve cpu %**: the part of the above spent by the threads that serve the
  watcher in the watched process, ``mujou-attach`` (the endpoint: it takes
  the watch's queue, makes the views, writes them) and ``mujou-host`` (only
  when something subscribes), each thread's own CPU clock: a figure free of
  the net's threads' noise, though not of what the watch costs them (the
  sender's share is **send ns/msg**; a GIL handed back and forth costs both).
* **watcher cpu %**: the ``mujou echo`` or ``mujou hz`` process's own CPU
  over the same window (its start-up left out).
* **lost**: messages the watcher lost on the run's side (the drops of its
  watch's queue, ``SubscriptionStats.watch_dropped``, and of any
  subscription's), summed over the window; **watcher lost**: those the
  watcher was told it lost (since it began); **received** (echo): messages it
  printed.

The script imports ``mujou_actors`` from ``sys.path``: set ``PYTHONPATH`` to
the tree to measure. It needs the examples' extras (MuJoCo).

Usage::

    python benchmarks/attach.py [--seconds 10] [--warmup 2] [--repeat 5]
                                [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODES = ("none", "echo", "hz")
PORT = "physics.state"
_WAIT = 120.0  # wall seconds for any one step (a start, a subscription)


def child(mode: str, seconds: float, warmup: float) -> None:
    """One trial, in its own process: run the main job, time the sends, print the figures."""
    sys.path.insert(0, str(ROOT / "examples"))
    import inverted_pendulum

    import mujou_actors as mujou

    run = mujou.run(inverted_pendulum.make_net(seed=0), timer="realtime")
    try:
        port = run.nodes["physics"].state  # type: ignore[attr-defined]
        send = port.send
        acc = [0, 0]  # CPU ns of the sends, sends

        def timed(value: Any) -> None:
            t0 = time.thread_time_ns()
            send(value)
            acc[0] += time.thread_time_ns() - t0
            acc[1] += 1

        port.send = timed  # the run set `send` on the instance; this wraps it
        print(json.dumps({"ready": os.getpid()}), flush=True)
        deadline = time.monotonic() + _WAIT
        while mode != "none" and PORT not in run.stats().subscriptions:
            if time.monotonic() > deadline:
                raise TimeoutError("the watcher did not subscribe")
            run.wait(0.05)
        run.wait(warmup)
        lost0 = _lost(run)
        acc[0] = acc[1] = 0
        serving = _serving_clocks()
        serve0 = sum(time.clock_gettime_ns(c) for c in serving)
        cpu0, wall0 = sum(os.times()[:2]), time.monotonic()
        print(json.dumps({"measuring": True}), flush=True)
        run.wait(seconds)
        cpu1, wall1 = sum(os.times()[:2]), time.monotonic()
        serve1 = sum(time.clock_gettime_ns(c) for c in serving)
        ns, sends = acc
        lost = _lost(run) - lost0
        print(json.dumps({"send_ns": ns / max(sends, 1), "sends": sends,
                          "cpu_pct": 100 * (cpu1 - cpu0) / (wall1 - wall0),
                          "serve_cpu_pct": 100 * (serve1 - serve0) / 1e9 / (wall1 - wall0),
                          "lost": lost}),
              flush=True)
    finally:
        run.stop()


def _serving_clocks() -> list[int]:
    """The CPU clocks of the threads that serve a watcher: ``mujou-attach``, ``mujou-host``."""
    import threading

    return [time.pthread_getcpuclockid(t.ident) for t in threading.enumerate()
            if t.name in ("mujou-attach", "mujou-host") and t.ident is not None]


def _lost(run: Any) -> int:
    """Messages of `PORT` dropped on the run's side so far (watches' and subscriptions')."""
    subs = run.stats().subscriptions.get(PORT)
    return 0 if subs is None else subs.dropped + getattr(subs, "watch_dropped", 0)


def _line(proc: subprocess.Popen[str], key: str) -> dict[str, Any]:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the trial ended before {key!r} (exit {proc.wait()})")
        if line.startswith("{"):
            doc = json.loads(line)
            if key in doc:
                return doc


def trial(mode: str, seconds: float, warmup: float, env: dict[str, str]) -> dict[str, Any]:
    """One trial of ``mode`` in fresh processes (the run, and its watcher)."""
    import psutil

    run = subprocess.Popen([sys.executable, __file__, "--child", mode, "--seconds",
                            str(seconds), "--warmup", str(warmup)], stdout=subprocess.PIPE,
                           text=True, env=env)
    watcher = None
    result: dict[str, Any] = {}
    printed, said = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    try:
        pid = _line(run, "ready")["ready"]
        if mode != "none":
            # Its output to files, read at the end: a pipe nobody reads would stop it.
            args = [sys.executable, "-m", "mujou_actors", mode, str(pid), PORT]
            watcher = subprocess.Popen(args, stdout=printed, stderr=said, env=env)
        _line(run, "measuring")
        w0 = None if watcher is None else sum(psutil.Process(watcher.pid).cpu_times()[:2])
        t0 = time.monotonic()
        result = _line(run, "send_ns")
        if watcher is not None:
            spent = sum(psutil.Process(watcher.pid).cpu_times()[:2]) - (w0 or 0.0)
            result["watcher_cpu_pct"] = 100 * spent / (time.monotonic() - t0)
        run.wait(_WAIT)
    finally:
        if run.poll() is None:
            run.kill()
        if watcher is not None:
            if watcher.poll() is None:
                watcher.send_signal(signal.SIGINT)  # as Ctrl-C: it flushes what it printed
            watcher.wait(_WAIT)
            printed.seek(0)
            said.seek(0)
            if mode == "echo":
                result["received"] = printed.read().splitlines().count("---")
            # "(N message(s) of PORT lost, M in all: ...)": the last M
            lost = [line.split(" in all")[0].rpartition(" ")[2] for line in said
                    if " in all" in line]
            result["watcher_lost"] = int(lost[-1]) if lost else 0
        printed.close()
        said.close()
    return result


def measure(seconds: float, warmup: float, repeat: int) -> dict[str, Any]:
    """Every mode ``repeat`` times, alternating; the medians and the samples."""
    folder = tempfile.mkdtemp(prefix="mjb", dir="/tmp")
    env = {**os.environ, "MUJOU_RUNTIME_DIR": os.path.join(folder, "rt")}
    samples: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for _ in range(repeat):
        for mode in MODES:
            samples[mode].append(trial(mode, seconds, warmup, env))
    out: dict[str, Any] = {}
    for mode, runs in samples.items():
        med = {key: statistics.median(r[key] for r in runs)
               for key in ("send_ns", "cpu_pct", "serve_cpu_pct", "lost", "sends")}
        if mode != "none":
            for key in ("watcher_cpu_pct", "watcher_lost"):
                med[key] = statistics.median(r[key] for r in runs)
        out[mode] = {**med, "samples": runs}
    base = out["none"]
    for mode in ("echo", "hz"):
        out[mode]["send_extra_ns"] = out[mode]["send_ns"] - base["send_ns"]
        out[mode]["cpu_extra_pct"] = out[mode]["cpu_pct"] - base["cpu_pct"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="2 s, 0.5 s warm-up, 1 repeat")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        child(args.child, args.seconds, args.warmup)
        return 0
    if args.quick:
        args.seconds, args.warmup, args.repeat = 2.0, 0.5, 1
    if args.repeat < 1 or args.seconds <= 0 or args.warmup < 0:
        ap.error("--repeat must be >= 1, --seconds > 0, --warmup >= 0")
    import mujou_actors as mujou

    print(f"mujou_actors {mujou.__file__}", flush=True)
    result = measure(args.seconds, args.warmup, args.repeat)
    doc = {"benchmark": "attach", "quick": args.quick, "repeat": args.repeat,
           "seconds": args.seconds, "python": platform.python_version(),
           "cpus": os.cpu_count(), "port": PORT, "modes": result,
           "target": {"send_extra_ns": 1000, "cpu_extra_pct": 1.0}}
    print(f"{'mode':<6} {'send ns':>8} {'+send ns':>9} {'cpu %':>7} {'+cpu %':>7} "
          f"{'serve %':>8} {'watcher %':>10} {'lost':>6} {'w. lost':>8} {'sends':>7}")
    for mode, r in result.items():
        print(f"{mode:<6} {r['send_ns']:>8.0f} {r.get('send_extra_ns', 0.0):>9.0f} "
              f"{r['cpu_pct']:>7.2f} {r.get('cpu_extra_pct', 0.0):>7.2f} "
              f"{r['serve_cpu_pct']:>8.2f} "
              f"{r.get('watcher_cpu_pct', 0.0):>10.2f} {r['lost']:>6.0f} "
              f"{r.get('watcher_lost', 0.0):>8.0f} {r['sends']:>7.0f}")
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
