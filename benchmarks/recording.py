"""What recording to MCAP costs: the hook on the sender, the writer's throughput.

What is measured
----------------
* **hook ns/message** (cases ``float`` and ``tensor``, a 1 KiB float32 tensor):
  one periodic sender node (simulated time, one worker) makes ``--sends``
  sends per update to one reader, for ``--ticks`` updates, once in a run
  that records nothing and once in a run that records the Output (a queue big
  enough that nothing is dropped). Per run, the median over the updates of
  the send loop's CPU time per send (``time.thread_time_ns`` of the sender's
  thread: the writer thread's CPU, on the other core, is not the sender's).
  The hook's cost = recorded - plain, the runs interleaved, the median over
  ``--repeat``. **calls/message**: the Python calls the hook adds per send
  (``sys.setprofile``, one update of each run: exact whatever the load).
* **drop ns/message**: the same with a queue of 8 messages
  (``when_full="drop"``): what a send costs when its message is dropped.
* **capsule ns/message**: the same with a crash capsule instead of a
  recording (``record_on_failure=``, bounds that keep every message; no node
  fails, so no file is written): what keeping a message in the capsule's
  window costs the sender.
* **writer msg/s** (small: a float per message) and **writer GB/s** (tensors of
  ``--tensor-mib`` MiB): what the ``mujou-recorder`` thread does per message
  (`mcapfile.Writer.write_message`: encode with the snapshot codec, add to the
  chunk, write each closed 1 MiB chunk to the file), on one thread, to a file
  in ``--dir``; wall time, ``--messages`` small messages or 256 MiB of tensors.
  The split: **encode** alone (`mcapfile.encode_message`) and the **MCAP
  write** alone (`mcapfile.Writer.write` of encoded data: foxglove-sdk's
  writer).
* **recorded run msg/s**: a simulated run whose sender floods one Output with
  floats, recorded with ``when_full="wait"``: messages recorded per wall
  second with the sender and the writer sharing the interpreter (the GIL).

The script imports ``mujou_actors`` from ``sys.path``: set ``PYTHONPATH`` to
the tree to measure.

Usage::

    python benchmarks/recording.py [--sends 1000] [--ticks 20] [--repeat 5]
                                   [--messages 200000] [--tensor-mib 4]
                                   [--dir /tmp] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import mujou_actors as mujou
from mujou_actors.recording import mcapfile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PeriodicReader, TimedSender  # noqa: E402

CASES = ("float", "tensor")


class Sender(TimedSender):
    """Makes ``n`` sends per update for ``ticks`` updates; keeps one update's call count."""

    def __init__(self, case: str, n: int, ticks: int) -> None:
        super().__init__(case, n, ticks)
        self.calls = 0
        self.done = 0

    def on_update(self, dt: float) -> None:
        if self.done >= self.ticks:
            return
        self.done += 1
        sends = self.timed_sends()
        if self.done == self.ticks:
            self.calls = _calls(sends)


def _calls(fn: Callable[[], None]) -> int:
    """Python calls made by one call of ``fn`` on this thread (``sys.setprofile``)."""
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event == "call":
            count += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def hook_run(case: str, n: int, ticks: int, record: mujou.Recording | None,
             capsule: mujou.Capsule | None = None) -> dict[str, Any]:
    """One run of the sender: median CPU ns per send, calls per send, the recording's stats."""
    sender, reader = Sender(case, n, ticks), PeriodicReader(case)
    mujou.connect(sender.out, reader.inp)
    gc.collect()
    run = mujou.run([sender, reader], timer="simulated", workers=1,
                    duration=(ticks + 2) * 0.001, record=record, record_on_failure=capsule)
    run.join()
    rec = run.stats().recording
    return {"ns": statistics.median(sender.ns[1:] or sender.ns), "calls": sender.calls / n,
            "recorded": None if rec is None else rec.recorded,
            "dropped": None if rec is None else rec.dropped}


