"""The heartbeat between machines (``mujou_actors.distributed.heartbeat``), measured on loopback.

What is measured
----------------
The leader's ``Monitor`` runs in this process; the members' ``Responder``
threads in a child process (spawned with ``subprocess``, importing the
package), connected over ``tcp://127.0.0.1``: two processes of one machine
stand in for two machines.

**rtt**: one member pinged every ``--rtt-period`` seconds (0.005) for
``--rtt-seconds`` (3), every exchange kept (the clock filter's window holds
them all). Figures: the round trip ``t3 - t0`` as the Monitor saw it, p50 and
p99 µs; the NTP delay (the round trip without the member's own time between
receiving and answering) p50 µs; the clock filter's offset and its
uncertainty at the end (one clock: the true offset is 0, and ``|offset| <=
uncertainty`` must hold).

**detect**: with the defaults (``timeout`` 1.0 s, ``period`` 0.1 s, or
``--timeout``, ``--period``), ``--trials`` times (5): a member process is
started and answers, then it is SIGKILLed; the figure is the time from the
``kill`` call to the Monitor's ``Change`` (its ``at_ns``), p50, min and max
ms. Each kill comes at a random phase of the pings (a seeded uniform wait of
up to a period after an answer). Expected: between ``timeout - period`` and
``timeout``, plus the thread's wake-up.

**cpu**: ``--members`` (0, 1, 8, 64) members pinged at the default period
for ``--cpu-seconds`` (5); the CPU time of the Monitor's thread
(``time.pthread_getcpuclockid``), of this whole process (with zmq's I/O
thread) and of the child (all its Responders and their zmq threads), in µs
per second of wall time. With 0 members the Monitor only wakes every period:
the floor (on a virtual machine a wake-up alone is charged tens of µs of CPU).
The cost per member is the leader's above that floor, divided by the members,
and the member process's whole CPU divided by them.

Wall-clock figures on a shared machine swing; the repetitions (``--repeat``,
3; ``--quick``: 1, shorter runs, 2 trials) are interleaved by workload and
their median shown. The script imports ``mujou_actors`` from ``sys.path``
(set ``PYTHONPATH`` to the tree to measure); the children get the same tree.
Results: tables, and JSON in ``benchmarks/results/heartbeat.json`` unless
``--json`` says otherwise. Every wait is bounded; every child is killed and
reaped at the end whatever happens.

Usage::

    python benchmarks/heartbeat.py [--quick] [--repeat 3] [--only rtt,detect,cpu] [--json PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import zmq
from common import machine, pct, repeat_and_only, show_table

import mujou_actors
from mujou_actors.distributed.heartbeat import Change, Monitor

ROOT = Path(__file__).resolve().parent.parent
TREE = Path(mujou_actors.__file__).resolve().parent.parent  # the tree measured
WORKLOADS = ("rtt", "detect", "cpu")
BOUND_S = 60.0  # the bound on any single wait (a child's import of torch included)
# The child: Responders for the names given; "cpu" on stdin -> its CPU time (ns) on stdout.
CHILD = """\
import os, sys, time
from mujou_actors.distributed.heartbeat import Responder
responders = [Responder(sys.argv[1], name) for name in sys.argv[2:]]
print(os.getpid(), flush=True)
for line in sys.stdin:
    print(time.process_time_ns(), flush=True)
for r in responders:
    r.close()
"""


class Child:
    """A child process serving Responders; killed and reaped by `close` whatever happens."""

    def __init__(self, address: str, names: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, address, *names], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(TREE)})
        try:
            self.pid = int(self._line())
        except BaseException:
            self.proc.kill()
            self.proc.wait(5)
            raise

    def _line(self) -> str:
        """The child's next line of output, within `BOUND_S`."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], BOUND_S)
        if not ready:
            raise TimeoutError("the child did not answer")
        return self.proc.stdout.readline()

    def cpu_ns(self) -> int:
        """The child's CPU time so far (all its threads), ns."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("cpu\n")
        self.proc.stdin.flush()
        return int(self._line())

    def close(self) -> None:
        """End the child: close its stdin, then kill it if it lingers; reap it."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(5)
        except (subprocess.TimeoutExpired, OSError):
            self.proc.kill()
            self.proc.wait(5)


def wait_answers(monitor: Monitor, names: list[str], count: int) -> None:
    """Wait until every member in ``names`` has answered ``count`` pings and is not lost."""
    deadline = time.monotonic() + BOUND_S
    while True:
        members = monitor.members()
        if all(members[n].answers >= count and not members[n].lost for n in names):
            return
        if time.monotonic() > deadline:
            raise TimeoutError("the members did not answer")
        time.sleep(0.01)


def next_change(monitor: Monitor) -> Change:
    """The next change the Monitor reports, waiting on its file descriptor (bounded)."""
    deadline = time.monotonic() + BOUND_S
    while True:
        changes = monitor.take_changes()
        if changes:
            return changes[0]
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no change")
        select.select([monitor.fileno()], [], [], left)


