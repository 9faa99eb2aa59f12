"""Camera images -> CNN perception -> policy -> actuator, the models on a GPU if there is one.

The net, on the simulated timer::

    World (50 Hz, CPU, own thread) --frame--> Perception (CNN, every frame)
      ^                                          | features
      | command                                  v
    Actuator (CPU, every action) <--action-- Policy (MLP, every feature vector)

* ``World`` is a MuJoCo scene: a puck on a table, pushed by two motors
  (x and y). Every 20 ms it applies the newest command, steps the physics and
  sends a ``(3, 48, 64)`` uint8 image of the table seen from above.
  The image comes from MuJoCo's offscreen renderer. Rendering needs an OpenGL
  context; unless ``MUJOCO_GL`` is set, the example asks for EGL
  (``MUJOCO_GL=egl``, GPU or Mesa drivers), which works headless. Where no
  OpenGL context can be made at all (no EGL or OSMesa library), ``World`` draws
  the puck itself with torch (``--images synthetic``, or automatically, and
  the summary says why). The renderer's context belongs to the thread that made it
  current, so ``World`` runs on a dedicated thread: its ``on_start`` (which
  makes the renderer), ``on_update`` and ``on_stop`` all run there.
* ``Perception`` (a small CNN) and ``Policy`` (an MLP head, tanh-bounded
  forces) are the model nodes: they run on ``cuda:0`` when CUDA is available
  and on the CPU otherwise (``--device`` chooses). Nothing in their code
  depends on the device: the run moves the CPU image to the GPU on
  Perception's stream, keeps the features on the GPU between the two nodes
  and copies the action to host memory for the CPU Actuator.
  Their weights are drawn from a CPU generator with a fixed seed and then
  moved to the node's device, so the CPU and the GPU start from the same
  numbers. (The node's own ``self.generator`` lives on its device, and a CUDA
  generator draws different numbers from a CPU one.)
* ``Actuator`` (CPU) smooths and clamps the forces and sends them back to
  ``World`` as the next command; it keeps every command for the summary.

The same code gives the same results on the CPU and on a GPU up to float
rounding: ``run_pipeline`` turns TF32 off (a process-wide torch setting, set by the
host before the run), since TF32 convolutions and matmuls round to 10 bits.
On the simulated timer the run is bit-for-bit reproducible on one machine for
any number of workers. ``benchmarks/gpu_check.py`` runs it on both devices and
compares.

Run it from the repository root::

    python examples/gpu_pipeline.py                        # 2 s, cuda:0 if available
    python examples/gpu_pipeline.py --device cpu --duration 5 --workers 1
    python examples/gpu_pipeline.py --images synthetic
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from typing import Any, NamedTuple

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; read when mujoco is imported

import mujoco  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import mujou_actors as mujou  # noqa: E402

FRAME_PERIOD = 0.02  # s: World's rate, 50 Hz
SUBSTEPS = 10  # physics steps of 2 ms per frame
HEIGHT, WIDTH = 48, 64
FEATURES = 32
MAX_FORCE = 2.0  # N, per axis
SMOOTHING = 0.5  # Actuator: command = (1 - s) * action + s * previous command

SCENE = f"""
<mujoco>
  <option timestep="{FRAME_PERIOD / SUBSTEPS}"/>
  <visual><global offwidth="{WIDTH}" offheight="{HEIGHT}"/></visual>
  <worldbody>
    <light pos="0 0 3" dir="0 0 -1"/>
    <camera name="top" pos="0 0 1.6" xyaxes="1 0 0 0 1 0"/>
    <geom type="plane" size="1 0.75 0.1" rgba="0.2 0.3 0.4 1"/>
    <body name="puck" pos="0 0 0.05">
      <joint name="x" type="slide" axis="1 0 0" range="-0.9 0.9" limited="true" damping="1"/>
      <joint name="y" type="slide" axis="0 1 0" range="-0.6 0.6" limited="true" damping="1"/>
      <geom type="cylinder" size="0.08 0.04" rgba="1 0.8 0.1 1" mass="0.5"/>
    </body>
  </worldbody>
  <actuator>
    <motor joint="x" ctrlrange="-{MAX_FORCE} {MAX_FORCE}" ctrllimited="true"/>
    <motor joint="y" ctrlrange="-{MAX_FORCE} {MAX_FORCE}" ctrllimited="true"/>
  </actuator>
