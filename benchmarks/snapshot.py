"""Snapshot file speed: mujou ``save``/``load`` against a bare write/read of the same bytes.

What is measured
----------------
A tree of 16 contiguous CPU tensors of mixed dtypes (float32, bfloat16, int64,
complex64, bool, ...) totalling ``--gib`` GiB is written and read back in a
temporary folder on the project's disk (under ``benchmarks/results/``,
deleted afterwards).

* **save**: ``mujou_actors.snapshot.save(tree, path)``: structure, tensor bytes
  streamed with CRC-32, fsync, rename, fsync of the folder. Baseline: open a
  file, ``f.write(memoryview)`` of each tensor's bytes, flush, fsync.
* **load (cold)**: the file's pages are dropped from the page cache first
  (``posix_fadvise(DONTNEED)``, no root needed), so the disk is read.
  ``load(path)``: ``torch.empty`` + ``readinto`` + CRC-32. Baseline:
  ``torch.empty`` of each tensor and ``readinto`` its bytes.
* **load (cold, same file)**: as above, but the baseline reads the tensor bytes
  of the file mujou wrote. On a virtual disk backed by a file on the host, how a
  file was written (write sizes, pacing, rename) changes how fast it reads back
  while the host still caches or flushes it; this row compares the two readers
  on the very same bytes on disk.
* **load (warm)**: the same with the file in the page cache: no disk, so this
  is the worst case for the checksum's share.

MB/s = tensor bytes / wall seconds / 1e6; ratio = mujou / baseline (1.0: as
fast as a bare copy). Each phase runs in a fresh subprocess that builds (or
allocates) its tensors, resets its peak-RSS mark (``/proc/self/clear_refs``)
and reports **peak extra** = peak RSS during the phase minus RSS before it,
less the tensor bytes for loads (the result itself). 0 means no copy of the
data was held beyond the tensors; 1.0x the data would be one full copy.

How to read it: absolute MB/s is the machine's disk; compare the ratios and
the peak extra. Each phase runs mujou and baseline back to back (who goes first
alternates) so drifting disk speed hits both alike; the median over
``--repeat`` is shown with min-max.

Usage::

    python benchmarks/snapshot.py [--gib 1.0] [--quick] [--repeat 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

import torch

from mujou_actors.snapshot import MAGIC, load, save

ROOT = Path(__file__).resolve().parent
DEFAULT_JSON = ROOT / "results" / "snapshot.json"
DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.complex64, torch.bool,
          torch.float16, torch.uint8, torch.float64]
N_TENSORS = 16
# "same file": the baseline reads the tensor bytes of the file mujou wrote, so both readers
# meet the same on-disk layout (on a VM disk, how a file was written changes how fast it reads).
PHASES = ["save", "load (cold)", "load (cold, same file)", "load (warm)"]


# -- the child: one phase, in a fresh process ---------------------------------------------


def spec(total: int) -> list[tuple[torch.dtype, int]]:
    """16 tensors sharing ``total`` bytes: (dtype, number of elements)."""
    share = total // N_TENSORS
    return [(DTYPES[i % len(DTYPES)], share // DTYPES[i % len(DTYPES)].itemsize)
            for i in range(N_TENSORS)]


def make_tree(total: int) -> dict[str, torch.Tensor]:
    tree = {}
    for i, (dtype, n) in enumerate(spec(total)):
        t = torch.empty(n // 256, 256, dtype=dtype)
        # Random bytes filled in place: every page touched, no temporary tensor.
        t.view(torch.uint8).random_(0, 2 if dtype == torch.bool else 256)
        tree[f"t{i:02d}_{str(dtype).removeprefix('torch.')}"] = t
    return tree


def empty_tree(total: int) -> dict[str, torch.Tensor]:
    return {f"t{i}": torch.empty(n // 256, 256, dtype=d) for i, (d, n) in enumerate(spec(total))}


def raw(t: torch.Tensor) -> memoryview:
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def memory_kib() -> dict[str, int]:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) for k in ("VmRSS", "VmHWM")}


def drop_from_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def data_offset(f: BinaryIO) -> int:
    """Where the tensor bytes start: 0 in a baseline file, after the structure in a snapshot."""
    head = f.read(32)
    return 32 + struct.unpack_from("<Q", head, 12)[0] if head.startswith(MAGIC) else 0


def child(phase: str, side: str, path: Path, total: int) -> dict:
    writing = phase == "save"
    tree = make_tree(total) if writing else None
    if phase.startswith("load (cold"):
        drop_from_cache(path)
    elif phase == "load (warm)":
        path.read_bytes()  # into the page cache (a throwaway copy, before the measurement)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = memory_kib()["VmRSS"]
    t0 = time.perf_counter()
    if writing and side == "mujou":
        save(tree, path)
    elif writing:
        with open(path, "wb") as f:
            for t in tree.values():  # type: ignore[union-attr]
                f.write(raw(t))
            f.flush()
            os.fsync(f.fileno())
    elif side == "mujou":
        tree = load(path)
    else:
        tree = empty_tree(total)
        with open(path, "rb") as f:
            f.seek(data_offset(f))
            for t in tree.values():
                f.readinto(raw(t))
    seconds = time.perf_counter() - t0
    data = sum(t.nbytes for t in tree.values())  # type: ignore[union-attr]
    peak = (memory_kib()["VmHWM"] - before) * 1024 - (0 if writing else data)
    return {"seconds": seconds, "bytes": data, "mb_s": data / seconds / 1e6,
            "peak_extra_mib": peak / 2**20}


# -- the parent ---------------------------------------------------------------------------


def run_child(phase: str, side: str, path: Path, total: int) -> dict:
    cmd = [sys.executable, __file__, "--child", phase, side, str(path), "--bytes", str(total)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def stats(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "samples": samples}


def bench(folder: Path, total: int, repeat: int) -> dict:
    runs: dict[str, dict[str, list[dict]]] = {p: {"mujou": [], "baseline": []} for p in PHASES}
    for i in range(repeat):
        sides = ("mujou", "baseline")[:: 1 if i % 2 == 0 else -1]  # who goes first alternates
        for phase in PHASES:  # save first: the loads read what it wrote
            for side in sides:
                file = "mujou" if phase.endswith("same file)") else side
                runs[phase][side].append(run_child(phase, side, folder / f"{file}.bin", total))
        for side in sides:
            (folder / f"{side}.bin").unlink()
    results = {}
    for phase, sides in runs.items():
        ratios = [m["mb_s"] / b["mb_s"] for m, b in zip(sides["mujou"], sides["baseline"],
                                                         strict=True)]
        results[phase] = {
            **{f"{s}_mb_s": stats([r["mb_s"] for r in rs]) for s, rs in sides.items()},
            "ratio": stats(ratios),
            **{f"{s}_peak_extra_mib": max(r["peak_extra_mib"] for r in rs)
               for s, rs in sides.items()},
        }
    return results


def print_table(results: dict, title: str) -> None:
    header = ["phase", "mujou MB/s", "baseline MB/s", "mujou/baseline",
              "mujou peak extra MiB", "baseline peak extra MiB"]

    def cell(s: dict, fmt: str, sep: str) -> str:
        return f"{s['median']:{fmt}}{sep}{s['min']:{fmt}}–{s['max']:{fmt}}"

    def rows(sep: str) -> list[list[str]]:
        return [[phase, cell(r["mujou_mb_s"], ",.0f", sep), cell(r["baseline_mb_s"], ",.0f", sep),
                 cell(r["ratio"], ".2f", sep), f"{r['mujou_peak_extra_mib']:.1f}",
                 f"{r['baseline_peak_extra_mib']:.1f}"] for phase, r in results.items()]

    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        plain = [header, *rows(" | ")]
        widths = [max(len(x) for x in col) for col in zip(*plain, strict=False)]
        print(f"{title}\n(median | min–max over repetitions; peak extra: the worst)")
        for row in plain:
            print("  ".join(x.ljust(w) if i == 0 else x.rjust(w)
                            for i, (x, w) in enumerate(zip(row, widths, strict=False))))
        return
    table = Table(title=title, caption="MB/s: median, then min–max; peak extra: the worst run")
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in rows("\n"):
        table.add_row(*row)
    Console(width=130).print(table)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        phase, side, path, _, total = sys.argv[2:7]
        print(json.dumps(child(phase, side, Path(path), int(total))))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="total tensor data, GiB")
    ap.add_argument("--quick", action="store_true", help="64 MiB, for CI smoke runs")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = ap.parse_args()
    gib = 1 / 16 if args.quick else args.gib
    total = round(gib * 2**30) // (N_TENSORS * 4096) * (N_TENSORS * 4096)  # whole rows
    if total <= 0 or args.repeat < 1:
        ap.error("--gib must be at least 64 KiB and --repeat >= 1")
    (ROOT / "results").mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(ROOT / "results").free
    if free < 2 * total + 2**30:  # one file at a time, plus a margin
        sys.exit(f"not enough free disk: {free / 2**30:.1f} GiB for a {gib:g} GiB benchmark")

    with tempfile.TemporaryDirectory(prefix=".snapshot-bench-", dir=ROOT / "results") as tmp:
        results = bench(Path(tmp), total, args.repeat)
    title = (f"snapshot: {N_TENSORS} tensors, {total / 2**30:.3g} GiB, "
             f"{args.repeat} reps (CRC-32, fsync)")
    print_table(results, title)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "snapshot", "bytes": total, "gib": total / 2**30, "tensors": N_TENSORS,
           "repeat": args.repeat, "quick": args.quick, "python": platform.python_version(),
           "torch": torch.__version__, "platform": platform.platform(), "phases": results}
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
