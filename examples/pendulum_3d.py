"""The inverted pendulum in Foxglove's 3D panel: frame transforms and a scene, recorded or live.

The main job (``inverted_pendulum.py``: MuJoCo physics at 500 Hz, a noisy
sensor, an LQR controller at 100 Hz) with one node more, ``Scene`` (50 Hz),
which reads the true state and sends the robot as Foxglove draws it:

* ``scene.transforms``, declared ``Output(dict, foxglove="foxglove.FrameTransform")``:
  two transforms an update, ``world`` -> ``cart`` (the cart's position ``x``
  along the rail) and ``cart`` -> ``pole`` (the pole's angle ``theta``, a
  rotation about the hinge's y axis);
* ``scene.scene``, declared ``Output(dict, foxglove="foxglove.SceneUpdate")``:
  the rail (a line in ``world``), the cart (a cube in ``cart``), and in
  ``pole`` the rod (a line) and the bob (a sphere).

Each message is a dict of the Foxglove schema's fields; the declaration gives
its channel that schema's name, which is how Foxglove's 3D panel finds it, live
(``mujou.serve_foxglove``) and in a recording (``Recording(view=True)`` writes the
``/view/<path>`` channels Foxglove reads). The messages carry no ``timestamp``:
their views are stamped with the send's time.

Run it from the repository root::

    python examples/pendulum_3d.py --duration 10 --out pendulum_3d.mcap   # record
    python examples/pendulum_3d.py --live --duration 60                    # serve it live

Open the file in Foxglove (Open local file), or connect to ``ws://127.0.0.1:8765``
(Open connection, Foxglove WebSocket), and add a 3D panel: the cart slides on
its rail and the pole stays up. ``mujou view pendulum_3d.mcap`` serves the
file with playback controls; its ``/mujou/log`` channel holds the run's log.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

import torch

import mujou_actors as mujou
from mujou_actors.recording import mcapfile

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import inverted_pendulum as ip  # noqa: E402

POLE_LENGTH = 0.6  # m: the model's pole (inverted_pendulum.xml, "cpole")
RAIL = 1.0  # m: the cart's slider range is [-1, 1]


def _vector(x: float = 0.0, y: float = 0.0, z: float = 0.0) -> dict[str, float]:
    return {"x": x, "y": y, "z": z}


def _pose(x: float = 0.0, y: float = 0.0, z: float = 0.0) -> dict[str, Any]:
    return {"position": _vector(x, y, z), "orientation": {"x": 0.0, "y": 0.0, "z": 0.0,
                                                          "w": 1.0}}


def _color(r: float, g: float, b: float) -> dict[str, float]:
    return {"r": r, "g": g, "b": b, "a": 1.0}


def _line(points: list[dict[str, float]], color: dict[str, float]) -> dict[str, Any]:
    return {"type": 0, "pose": _pose(), "thickness": 0.02, "scale_invariant": False,  # 0: strip
            "points": points, "color": color, "colors": [], "indices": []}


def _entity(frame: str, id_: str, **primitives: list[dict[str, Any]]) -> dict[str, Any]:
    # frame_locked: the entity follows its frame as the transforms move it, so the
    # geometry is the same every time; only the transforms change.
    return {"frame_id": frame, "id": id_, "lifetime": {"sec": 0, "nsec": 0},
            "frame_locked": True, "metadata": [], **primitives}


SCENE: dict[str, Any] = {"deletions": [], "entities": [
    _entity("world", "rail", lines=[_line([_vector(-RAIL), _vector(RAIL)],
                                          _color(0.3, 0.3, 0.7))]),
    _entity("cart", "cart", cubes=[{"pose": _pose(), "size": _vector(0.3, 0.2, 0.2),
                                    "color": _color(0.7, 0.7, 0.0)}]),
    _entity("pole", "pole",
            lines=[_line([_vector(), _vector(z=POLE_LENGTH)], _color(0.0, 0.7, 0.7))],
            spheres=[{"pose": _pose(z=POLE_LENGTH), "size": _vector(0.1, 0.1, 0.1),
                      "color": _color(0.8, 0.2, 0.2)}]),
]}
"""The robot as Foxglove's SceneUpdate: each part in the frame it moves with."""


class Scene(mujou.Node):
    """The pendulum for Foxglove's 3D panel: its frames' transforms, and its parts.

    Every 20 ms: ``world`` -> ``cart`` (translation x) and ``cart`` -> ``pole``
    (rotation theta about y, the hinge's axis: a positive angle tips the pole
    towards +x) as two ``foxglove.FrameTransform``, then the ``SCENE``.
    """

    state = mujou.Input(torch.Tensor, shape=(4,), dtype=torch.float64, depth=1)
    transforms = mujou.Output(dict, foxglove="foxglove.FrameTransform")
    scene = mujou.Output(dict, foxglove="foxglove.SceneUpdate")

    def __init__(self) -> None:
        super().__init__(period=0.02)

    def on_update(self, dt: float) -> None:
        state = self.state.read()
        if state is None:
            return
        x, theta = state[0].item(), state[1].item()
        self.transforms.send({"parent_frame_id": "world", "child_frame_id": "cart",
                              "translation": _vector(x), "rotation": {
                                  "x": 0.0, "y": 0.0, "z": 0.0, "w": 1.0}})
        self.transforms.send({"parent_frame_id": "cart", "child_frame_id": "pole",
                              "translation": _vector(), "rotation": {
                                  "x": 0.0, "y": math.sin(theta / 2), "z": 0.0,
                                  "w": math.cos(theta / 2)}})
        self.scene.send(SCENE)


def make_net(seed: int | None = None) -> dict[str, mujou.Node]:
    """The pendulum of ``inverted_pendulum.py`` and its ``Scene``."""
    pendulum, scene = ip.make_net(seed=seed), Scene()
    mujou.connect(pendulum.physics.state, scene.state)
    return {"pendulum": pendulum, "scene": scene}


def main(argv: list[str] | None = None) -> int:
    """Record the pendulum with its views (or serve it live) and say what the file holds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of the run")
    parser.add_argument("--out", default="pendulum_3d.mcap", help="the recording to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--live", action="store_true",
                        help="real time, served to Foxglove at ws://127.0.0.1:8765, "
                             "not recorded")
    args = parser.parse_args(argv)

    if args.live:
        run = mujou.run(make_net(args.seed), timer="realtime", duration=args.duration)
        with mujou.serve_foxglove(run):
            print("serving at ws://127.0.0.1:8765: open it in Foxglove and add a 3D panel")
            run.join()
        return 0

    run = mujou.run(make_net(args.seed), timer="simulated", duration=args.duration,
                    seed=args.seed, record=mujou.Recording(
                        args.out, ports=["scene.*", "pendulum.physics.state"],
                        view=True, log=True))
    run.join()
    info = mcapfile.info(args.out)
    print(f"recorded     {args.duration:g} s to {args.out}: {info.messages} messages")
    for channel in info.views:
        print(f"view         {channel.topic:<32} {channel.type:<26} {channel.count} messages")
    print("open it in Foxglove (Open local file) and add a 3D panel")
    return 0


if __name__ == "__main__":
    sys.exit(main())