</mujoco>
"""


class Frame(NamedTuple):
    """One camera image."""

    step: int  # frame counter, from 0
    image: torch.Tensor  # (3, HEIGHT, WIDTH) uint8, on the CPU


class World(mujou.Node):
    """The MuJoCo scene and its camera; applies the newest command each frame.

    Args:
        images (str): ``"render"`` (MuJoCo's renderer; fails without OpenGL),
            ``"synthetic"`` (the puck drawn with torch) or ``"auto"`` (render,
            else synthetic).
        start (tuple[float, float]): the puck's start position, metres.
    """

    command = mujou.Input(torch.Tensor, shape=(2,), dtype=torch.float32, depth=1)
    frame = mujou.Output(Frame)

    def __init__(self, images: str = "auto", start: tuple[float, float] = (0.3, -0.2)) -> None:
        super().__init__(period=FRAME_PERIOD, dedicated_thread=True)
        self.images = images
        self.start = start
        self.source = ""  # what made the images, for the summary
        self.positions: list[tuple[float, float]] = []

    def on_start(self) -> None:
        self.model = mujoco.MjModel.from_xml_string(SCENE)
        self.data = mujoco.MjData(self.model)
        self.data.qpos[:] = self.start
        mujoco.mj_forward(self.model, self.data)
        self.renderer: Any = None
        if self.images in ("auto", "render"):
            try:
                self.renderer = mujoco.Renderer(self.model, HEIGHT, WIDTH)
                self.source = f"MuJoCo render (MUJOCO_GL={os.environ.get('MUJOCO_GL')})"
            except Exception as exc:  # no OpenGL library or context on this machine
                if self.images == "render":
                    raise
                self.source = f"synthetic (no OpenGL context: {type(exc).__name__}: {exc})"
        else:
            self.source = "synthetic (--images synthetic)"
        ys, xs = torch.meshgrid(torch.arange(HEIGHT, dtype=torch.float64),
                                torch.arange(WIDTH, dtype=torch.float64), indexing="ij")
        self._pixels = (xs, ys)
        self.step = 0

    def on_update(self, dt: float) -> None:
        cmd = self.command.read()
        self.data.ctrl[:] = cmd.numpy() if cmd is not None else 0.0
        for _ in range(SUBSTEPS):
            mujoco.mj_step(self.model, self.data)
        self.positions.append((float(self.data.qpos[0]), float(self.data.qpos[1])))
        self.frame.send(Frame(self.step, self._image()))
        self.step += 1

    def on_stop(self) -> None:
        if self.renderer is not None:
            self.renderer.close()  # on the thread whose context it is

    def _image(self) -> torch.Tensor:
        if self.renderer is not None:
            self.renderer.update_scene(self.data, camera="top")
            return torch.from_numpy(np.ascontiguousarray(self.renderer.render())).permute(2, 0, 1)
        # The camera's view, drawn by hand: the table 2 m x 1.5 m fills the image.
        x, y = self.data.qpos[0], self.data.qpos[1]
        col, row = (x + 1.0) / 2.0 * WIDTH, (0.75 - y) / 1.5 * HEIGHT
        xs, ys = self._pixels
        disk = ((xs + 0.5 - col) ** 2 + (ys + 0.5 - row) ** 2) <= (0.08 / 2.0 * WIDTH) ** 2
        table = torch.tensor([50, 75, 100], dtype=torch.uint8).view(3, 1, 1)
        image = table.repeat(1, HEIGHT, WIDTH)
        image[:, disk] = torch.tensor([255, 204, 25], dtype=torch.uint8).view(3, 1)
        return image


def _fill(module: torch.nn.Module, seed: int) -> None:
    """Give every parameter of ``module`` values drawn on the CPU from ``seed``.

    The same numbers whatever the module's device, which is what makes the CPU
    and the GPU runs comparable.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            fan_in = p[0].numel() if p.dim() > 1 else p.numel()
            p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)