def hook_cost(case: str, n: int, ticks: int, repeat: int, folder: str) -> dict[str, Any]:
    """The hook's cost per message (recorded - plain, interleaved) and per dropped message."""
    path = os.path.join(folder, f"mujou-bench-hook-{os.getpid()}.mcap")
    big = mujou.Recording(path, max_messages=4 * n * ticks, max_bytes=1 << 30,
                          when_full="drop")
    tiny = mujou.Recording(path, max_messages=8, when_full="drop")
    # A crash capsule that keeps every message of the run (no node fails: no file).
    kept = mujou.Capsule(path + ".capsule", max_messages=4 * n * ticks, max_bytes=1 << 30)
    plain, recorded, dropped, capsule = [], [], [], []
    calls = {}
    try:
        for _ in range(repeat):
            a = hook_run(case, n, ticks, None)
            b = hook_run(case, n, ticks, big)
            c = hook_run(case, n, ticks, tiny)
            d = hook_run(case, n, ticks, None, kept)
            assert b["dropped"] == 0, "the big queue dropped: raise max_messages"
            plain.append(a["ns"])
            recorded.append(b["ns"] - a["ns"])
            dropped.append(c["ns"] - a["ns"])
            capsule.append(d["ns"] - a["ns"])
            calls = {"plain": a["calls"], "recorded": b["calls"], "dropped": c["calls"]}
    finally:
        if os.path.exists(path):
            os.unlink(path)
    return {"send_ns": statistics.median(plain), "hook_ns": statistics.median(recorded),
            "hook_ns_samples": recorded, "drop_ns": statistics.median(dropped),
            "capsule_ns": statistics.median(capsule),
            "hook_calls": calls["recorded"] - calls["plain"],
            "drop_calls": calls["dropped"] - calls["plain"]}


def writer_rate(messages: list[Any], folder: str) -> dict[str, float]:
    """Wall seconds for one thread to encode and write ``messages`` (one channel), and the file."""
    path = os.path.join(folder, f"mujou-bench-writer-{os.getpid()}.mcap")
    try:
        gc.collect()
        t0 = time.perf_counter()
        w = mcapfile.Writer(path)
        ch = w.add_channel(mcapfile.ChannelSpec("src.out", "src", "out", 1,
                                                type(messages[0])))
        write = w.write_message
        for seq, m in enumerate(messages):
            write(ch, seq, seq, 0, m)
        w.close({})
        seconds = time.perf_counter() - t0
        size = os.path.getsize(path)
    finally:
        if os.path.exists(path):
            os.unlink(path)
    return {"seconds": seconds, "file_bytes": size}


def split_small(messages: list[Any], folder: str) -> dict[str, float]:
    """Seconds per message of the encoding alone and of the MCAP write alone (encoded data)."""
    encode = mcapfile.encode_message
    t0 = time.perf_counter()
    data = [encode(0, seq, m) for seq, m in enumerate(messages)]
    t1 = time.perf_counter()
    path = os.path.join(folder, f"mujou-bench-split-{os.getpid()}.mcap")
    try:
        w = mcapfile.Writer(path)
        ch = w.add_channel(mcapfile.ChannelSpec("src.out", "src", "out", 1, float))
        write = w.write
        t2 = time.perf_counter()
        for seq, d in enumerate(data):
            write(ch, seq, d)
        t3 = time.perf_counter()
        w.close({})
    finally:
        if os.path.exists(path):
            os.unlink(path)
    return {"encode_us": (t1 - t0) / len(messages) * 1e6,
            "mcap_us": (t3 - t2) / len(messages) * 1e6}


def disk_rate(folder: str, nbytes: int, count: int) -> float:
    """GB/s of plain ``os.write`` calls of ``nbytes`` each into a file in ``folder``."""
    path = os.path.join(folder, f"mujou-bench-disk-{os.getpid()}.bin")
    data = os.urandom(nbytes)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        t0 = time.perf_counter()
        try:
            for _ in range(count):
                os.write(fd, data)
        finally:
            os.close(fd)
        return nbytes * count / (time.perf_counter() - t0) / 1e9
    finally:
        os.unlink(path)


class Flood(mujou.Node):
    """Sends ``n`` floats per update, as fast as it can."""

    out = mujou.Output(float)

    def __init__(self, n: int) -> None:
        super().__init__(period=0.001)
        self.n = n

    def on_update(self, dt: float) -> None:
        send = self.out.send
        for k in range(self.n):
            send(k * 0.25)


