"""GPU checks for mujou_actors: every rule of docs/devices.md that only hardware can prove.

The CPU test suite checks the device *decisions* with fake runtimes; this
script runs real nets on a CUDA GPU and checks what the GPU does. Each check
is one row of the table printed at the end and one entry of the JSON file, and
each has a **control**: the same measurement on a run where the rule is broken
on purpose (``record_stream`` patched out, the host's waits patched out, a
host-path port, another seed, ...), which must show the failure. A check
whose control does not fail proves nothing, and counts as a failure.

Checks (JSON key: what it shows; its control):

* ``pytest``: the tests marked ``cuda`` pass (they are skipped without a GPU).
* ``handoff``: a cuda:0 -> cuda:0 port makes one device-to-device copy per
  send and no host copy (``torch.profiler``), data intact; control: a host-path
  port (a CPU reader) in the same profiler shows its device-to-host copies.
* ``alloc-device`` / ``alloc-write``: the caching allocator never hands a
  message's memory to a new one while a reader still reads it: 200+ messages
  on the realtime timer, several workers, readers that read late on purpose
  (``torch.cuda._sleep`` on their stream before reading), every sum compared
  with the CPU reference; on the device path and through ``run.write``.
  Control: the same run with ``record_stream`` patched out reports corruption.
* ``wait-cpu``: process CPU time while the GPU runs long kernels, with every
  wait of the run in turn on the critical path (after ``on_update``, a send to
  CPU readers, a CPU reader of a device-path message, a CPU message to a CUDA
  reader, the host's read / wait_for / subscribe / state_dict, ``run.write``):
  with ``cuda_sync="block"`` well under the GPU time; control: ``"spin"``,
  which must use about a core for the whole GPU time.
* ``sync-waits``: ``mujou.cuda.set_sync_mode("block")`` in a fresh process
  makes CUDA's own waits (``.item()``) sleep; control: a fresh process with
  ``"spin"``.
* ``sync-api``: the mode reads back, a different mode is refused once the
  context is active, the same one is accepted, and what the driver does with a
  flag set on an active context (reported, not judged); control: ``"spin"``
  reads back as ``"spin"``.
* ``host-reads``: ``run.read`` of a CUDA node's Output and Input while the
  sender is late (its kernels wait before they write) never returns stale
  memory; controls: the same run with the host's event and stream waits patched
  out returns stale data, and with only the wait for a CUDA Input's kept values
  (``Wiring.wait_kept``) patched out, stale Input reads.
* ``mixed``: a message mixing CUDA and CPU tensors (and another GPU's, with
  two GPUs) reaches a CUDA reader with every tensor on its device, a CPU
  reader with every tensor on the CPU, values intact; control: the same run
  with the receive path's per-tensor routing patched out (a CUDA reader gets
  the message's CPU tensors as sent) must be flagged by the same detector.
* ``streams``: ``torch.cuda.current_stream()`` in every hook of a CUDA node
  (on_start, on_update, on_stop, state_dict, load_state_dict) is one stream,
  its own, not the default one; a CPU node that runs on the same (single)
  worker afterwards sees the default stream; control: the same runs with the
  node's stream context (``Actor.on_stream``) patched to enter the default
  stream instead of the node's must be flagged by the same detector.
* ``sync-debug``: with ``torch.cuda.set_sync_debug_mode("error")`` during a
  cuda:0 -> cuda:0 hand-off nothing raises; control: a host-path port under
  the same mode raises, or, where the host path makes only calls the debug
  mode does not flag (non-blocking copies into pinned memory, event waits), a
  reader that calls ``.item()`` in its hook must raise (the row says which).
* ``state``: a CUDA node's generator and tensors through ``state_dict`` and a
  restore continue bit-identically to an uninterrupted run, and a CUDA tree
  into a CPU node is refused naming ``generator``; control: the tree with the
  generator's state replaced by a seed continues differently.
* ``many-nodes``: 40 CUDA nodes on one device (past the 32 streams of torch's
  pool, so streams are shared), late readers: messages intact; control: the
  same run with ``record_stream`` patched out reports corruption.
* ``workers``: a simulated net of CUDA nodes (generator draws, matmuls) is
  bit-identical for 1, 2 and 4 workers; control: another seed differs.
* ``example``: examples/gpu_pipeline.py gives the same forces and trajectory
  with its models on the CPU and on the GPU, within ``EXAMPLE_TOL``; control:
  other weights differ by more than that.
* ``two-gpus``: cuda:0 -> cuda:1 without host copies (skipped, and said so,
  with one GPU); control: a host-path port shows its host copies.
* ``cuda-ipc``: a 4 MiB CUDA tensor from one process to another through the
  data plane's encoding with CUDA IPC (`distributed.cudaipc`, as two groups
  on one machine): values equal to the sender's, the receiver's tensor on its
  device, neither process copying to or from the host (``torch.profiler`` in
  each), each export released back; the hop time beside the host path's.
  Control: the host path in the same harness shows its device-to-host copies.
  Skipped in the dry run (it needs CUDA in two processes).

``--dry-run`` runs every check's nets, ports, runs and state round trips on
the CPU, with CPU devices in place of the CUDA ones and small sizes, in a few
seconds: the GPU-only measurements and the controls that need CUDA are not
made (the row says so, status ``dry-ok``), but the script cannot rot: the
test suite runs it. Without CUDA and without ``--dry-run`` the script says so
and exits 0.

Usage::

    python benchmarks/gpu_check.py [--json PATH] [--only KEY,KEY] [--no-pytest]
                                   [--updates 1000] [--kernel-ms 300] [--waits 3]
    python benchmarks/gpu_check.py --dry-run

Exit status: 0 when every check that ran passed, 1 when one failed, 2 for a
bad command line.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import hashlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # check the repository this script is in, installed or not
    sys.path.insert(0, str(ROOT))

import mujou_actors as mujou  # noqa: E402
from mujou_actors import devices as mujou_devices  # noqa: E402
from mujou_actors._runtime.build import Wiring  # noqa: E402

NUMEL = 1 << 20  # 1M float32 elements: 4 MiB per message (hand-off)
EXAMPLE_TOL = 1e-4  # max |CPU - GPU| of the example's forces (N) and positions (m)
BLOCK_MAX = 0.3  # "block": process CPU time at most this share of the GPU time
SPIN_MIN = 0.7  # "spin" (the control): at least this share


@dataclasses.dataclass
class Env:
    """Where the checks run and how big they are."""

    dry: bool  # the CPU dry run
    dev: torch.device  # the "CUDA" device of the checks: cuda:0, or cpu in the dry run
    dev1: torch.device | None  # a second GPU, if any
    args: argparse.Namespace
    cycles_per_ms: float = 0.0  # torch.cuda._sleep cycles per millisecond

    def sleep(self, ms: float) -> None:
        """Delay the current stream by ``ms`` on the GPU (nothing in the dry run)."""
        if not self.dry and ms > 0:
            torch.cuda._sleep(int(ms * self.cycles_per_ms))

    def size(self, gpu: int, dry: int) -> int:
        """``gpu``, or the small ``dry`` in the dry run."""
        return dry if self.dry else gpu


def _calibrate_sleep() -> float:
    """``torch.cuda._sleep`` cycles per millisecond on this GPU."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / start.elapsed_time(end)


def _result(env: Env, ok: bool, detail: str, control: str, **data: Any) -> dict[str, Any]:
    status = "FAIL" if not ok else ("dry-ok" if env.dry else "ok")
    return {"status": status, "detail": detail, "control": control, **data}


def _skipped(why: str, **data: Any) -> dict[str, Any]:
    return {"status": "skipped", "detail": why, "control": "-", **data}


def _error_text(exc: BaseException) -> str:
    """The exception and its causes, one line (the names a check looks for)."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return " <- ".join(parts)


@contextlib.contextmanager
def _no_record_stream() -> Iterator[None]:
    """The control of the allocator checks: ``record_stream`` does nothing."""
    def nop(*_: Any, **__: Any) -> None:
        return None

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.Tensor, "record_stream", nop))
        if hasattr(mujou_devices.CudaRuntime, "record_stream"):
            stack.enter_context(mock.patch.object(mujou_devices.CudaRuntime, "record_stream", nop))
        yield


@contextlib.contextmanager
def _no_host_waits() -> Iterator[None]:
    """The control of the host-read check: every CPU-side wait on CUDA returns at once."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.cuda.Event, "synchronize", lambda s: None))
        stack.enter_context(mock.patch.object(torch.cuda.Event, "query", lambda s: True))
        stack.enter_context(mock.patch.object(torch.cuda.Stream, "synchronize", lambda s: None))
        yield