def measure_rtt(period: float, seconds: float) -> dict[str, float]:
    """One member pinged every ``period`` for ``seconds``: RTT, delay, offset (see the top)."""
    with Monitor(period=period, window=1_000_000) as monitor:
        monitor.watch("m")
        child = Child(monitor.address, ["m"])
        try:
            wait_answers(monitor, ["m"], 1)
            first = len(monitor.members()["m"].samples)
            time.sleep(seconds)  # the measurement itself: exchanges at the period
            status = monitor.members()["m"]
        finally:
            child.close()
    samples = status.samples[first:]
    assert status.offset is not None and samples
    rtts = [s.rtt_ns / 1e3 for s in samples]
    delays = [s.delay_ns / 1e3 for s in samples]
    return {"exchanges": len(samples), "rtt_p50_us": pct(rtts, 50), "rtt_p99_us": pct(rtts, 99),
            "delay_p50_us": pct(delays, 50), "offset_us": status.offset.offset_ns / 1e3,
            "uncertainty_us": status.offset.uncertainty_ns / 1e3,
            "within": float(abs(status.offset.offset_ns) <= status.offset.uncertainty_ns)}


def measure_detect(trials: int, timeout: float, period: float) -> dict[str, Any]:
    """SIGKILL of a member process to its loss on the Monitor, ``trials`` times (ms)."""
    times: list[float] = []
    rng = random.Random(17)
    with Monitor(period=period, timeout=timeout) as monitor:
        monitor.watch("m")
        for _ in range(trials):
            child = Child(monitor.address, ["m"])
            try:
                wait_answers(monitor, ["m"], 3)
                monitor.take_changes()  # its loss while it started, and its return
                time.sleep(rng.uniform(0, period))  # a kill at any phase of the pings
                killed = time.monotonic_ns()
                os.kill(child.pid, signal.SIGKILL)
                change = next_change(monitor)
                assert change.lost, change
                times.append((change.at_ns - killed) / 1e6)
            finally:
                child.close()
    return {"trials": trials, "p50_ms": statistics.median(times), "min_ms": min(times),
            "max_ms": max(times), "samples_ms": times}


def measure_cpu(members: int, seconds: float) -> dict[str, float]:
    """``members`` members at the default period for ``seconds``: CPU µs per second of wall time.

    With 0 members, the Monitor alone (its wake-up every period): the floor.
    """
    names = [f"m{i}" for i in range(members)]
    with Monitor() as monitor:
        for name in names:
            monitor.watch(name)
        child = Child(monitor.address, names) if names else None
        try:
            wait_answers(monitor, names, 2)
            ident = monitor._thread.ident  # the Monitor's thread: its own CPU clock
            assert ident is not None
            clock = time.pthread_getcpuclockid(ident)
            answers0 = monitor.stats().answers
            t0, m0, p0, c0 = (time.monotonic_ns(), time.clock_gettime_ns(clock),
                              time.process_time_ns(), child.cpu_ns() if child else 0)
            time.sleep(seconds)  # the measurement itself: the Monitor's thread works alone
            t1, m1, p1, c1 = (time.monotonic_ns(), time.clock_gettime_ns(clock),
                              time.process_time_ns(), child.cpu_ns() if child else 0)
            answers = monitor.stats().answers - answers0
            lost = [n for n, s in monitor.members().items() if s.lost]
        finally:
            if child is not None:
                child.close()
    wall = (t1 - t0) / 1e9
    return {"members": members, "answers_s": answers / wall, "monitor_us_s": (m1 - m0) / 1e3 / wall,
            "process_us_s": (p1 - p0) / 1e3 / wall, "responder_us_s": (c1 - c0) / 1e3 / wall,
            "lost": len(lost)}


def per_member(results: dict[str, dict[str, float]]) -> None:
    """Add each row's cost per member: above the 0-member floor (leader), all of it (member)."""
    floor = results.get("0", {"monitor_us_s": 0.0, "process_us_s": 0.0})
    for r in results.values():
        n = r["members"]
        if n:
            r["monitor_us"] = (r["monitor_us_s"] - floor["monitor_us_s"]) / n
            r["process_us"] = (r["process_us_s"] - floor["process_us_s"]) / n
            r["responder_us"] = r["responder_us_s"] / n


def median_of(reps: list[dict[str, float]]) -> dict[str, float]:
    """The median of each figure over the repetitions."""
    return {k: statistics.median(r[k] for r in reps) for k in reps[0]}


RTT_COLUMNS = (("exchanges", "exchanges", "{:.0f}"), ("rtt_p50_us", "RTT p50 µs", "{:.0f}"),
               ("rtt_p99_us", "RTT p99 µs", "{:.0f}"), ("delay_p50_us", "delay p50 µs", "{:.0f}"),
               ("offset_us", "offset µs", "{:+.1f}"), ("uncertainty_us", "± µs", "{:.1f}"))
