"""mujou_actors against the frameworks a user would pick instead: three workloads, one run.

What is measured
----------------
Every workload runs, in the same process and the same invocation, once per
repetition for mujou_actors and for each peer (interleaved, so drifts in machine
load hit every side). The table shows the median over repetitions and the
min–max; the JSON file keeps every sample.

1. **ticks** -- 1,000 nodes with a no-op ``on_update``, all with a 10 ms
   period, for ``D`` seconds of time; figure: no-op calls per wall second.

   * *mujou*: ``mujou.run(nodes, timer="simulated", duration=D)`` with the
     default workers; updates from ``run.stats()`` over the wall time of
     ``run.join()`` (starting the run is excluded).
   * *floor*: a bare ``heapq`` of ``(due_ns, index)`` popped in a loop that
     calls the same no-op method (as ``benchmarks/dispatch.py``'s floor).
   * *asyncio*: one task per node waiting on a future; a single scheduler
     coroutine pops the heap of simulated due times, resolves the futures of
     every node due at that time and yields with ``await asyncio.sleep(0)`` so
     they run. Same number of no-op calls (asserted).
   * pykka and Thespian have no timer/scheduler of this kind: not applicable.

2. **pingpong** -- two event-driven actors bounce an ``int`` ``N`` times, then a
   ``torch.zeros(16)`` once; figure: round trips per second, plus p50 / p99
   round-trip time in µs, measured with ``time.perf_counter_ns`` by the pinging
   side (send to reply). mujou: ``period=None`` nodes with triggered Inputs,
   realtime timer; asyncio: two tasks and two ``asyncio.Queue``; pykka: two
   ``ThreadingActor``; Thespian: two actors in ``simpleSystemBase``.

3. **fanout** -- one source sends ``M`` messages round-robin to 100 workers, each
   forwards every message to one sink; figure: messages per second from the
   source's first send to the sink's ``M``-th receipt (start-up excluded).
   mujou: realtime timer, triggered Inputs with ``depth=None``; the peers use
   their own mailboxes (queues for asyncio).

How to read the ratios
----------------------
``mujou / peer`` = median mujou rate / median peer rate, for the same workload
and the same sizes. Above 1 mujou is faster than that peer, below 1 slower
(0.5: the peer does twice the work per second). The floor is no framework at
all, so its ratio is the share of the bare minimum that mujou reaches. The
peers do not give the same guarantees (asyncio runs on one thread; Thespian's
``simpleSystemBase`` runs everything inline on the caller's thread; mujou copies
and type-checks every message and runs on a worker pool), so read the ratios as
"the price of what mujou adds for this workload", and compare them across
commits on one machine rather than absolute rates across machines. A peer that
cannot be imported is reported as missing; no figure is ever made up for it.

Usage::

    python benchmarks/run.py [--quick] [--json PATH] [--repeat R]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import json
import platform
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from common import NoOp, Plain, heap_floor, summary

import mujou_actors as mujou

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "run.json"
WAIT_S = 120.0  # bound on any single measurement; a peer that overruns is reported as failed
PERIOD_NS = 10_000_000
FAN_WORKERS = 100

try:
    import pykka
except ImportError:  # pragma: no cover - depends on the environment
    pykka = None

try:
    from thespian.actors import Actor as ThespianActor
    from thespian.actors import ActorSystem
except ImportError:  # pragma: no cover - depends on the environment
    ThespianActor = object
    ActorSystem = None


class Timeout(RuntimeError):
    pass


def wait(event: threading.Event) -> None:
    if not event.wait(WAIT_S):
        raise Timeout(f"no result within {WAIT_S:g} s")


def percentile(values: list[int], q: float) -> float:
    s = sorted(values)
    return float(s[min(len(s) - 1, round(q * (len(s) - 1)))])


# --------------------------------------------------------------------------- 1. ticks


def ticks_mujou(n: int, end_ns: int) -> dict:
    nodes = [NoOp(period=PERIOD_NS / 1e9) for _ in range(n)]
    gc.collect()
    run = mujou.run(nodes, timer="simulated", duration=end_ns / 1e9)
    t0 = time.perf_counter()
    run.join(timeout=WAIT_S)
    t1 = time.perf_counter()
    if run.running:
        run.stop()
        raise Timeout("mujou ticks did not finish")
    updates = sum(s.updates for s in run.stats().nodes.values())
    return {"count": updates, "rate": updates / (t1 - t0)}


def ticks_floor(n: int, end_ns: int) -> dict:
    floor = heap_floor([PERIOD_NS] * n, end_ns)
    return {"count": floor["updates"], "rate": floor["rate"]}


def ticks_asyncio(n: int, end_ns: int) -> dict:
    async def main() -> dict:
        loop = asyncio.get_running_loop()
        objs = [Plain() for _ in range(n)]
        futs: list[asyncio.Future] = [loop.create_future() for _ in range(n)]
        counts = [0] * n

        async def node(i: int) -> None:
            obj = objs[i]
            while True:
                dt = await futs[i]
                if dt is None:
                    return
                futs[i] = loop.create_future()
                obj.on_update(dt)
                counts[i] += 1

        tasks = [asyncio.create_task(node(i)) for i in range(n)]
        await asyncio.sleep(0)  # every task now waits on its future
        last = [0] * n
        heap = [(PERIOD_NS, i) for i in range(n)]
        heapq.heapify(heap)
        gc.collect()
        t0 = time.perf_counter()
        while heap[0][0] <= end_ns:
            now = heap[0][0]
            while heap[0][0] == now:
                due, i = heapq.heappop(heap)
                futs[i].set_result((due - last[i]) / 1e9)
                last[i] = due
                heapq.heappush(heap, (due + PERIOD_NS, i))
            await asyncio.sleep(0)  # the woken tasks run their tick
        t1 = time.perf_counter()
        for f in futs:
            f.set_result(None)
        await asyncio.gather(*tasks)
        total = sum(counts)
        return {"count": total, "rate": total / (t1 - t0)}

    return asyncio.run(main())


# --------------------------------------------------------------------------- 2. ping-pong


def pingpong_result(rtts: list[int], elapsed_ns: int) -> dict:
    return {"count": len(rtts), "rate": len(rtts) / (elapsed_ns / 1e9),
            "p50_us": percentile(rtts, 0.50) / 1e3, "p99_us": percentile(rtts, 0.99) / 1e3}


class Pinger(mujou.Node):
    back = mujou.Input(object, depth=None)
    out = mujou.Output(object)

    def __init__(self, n: int, done: threading.Event):
        super().__init__(period=None)
        self.n, self.done = n, done
        self.rtts: list[int] = []
        self.sent_ns = self.first_ns = self.last_ns = 0

    def on_start(self) -> None:
        self.first_ns = self.sent_ns = time.perf_counter_ns()
        self.out.send(0)

    def on_update(self, dt: float) -> None:
        for _ in self.back.drain():
            now = time.perf_counter_ns()
            self.rtts.append(now - self.sent_ns)
            k = len(self.rtts)
            if k > self.n:
                self.last_ns = now
                self.done.set()
                return
            self.sent_ns = time.perf_counter_ns()
            self.out.send(k if k < self.n else torch.zeros(16))


class Relay(mujou.Node):
    """A triggered node that sends on every message it receives (pong, and fan-out workers)."""

    inp = mujou.Input(object, depth=None)
    out = mujou.Output(object)

    def __init__(self):
        super().__init__(period=None)

    def on_update(self, dt: float) -> None:
        for m in self.inp.drain():
            self.out.send(m)


def pingpong_mujou(n: int) -> dict:
    done = threading.Event()
    ping, pong = Pinger(n, done), Relay()
    mujou.connect(ping.out, pong.inp)
    mujou.connect(pong.out, ping.back)
    gc.collect()
    with mujou.run([ping, pong], timer="realtime"):
        wait(done)
    return pingpong_result(ping.rtts, ping.last_ns - ping.first_ns)


def pingpong_asyncio(n: int) -> dict:
    async def main() -> dict:
        to_pong: asyncio.Queue = asyncio.Queue()
        to_ping: asyncio.Queue = asyncio.Queue()

        async def pong() -> None:
            while True:
                m = await to_pong.get()
                if m is None:
                    return
                await to_ping.put(m)

        task = asyncio.create_task(pong())
        rtts: list[int] = []
        first = time.perf_counter_ns()
        for k in range(n + 1):
            sent = time.perf_counter_ns()
            await to_pong.put(k if k < n else torch.zeros(16))
            await to_ping.get()
            rtts.append(time.perf_counter_ns() - sent)
        last = time.perf_counter_ns()
        await to_pong.put(None)
        await task
        return pingpong_result(rtts, last - first)

    return asyncio.run(main())


if pykka is not None:

    class PykkaPonger(pykka.ThreadingActor):
        def __init__(self, ping):
            super().__init__()
            self.ping = ping

        def on_receive(self, message):
            self.ping.tell(message)

    class PykkaPinger(pykka.ThreadingActor):
        def __init__(self, n: int, done: threading.Event):
            super().__init__()
            self.n, self.done, self.pong = n, done, None
            self.rtts: list[int] = []
            self.sent_ns = self.first_ns = self.last_ns = 0

        def on_receive(self, message):
            if isinstance(message, tuple) and message[0] == "start":
                self.pong = message[1]
                self.first_ns = self.sent_ns = time.perf_counter_ns()
                self.pong.tell(0)
                return None
            if message == "result":
                return self.rtts, self.last_ns - self.first_ns
            now = time.perf_counter_ns()
            self.rtts.append(now - self.sent_ns)
            k = len(self.rtts)
            if k > self.n:
                self.last_ns = now
                self.done.set()
                return None
            self.sent_ns = time.perf_counter_ns()
            self.pong.tell(k if k < self.n else torch.zeros(16))
            return None


def pingpong_pykka(n: int) -> dict:
    done = threading.Event()
    ping = PykkaPinger.start(n, done)
    pong = PykkaPonger.start(ping)
    try:
        gc.collect()
        ping.tell(("start", pong))
        wait(done)
        rtts, elapsed = ping.ask("result", timeout=WAIT_S)
    finally:
        pong.stop()
        ping.stop()
    return pingpong_result(rtts, elapsed)


class ThPonger(ThespianActor):
    def receiveMessage(self, message, sender):  # noqa: N802 - Thespian's API
        if isinstance(message, int | torch.Tensor):
            self.send(sender, message)


class ThPinger(ThespianActor):
    def receiveMessage(self, message, sender):  # noqa: N802 - Thespian's API
        if isinstance(message, tuple) and message[0] == "start":
            _, self.n, self.pong = message
            self.requester = sender
            self.rtts = []
            self.first_ns = self.sent_ns = time.perf_counter_ns()
            self.send(self.pong, 0)
        elif isinstance(message, int | torch.Tensor):
            now = time.perf_counter_ns()
            self.rtts.append(now - self.sent_ns)
            k = len(self.rtts)
            if k > self.n:
                self.send(self.requester, (self.rtts, now - self.first_ns))
                return
            self.sent_ns = time.perf_counter_ns()
            self.send(self.pong, k if k < self.n else torch.zeros(16))


def thespian_system():
    return ActorSystem("simpleSystemBase", logDefs=False)


def pingpong_thespian(n: int) -> dict:
    asys = thespian_system()
    try:
        ping, pong = asys.createActor(ThPinger), asys.createActor(ThPonger)
        gc.collect()
        reply = asys.ask(ping, ("start", n, pong), WAIT_S)
    finally:
        asys.shutdown()
    if reply is None:
        raise Timeout("thespian ping-pong gave no reply")
    return pingpong_result(*reply)


# --------------------------------------------------------------------------- 3. fan-out/fan-in


def fanout_result(m: int, elapsed_ns: int) -> dict:
    return {"count": m, "rate": m / (elapsed_ns / 1e9)}


class Source(mujou.Node):
    go = mujou.Input(int)

    def __init__(self, m: int, workers: int):
        super().__init__(period=None)
        self.m = m
        self.outs = []
        for i in range(workers):
            port = mujou.Output(int)
            setattr(self, f"out{i}", port)
            self.outs.append(port)
        self.first_ns = 0

    def on_update(self, dt: float) -> None:
        self.go.drain()
        outs, w = self.outs, len(self.outs)
        self.first_ns = time.perf_counter_ns()
        for k in range(self.m):
            outs[k % w].send(k)


class Sink(mujou.Node):
    inp = mujou.Input(int, depth=None)

    def __init__(self, m: int, done: threading.Event):
        super().__init__(period=None)
        self.m, self.done, self.count, self.last_ns = m, done, 0, 0

    def on_update(self, dt: float) -> None:
        self.count += len(self.inp.drain())
        if self.count >= self.m and not self.done.is_set():
            self.last_ns = time.perf_counter_ns()
            self.done.set()


def fanout_mujou(m: int) -> dict:
    done = threading.Event()
    src = Source(m, FAN_WORKERS)
    workers = [Relay() for _ in range(FAN_WORKERS)]
    sink = Sink(m, done)
    for out, w in zip(src.outs, workers, strict=True):
        mujou.connect(out, w.inp)
        mujou.connect(w.out, sink.inp)
    gc.collect()
    with mujou.run([src, *workers, sink], timer="realtime", inputs={src.go: 1}):
        wait(done)
    if sink.count != m:
        raise RuntimeError(f"mujou fan-out: sink got {sink.count} of {m}")
    return fanout_result(m, sink.last_ns - src.first_ns)


def fanout_asyncio(m: int) -> dict:
    async def main() -> dict:
        queues = [asyncio.Queue() for _ in range(FAN_WORKERS)]
        sink_q: asyncio.Queue = asyncio.Queue()

        async def worker(q: asyncio.Queue) -> None:
            while True:
                x = await q.get()
                if x is None:
                    return
                await sink_q.put(x)

        async def sink() -> int:
            count = 0
            while count < m:
                await sink_q.get()
                count += 1
            return time.perf_counter_ns()

        tasks = [asyncio.create_task(worker(q)) for q in queues]
        sink_task = asyncio.create_task(sink())
        await asyncio.sleep(0)
        gc.collect()
        first = time.perf_counter_ns()
        for k in range(m):
            await queues[k % FAN_WORKERS].put(k)
        last = await sink_task
        for q in queues:
            await q.put(None)
        await asyncio.gather(*tasks)
        return fanout_result(m, last - first)

    return asyncio.run(main())


if pykka is not None:

    class PykkaSink(pykka.ThreadingActor):
        def __init__(self, m: int, done: threading.Event):
            super().__init__()
            self.m, self.done, self.count, self.last_ns = m, done, 0, 0

        def on_receive(self, message):
            if message == "result":
                return self.count, self.last_ns
            self.count += 1
            if self.count == self.m:
                self.last_ns = time.perf_counter_ns()
                self.done.set()
            return None

    class PykkaWorker(pykka.ThreadingActor):
        def __init__(self, sink):
            super().__init__()
            self.sink = sink

        def on_receive(self, message):
            self.sink.tell(message)

    class PykkaSource(pykka.ThreadingActor):
        def __init__(self, m: int, workers: list):
            super().__init__()
            self.m, self.workers, self.first_ns = m, workers, 0

        def on_receive(self, message):
            if message == "result":
                return self.first_ns
            ws, w = self.workers, len(self.workers)
            self.first_ns = time.perf_counter_ns()
            for k in range(self.m):
                ws[k % w].tell(k)
            return None


def fanout_pykka(m: int) -> dict:
    done = threading.Event()
    sink = PykkaSink.start(m, done)
    workers = [PykkaWorker.start(sink) for _ in range(FAN_WORKERS)]
    src = PykkaSource.start(m, workers)
    try:
        gc.collect()
        src.tell("go")
        wait(done)
        first = src.ask("result", timeout=WAIT_S)
        count, last = sink.ask("result", timeout=WAIT_S)
    finally:
        for ref in (src, *workers, sink):
            ref.stop()
    if count != m:
        raise RuntimeError(f"pykka fan-out: sink got {count} of {m}")
    return fanout_result(m, last - first)


class ThSink(ThespianActor):
    def receiveMessage(self, message, sender):  # noqa: N802 - Thespian's API
        if isinstance(message, tuple) and message[0] == "expect":
            _, self.m, self.reply_to = message
            self.count = 0
        elif isinstance(message, int):
            self.count += 1
            if self.count == self.m:
                self.send(self.reply_to, ("done", self.count, time.perf_counter_ns()))


class ThWorker(ThespianActor):
    def receiveMessage(self, message, sender):  # noqa: N802 - Thespian's API
        if isinstance(message, tuple) and message[0] == "sink":
            self.sink = message[1]
        elif isinstance(message, int):
            self.send(self.sink, message)


class ThSource(ThespianActor):
    def receiveMessage(self, message, sender):  # noqa: N802 - Thespian's API
        if isinstance(message, tuple) and message[0] == "go":
            _, m, workers, sink = message
            self.requester = sender
            for w in workers:
                self.send(w, ("sink", sink))
            self.send(sink, ("expect", m, self.myAddress))
            self.first_ns = time.perf_counter_ns()
            n = len(workers)
            for k in range(m):
                self.send(workers[k % n], k)
        elif isinstance(message, tuple) and message[0] == "done":
            _, count, last = message
            self.send(self.requester, (count, last - self.first_ns))


def fanout_thespian(m: int) -> dict:
    asys = thespian_system()
    try:
        sink = asys.createActor(ThSink)
        workers = [asys.createActor(ThWorker) for _ in range(FAN_WORKERS)]
        src = asys.createActor(ThSource)
        gc.collect()
        reply = asys.ask(src, ("go", m, workers, sink), WAIT_S)
    finally:
        asys.shutdown()
    if reply is None:
        raise Timeout("thespian fan-out gave no reply")
    count, elapsed = reply
    if count != m:
        raise RuntimeError(f"thespian fan-out: sink got {count} of {m}")
    return fanout_result(m, elapsed)


# --------------------------------------------------------------------------- suite


def missing_peers() -> dict[str, str]:
    out = {}
    if pykka is None:
        out["pykka"] = "missing: pykka is not installed"
    if ActorSystem is None:
        out["thespian"] = "missing: thespian is not installed"
    return out


def measure(name: str, unit: str, size: dict, sides: dict[str, Callable[[], dict] | str],
            repeat: int, extras: tuple[str, ...] = ()) -> dict:
    """Run every side ``repeat`` times, interleaved; a str side is a reason it is absent."""
    samples: dict[str, list[dict]] = {k: [] for k, v in sides.items() if callable(v)}
    errors: dict[str, str] = {}
    for _ in range(repeat):
        for side, fn in sides.items():
            if not callable(fn) or side in errors:
                continue
            try:
                samples[side].append(fn())
            except Exception as exc:  # a peer that fails is reported, not faked
                errors[side] = f"failed: {type(exc).__name__}: {exc}"
    results: dict[str, dict] = {}
    for side, fn in sides.items():
        if not callable(fn):
            results[side] = {"absent": fn}
        elif side in errors:
            results[side] = {"absent": errors[side]}
        else:
            runs = samples[side]
            counts = {r["count"] for r in runs}
            entry = {"count": max(counts), **summary([r["rate"] for r in runs])}
            for key in extras:
                entry[key] = summary([r[key] for r in runs])
            results[side] = entry
    if "mujou" in errors:
        raise RuntimeError(f"{name}: mujou {errors['mujou']}")
    counts = {s: r["count"] for s, r in results.items() if "count" in r}
    if len(set(counts.values())) > 1:
        raise AssertionError(f"{name}: sides did different amounts of work: {counts}")
    mj = results["mujou"]["median"]
    ratios = {s: mj / r["median"] for s, r in results.items() if s != "mujou" and "median" in r}
    return {"unit": unit, "size": size, "results": results, "ratios": ratios}


def fmt_rate(x: float) -> str:
    return f"{x / 1e3:,.1f}k" if x >= 1e3 else f"{x:,.0f}"


def print_table(workloads: dict) -> None:
    header = ["workload", "side", "rate (median, min–max)", "p50 µs", "p99 µs", "mujou/side"]
    rows = [header]
    for name, w in workloads.items():
        for side, r in w["results"].items():
            if "absent" in r:
                rows.append([name, side, r["absent"], "", "", ""])
                continue
            rate = (f"{fmt_rate(r['median'])} ({fmt_rate(r['min'])}–{fmt_rate(r['max'])}) "
                    f"{w['unit']}")
            p50 = f"{r['p50_us']['median']:.1f}" if "p50_us" in r else ""
            p99 = f"{r['p99_us']['median']:.1f}" if "p99_us" in r else ""
            ratio = f"{w['ratios'][side]:.3f}" if side in w["ratios"] else ""
            rows.append([name, side, rate, p50, p99, ratio])
    widths = [max(len(r[i]) for r in rows if len(r[i]) < 60) for i in range(len(header))]
    for k, row in enumerate(rows):
        print("  ".join(x.ljust(wd) if i < 3 else x.rjust(wd)
                        for i, (x, wd) in enumerate(zip(row, widths, strict=True))).rstrip())
        if k == 0:
            print("  ".join("-" * wd for wd in widths))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 2 reps: a CI smoke run")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    ap.add_argument("--repeat", type=int, default=None, help="default 5; quick 2")
    args = ap.parse_args()
    repeat = args.repeat if args.repeat is not None else (2 if args.quick else 5)
    if repeat < 1:
        ap.error("--repeat must be >= 1")
    nodes = 1000
    duration = 0.2 if args.quick else 1.0
    n_ping = 1000 if args.quick else 5000
    m_fan = 5000 if args.quick else 50_000
    end_ns = round(duration * 1e9)
    absent = missing_peers()
    t_start = time.perf_counter()

    def peer(name: str, fn: Callable[[], dict]) -> Callable[[], dict] | str:
        return absent.get(name, fn)

    na = "n/a: no periodic scheduler to compare"
    workloads = {
        "ticks": measure("ticks", "ticks/s", {"nodes": nodes, "period_s": PERIOD_NS / 1e9,
                                              "duration_s": duration},
                         {"mujou": lambda: ticks_mujou(nodes, end_ns),
                          "floor": lambda: ticks_floor(nodes, end_ns),
                          "asyncio": lambda: ticks_asyncio(nodes, end_ns),
                          "pykka": absent.get("pykka", na),
                          "thespian": absent.get("thespian", na)}, repeat),
        "pingpong": measure("pingpong", "rt/s", {"round_trips": n_ping + 1},
                            {"mujou": lambda: pingpong_mujou(n_ping),
                             "asyncio": lambda: pingpong_asyncio(n_ping),
                             "pykka": peer("pykka", lambda: pingpong_pykka(n_ping)),
                             "thespian": peer("thespian", lambda: pingpong_thespian(n_ping))},
                            repeat, extras=("p50_us", "p99_us")),
        "fanout": measure("fanout", "msg/s", {"messages": m_fan, "workers": FAN_WORKERS},
                          {"mujou": lambda: fanout_mujou(m_fan),
                           "asyncio": lambda: fanout_asyncio(m_fan),
                           "pykka": peer("pykka", lambda: fanout_pykka(m_fan)),
                           "thespian": peer("thespian", lambda: fanout_thespian(m_fan))},
                          repeat),
    }
    elapsed = time.perf_counter() - t_start
    print(f"mujou_actors {mujou.__version__} vs peers, {repeat} reps"
          f"{' (quick)' if args.quick else ''}; mujou/side = median mujou / median side "
          "(>1: mujou faster)")
    print_table(workloads)
    print(f"suite took {elapsed:.1f} s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "run", "repeat": repeat, "quick": args.quick,
           "python": platform.python_version(), "platform": platform.platform(),
           "mujou_version": mujou.__version__, "torch_version": torch.__version__,
           "pykka_version": getattr(pykka, "__version__", None), "elapsed_s": elapsed,
           "workloads": workloads}
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
