"""The data plane's encoding of port messages (``mujou_actors.distributed.wire``), measured.

What is measured
----------------
**codec** (one process, no transport): for each case, a batch of items
``(t_ns, delta, sender, port, message)`` is encoded by an ``Encoder`` and its
frames decoded by a ``Decoder``, ``--codec`` times after a warm-up; the
shared-memory blocks are released after each. Figures, per message:

* **enc µs** and **dec µs**: the median over the batches of the wall time of
  ``Encoder.encode`` and of ``Decoder.decode`` (``time.perf_counter_ns``),
  divided by the messages of a batch;
* **calls**: Python function calls per message of one encode plus decode
  (``sys.setprofile``, ``call`` events; exact whatever the machine's load).

Cases: ``float`` (a float on a ``float`` port), ``tensor64`` (a 16-float32
tensor, 64 bytes, on a ``torch.Tensor`` port) and ``tuple`` (``(tensor64,
1.0)`` on an ``object`` port), each alone (``x1``) and in batches of 64
(``x64``); ``1MiB-inline`` (a 1 MiB float32 tensor in a frame of its own, a
view of its memory), ``1MiB-shm`` (the same through the Encoder's shared
memory pool, copied out) and ``1MiB-shm-view`` (the same, decoded by a
``zero_copy`` Decoder, as a peer link on one machine decodes: a view of the
block, freed when the batch is dropped; its reads cost the reader later,
where the copy paid them in the decode).

**hop** (two processes, spawn): the parent and a child process connected by
one pyzmq ``PAIR`` socket over ``ipc://`` (a socket file in a temporary
folder), each with its own Encoder (shared memory on) and Decoder; the freed
block ids ride in a frame before each batch, the way a driver carries them
back. Figures:

* **RTT p50 / p99 µs**: ping-pong of one message (``tensor64``, ``1MiB-inline``,
  ``1MiB-shm``): encode, send, the child decodes, encodes it again and sends
  it back, the parent decodes; ``--rtt`` round trips after 50 unmeasured ones.
  One hop (what the issue's targets, 64 B ≤ 50 µs and 1 MB ≤ 150 µs, are
  for) is half a round trip: **hop p50 µs**.
* **msg/s**: ``--small`` ``tensor64`` messages in batches of 64, sent without
  waiting; the child decodes each batch; the clock stops when the child's
  count comes back (target: 100,000 a pair).

These are the codec plus the socket, without a placed run's driver (its
grants, routes and kernels add to them).

The script imports ``mujou_actors`` from ``sys.path``: set ``PYTHONPATH`` to
the tree to measure. Results: a table, and JSON in
``benchmarks/results/wire.json`` unless ``--json`` says otherwise. Every wait
has a timeout; the child is joined, then killed, at the end whatever happens.

Usage::

    python benchmarks/wire.py [--quick] [--repeat 3] [--only codec,hop] [--json PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import torch
import zmq
from common import repeat_and_only, show_table, summary

from mujou_actors.distributed import wire

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("codec", "hop")
TIMEOUT_MS = 60_000  # the bound on any single wait; a healthy run never comes close
DECLARED = [float, torch.Tensor, object]
MiB = 1 << 20


def message(case: str, k: int = 0) -> tuple[int, Any]:
    """The port and the message of a case."""
    if case.startswith("float"):
        return 0, 0.5 + k
    if case.startswith("tensor64"):
        return 1, torch.arange(16, dtype=torch.float32) + k
    if case.startswith("tuple"):
        return 2, (torch.arange(16, dtype=torch.float32) + k, 1.0)
    return 1, torch.full((MiB // 4,), float(k))


def batch(case: str, size: int) -> list[wire.Item]:
    """``size`` items of a case, as a driver sends them."""
    return [(10**12 + k, 1, 7, *message(case, k)) for k in range(size)]


# --------------------------------------------------------------------------- codec

CODEC_CASES = {"float x1": 1, "float x64": 64, "tensor64 x1": 1, "tensor64 x64": 64,
               "tuple x1": 1, "tuple x64": 64, "1MiB-inline": 1, "1MiB-shm": 1,
               "1MiB-shm-view": 1}


def calls_of(fn: Callable[[], Any]) -> int:
    """Python function calls that one call of ``fn`` makes (``sys.setprofile``)."""
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
    return count - 1  # fn itself


def measure_codec(case: str, n: int, prefix: str) -> dict[str, float]:
    """Encode and decode one case ``n`` times in this process; µs and calls per message."""
    shm = case.startswith("1MiB-shm")
    encoder = wire.Encoder(prefix if shm else None)
    decoder = wire.Decoder(prefix if shm else None, zero_copy=case == "1MiB-shm-view")
    items = batch(case, CODEC_CASES[case])
    enc_ns: list[int] = []
    dec_ns: list[int] = []
    clock = time.perf_counter_ns
    try:
        for i in range(n + 20):
            t0 = clock()
            frames = encoder.encode(items, DECLARED)
            t1 = clock()
            decoder.decode(frames, DECLARED)
            t2 = clock()
            encoder.release(decoder.take_freed())
            if i >= 20:
                enc_ns.append(t1 - t0)
                dec_ns.append(t2 - t1)
        if shm:
            assert len(frames) == 1, "the 1 MiB tensor did not go through shared memory"

        def both() -> None:
            decoder.decode(encoder.encode(items, DECLARED), DECLARED)
            encoder.release(decoder.take_freed())

        calls = calls_of(both)
    finally:
        encoder.close()
        decoder.close()
    size = len(items)
    return {"enc_us": statistics.median(enc_ns) / size / 1e3,
            "dec_us": statistics.median(dec_ns) / size / 1e3, "calls": calls / size}


# --------------------------------------------------------------------------- hop


def child_main(address: str, prefix: str) -> None:
    """The other process: echoes ``ping`` batches, counts ``sink`` ones, until ``end``.

    Each message is ``[command, freed ids (msgpack), *the wire's frames]``.
    """
    torch.set_num_threads(1)
    context = zmq.Context()
    sock = context.socket(zmq.PAIR)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    sock.connect(address)
    encoder, decoder = wire.Encoder(prefix + "child-"), wire.Decoder(prefix)
    counted = 0
    try:
        while True:
            frames = sock.recv_multipart(copy=False)
            command = frames[0].bytes
            if command == b"end":
                break
            encoder.release(msgpack.unpackb(frames[1].bytes))
            if command == b"count":
                sock.send_multipart([b"count", msgpack.packb(decoder.take_freed()),
                                     msgpack.packb(counted)])
                counted = 0
                continue
            items = decoder.decode(frames[2:], DECLARED)
            if command == b"sink":
                counted += len(items)
                continue
            out = encoder.encode(items, DECLARED)
            sock.send_multipart([b"pong", msgpack.packb(decoder.take_freed()), *out], copy=False)
    finally:
        encoder.close()
        decoder.close()
        sock.close()
        context.term()


class Peer:
    """The child process and the parent's end of the socket, codecs included."""

    def __init__(self, folder: str, prefix: str) -> None:
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.PAIR)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
        self.sock.setsockopt(zmq.SNDTIMEO, TIMEOUT_MS)
        address = f"ipc://{folder}/wire"
        self.sock.bind(address)
        self.proc = mp.get_context("spawn").Process(target=child_main, args=(address, prefix),
                                                    daemon=True)
        self.proc.start()
        self.encoder = wire.Encoder(prefix + "parent-")
        self.decoder = wire.Decoder(prefix)

    def send(self, command: bytes, items: list[wire.Item]) -> None:
        """One batch, behind its command and the ids this side freed."""
        frames = self.encoder.encode(items, DECLARED) if items else []
        self.sock.send_multipart([command, msgpack.packb(self.decoder.take_freed()), *frames],
                                 copy=False)

    def receive(self) -> list[Any]:
        """The next reply's frames; the ids it carries go back to this side's pool."""
        frames = self.sock.recv_multipart(copy=False)
        self.encoder.release(msgpack.unpackb(frames[1].bytes))
        return frames

    def close(self) -> None:
        """Ask the child to end; join it, then kill it, with timeouts; close everything."""
        try:
            self.sock.send_multipart([b"end"])
        except zmq.ZMQError:  # the child may be gone already: it is killed below anyway
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.encoder.close()
        self.decoder.close()
        self.sock.close()
        self.context.term()


