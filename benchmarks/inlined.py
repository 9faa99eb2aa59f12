"""The kernel's inlined rules, measured: each hand-inlined copy against a call to its rule.

What is measured
----------------
The kernel (``mujou_actors/_runtime/``) copies a few rules into the
functions that run them per message, per update or per delta cycle; each
copy carries a comment with the word "inlined", and ``tests/test_inlined.py``
pins each copy to its rule (`COPIES` here lists the same copies). For each
copy, this script builds the kernel twice in temporary copies of the
package: as it is (**with** the copy) and with that one copy replaced by a
call to its rule (**without**), then measures both on the workloads:

* **ticks10**: 10 no-op nodes, 10 ms period, simulated timer, one worker
  (the lone worker's loop); unit: one update.
* **rl**: ``benchmarks/opcount.py``'s RL step (env, policy, recorder; float32
  tensors), simulated, one worker; unit: one step (four updates, two sends).
* **rl2w**: the same with two workers (the worker pool's loop, batches
  under a budget).
* **rlpool**: the same with one worker and an idle node on a dedicated
  thread beside it, which puts the one worker on the pool's loop: the pool's
  rules with one thread to count (Callgrind counts no run of two workers:
  Valgrind runs one thread at a time, and how two workers interleave moves
  their counts by tens of per cent).
* **pingpong**: two triggered nodes bouncing an int, real time, one worker;
  unit: one round trip (two updates, two sends).

Three figures per build and workload:

* **bytecodes/unit**, pure Python (``MUJOU_PURE=1``): Python bytecode
  instructions the worker threads execute per unit (``opcount.py``'s
  counter: exact, and the same on a loaded machine).
* **Ir/unit**, compiled (mypyc): machine instructions per unit, counted by
  Callgrind (``valgrind --tool=callgrind``, every thread; the script turns
  the count on around each run with Callgrind's client requests, from a
  small C helper it compiles). Needs ``valgrind``, its ``callgrind.h`` and
  a C compiler; without them the column says so.
* **CPU/unit**, compiled: the process's CPU time per unit (all threads,
  ``getrusage``) across the run, each child the median of ``--inner`` runs;
  children of every build alternate (``--repeat`` rounds, each round in a
  rotated order), and each copy's figure is the median over the rounds of
  its child's time over the base child's of the same round.

Each count is marginal: a run of ``N`` units and one of ``2N`` in the same
child, the difference over ``N``, so starting and stopping cancel out. A
second build of the unchanged kernel (**A/A**) runs beside the others:
what it differs from the base by is the noise of each figure.

**Verdict**: *needed* when the call costs at least ``--threshold`` (1 %)
of a unit on some workload in bytecodes (pure) or in instructions or CPU
time (compiled), the CPU time also beyond the A/A's spread; *not needed*
otherwise. The per-copy table goes to docs/performance.md ("The kernel's
inlined rules").

Usage::

    python benchmarks/inlined.py [--only NAME,...] [--workloads ticks10,rl,...]
                                 [--pure-only] [--no-callgrind] [--repeat 5] [--inner 3]
                                 [--quick] [--trees DIR] [--json PATH]

``--trees DIR`` keeps the built copies there and reuses those whose
sources match (a compiled build takes about a minute each). ``--quick``:
pure bytecodes only, a tenth of the units, the copies named by ``--only``
(default: every copy): what ``tests/test_benchmarks.py`` runs.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_JSON = HERE / "results" / "inlined.json"
BUILD_TIMEOUT_S = 1200.0


@dataclass(frozen=True)
class Copy:
    """One inlined copy of a rule, and the call that replaces it in the *without* build."""

    name: str  # short name, for --only and the table
    file: str  # the copy's file, relative to mujou_actors/
    holder: str  # the function that holds the copy
    mark: str  # the text of its "inlined" comment (as tests/test_inlined.py lists it)
    rule: str  # "file:Qualified.name" of the rule
    inlines: str  # what the copy does, in words
    indent: int  # the indentation of ``old`` and ``new`` in the file
    old: str  # the copy, dedented (exactly once in the file, at that indentation)
    new: str  # the call to the rule, dedented ("" removes the copy: the code after it calls)


def _d(text: str) -> str:
    return textwrap.dedent(text).strip("\n") + "\n" if text.strip() else ""


COPIES: list[Copy] = [
    Copy("run_due", "_runtime/actor.py", "Actor.run_due",
         "run_update's common case with now == due, inlined",
         "_runtime/actor.py:Actor.run_update",
         "run_update for a simulated update (now == due, no lateness sample)", 8, _d("""
        if self.rt is not None or self.trace is not None:
            return self.run_update(t_ns, t_ns, is_tick, end_ns)
        # run_update's common case with now == due, inlined: once per update.
        if is_tick:
            self.next_tick_ns = t_ns + self.period_ns  # type: ignore[operator]
        gap = t_ns - self.last_update_ns  # type: ignore[operator]
        self.last_update_ns = t_ns
        self.updates += 1  # counted when called: an update that raises counts too
        flight = self.flight  # not the `hook` property: a call per write (see __init__)
        flight[0] = "on_update"
        if not self.timed:
            try:
                self.context.run(self.update, self.node, gap / 1e9)
            finally:
                flight[0] = None
            return 0
        if gap > self.dt_max_ns:
            self.dt_max_ns = self.period_ns if gap == self.period_ns else gap
        t0 = _clock()
        try:
            self.context.run(self.update, self.node, gap / 1e9)
        except BaseException:  # timed and re-raised: the dispatcher reports it
            took = self.last_hook_ns = _clock() - t0
            self.hook_ns += took
            flight[0] = None
            raise
        took = _clock() - t0
        self.hook_ns += took
        flight[0] = None
        return took
        """), _d("""
        return self.run_update(t_ns, t_ns, is_tick, end_ns)
        """)),
    Copy("run_update", "_runtime/actor.py", "Actor.run_update",
         "What call() does, inlined for the common case", "_runtime/actor.py:Actor.call",
         "call('on_update') without CUDA or trace (real time's update)", 8, _d("""
        if self.rt is not None or self.trace is not None:
            try:
                self.call("on_update", dt)
            finally:
                self.wait_stream()  # also after a failure: a restart must not race the GPU
            took, self.last_hook_ns = self.last_hook_ns, 0  # taken once, by the caller
            return took
        # What call() does, inlined for the common case (no CUDA, no trace):
        # this runs once per update. The hook's time is returned rather than
        # stored: an int kept per node is one more cache miss per update
        # with 100,000 nodes.
        flight = self.flight  # not the `hook` property: a call per write (see __init__)
        flight[0] = "on_update"
        if not self.timed:
            try:
                self.context.run(self.update, self.node, dt)
            finally:
                flight[0] = None
            return 0
        t0 = _clock()
        ok = False
        try:
            self.context.run(self.update, self.node, dt)
            ok = True
        finally:
            took = _clock() - t0
            self.hook_ns += took
            flight[0] = None
            if not ok:
                self.last_hook_ns = took
        return took
        """), _d("""
        try:
            self.call("on_update", dt)
        finally:
            self.wait_stream()  # also after a failure: a restart must not race the GPU
        took, self.last_hook_ns = self.last_hook_ns, 0  # taken once, by the caller
        return took
        """)),
    Copy("top", "_runtime/calendar.py", "Calendar.top", "# Calendar.live, inlined",
         "_runtime/calendar.py:Calendar.live",
         "the liveness test of a queued entry, per delta cycle", 12, _d("""
            while bucket:
                actor = bucket[-1]
                if actor.queued_key is key and not actor.busy:  # Calendar.live, inlined
                    return actor
                bucket.pop()
                self.queued -= 1
            if self._standing:
                for cohort in self._standing.get(code, ()):
                    for actor in cohort.actors:
                        if actor.queued_key is key and not actor.busy:
                            return actor
        """), _d("""
            while bucket:
                actor = bucket[-1]
                if Calendar.live(actor, key):
                    return actor
                bucket.pop()
                self.queued -= 1
            if self._standing:
                for cohort in self._standing.get(code, ()):
                    for actor in cohort.actors:
                        if Calendar.live(actor, key):
                            return actor
        """)),
    Copy("claim_simulated", "_runtime/dispatcher.py", "_claim_simulated",
         "# Calendar.live, inlined", "_runtime/calendar.py:Calendar.live",
         "the liveness test, per claimed actor (simulated)", 12, _d("""
        if actor.queued_key is not key or actor.busy:  # Calendar.live, inlined
            continue
        actor.queued_key = None
        actor.busy = True
        trig = actor.trigger_key
        """), _d("""
        if not Calendar.live(actor, key):
            continue
        actor.queued_key = None
        actor.busy = True
        trig = actor.trigger_key
        """)),
    Copy("may_start", "_runtime/dispatcher.py", "Dispatcher._may_start",
         "RealTime.start's common case, inlined", "_runtime/policy.py:RealTime.start",
         "RealTime.start for work already due and no end: per hop (real time)", 8, _d("""
        if key[0] <= now and self._end_ns is None:
            return True, None  # RealTime.start's common case, inlined: one call fewer per hop
        """), ""),
    Copy("advance", "_runtime/dispatcher.py", "Dispatcher._advance",
         "SimulatedTime.advance's NEXT_DELTA, inlined", "_runtime/policy.py:SimulatedTime.advance",
         "SimulatedTime.advance's next delta cycle: per delta cycle (worker pool)", 8, _d("""
        if key is not None and key[0] == self._frontier[0] and self._bound is None:
            if key[1] > self._max_delta:
                return self._loop_found(key)
            self._frontier = key  # SimulatedTime.advance's NEXT_DELTA, inlined: per delta cycle
            return True
        """), ""),
    Copy("lone_instant", "_runtime/dispatcher.py", "Dispatcher._lone_loop",
         "(_advance's NEXT_INSTANT, inlined", "_runtime/dispatcher.py:Dispatcher._advance",
         "_advance's next instant (nothing asked of the boundary): per instant (lone worker)",
         20, _d("""
        elif self._plain_instant(key[0]):
            # The next instant, nothing asked of its boundary
            # (_advance's NEXT_INSTANT, inlined: once per instant).
            self._frontier = key
            self.timer.advance_to(key[0])  # type: ignore[attr-defined]
        """), ""),
    Copy("finish_lone", "_runtime/dispatcher.py", "Dispatcher._finish_lone",
         "_lower_trigger, inlined: per send", "_runtime/dispatcher.py:Dispatcher._lower_trigger",
         "lowering a reader's trigger (simulated): per deferred trigger (lone worker)", 16, _d("""
        for reader in deferred:
            current = reader.trigger_key  # _lower_trigger, inlined: per send
            if current is None or nkey < current:
                reader.trigger_key = nkey
                if not reader.busy:
                    nxt.append(reader)
        """), _d("""
        for reader in deferred:
            if self._lower_trigger(reader, nkey) and not reader.busy:
                nxt.append(reader)
        """)),
    Copy("run_members", "_runtime/dispatcher.py", "Dispatcher._run_members",
         "`_run_claimed` for simulated time, inlined",
         "_runtime/dispatcher.py:Dispatcher._run_claimed",
         "_run_claimed in simulated time: per member of a batch", 8, _d("""
        owes, end = self._owed, self._end_ns
        todo, done = rec.todo, rec.done
        take, add = todo.popleft, done.append
        busy = 0
        while todo:
            try:
                actor, now, _, is_tick, _ = take()
            except IndexError:  # given back meanwhile
                break
            try:
                busy += actor.run_due(now, is_tick, end, owes)
            except BaseException as exc:  # noqa: BLE001 - reported, never swallowed
                busy += self._failed_update(actor, exc)
            add(actor)
        return busy
        """), _d("""
        todo, done = rec.todo, rec.done
        take, add = todo.popleft, done.append
        busy = 0
        while todo:
            try:
                item = take()
            except IndexError:  # given back meanwhile
                break
            busy += self._run_claimed(item)
            add(item[0])
        return busy
        """)),
]


def without(copy: Copy, source: str) -> str:
    """``source`` (the copy's file) with ``copy`` replaced by its call.

    Raises:
        ValueError: the copy is not in ``source`` exactly once, at its indentation.
    """
    pad = " " * copy.indent
    old = "\n" + textwrap.indent(copy.old, pad)
    if source.count(old) != 1:
        raise ValueError(f"{copy.name}: its text is {source.count(old)} times in {copy.file} "
                         "(once expected): update COPIES in benchmarks/inlined.py")
    return source.replace(old, "\n" + textwrap.indent(copy.new, pad), 1)


# -- workloads (run in a child, in the build under measurement) ------------------------------

class Window:
    """``opcount.Counter`` for a window of a run: bytecodes only while ``on``, waits left out.

    ``on`` follows the simulated time: it is set as the timer advances to an
    instant in ``[start_ns, stop_ns)`` (``SimulatedTimer.advance_to`` is
    Python on both builds), so the count holds whole instants of the run's
    steady state, not its start or its stop; or a hook sets it (the real-time
    ping-pong, ``start_ns`` None). A worker's waits for work
    (``Dispatcher._wait``, ``_worker_wait``) and the control hooks it runs
    (``_run_control``: ``on_start``, ``on_stop``) are not counted: they depend
    on the timing of the threads, not on the work.
    """

    SKIP = frozenset({"_wait", "_worker_wait", "_run_control"})

    def __init__(self, start_ns: int | None = None, stop_ns: int | None = None) -> None:
        self.start_ns, self.stop_ns = start_ns, stop_ns
        self.on = False
        self.ops: dict[tuple[str, str], int] = {}
        self._skip = threading.local()

    def tracer(self, frame: Any, event: str, arg: Any) -> Callable[..., Any] | None:
        """The global trace function of the worker threads."""
        if getattr(self._skip, "depth", 0):
            return None
        code = frame.f_code
        if code.co_name in self.SKIP and code.co_filename.endswith("dispatcher.py"):
            self._skip.depth = 1
            return self._skipped
        if code.co_name == "advance_to" and self.start_ns is not None:
            t = frame.f_locals["t_ns"]
            self.on = self.start_ns <= t < self.stop_ns  # type: ignore[operator]
        frame.f_trace_opcodes = True
        return self._local

    def _skipped(self, frame: Any, event: str, arg: Any) -> Callable[..., Any]:
        if event == "return":
            self._skip.depth = 0
        return self._skipped

    def _local(self, frame: Any, event: str, arg: Any) -> Callable[..., Any]:
        if event == "opcode" and self.on:
            where = (Path(frame.f_code.co_filename).name, frame.f_code.co_name)
            self.ops[where] = self.ops.get(where, 0) + 1
        return self._local


_ACTIVE: list[Any] = [None]  # the ping-pong's window, which its hook turns on and off


def _net_run(make: Callable[[], Any], duration_s: float, workers: int) -> float:
    """Run ``make()`` simulated for ``duration_s``; the process's CPU seconds across join."""
    from common import cpu_s

    import mujou_actors as mujou

    run = mujou.run(make(), timer="simulated", duration=duration_s, workers=workers)
    c0 = cpu_s()
    run.join(timeout=600)
    return cpu_s() - c0


def _ticks10(units: int) -> float:
    import opcount

    return _net_run(lambda: opcount.ticks_net(10), units / 1000, 1)  # 10 nodes x 100 Hz


def _rl(units: int) -> float:
    import opcount

    return _net_run(opcount.RL, units * 0.008, 1)


def _rl2w(units: int) -> float:
    import opcount

    return _net_run(opcount.RL, units * 0.008, 2)


def _rlpool(units: int) -> float:
    """The RL step on the worker pool's loop with one worker: an idle dedicated node beside it."""
    import opcount

    import mujou_actors as mujou

    def make() -> mujou.Node:
        net = opcount.RL()
        net.idle = mujou.Node(period=None, dedicated_thread=True)  # never updates
        return net

    return _net_run(make, units * 0.008, 1)


def _pingpong(units: int) -> float:
    """``units`` round trips between two triggered nodes, real time, one worker.

    Counted (a `Window` in ``_ACTIVE``): the round trips of the middle half.
    """
    from common import cpu_s

    import mujou_actors as mujou

    done = threading.Event()
    lo, hi = units // 4, units // 4 + units // 2

    class Ping(mujou.Node):
        back = mujou.Input(int, depth=None)
        out = mujou.Output(int)

        def on_start(self) -> None:
            self.out.send(0)

        def on_update(self, dt: float) -> None:
            for k in self.back.drain():
                window = _ACTIVE[0]
                if window is not None and (k == lo or k == hi):
                    window.on = k == lo
                if k >= units:
                    done.set()
                    return
                self.out.send(k + 1)

    class Pong(mujou.Node):
        inp = mujou.Input(int, depth=None)
        out = mujou.Output(int)

        def on_update(self, dt: float) -> None:
            for k in self.inp.drain():
                self.out.send(k)

    ping, pong = Ping(period=None), Pong(period=None)
    mujou.connect(ping.out, pong.inp)
    mujou.connect(pong.out, ping.back)
    with mujou.run([ping, pong], timer="realtime", workers=1,
                   max_delta_cycles=max(10_000, 2 * units + 10)):
        c0 = cpu_s()
        if not done.wait(600):  # pragma: no cover - a build that breaks the ring
            raise RuntimeError("the ping-pong did not end")
        took = cpu_s() - c0
    return took


@dataclass(frozen=True)
class Workload:
    """A workload: how to run it, its unit, and the units of each measure."""

    run: Callable[[int], float]  # runs ``units`` units; the process's CPU seconds
    unit: str
    counted: int  # units counted (bytecodes: a window of that many; Ir: N, and 2N)
    timed: int  # units per timed run
    period_ns: int | None  # simulated: the instants' spacing, a unit each ``per`` of them
    per: int = 1  # simulated: units per instant
    workers: int = 1  # worker threads (Callgrind counts only a run of one)


WORKLOADS: dict[str, Workload] = {
    "ticks10": Workload(_ticks10, "update", 2_000, 100_000, 10_000_000, 10),
    "rl": Workload(_rl, "step", 300, 5_000, 8_000_000),
    "rl2w": Workload(_rl2w, "step", 300, 5_000, 8_000_000, workers=2),
    "rlpool": Workload(_rlpool, "step", 300, 5_000, 8_000_000),
    "pingpong": Workload(_pingpong, "round trip", 300, 5_000, None),
}


def _child_setup(expect: str) -> None:
    """In a child: the benchmarks' modules importable; the build under measurement is ``expect``."""
    sys.path.insert(0, str(HERE))
    import mujou_actors
    from mujou_actors import _runtime

    tree = os.environ["MUJOU_INLINED_TREE"]
    if not Path(mujou_actors.__file__).resolve().is_relative_to(Path(tree).resolve()):
        raise RuntimeError(f"the child imported {mujou_actors.__file__}, not the copy in {tree}")
    if _runtime.BUILD.kind != expect:
        raise RuntimeError(f"the child runs {_runtime.BUILD}, not a {expect} build")


def count_window(name: str, units: int) -> tuple[float, dict[str, float]]:
    """Bytecodes per unit of ``units`` units in the steady state of workload ``name``.

    A simulated workload runs for twice its window's instants; the window
    starts a quarter in. Returns the figure and the bytecodes per unit by
    ``file:function``.
    """
    import opcount

    w = WORKLOADS[name]
    if w.period_ns is None:  # a hook turns the window on and off: the middle half
        window = Window()
        counted = units // 2
        run_units = units
    else:
        instants = max(1, units // w.per)
        counted = instants * w.per
        start = (instants // 2 + 1) * w.period_ns
        window = Window(start, start + instants * w.period_ns)
        run_units = 2 * counted + 2 * w.per
    _ACTIVE[0] = window
    undo = opcount.traced_workers(window)  # type: ignore[arg-type]
    try:
        w.run(run_units)
    finally:
        undo()
        _ACTIVE[0] = None
    per_fn = {f"{f}:{fn}": n / counted for (f, fn), n in window.ops.items()}
    return sum(window.ops.values()) / counted, per_fn


def child_opcount(names: list[str], scale: float) -> dict[str, Any]:
    """Bytecodes per unit of each workload (pure Python), and by function."""
    _child_setup("python")
    result: dict[str, Any] = {}
    for name in names:
        units = max(40, round(WORKLOADS[name].counted * scale))
        ops, per_fn = count_window(name, units)
        result[name] = {"ops": ops, "functions": per_fn}
    return result


_CALLGRIND_C = """
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_zero(void) { CALLGRIND_ZERO_STATS; }
void cg_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
"""


def callgrind_helper(into: Path) -> Path | str:
    """The C helper that turns Callgrind's count on and dumps it; or why there is none."""
    if shutil.which("valgrind") is None:
        return "no valgrind on the PATH"
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return "no C compiler (cc) for the Callgrind helper"
    source, lib = into / "cgmark.c", into / "libcgmark.so"
    source.write_text(_CALLGRIND_C)
    done = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(source)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"the Callgrind helper did not compile (valgrind/callgrind.h?): {done.stderr[-300:]}"
    return lib


class Marks:
    """Callgrind's count over a window: zeroed as it begins, dumped (with ``label``) as it ends.

    The simulated workloads' window is whole instants (``begin_ns`` to
    ``end_ns``): ``SimulatedTimer.advance_to`` is replaced by one that also
    marks the window's ends (the same Python function for every build, a
    comparison more per instant); the ping-pong's hook marks its own (as
    `Window.on`).
    """

    def __init__(self, lib: Any, label: str, begin_ns: int | None = None,
                 end_ns: int | None = None) -> None:
        self.lib, self.label = lib, label.encode()
        self.begin_ns, self.end_ns = begin_ns, end_ns

    @property
    def on(self) -> bool:
        return False

    @on.setter
    def on(self, value: bool) -> None:
        if value:
            self.lib.cg_zero()
        else:
            self.lib.cg_dump(self.label)


def _marking_advance(marks: list[Marks | None]) -> Callable[[Any, int], None]:
    """``SimulatedTimer.advance_to`` that marks the window of ``marks[0]``."""
    def advance_to(self: Any, t_ns: int) -> None:
        if t_ns > self._now:
            self._now = t_ns
            m = marks[0]
            if m is not None and (t_ns == m.begin_ns or t_ns == m.end_ns):
                m.on = t_ns == m.begin_ns
    return advance_to


def child_callgrind(names: list[str], scale: float, helper: str, windows: int) -> None:
    """Under Callgrind: each workload's window of N units, ``windows`` times, each count dumped.

    A shorter run first warms the workload up (its count is dumped too, and
    left out).
    """
    _child_setup("compiled")
    from mujou_actors import timers

    lib = ctypes.CDLL(helper)
    lib.cg_dump.argtypes = [ctypes.c_char_p]
    current: list[Marks | None] = [None]
    timers.SimulatedTimer.advance_to = _marking_advance(current)  # type: ignore[method-assign]
    lib.cg_start()
    for name in names:
        w = WORKLOADS[name]
        n = max(40, round(w.counted * scale))
        for i in range(windows + 1):
            units = n if i else max(8, n // 4)
            label = f"{name} {i} {units}"
            if w.period_ns is None:  # the hook marks the middle half of 2 units
                _ACTIVE[0] = Marks(lib, label)
                w.run(2 * units)
                _ACTIVE[0] = None
            else:
                instants = max(1, units // w.per)
                begin = (instants // 2 + 1) * w.period_ns
                current[0] = Marks(lib, f"{name} {i} {instants * w.per}", begin,
                                   begin + instants * w.period_ns)
                w.run(2 * instants * w.per + 2 * w.per)
                current[0] = None


def child_time(names: list[str], scale: float, inner: int) -> dict[str, float]:
    """CPU ns per unit of each workload, the median of ``inner`` runs (alternated)."""
    _child_setup("compiled")
    for name in names:
        WORKLOADS[name].run(max(20, round(WORKLOADS[name].timed * scale / 20)))
    figures: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(inner):
        for name in names:
            w = WORKLOADS[name]
            n = max(40, round(w.timed * scale))
            figures[name].append(w.run(n) / n * 1e9)
    return {name: statistics.median(xs) for name, xs in figures.items()}


# -- the parent: builds, children, the table --------------------------------------------------

def _tree_key(copy: Copy | None, compiled: bool, replica: int) -> str:
    """A folder name for a build: a hash of the copy (or base), the sources and the kind.

    Every name has the same length: the paths a child imports from end up in
    its memory layout, which moves its instruction counts by up to 1 %.
    """
    digest = hashlib.sha256()
    for path in sorted((ROOT / "mujou_actors").rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    for name in ("setup.py", "setup.cfg", "pyproject.toml"):
        digest.update((ROOT / name).read_bytes())
    label = "base" if copy is None else copy.name
    digest.update(f"{label} {replica} {'mypyc' if compiled else 'py'}".encode())
    return digest.hexdigest()[:16]


def prepare(copy: Copy | None, compiled: bool, trees: Path, replica: int = 0) -> Path:
    """A copy of the package with ``copy`` replaced by its call (None: as it is), built if asked.

    The copy holds the package (no extension module, no manifest of this
    tree's build), and for a compiled build ``setup.py``, ``setup.cfg`` and
    ``pyproject.toml``, built in place (``MUJOU_COMPILE=1 setup.py build_ext
    --inplace``). Reused when ``trees`` holds it already (the key includes
    the sources' hash).
    """
    tree = trees / _tree_key(copy, compiled, replica)
    if (tree / ".ready").exists():
        return tree
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    shutil.copytree(ROOT / "mujou_actors", tree / "mujou_actors",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "_compiled.json",
                                                  "__pycache__"))
    if copy is not None:
        path = tree / "mujou_actors" / copy.file
        path.write_text(without(copy, path.read_text()))
    if compiled:
        for name in ("setup.py", "setup.cfg", "pyproject.toml", "README.md"):
            if (ROOT / name).exists():
                shutil.copy2(ROOT / name, tree / name)
        env = {**os.environ, "MUJOU_COMPILE": "1"}
        done = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"],
                              cwd=tree, env=env, capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S, check=False)
        if done.returncode != 0 or "installing pure Python" in done.stderr \
                or not (tree / "mujou_actors" / "_runtime" / "_compiled.json").exists():
            raise RuntimeError(f"the build of {tree.name} failed:\n{done.stdout[-2000:]}\n"
                               f"{done.stderr[-3000:]}")
        shutil.rmtree(tree / "build", ignore_errors=True)
    (tree / ".ready").write_text(f"{copy.name if copy else 'base'} {replica} {compiled}\n")
    return tree


def _environ(tree: Path, compiled: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MUJOU_PURE"}
    if not compiled:
        env["MUJOU_PURE"] = "1"
    env["MUJOU_INLINED_TREE"] = str(tree)
    env["MUJOU_ATTACH"] = "0"  # no attach endpoint: its thread polls, on the wall clock
    env["PYTHONPATH"] = os.pathsep.join([str(tree)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _child(tree: Path, compiled: bool, args: list[str], prefix: list[str] | None = None,
           timeout: float = 3600, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([*(prefix or []), sys.executable, __file__, *args],
                          env={**_environ(tree, compiled), **(env or {})},
                          capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the child in {tree.name} ({' '.join(args)}) failed:\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def measure_opcount(tree: Path, names: list[str], scale: float) -> dict[str, Any]:
    """Bytecodes per unit of each workload on the pure build of ``tree``, and by function."""
    out = _child(tree, False, ["--child", "opcount", "--workloads", ",".join(names),
                               "--scale", str(scale)])
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result


_SUMMARY = re.compile(r"^summary:\s+(\d+)", re.M)
_TRIGGER = re.compile(r"^desc: Trigger: Client Request: (\S+) (\d+) (\d+)$", re.M)


def measure_callgrind(tree: Path, names: list[str], scale: float, helper: Path,
                      scratch: Path, windows: int) -> dict[str, dict[str, Any]]:
    """Ir per unit of each workload on the compiled build in ``tree``: the median window.

    One child under Callgrind (``PYTHONHASHSEED=0``: the same string hashes
    in every child); each window's count over its units. Only the thread that
    ends the window is counted (``--separate-threads=yes``, and the dump
    request writes the calling thread's): the worker, the one thread that runs
    the workload (the run's other threads wait on wall-clock timeouts, which
    Valgrind stretches unevenly).
    """
    out = scratch / f"cg-{tree.name}"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    _child(tree, True, ["--child", "callgrind", "--workloads", ",".join(names),
                        "--scale", str(scale), "--helper", str(helper),
                        "--windows", str(windows)],
           prefix=["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
                   f"--callgrind-out-file={out / 'cg.out'}"], timeout=7200,
           env={"PYTHONHASHSEED": "0"})
    per_unit: dict[str, list[float]] = {name: [] for name in names}
    for part in sorted(out.glob("cg.out.*")):
        text = part.read_text(errors="replace")
        trigger, total = _TRIGGER.search(text), _SUMMARY.search(text)
        if trigger and total and int(trigger[2]) > 0:  # window 0: the warm-up
            per_unit[trigger[1]].append(int(total[1]) / int(trigger[3]))
    shutil.rmtree(out, ignore_errors=True)
    return {name: {"ir": statistics.median(xs), "windows": xs} for name, xs in per_unit.items()}


def measure_time(tree: Path, names: list[str], scale: float, inner: int) -> dict[str, float]:
    out = _child(tree, True, ["--child", "time", "--workloads", ",".join(names),
                              "--scale", str(scale), "--inner", str(inner)])
    return json.loads(out.splitlines()[-1])


def _pct(new: float, old: float) -> float:
    return (new - old) / old * 100.0


def verdict(row: dict[str, Any], threshold: float, noise: dict[str, float]) -> str:
    """"needed" or "not needed" from a copy's figures (see the module's docstring)."""
    reasons = []
    for name, w in row["workloads"].items():
        if "ops" in w and w["ops"]["pct"] >= threshold:
            reasons.append(f"{name}: +{w['ops']['delta']:.0f} bytecodes ({w['ops']['pct']:.1f} %)")
        if "ir" in w and w["ir"]["pct"] >= threshold:
            reasons.append(f"{name}: +{w['ir']['pct']:.1f} % instructions")
        if "cpu" in w and w["cpu"]["pct"] >= max(threshold, noise.get(name, 0.0)):
            reasons.append(f"{name}: +{w['cpu']['pct']:.1f} % CPU")
    row["reasons"] = reasons
    return "needed" if reasons else "not needed"


def markdown(rows: list[dict[str, Any]], names: list[str]) -> str:
    """The rows as a Markdown table: per workload, what the call costs more than the copy,
    in % of a unit (bytecodes / instructions / CPU, those measured), and the verdict."""
    lines = ["| Copy | " + " | ".join(names) + " | Verdict |",
             "|---|" + "---|" * len(names) + "---|"]
    for row in rows:
        cells = []
        for n in names:
            w = row["workloads"][n]
            cells.append(" / ".join(f"{w[fig]['pct']:+.1f}" for fig in ("ops", "ir", "cpu")
                                    if fig in w))
        lines.append(f"| `{row['copy']}` | " + " | ".join(cells) + f" | {row['verdict']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only",
                        help="comma-separated copies: " + ", ".join(c.name for c in COPIES))
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help="comma-separated workloads: " + ", ".join(WORKLOADS))
    parser.add_argument("--pure-only", action="store_true",
                        help="bytecodes only: no compiled build")
    parser.add_argument("--no-callgrind", action="store_true", help="no instruction counts")
    parser.add_argument("--no-time", action="store_true", help="no compiled timing")
    parser.add_argument("--repeat", type=int, default=5, help="rounds of timed children")
    parser.add_argument("--windows", type=int, default=3,
                        help="Callgrind windows per workload (median)")
    parser.add_argument("--inner", type=int, default=3, help="runs per timed child (median)")
    parser.add_argument("--scale", type=float, default=1.0, help="units, times the default")
    parser.add_argument("--threshold", type=float, default=1.0, help="%% of a unit: needed")
    parser.add_argument("--quick", action="store_true",
                        help="pure bytecodes only, a tenth of the units")
    parser.add_argument("--trees", help="keep the built copies here (reused when unchanged)")
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    parser.add_argument("--child", choices=("opcount", "callgrind", "time"), help=argparse.SUPPRESS)
    parser.add_argument("--helper", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or not names:
        parser.error(f"--workloads: no workload {', '.join(unknown)}; choose from "
                     + ", ".join(WORKLOADS))
    if args.child == "opcount":
        print(json.dumps(child_opcount(names, args.scale)))
        return 0
    if args.child == "callgrind":
        child_callgrind(names, args.scale, args.helper, args.windows)
        return 0
    if args.child == "time":
        print(json.dumps(child_time(names, args.scale, args.inner)))
        return 0
    by_name = {c.name: c for c in COPIES}
    copies = COPIES
    if args.only is not None:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        missing = [n for n in wanted if n not in by_name]
        if missing or not wanted:
            parser.error(f"--only: no copy {', '.join(missing)}; choose from "
                         + ", ".join(by_name))
        copies = [by_name[n] for n in wanted]
    if args.quick:
        args.pure_only, args.scale = True, args.scale / 10
    for copy in copies:  # every copy still as listed, before anything is built
        without(copy, (ROOT / "mujou_actors" / copy.file).read_text())

    from rich.console import Console
    from rich.table import Table

    console = Console()
    scratch_dir = tempfile.TemporaryDirectory(prefix="mujou-inlined-")
    scratch = Path(scratch_dir.name)
    trees = Path(args.trees) if args.trees else scratch / "trees"
    t_start = time.perf_counter()
    doc: dict[str, Any] = {
        "benchmark": "inlined", "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "quick": args.quick, "scale": args.scale, "threshold_pct": args.threshold,
        "workloads": {n: {"unit": WORKLOADS[n].unit,
                          "counted": max(40, round(WORKLOADS[n].counted * args.scale)),
                          "timed": max(40, round(WORKLOADS[n].timed * args.scale))}
                      for n in names},
    }
    builds: list[tuple[str, Copy | None, int]] = [("base", None, 0), ("A/A", None, 1)]
    builds += [(c.name, c, 0) for c in copies]
    figures: dict[str, dict[str, dict[str, float]]] = {b: {} for b, _, _ in builds}
    functions: dict[str, dict[str, dict[str, float]]] = {}

    console.print(f"pure Python: bytecodes per unit, {len(builds)} builds")
    for label, copy, replica in builds:
        tree = prepare(copy, False, trees, replica)
        counted = measure_opcount(tree, names, args.scale)
        figures[label]["ops"] = {n: counted[n]["ops"] for n in names}
        functions[label] = {n: counted[n]["functions"] for n in names}
        console.print(f"  {label}: " + ", ".join(f"{n} {v:.1f}"
                                                 for n, v in figures[label]["ops"].items()))

    helper_note = None
    if not args.pure_only:
        console.print("compiled builds (mypyc)")
        compiled = {label: prepare(copy, True, trees, replica) for label, copy, replica in builds}
        lone = [n for n in names if WORKLOADS[n].workers == 1]  # Callgrind: one worker
        if not args.no_callgrind and lone:
            helper = callgrind_helper(scratch)
            if isinstance(helper, str):
                helper_note = helper
                console.print(f"  no instruction counts: {helper}")
            else:
                for label, tree in compiled.items():
                    counted = measure_callgrind(tree, lone, args.scale, helper, scratch,
                                                args.windows)
                    figures[label]["ir"] = {n: counted[n]["ir"] for n in lone}
                    doc.setdefault("ir_windows", {})[label] = {
                        n: counted[n]["windows"] for n in lone}
                    console.print(f"  {label}: Ir " + ", ".join(
                        f"{n} {v:,.0f}" for n, v in figures[label]["ir"].items()))
        if not args.no_time:
            samples: dict[str, list[dict[str, float]]] = {label: [] for label in compiled}
            order = list(compiled)
            for r in range(args.repeat):  # every build once per round, the order rotated
                k = r % len(order)
                for label in order[k:] + order[:k]:
                    samples[label].append(measure_time(compiled[label], names, args.scale,
                                                       args.inner))
                console.print(f"  round {r + 1}/{args.repeat} done")
            doc["time_samples"] = samples
            for label in compiled:  # per round: this build's time over the base's
                figures[label]["cpu_ratio"] = {
                    n: statistics.median(s[n] / b[n] for s, b in zip(samples[label],
                                                                     samples["base"], strict=True))
                    for n in names}
                figures[label]["cpu"] = {n: statistics.median(s[n] for s in samples[label])
                                         for n in names}

    # The A/A build is the base built again: its differences are the noise.
    noise: dict[str, float] = {}
    if "cpu_ratio" in figures["A/A"]:
        aa = doc["time_samples"]["A/A"]
        base = doc["time_samples"]["base"]
        for n in names:
            ratios = [abs(_pct(a[n], b[n])) for a, b in zip(aa, base, strict=True)]
            noise[n] = statistics.median(ratios)
    doc["noise_cpu_pct"] = noise
    rows = []
    for label, copy, _ in builds:
        if copy is None and label == "base":
            continue
        row: dict[str, Any] = {"copy": label, "workloads": {}}
        if copy is not None:
            row.update(file=copy.file, holder=copy.holder, rule=copy.rule, inlines=copy.inlines)
        for n in names:
            w: dict[str, Any] = {}
            for fig in ("ops", "ir", "cpu"):
                if n in figures[label].get(fig, {}):
                    old, new = figures["base"][fig][n], figures[label][fig][n]
                    w[fig] = {"with": old, "without": new, "delta": new - old,
                              "pct": (_pct(new, old) if fig != "cpu"
                                      else (figures[label]["cpu_ratio"][n] - 1) * 100)}
            if "ops" in w:  # where the bytecodes moved
                before, after = functions["base"][n], functions[label][n]
                moved = {f: after.get(f, 0.0) - before.get(f, 0.0) for f in {*before, *after}}
                w["ops"]["functions"] = {f: round(d, 2) for f, d in sorted(
                    moved.items(), key=lambda kv: -abs(kv[1])) if abs(d) >= 0.05}
            row["workloads"][n] = w
        row["verdict"] = verdict(row, args.threshold, noise) if copy is not None else "control"
        rows.append(row)
    doc["copies"] = rows
    doc["callgrind"] = helper_note or ("not run" if args.pure_only or args.no_callgrind else "run")
    doc["seconds"] = time.perf_counter() - t_start

    table = Table(title="Inlined copies: the build without each (its rule called) against the "
                        "base; per workload: bytecodes (pure), instructions and CPU (compiled)")
    table.add_column("copy")
    table.add_column("where")
    for n in names:
        table.add_column(n, justify="right")
    table.add_column("verdict")
    for row in rows:
        cells = []
        for n in names:
            w = row["workloads"][n]
            parts = []
            if "ops" in w:
                parts.append(f"{w['ops']['with']:.0f}→{w['ops']['without']:.0f} "
                             f"({w['ops']['pct']:+.1f} %)")
            if "ir" in w:
                parts.append(f"Ir {w['ir']['pct']:+.2f} %")
            if "cpu" in w:
                parts.append(f"CPU {w['cpu']['pct']:+.1f} %")
            cells.append("\n".join(parts))
        table.add_row(row["copy"], f"{row.get('file', '')} {row.get('holder', '')}", *cells,
                      row["verdict"])
    console.print(table)
    print(markdown(rows, names))  # the form of docs/performance.md's table
    if noise:
        console.print("CPU noise (A/A, median |Δ| per round): "
                      + ", ".join(f"{n} {v:.1f} %" for n, v in noise.items()))
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    console.print(f"wrote {path}")
    scratch_dir.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
