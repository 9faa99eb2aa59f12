"""Placed runs (groups of nodes in processes of their own), measured against the alternatives.

What is measured
----------------
Every figure comes from a real placed run, ``mujou.run(factory, placement=...)``:
group processes started by the Thespian control plane, port messages on the
ZeroMQ data plane through the host's driver. The nets are in
``benchmarks/_placed_nets.py``. Start-up (spawning the processes, about a
second each) is never timed.

* **hop** (real time): ``ping`` in group ``a`` sends a message to ``pong`` in
  group ``b``, which echoes it; ``ping`` times each round trip with
  ``time.perf_counter_ns`` in its hook (``--rtt`` round trips) and sends the
  next. A hop is half a round trip: the message crosses from the sender's
  group to the reader's on their peer link (``hop``), or through the host's
  driver, which relays it (``hop ..., host relay``: ``MUJOU_PEER_LINKS=0``).
  Messages: a Python ``int`` (``int``) and a 1 MiB float32 tensor (``1MB``, through shared memory).
  Rows, same nets and measurement: ``in one process`` (no placement),
  ``placed`` (two group processes), and for scale the same ping-pong on
  ``multiprocessing`` queues between two processes (pickled) and between two
  Thespian actors of a private ``multiprocTCPBase`` system (``tell``;
  benchmarks/transport.py's measurement), and the floor the targets of issue
  30 are set against: the same ping-pong of the same number of bytes on
  iceoryx2's shared memory, woken by its events (``benchmarks/shm_floor.py``;
  the row is left out, with a note, where the ``bench`` extra's ``iceoryx2``
  is not installed).
* **stream** (real time): ``burst`` in group ``a`` sends ``--per-tick``
  floats every millisecond to ``sink`` in group ``b``; figure = messages per
  second from the first to the last arrival (target >= 100,000 a group pair).
* **steps** (simulated): two periodic nodes at 1 kHz in two groups message
  each other at every tick for ``--sim-seconds``; figure = global steps (delta
  cycles with work: one per tick, the messages trigger nothing) per wall
  second, the driver's rounds (or segments) per second, and the same net in
  one process (target >= 5,000 global steps/s with 2 groups). Rows: on the
  host's rounds (``steps, host rounds``: ``MUJOU_PEER_LINKS=0``) and on peer
  links (``steps``: the default, distributed/segments.py); the same for four groups
  in a ring, each messaging the next at every tick.
* **cpu** (simulated): two CPU-bound Python nodes (``Spin``: integer
  arithmetic in a loop, no GIL release) at the same period, in two groups
  against one process (``workers=2``: one GIL); figure = speed-up of the wall
  time (target >= 1.7x on 2 cores).

Every figure is the median of ``--repeat`` repetitions; p99 is the median of
the repetitions' p99. Results: a table, and JSON in
``benchmarks/results/processes.json`` unless ``--json`` says otherwise.
Wall-clock figures on a shared 2-core machine vary by 10-40 %.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _placed_nets as nets  # noqa: E402
import shm_floor  # noqa: E402
import torch  # noqa: E402
from common import pct, peer_processes  # noqa: E402

import mujou_actors as mujou  # noqa: E402

TIMEOUT_S = 120.0
WORKLOADS = ("hop", "stream", "steps", "cpu")
# Issue 30's targets (issue 16 had set 50 and 150 µs for the hops).
TARGETS = {"hop int": ("hop p50 µs", 25.0, "<="), "hop 1MB": ("hop p50 µs", 100.0, "<="),
           "stream": ("msg/s", 100_000.0, ">="), "steps": ("steps/s", 5_000.0, ">="),
           "cpu": ("speed-up", 1.7, ">=")}


# --------------------------------------------------------------------------- hop

@contextlib.contextmanager
def peer_links(on: bool) -> Iterator[None]:
    """``MUJOU_PEER_LINKS`` set to ``1`` (or ``0``) for the runs started inside."""
    before = os.environ.get("MUJOU_PEER_LINKS")
    os.environ["MUJOU_PEER_LINKS"] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["MUJOU_PEER_LINKS"]
        else:
            os.environ["MUJOU_PEER_LINKS"] = before


def wait_done(run: mujou.Run, port: str) -> None:
    """Wait for ``port``'s first message, also one sent before the wait began.

    ``wait_for`` takes only messages sent after it is called; a workload that
    ends before the host gets there (a loaded machine slows the host, not the
    groups' timers) is seen by ``read`` instead.

    Raises:
        TimeoutError: no message within `TIMEOUT_S`.
    """
    deadline = time.monotonic() + TIMEOUT_S
    while run.read(port) is None:
        try:
            run.wait_for(port, timeout=0.5)
            return
        except TimeoutError:
            if time.monotonic() > deadline:
                raise


def hop_mujou(kind: str, n: int, placed: bool, relay: bool = False) -> dict[str, float]:
    """Round trips of ``ping`` <-> ``pong`` in real time, placed in two groups or not;
    placed, on peer links (the default) or relayed by the host (``relay``)."""
    kwargs: dict[str, Any] = {"timer": "realtime", "seed": 0}
    if placed:
        with peer_links(not relay):
            # kick (one message at the start) placed too: a node left in the host's group
            # keeps the host's relay, and the row would not measure peer links.
            placement = mujou.Placement({"kick": "a", "ping": "a", "pong": "b"},
                                        net_kwargs={"n": n, "kind": kind})
            run = mujou.run(nets.make_pingpong, placement=placement, **kwargs)
    else:
        run = mujou.run(nets.make_pingpong(n, kind), **kwargs)
    try:
        wait_done(run, "ping.done")
        rtts = run.state_dict(timeout=30)["nodes"]["ping"]["rtts"]
    finally:
        run.stop()
    run.join(TIMEOUT_S)
    us = [r / 1e3 for r in rtts[min(50, len(rtts) // 10):]]  # the first ones warm up
    return {"rtt_p50": pct(us, 50), "rtt_p99": pct(us, 99), "hop_p50": pct(us, 50) / 2}


def _queue_echo(inbox: Any, outbox: Any) -> None:
    """The child of the multiprocessing ping-pong: echo until None."""
    while True:
        m = inbox.get(timeout=TIMEOUT_S)
        if m is None:
            return
        outbox.put(m)


def hop_queues(kind: str, n: int) -> dict[str, float]:
    """The same ping-pong on two ``multiprocessing`` queues between two processes."""
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_queue_echo, args=(inbox, outbox), daemon=True)
    child.start()
    message = nets.payload(kind)
    us = []
    try:
        for i in range(n + 50):
            t0 = time.perf_counter_ns()
            inbox.put(message)
            outbox.get(timeout=TIMEOUT_S)
            if i >= 50:
                us.append((time.perf_counter_ns() - t0) / 1e3)
        inbox.put(None)
        child.join(10)
    finally:
        if child.is_alive():
            child.kill()
            child.join(5)
    return {"rtt_p50": pct(us, 50), "rtt_p99": pct(us, 99), "hop_p50": pct(us, 50) / 2}


def hop_floor(kind: str, n: int) -> dict[str, float] | None:
    """The shared-memory floor of a hop (`shm_floor.hop`) with the payload's byte size.

    An ``int`` is 8 bytes there, the 1 MiB tensor 1 MiB; None without iceoryx2.
    """
    if not shm_floor.available():
        print("hop floor: not measured (iceoryx2 is not installed: the bench extra)",
              file=sys.stderr)
        return None
    size = 8 if kind == "int" else nets.payload(kind).numel() * 4
    return shm_floor.hop(size, n)


def hop_thespian(n: int) -> dict[str, float] | None:
    """Thespian's own actor-to-actor ``tell`` round trip: benchmarks/transport.py's figure.

    Run as a process of its own (its actors' module must be its main module,
    and its admin starts faster without this script's imports); None when it fails.
    It and its Thespian processes bind 127.0.0.1 only and end with this process, or
    with it if it is killed at the timeout (`common.peer_processes`).
    """
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as folder, peer_processes():
        out = Path(folder) / "t.json"
        cmd = [sys.executable, str(Path(__file__).with_name("transport.py")), "--only",
               "thespian", "--rtt", str(n), "--thespian-small", "200", "--repeat", "1",
               "--json", str(out)]
        try:  # killed at the timeout: its Thespian processes end with it (common.py)
            subprocess.run(cmd, check=True, capture_output=True, timeout=TIMEOUT_S)
            got = json.loads(out.read_text())["results"]["thespian"]
        except (subprocess.SubprocessError, OSError, KeyError, ValueError) as exc:
            print(f"thespian: not measured ({type(exc).__name__})", file=sys.stderr)
            return None
    p50 = got["rtt_p50"]["median"] if isinstance(got["rtt_p50"], dict) else got["rtt_p50"]
    p99 = got["rtt_p99"]["median"] if isinstance(got["rtt_p99"], dict) else got["rtt_p99"]
    return {"rtt_p50": p50, "rtt_p99": p99, "hop_p50": p50 / 2}


# --------------------------------------------------------------------------- stream, steps, cpu

def stream(per_tick: int, ticks: int) -> dict[str, float]:
    """Small messages from group ``a`` to group ``b`` as fast as they go (real time)."""
    placement = mujou.Placement({"burst": "a", "sink": "b"},
                                net_kwargs={"per_tick": per_tick, "ticks": ticks})
    run = mujou.run(nets.make_stream, placement=placement, timer="realtime")
    try:
        wait_done(run, "sink.done")
        state = run.state_dict(timeout=30)["nodes"]["sink"]
    finally:
        run.stop()
    run.join(TIMEOUT_S)
    span = (state["last"] - state["first"]) / 1e9
    return {"rate": state["count"] / span if span > 0 else 0.0}


def steps(seconds: float, placed: bool, on_peers: bool = False,
          groups: int = 2) -> dict[str, float]:
    """Global delta cycles per wall second of 1 kHz peers messaging each other at every
    tick (two: both ways; more: a ring), each in a group of its own or all in one
    process; placed on the host's rounds or on peer links (``MUJOU_PEER_LINKS``)."""
    factory = nets.make_exchange if groups == 2 else nets.make_ring
    kwargs = {} if groups == 2 else {"groups": groups}
    if placed:
        with peer_links(on_peers):
            placement = mujou.Placement({p: p for p in factory(**kwargs)}, net_kwargs=kwargs)
            run = mujou.run(factory, placement=placement, timer="simulated", duration=seconds,
                            seed=0)
    else:
        run = mujou.run(factory(**kwargs), timer="simulated", duration=seconds, seed=0)
    wall = _wall(run)
    ticks = round(seconds * 1000)
    out = {"steps_s": ticks / wall, "wall": wall}
    driver = getattr(run, "_driver", None)
    if driver is not None:
        out["rounds_s"] = driver.timing.rounds / wall
    return out


def _wall(run: Any) -> float:
    """Wall seconds of a run from its timer's start to its end, without the shut-down.

    A placed run's driver times its rounds (processes ending are not timed);
    a run in one process is timed from `mujou.run`'s return to `join`'s.
    """
    t0 = time.perf_counter()
    run.join(TIMEOUT_S)
    driver = getattr(run, "_driver", None)
    if driver is not None:
        return driver.rounds_ended - driver.rounds_started  # type: ignore[no-any-return]
    return time.perf_counter() - t0


def cpu(work: int, seconds: float) -> dict[str, float]:
    """Two CPU-bound nodes in two groups against one process: the wall-time speed-up."""
    walls = {}
    for placed in (False, True):
        if placed:
            run = mujou.run(nets.make_spin,
                            placement=mujou.Placement({"a": "a", "b": "b"},
                                                      net_kwargs={"work": work}),
                            timer="simulated", duration=seconds)
        else:
            run = mujou.run(nets.make_spin(work), timer="simulated", duration=seconds,
                            workers=2)
        walls[placed] = _wall(run)
    return {"one": walls[False], "placed": walls[True], "speedup": walls[False] / walls[True]}


# --------------------------------------------------------------------------- main

def _median(samples: list[dict[str, float]]) -> dict[str, float]:
    keys = samples[0].keys()
    return {k: statistics.median(s[k] for s in samples) for k in keys}


def measure(cfg: argparse.Namespace, only: list[str]) -> dict[str, dict[str, float]]:
    """Every row of the table: the medians over ``cfg.repeat`` repetitions."""
    rows: dict[str, list[dict[str, float]]] = {}

    def add(name: str, value: dict[str, float] | None) -> None:
        if value is not None:
            rows.setdefault(name, []).append(value)

    for _ in range(cfg.repeat):
        if "hop" in only:
            # First: Thespian's stock transport, before the placed runs' loopback-only one.
            add("hop int thespian tell", hop_thespian(cfg.rtt))
            for kind in ("int", "1MB"):
                n = cfg.rtt if kind == "int" else cfg.rtt_big
                add(f"hop {kind}", hop_mujou(kind, n, placed=True))
                add(f"hop {kind}, host relay", hop_mujou(kind, n, placed=True, relay=True))
                add(f"hop {kind} in one process", hop_mujou(kind, n, placed=False))
                add(f"hop {kind} multiprocessing queues", hop_queues(kind, n))
                add(f"hop {kind} iceoryx2 shared memory (floor)", hop_floor(kind, n))
        if "stream" in only:
            add("stream", stream(cfg.per_tick, cfg.ticks))
        if "steps" in only:
            add("steps, host rounds", steps(cfg.sim_seconds, placed=True))
            add("steps", steps(cfg.sim_seconds, placed=True, on_peers=True))
            add("steps in one process", steps(cfg.sim_seconds, placed=False))
            add("steps, 4 groups, host rounds", steps(cfg.sim_seconds, True, groups=4))
            add("steps, 4 groups", steps(cfg.sim_seconds, True, on_peers=True, groups=4))
            add("steps, 4 groups in one process", steps(cfg.sim_seconds, False, groups=4))
        if "cpu" in only:
            add("cpu", cpu(cfg.work, cfg.cpu_seconds))
    return {name: _median(samples) for name, samples in rows.items()}


COLUMNS = (("hop_p50", "hop p50 µs", "{:,.0f}"), ("rtt_p50", "RTT p50 µs", "{:,.0f}"),
           ("rtt_p99", "RTT p99 µs", "{:,.0f}"), ("rate", "msg/s", "{:,.0f}"),
           ("steps_s", "steps/s", "{:,.0f}"), ("rounds_s", "rounds/s", "{:,.0f}"),
           ("speedup", "speed-up", "{:.2f}x"))


def show(results: dict[str, dict[str, float]]) -> None:
    """Print the table with each target and whether it was met."""
    head = ["case"] + [c[1] for c in COLUMNS] + ["target"]
    lines = [head]
    for name, row in results.items():
        cells = [name] + [fmt.format(row[key]) if key in row else "" for key, _, fmt in COLUMNS]
        target = TARGETS.get(name)
        if target is None:
            cells.append("")
        else:
            column, value, how = target
            key = next(k for k, label, _ in COLUMNS if label == column)
            got = row.get(key, float("nan"))
            met = got <= value if how == "<=" else got >= value
            cells.append(f"{how} {value:,g} {'met' if met else 'MISSED'}")
        lines.append(cells)
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    for r in lines:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


def main(argv: list[str] | None = None) -> int:
    """Run the measurements; print the table; write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rtt", type=int, default=2000, help="round trips of an int")
    ap.add_argument("--rtt-big", type=int, default=300, help="round trips of a 1 MiB tensor")
    ap.add_argument("--per-tick", type=int, default=2000, help="stream: messages per 1 ms tick")
    ap.add_argument("--ticks", type=int, default=100, help="stream: ticks")
    ap.add_argument("--sim-seconds", type=float, default=2.0, help="steps: simulated seconds")
    ap.add_argument("--work", type=int, default=100_000, help="cpu: iterations per update")
    ap.add_argument("--cpu-seconds", type=float, default=2.0, help="cpu: simulated seconds")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions (3; --quick: 1)")
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--quick", action="store_true", help="small counts, one repetition")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/processes.json")
    cfg = ap.parse_args(argv)
    only = [w.strip() for w in cfg.only.split(",") if w.strip()]
    unknown = sorted(set(only) - set(WORKLOADS))
    if unknown or not only:
        ap.error(f"--only: unknown workloads {unknown}; choose from {', '.join(WORKLOADS)}")
    if cfg.quick:
        cfg.rtt, cfg.rtt_big, cfg.per_tick, cfg.ticks = 200, 30, 500, 20
        cfg.sim_seconds, cfg.work, cfg.cpu_seconds = 0.2, 20_000, 0.1
    cfg.repeat = cfg.repeat if cfg.repeat is not None else (1 if cfg.quick else 3)
    if cfg.repeat < 1:
        ap.error("--repeat must be >= 1")
    torch.set_num_threads(1)
    results = measure(cfg, only)
    print(f"placed runs, {os.cpu_count()} CPUs, median of {cfg.repeat}")
    show(results)
    cfg.json.parent.mkdir(parents=True, exist_ok=True)
    cfg.json.write_text(json.dumps({"config": {k: (str(v) if isinstance(v, Path) else v)
                                               for k, v in vars(cfg).items()},
                                    "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