def round_trips(peer: Peer, case: str, n: int) -> dict[str, float]:
    """RTT p50/p99 (µs) of one message of a case, ``n`` round trips after 50."""
    inline = case == "1MiB-inline"
    encoder = peer.encoder
    if inline:  # the same socket and child, without this side's pool
        peer.encoder = wire.Encoder()
    items = batch(case, 1)
    lat: list[float] = []
    try:
        for i in range(n + 50):
            t0 = time.perf_counter_ns()
            peer.send(b"ping", items)
            peer.decoder.decode(peer.receive()[2:], DECLARED)
            if i >= 50:
                lat.append((time.perf_counter_ns() - t0) / 1e3)
    finally:
        if inline:
            peer.encoder.close()
            peer.encoder = encoder
    lat.sort()
    p50 = lat[len(lat) // 2]
    return {"rtt_p50": p50, "rtt_p99": lat[min(len(lat) - 1, len(lat) * 99 // 100)],
            "hop_p50": p50 / 2}


def rate(peer: Peer, n: int) -> float:
    """Small messages a second, one way, in batches of 64 (``n`` rounded up to batches)."""
    batches = [batch("tensor64", 64) for _ in range(-(-n // 64))]
    peer.send(b"count", [])  # the child is up and its count is 0
    peer.receive()
    t0 = time.perf_counter()
    for items in batches:
        peer.send(b"sink", items)
    peer.send(b"count", [])
    counted = msgpack.unpackb(peer.receive()[2].bytes)
    elapsed = time.perf_counter() - t0
    if counted != len(batches) * 64:
        raise RuntimeError(f"the child decoded {counted} messages of {len(batches) * 64}")
    return counted / elapsed


def measure_hop(cfg: argparse.Namespace, folder: str, prefix: str) -> dict[str, dict[str, float]]:
    """The two-process figures: round trips per case and the small-message rate."""
    peer = Peer(folder, prefix)
    try:
        out = {case: round_trips(peer, case, cfg.rtt if case == "tensor64" else cfg.rtt_big)
               for case in ("tensor64", "1MiB-inline", "1MiB-shm")}
        out["tensor64"]["rate"] = rate(peer, cfg.small)
    finally:
        peer.close()
    return out


# --------------------------------------------------------------------------- main

CODEC_COLUMNS = (("enc_us", "enc µs/msg", "{:.2f}"), ("dec_us", "dec µs/msg", "{:.2f}"),
                 ("total_us", "enc+dec µs/msg", "{:.2f}"), ("calls", "calls/msg", "{:.1f}"))
HOP_COLUMNS = (("rtt_p50", "RTT p50 µs", "{:.0f}"), ("rtt_p99", "RTT p99 µs", "{:.0f}"),
               ("hop_p50", "hop p50 µs", "{:.0f}"), ("rate", "msg/s (batches of 64)", "{:,.0f}"))


def medians(reps: list[dict[str, float]]) -> dict[str, float]:
    """The median of each figure over the repetitions."""
    return {k: summary([r[k] for r in reps])["median"] for k in reps[0]}


def main(argv: list[str] | None = None) -> int:
    """Run the measurements; print the tables; write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--codec", type=int, default=2000, help="batches per codec case")
    ap.add_argument("--rtt", type=int, default=3000, help="round trips of the small message")
    ap.add_argument("--rtt-big", type=int, default=300, help="round trips of a 1 MiB tensor")
    ap.add_argument("--small", type=int, default=100_000, help="messages of the rate")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions (5; --quick: 2)")
    ap.add_argument("--only", type=lambda s: [w.strip() for w in s.split(",") if w.strip()],
                    default=None, help=f"workloads, from {', '.join(WORKLOADS)}")
    ap.add_argument("--quick", action="store_true",
                    help="200 batches, 300 + 30 round trips, 10,000 messages")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/wire.json")
    cfg = ap.parse_args(argv)
    if cfg.quick:
        cfg.codec, cfg.rtt, cfg.rtt_big, cfg.small = 200, 300, 30, 10_000
    repeat, only = repeat_and_only(ap, cfg, WORKLOADS)
    torch.set_num_threads(1)
    prefix = f"mujou-bench-{os.getpid()}-"
    codec: dict[str, list[dict[str, float]]] = {case: [] for case in CODEC_CASES}
    hop: dict[str, list[dict[str, float]]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="mujou-wire-") as folder:
            for rep in range(repeat):  # the workloads interleaved, repetition by repetition
                print(f"repetition {rep + 1}/{repeat}", flush=True)
                if "codec" in only:
                    for case in CODEC_CASES:
                        codec[case].append(measure_codec(case, cfg.codec, prefix))
                if "hop" in only:
                    for case, figures in measure_hop(cfg, folder, prefix).items():
                        hop.setdefault(case, []).append(figures)
    finally:
        wire.remove_blocks(prefix)  # pools a failed run left behind
    results: dict[str, Any] = {}
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    if "codec" in only:
        results["codec"] = {case: medians(reps) for case, reps in codec.items()}
        for r in results["codec"].values():
            r["total_us"] = r["enc_us"] + r["dec_us"]
        show_table(f"Codec, one process, {when}, {machine}, median of {repeat}", "case",
                   results["codec"], CODEC_COLUMNS)
    if "hop" in only:
        results["hop"] = {case: medians(reps) for case, reps in hop.items()}
        show_table(f"Hop, two processes over zmq ipc://, median of {repeat}", "case",
                   results["hop"], HOP_COLUMNS)
    cfg.json.parent.mkdir(parents=True, exist_ok=True)
    cfg.json.write_text(json.dumps({
        "date": when, "machine": machine, "mujou_actors": wire.__file__,
        "versions": {"torch": torch.__version__, "pyzmq": zmq.pyzmq_version(),
                     "libzmq": zmq.zmq_version(), "msgpack": ".".join(map(str, msgpack.version))},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items()},
        "results": results, "samples": {"codec": codec, "hop": hop}}, indent=1))
    print(f"wrote {cfg.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