def recorded_run(total: int, folder: str) -> dict[str, float]:
    """A simulated run flooding one Output, recorded with when_full="wait": msg per wall s."""
    path = os.path.join(folder, f"mujou-bench-run-{os.getpid()}.mcap")
    per_tick = 1000
    ticks = max(1, total // per_tick)
    try:
        node = Flood(per_tick)
        gc.collect()
        t0 = time.perf_counter()
        run = mujou.run(node, timer="simulated", workers=1, duration=ticks * 0.001,
                        record=mujou.Recording(path, when_full="wait"))
        run.join()
        seconds = time.perf_counter() - t0
        rec = run.stats().recording
        assert rec is not None and rec.dropped == 0
    finally:
        if os.path.exists(path):
            os.unlink(path)
    return {"messages": rec.recorded, "seconds": seconds, "rate": rec.recorded / seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sends", type=int, default=1000)
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--tensor-mib", type=int, default=4)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--quick", action="store_true",
                    help="200 sends, 5 ticks, 1 repeat, 20k messages, 32 MiB of tensors")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.sends, args.ticks, args.repeat, args.messages = 200, 5, 1, 20_000
    if min(args.sends, args.ticks, args.repeat, args.messages, args.tensor_mib) < 1:
        ap.error("--sends, --ticks, --repeat, --messages and --tensor-mib must be >= 1")
    tensor_total = (32 if args.quick else 256) << 20
    print(f"mujou_actors {mujou.__file__}", flush=True)

    hooks = {case: hook_cost(case, args.sends, args.ticks, args.repeat, args.dir)
             for case in CASES}
    small = [i * 0.5 for i in range(args.messages)]
    small_runs = [writer_rate(small, args.dir) for _ in range(args.repeat)]
    small_s = statistics.median(r["seconds"] for r in small_runs)
    split = split_small(small[: min(len(small), 50_000)], args.dir)
    tensor = torch.rand((args.tensor_mib << 20) // 4)
    count = max(1, tensor_total // tensor.nbytes)
    big_runs = [writer_rate([tensor] * count, args.dir) for _ in range(args.repeat)]
    big_s = statistics.median(r["seconds"] for r in big_runs)
    # The same into memory (tmpfs), where the disk is not what limits it.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    shm_s = None if shm is None else statistics.median(
        writer_rate([tensor] * count, shm)["seconds"] for _ in range(args.repeat))
    disk = disk_rate(args.dir, tensor.nbytes, count)
    flood = recorded_run(args.messages, args.dir)

    result = {
        "python": platform.python_version(), "torch": torch.__version__,
        "cpus": os.cpu_count(), "dir": args.dir,
        "hook": hooks,
        "writer_small": {"messages": args.messages, "seconds": small_s,
                         "rate": args.messages / small_s, **split,
                         "bytes_per_message": small_runs[0]["file_bytes"] / args.messages},
        "writer_tensors": {"tensor_bytes": tensor.nbytes, "count": count, "seconds": big_s,
                           "gb_per_s": tensor.nbytes * count / big_s / 1e9,
                           "gb_per_s_tmpfs": None if shm_s is None
                           else tensor.nbytes * count / shm_s / 1e9,
                           "disk_gb_per_s": disk},
        "recorded_run": flood,
        "targets": {"hook_ns": 2000, "writer_small_rate": 300_000, "writer_gb_per_s": 1.0},
    }
    print(f"{'case':<8} {'send ns':>9} {'hook ns':>9} {'drop ns':>9} {'hook calls':>11} "
          f"{'capsule ns':>11}")
    for case, h in hooks.items():
        print(f"{case:<8} {h['send_ns']:>9.0f} {h['hook_ns']:>9.0f} {h['drop_ns']:>9.0f} "
              f"{h['hook_calls']:>11.2f} {h['capsule_ns']:>11.0f}")
    ws, wt = result["writer_small"], result["writer_tensors"]
    print(f"writer, small messages: {ws['rate']:,.0f} msg/s (encode {ws['encode_us']:.2f} us "
          f"+ MCAP write {ws['mcap_us']:.2f} us per message; target 300,000)")
    tmpfs = wt["gb_per_s_tmpfs"]
    print(f"writer, {tensor.nbytes >> 20} MiB tensors: {wt['gb_per_s']:.2f} GB/s to {args.dir}, "
          + ("" if tmpfs is None else f"{tmpfs:.2f} GB/s to /dev/shm, ")
          + f"target 1 (plain os.write of the same bytes to {args.dir}: {disk:.2f} GB/s)")
    print(f"recorded run (sender and writer sharing the GIL): {flood['rate']:,.0f} msg/s")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
