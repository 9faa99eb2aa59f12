"""Balance MuJoCo's inverted pendulum with an LQR, as a net of mujou_actors nodes.

The pipeline, with the rate of each node::

    Physics (500 Hz) --state--> Sensor (250 Hz) --measurement--> Controller (100 Hz)
      ^       |                                                        |
      |       +--state--> Recorder (on every message) <--command-------+
      |                                                                |
      +------------------------------command---------------------------+

* ``Physics`` steps gymnasium's ``inverted_pendulum.xml`` with MuJoCo every 2 ms,
  holding the newest command (zero-order hold), and sends the true state
  ``[x, theta, xdot, thetadot]`` (m, rad, m/s, rad/s).
* ``Sensor`` samples the newest state every 4 ms and adds Gaussian noise.
* ``Controller`` computes ``u = clip(-K m, -3, 3)`` every 10 ms from the newest
  measurement ``m``, with the LQR gain ``K`` of ``_pendulum_model``.
* ``Recorder`` has no period: every message on its inputs triggers it, so it
  keeps every true state and every command for the summary and the plot.

With the simulated timer (the default) the run goes as fast as the CPU allows and
is bit-for-bit reproducible: the same seed gives the same fingerprint whatever
``--workers`` is. A message sent at time ``t`` reaches periodic nodes only after
``t``, so the controller acts on a measurement 4-6 ms old, like a real sampled
loop.

Run it from the repository root::

    python examples/inverted_pendulum.py                # 60 s simulated, seed 0
    python examples/inverted_pendulum.py --workers 2 --duration 10 --no-plot
    python examples/inverted_pendulum.py --timer realtime --duration 5

Stop and resume: ``--save-state PATH`` writes the net's final state with
``mujou.save``; ``--restore PATH`` starts from such a file, and ``--duration``
then counts from the snapshot's time. With the simulated timer, a 60 s run and a
30 s run resumed for another 30 s end in bit-identical states::

    python examples/inverted_pendulum.py --duration 30 --save-state half.mujou
    python examples/inverted_pendulum.py --duration 30 --restore half.mujou

The exit status is 0 when the pole stayed up (``|theta| < 0.2 rad`` throughout).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from typing import Any

import mujoco
import torch

import mujou_actors as mujou

# The framework-free plant, sensor and LQR live next to this file.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import _pendulum_model as pm  # noqa: E402

PHYSICS_PERIOD = pm.PHYSICS_PERIOD_NS / 1e9  # 0.002 s
SENSOR_PERIOD = pm.SENSOR_PERIOD_NS / 1e9  # 0.004 s
CONTROL_PERIOD = pm.CONTROL_PERIOD_NS / 1e9  # 0.01 s


class Physics(mujou.Node):
    """The plant: MuJoCo's inverted pendulum, stepped every 2 ms.

    Each update holds the newest command (zero before the first one) for
    ``dt`` seconds of MuJoCo time and sends the true state. ``on_start`` draws
    the initial state from the node's own generator and sends it, so the first
    state is the one at t = 0.
    """

    command = mujou.Input(torch.Tensor, shape=(1,), dtype=torch.float64, depth=1)
    state = mujou.Output(torch.Tensor, shape=(4,), dtype=torch.float64)

    def __init__(self, *, seed: int | None = None) -> None:
        super().__init__(period=PHYSICS_PERIOD, seed=seed)
        self.model, self.data = pm.load_model(timestep=PHYSICS_PERIOD)
        self.behind = 0.0  # seconds of the run's timer not simulated yet

    def on_start(self) -> None:
        self.behind = 0.0
        self.state.send(pm.reset(self.model, self.data, self.generator))

    def on_update(self, dt: float) -> None:
        u = self.command.read()
        # One MuJoCo step per 2 ms of dt: exactly one with the simulated timer
        # (dt == period); with the real-time timer a late tick catches up.
        self.behind += dt
        step = self.model.opt.timestep
        while self.behind > 0.5 * step:
            pm.step_physics(self.model, self.data, 0.0 if u is None else u)
            self.behind -= step
        self.state.send(pm.true_state(self.data))

    # MuJoCo's state is not a tensor attribute: add it to the node's state so
    # that snapshots and restarts carry it.
    _MJ_STATE = mujoco.mjtState.mjSTATE_INTEGRATION

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        buf = torch.empty(mujoco.mj_stateSize(self.model, self._MJ_STATE), dtype=torch.float64)
        mujoco.mj_getState(self.model, self.data, buf.numpy(), self._MJ_STATE)
        state["mujoco"] = buf
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        buf = state.pop("mujoco").to(torch.float64).contiguous()
        super().load_state_dict(state)
        mujoco.mj_setState(self.model, self.data, buf.numpy(), self._MJ_STATE)
        # Exact because this node reads only qpos and qvel between steps:
        # mj_forward recomputes derived quantities (xpos, cfrc_ext, ...) from
        # the restored state, not as the last mj_step left them. A node that
        # reads those saves them too (docs/state.md, "a simulator's state").
        mujoco.mj_forward(self.model, self.data)


class Sensor(mujou.Node):
    """A noisy state sensor sampling every 4 ms.

    Sends the newest true state plus zero-mean Gaussian noise (2 mm / 2 mrad on
    positions, 0.02 m/s / 0.02 rad/s on velocities) drawn from the node's own
    generator.
    """

    state = mujou.Input(torch.Tensor, shape=(4,), dtype=torch.float64, depth=1)
    measurement = mujou.Output(torch.Tensor, shape=(4,), dtype=torch.float64)

    def __init__(self, *, noise: pm.SensorNoise = pm.SensorNoise(),  # noqa: B008 - frozen
                 seed: int | None = None) -> None:
        super().__init__(period=SENSOR_PERIOD, seed=seed)
        self.noise = noise

    def on_update(self, dt: float) -> None:
        state = self.state.read()
        if state is not None:
            self.measurement.send(pm.measure(state, self.generator, self.noise))


class Controller(mujou.Node):
    """LQR state feedback every 10 ms: ``u = clip(-K m, -3, 3)``.

    ``K`` is designed for the 10 ms zero-order-hold discretisation of the MuJoCo
    model (see ``_pendulum_model.lqr_gain``); ``m`` is the newest measurement.
    A command unit pushes the cart with 100 N.
    """

    measurement = mujou.Input(torch.Tensor, shape=(4,), dtype=torch.float64, depth=1)
    command = mujou.Output(torch.Tensor, shape=(1,), dtype=torch.float64)

    def __init__(self) -> None:
        super().__init__(period=CONTROL_PERIOD)
        model, _ = pm.load_model(timestep=PHYSICS_PERIOD)
        self.gain = pm.lqr_gain(model, dt_control=CONTROL_PERIOD)  # (1, 4)

    def on_update(self, dt: float) -> None:
        m = self.measurement.read()
        if m is not None:
            u = -(self.gain @ m)
            self.command.send(u.clamp(-pm.CTRL_LIMIT, pm.CTRL_LIMIT))


class Recorder(mujou.Node):
    """Keeps every true state and every command, with the time it arrived.

    It has no period: each message triggers an update (messages that arrive
    together give one update), and ``depth=None`` keeps them all until
    ``drain()``. Its clock is the sum of the ``dt`` of its updates.
    """

    state = mujou.Input(torch.Tensor, shape=(4,), dtype=torch.float64, depth=None)
    command = mujou.Input(torch.Tensor, shape=(1,), dtype=torch.float64, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.now_ns = 0
        self.state_t: list[float] = []
        self.states: list[torch.Tensor] = []
        self.command_t: list[float] = []
        self.commands: list[torch.Tensor] = []

    def on_update(self, dt: float) -> None:
        self.now_ns += round(dt * 1e9)
        t = self.now_ns / 1e9
        for s in self.state.drain():
            self.state_t.append(t)
            self.states.append(s)  # messages are shared read-only: keep, never modify
        for u in self.command.drain():
            self.command_t.append(t)
            self.commands.append(u)

    def trajectory(self) -> dict[str, torch.Tensor]:
        """The recording as float64 tensors: ``t, x, theta`` and ``t_u, u``."""
        f64 = torch.float64
        states = torch.stack(self.states) if self.states else torch.zeros(0, 4, dtype=f64)
        commands = torch.cat(self.commands) if self.commands else torch.zeros(0, dtype=f64)
        return {
            "t": torch.tensor(self.state_t, dtype=f64),
            "x": states[:, 0],
            "theta": states[:, 1],
            "t_u": torch.tensor(self.command_t, dtype=f64),
            "u": commands,
        }


class Pendulum(mujou.Node):
    """The root: holds the four nodes and wires them. It never updates itself."""

    def __init__(self, *, physics_seed: int | None = None,
                 sensor_seed: int | None = None) -> None:
        super().__init__(period=None)
        self.physics = Physics(seed=physics_seed)
        self.sensor = Sensor(seed=sensor_seed)
        self.controller = Controller()
        self.recorder = Recorder()
        mujou.connect(self.physics.state, self.sensor.state)
        mujou.connect(self.sensor.measurement, self.controller.measurement)
        mujou.connect(self.controller.command, self.physics.command)
        mujou.connect(self.physics.state, self.recorder.state)
        mujou.connect(self.controller.command, self.recorder.command)


def make_net(seed: int | None = None) -> Pendulum:
    """Build the pendulum net.

    Args:
        seed (int | None): seeds of the two random nodes. An int gives Physics
            ``2 * seed`` and Sensor ``2 * seed + 1``, the generators of
            ``_pendulum_model.simulate(seed)``: the net then follows that
            framework-free reference loop sample for sample. None leaves the
            seeds to ``mujou.run(seed=...)``, which derives them from the paths.

    Returns:
        Pendulum: the root node.
    """
    if seed is None:
        return Pendulum()
    return Pendulum(physics_seed=2 * seed, sensor_seed=2 * seed + 1)


def fingerprint(traj: dict[str, torch.Tensor]) -> str:
    """A short hex digest of the recorded times, angles, positions and commands."""
    h = hashlib.sha256()
    for key in ("t", "theta", "x", "t_u", "u"):
        h.update(traj[key].numpy().tobytes())
    return h.hexdigest()[:16]


def plot(traj: dict[str, torch.Tensor], path: str) -> None:
    """Write a PNG of pole angle, cart position and command against time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_th, ax_x, ax_u) = plt.subplots(3, 1, sharex=True, figsize=(9, 7))
    ax_th.plot(traj["t"], traj["theta"], lw=0.7)
    ax_th.set_ylabel("pole angle [rad]")
    ax_x.plot(traj["t"], traj["x"], lw=0.7, color="tab:green")
    ax_x.set_ylabel("cart x [m]")
    ax_u.step(traj["t_u"], traj["u"], where="post", lw=0.7, color="tab:orange")
    ax_u.set_ylabel("command [x100 N]")
    ax_u.set_xlabel("time [s]")
    ax_th.set_title("mujou_actors: inverted pendulum, LQR at 100 Hz")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run the net, print a summary, write the plot; 0 when the pole stayed up."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0,
                        help="seconds of the run's timer (default: 60)")
    parser.add_argument("--seed", type=int, default=0, help="run seed (default: 0)")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker threads (default: mujou's choice)")
    parser.add_argument("--timer", choices=("simulated", "realtime"), default="simulated")
    parser.add_argument("--plot", default="pendulum.png", metavar="PATH",
                        help="PNG to write (default: pendulum.png)")
    parser.add_argument("--no-plot", action="store_true", help="do not write the plot")
    parser.add_argument("--save-state", metavar="PATH",
                        help="after the run, save the net's state to PATH (mujou.save)")
    parser.add_argument("--restore", metavar="PATH",
                        help="start from a state saved with --save-state; --duration "
                             "then counts from its time, and the summary covers only "
                             "what this run recorded")
    args = parser.parse_args(argv)

    net = make_net(seed=args.seed)
    start = 0.0  # seconds of the run's timer at the start
    if args.restore:
        # The recording is not part of the state, and neither is the recorder's
        # clock (a plain int): start it where the snapshot's recorder left off.
        saved = mujou.load(args.restore)
        start = saved["time_ns"] / 1e9
        # (mujou.run checks that the snapshot fits this net; .get leaves that to it.)
        last = saved.get("schedule", {}).get("recorder", {}).get("last_update_ns")
        net.recorder.now_ns = last if last is not None else saved["time_ns"]
    # The depth=1 inputs keep only the newest message on purpose (sample and
    # hold): a message replaced before its node read it counts as a drop, so
    # the slower sensor and controller report the messages they skip, and the
    # summary prints those counts.
    run = mujou.run(net, timer=args.timer, duration=args.duration, seed=args.seed,
                    workers=args.workers, state=args.restore)
    run.join()
    if args.save_state:
        mujou.save(run.state_dict(), args.save_state)
    stats = run.stats()
    traj = net.recorder.trajectory()

    t, theta, x = traj["t"], traj["theta"].abs(), traj["x"].abs()
    late = t >= 1.0  # after the start transient (all of a restored run)
    stayed_up = len(theta) > 0 and bool((theta < pm.THETA_LIMIT_RAD).all())
    workers = sum(1 for name in stats.workers if name.startswith("mujou-worker-"))

    def peak(values: torch.Tensor) -> float:
        return float(values.max()) if len(values) else float("nan")

    resumed = f" from t = {start:g} s" if args.restore else ""
    print(f"inverted pendulum: {stats.time - start:g} s{resumed} on the {args.timer} timer, "
          f"seed {args.seed}, {workers} worker(s)")
    print(f"  {'node':<12}{'updates':>9}{'hook time [s]':>15}  drops (newest kept)")
    for path, node in stats.nodes.items():
        if path:  # the root is a pure container
            drops = ", ".join(f"{name} {n}" for name, n in node.drops.items() if n) or "-"
            print(f"  {path:<12}{node.updates:>9}{node.hook_time:>15.3f}  {drops}")
    print("  (depth-1 inputs keep only the newest message: one replaced unread is a drop)")
    print(f"  max |theta|  {peak(theta):.5f} rad   (after 1 s: {peak(theta[late]):.5f} rad)")
    print(f"  max |x|      {peak(x):.5f} m     (after 1 s: {peak(x[late]):.5f} m)")
    print(f"  stayed up    {'yes' if stayed_up else 'NO'} "
          f"(|theta| < {pm.THETA_LIMIT_RAD} rad throughout)")
    print(f"  wall time    {stats.wall:.2f} s for {stats.time - start:g} s: "
          f"{(stats.time - start) / stats.wall:.1f}x real time")
    print(f"  fingerprint  {fingerprint(traj)}")
    if args.save_state:
        print(f"  state        {args.save_state}")
    if not args.no_plot:
        plot(traj, args.plot)
        print(f"  plot         {args.plot}")
    return 0 if stayed_up else 1


if __name__ == "__main__":
    sys.exit(main())
