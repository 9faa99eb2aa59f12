"""GPU checks for mujou_actors: run this on a machine with a CUDA GPU.

The CPU test suite covers the device *decisions* with a fake runtime; this
script checks what only real hardware can show. Each check is one row of the
table printed at the end (and one entry of the JSON file):

* **pytest -m cuda** runs the tests marked ``cuda`` in a subprocess and
  records how many passed, failed and errored. They are skipped on a machine
  without a GPU, so this is where they actually run.
* **hand-off** runs a sender and a triggered reader, both on ``cuda:0``, under
  the simulated timer. The sender sends a 1M-element float32 CUDA tensor on
  every update. ``torch.profiler`` (CUDA activity) counts the memory copies the
  GPU ran, by kind. A port between two nodes on one device must stay on the
  device: the expected count is one device-to-device copy per send (the
  value-semantics clone made at send) and no host-to-device or device-to-host
  copy at all. The reader also checks that every message arrived intact.
  A second, unprofiled run gives the time per update.
* **wait cpu** runs one CUDA node whose ``on_update`` queues a chain of
  matmuls lasting about ``--kernel-ms`` on its stream, so its worker then waits
  for the GPU. The process CPU time (``time.process_time``, every thread)
  spent in the run is compared between ``cuda_sync="spin"``, ``"yield"`` and
  ``"block"``. A spinning worker keeps a core busy for the whole wait; a
  blocking one sleeps, so ``block`` should use a small fraction of ``spin``'s
  CPU time.

Without CUDA the script prints ``no CUDA device: nothing to check`` and exits 0,
so CI can smoke-run it. With CUDA it exits 1 when a check fails.

Usage::

    python benchmarks/gpu_check.py [--json PATH] [--updates 1000]
                                   [--kernel-ms 200] [--waits 5] [--no-pytest]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import mujou_actors as mujou

ROOT = Path(__file__).resolve().parent.parent
NUMEL = 1 << 20  # 1M float32 elements: 4 MiB per message


def check_pytest() -> dict[str, Any]:
    """Run the ``cuda``-marked tests in a subprocess and count the outcomes."""
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
    counts = {k: 0 for k in ("passed", "failed", "errors", "skipped")}
    for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", tail[0]):
        counts["errors" if word.startswith("error") else word] += int(n)
    ok = proc.returncode == 0 and counts["passed"] > 0
    return {"ok": ok, "returncode": proc.returncode, **counts, "summary": tail[0]}


class Sender(mujou.Node):
    out = mujou.Output(torch.Tensor, dtype=torch.float32)

    def on_start(self) -> None:
        self.buf = torch.zeros(NUMEL, device=self.device)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.buf.fill_(float(self.n))
        self.out.send(self.buf)
        self.buf.fill_(-1.0)  # the message was copied at send: readers never see this


class Reader(mujou.Node):
    inp = mujou.Input(torch.Tensor, depth=1)

    def on_start(self) -> None:
        self.total = torch.zeros((), dtype=torch.float64, device=self.device)
        self.bad = torch.zeros((), dtype=torch.int64, device=self.device)

    def on_update(self, dt: float) -> None:
        for msg in self.inp.drain():  # stays on the GPU: no host sync here
            self.total += msg[0].double()
            self.bad += (msg != msg[0]).sum()


def _hand_off(updates: int, profile: bool) -> tuple[float, dict[str, int], bool]:
    period = 0.001
    sender, reader = Sender(period=period, device="cuda:0"), Reader(period=None, device="cuda:0")
    mujou.connect(sender.out, reader.inp)
    net = {"sender": sender, "reader": reader}
    copies = {"HtoD": 0, "DtoH": 0, "DtoD": 0, "other": 0}
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    t0 = time.perf_counter()
    if profile:
        with torch.profiler.profile(activities=acts) as prof:
            mujou.run(net, timer="simulated", duration=updates * period, workers=2).join()
        for event in prof.events():
            if event.name.startswith("Memcpy"):  # GPU activity; "cudaMemcpy*" is the CPU call
                kind = next((k for k in ("HtoD", "DtoH", "DtoD") if k in event.name), "other")
                copies[kind] += 1
    else:
        mujou.run(net, timer="simulated", duration=updates * period, workers=2).join()
    wall = time.perf_counter() - t0
    intact = (reader.bad.item() == 0
              and reader.total.item() == updates * (updates + 1) / 2)
    return wall, copies, intact


def check_hand_off(updates: int) -> dict[str, Any]:
    """Memcpy kinds and time per update of a cuda:0 -> cuda:0 port."""
    _hand_off(20, profile=False)  # warm up: CUDA context, allocator, kernels
    wall, _, intact_timed = _hand_off(updates, profile=False)
    _, copies, intact = _hand_off(updates, profile=True)
    ok = (intact and intact_timed and copies["HtoD"] == 0 and copies["DtoH"] == 0
          and copies["DtoD"] == updates)
    return {"ok": ok, "updates": updates, "us_per_update": wall / updates * 1e6,
            "intact": intact and intact_timed, "memcpy": copies}


class LongKernel(mujou.Node):
    def __init__(self, chain: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.chain = chain

    def on_start(self) -> None:
        self.a = torch.randn(4096, 4096, device=self.device, generator=self.generator) / 64
        self.x = torch.randn(4096, 4096, device=self.device, generator=self.generator)

    def on_update(self, dt: float) -> None:
        for _ in range(self.chain):  # queued at once; the worker then waits for the GPU
            self.x = self.a @ self.x


def _chain_length(kernel_ms: float) -> tuple[int, float]:
    """Matmuls in a chain of about ``kernel_ms`` ms on this GPU."""
    a = torch.randn(4096, 4096, device="cuda:0")
    x = a @ a
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        x = a @ x
    end.record()
    end.synchronize()
    per = start.elapsed_time(end) / 10
    chain = max(1, round(kernel_ms / per))
    return chain, chain * per


def check_wait_cpu(kernel_ms: float, waits: int) -> dict[str, Any]:
    """Process CPU time while a worker waits for a long kernel, per cuda_sync."""
    chain, chain_ms = _chain_length(kernel_ms)
    modes: dict[str, dict[str, float]] = {}
    for mode in ("spin", "yield", "block"):
        node = LongKernel(chain, period=1.0, device="cuda:0")
        c0, t0 = time.process_time(), time.perf_counter()
        mujou.run(node, timer="simulated", duration=float(waits), workers=1,
                  cuda_sync=mode).join()
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        modes[mode] = {"cpu_s": cpu, "wall_s": wall, "cpu_per_wall": cpu / wall}
    ok = modes["block"]["cpu_s"] < 0.5 * modes["spin"]["cpu_s"]
    return {"ok": ok, "chain": chain, "chain_ms": chain_ms, "waits": waits, "modes": modes}


def _guarded(fn: Any, *args: Any) -> dict[str, Any]:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - a check that breaks is reported, not fatal
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def _rows(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    for name, res in results["checks"].items():
        if "error" in res:
            detail = res["error"]
        elif name == "pytest -m cuda":
            detail = res["summary"]
        elif name == "hand-off":
            m = res["memcpy"]
            detail = (f"{res['us_per_update']:.1f} us/update; memcpy HtoD {m['HtoD']} "
                      f"DtoH {m['DtoH']} DtoD {m['DtoD']} other {m['other']} "
                      f"({res['updates']} sends); intact {res['intact']}")
        else:
            detail = f"chain {res['chain_ms']:.0f} ms x {res['waits']}; " + ", ".join(
                f"{k} {v['cpu_s']:.2f} s CPU / {v['wall_s']:.2f} s"
                for k, v in res["modes"].items())
        rows.append((name, "ok" if res["ok"] else "FAIL", detail))
    return rows


def _print_table(results: dict[str, Any]) -> None:
    rows = _rows(results)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(results["device"])
        for row in rows:
            print(" | ".join(row))
        return
    table = Table(title=f"mujou_actors GPU check: {results['device']}")
    for col in ("check", "result", "detail"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/gpu_check.json")
    parser.add_argument("--updates", type=int, default=1000, help="sends in the hand-off")
    parser.add_argument("--kernel-ms", type=float, default=200.0, help="GPU work per update")
    parser.add_argument("--waits", type=int, default=5, help="updates per cuda_sync mode")
    parser.add_argument("--no-pytest", action="store_true", help="skip the cuda tests")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0

    checks: dict[str, Any] = {}
    if not args.no_pytest:
        checks["pytest -m cuda"] = _guarded(check_pytest)
    checks["hand-off"] = _guarded(check_hand_off, args.updates)
    checks["wait cpu"] = _guarded(check_wait_cpu, args.kernel_ms, args.waits)
    results = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "cuda": torch.version.cuda, "checks": checks}
    _print_table(results)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0 if all(c["ok"] for c in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