class Perception(mujou.Node):
    """A small CNN: an image to a feature vector, on ``device``.

    Args:
        device (str): ``"cpu"`` or ``"cuda:N"``.
        weights_seed (int): seed of the CPU generator the weights are drawn from.
    """

    frame = mujou.Input(Frame)  # triggers an update
    features = mujou.Output(torch.Tensor, shape=(FEATURES,), dtype=torch.float32)

    def __init__(self, device: str, weights_seed: int = 1) -> None:
        super().__init__(period=None, device=device)
        self.weights_seed = weights_seed

    def on_start(self) -> None:
        # Made on the meta device (no memory, no global RNG), then given storage
        # on this node's device, on its stream, and filled from a CPU generator.
        with torch.device("meta"):
            cnn = torch.nn.Sequential(
                torch.nn.Conv2d(3, 8, 5, stride=2), torch.nn.ReLU(),
                torch.nn.Conv2d(8, 16, 3, stride=2), torch.nn.ReLU(),
                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                torch.nn.Linear(16, FEATURES), torch.nn.Tanh())
        self.cnn = cnn.to_empty(device=self.device)
        _fill(self.cnn, self.weights_seed)

    def on_update(self, dt: float) -> None:
        frame = self.frame.read()  # its image is already on self.device
        with torch.no_grad():
            x = frame.image.unsqueeze(0).float() / 255.0
            self.features.send(self.cnn(x)[0])


class Policy(mujou.Node):
    """An MLP head: features to two forces in ``[-MAX_FORCE, MAX_FORCE]``, on ``device``.

    Args:
        device (str): ``"cpu"`` or ``"cuda:N"``.
        weights_seed (int): seed of the CPU generator the weights are drawn from.
    """

    features = mujou.Input(torch.Tensor, shape=(FEATURES,), dtype=torch.float32)
    action = mujou.Output(torch.Tensor, shape=(2,), dtype=torch.float32)

    def __init__(self, device: str, weights_seed: int = 2) -> None:
        super().__init__(period=None, device=device)
        self.weights_seed = weights_seed

    def on_start(self) -> None:
        with torch.device("meta"):
            mlp = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(),
                                      torch.nn.Linear(32, 2), torch.nn.Tanh())
        self.mlp = mlp.to_empty(device=self.device)
        _fill(self.mlp, self.weights_seed)

    def on_update(self, dt: float) -> None:
        with torch.no_grad():
            self.action.send(MAX_FORCE * self.mlp(self.features.read()))


class Actuator(mujou.Node):
    """Smooths and clamps the forces (CPU) and sends them to the World."""

    action = mujou.Input(torch.Tensor, shape=(2,), dtype=torch.float32)
    command = mujou.Output(torch.Tensor, shape=(2,), dtype=torch.float32)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.commands: list[torch.Tensor] = []

    def on_start(self) -> None:
        self.last = torch.zeros(2)

    def on_update(self, dt: float) -> None:
        action = self.action.read()  # a CPU tensor, whatever the Policy's device
        self.last = ((1 - SMOOTHING) * action + SMOOTHING * self.last).clamp(-MAX_FORCE,
                                                                               MAX_FORCE)
        self.commands.append(self.last)
        self.command.send(self.last)