def _dry_note(env: Env, what: str) -> str:
    return f" ({what}: not in the dry run)" if env.dry else ""


# ---------------------------------------------------------------------------
# pytest -m cuda


def check_pytest(env: Env) -> dict[str, Any]:
    """Run the ``cuda``-marked tests in a subprocess and count the outcomes."""
    if env.dry:
        return _skipped("dry run: the cuda tests need a GPU")
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
    counts = {k: 0 for k in ("passed", "failed", "errors", "skipped")}
    for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", tail[0]):
        counts["errors" if word.startswith("error") else word] += int(n)
    ok = proc.returncode == 0 and counts["passed"] > 0
    return _result(env, ok, tail[0], "a test fails when its rule breaks",
                   returncode=proc.returncode, **counts)


# ---------------------------------------------------------------------------
# hand-off: copies by kind


class Sender(mujou.Node):
    """Sends its buffer filled with the update count, then overwrites it."""

    out = mujou.Output(torch.Tensor, dtype=torch.float32)

    def __init__(self, numel: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.numel = numel

    def on_start(self) -> None:
        self.buf = torch.zeros(self.numel, device=self.device)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.buf.fill_(float(self.n))
        self.out.send(self.buf)
        self.buf.fill_(-1.0)  # the message was copied at send: readers never see this


class Reader(mujou.Node):
    """Sums what it reads, and counts elements that differ from the first one."""

    inp = mujou.Input(torch.Tensor, depth=None)

    def on_start(self) -> None:
        self.total = torch.zeros((), dtype=torch.float64, device=self.device)
        self.bad = torch.zeros((), dtype=torch.int64, device=self.device)
        self.count = 0

    def on_update(self, dt: float) -> None:
        for msg in self.inp.drain():  # no host sync here
            self.total += msg[0].double()
            self.bad += (msg != msg[0]).sum()
            self.count += 1


def _profiled_hand_off(env: Env, updates: int, reader_device: torch.device, *,
                       profile: bool, sender_device: torch.device | None = None
                       ) -> tuple[float, dict[str, int], bool, int]:
    """Run sender -> reader; (wall s, GPU memcpy counts by kind, data intact, sends)."""
    period = 0.001
    numel = env.size(NUMEL, 1024)
    sender = Sender(numel, period=period, device=sender_device or env.dev)
    reader = Reader(period=None, device=reader_device)
    mujou.connect(sender.out, reader.inp)
    net = {"sender": sender, "reader": reader}
    copies = {"HtoD": 0, "DtoH": 0, "DtoD": 0, "PtoP": 0, "other": 0}
    t0 = time.perf_counter()
    if profile and not env.dry:
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            mujou.run(net, timer="simulated", duration=updates * period, workers=2).join()
        for event in prof.events():
            if event.name.startswith("Memcpy"):  # GPU activity; "cudaMemcpy*" is the CPU call
                kinds = ("HtoD", "DtoH", "DtoD", "PtoP")
                copies[next((k for k in kinds if k in event.name), "other")] += 1
    else:
        mujou.run(net, timer="simulated", duration=updates * period, workers=2).join()
    wall = time.perf_counter() - t0
    sent = sender.n
    intact = (reader.count == sent and int(reader.bad) == 0
              and float(reader.total) == sent * (sent + 1) / 2)
    return wall, copies, intact, sent


def check_handoff(env: Env) -> dict[str, Any]:
    """cuda:0 -> cuda:0: one device copy per send, no host copy, data intact."""
    updates = env.size(env.args.updates, 20)
    _profiled_hand_off(env, 20, env.dev, profile=False)  # warm up: context, allocator
    wall, _, intact_timed, _ = _profiled_hand_off(env, updates, env.dev, profile=False)
    _, copies, intact, sent = _profiled_hand_off(env, updates, env.dev, profile=True)
    _, host_copies, host_intact, host_sent = _profiled_hand_off(
        env, updates, torch.device("cpu"), profile=True)
    detail = (f"{wall / sent * 1e6:.1f} us/update, {sent} sends, intact "
              f"{intact and intact_timed}")
    if env.dry:
        return _result(env, intact and intact_timed and host_intact,
                       detail + _dry_note(env, "memcpy counts"), "not in the dry run")
    ok_main = (copies["HtoD"] == 0 and copies["DtoH"] == 0 and copies["DtoD"] == sent)
    control_fails = host_copies["DtoH"] >= host_sent  # the counter sees host copies
    detail += f"; memcpy {copies} (DtoD {sent} expected)"
    control = f"host-path port: DtoH {host_copies['DtoH']} (>= {host_sent} expected)"
    return _result(env, intact and intact_timed and host_intact and ok_main and control_fails,
                   detail, control, memcpy=copies, control_memcpy=host_copies,
                   us_per_update=wall / sent * 1e6)


# ---------------------------------------------------------------------------
# allocator reuse: late readers


class Msg(NamedTuple):
    """A numbered message: ``x`` is filled with ``n``."""

    n: int
    x: torch.Tensor


class CountingSender(mujou.Node):
    """Sends ``Msg(n, full(n))`` on every update, a fresh tensor each time."""

    out = mujou.Output(Msg)

    def __init__(self, numel: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.numel = numel
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.out.send(Msg(self.n, torch.full((self.numel,), float(self.n), device=self.device)))


class LateReader(mujou.Node):
    """Reads every message late on purpose: its stream sleeps before each sum.

    The messages are dropped when the hook returns, while the stream has not
    read them yet: only ``record_stream`` (or a held reference) keeps the
    allocator from giving their memory to a new message in the meantime.
    """

    inp = mujou.Input(Msg, depth=None)

    def __init__(self, env: Env, sleep_ms: float, device: torch.device,
                 done: threading.Event | None = None, expect: int = 0) -> None:
        super().__init__(period=None, device=device)
        self.env, self.sleep_ms, self.done, self.expect = env, sleep_ms, done, expect
        self.seen: list[tuple[int, torch.Tensor]] = []

    def on_update(self, dt: float) -> None:
        for msg in self.inp.drain():
            self.env.sleep(self.sleep_ms)  # on this node's stream: the sum reads late
            self.seen.append((msg.n, msg.x.sum(dtype=torch.float64)))
        if self.done is not None and len(self.seen) >= self.expect:
            self.done.set()


def _corrupted(readers: list[LateReader], numel: int) -> tuple[int, int]:
    """(messages read, messages whose sum is not the CPU reference n * numel)."""
    seen = [(n, float(s)) for r in readers for n, s in r.seen]
    return len(seen), sum(1 for n, s in seen if s != n * numel)


def _late_device_path(env: Env, pairs: int, period: float, duration: float,
                      sleep_ms: float, numel: int) -> tuple[int, int]:
    net: dict[str, mujou.Node] = {}
    readers = []
    for i in range(pairs):
        sender = CountingSender(numel, period=period, device=env.dev)
        reader = LateReader(env, sleep_ms, env.dev)
        mujou.connect(sender.out, reader.inp)
        net[f"sender{i}"], net[f"reader{i}"] = sender, reader
        readers.append(reader)
    mujou.run(net, timer="realtime", duration=duration, workers=4).join()
    return _corrupted(readers, numel)


def _allocator_result(env: Env, main: tuple[int, int], control: tuple[int, int] | None,
                      want: int) -> dict[str, Any]:
    (seen, bad) = main
    detail = f"{seen} messages read late, {bad} corrupted (CPU reference)"
    if control is None:
        return _result(env, seen > 0 and bad == 0, detail, "not in the dry run",
                       messages=seen, corrupted=bad)
    c_seen, c_bad = control
    ok = seen >= want and bad == 0 and c_bad > 0
    text = f"record_stream patched out: {c_bad} of {c_seen} corrupted"
    if c_bad == 0:
        text += " (the check cannot see the defect here)"
    return _result(env, ok, detail, text, messages=seen, corrupted=bad,
                   control_messages=c_seen, control_corrupted=c_bad)


def _late_device_path_and_control(env: Env, **kw: Any) -> tuple[Any, Any]:
    """The late-reader run, and (off the dry run) the same run with record_stream patched out."""
    main = _late_device_path(env, **kw)
    if env.dry:
        return main, None
    with _no_record_stream():
        return main, _late_device_path(env, **kw)


def check_alloc_device(env: Env) -> dict[str, Any]:
    """Device path: late CUDA readers of a CUDA sender, on several workers."""
    numel = env.size(1 << 18, 1024)
    # A reader's stream sleeps 1 ms per message, as long as the sender's
    # period: it falls behind, so blocks are freed while still unread.
    kw = dict(pairs=2, period=0.001, duration=env.size(400, 50) / 1000,
              sleep_ms=0.0 if env.dry else 1.0, numel=numel)
    main, control = _late_device_path_and_control(env, **kw)
    return _allocator_result(env, main, control, want=200)


def _late_write_path(env: Env, count: int, sleep_ms: float, numel: int) -> tuple[int, int]:
    done = threading.Event()
    reader = LateReader(env, sleep_ms, env.dev, done=done, expect=count)
    run = mujou.run({"reader": reader}, timer="realtime", workers=4)
    try:
        for n in range(1, count + 1):
            # The host's own tensor, freed right after the write: the host's
            # stream may reuse the memory at once for the next one.
            run.write(reader.inp, Msg(n, torch.full((numel,), float(n), device=env.dev)))
            time.sleep(0.0005)  # let the reader drop messages while writes go on
        done.wait(30.0)
    finally:
        run.stop()
        run.join()
    return _corrupted([reader], numel)


def check_alloc_write(env: Env) -> dict[str, Any]:
    """``run.write`` of CUDA tensors into a late CUDA reader."""
    numel = env.size(1 << 18, 1024)
    count = env.size(250, 30)
    sleep_ms = 0.0 if env.dry else 1.0  # the host writes every ~0.5 ms: the reader lags
    main = _late_write_path(env, count, sleep_ms, numel)
    control = None
    if not env.dry:
        with _no_record_stream():
            control = _late_write_path(env, count, sleep_ms, numel)
    return _allocator_result(env, main, control, want=count)


# ---------------------------------------------------------------------------
# CPU time of the run's waits


class Chain(mujou.Node):
    """Queues about ``chain`` matmuls on its stream per update; may send a slice."""

    out = mujou.Output(torch.Tensor)
    inp = mujou.Input(torch.Tensor, depth=1, trigger=False)

    def __init__(self, chain: int, size: int, sends: bool, **kw: Any) -> None:
        super().__init__(**kw)
        self.chain, self.size, self.sends = chain, size, sends
        self.updates = 0

    def on_start(self) -> None:
        self.a = torch.randn(self.size, self.size, device=self.device,
                             generator=self.generator) / self.size ** 0.5
        self.x = torch.randn(self.size, self.size, device=self.device, generator=self.generator)

    def on_update(self, dt: float) -> None:
        for _ in range(self.chain):  # queued at once; the waits come after
            self.x = self.a @ self.x
        self.updates += 1
        if self.sends:
            self.out.send(self.x[0, :8])


class Sink(mujou.Node):
    """Counts what it reads."""

    inp = mujou.Input(torch.Tensor, depth=None)

    def __init__(self, **kw: Any) -> None:
        super().__init__(period=None, **kw)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += len(self.inp.drain())


class Ticker(mujou.Node):
    """A CPU node sending a small CPU tensor every period."""

    out = mujou.Output(torch.Tensor)

    def on_update(self, dt: float) -> None:
        self.out.send(torch.zeros(8))


def _chain_length(env: Env, kernel_ms: float, size: int) -> tuple[int, float]:
    """Matmuls in a chain of about ``kernel_ms`` ms on this GPU, and its length in ms."""
    if env.dry:
        return 2, 0.0
    a = torch.randn(size, size, device=env.dev)
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


def _wait_scenarios() -> dict[str, Callable[..., tuple[int, int]]]:
    """Each builds a net (and host activity) whose GPU time sits behind one kind of wait.

    Each takes (env, chain, size, waits, period, mode) and returns (updates of
    the long chain, messages that arrived).
    """
    def run_net(env: Env, net: dict[str, mujou.Node], period: float, waits: int,
                mode: str) -> None:
        mujou.run(net, timer="realtime", duration=(waits - 0.5) * period, workers=2,
                  cuda_sync=mode).join()

    def after_update(env, chain, size, waits, period, mode):
        node = Chain(chain, size, False, period=period, device=env.dev)
        run_net(env, {"chain": node}, period, waits, mode)
        return node.updates, node.updates

    def host_path_send(env, chain, size, waits, period, mode):
        node = Chain(chain, size, True, period=period, device=env.dev)
        sink = Sink()  # only CPU readers: the send copies to the host, waiting for the chain
        mujou.connect(node.out, sink.inp)
        run_net(env, {"chain": node, "sink": sink}, period, waits, mode)
        return node.updates, sink.count

    def cpu_reader_of_device_path(env, chain, size, waits, period, mode):
        node = Chain(chain, size, True, period=period, device=env.dev)
        gpu, cpu = Sink(device=env.dev), Sink()  # a CUDA reader: the device path
        mujou.connect(node.out, gpu.inp)
        mujou.connect(node.out, cpu.inp)
        run_net(env, {"chain": node, "gpu": gpu, "cpu": cpu}, period, waits, mode)
        return node.updates, cpu.count

    def cpu_message_to_cuda_reader(env, chain, size, waits, period, mode):
        # No thread waits for this copy (docs/devices.md: it is queued on the
        # reader's stream, which the reader's own waits cover): the scenario
        # shows that it adds no spinning wait to the net's.
        ticker = Ticker(period=period / 2)
        node = Chain(chain, size, False, period=period, device=env.dev)
        mujou.connect(ticker.out, node.inp)
        run_net(env, {"ticker": ticker, "chain": node}, period, waits, mode)
        return node.updates, node.updates

    def host_reads(env, chain, size, waits, period, mode):
        node = Chain(chain, size, True, period=period, device=env.dev)
        gpu = Sink(device=env.dev)
        mujou.connect(node.out, gpu.inp)
        got = []
        run = mujou.run({"chain": node, "gpu": gpu}, timer="realtime", workers=2,
                        cuda_sync=mode)
        try:
            run.subscribe(node.out, got.append)
            for _ in range(waits):
                run.wait_for(node.out, timeout=30.0)
                run.read(node.out)
            run.state_dict(timeout=30.0)  # a cut: the Output's message to the host
        finally:
            run.stop()
            run.join()
        return node.updates, len(got)

    def host_write(env, chain, size, waits, period, mode):
        sink = Sink(device=env.dev)
        a = torch.randn(size, size, device=env.dev) / size ** 0.5
        x = torch.randn(size, size, device=env.dev)
        run = mujou.run({"sink": sink}, timer="realtime", workers=2, cuda_sync=mode)
        try:
            for _ in range(waits):
                for _ in range(chain):  # on the host's current stream
                    x = a @ x
                run.write(sink.inp, x[0, :8])  # waits for the host's stream
                time.sleep(period / 2)
        finally:
            run.stop()
            run.join()
        return waits, sink.count

    return {"after on_update": after_update, "send to CPU readers": host_path_send,
            "CPU reader, device path": cpu_reader_of_device_path,
            "CPU message to CUDA reader": cpu_message_to_cuda_reader,
            "host read/wait_for/subscribe/cut": host_reads, "run.write": host_write}


def check_wait_cpu(env: Env) -> dict[str, Any]:
    """Process CPU time per scenario and cuda_sync mode, against the GPU time."""
    size = env.size(4096, 32)
    chain, chain_ms = _chain_length(env, env.args.kernel_ms, size)
    waits = env.size(env.args.waits, 2)
    period = 0.02 if env.dry else 2 * chain_ms / 1000
    scenarios: dict[str, dict[str, Any]] = {}
    ok = True
    for name, scenario in _wait_scenarios().items():
        modes = {}
        for mode in ("spin", "block"):
            c0, t0 = time.process_time(), time.perf_counter()
            chains, arrived = scenario(env, chain, size, waits, period, mode)
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            gpu = chains * chain_ms / 1000
            modes[mode] = {"cpu_s": cpu, "wall_s": wall, "gpu_s": gpu, "chains": chains,
                           "arrived": arrived}
            ok = ok and chains > 0 and arrived > 0
        if not env.dry:
            s, b = modes["spin"], modes["block"]
            ok = ok and b["cpu_s"] < BLOCK_MAX * b["gpu_s"] and s["cpu_s"] > SPIN_MIN * s["gpu_s"]
        scenarios[name] = modes

    def share(m: dict[str, Any]) -> str:
        return f"{m['cpu_s'] / m['gpu_s']:.2f}" if m["gpu_s"] else "-"

    detail = "CPU/GPU time, block: " + ", ".join(
        f"{k} {share(v['block'])}" for k, v in scenarios.items())
    control = "spin: " + ", ".join(f"{k} {share(v['spin'])}" for k, v in scenarios.items())
    if env.dry:
        detail = f"{len(scenarios)} scenarios x 2 modes ran" + _dry_note(env, "CPU times")
        control = "not in the dry run"
    else:
        detail += f" (< {BLOCK_MAX}; chain {chain_ms:.0f} ms x {waits})"
        control += f" (> {SPIN_MIN})"
    return _result(env, ok, detail, control, chain=chain, chain_ms=chain_ms,
                   scenarios=scenarios)


# ---------------------------------------------------------------------------
# mujou.cuda.set_sync_mode, in fresh processes


def _implicit_wait_cpu(kernel_ms: float, waits: int) -> dict[str, float]:
    """CPU time of CUDA's own waits (``.item()``) behind long kernels on cuda:0."""
    env = Env(False, torch.device("cuda:0"), None, argparse.Namespace())
    chain, chain_ms = _chain_length(env, kernel_ms, 4096)
    a = torch.randn(4096, 4096, device="cuda:0") / 64
    x = torch.randn(4096, 4096, device="cuda:0")
    c0 = time.process_time()
    for _ in range(waits):
        for _ in range(chain):
            x = a @ x
        x[0, 0].item()
    cpu = time.process_time() - c0
    return {"cpu_s": cpu, "gpu_s": waits * chain_ms / 1000}


def child_sync_mode(mode: str, kernel_ms: float, waits: int, dry: bool) -> dict[str, Any]:
    """What ``set_sync_mode(mode)`` does in this (fresh) process; see ``check_sync_*``."""
    out: dict[str, Any] = {"mode": mode}
    for key, call in (("before", lambda: mujou.cuda.get_sync_mode(0)),
                      ("set", lambda: mujou.cuda.set_sync_mode(mode))):
        try:
            out[key] = call()
        except mujou.cuda.SyncModeError as exc:
            out[key] = f"SyncModeError: {exc}"
    if dry or not torch.cuda.is_available():
        return out
    out["read_back"] = mujou.cuda.get_sync_mode(0)
    out["implicit"] = _implicit_wait_cpu(kernel_ms, waits)  # the context is active now
    out["read_back_active"] = mujou.cuda.get_sync_mode(0)
    other = "spin" if mode != "spin" else "block"
    for key, m in (("too_late", other), ("same_mode_active", mode)):
        try:
            out[key] = f"accepted: {mujou.cuda.set_sync_mode(m, 0)}"
        except mujou.cuda.SyncModeError as exc:
            out[key] = f"refused: {exc}"
    # What the driver itself does with a flag set on the active context.
    drv = mujou.cuda._driver()
    _, dev = drv.device_get(0)
    _, flags_now, _ = drv.primary_ctx_get_state(dev)
    # Only the scheduling bits (CU_CTX_SCHED_MASK, 0x7) change, as set_sync_mode does.
    code = drv.primary_ctx_set_flags(dev, (flags_now & ~7) | {"spin": 1, "block": 4}[other])
    _, flags, active = drv.primary_ctx_get_state(dev)
    out["driver_on_active"] = {"set_flags": drv.error_name(code) or str(code),
                               "flags_read_back": flags & 7, "active": active,
                               "implicit_after": _implicit_wait_cpu(kernel_ms, waits)}
    return out


def _sync_children(env: Env) -> dict[str, dict[str, Any]]:
    cache = getattr(env, "_sync_children", None)
    if cache is not None:
        return cache
    cache = {}
    for mode in (("block",) if env.dry else ("spin", "block")):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child-sync-mode", mode,
               "--kernel-ms", str(env.args.kernel_ms), "--waits", str(env.args.waits)]
        if env.dry:
            cmd.append("--dry-run")
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"child for {mode!r} exited {proc.returncode}: "
                               f"{proc.stderr.strip()[-2000:]}")
        cache[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    env._sync_children = cache  # type: ignore[attr-defined]
    return cache


def check_sync_waits(env: Env) -> dict[str, Any]:
    """``set_sync_mode("block")`` first in a fresh process: ``.item()`` sleeps."""
    kids = _sync_children(env)
    if env.dry:
        return _result(env, "set" in kids["block"],
                       f"child ran: set {str(kids['block']['set'])[:70]}"
                       + _dry_note(env, "CPU times"), "not in the dry run", children=kids)
    b, s = kids["block"]["implicit"], kids["spin"]["implicit"]
    ok = b["cpu_s"] < BLOCK_MAX * b["gpu_s"] and s["cpu_s"] > SPIN_MIN * s["gpu_s"]
    return _result(env, ok, f"block: CPU {b['cpu_s']:.2f} s for GPU {b['gpu_s']:.2f} s",
                   f"spin: CPU {s['cpu_s']:.2f} s for GPU {s['gpu_s']:.2f} s", children=kids)


def check_sync_api(env: Env) -> dict[str, Any]:
    """Read back, refusal when too late, and the driver's answer on an active context."""
    kids = _sync_children(env)
    b = kids["block"]
    if env.dry:
        ok = str(b["set"]).startswith(("SyncModeError", "block"))
        return _result(env, ok, f"before: {str(b['before'])[:50]}; set: {str(b['set'])[:50]}",
                       "not in the dry run", children=kids)
    d = b["driver_on_active"]
    ok = (b["set"] == "block" and b["read_back"] == "block"
          and b["read_back_active"] == "block" and b["too_late"].startswith("refused")
          and b["same_mode_active"] == "accepted: block"
          and kids["spin"]["read_back"] == "spin")
    imp = d["implicit_after"]
    detail = (f"read back {b['read_back']}; spin when active: {b['too_late'][:60]}; "
              f"block again: {b['same_mode_active']}; driver on the active context: "
              f"{d['set_flags']}, flags read back {d['flags_read_back']}, then .item() "
              f"CPU {imp['cpu_s']:.2f} s for GPU {imp['gpu_s']:.2f} s")
    return _result(env, ok, detail, f"spin reads back {kids['spin']['read_back']}",
                   children=kids)


# ---------------------------------------------------------------------------
# host reads while the sender is late


class LateFill(mujou.Node):
    """Sends ``Msg(n, x)`` where ``x`` is written only after a GPU-side sleep."""

    out = mujou.Output(Msg)

    def __init__(self, env: Env, numel: int, sleep_ms: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.env, self.numel, self.sleep_ms, self.n = env, numel, sleep_ms, 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        x = torch.empty(self.numel, device=self.device)  # reused memory: the previous value
        self.env.sleep(self.sleep_ms)
        x.fill_(float(self.n))
        self.out.send(Msg(self.n, x))


class Keeper(mujou.Node):
    """A CUDA reader that keeps the newest message (the host reads its Input)."""

    inp = mujou.Input(Msg, depth=1)

    def __init__(self, **kw: Any) -> None:
        super().__init__(period=None, **kw)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.inp.read()
        self.count += 1


def _host_reads(env: Env, numel: int, sleep_ms: float, duration: float) -> dict[str, int]:
    sender = LateFill(env, numel, sleep_ms, period=0.005, device=env.dev)
    keeper = Keeper(device=env.dev)
    mujou.connect(sender.out, keeper.inp)
    counts = {"reads": 0, "stale_output": 0, "stale_input": 0}
    run = mujou.run({"sender": sender, "keeper": keeper}, timer="realtime", workers=2)
    try:
        end = time.monotonic() + duration
        while time.monotonic() < end:
            for port, key in ((sender.out, "stale_output"), (keeper.inp, "stale_input")):
                msg = run.read(port)
                if msg is not None:
                    counts["reads"] += 1
                    counts[key] += not bool((msg.x == msg.n).all())
    finally:
        run.stop()
        run.join()
    return counts


def check_host_reads(env: Env) -> dict[str, Any]:
    """``run.read`` of a CUDA node's Output and Input is never stale."""
    numel = env.size(1 << 18, 1024)
    duration = env.size(300, 50) / 1000
    main = _host_reads(env, numel, 3.0, duration)
    detail = (f"{main['reads']} reads, stale: Output {main['stale_output']}, "
              f"Input {main['stale_input']}")
    ok = main["reads"] > 0 and main["stale_output"] == 0 and main["stale_input"] == 0
    # The rule of the Input's reads alone: the host waits for the kept values'
    # event (Wiring.wait_kept) before it copies them; without that wait its copy,
    # on its own stream, may run before the sender's late write.
    with mock.patch.object(Wiring, "wait_kept", lambda self, port: None):
        kept = _host_reads(env, numel, 3.0, duration)
    if env.dry:
        return _result(env, ok and kept["reads"] > 0, detail, "not in the dry run",
                       counts=main)
    with _no_host_waits():
        ctl = _host_reads(env, numel, 3.0, duration)
    c_stale = ctl["stale_output"] + ctl["stale_input"]
    control = (f"host waits patched out: {c_stale} of {ctl['reads']} reads stale; "
               f"only the kept-value wait patched out: Input {kept['stale_input']} stale")
    return _result(env, ok and c_stale > 0 and kept["stale_input"] > 0, detail, control,
                   counts=main, control_counts=ctl, control_kept_counts=kept)


# ---------------------------------------------------------------------------
# mixed-device messages


def _flat(value: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        return [(prefix or "value", value)]
    if isinstance(value, dict):
        return [kv for k, v in value.items() for kv in _flat(v, f"{prefix}{k}.")]
    if isinstance(value, (list, tuple)):
        return [kv for i, v in enumerate(value) for kv in _flat(v, f"{prefix}{i}.")]
    return []


def _misplaced(message: Any, device: torch.device) -> list[str]:
    """The tensors of ``message`` that are not on ``device``, as ``key@device``."""
    return [f"{k.rstrip('.')}@{t.device}" for k, t in _flat(message) if t.device != device]


class MixedSender(mujou.Node):
    """Sends a dict of tensors on its device, on the CPU and (with two GPUs) on cuda:1."""

    out = mujou.Output(dict)

    def __init__(self, env: Env, **kw: Any) -> None:
        super().__init__(**kw)
        self.env, self.n = env, 0
        self.last: Any = None  # the newest message as sent, for the control

    def on_update(self, dt: float) -> None:
        self.n += 1
        n = float(self.n)
        msg: dict[str, Any] = {"img": torch.full((64,), n, device=self.device),
                               "stamp": torch.tensor(n),
                               "parts": [torch.full((4,), n, device=self.device),
                                         torch.full((2,), n)]}
        if self.env.dev1 is not None:
            msg["other_gpu"] = torch.full((4,), n, device=self.env.dev1)
        self.last = msg
        self.out.send(msg)


class Collector(mujou.Node):
    """Keeps every message it reads (checked after the run, on the host)."""

    inp = mujou.Input(dict, depth=None)

    def __init__(self, **kw: Any) -> None:
        super().__init__(period=None, **kw)
        self.got: list[Any] = []

    def on_update(self, dt: float) -> None:
        self.got.extend(self.inp.drain())


def _mixed_run(env: Env) -> dict[str, Any]:
    """One run of the mixed net: what each reader got, by the detector."""
    sender = MixedSender(env, period=0.001, device=env.dev)
    gpu, cpu = Collector(device=env.dev), Collector()
    mujou.connect(sender.out, gpu.inp)
    mujou.connect(sender.out, cpu.inp)
    mujou.run({"sender": sender, "gpu": gpu, "cpu": cpu}, timer="simulated",
              duration=0.05, workers=2).join()
    wrong = {"gpu": sorted({w for m in gpu.got for w in _misplaced(m, env.dev)}),
             "cpu": sorted({w for m in cpu.got for w in _misplaced(m, torch.device("cpu"))})}
    bad_values = sum(1 for r in (gpu, cpu) for i, m in enumerate(r.got)
                     for _, t in _flat(m) if not bool((t.cpu() == i + 1).all()))
    count = (len(gpu.got), len(cpu.got))
    ok = count == (sender.n, sender.n) and not wrong["gpu"] and not wrong["cpu"] \
        and bad_values == 0
    return {"ok": ok, "count": count, "tensors": len(_flat(sender.last)), "wrong": wrong,
            "bad_values": bad_values}


_ACTOR_MODULE = importlib.import_module("mujou_actors._runtime.actor")  # where readers call receive


@contextlib.contextmanager
def _unrouted_receive(calls: list[int]) -> Iterator[None]:
    """The control of the mixed check: the receive path without per-tensor routing.

    A reader on the device of a device-path message gets the message as sent,
    as before the fix: its CPU tensors stay on the CPU. ``record_stream`` is
    called on the sender-device tensors only, so the reader's hook still runs
    and the check's detector (not a crash) has to find the failure. Every
    other case goes to the real ``devices.receive``. ``calls[0]`` counts the
    calls of the patched function.

    Raises:
        RuntimeError: the readers do not call ``devices.receive`` through
            ``mujou_actors._runtime.actor.receive`` (the patch would change nothing), or
            its parameters changed (the stand-in would not match it).
    """
    real = mujou_devices.receive
    if getattr(_ACTOR_MODULE, "receive", None) is not real:
        raise RuntimeError("mujou_actors._runtime.actor.receive is not devices.receive: "
                           "the mixed check's control would patch nothing")

    def unrouted(message: Any, reader_device: torch.device, reader_stream: Any,
                 copy_streams: dict[torch.device, Any], rt: Any,
                 copy_done: dict[torch.device, Any] | None = None) -> Any:
        calls[0] += 1
        if type(message) is mujou_devices.DeviceMessage and reader_device == message.device:
            rt.wait_event(reader_stream, message.event)
            for t in mujou_devices.tensors_in(message.value):
                if t.device == message.device:
                    rt.record_stream(t, reader_stream)
            return message.value  # the broken rule: CPU tensors left on the CPU
        return real(message, reader_device, reader_stream, copy_streams, rt, copy_done)

    want = list(inspect.signature(real).parameters)
    if list(inspect.signature(unrouted).parameters) != want:
        raise RuntimeError(f"devices.receive takes {want} now: update the mixed check's control")
    with mock.patch.object(_ACTOR_MODULE, "receive", unrouted):
        if _ACTOR_MODULE.receive is not unrouted:
            raise RuntimeError("the mixed check's control did not replace actor.receive")
        yield


def check_mixed(env: Env) -> dict[str, Any]:
    """Every tensor of a mixed message arrives on the reader's device, intact."""
    main = _mixed_run(env)
    detail = (f"{main['count'][0]}+{main['count'][1]} messages, {main['tensors']} tensors "
              f"each; misplaced {main['wrong']}; wrong values {main['bad_values']}")
    calls = [0]
    with _unrouted_receive(calls):
        ctl = _mixed_run(env)
    if env.dry:  # the control's patch and net ran; on one device nothing can be misplaced
        control = (f"receive without per-tensor routing: patched in, {calls[0]} calls "
                   f"(no device path on the CPU: not in the dry run)")
        return _result(env, main["ok"] and ctl["ok"], detail, control,
                       counts=main, control_counts=ctl)
    # The CPU tensors of each message ("stamp", "parts.1") must be found on the CPU.
    caught = ctl["wrong"]["gpu"]
    control = (f"receive without per-tensor routing ({calls[0]} calls): "
               f"the CUDA reader got misplaced {caught}")
    return _result(env, main["ok"] and calls[0] > 0
                   and {"stamp@cpu", "parts.1@cpu"} <= set(caught),
                   detail, control, counts=main, control_counts=ctl)


# ---------------------------------------------------------------------------
# the current stream in every hook


def _stream_id(device: torch.device) -> tuple[int, bool] | None:
    if device.type != "cuda":
        return None
    s = torch.cuda.current_stream(device)
    return s.cuda_stream, s == torch.cuda.default_stream(device)


class StreamProbe(mujou.Node):
    """Records the current stream in each of its hooks."""

    out = mujou.Output(torch.Tensor)

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.streams: dict[str, set[Any]] = {}

    def _probe(self, hook: str) -> None:
        self.streams.setdefault(hook, set()).add(_stream_id(self.device))

    def on_start(self) -> None:
        self._probe("on_start")
        self.x = torch.zeros(4, device=self.device)

    def on_update(self, dt: float) -> None:
        self._probe("on_update")
        self.x += 1
        self.out.send(self.x)

    def on_stop(self) -> None:
        self._probe("on_stop")

    def state_dict(self) -> dict[str, Any]:
        self._probe("state_dict")
        return super().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._probe("load_state_dict")
        super().load_state_dict(state)


class CpuProbe(mujou.Node):
    """A CPU node: records the stream current on its worker (observing only)."""

    def __init__(self, cuda_device: torch.device, **kw: Any) -> None:
        super().__init__(**kw)
        self.cuda_device = cuda_device
        self.seen: set[Any] = set()

    def on_update(self, dt: float) -> None:
        self.seen.add(_stream_id(self.cuda_device))


def _stream_runs(env: Env) -> dict[str, Any]:
    """A run and a restored run of the probes: the streams each hook saw."""
    def net() -> dict[str, mujou.Node]:
        # Same period, the CUDA node first: on one worker the CPU node runs right after it.
        return {"gpu": StreamProbe(period=0.001, device=env.dev),
                "cpu": CpuProbe(env.dev, period=0.001)}

    first = net()
    run = mujou.run(first, timer="simulated", duration=0.01, workers=1)
    run.join()
    state = run.state_dict()
    second = net()
    mujou.run(second, timer="simulated", duration=0.005, workers=1, state=state).join()
    hooks: dict[str, set[Any]] = {}
    for probe in (first["gpu"], second["gpu"]):
        for hook, ids in probe.streams.items():
            hooks.setdefault(hook, set()).update(ids)
    want = {"on_start", "on_update", "on_stop", "state_dict", "load_state_dict"}
    per_run = [{i for ids in p.streams.values() for i in ids} for p in (first["gpu"],
                                                                       second["gpu"])]
    return {"hooks": hooks, "missing": sorted(want - set(hooks)), "per_run": per_run,
            "cpu_seen": first["cpu"].seen | second["cpu"].seen}


def _own(per_run: list[set[Any]]) -> bool:
    """The detector: each run's CUDA hooks saw one stream, not the default one."""
    return all(len(ids) == 1 and not next(iter(ids))[1] for ids in per_run)


def check_streams(env: Env) -> dict[str, Any]:
    """Every hook of a CUDA node on its own non-default stream; a CPU node after it not."""
    main = _stream_runs(env)
    hooks, missing = main["hooks"], main["missing"]
    # The control: the node's stream context made to enter the worker's current stream
    # of the node's device (its default stream) instead of the node's own.
    # (Replaced where Actor.on_stream calls it: a compiled Actor's methods cannot be.)
    def default_stream(rt: Any, stream: Any, copy_streams: Any) -> Any:
        if stream is None:
            return contextlib.nullcontext()
        return rt.use(rt.current_stream(stream.device))

    with mock.patch.object(_ACTOR_MODULE, "enter_streams", default_stream):
        if _ACTOR_MODULE.enter_streams is not default_stream:
            raise RuntimeError("the streams check's control did not replace actor.enter_streams")
        ctl = _stream_runs(env)
    if env.dry:
        ok = not missing and all(ids == {None} for ids in hooks.values()) \
            and not ctl["missing"]
        return _result(env, ok, f"hooks probed: {sorted(hooks)}; missing {missing}"
                       + _dry_note(env, "streams"),
                       "Actor.on_stream on the default stream: the net ran "
                       "(streams not in the dry run)")
    per_run, cpu_seen = main["per_run"], main["cpu_seen"]
    own = _own(per_run)
    cpu_ok = bool(cpu_seen) and all(default for _, default in cpu_seen)
    ok = not missing and own and cpu_ok and not _own(ctl["per_run"])
    detail = (f"streams per run {[sorted(i) for i in per_run]} (one, non-default each); "
              f"CPU node after it sees {sorted(cpu_seen)}")
    control = (f"Actor.on_stream on the default stream: streams per run "
               f"{[sorted(i) for i in ctl['per_run']]}, the detector says "
               f"{'own' if _own(ctl['per_run']) else 'not own'}")
    return _result(env, ok, detail, control)


# ---------------------------------------------------------------------------
# no hidden host synchronisation (set_sync_debug_mode)


class GatedSender(Sender):
    """A Sender whose first update waits for the host to arm the check."""

    def __init__(self, gate: threading.Event, numel: int, **kw: Any) -> None:
        super().__init__(numel, **kw)
        self.gate = gate

    def on_update(self, dt: float) -> None:
        if self.n == 0 and not self.gate.wait(30.0):
            raise RuntimeError("the host never armed the check")
        super().on_update(dt)


class DoneReader(Reader):
    """A Reader that sets ``done`` once it has read ``expect`` messages.

    With ``item=True`` it also reads its sum on the CPU in every update (a
    host synchronisation in the hook itself).
    """

    def __init__(self, done: threading.Event, expect: int, item: bool = False,
                 **kw: Any) -> None:
        super().__init__(period=None, **kw)
        self.done, self.expect, self.item = done, expect, item

    def on_update(self, dt: float) -> None:
        super().on_update(dt)
        if self.item:
            float(self.total)
        if self.count >= self.expect:
            self.done.set()


def _under_sync_debug(env: Env, reader_device: torch.device, expect: int,
                      item: bool = False) -> str | None:
    """Run sender -> reader with sync debug mode "error"; the error text, or None."""
    gate, done = threading.Event(), threading.Event()
    sender = GatedSender(gate, 4096, period=0.001, device=env.dev)
    reader = DoneReader(done, expect, item, device=reader_device)
    mujou.connect(sender.out, reader.inp)
    run = mujou.run({"sender": sender, "reader": reader}, timer="realtime", workers=2)
    try:
        if not env.dry:
            torch.cuda.set_sync_debug_mode("error")
        gate.set()
        deadline = time.monotonic() + 30.0
        while not done.wait(0.01) and run.running and time.monotonic() < deadline:
            pass
    finally:
        gate.set()  # also when arming failed: the sender must not wait for it
        if not env.dry:
            torch.cuda.set_sync_debug_mode(0)
        run.stop()
    try:
        run.join()
    except Exception as exc:  # noqa: BLE001 - the error is what the check looks at
        return _error_text(exc)
    return None if done.is_set() else f"only {reader.count} of {expect} messages"


def check_sync_debug(env: Env) -> dict[str, Any]:
    """No host synchronisation on the cuda -> cuda path; the host path has one."""
    expect = env.size(50, 10)
    err = _under_sync_debug(env, env.dev, expect)
    detail = f"cuda -> cuda, {expect} messages: {err or 'nothing raised'}"
    if env.dry:
        return _result(env, err is None, detail + _dry_note(env, "sync debug mode"),
                       "not in the dry run")
    ctl = _under_sync_debug(env, torch.device("cpu"), expect)
    raised = ctl is not None and "synchroniz" in ctl
    control = f"host-path port: {ctl[:160] if ctl else 'did not raise'}"
    if not raised:
        # A host path made of non-blocking copies and event waits is not
        # flagged by the debug mode; then show it is armed with .item().
        item = _under_sync_debug(env, env.dev, expect, item=True)
        raised = item is not None and "synchroniz" in item
        control += f"; .item() in the reader: {item[:120] if item else 'did not raise'}"
    return _result(env, err is None and raised, detail, control)


# ---------------------------------------------------------------------------
# GPU state through save / restore


class Noisy(mujou.Node):
    """Draws from its generator and keeps a running tensor."""

    out = mujou.Output(torch.Tensor)

    def on_start(self) -> None:
        self.acc = torch.zeros(16, device=self.device)

    def on_update(self, dt: float) -> None:
        self.acc = 0.5 * self.acc + torch.randn(16, device=self.device, generator=self.generator)
        self.out.send(self.acc)


def _noisy_run(device: torch.device, duration: float, state: Any = None
               ) -> tuple[Noisy, dict[str, Any]]:
    node = Noisy(period=0.001, device=device, seed=7)
    run = mujou.run({"noisy": node}, timer="simulated", duration=duration, state=state)
    run.join()
    return node, run.state_dict()


def check_state(env: Env) -> dict[str, Any]:
    """Save / restore of a CUDA node is bit-identical; a CUDA tree into a CPU node refused."""
    whole, _ = _noisy_run(env.dev, 0.2)
    _, half = _noisy_run(env.dev, 0.1)
    rest, _ = _noisy_run(env.dev, 0.1, half)
    same = (torch.equal(whole.acc.cpu(), rest.acc.cpu())
            and torch.equal(whole.generator.get_state(), rest.generator.get_state()))
    reseeded = copy.deepcopy(half)
    reseeded["nodes"]["noisy"]["generator"] = 99  # a seed instead of the drawn state
    other, _ = _noisy_run(env.dev, 0.1, reseeded)
    differs = not torch.equal(whole.acc.cpu(), other.acc.cpu())
    detail = f"restored run bit-identical: {same}"
    if env.dry:
        return _result(env, same and differs, detail + _dry_note(env, "CUDA into CPU"),
                       f"generator replaced by a seed: differs {differs}")
    try:
        _noisy_run(torch.device("cpu"), 0.01, half)
        refusal = "accepted"
    except Exception as exc:  # noqa: BLE001 - the message is what the check looks at
        refusal = _error_text(exc)
    refused = refusal != "accepted" and "generator" in refusal
    detail += f"; CUDA tree into a CPU node: {refusal[:160]}"
    return _result(env, same and refused and differs, detail,
                   f"generator replaced by a seed: differs {differs}")


# ---------------------------------------------------------------------------
# more than 32 CUDA nodes on one device


def check_many_nodes(env: Env) -> dict[str, Any]:
    """40 CUDA nodes (shared pool streams) with late readers: messages intact."""
    numel = env.size(1 << 16, 256)
    kw = dict(pairs=20, period=0.002, duration=env.size(200, 20) / 1000,
              sleep_ms=0.0 if env.dry else 1.0, numel=numel)
    main, control = _late_device_path_and_control(env, **kw)
    res = _allocator_result(env, main, control, want=200)
    res["detail"] = "40 nodes: " + res["detail"]
    return res


# ---------------------------------------------------------------------------
# simulated runs for 1, 2 and 4 workers


class Mixer(mujou.Node):
    """A triggered CUDA node: a fixed matmul of what it reads."""

    inp = mujou.Input(torch.Tensor)
    out = mujou.Output(torch.Tensor)

    def __init__(self, **kw: Any) -> None:
        super().__init__(period=None, **kw)

    def on_start(self) -> None:
        w = torch.randn(16, 16, generator=torch.Generator().manual_seed(5))
        self.w = w.to(self.device)

    def on_update(self, dt: float) -> None:
        self.out.send(torch.tanh(self.w @ self.inp.read()))


class Recorder(mujou.Node):
    """A CPU node keeping every message."""

    inp = mujou.Input(torch.Tensor, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.got: list[torch.Tensor] = []

    def on_update(self, dt: float) -> None:
        self.got.extend(self.inp.drain())


def _fingerprint(env: Env, workers: int, seed: int) -> str:
    net: dict[str, mujou.Node] = {}
    rec = Recorder()
    for i in range(3):
        noisy, mixer = Noisy(period=0.001 * (i + 1), device=env.dev), Mixer(device=env.dev)
        mujou.connect(noisy.out, mixer.inp)
        mujou.connect(mixer.out, rec.inp)
        net[f"noisy{i}"], net[f"mixer{i}"] = noisy, mixer
    net["rec"] = rec
    mujou.run(net, timer="simulated", duration=0.1, workers=workers, seed=seed).join()
    digest = hashlib.sha256()
    for t in rec.got:
        digest.update(t.numpy().tobytes())
    return f"{len(rec.got)}:{digest.hexdigest()[:12]}"


def check_workers(env: Env) -> dict[str, Any]:
    """A simulated CUDA net is bit-identical for 1, 2 and 4 workers."""
    prints = {w: _fingerprint(env, w, seed=1) for w in (1, 2, 4)}
    other = _fingerprint(env, 2, seed=2)
    same = len(set(prints.values())) == 1
    return _result(env, same and other != prints[1], f"fingerprints {prints}",
                   f"seed 2: {other} (differs {other != prints[1]})")


# ---------------------------------------------------------------------------
# the example, CPU against GPU


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_pipeline",
                                                  ROOT / "examples" / "gpu_pipeline.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    if a["commands"].shape != b["commands"].shape or a["positions"].shape != b["positions"].shape:
        return float("inf")
    return max((float((a[k] - b[k]).abs().max()) if a[k].numel() else 0.0)
               for k in ("commands", "positions"))


def check_example(env: Env) -> dict[str, Any]:
    """examples/gpu_pipeline.py: models on the CPU and on the GPU agree."""
    ex = _example()
    duration = env.size(2, 0.3)
    cpu = ex.run_pipeline("cpu", duration=duration)
    images = "synthetic" if cpu["source"].startswith("synthetic") else "render"  # the same
    gpu = ex.run_pipeline(str(env.dev), duration=duration, images=images)
    other = ex.run_pipeline("cpu", duration=duration, weights_seed=3)
    diff, d_other = _diff(cpu, gpu), _diff(cpu, other)
    ok = diff <= EXAMPLE_TOL < d_other and len(cpu["commands"]) > 0
    detail = (f"{len(cpu['commands'])} commands, images {cpu['source'][:40]}; "
              f"max |cpu - {env.dev}| {diff:.2e} (<= {EXAMPLE_TOL})")
    return _result(env, ok, detail, f"other weights: {d_other:.2e} (> {EXAMPLE_TOL})",
                   diff=diff, control_diff=d_other)


# ---------------------------------------------------------------------------
# cuda:0 -> cuda:1


def check_two_gpus(env: Env) -> dict[str, Any]:
    """cuda:0 -> cuda:1: device-to-device copies, none through the host."""
    if env.dev1 is None and not env.dry:
        return _skipped(f"{torch.cuda.device_count()} GPU: needs two")
    dev1 = env.dev1 if env.dev1 is not None else env.dev  # the dry run: cpu -> cpu
    updates = env.size(200, 20)
    _, copies, intact, sent = _profiled_hand_off(env, updates, dev1, profile=True)
    if env.dry:
        return _result(env, intact, f"{updates} sends, intact {intact}"
                       + _dry_note(env, "memcpy counts"), "not in the dry run")
    _, host, _, host_sent = _profiled_hand_off(env, updates, torch.device("cpu"), profile=True)
    ok = (intact and copies["HtoD"] == 0 and copies["DtoH"] == 0
          and copies["DtoD"] + copies["PtoP"] >= sent and host["DtoH"] >= host_sent)
    return _result(env, ok, f"{sent} sends, intact {intact}, memcpy {copies}",
                   f"host-path port: DtoH {host['DtoH']}", memcpy=copies)


# ---------------------------------------------------------------------------
# two groups on one machine: CUDA IPC


def _memcpy_counts(prof: Any) -> dict[str, int]:
    copies = {"HtoD": 0, "DtoH": 0, "DtoD": 0, "PtoP": 0, "other": 0}
    for event in prof.events():
        if event.name.startswith("Memcpy"):  # GPU activity; "cudaMemcpy*" is the CPU call
            kinds = ("HtoD", "DtoH", "DtoD", "PtoP")
            copies[next((k for k in kinds if k in event.name), "other")] += 1
    return copies


def _ipc_consumer(conn: Any) -> None:
    """The receiving process: decode each batch, as a group's link does, and answer.

    Answers ``(sum, device, released ids)`` per batch. ``"profile"`` starts the
    profiler (the sums are then kept on the device, so that reading them is no
    host copy, and the answers carry None); ``"report"`` stops it and sends the
    memcpy counts, the kept sums and the last tensor (on the CPU, after the
    profile); ``None`` ends.
    """
    import msgpack

    from mujou_actors.distributed import cudaipc, wire

    decoder = wire.Decoder()
    importer = decoder.shared = cudaipc.Importer(cudaipc.TorchIpc())
    prof = None
    kept: list[torch.Tensor] = []
    last = None
    while True:
        got = conn.recv()
        if got is None:
            break
        if got == "profile":
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            prof = torch.profiler.profile(activities=acts)
            prof.__enter__()
            conn.send("ok")
            continue
        if got == "report":
            assert prof is not None
            prof.__exit__(None, None, None)
            conn.send((_memcpy_counts(prof), [float(x) for x in kept],
                       None if last is None else last.cpu()))
            prof, kept = None, []
            continue
        frames, rows = got
        items = decoder.decode(frames, [object], msgpack.unpackb(rows) if rows else None)
        t = items[0][4]
        if t.device.type != "cuda":  # the host path: the receiving kernel's move
            t = t.to("cuda:0", non_blocking=False)
        total = t.double().sum()
        torch.cuda.current_stream().synchronize()  # the hop ends when the data is there
        released: list[int] = []
        while rows and not released:
            released = importer.take_released()
        last = t
        if prof is not None:
            kept.append(total)
            conn.send((None, str(t.device), released))
        else:
            conn.send((float(total), str(t.device), released))
    importer.close()


def _ipc_hops(env: Env, conn: Any, hops: int, share: bool, profile: bool
              ) -> dict[str, Any]:
    """Send ``hops`` batches of one 4 MiB CUDA tensor each, by CUDA IPC or the host path.

    Returns ``s`` (seconds per hop), ``sums`` (the receiver's, None while
    profiling), ``wants`` (the sender's, computed, not read back), ``devices``,
    ``stats`` (the exporter's), ``memcpy`` (the sender's, when profiled) and
    ``last`` (the last tensor sent).
    """
    import msgpack

    from mujou_actors.distributed import cudaipc, wire

    encoder = wire.Encoder()
    exporter = cudaipc.Exporter(cudaipc.TorchIpc())
    if share:
        encoder.shared = exporter
    sums, wants, devices = [], [], []
    prof = None
    if profile:
        conn.send("profile")
        conn.recv()
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        prof = torch.profiler.profile(activities=acts)
        prof.__enter__()
    total = 0.0
    sent = None
    for k in range(hops):
        # Distinct values (a stale, shifted or reused block shows), made on the device: no
        # host-to-device copy in the sender's profile. Floats up to 2**24 are exact.
        sent = torch.arange(NUMEL, dtype=torch.float32, device=env.dev) + float(k)
        wants.append(float(NUMEL * (NUMEL - 1) // 2 + k * NUMEL))  # exact; no read back
        t0 = time.perf_counter()
        items = exporter.prepare([(0, 0, 0, 0, sent)], 1) if share else [(0, 0, 0, 0, sent)]
        frames = [bytes(f) for f in encoder.encode(items, [object])]
        rows = encoder.take_shared()
        conn.send((frames, msgpack.packb(rows) if rows else b""))
        got, device, released = conn.recv()
        total += time.perf_counter() - t0
        exporter.release(released)
        sums.append(got)
        devices.append(device)
    memcpy: dict[str, int] = {}
    if prof is not None:
        prof.__exit__(None, None, None)
        memcpy = _memcpy_counts(prof)
    return {"s": total / hops, "sums": sums, "wants": wants, "devices": devices,
            "stats": exporter.stats(), "memcpy": memcpy, "last": sent}


def check_cuda_ipc(env: Env) -> dict[str, Any]:
    """A 4 MiB CUDA tensor between two processes of one machine: CUDA IPC vs the host path."""
    if env.dry:
        return _skipped("dry run: CUDA IPC needs CUDA in two processes")
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    conn, there = ctx.Pipe()
    child = ctx.Process(target=_ipc_consumer, args=(there,), daemon=True)
    child.start()
    try:
        hops = env.size(200, 4)
        _ipc_hops(env, conn, 5, True, False)  # warm up: contexts, handles, allocator
        _ipc_hops(env, conn, 5, False, False)
        ipc = _ipc_hops(env, conn, hops, True, False)
        host = _ipc_hops(env, conn, hops, False, False)
        profiled = _ipc_hops(env, conn, 20, True, True)
        conn.send("report")
        theirs, sums, last = conn.recv()
        host_profiled = _ipc_hops(env, conn, 20, False, True)
        conn.send("report")
        host_theirs, _, _ = conn.recv()
        conn.send(None)
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
    intact = (ipc["sums"] == ipc["wants"] and host["sums"] == host["wants"]
              and sums == profiled["wants"])
    values = last is not None and torch.equal(last, profiled["last"].cpu())
    on_device = all(d == "cuda:0" for d in ipc["devices"])
    mine = profiled["memcpy"]
    no_host = (mine["DtoH"] == 0 and mine["HtoD"] == 0 and theirs["DtoH"] == 0
               and theirs["HtoD"] == 0 and theirs["DtoD"] >= 20)
    stats = ipc["stats"]
    released = (stats["in_flight"] == 0 and stats["exported"] == hops and not stats["fallbacks"]
                and profiled["stats"]["in_flight"] == 0)
    control_fails = host_profiled["memcpy"]["DtoH"] >= 20
    ok = intact and values and on_device and no_host and released and control_fails
    detail = (f"{hops} hops of 4 MiB: IPC {ipc['s'] * 1e6:.0f} us/hop, host path "
              f"{host['s'] * 1e6:.0f} us/hop; intact {intact and values}, on "
              f"{ipc['devices'][0]}; memcpy sender {mine}, receiver {theirs}; "
              f"exporter {stats}")
    control = (f"host path: sender DtoH {host_profiled['memcpy']['DtoH']} (>= 20 expected), "
               f"receiver {host_theirs}")
    return _result(env, ok, detail, control, us_per_hop_ipc=ipc["s"] * 1e6,
                   us_per_hop_host=host["s"] * 1e6, memcpy_sender=mine,
                   memcpy_receiver=theirs, control_memcpy_sender=host_profiled["memcpy"],
                   exporter=stats)


# ---------------------------------------------------------------------------

CHECKS: dict[str, tuple[str, Callable[[Env], dict[str, Any]]]] = {
    "pytest": ("pytest -m cuda", check_pytest),
    "handoff": ("cuda->cuda hand-off: copies", check_handoff),
    "alloc-device": ("allocator reuse: device path", check_alloc_device),
    "alloc-write": ("allocator reuse: run.write", check_alloc_write),
    "wait-cpu": ("waits: CPU time, block vs spin", check_wait_cpu),
    "sync-waits": ("set_sync_mode: implicit waits", check_sync_waits),
    "sync-api": ("set_sync_mode: read back, too late", check_sync_api),
    "host-reads": ("host reads never stale", check_host_reads),
    "mixed": ("mixed-device messages", check_mixed),
    "streams": ("current stream in every hook", check_streams),
    "sync-debug": ("no hidden host sync", check_sync_debug),
    "state": ("GPU state through save/restore", check_state),
    "many-nodes": ("more than 32 CUDA nodes", check_many_nodes),
    "workers": ("simulated: 1, 2, 4 workers", check_workers),
    "example": ("examples/gpu_pipeline.py CPU vs GPU", check_example),
    "two-gpus": ("cuda:0 -> cuda:1", check_two_gpus),
    "cuda-ipc": ("two groups, one machine: CUDA IPC", check_cuda_ipc),
}


def _guarded(fn: Callable[[Env], dict[str, Any]], env: Env) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        res = fn(env)
    except Exception as exc:  # noqa: BLE001 - a check that breaks is reported, not fatal
        res = {"status": "FAIL", "detail": _error_text(exc)[:400], "control": "-"}
    res["seconds"] = round(time.perf_counter() - t0, 2)
    return res


def _print_table(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"mujou_actors GPU check: {results['device']}")
    for col in ("check", "result", "s", "detail", "control"):
        table.add_column(col, overflow="fold")
    for res in results["checks"].values():
        style = {"FAIL": "bold red", "skipped": "yellow"}.get(res["status"], "green")
        table.add_row(res["name"], f"[{style}]{res['status']}[/]", f"{res['seconds']:.1f}",
                      res["detail"], res["control"])
    Console(width=max(160, os.get_terminal_size(1).columns if sys.stdout.isatty() else 160)
            ).print(table)


def main(argv: list[str] | None = None) -> int:
    """Run the checks, print the table, write the JSON; 1 when a check failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/gpu_check.json")
    parser.add_argument("--dry-run", action="store_true",
                        help="run every check's nets on the CPU (no GPU measurement)")
    parser.add_argument("--only", default=None, help=f"comma-separated keys: {', '.join(CHECKS)}")
    parser.add_argument("--no-pytest", action="store_true", help="skip the cuda tests")
    parser.add_argument("--updates", type=int, default=1000, help="sends in the hand-off")
    parser.add_argument("--kernel-ms", type=float, default=300.0, help="GPU work per wait")
    parser.add_argument("--waits", type=int, default=3, help="long waits per measurement")
    parser.add_argument("--child-sync-mode", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child_sync_mode is not None:  # a fresh process for set_sync_mode
        print(json.dumps(child_sync_mode(args.child_sync_mode, args.kernel_ms, args.waits,
                                         args.dry_run)))
        return 0
    keys = list(CHECKS)
    if args.only is not None:
        keys = [k.strip() for k in args.only.split(",") if k.strip()]
        unknown = [k for k in keys if k not in CHECKS]
        if unknown or not keys:
            parser.error(f"--only: no check {', '.join(unknown) or '(none named)'}; "
                         f"choose from {', '.join(CHECKS)}")
    if args.no_pytest and "pytest" in keys:
        keys.remove("pytest")
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device: nothing to check (--dry-run runs the checks' nets on the CPU)")
        return 0

    if args.dry_run:
        env = Env(True, torch.device("cpu"), None, args)
        device = "CPU dry run"
    else:
        dev1 = torch.device("cuda:1") if torch.cuda.device_count() > 1 else None
        env = Env(False, torch.device("cuda:0"), dev1, args, _calibrate_sleep())
        device = torch.cuda.get_device_name(0)
    checks = {}
    for key in keys:
        name, fn = CHECKS[key]
        checks[key] = {"name": name, **_guarded(fn, env)}
    results = {"device": device, "dry_run": env.dry, "torch": torch.__version__,
               "cuda": torch.version.cuda, "gpus": torch.cuda.device_count(), "checks": checks}
    _print_table(results)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {args.json}")
    return 1 if any(c["status"] == "FAIL" for c in checks.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
