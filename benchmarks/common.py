"""Pieces the benchmark scripts share: the no-op node, the heap-loop floor, summaries.

The scripts put their own folder on ``sys.path`` (as ``python benchmarks/X.py``
does), so they import this module as ``common``.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch

import mujou_actors as mujou


class NoOp(mujou.Node):
    """A periodic node whose update does nothing: what dispatch costs alone."""

    def on_update(self, dt: float) -> None:
        pass


class Plain:
    """A plain object with the very same no-op method (the floor's node)."""

    on_update = NoOp.on_update


def heap_floor(periods: list[int], end_ns: int,
               on_ready: Callable[[], None] | None = None) -> dict:
    """The floor: pop due times from a heap and call the same no-op method.

    Args:
        periods: one period per node, integer nanoseconds.
        end_ns: the last due time to run, nanoseconds.
        on_ready: called once the objects and the heap are built, before the
            timed loop (to read the build time and memory).

    Returns:
        dict: ``updates`` (calls made) and ``rate`` (calls per wall second).
    """
    objs = [Plain() for _ in periods]
    last = [0] * len(periods)
    heap = [(p, i) for i, p in enumerate(periods)]
    heapq.heapify(heap)
    replace = heapq.heapreplace
    updates = 0
    if on_ready is not None:
        on_ready()
    gc.collect()
    t0 = time.perf_counter()
    while heap[0][0] <= end_ns:
        due, i = heap[0]
        dt = (due - last[i]) / 1e9
        last[i] = due
        objs[i].on_update(dt)
        updates += 1
        replace(heap, (due + periods[i], i))
    t1 = time.perf_counter()
    return {"updates": updates, "rate": updates / (t1 - t0)}


def summary(values: list[float]) -> dict:
    """Median, min, max and the samples of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "samples": values}


def pct(values: list[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (nearest rank).

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("pct: no values")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))]


def machine() -> str:
    """The machine in words: its architecture, CPUs and Python."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def repeat_and_only(ap: argparse.ArgumentParser, args: argparse.Namespace,
                    workloads: tuple[str, ...]) -> tuple[int, list[str] | tuple[str, ...]]:
    """The repetitions and workloads that ``--repeat``, ``--quick`` and ``--only`` ask for.

    Default 5 repetitions, 2 with ``--quick``. Calls ``ap.error`` (exit status
    2) for fewer than one repetition, an unknown workload or an empty ``--only``.
    """
    repeat = args.repeat if args.repeat is not None else (2 if args.quick else 5)
    if repeat < 1:
        ap.error("--repeat must be >= 1")
    only = workloads if args.only is None else args.only
    unknown = [name for name in only if name not in workloads]
    if unknown or not only:
        what = f"no workload {', '.join(unknown)}" if unknown else "name at least one workload"
        ap.error(f"--only: {what}; choose from {', '.join(workloads)}")
    return repeat, only


def show_table(title: str, first: str, results: dict[str, dict[str, float]],
               columns: tuple[tuple[str, str, str], ...]) -> None:
    """Print a table of figures: rich if installed, plain text otherwise.

    Args:
        title: the table's title.
        first: the heading of the first column, which names each row.
        results: row name -> figures by key.
        columns: ``(key, heading, format)`` per column; a missing figure shows as a dash.
    """
    heads = [first] + [h for _, h, _ in columns]
    rows = [[name] + [fmt.format(r[k]) if k in r else "—" for k, _, fmt in columns]
            for name, r in results.items()]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        print("  ".join(f"{h:>16s}" for h in heads))
        for row in rows:
            print("  ".join(f"{cell:>16s}" for cell in row))
        return
    table = Table(title=title)
    for h in heads:
        table.add_column(h, justify="left" if h == first else "right")
    for row in rows:
        table.add_row(*row)
    Console().print(table)


class TimedSender(mujou.Node):
    """A sender that times its sends: ``n`` per update, each update's CPU ns per send in ``ns``.

    The sender of benchmarks/recording.py and view.py: ``case`` ``"float"`` sends
    floats on an ``Output(float)``, ``"tensor"`` a 1 KiB tensor on an
    ``Output(torch.Tensor)``; a subclass decides when an update sends
    (`timed_sends`).
    """

    def __init__(self, case: str, n: int, ticks: int) -> None:
        super().__init__(period=0.001)
        self.case, self.n, self.ticks = case, n, ticks
        self.out = mujou.Output(float) if case == "float" else mujou.Output(torch.Tensor)
        self.t = torch.rand(256)
        self.ns: list[float] = []

    def timed_sends(self) -> Callable[[], None]:
        """Make this update's ``n`` sends, timed (thread CPU ns); returns the send loop."""
        sends = send_loop(self.out, self.case, self.n, self.t)
        t0 = time.thread_time_ns()
        sends()
        self.ns.append((time.thread_time_ns() - t0) / self.n)
        return sends


class PeriodicReader(mujou.Node):
    """The one reader of a `TimedSender`: periodic, so that no send triggers it."""

    def __init__(self, case: str) -> None:
        super().__init__(period=0.001)
        self.inp = mujou.Input(float) if case == "float" else mujou.Input(torch.Tensor)

    def on_update(self, dt: float) -> None:
        self.inp.read()


def send_loop(out: mujou.Output, case: str, n: int, tensor: object) -> Callable[[], None]:
    """``n`` sends on ``out`` in one call: floats (``case == "float"``) or ``tensor``.

    The loop a sender node times in its update (benchmarks/recording.py, view.py): a
    function made once per update, so that the timed part is the sends alone.
    """
    if case == "float":
        def sends() -> None:
            for k in range(n):
                out.send(k * 0.5)
    else:
        def sends() -> None:
            for _ in range(n):
                out.send(tensor)
    return sends