class Pipeline(mujou.Node):
    """The whole net: World -> Perception -> Policy -> Actuator -> World.

    Args:
        device (str): where the model nodes run.
        images (str): the World's image source (see `World`).
        weights_seed (int): seed of the CNN's weights; the MLP's is the next one.
    """

    def __init__(self, device: str, images: str = "auto", weights_seed: int = 1) -> None:
        super().__init__()
        self.world = World(images)
        self.perception = Perception(device, weights_seed)
        self.policy = Policy(device, weights_seed + 1)
        self.actuator = Actuator()
        mujou.connect(self.world.frame, self.perception.frame)
        mujou.connect(self.perception.features, self.policy.features)
        mujou.connect(self.policy.action, self.actuator.action)
        mujou.connect(self.actuator.command, self.world.command)


def default_device() -> str:
    """``"cuda:0"`` when CUDA is available, else ``"cpu"``."""
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def run_pipeline(device: str, *, duration: float = 2.0, workers: int | None = None,
                 seed: int = 0, images: str = "auto", weights_seed: int = 1) -> dict[str, Any]:
    """Run the pipeline on the simulated timer and return what it did.

    Args:
        device (str): where the model nodes run (``"cpu"``, ``"cuda:0"``).
        duration (float): seconds of simulated time.
        workers (int, optional): worker threads (default: mujou's choice).
        seed (int): the run's seed.
        images (str): the image source (see `World`).
        weights_seed (int): seed of the models' weights (see `Pipeline`).

    Returns:
        dict[str, Any]: ``commands`` (N, 2) float32 and ``positions`` (M, 2)
        float64 CPU tensors, ``source`` (the image source used), ``updates``
        (node path -> updates) and ``fingerprint`` (a hash of both tensors'
        bytes, equal between bit-identical runs).
    """
    torch.backends.cuda.matmul.allow_tf32 = False  # process-wide: set by the host, before
    torch.backends.cudnn.allow_tf32 = False        # the run (see docs/devices.md)
    net = Pipeline(device, images, weights_seed)
    run = mujou.run(net, timer="simulated", duration=duration, seed=seed, workers=workers)
    run.join()
    commands = torch.stack(net.actuator.commands) if net.actuator.commands else torch.zeros(0, 2)
    positions = torch.tensor(net.world.positions, dtype=torch.float64).reshape(-1, 2)
    digest = hashlib.sha256(commands.numpy().tobytes() + positions.numpy().tobytes())
    stats = run.stats()
    return {"commands": commands, "positions": positions, "source": net.world.source,
            "updates": {p: n.updates for p, n in stats.nodes.items() if p},
            "fingerprint": digest.hexdigest()[:16]}


def main(argv: list[str] | None = None) -> int:
    """Run the pipeline and print a summary; 0 when every frame got its command."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=default_device(),
                        help="device of the model nodes (default: cuda:0 if available, else cpu)")
    parser.add_argument("--duration", type=float, default=2.0, help="simulated seconds")
    parser.add_argument("--workers", type=int, default=None, help="worker threads")
    parser.add_argument("--seed", type=int, default=0, help="run seed")
    parser.add_argument("--images", choices=("auto", "render", "synthetic"), default="auto",
                        help="image source (default: render, else synthetic)")
    args = parser.parse_args(argv)

    result = run_pipeline(args.device, duration=args.duration, workers=args.workers,
                          seed=args.seed, images=args.images)
    commands, positions = result["commands"], result["positions"]
    print(f"gpu pipeline: {args.duration:g} s on the simulated timer, seed {args.seed}, "
          f"models on {args.device}")
    print(f"  images       {result['source']}")
    for path, updates in result["updates"].items():
        print(f"  {path:<12} {updates} updates")
    if len(positions):
        x, y = positions[-1].tolist()
        print(f"  puck at      x {x:+.4f} m, y {y:+.4f} m")
    if len(commands):
        print(f"  mean |force| {commands.abs().mean():.4f} N over {len(commands)} commands")
    print(f"  fingerprint  {result['fingerprint']}")
    frames = result["updates"].get("world", 0)
    # On the simulated timer a frame's whole chain runs at its own time (delta
    # cycles), so every frame, the last included, gets its command.
    return 0 if frames > 0 and len(commands) == frames else 1


if __name__ == "__main__":
    sys.exit(main())
