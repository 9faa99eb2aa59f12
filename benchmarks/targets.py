"""The targets of issue 29, side by side in one run: fresh processes, alternating, medians.

What is measured
----------------
Every target compares mujou_actors with a reference measured in the same run
(the plain loop doing the same work, or the Python heap floor), or, for the
real-time figures that have no such reference, with a baseline stored by an
earlier run of this script:

* **rl** -- the trivial RL step of ``benchmarks/rlstep.py``, its ``full``
  variant (an ``env`` node every 8 ms, a ``policy`` triggered by the
  observation, a ``recorder`` triggered by both; float32 tensors sent from
  buffers the senders keep, so each send copies; statistics on), against its
  ``plain`` loop of the same trivial calls. Figure: µs per step, the wall time
  of ``run.join()`` / steps (as rlstep.py: the run's start excluded, its stop
  included). Target: mujou at most 4 µs per step.
* **ticks10**, **ticks1000**, **ticks100000** -- N ``common.NoOp`` nodes (10 ms
  period, simulated timer, default workers) against ``common.heap_floor`` (a
  ``heapq`` of due times calling the same no-op method) on the same schedule;
  both sides make the same number of updates (asserted). Figure: ns per
  update; ratio: mujou's rate as a fraction of the floor's (floor ns / mujou
  ns). Target: at least 1.0. Window: at 10 nodes ``run.join()`` (as
  realwork.py's *ticks10*; the run is long enough that its end is well under
  1 % of it); at 1,000 and 100,000 nodes from the return of ``mujou.run`` to
  the last instant's update of a marker (a periodic node and the child it
  triggers, which runs after every tick of an instant, as run.py's *scale*):
  the end of the run (every node's ``on_stop``: 0.8 s at 100,000 nodes) is
  left out. The marker's own two updates per instant are not counted; they
  are 0.2 % of the work at 1,000 nodes (at 10 nodes they would be 20 %, hence
  the join window there).
* **pendulum** -- the main job's shape: the 4-rate net of
  ``examples/inverted_pendulum.py`` (MuJoCo physics at 500 Hz, a sensor at
  250 Hz, an LQR controller at 100 Hz, a triggered recorder), against the same
  arithmetic in a plain loop (``benchmarks/realwork.py``'s *pendulum*, with
  its timed window). Figure: µs per physics step. Target: at most 1.5 x the
  plain loop. The recordings are compared bit for bit every repetition.
* **hopper** -- gymnasium ``Hopper-v5`` and a torch MLP 11-64-64-3
  (``benchmarks/realwork.py``'s *hopper*, its window and its plain loop).
  Figure: µs per step. Target: at most 1.05 x the plain loop, and the same
  result bit for bit: both sides' recordings (every observation, reward and
  action) are compared every repetition, and a difference stops the script
  with an ``AssertionError``.
* **pingpong**, **fanout**, **timer** -- the mujou sides of
  ``benchmarks/run.py``'s workloads of those names, real time: the ping-pong
  round trip (p50 µs; CPU per round trip over the same window), fan-out to
  100 workers and back (µs per message = 1 / messages per second, from the
  source's first send to the sink's last receipt), ten 1 kHz timers
  (lateness p99 µs; CPU per tick over the whole run). Target: not worse than
  today, that is than the baseline: ``--baseline PATH``, else
  ``results/targets-baseline.json`` (``--save-baseline`` writes it), else the
  previous run's JSON at the ``--json`` path. A baseline counts only if it
  ran the same sizes (``--quick`` or not); met when mujou's median is at most
  ``1 + TOLERANCE`` times the baseline's (these figures move by up to 10 %
  between two runs on the shared reference machine). Without a baseline the
  figures stand alone and nothing is judged.

How it runs
-----------
Each measurement runs in a fresh ``python`` process (this script with
``--child``): it imports what it needs, runs a short warm-up of the same side
(first calls, lazy imports), then the measured run, and prints its figures.
For each target, every repetition runs every side once, the order reversed
on every other repetition (mujou, reference; reference, mujou; ...), so drifts
in the machine's load hit both sides. Nothing the parent process holds is in
a child's heap, and no side runs in a process another measurement has warmed
or fragmented.

How to read it
--------------
Every figure is a cost per unit of work (µs per step, ns per update, µs per
message, µs of lateness), so lower is better, and each cell shows the median
over the repetitions with the minimum (the least disturbed repetition)
beside it. *ratio* is computed per repetition from that repetition's two
samples, then its median is shown: mujou / reference for costs (1.3x: mujou
takes 30 % longer), except for the ticks, where it is mujou's rate / the
floor's (0.5: half the floor's rate); against a baseline it is mujou's median
/ the baseline's. *met* judges the issue's target on the wall figures; where
the same rule on the CPU figures says otherwise, the cell says so
(``yes (CPU: no)``): the machine's load, not the code, decided that verdict,
and a run on a quieter machine (or more repetitions) should settle it.

Wall and CPU time. The targets use the wall time, as issue 29 states them.
Each measurement also reads the process's CPU time (``resource.getrusage``,
every thread, user and system) around the same window, and the table shows
it beside: the reference machine is shared and often loaded, and a thread
waiting for a CPU stretches the wall time of a run but not its CPU time, so a
wall ratio that moves between runs while the CPU ratio holds is the machine,
not the code. (CPU time counts every thread of the process: a framework
thread that spins or wakes needlessly shows there, not in the wall time.)

The JSON file (default ``results/targets.json``) records every sample of every
side, the ratios and verdicts, and which build of the kernel ran
(``mujou_actors._runtime.BUILD`` where the package has one, else
``"python"``), as each child process reports it.

Usage::

    python benchmarks/targets.py [--quick] [--only NAME[,NAME...]] [--repeat N]
                                 [--json PATH] [--baseline PATH] [--save-baseline]

``--quick``: small sizes and 2 repetitions, a CI smoke run (a few minutes
for every target on a loaded 2-core machine); ``--only rl,hopper`` measures
those targets alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from common import NoOp, cpu_s, heap_floor, machine, repeat_and_only, summary

import mujou_actors as mujou

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DEFAULT_JSON = RESULTS / "targets.json"
DEFAULT_BASELINE = RESULTS / "targets-baseline.json"
CHILD_TIMEOUT_S = 600.0  # bound on one child process (warm-up and measurement)
WAIT_S = 300.0  # bound on one run's join inside a child
PERIOD_NS = 10_000_000  # the ticks' period
MARK_FROM = 1000  # from this many nodes on, the ticks' window ends at the marker
TOLERANCE = 0.10  # "not worse than the baseline": at most this much more
TIMER_NODES = 10
TIMER_PERIOD_NS = 1_000_000


# --------------------------------------------------------------------------- targets


@dataclasses.dataclass(frozen=True)
class Target:
    """One target of issue 29: what runs on each side, at which sizes, and the goal.

    Attributes:
        name (str): the name ``--only`` takes.
        title (str): the row's title in the table.
        unit (str): the unit of the wall figure.
        cpu_unit (str): the unit of the CPU figure.
        against (str): what the reference is, in words ("plain loop", ...).
        mujou (str): the child that measures mujou (a key of `CHILDREN`).
        reference (str | None): the child that measures the reference in the
            same run; None: the reference is the stored baseline.
        full (dict): the children's arguments for a full run.
        quick (dict): the same for ``--quick``.
        warm (dict): the arguments of the warm-up run each child makes first.
        goal (str): ``"absolute"`` (mujou's median at most ``bound``),
            ``"cost"`` (ratio at most ``bound``), ``"rate"`` (ratio at least
            ``bound``) or ``"baseline"`` (ratio to the baseline at most
            ``bound``).
        bound (float): the bound of ``goal``.
        text (str): the target in words, for the table.
        records (bool): both sides return a recording, compared bit for bit.
        needs (tuple[str, ...]): optional modules both sides need (checked first).
    """

    name: str
    title: str
    unit: str
    cpu_unit: str
    against: str
    mujou: str
    reference: str | None
    full: dict
    quick: dict
    warm: dict
    goal: str
    bound: float
    text: str
    records: bool = False
    needs: tuple[str, ...] = ()


def ticks_target(n: int, full_s: float, quick_s: float, warm: dict) -> Target:
    """The no-op ticks target at ``n`` nodes, runs of ``full_s`` / ``quick_s`` simulated s."""
    return Target(
        name=f"ticks{n}", title=f"no-op ticks, {n:,} nodes", unit="ns/update",
        cpu_unit="CPU ns/update", against="heap floor", mujou="ticks_mujou",
        reference="ticks_floor", full={"n": n, "end_ns": round(full_s * 1e9)},
        quick={"n": n, "end_ns": round(quick_s * 1e9)}, warm=warm, goal="rate", bound=1.0,
        text="rate ≥ 1.0 x floor's")


TARGETS: tuple[Target, ...] = (
    Target("rl", "trivial RL step (rlstep full)", "µs/step", "CPU µs/step", "plain loop",
           "rl_mujou", "rl_plain", {"steps": 20_000}, {"steps": 2000}, {"steps": 500},
           "absolute", 4.0, "≤ 4 µs/step"),
    ticks_target(10, 1000.0, 200.0, {"n": 10, "end_ns": 20 * 10**9}),
    ticks_target(1000, 1.0, 0.2, {"n": 1000, "end_ns": 20 * PERIOD_NS}),
    ticks_target(100_000, 0.1, 0.03, {"n": 1000, "end_ns": 20 * PERIOD_NS}),
    Target("pendulum", "4-rate pendulum net (main job)", "µs/physics step",
           "CPU µs/physics step", "plain loop", "pendulum_mujou", "pendulum_plain",
           {"duration_ns": 40 * 10**9}, {"duration_ns": 4 * 10**9},
           {"duration_ns": 2 * 10**8}, "cost", 1.5, "≤ 1.5 x plain", records=True,
           needs=("mujoco",)),
    Target("hopper", "Hopper-v5 + MLP (realwork)", "µs/step", "CPU µs/step", "plain loop",
           "hopper_mujou", "hopper_plain", {"steps": 10_000}, {"steps": 2000}, {"steps": 50},
           "cost", 1.05, "≤ 1.05 x plain, bit-identical", records=True,
           needs=("gymnasium", "mujoco")),
    Target("pingpong", "ping-pong round trip (run.py)", "µs p50", "CPU µs/round trip",
           "baseline", "pingpong_mujou", None, {"n": 5000}, {"n": 1000}, {"n": 200},
           "baseline", 1 + TOLERANCE, "not worse than baseline"),
    Target("fanout", "fan-out, 100 workers (run.py)", "µs/message", "CPU µs/message",
           "baseline", "fanout_mujou", None, {"m": 50_000}, {"m": 5000}, {"m": 1000},
           "baseline", 1 + TOLERANCE, "not worse than baseline"),
    Target("timer", "1 kHz timer, 10 nodes (run.py)", "µs lateness p99", "CPU µs/tick",
           "baseline", "timer_mujou", None, {"k": 5000}, {"k": 500}, {"k": 50},
           "baseline", 1 + TOLERANCE, "not worse than baseline"),
)
NAMES = tuple(t.name for t in TARGETS)


# --------------------------------------------------------------------------- children


def wait_join(run: mujou.Run, what: str) -> None:
    """``run.join()`` bounded by ``WAIT_S``.

    Raises:
        TimeoutError: the run was still going after ``WAIT_S`` (it is stopped first).
    """
    run.join(timeout=WAIT_S)
    if run.running:
        run.stop()
        raise TimeoutError(f"mujou {what} did not finish within {WAIT_S:g} s")


def rl_mujou(steps: int) -> dict:
    """rlstep.py's *full* net (``time_net``) for ``steps`` steps: µs and CPU µs per step."""
    import rlstep

    cpu: list[float] = []
    wall = rlstep.time_net(steps, cpu=cpu)
    return {"count": steps, "wall": wall, "cpu": cpu[0]}


def rl_plain(steps: int) -> dict:
    """rlstep.py's plain loop (``time_plain``) for ``steps`` steps: µs and CPU µs per step."""
    import rlstep

    cpu: list[float] = []
    wall = rlstep.time_plain(steps, cpu=cpu)
    return {"count": steps, "wall": wall, "cpu": cpu[0]}


class Marker(mujou.Node):
    """Periodic (the ticks' period): sends to its triggered `Mark` once per instant."""

    def __init__(self) -> None:
        """A marker with its `Mark` as its child, connected."""
        super().__init__(period=PERIOD_NS / 1e9)
        self.mark = Mark()
        self.out = mujou.Output(int)
        mujou.connect(self.out, self.mark.inp)

    def on_update(self, dt: float) -> None:
        """Trigger the mark, whose update comes after every tick of this instant."""
        self.out.send(0)


class Mark(mujou.Node):
    """Notes the wall and CPU clocks once every tick of an instant has run."""

    inp = mujou.Input(int)

    def __init__(self) -> None:
        """A triggered node; its clocks read 0 until its first update."""
        super().__init__(period=None)
        self.wall = self.cpu = 0.0

    def on_update(self, dt: float) -> None:
        """Read both clocks: the last update of the run leaves the end of its last instant."""
        self.inp.drain()
        self.wall = time.perf_counter()
        self.cpu = cpu_s()


def ticks_mujou(n: int, end_ns: int) -> dict:
    """``n`` no-op nodes for ``end_ns`` simulated: ns and CPU ns per update (see the module)."""
    nodes: list[mujou.Node] = [NoOp(period=PERIOD_NS / 1e9) for _ in range(n)]
    marker = Marker() if n >= MARK_FROM else None
    gc.collect()
    run = mujou.run(nodes + ([marker] if marker else []), timer="simulated",
                    duration=end_ns / 1e9)
    c0, t0 = cpu_s(), time.perf_counter()
    wait_join(run, f"ticks at {n} nodes")
    t1, c1 = time.perf_counter(), cpu_s()
    marks: tuple[str, ...] = ()
    if marker is not None:
        t1, c1, marks = marker.mark.wall, marker.mark.cpu, (marker.path, marker.mark.path)
    updates = sum(s.updates for p, s in run.stats().nodes.items() if p not in marks)
    return {"count": updates, "wall": (t1 - t0) / updates * 1e9,
            "cpu": (c1 - c0) / updates * 1e9}


def ticks_floor(n: int, end_ns: int) -> dict:
    """``common.heap_floor`` on the ticks' schedule: ns and CPU ns per update."""
    floor = heap_floor([PERIOD_NS] * n, end_ns)
    return {"count": floor["updates"], "wall": 1e9 / floor["rate"],
            "cpu": floor["cpu_s"] / floor["updates"] * 1e9}


def pendulum_mujou(duration_ns: int) -> dict:
    """realwork.py's pendulum net: µs and CPU µs per physics step, and its recording."""
    import realwork

    out = realwork.pendulum_mujou(duration_ns)
    return {"count": out["count"], "wall": out["us_per_step"], "cpu": out["cpu_us_per_step"],
            "record": out["record"]}


def pendulum_plain(duration_ns: int) -> dict:
    """realwork.py's pendulum plain loop: µs and CPU µs per physics step, and its recording."""
    import realwork

    out = realwork.pendulum_plain(duration_ns)
    return {"count": out["count"], "wall": out["us_per_step"], "cpu": out["cpu_us_per_step"],
            "record": out["record"]}


def hopper_side(out: dict) -> dict:
    """A realwork.py hopper sample as a child's result (the user's calls as extras)."""
    return {"count": out["count"], "wall": out["us_per_step"], "cpu": out["cpu_us_per_step"],
            "extra": {"env_us": out["env_us"], "policy_us": out["policy_us"]},
            "record": out["record"]}


def hopper_mujou(steps: int) -> dict:
    """realwork.py's hopper net (default workers) for ``steps`` steps."""
    import realwork

    return hopper_side(realwork.hopper_mujou(steps))


def hopper_plain(steps: int) -> dict:
    """realwork.py's hopper plain loop for ``steps`` steps."""
    import realwork

    return hopper_side(realwork.hopper_plain(steps))


def pingpong_mujou(n: int) -> dict:
    """run.py's mujou ping-pong (realtime timer): p50 round trip µs, CPU µs per round trip.

    The CPU window is the wall window of run.py's figures: from the first send
    (the pinger's ``on_start``) to the last reply.
    """
    import run as peers

    class CpuPinger(peers.Pinger):
        """run.py's pinger, reading the CPU clock where it reads the wall clock."""

        cpu0 = cpu1 = 0.0

        def on_start(self) -> None:
            """Read the CPU clock, then send the first ball."""
            self.cpu0 = cpu_s()
            super().on_start()

        def on_update(self, dt: float) -> None:
            """Return the ball; read the CPU clock once the last reply is in."""
            super().on_update(dt)
            if self.done.is_set() and not self.cpu1:
                self.cpu1 = cpu_s()

    done = threading.Event()
    ping, pong = CpuPinger(n, done), peers.Relay()
    mujou.connect(ping.out, pong.inp)
    mujou.connect(pong.out, ping.back)
    gc.collect()
    # In real time a chain of triggered updates is held to max_delta_cycles (the
    # run's guard against algebraic loops): a ping-pong is one chain of 2n updates.
    with mujou.run([ping, pong], timer="realtime", max_delta_cycles=max(10_000, 2 * n + 10)):
        peers.wait(done)
    out = peers.pingpong_result(ping.rtts, ping.last_ns - ping.first_ns)
    return {"count": out["count"], "wall": out["p50_us"],
            "cpu": (ping.cpu1 - ping.cpu0) / out["count"] * 1e6,
            "extra": {"rate": out["rate"], "p99_us": out["p99_us"]}}


def fanout_mujou(m: int) -> dict:
    """run.py's mujou fan-out (realtime timer): µs and CPU µs per message.

    Both windows run from the source's first send to the sink's last receipt.
    """
    import run as peers

    class CpuSource(peers.Source):
        """run.py's source, reading the CPU clock before its first send."""

        cpu0 = 0.0

        def on_update(self, dt: float) -> None:
            """Read the CPU clock, then send the ``m`` messages."""
            self.cpu0 = cpu_s()
            super().on_update(dt)

    class CpuSink(peers.Sink):
        """run.py's sink, reading the CPU clock at the last receipt."""

        cpu1 = 0.0

        def on_update(self, dt: float) -> None:
            """Count what arrived; read the CPU clock once all of it has."""
            super().on_update(dt)
            if self.done.is_set() and not self.cpu1:
                self.cpu1 = cpu_s()

    done = threading.Event()
    src, sink = CpuSource(m, peers.FAN_WORKERS), CpuSink(m, done)
    workers = [peers.Relay() for _ in range(peers.FAN_WORKERS)]
    for out, w in zip(src.outs, workers, strict=True):
        mujou.connect(out, w.inp)
        mujou.connect(w.out, sink.inp)
    gc.collect()
    with mujou.run([src, *workers, sink], timer="realtime", inputs={src.go: 1}):
        peers.wait(done)
    if sink.count != m:
        raise RuntimeError(f"fan-out: the sink got {sink.count} of {m}")
    elapsed_ns = sink.last_ns - src.first_ns
    return {"count": m, "wall": elapsed_ns / m / 1e3, "cpu": (sink.cpu1 - src.cpu0) / m * 1e6,
            "extra": {"rate": m / (elapsed_ns / 1e9)}}


def timer_mujou(k: int) -> dict:
    """run.py's mujou 1 kHz timer (10 nodes, ``k`` ticks): lateness p99 µs, CPU µs per tick.

    The CPU is the process's over the whole call (start, ``k`` ms of ticks,
    stop); ``cpu_share`` is that CPU time / the call's wall time.
    """
    import run as peers

    c0, t0 = cpu_s(), time.perf_counter()
    out = peers.timer_mujou(TIMER_NODES, TIMER_PERIOD_NS, k)
    t1, c1 = time.perf_counter(), cpu_s()
    keys = ("late_mean_us", "period_err_pct", "missed", "over_period", "stats_p99_us")
    return {"count": out["count"], "wall": out["late_p99_us"],
            "cpu": (c1 - c0) / out["count"] * 1e6,
            "extra": {**{key: out[key] for key in keys}, "cpu_share": (c1 - c0) / (t1 - t0)}}


CHILDREN: dict[str, Callable[..., dict]] = {
    "rl_mujou": rl_mujou, "rl_plain": rl_plain,
    "ticks_mujou": ticks_mujou, "ticks_floor": ticks_floor,
    "pendulum_mujou": pendulum_mujou, "pendulum_plain": pendulum_plain,
    "hopper_mujou": hopper_mujou, "hopper_plain": hopper_plain,
    "pingpong_mujou": pingpong_mujou, "fanout_mujou": fanout_mujou, "timer_mujou": timer_mujou,
}


def build() -> dict[str, Any]:
    """Which build of the kernel this process runs.

    Returns:
        dict: ``build``: ``str(mujou_actors._runtime.BUILD)`` where the package
        has that attribute, else ``"python"``; ``build_info``: its fields, when
        it is a dataclass.
    """
    from mujou_actors import _runtime

    b = getattr(_runtime, "BUILD", None)
    if b is None:
        return {"build": "python"}
    out: dict[str, Any] = {"build": str(b)}
    if dataclasses.is_dataclass(b) and not isinstance(b, type):
        out["build_info"] = dataclasses.asdict(b)
    return out


def child_main(name: str, spec: str) -> None:
    """In a fresh process: warm up, measure once, print the result as one JSON line.

    Args:
        name (str): the child (a key of `CHILDREN`).
        spec (str): JSON: ``kwargs`` (the measured run's), ``warm`` (the
            warm-up's) and ``record`` (a path to save the recording to, or null).
    """
    fn, args = CHILDREN[name], json.loads(spec)
    fn(**args["warm"])
    gc.collect()
    out = fn(**args["kwargs"])
    record = out.pop("record", None)
    if args["record"] is not None:
        torch.save(record, args["record"])
    print(json.dumps({**out, **build()}))


def run_child(name: str, kwargs: dict, warm: dict, record: Path | None) -> dict:
    """Run one measurement in a fresh process (this script with ``--child``).

    Args:
        name (str): the child (a key of `CHILDREN`).
        kwargs (dict): the measured run's arguments.
        warm (dict): the warm-up run's arguments.
        record (Path | None): where the child saves its recording.

    Returns:
        dict: the child's result: ``count``, ``wall``, ``cpu``, maybe ``extra``,
        and ``build``.

    Raises:
        RuntimeError: the child failed or overran ``CHILD_TIMEOUT_S``.
    """
    spec = json.dumps({"kwargs": kwargs, "warm": warm,
                       "record": None if record is None else str(record)})
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, spec]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                              cwd=HERE.parent)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{name} {kwargs}: killed after {CHILD_TIMEOUT_S:g} s") from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:]) or "no output"
        raise RuntimeError(f"{name} {kwargs}: exited with {proc.returncode}:\n{tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- measuring


def compare_records(target: str, mujou_rec: Path, plain_rec: Path) -> None:
    """Assert that mujou's recording is bit-identical to the plain loop's.

    Raises:
        AssertionError: they differ (realwork.py's check: it names the field
            and the first index that differs).
    """
    import realwork

    got = torch.load(mujou_rec, weights_only=True)
    want = torch.load(plain_rec, weights_only=True)
    realwork.check_identical(target, "mujou", got, want)


def side_figures(runs: list[dict]) -> dict:
    """A side's figures over the repetitions: count, wall and CPU summaries, extras."""
    out: dict[str, Any] = {"count": runs[0]["count"],
                           "wall": summary([r["wall"] for r in runs]),
                           "cpu": summary([r["cpu"] for r in runs])}
    for key in runs[0].get("extra", {}):
        out[key] = summary([r["extra"][key] for r in runs])
    return out


def paired_ratio(mj: list[dict], ref: list[dict], key: str, rate: bool) -> dict | None:
    """The ratio of each repetition's two samples of ``key``, summarised.

    mujou / reference, or reference / mujou when ``rate`` (costs turned into
    mujou's rate as a fraction of the reference's). None if a sample is zero.
    """
    pairs = list(zip(mj, ref, strict=True))
    if any(a[key] <= 0 or b[key] <= 0 for a, b in pairs):
        return None
    return summary([b[key] / a[key] if rate else a[key] / b[key] for a, b in pairs])


def baseline_ratio(mj: dict, base: dict | None, key: str) -> dict | None:
    """mujou's median / the baseline's (as a one-sample summary); None without a baseline."""
    if base is None or base[key]["median"] <= 0:
        return None
    return summary([mj[key]["median"] / base[key]["median"]])


def judge(t: Target, figure: dict, ratio: dict | None) -> tuple[float | None, bool | None]:
    """The value ``t``'s goal looks at (mujou's ``figure`` or the ``ratio``), and whether
    it meets the goal (None when there is nothing to judge: no baseline)."""
    value = figure["median"] if t.goal == "absolute" else (
        None if ratio is None else ratio["median"])
    if value is None:
        return None, None
    return value, value >= t.bound if t.goal == "rate" else value <= t.bound


def verdict(t: Target, mj: dict, ratio: dict[str, dict | None]) -> dict:
    """Whether ``t``'s goal is met: judged on the wall figures' medians, as the issue says.

    The same rule applied to the CPU figures is recorded beside it: where the
    two disagree, the machine's load decided the wall verdict.

    Returns:
        dict: ``text``, ``goal``, ``bound``, ``value`` (the wall figure judged),
        ``met`` (None when there is nothing to judge: no baseline),
        ``cpu_value`` and ``met_cpu`` (the same for CPU time).
    """
    value, met = judge(t, mj["wall"], ratio["wall"])
    cpu_value, met_cpu = judge(t, mj["cpu"], ratio["cpu"])
    return {"text": t.text, "goal": t.goal, "bound": t.bound, "value": value, "met": met,
            "cpu_value": cpu_value, "met_cpu": met_cpu}


def baseline_side(t: Target, size: dict, baseline: dict | None) -> tuple[dict | None, str]:
    """The baseline's mujou figures for ``t``, and a note on where they come from.

    Returns:
        tuple: the figures (None when the baseline has none for this target at
        these sizes) and a note for the table.
    """
    if baseline is None:
        return None, "no baseline: figures alone (--save-baseline stores one)"
    entry = baseline["doc"].get("targets", {}).get(t.name)
    where = f"baseline {baseline['source']} ({baseline['doc'].get('date', '?')}, " \
            f"build {baseline['doc'].get('build', '?')})"
    if entry is None or "wall" not in entry.get("sides", {}).get("mujou", {}):
        return None, f"{where} has no figures for {t.name}"
    if entry.get("size") != size:
        return None, f"{where} ran other sizes ({entry.get('size')}): not compared"
    return entry["sides"]["mujou"], where


def measure(t: Target, quick: bool, repeat: int, baseline: dict | None, tmp: Path) -> dict:
    """Measure target ``t``: every repetition runs each side once in a fresh process.

    Args:
        t (Target): the target.
        quick (bool): the ``--quick`` sizes.
        repeat (int): repetitions.
        baseline (dict | None): the stored baseline (``doc``, ``source``), if any.
        tmp (Path): a folder for the recordings.

    Returns:
        dict: the target's entry of the JSON file (see the module).

    Raises:
        AssertionError: the sides did different amounts of work, or a recording
            differs from the plain loop's.
    """
    size = t.quick if quick else t.full
    sides = {"mujou": t.mujou, **({"reference": t.reference} if t.reference else {})}
    samples: dict[str, list[dict]] = {side: [] for side in sides}
    compared = 0
    for rep in range(repeat):
        order = list(sides) if rep % 2 == 0 else list(sides)[::-1]
        records: dict[str, Path] = {}
        for side in order:
            path = tmp / f"{t.name}-{side}-{rep}.pt" if t.records else None
            samples[side].append(run_child(sides[side], size, t.warm, path))
            if path is not None:
                records[side] = path
        if t.records:
            compare_records(t.name, records["mujou"], records["reference"])
            compared += 1
    counts = {side: {r["count"] for r in runs} for side, runs in samples.items()}
    if len(set().union(*counts.values())) != 1:
        raise AssertionError(f"{t.name}: the sides did different amounts of work: {counts}")
    figures = {side: side_figures(runs) for side, runs in samples.items()}
    entry: dict[str, Any] = {"title": t.title, "unit": t.unit, "cpu_unit": t.cpu_unit,
                             "against": t.against, "size": size,
                             "builds": sorted({r["build"] for rs in samples.values()
                                               for r in rs})}
    if t.reference is not None:
        rate = t.goal == "rate"
        ratio = {key: paired_ratio(samples["mujou"], samples["reference"], key, rate)
                 for key in ("wall", "cpu")}
        note = None
    else:
        base, note = baseline_side(t, size, baseline)
        if base is not None:
            figures["reference"] = {"wall": base["wall"], "cpu": base["cpu"]}
        ratio = {key: baseline_ratio(figures["mujou"], base, key) for key in ("wall", "cpu")}
    entry.update(sides=figures, ratio=ratio, target=verdict(t, figures["mujou"], ratio))
    if t.records:
        entry["identical"] = {"compared": compared, "passed": True}
        note = f"bit-identical to the plain loop: {compared} recordings compared"
    if note:
        entry["note"] = note
    return entry


def absent(t: Target, quick: bool, why: str) -> dict:
    """The entry of a target that cannot run here, with the reason."""
    return {"title": t.title, "unit": t.unit, "cpu_unit": t.cpu_unit, "against": t.against,
            "size": t.quick if quick else t.full, "absent": why}


def missing(t: Target) -> str | None:
    """Why ``t`` cannot run here (an optional module not installed), or None."""
    for module in t.needs:
        try:
            __import__(module)
        except ImportError:
            return f"missing: {module} is not installed (pip install -e '.[examples]')"
    return None


def load_baseline(path: Path | None, previous: Path) -> dict | None:
    """The stored baseline: ``path``, else `DEFAULT_BASELINE`, else the previous run's JSON.

    Returns:
        dict | None: ``doc`` (the stored JSON) and ``source`` (its file, and
        whether it is the previous run's); None when there is none.
    """
    for candidate, source in ((path, "file"), (DEFAULT_BASELINE, "file"),
                              (previous, "previous run")):
        if candidate is not None and candidate.is_file():
            try:
                doc = json.loads(candidate.read_text())
            except ValueError:
                continue
            if doc.get("benchmark") == "targets":
                return {"doc": doc, "source": f"{source} {candidate}", "path": str(candidate)}
    return None


# --------------------------------------------------------------------------- output


def fmt(x: float | None) -> str:
    """A figure with three significant digits or so (``—`` for none)."""
    if x is None:
        return "—"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def cell(s: dict | None) -> str:
    """``median (min)`` of a summary."""
    return "—" if s is None else f"{fmt(s['median'])} ({fmt(s['min'])})"


def ratio_cell(goal: str, r: dict | None) -> str:
    """A ratio's median: ``0.52`` (a fraction of the floor's rate) or ``1.30x`` (a cost)."""
    if r is None:
        return "—"
    return f"{r['median']:.2f}" if goal == "rate" else f"{r['median']:.2f}x"


def met_cell(verdict: dict) -> str:
    """``yes`` or ``NO`` (the wall verdict), ``(CPU: ...)`` beside it where CPU time disagrees."""
    met, met_cpu = verdict["met"], verdict.get("met_cpu")
    if met is None:
        return "—"
    text = "[green]yes[/green]" if met else "[red]NO[/red]"
    return text if met_cpu in (None, met) else f"{text} (CPU: {'yes' if met_cpu else 'no'})"


def print_table(doc: dict, title: str) -> None:
    """One rich table, a row per target: mujou, the reference, ratios, the goal, met."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # a pipe or a file: no 80-column wrapping
        console = Console(width=220)
    table = Table(title=title, title_justify="left", caption_justify="left", caption=(
        "median (min) over repetitions, each in a fresh process; every figure a cost, lower "
        "is better. ratio: median of per-repetition mujou/reference (ticks: mujou's rate / "
        "the floor's); against a baseline: mujou's median / its median. Targets judged on "
        "wall time; (CPU: ...) where CPU time says otherwise (the machine's load decided)."))
    heads = ("target", "against", "unit", "mujou wall", "reference wall", "ratio",
             "mujou CPU", "reference CPU", "CPU ratio", "issue's target", "met")
    for i, head in enumerate(heads):
        table.add_column(head, justify="left" if i < 3 or i >= 9 else "right")
    goals = {t.name: t.goal for t in TARGETS}
    for name, e in doc["targets"].items():
        if "absent" in e:
            table.add_row(e["title"], e["against"], e["unit"], "absent: " + e["absent"],
                          *[""] * 7)
            continue
        mj, ref = e["sides"]["mujou"], e["sides"].get("reference")
        table.add_row(
            e["title"], e["against"], e["unit"], cell(mj["wall"]),
            cell(ref["wall"] if ref else None), ratio_cell(goals[name], e["ratio"]["wall"]),
            cell(mj["cpu"]), cell(ref["cpu"] if ref else None),
            ratio_cell(goals[name], e["ratio"]["cpu"]), e["target"]["text"],
            met_cell(e["target"]))
    console.print(table)
    for name, e in doc["targets"].items():
        if "note" in e:
            console.print(f"  {name}: {e['note']}")


def versions() -> dict[str, str | None]:
    """Versions of what the targets run on (None: not installed): realwork.py's list."""
    import realwork

    return realwork.versions()


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, int, list[str]]:
    """The command line: the arguments, the repetitions and the targets to measure."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 2 reps: a CI smoke run")
    ap.add_argument("--repeat", type=int, default=None, help="default 5; quick 2")
    ap.add_argument("--only", type=lambda v: [w.strip() for w in v.split(",") if w.strip()],
                    default=None, metavar="NAME[,NAME...]",
                    help="measure only these targets: " + ", ".join(NAMES))
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON,
                    help=f"where to write every sample (default {DEFAULT_JSON})")
    ap.add_argument("--baseline", type=Path, default=None,
                    help=f"the stored run that pingpong, fanout and timer must not be worse "
                         f"than (default {DEFAULT_BASELINE.name} if there is one, else the "
                         f"previous run at --json)")
    ap.add_argument("--save-baseline", action="store_true",
                    help="also write this run's JSON as the baseline (--baseline or "
                         f"{DEFAULT_BASELINE.name})")
    ap.add_argument("--child", nargs=2, metavar=("NAME", "SPEC"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return args, 0, []
    if args.baseline is not None and not args.baseline.is_file():
        ap.error(f"--baseline: no file {args.baseline}")
    repeat, only = repeat_and_only(ap, args, NAMES)
    return args, repeat, list(only)


def main(argv: list[str] | None = None) -> int:
    """Measure the targets named, print the table, write the JSON (and the baseline)."""
    args, repeat, only = parse_args(argv)
    if args.child:
        child_main(*args.child)
        return 0
    baseline = load_baseline(args.baseline, args.json)
    t_start = time.perf_counter()
    targets: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="mujou-targets-") as tmp:
        for t in TARGETS:
            if t.name not in only:
                continue
            why = missing(t)
            targets[t.name] = (absent(t, args.quick, why) if why else
                               measure(t, args.quick, repeat, baseline, Path(tmp)))
            print(f"[targets] {t.name} done, {time.perf_counter() - t_start:.0f} s",
                  file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - t_start
    builds = sorted({b for e in targets.values() for b in e.get("builds", ())})
    if len(builds) > 1:
        raise RuntimeError(f"the build changed during the run: {builds}")
    doc = {"benchmark": "targets", "issue": 29, "quick": args.quick, "repeat": repeat,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           **build(), **({"build": builds[0]} if builds else {}),  # as the children ran it
           "machine": machine(), "python": platform.python_version(),
           "platform": platform.platform(), "versions": versions(),
           "tolerance": TOLERANCE, "elapsed_s": elapsed,
           "baseline": None if baseline is None else {
               "path": baseline["path"], "source": baseline["source"],
               "date": baseline["doc"].get("date"), "build": baseline["doc"].get("build")},
           "targets": targets}
    print_table(doc, f"issue 29's targets: mujou_actors {mujou.__version__}, build "
                     f"{doc['build']}, {repeat} reps{' (quick)' if args.quick else ''}, "
                     f"{elapsed:.0f} s; {machine()}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.json}")
    if args.save_baseline:
        path = args.baseline or DEFAULT_BASELINE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote the baseline {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
