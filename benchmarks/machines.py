"""Placed runs across machines (convention members), against the same net on one machine.

What is measured
----------------
Every figure comes from real placed runs, ``mujou.run(make_machines,
placement=mujou.Placement(..., listen=...), timer="realtime")``: groups started by the leader
(this process) on member actor systems, port messages on the data plane between
machines (TCP with the run's secret: CURVE, every message encrypted and
authenticated), from group to group on their peer link where peer links apply
(every node of these nets is placed), else through the host's driver (each
run's JSON sample says which: ``peer_links``, and ``relayed``, the messages the
host's driver passed from one group to another). Three ``mujou worker`` processes,
each a member on a loopback port of this host, stand in for machines:
``robot`` and ``gpu-box`` (group ``g1`` on ``robot``, with ``spare`` as its
fallback: ``robot,spare:g1``; group ``g2`` on ``gpu-box``). Each worker is in
a session of its own, and every process it starts carries a marker in its
environment, so that a machine's death is every one of them stopped and killed
at once. The other rows are the same net with both groups on ``robot``
(``robot:g1``, ``robot:g2``: their link is the member's own, ``ipc://`` and
shared memory in a private folder there, or TCP+CURVE in a tree before it;
no recovery is measured there), and placed on one machine (``g1`` and ``g2``
in processes of their own, no members: ``ipc://`` and shared memory); the
ratio column is machines over one machine. The net is
``benchmarks/_placed_nets.py:make_machines``; the start of a run (processes
spawned, a few seconds each on a loaded 2-core machine) is never timed. Each
run does the workloads in turn (``steps`` in a placed run of its own),
``--repeat`` runs per placement (5; ``--quick``: 1), the placements
interleaved:

* **hop**: ``ping`` in ``g1`` sends a message to ``pong`` in ``g2``, which
  echoes it; ``ping`` times each round trip with ``time.perf_counter_ns`` in its
  own hooks (one clock, on ``robot``) and sends the next once the echo is in.
  A hop is half a round trip: the message crosses from its sender's group to
  its reader's on their peer link (TCP+CURVE across machines, ``ipc://`` on
  one), or, where the host relays, to the host's driver and on, over two links.
  Messages: a Python ``int`` (``--rtt`` round trips) and a 1 MiB float32
  tensor (``--rtt-big``), after 50 (5)
  unmeasured ones; p50 and p99 of every measured round trip of every run,
  halved, in µs.
* **stream**: ``source`` in ``g1`` sends numbered messages as fast as the run
  takes them (``--per-tick`` ints, or 4 tensors, every 1 ms tick), ``checker``
  in ``g2`` checks that message ``i`` is the ``i``-th to arrive (the int itself;
  each tensor is filled with its number), so a message lost, repeated or out of
  order fails the benchmark. Figures: ints a second (``--ints`` of them) and
  MB/s (10^6 bytes) of 1 MiB tensors (``--tensors``): the count over the time
  from the source's first send to the checker's last arrival (both read
  ``time.monotonic_ns``: every member is on this host, one clock); median of
  the runs.
* **steps** (simulated): ``a`` in ``g1`` and ``b`` in ``g2``, two periodic
  nodes at 1 kHz that message each other at every tick
  (``_placed_nets.make_exchange``, benchmarks/processes.py's), for
  ``--sim-seconds``; figure = global steps (delta cycles with work, one per
  tick) per wall second of the driver's rounds (or segments), median of the
  runs. A run of its own, after the others.
* **recover**: group ``g1`` also holds ``beacon``, which sends its tick count
  every 5 ms; the host subscribes to it. The run has a
  ``Supervisor("one_for_all")`` (its one snapshot: the start's). Every process
  of ``robot`` is stopped and killed at once (SIGSTOP of each until none is
  new, then SIGKILL: no Thespian admin is left to tell of the group's end, only
  the heartbeat finds it). Phases, on the host's ``time.monotonic_ns``, marked
  by wrapping the driver's own calls (`Timeline`): **detection**, the kill to
  the driver acting on the loss (the heartbeat's silence of
  ``heartbeat_timeout``, 1 s, then its decision, ``detect_hb``, and the
  driver's wake); **restart**, from there until every group is restored: the
  machine chosen (``choose``: the members listed), the new process on ``spare``
  started, connected and its net checked (``spawn``), every group restored
  from the snapshot (``restore``); **first message**, from there to the first
  beacon reaching the host; and the **total**. On one machine the group's
  process is SIGKILLed (its exit is reported by the control plane) and starts
  again in a new process. p50 (median) and max over the runs. ``spare`` lives
  across the runs, and the first group placed on a member makes its admin import
  the package (about 1.5 s, once; see docs/machines.md), so the first trial's
  spawn is the longest (``spare_warm`` 0 in the samples).

The run's secret: ``MUJOU_SECRET`` or ``MUJOU_SECRET_FILE`` as set; if neither
is, a fixed benchmark secret (said so in the output: fine on loopback, never
elsewhere). The script imports ``mujou_actors`` from ``sys.path``: set
``PYTHONPATH`` to the tree to measure; the workers get the same tree, and this
folder (the net's module imports by the same name on every machine). Results:
two tables, and JSON in ``benchmarks/results/machines.json`` unless ``--json``
says otherwise. Every wait has a bound; every worker is ended (then killed) and
every run stopped, whatever happens.

Usage::

    python benchmarks/machines.py [--quick] [--repeat 5] [--only hop,stream,steps,recover]
        [--sim-seconds 2.0] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import queue
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _placed_nets as nets  # noqa: E402
import torch  # noqa: E402
import zmq  # noqa: E402
from common import machine, pct, repeat_and_only, show_table  # noqa: E402

import mujou_actors as mujou  # noqa: E402
from mujou_actors.distributed import secret  # noqa: E402
from mujou_actors.distributed.system import free_port  # noqa: E402

ROOT = HERE.parent
TREE = Path(mujou.__file__).resolve().parent.parent  # the tree measured
WORKLOADS = ("hop", "stream", "steps", "recover")
BOUND_S = 120.0  # the bound on any single wait; a healthy run never comes close
BENCH_SECRET = "benchmarks/machines.py: a fixed secret of this benchmark, for loopback only"
MARKER = "MUJOU_BENCH_MACHINE"  # in the environment of every process of a worker
WARM = {"int": 50, "1MiB": 5}  # round trips not measured (the first ones warm up)
PER_TICK_TENSORS = 4  # 1 MiB tensors a 1 ms tick offers: more than any link here takes
BEACON_PERIOD_S = 0.005
MB = 1e6


# --------------------------------------------------------------------------- machines


class Worker:
    """A ``mujou worker`` subprocess: a member of the convention at ``leader``, a "machine".

    It runs in a session of its own; every process it starts (its Thespian
    admin and logger, which leave its session, and the groups placed on it)
    inherits ``MUJOU_BENCH_MACHINE`` with a value of this worker's own, so that
    `pids` finds them all. Its stderr and its temporary files go in ``folder``.

    Args:
        name (str): the member's name, as placements name it.
        leader (str): ``"127.0.0.1:PORT"`` of the leader.
        folder (str): where its log and temporary files go.

    Started, it may not listen yet: `wait_ready` waits until it does.
    """

    def __init__(self, name: str, leader: str, folder: str) -> None:
        self.name = name
        self.marker = f"{name}-{uuid.uuid4().hex}"
        # The tree measured, and this folder: the net factory's module imports by the same
        # name on every machine (docs/machines.md). Its temporary files go in ``folder``:
        # a machine that vanishes leaves its own behind, and they go with the folder.
        path = [str(TREE), str(HERE), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, MARKER: self.marker, "TMPDIR": folder,
               "PYTHONPATH": os.pathsep.join(filter(None, path))}
        self.log = Path(folder) / f"{self.marker}.log"
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mujou_actors", "worker", "--join", leader, "--name",
                 name], env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                start_new_session=True)

    def wait_ready(self) -> None:
        """Wait until the worker says where it listens (its member is up).

        Raises:
            RuntimeError: it did not within `BOUND_S`, or it ended (its log says why).
        """
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], BOUND_S)
        line = self.proc.stdout.readline() if ready else ""
        if "listening on" not in line:
            raise RuntimeError(f"worker {self.name} did not start: {line!r} "
                               f"{self.log.read_text()[-2000:]}")

    def pids(self) -> set[int]:
        """Every live process of this machine, the worker included (by their environment)."""
        entry = f"{MARKER}={self.marker}".encode()
        found = set()
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/environ", "rb") as f:
                        if entry in f.read().split(b"\0"):
                            found.add(int(name))
                except OSError:
                    continue
        return found

    def vanish(self) -> int:
        """The machine is gone: every process of it stopped (SIGSTOP, until no new one is
        found, so that none acts on another's end), then SIGKILLed; waited for (bounded).

        Returns:
            int: ``time.monotonic_ns()`` just before the first signal (the machine's death).
        """
        died = time.monotonic_ns()
        stopped: set[int] = set()
        while fresh := self.pids() - stopped:
            _signal_all(fresh, signal.SIGSTOP)
            stopped |= fresh
        _signal_all(stopped | {self.proc.pid}, signal.SIGKILL)
        self.proc.wait(10)
        deadline = time.monotonic() + 10
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.02)  # (the others are reaped by their parents)
        return died

    def stop(self) -> None:
        """End the worker as Ctrl-C does (SIGTERM), within 20 s; else its machine vanishes."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        self.vanish()  # whatever is left of it (nothing, after a clean end)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _signal_all(pids: set[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids`` (those already gone skipped)."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class Machines:
    """The workers of a benchmark, members of one leader's convention (``leader``, the
    address every run of the benchmark listens on): started on demand, every one
    ended by `close`, whatever happened.

    Args:
        folder (str): where their logs and temporary files go.
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.leader = f"127.0.0.1:{free_port()}"
        self.workers: dict[str, Worker] = {}

    def start(self, *names: str) -> None:
        """Start a worker for each name that has none alive, all at once; wait until they
        listen (a worker that does not is killed, with its machine: see `Worker.wait_ready`)."""
        fresh = []
        for name in names:
            w = self.workers.get(name)
            if w is None or w.proc.poll() is not None:
                if w is not None:
                    w.stop()  # (reaped already: its machine vanished)
                fresh.append(w := Worker(name, self.leader, self.folder))
                self.workers[name] = w
        for w in fresh:
            w.wait_ready()

    def close(self) -> None:
        """End every worker (bounded; killed if it lingers), each whatever the others did.

        Raises:
            Exception: the first failure to end one, once every one was tried.
        """
        failures = []
        for w in self.workers.values():
            try:
                w.stop()
            except Exception as exc:  # the others are ended all the same
                failures.append(exc)
        if failures:
            raise failures[0]


def use_secret() -> str:
    """Set ``MUJOU_SECRET`` to the benchmark's fixed secret where no secret is set; say which."""
    if os.environ.get(secret.ENV_SECRET) or os.environ.get(secret.ENV_SECRET_FILE):
        return "the run's secret from the environment"
    os.environ[secret.ENV_SECRET] = BENCH_SECRET
    return (f"no secret was set: {secret.ENV_SECRET} is the benchmark's fixed one "
            f"(loopback only)")


# --------------------------------------------------------------------------- one run


def start(groups: dict[str, str], factory: Callable[..., Any], leader: str | None, *,
          net_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """A real-time placed run of ``factory``; across machines when ``leader`` is given.

    A start across machines that fails is tried once more, and said so: the
    first group placed on a member makes its admin import the package, and on a
    loaded machine that admin may answer the leader's checks too late, which
    fails the start ("stopped answering while the group started"). The start
    is never timed.
    """
    machines = {} if leader is None else {"listen": leader, "join_timeout": 60}
    placement = mujou.Placement(groups, net_kwargs=net_kwargs, **machines)

    def run() -> Any:
        return mujou.run(factory, placement=placement, timer="realtime", seed=0,
                         start_timeout=BOUND_S, **kwargs)

    try:
        return run()
    except Exception as exc:
        if leader is None:
            raise
        print(f"the run's start failed ({type(exc).__name__}: {str(exc)[:300]}); trying "
              f"once more", file=sys.stderr, flush=True)
    return run()


PLACED = {  # where each group goes: across machines, on one member, and on one machine
    "machines": {"ping": "robot,spare:g1", "source": "robot,spare:g1",
                 "beacon": "robot,spare:g1", "pong": "gpu-box:g2", "checker": "gpu-box:g2"},
    "one member": {"ping": "robot:g1", "source": "robot:g1", "beacon": "robot:g1",
                   "pong": "robot:g2", "checker": "robot:g2"},
    "one machine": {"ping": "g1", "source": "g1", "beacon": "g1", "pong": "g2",
                    "checker": "g2"},
}
PLACEMENTS = (("machines", "2 machines (TCP+CURVE)"),
              ("one member", "1 member (its own link)"),
              ("one machine", "1 machine (ipc+shm)"))
STEPS = {"machines": {"a": "robot:g1", "b": "gpu-box:g2"},  # make_exchange, placed so
         "one member": {"a": "robot:g1", "b": "robot:g2"},
         "one machine": {"a": "g1", "b": "g2"}}


def command(run: Any, go: str, value: Any, done: str) -> tuple[Any, int]:
    """Write ``value`` to the Input ``go``; wait for the next message of the Output ``done``.

    Returns:
        tuple: the message, and the ns from the write to its arrival on the host.

    Raises:
        TimeoutError: no message within `BOUND_S`.
    """
    answers: queue.Queue[tuple[int, Any]] = queue.Queue()
    sub = run.subscribe(done, lambda m: answers.put((time.monotonic_ns(), m)))
    try:
        t0 = time.monotonic_ns()
        run.write(go, value)
        t1, message = answers.get(timeout=BOUND_S)
        return message, t1 - t0
    except queue.Empty:
        raise TimeoutError(f"{done}: no answer within {BOUND_S} s to {go} <- {value!r}") from None
    finally:
        sub.cancel()


class Timeline:
    """When the driver of a run acted on a failure, restarted a group and restored them.

    It wraps, on that one driver's recovery (`distributed.recovery.Recovery`),
    the calls that mark each phase (the benchmark's instrument, not the
    package's API): ``recover`` (it acts on the failure: ``acted``),
    ``choose_member`` (the machine chosen: ``chosen``), ``relaunch`` (the
    group's new process started, connected and its net checked: ``spawned``),
    ``restart_all`` (every group restored: ``restored``), and the driver's
    heartbeat monitor's ``take_changes`` (the
    loss decided: ``lost``, the Monitor's own time). Each is
    ``time.monotonic_ns()`` of the first such call, or of its return.

    Args:
        run: the placed run (`mujou.run`'s).
    """

    def __init__(self, run: Any) -> None:
        self.at: dict[str, int] = {}
        driver = run._driver
        recovery = driver.recovery
        self._wrap(recovery, "recover", "acted", after=False)
        self._wrap(recovery, "relaunch", "spawned", after=True)
        self._wrap(recovery, "restart_all", "restored", after=True)
        if recovery.choose_member is not None:
            self._wrap(recovery, "choose_member", "chosen", after=True)
        monitor = driver.monitor
        if monitor is not None:
            take = monitor.take_changes

            def take_changes() -> Any:
                changes = take()
                for c in changes:
                    if c.lost:
                        self.at.setdefault("lost", c.at_ns)
                return changes

            monitor.take_changes = take_changes

    def _wrap(self, obj: Any, name: str, mark: str, *, after: bool) -> None:
        """Time ``obj.name``'s first call (``after``: its return) as ``mark``."""
        inner = getattr(obj, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not after:
                self.at.setdefault(mark, time.monotonic_ns())
            result = inner(*args, **kwargs)
            if after:
                self.at.setdefault(mark, time.monotonic_ns())
            return result

        setattr(obj, name, timed)


def one_run(cfg: argparse.Namespace, where: str, machines: Machines,
            only: list[str]) -> dict[str, Any]:
    """One run of the net placed ``where``: round trips, streams, then a death and recovery.

    Returns:
        dict: ``rtt_<kind>`` (µs, each measured round trip), ``stream_<kind>``
        (its ``count`` and the ``seconds`` from the first send to the last
        arrival), ``recover`` (phase -> ms), as `only` asks.

    Raises:
        AssertionError: a stream lost, repeated or reordered a message, or the
            group restarted elsewhere than on the fallback.
        TimeoutError: a step did not end within `BOUND_S`.
    """
    leader = None
    if where == "one member":  # the link between two groups of a member: no recovery
        only = [w for w in only if w != "recover"]
        machines.start("robot")
        leader = machines.leader
    if where == "machines":
        warm = "spare" in machines.workers
        machines.start("robot", "gpu-box", *(["spare"] if "recover" in only else []))
        leader = machines.leader
    out: dict[str, Any] = {}
    if "steps" in only:
        out["steps"] = steps(cfg.sim_seconds, where, leader)
    if not {"hop", "stream", "recover"} & set(only):
        return out
    run = start(PLACED[where], nets.make_machines, leader,
                net_kwargs={"ints": cfg.ints, "tensors": cfg.tensors,
                            "beacon": BEACON_PERIOD_S},
                supervisor=mujou.Supervisor("one_for_all"))  # one snapshot: the start's
    out.update(paths(run))
    try:
        if "hop" in only:
            for kind, n in (("int", cfg.rtt), ("1MiB", cfg.rtt_big)):
                command(run, "ping.go", (kind, n + WARM[kind]), "ping.done")
            rtts = run.state_dict(timeout=BOUND_S)["nodes"]["ping"]["rtts"]
            for kind in ("int", "1MiB"):
                out[f"rtt_{kind}"] = [r / 1e3 for r in rtts[kind][WARM[kind]:]]
        if "stream" in only:
            for kind, n, per_tick in (("int", cfg.ints, cfg.per_tick),
                                      ("1MiB", cfg.tensors, PER_TICK_TENSORS)):
                command(run, "source.go", (kind, n, per_tick), "checker.done")
            nodes = run.state_dict(timeout=BOUND_S)["nodes"]
            for kind, n in (("int", cfg.ints), ("1MiB", cfg.tensors)):
                s = nodes["checker"]["streams"][kind]
                assert s["count"] == n and s["wrong"] is None, (where, kind, s)
                out[f"stream_{kind}"] = {
                    "count": n, "seconds": (s["last"] - nodes["source"]["started"][kind]) / 1e9}
        out["relayed"] = getattr(run._driver, "relayed", None)  # before the death's restore
        if "recover" in only:
            out["recover"] = recover(run, machines if where == "machines" else None)
            if where == "machines":
                out["recover"]["spare_warm"] = float(warm)
    finally:
        run.stop()
        run.join(BOUND_S)
    return out


def paths(run: Any) -> dict[str, Any]:
    """Whether the run's groups send to each other on peer links (``peer_links``), how
    many TCP links with an end off the host's machine it made (``links``), and how many
    ``ipc://`` links between two groups of one member (``local``; None where the tree
    measured has no such links): the benchmark's instrument, read from the driver."""
    timing = run._driver.timing
    cross = getattr(timing, "cross", None)
    return {"peer_links": bool(getattr(timing, "live", False)),
            "links": None if cross is None else cross.links,
            "local": getattr(cross, "local", None)}


def steps(seconds: float, where: str, leader: str | None) -> dict[str, Any]:
    """Global simulated steps a wall second of ``make_exchange`` placed ``where`` (see the
    top): ticks over the driver's own time from its first round to its last."""
    machines = {} if leader is None else {"listen": leader, "join_timeout": 60}

    def run() -> Any:
        return mujou.run(nets.make_exchange, placement=mujou.Placement(STEPS[where], **machines),
                         timer="simulated", duration=seconds, seed=0, start_timeout=BOUND_S)

    try:
        placed = run()
    except Exception as exc:  # a loaded machine's member may answer the start too late
        if leader is None:
            raise
        print(f"the run's start failed ({type(exc).__name__}: {str(exc)[:300]}); trying "
              f"once more", file=sys.stderr, flush=True)
        placed = run()
    placed.join(BOUND_S)
    nodes = placed.state_dict()["nodes"]
    ticks = round(seconds * 1000)
    assert nodes["a"]["n"] == nodes["b"]["n"] == ticks, nodes  # every step ran, both ways
    driver = placed._driver
    wall = driver.rounds_ended - driver.rounds_started
    timing = driver.timing
    return {"steps_s": ticks / wall, "wall": wall, "rounds": timing.rounds,
            "segments": getattr(timing, "segments", 0),
            "relayed": getattr(driver, "relayed", None), **paths(placed)}


def recover(run: Any, machines: Machines | None) -> dict[str, float]:
    """The death of ``g1``'s machine (``machines`` None: of its process) and its recovery.

    Returns:
        dict: phase -> ms (see the top; ``detect_hb`` and ``choose`` across machines).
    """
    arrivals: list[int] = []
    run.subscribe("beacon.out", lambda _: arrivals.append(time.monotonic_ns()))
    timeline = Timeline(run)
    at = timeline.at
    deadline = time.monotonic() + BOUND_S
    while not arrivals:  # the beacon reaches the host: the group serves
        if time.monotonic() > deadline or not run.running:
            raise TimeoutError(f"no beacon in {BOUND_S} s ({run.failure})")
        time.sleep(0.01)
    if machines is not None:
        died = machines.workers["robot"].vanish()
    else:
        pid = run.stats().groups["g1"].pid
        died = time.monotonic_ns()
        os.kill(pid, signal.SIGKILL)
    while "restored" not in at or not arrivals or arrivals[-1] < at["restored"]:
        if time.monotonic() > deadline or not run.running:
            raise TimeoutError(f"the group did not serve again in {BOUND_S} s "
                               f"({run.failure}; {at})")
        time.sleep(0.002)
    first = next(t for t in arrivals if t >= at["restored"])
    if machines is not None:
        on = run.stats().groups["g1"].machine
        assert on == "spare", f"g1 restarted on {on!r}"
    ms = {k: (t - died) / 1e6 for k, t in at.items()}  # each mark, from the death
    out = {"detect": ms["acted"], "restart": ms["restored"] - ms["acted"],
           "spawn": ms["spawned"] - ms.get("chosen", ms["acted"]),
           "restore": ms["restored"] - ms["spawned"],
           "first": (first - died) / 1e6 - ms["restored"], "total": (first - died) / 1e6}
    if "lost" in ms:
        out["detect_hb"] = ms["lost"]
    if "chosen" in ms:
        out["choose"] = ms["chosen"] - ms["acted"]
    return out


# --------------------------------------------------------------------------- figures


HOP_ROWS = (("int_hop_p50", "int hop p50 µs"), ("int_hop_p99", "int hop p99 µs"),
            ("1MiB_hop_p50", "1 MiB hop p50 µs"), ("1MiB_hop_p99", "1 MiB hop p99 µs"),
            ("int_rate", "ints/s, one way"), ("1MiB_MBs", "1 MiB tensors, MB/s"),
            ("lost", "messages lost or out of order"),
            ("steps_s", "global steps/s (simulated)"))
RECOVER_ROWS = (("detect", "detection"), ("detect_hb", "  of it the heartbeat's decision"),
                ("restart", "restart"), ("choose", "  of it choosing the machine"),
                ("spawn", "  of it the new process"), ("restore", "  of it the restore"),
                ("first", "first message after"), ("total", "total"))


def rate(stream: dict[str, float]) -> float:
    """Messages a second of a stream: its count over the time from the source's first
    send to the checker's last arrival (one clock: every member is on this host)."""
    return stream["count"] / stream["seconds"]


def figures(samples: list[dict[str, Any]], cfg: argparse.Namespace) -> dict[str, float]:
    """One placement's figures over its runs (see the top)."""
    out: dict[str, float] = {}
    for kind in ("int", "1MiB"):
        rtts = [r for s in samples for r in s.get(f"rtt_{kind}", [])]
        if rtts:
            out[f"{kind}_hop_p50"] = pct(rtts, 50) / 2
            out[f"{kind}_hop_p99"] = pct(rtts, 99) / 2
    streams = [s for s in samples if "stream_int" in s]
    if streams:
        out["int_rate"] = statistics.median(rate(s["stream_int"]) for s in streams)
        out["1MiB_MBs"] = statistics.median(rate(s["stream_1MiB"]) * nets.MiB / MB
                                            for s in streams)
        out["lost"] = 0  # every stream was checked in full (else the run failed)
    stepped = [s["steps"]["steps_s"] for s in samples if "steps" in s]
    if stepped:
        out["steps_s"] = statistics.median(stepped)
    trials = [s["recover"] for s in samples if "recover" in s]
    if trials:
        out["trials"] = len(trials)
        for key, _ in RECOVER_ROWS:
            values = [t[key] for t in trials if key in t]
            if values:
                out[f"{key}_p50"] = statistics.median(values)
                out[f"{key}_max"] = max(values)
    return out


def hop_table(results: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The hop and stream figures as rows, a column per placement and their ratio."""
    rows: dict[str, dict[str, float]] = {}
    for key, label in HOP_ROWS:
        row = {w: results[w][key] for w, _ in PLACEMENTS if key in results[w]}
        if row.get("one machine") and "machines" in row:
            row["ratio"] = row["machines"] / row["one machine"]
        if row:
            rows[label] = row
    return rows


def recover_table(results: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The recovery's phases as rows, p50 and max per placement."""
    rows: dict[str, dict[str, float]] = {}
    for key, label in RECOVER_ROWS:
        row = {f"{w} {m}": results[w][f"{key}_{m}"] for w, _ in PLACEMENTS
               for m in ("p50", "max") if f"{key}_{m}" in results[w]}
        if row:
            rows[label] = row
    return rows


HOP_COLUMNS = (("machines", PLACEMENTS[0][1], "{:,.0f}"),
               ("one member", PLACEMENTS[1][1], "{:,.0f}"),
               ("one machine", PLACEMENTS[2][1], "{:,.0f}"), ("ratio", "ratio", "{:.2f}x"))
RECOVER_COLUMNS = (("machines p50", "machine lost: p50", "{:,.1f}"),
                   ("machines max", "max", "{:,.1f}"),
                   ("one machine p50", "process killed: p50", "{:,.1f}"),
                   ("one machine max", "max", "{:,.1f}"))


# --------------------------------------------------------------------------- main


FULL = {"rtt": 2000, "rtt_big": 200, "ints": 64_000, "tensors": 128, "repeat": 5,
        "sim_seconds": 2.0}
QUICK = {"rtt": 300, "rtt_big": 30, "ints": 6_400, "tensors": 16, "repeat": 1,
         "sim_seconds": 0.2}


def main(argv: list[str] | None = None) -> int:
    """Run the measurements; print the tables; write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rtt", type=int, default=None, help="round trips of the int (2000)")
    ap.add_argument("--rtt-big", type=int, default=None,
                    help="round trips of the 1 MiB tensor (200)")
    ap.add_argument("--ints", type=int, default=None, help="ints of the stream (64,000)")
    ap.add_argument("--per-tick", type=int, default=2000, help="ints sent per 1 ms tick")
    ap.add_argument("--tensors", type=int, default=None, help="1 MiB tensors of the stream (128)")
    ap.add_argument("--sim-seconds", type=float, default=None,
                    help="steps: simulated seconds (2.0; --quick: 0.2)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="runs per placement, each with one death (5; --quick: 1)")
    ap.add_argument("--only", type=lambda s: [w.strip() for w in s.split(",") if w.strip()],
                    default=None, help=f"workloads, from {', '.join(WORKLOADS)}")
    ap.add_argument("--quick", action="store_true",
                    help="300 + 30 round trips, 6,400 ints and 16 tensors, 0.2 simulated "
                         "seconds, 1 run each")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/machines.json")
    cfg = ap.parse_args(argv)
    for key, value in (QUICK if cfg.quick else FULL).items():  # what the command line left
        if getattr(cfg, key) is None:
            setattr(cfg, key, value)
    repeat, only = repeat_and_only(ap, cfg, WORKLOADS)
    torch.set_num_threads(1)
    said = use_secret()
    print(f"secret: {said}", flush=True)
    samples: dict[str, list[dict[str, Any]]] = {w: [] for w, _ in PLACEMENTS}
    with tempfile.TemporaryDirectory(prefix="mujou-machines-") as folder, \
            contextlib.closing(Machines(folder)) as machines:
        for rep in range(repeat):  # the placements interleaved, run by run
            for where, _ in PLACEMENTS:
                print(f"run {rep + 1}/{repeat}: {where}", flush=True)
                samples[where].append(one_run(cfg, where, machines, only))
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    results = {w: figures(samples[w], cfg) for w, _ in PLACEMENTS}
    if {"hop", "stream", "steps"} & set(only):
        show_table(f"A placed run across 2 machines (members on loopback) and on 1 machine, "
                   f"real time (steps: simulated), {when}, {machine()}, {repeat} runs each",
                   "figure",
                   hop_table(results), HOP_COLUMNS)
    if "recover" in only:
        show_table(f"From a death to the group serving again, ms ({repeat} trials each; "
                   f"heartbeat_timeout 1 s)", "phase", recover_table(results),
                   RECOVER_COLUMNS)
    print(f"secret: {said}")
    cfg.json.parent.mkdir(parents=True, exist_ok=True)
    cfg.json.write_text(json.dumps({
        "benchmark": "machines", "date": when, "machine": machine(), "secret": said,
        "mujou_actors": str(TREE), "versions": {"torch": torch.__version__,
                                                "pyzmq": zmq.pyzmq_version(),
                                                "libzmq": zmq.zmq_version()},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items()},
        "results": results, "samples": samples}, indent=1))
    print(f"wrote {cfg.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
