"""What the Foxglove view costs: the sender with the live server, the projection itself.

What is measured
----------------
* **send ns/message** (cases ``float`` and ``tensor``, a 1 KiB float32 tensor):
  one periodic sender node (simulated time, one worker) makes ``--sends``
  sends per update to one reader, ``--ticks`` updates once measuring starts,
  in three runs: **no server**; **server, no client** (``mujou.serve_foxglove``
  serving the run, nobody connected); **client watching** (a WebSocket client
  in this process, on a thread of its own, subscribed to the sender's
  Output). Per run, the median over the updates of the send loop's CPU time
  per send (``time.thread_time_ns`` of the sender's thread: the host thread's
  and the server's work are not the sender's). The sender starts measuring
  only once the server (and the client's subscription) is up. The extra
  cost = that run - the run without a server, the runs interleaved, the
  median over ``--repeat``. **received**: messages the client got; **dropped**:
  those lost on the way, counted (the port's watch, 1024 deep, drops the
  oldest when the view's ``mujou-foxglove-take`` thread falls behind a flood;
  the client's queue, `wsserver.BACKLOG`, when the client reads too slowly).
* **projection us/message**: `view.Projection.encode` (the JSON view: what the
  view's thread does per watched message, and the recorder per message with
  ``Recording(view=True)``) of a float, a 16-element tensor, a 1 KiB tensor
  (256 elements), a 64 Ki-element tensor (statistics) and a 64x64 RGB image.

The script imports ``mujou_actors`` from ``sys.path``: set ``PYTHONPATH`` to
the tree to measure. It needs ``foxglove-sdk`` and ``websockets``.

Usage::

    python benchmarks/view.py [--sends 1000] [--ticks 20] [--repeat 5]
                              [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

import mujou_actors as mujou
from mujou_actors.recording.view import Projection

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PeriodicReader, TimedSender  # noqa: E402

CASES = ("float", "tensor")
MODES = ("none", "server", "client")
_WAIT = 60.0  # wall seconds for any one step (a start, a subscription, the measured updates)


class Sender(TimedSender):
    """Makes ``n`` sends per update once ``go`` is set, for ``ticks`` updates."""

    def __init__(self, case: str, n: int, ticks: int) -> None:
        super().__init__(case, n, ticks)
        self.go = threading.Event()
        self.done = threading.Event()

    def on_update(self, dt: float) -> None:
        if not self.go.is_set() or len(self.ns) >= self.ticks:
            return
        self.timed_sends()
        if len(self.ns) >= self.ticks:
            self.done.set()


class Client(threading.Thread):
    """A Foxglove WebSocket client that subscribes to one topic and counts its messages."""

    def __init__(self, port: int, topic: str) -> None:
        super().__init__(name="bench-client", daemon=True)
        self.port, self.topic = port, topic
        self.subscribed = threading.Event()
        self.stop = threading.Event()
        self.received = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        from websockets.sync.client import connect

        try:
            with connect(f"ws://127.0.0.1:{self.port}", subprotocols=["foxglove.sdk.v1"],
                         open_timeout=10) as ws:
                channel = None
                while channel is None:
                    frame = ws.recv(timeout=10)
                    if isinstance(frame, str) and json.loads(frame)["op"] == "advertise":
                        channel = next((c["id"] for c in json.loads(frame)["channels"]
                                        if c["topic"] == self.topic), None)
                ws.send(json.dumps({"op": "subscribe",
                                    "subscriptions": [{"id": 1, "channelId": channel}]}))
                self.subscribed.set()
                while not self.stop.is_set():
                    try:
                        frame = ws.recv(timeout=0.1)
                    except TimeoutError:
                        continue
                    if isinstance(frame, bytes) and frame[0] == 1:  # message data
                        self.received += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            self.error = exc
            self.subscribed.set()


def _wait(event: threading.Event, what: str) -> None:
    if not event.wait(_WAIT):
        raise TimeoutError(f"{what} did not happen within {_WAIT} s")


def send_run(case: str, n: int, ticks: int, mode: str) -> dict[str, Any]:
    """One run of the sender in ``mode``: median CPU ns per send, what the client received."""
    sender, reader = Sender(case, n, ticks), PeriodicReader(case)
    mujou.connect(sender.out, reader.inp)
    gc.collect()
    run = mujou.run([sender, reader], timer="simulated", workers=1)
    server = client = None
    try:
        if mode != "none":
            server = mujou.serve_foxglove(run, 0)
        if mode == "client":
            assert server is not None
            client = Client(server.port, sender.out.path)
            client.start()
            _wait(client.subscribed, "the client's subscription")
            if client.error is not None:
                raise client.error
            deadline = time.monotonic() + _WAIT
            while server.watched() != [sender.out.path]:
                if time.monotonic() > deadline:
                    raise TimeoutError("the server did not see the subscription")
                time.sleep(0.001)
        sender.go.set()
        _wait(sender.done, "the measured updates")
        if client is not None:  # what is on its way still arrives: until 0.5 s without any
            deadline, seen = time.monotonic() + _WAIT, -1
            while client.received != seen and time.monotonic() < deadline:
                seen = client.received
                time.sleep(0.5)
    finally:
        run.stop()
        run.join(timeout=_WAIT)
        if client is not None:
            client.stop.set()
            client.join(_WAIT)
        if server is not None:
            server.close()
    # The view's port watch (and a subscription, in a tree that subscribed) and the
    # client's queue.
    dropped = sum(s.dropped + s.watch_dropped for s in run.stats().subscriptions.values())
    if server is not None:
        dropped += server.stats().dropped
    return {"ns": statistics.median(sender.ns[1:] or sender.ns),
            "received": None if client is None else client.received, "dropped": dropped}


def send_cost(case: str, n: int, ticks: int, repeat: int) -> dict[str, Any]:
    """Per send: no server; the extra with a server and no client, and with a client."""
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    received, dropped = [], []
    for _ in range(repeat):
        runs = {mode: send_run(case, n, ticks, mode) for mode in MODES}
        base = runs["none"]["ns"]
        samples["none"].append(base)
        samples["server"].append(runs["server"]["ns"] - base)
        samples["client"].append(runs["client"]["ns"] - base)
        received.append(runs["client"]["received"])
        dropped.append(runs["client"]["dropped"])
    return {"send_ns": statistics.median(samples["none"]),
            "server_extra_ns": statistics.median(samples["server"]),
            "client_extra_ns": statistics.median(samples["client"]),
            "samples": samples, "sent": n * ticks, "received": received, "dropped": dropped}


def projection_cost(repeat: int) -> dict[str, float]:
    """Microseconds per `Projection.encode` of a few typical messages (median of ``repeat``)."""
    cases: dict[str, tuple[Projection, Any, int]] = {
        "float": (Projection("a.b", float), 0.5, 20_000),
        "tensor16": (Projection("a.b", torch.Tensor), torch.rand(16), 5_000),
        "tensor256": (Projection("a.b", torch.Tensor), torch.rand(256), 2_000),
        "tensor64k": (Projection("a.b", torch.Tensor), torch.rand(1 << 16), 500),
        "image64x64": (Projection("cam.image", torch.Tensor, (None, None, 3), torch.uint8),
                       torch.randint(0, 255, (64, 64, 3), dtype=torch.uint8), 2_000),
    }
    out = {}
    for name, (projection, message, count) in cases.items():
        times = []
        for _ in range(repeat):
            encode = projection.encode
            t0 = time.perf_counter()
            for _ in range(count):
                encode(message, 0)
            times.append((time.perf_counter() - t0) / count * 1e6)
        out[name] = statistics.median(times)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sends", type=int, default=1000)
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="200 sends, 5 ticks, 1 repeat")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.sends, args.ticks, args.repeat = 200, 5, 1
    if min(args.sends, args.ticks, args.repeat) < 1:
        ap.error("--sends, --ticks and --repeat must be >= 1")
    print(f"mujou_actors {mujou.__file__}", flush=True)

    sends = {case: send_cost(case, args.sends, args.ticks, args.repeat) for case in CASES}
    projection = projection_cost(args.repeat)
    result = {"python": platform.python_version(), "torch": torch.__version__,
              "cpus": os.cpu_count(), "sends": sends, "projection_us": projection,
              "target": {"unwatched_extra_ns": 1000}}
    print(f"{'case':<8} {'send ns':>9} {'+server ns':>11} {'+client ns':>11} "
          f"{'received':>9} {'dropped':>8} {'of sent':>8}")
    for case, s in sends.items():
        print(f"{case:<8} {s['send_ns']:>9.0f} {s['server_extra_ns']:>11.0f} "
              f"{s['client_extra_ns']:>11.0f} {statistics.median(s['received']):>9.0f} "
              f"{statistics.median(s['dropped']):>8.0f} {s['sent']:>8}")
    print("projection (Projection.encode), us per message: "
          + ", ".join(f"{k} {v:.2f}" for k, v in projection.items()))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
