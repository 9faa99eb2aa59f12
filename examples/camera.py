"""A blocking camera on a dedicated thread, beside periodic nodes on the worker pool.

The net, in real time::

    Camera (30 Hz, own thread) --frame--> FrameStats (on every frame, pool)
    Heartbeat (200 Hz, pool)

* ``Camera`` stands for a camera driver. A plain Python thread (the "capture"
  thread, started in ``on_start`` and stopped in ``on_stop``) produces a small
  ``(3, 48, 64)`` uint8 image 30 times a second into a ``queue.Queue``, each one
  a readout time after its frame interval ends. The node ticks at 30 Hz too; its
  ``on_update`` blocks on the queue until an image is there (here for the
  readout time, half a frame) and sends it as a :class:`Frame`. Because the node has
  ``dedicated_thread=True``, the blocking happens on its own thread
  (``mujou-node-camera``), never on a worker.
* ``FrameStats`` has no period: every frame triggers it. It measures the latency
  from capture to processing and notices skipped frames.
* ``Heartbeat`` is a 200 Hz loop (a stand-in for a controller) on the shared
  workers. It keeps its rate while the camera blocks.

Run it from the repository root::

    python examples/camera.py                 # 3 s of real time
    python examples/camera.py --duration 10 --workers 1

The exit status is 0 when frames flowed and the heartbeat achieved its rate
within 5 %. ``--no-rate-check`` leaves the rate out of the exit status (it is
still printed): the test suite runs the example that way, because a shared CI
machine cannot promise real-time rates; ``benchmarks/`` measure them.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
from typing import NamedTuple

import torch

import mujou_actors as mujou

HEARTBEAT_HZ = 200.0
CAMERA_FPS = 30.0


class Frame(NamedTuple):
    """One captured image."""

    index: int  # capture counter, from 0
    captured: float  # time.monotonic() when the image was ready, seconds
    image: torch.Tensor  # (3, 48, 64) uint8


class Camera(mujou.Node):
    """A camera driver: blocks until an image is there and sends it.

    The capture thread is ordinary Python code that knows nothing of mujou: it
    delivers an image every ``1 / fps`` s, each ``readout`` s after the end of
    its frame interval, and drops its oldest image when two are waiting (as a camera
    ring buffer does), counting it in ``capture_drops``. When the node finds
    several images waiting it sends the newest and counts the others in
    ``stale``.
    """

    frame = mujou.Output(Frame)

    def __init__(self, *, fps: float = CAMERA_FPS, readout: float = 0.5 / CAMERA_FPS,
                 timeout: float = 1.0) -> None:
        super().__init__(period=1.0 / fps, dedicated_thread=True)
        self.fps = fps
        self.readout = readout
        self.timeout = timeout
        self.sent = 0
        self.stale = 0
        self.capture_drops = 0

    def on_start(self) -> None:
        self._images: queue.Queue[Frame] = queue.Queue(maxsize=2)
        self._stop_capture = threading.Event()
        self._capture = threading.Thread(target=self._capture_loop, name="camera-capture",
                                         daemon=True)
        self._capture.start()

    def on_update(self, dt: float) -> None:
        try:
            frame = self._images.get(timeout=self.timeout)  # blocks this node's thread only
        except queue.Empty:
            raise RuntimeError(f"no image from the camera for {self.timeout} s") from None
        while not self._images.empty():  # fell behind: send the newest image
            frame = self._images.get_nowait()
            self.stale += 1
        self.frame.send(frame)
        self.sent += 1

    def on_stop(self) -> None:
        self._stop_capture.set()
        self._capture.join()

    def _capture_loop(self) -> None:
        """The producer: one synthetic image every 1/fps s until stopped."""
        period = 1.0 / self.fps
        due = time.monotonic() + period + self.readout
        index = 0
        while not self._stop_capture.wait(max(0.0, due - time.monotonic())):
            image = torch.full((3, 48, 64), 32, dtype=torch.uint8)
            col = (4 * index) % 56
            image[:, 20:28, col:col + 8] = 255  # a bright square moving right
            frame = Frame(index, time.monotonic(), image)
            try:
                self._images.put_nowait(frame)
            except queue.Full:
                try:
                    self._images.get_nowait()
                    self.capture_drops += 1
                except queue.Empty:
                    pass
                self._images.put_nowait(frame)
            index += 1
            due += period


class FrameStats(mujou.Node):
    """Triggered by frames: capture-to-processing latency and skipped frames."""

    frame = mujou.Input(Frame, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.frames = 0
        self.skipped = 0
        self.latency_sum = 0.0
        self.latency_max = 0.0
        self.brightness = 0.0
        self._last_index: int | None = None

    def on_update(self, dt: float) -> None:
        now = time.monotonic()
        for frame in self.frame.drain():
            if self._last_index is not None:
                self.skipped += frame.index - self._last_index - 1
            self._last_index = frame.index
            latency = now - frame.captured
            self.latency_sum += latency
            self.latency_max = max(self.latency_max, latency)
            self.brightness = frame.image.float().mean().item()
            self.frames += 1


class Heartbeat(mujou.Node):
    """A 200 Hz loop on the worker pool: a small torch step every 5 ms."""

    def __init__(self, *, hz: float = HEARTBEAT_HZ) -> None:
        super().__init__(period=1.0 / hz)
        self.x = torch.ones(8)
        self.w = torch.eye(8) * 0.5

    def on_update(self, dt: float) -> None:
        self.x = torch.tanh(self.w @ self.x + 1.0)


class CameraRig(mujou.Node):
    """The root: the camera, its frame statistics and the heartbeat."""

    def __init__(self) -> None:
        super().__init__(period=None)
        self.camera = Camera()
        self.frame_stats = FrameStats()
        self.heartbeat = Heartbeat()
        mujou.connect(self.camera.frame, self.frame_stats.frame)


def main(argv: list[str] | None = None) -> int:
    """Run the rig in real time, print rates; 0 when frames flowed and the heartbeat held."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0,
                        help="seconds of real time (default: 3)")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker threads (default: mujou's choice)")
    parser.add_argument("--no-rate-check", action="store_true",
                        help="exit 0 when frames flowed, whatever rate the heartbeat achieved")
    args = parser.parse_args(argv)

    rig = CameraRig()
    run = mujou.run(rig, timer="realtime", duration=args.duration, workers=args.workers)
    run.join()
    stats = run.stats()

    # Every update due at t <= duration ran: rates are counted over the duration.
    print(f"camera rig: {args.duration:g} s of real time, "
          f"threads {', '.join(sorted(stats.workers))}")
    print(f"  {'node':<12}{'updates':>8}{'rate [Hz]':>11}{'mean dt [ms]':>14}"
          f"{'lateness p99 [ms]':>19}{'overruns':>10}")
    for path, node in stats.nodes.items():
        if path:  # the root is a pure container
            print(f"  {path:<12}{node.updates:>8}{node.updates / args.duration:>11.1f}"
                  f"{node.dt_mean * 1e3:>14.2f}{node.lateness_p99 * 1e3:>19.3f}"
                  f"{node.overruns:>10}")

    camera, frames = rig.camera, rig.frame_stats
    mean_latency = frames.latency_sum / frames.frames if frames.frames else float("nan")
    blocked = stats.nodes["camera"].hook_time / stats.wall
    print(f"  camera: {camera.sent} frames sent, {camera.stale} stale, "
          f"{camera.capture_drops} dropped at capture; blocked in on_update "
          f"{blocked:.0%} of the time")
    print(f"  frame stats: {frames.frames} processed, {frames.skipped} skipped; capture to "
          f"processing mean {mean_latency * 1e3:.2f} ms, max {frames.latency_max * 1e3:.2f} ms")

    beat_hz = stats.nodes["heartbeat"].updates / args.duration
    held = abs(beat_hz - HEARTBEAT_HZ) <= 0.05 * HEARTBEAT_HZ
    flowed = frames.frames >= 0.8 * CAMERA_FPS * args.duration
    print(f"  heartbeat: {beat_hz:.1f} Hz of {HEARTBEAT_HZ:g} Hz while the camera blocked: "
          f"{'held (within 5 %)' if held else 'NOT held'}")
    print(f"  frames flowed: {'yes' if flowed else 'NO'} "
          f"({frames.frames} of ~{CAMERA_FPS * args.duration:.0f} expected)")
    return 0 if flowed and (held or args.no_rate_check) else 1


if __name__ == "__main__":
    sys.exit(main())