DETECT_COLUMNS = (("trials", "trials", "{:.0f}"), ("p50_ms", "p50 ms", "{:.0f}"),
                  ("min_ms", "min ms", "{:.0f}"), ("max_ms", "max ms", "{:.0f}"))
CPU_COLUMNS = (("answers_s", "answers/s", "{:.0f}"),
               ("monitor_us_s", "monitor µs/s", "{:.0f}"),
               ("monitor_us", "per member", "{:.0f}"),
               ("process_us_s", "leader µs/s", "{:.0f}"),
               ("process_us", "per member", "{:.0f}"),
               ("responder_us", "member µs/s per member", "{:.0f}"),
               ("lost", "lost", "{:.0f}"))


FULL = {"rtt_seconds": 3.0, "trials": 5, "members": [0, 1, 8, 64], "cpu_seconds": 5.0,
        "repeat": 3}
QUICK = {"rtt_seconds": 1.0, "trials": 2, "members": [0, 8], "cpu_seconds": 1.0, "repeat": 1}


def main(argv: list[str] | None = None) -> int:
    """Run the measurements; print the tables; write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rtt-period", type=float, default=0.005, help="seconds between pings")
    ap.add_argument("--rtt-seconds", type=float, default=None, help="3 (--quick: 1)")
    ap.add_argument("--trials", type=int, default=None, help="SIGKILLs of a member (5; --quick: 2)")
    ap.add_argument("--timeout", type=float, default=1.0, help="the Monitor's timeout (detect)")
    ap.add_argument("--period", type=float, default=0.1, help="the Monitor's period (detect)")
    ap.add_argument("--members", type=lambda s: [int(n) for n in s.split(",")],
                    default=None, help="member counts of the CPU cost (0: the floor; "
                    "0,1,8,64; --quick: 0,8)")
    ap.add_argument("--cpu-seconds", type=float, default=None, help="5 (--quick: 1)")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions (3; --quick: 1)")
    ap.add_argument("--only", type=lambda s: [w.strip() for w in s.split(",") if w.strip()],
                    default=None, help=f"workloads, from {', '.join(WORKLOADS)}")
    ap.add_argument("--quick", action="store_true",
                    help="1 repetition, 1 s of RTT, 2 trials, 1 s of CPU for 0 and 8 members")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/heartbeat.json")
    cfg = ap.parse_args(argv)
    defaults = QUICK if cfg.quick else FULL
    for key, value in defaults.items():  # what the command line did not say
        if getattr(cfg, key) is None:
            setattr(cfg, key, value)
    repeat, only = repeat_and_only(ap, cfg, WORKLOADS)
    rtt: list[dict[str, float]] = []
    cpu: dict[str, list[dict[str, float]]] = {str(n): [] for n in cfg.members}
    detect: dict[str, Any] = {}
    for rep in range(repeat):  # interleaved, repetition by repetition
        print(f"repetition {rep + 1}/{repeat}", flush=True)
        if "rtt" in only:
            rtt.append(measure_rtt(cfg.rtt_period, cfg.rtt_seconds))
        if "cpu" in only:
            for n in cfg.members:
                cpu[str(n)].append(measure_cpu(n, cfg.cpu_seconds))
    if "detect" in only:  # trials, not repetitions: each is one sample
        detect = measure_detect(cfg.trials, cfg.timeout, cfg.period)
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    results: dict[str, Any] = {}
    if "rtt" in only:
        results["rtt"] = median_of(rtt)
        show_table(f"Heartbeat RTT, two processes over tcp://127.0.0.1, period "
                   f"{cfg.rtt_period} s, {when}, {machine()}, median of {repeat}", "case",
                   {"loopback": results["rtt"]}, RTT_COLUMNS)
    if "detect" in only:
        results["detect"] = detect
        show_table(f"SIGKILL of a member to its loss, timeout {cfg.timeout} s, period "
                   f"{cfg.period} s", "case", {"loopback": detect}, DETECT_COLUMNS)
    if "cpu" in only:
        results["cpu"] = {case: median_of(reps) for case, reps in cpu.items()}
        per_member(results["cpu"])
        show_table(f"CPU of the heartbeat (µs of CPU per second), period 0.1 s, median of "
                   f"{repeat}; per member: above the 0-member floor", "members",
                   results["cpu"], CPU_COLUMNS)
    cfg.json.parent.mkdir(parents=True, exist_ok=True)
    cfg.json.write_text(json.dumps({
        "benchmark": "heartbeat", "date": when, "machine": machine(),
        "mujou_actors": str(TREE), "versions": {"pyzmq": zmq.pyzmq_version(),
                                                "libzmq": zmq.zmq_version()},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items()},
        "results": results, "samples": {"rtt": rtt, "cpu": cpu}}, indent=1))
    print(f"wrote {cfg.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
