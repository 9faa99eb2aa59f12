"""Framework-free model of the MuJoCo inverted pendulum with a noisy sensor and an LQR.

This module holds the plant, sensor and controller pieces that the ``mujou_actors``
example nodes wrap. Nothing here depends on the framework: every function is a small
pure (or clearly state-mutating) helper so that it can be called from a node's tick.

Plant
    The ``inverted_pendulum.xml`` model that ships with gymnasium, loaded with
    :func:`load_model`. The physics timestep is overridden to 2 ms (500 Hz); the
    integrator stays the file's RK4. Generalised coordinates are
    ``qpos = [x, theta]`` (cart position in metres along the rail, pole angle in
    radians from upright, positive tipping the pole towards +x) and
    ``qvel = [xdot, thetadot]`` (m/s, rad/s). The rail is limited to ``|x| <= 1`` m
    and the hinge to ``|theta| <= pi/2``. The single actuator is a motor on the
    slider with ``ctrlrange = [-3, 3]`` and ``gear = 100``, so a command ``u``
    (dimensionless control units) pushes the cart with ``100 * u`` newtons.

State vector
    Everywhere below a *state* is a float64 tensor of shape ``(4,)`` ordered
    ``[x, theta, xdot, thetadot]`` in ``[m, rad, m/s, rad/s]``.

Timing (the reference schedule used by :func:`simulate`)
    Times are integer nanoseconds. Physics ticks every 2 ms, the sensor every
    4 ms, the controller every 10 ms. A value produced at time ``t`` is visible to
    consumers only at times strictly after ``t`` (at a shared time the updates run
    physics -> sensor -> controller, but each reads the snapshot taken before any of
    them ran). Concretely:

    * the physics tick at ``t > 0`` integrates ``[t - 2 ms, t]`` with the newest
      command produced before ``t`` (zero-order hold) and publishes ``x(t)``;
      the tick at ``t = 0`` only publishes the initial state;
    * the sensor tick at ``t`` samples the newest state produced before ``t``,
      i.e. ``x(t - 2 ms)``, and adds Gaussian noise;
    * the controller tick at ``t`` uses the newest sensor sample produced before
      ``t``, so it acts on a state that is 4 ms or 6 ms old (alternating, mean
      5 ms). This is the "one sample of latency" of a real sampled loop.

    The LQR is designed for the 10 ms zero-order-hold discretisation and, by
    default, :func:`control` is used without a predictor; the gain has ample
    margin for the 4-6 ms measurement delay: it still balances with about 40 ms of
    extra sensor delay (``__main__`` runs a stress check with +30 ms).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import NamedTuple

import gymnasium
import mujoco
import numpy as np
import torch

__all__ = [
    "PHYSICS_PERIOD_NS",
    "SENSOR_PERIOD_NS",
    "CONTROL_PERIOD_NS",
    "CTRL_LIMIT",
    "GEAR_N",
    "STATE_DIM",
    "THETA_LIMIT_RAD",
    "DEFAULT_Q",
    "DEFAULT_R",
    "SensorNoise",
    "RunResult",
    "model_path",
    "load_model",
    "make_generators",
    "initial_state",
    "reset",
    "true_state",
    "step_physics",
    "measure",
    "linearize",
    "dlqr",
    "lqr_gain",
    "control",
    "simulate",
]

#: Physics period in nanoseconds (2 ms, 500 Hz).
PHYSICS_PERIOD_NS: int = 2_000_000
#: Sensor period in nanoseconds (4 ms, 250 Hz).
SENSOR_PERIOD_NS: int = 4_000_000
#: Controller period in nanoseconds (10 ms, 100 Hz).
CONTROL_PERIOD_NS: int = 10_000_000

#: Symmetric actuator command limit (control units; force = ``GEAR_N * u`` newtons).
CTRL_LIMIT: float = 3.0
#: Actuator gear: newtons of cart force per control unit.
GEAR_N: float = 100.0
#: Length of the state vector ``[x, theta, xdot, thetadot]``.
STATE_DIM: int = 4
#: Pole angle (radians) within which a run counts as "stayed up".
THETA_LIMIT_RAD: float = 0.2

#: Default LQR state weights for ``[x, theta, xdot, thetadot]`` (Bryson-style:
#: about 1 / (acceptable excursion)^2 with 0.2 m, 0.05 rad, 1 m/s, 1 rad/s).
DEFAULT_Q: tuple[float, float, float, float] = (25.0, 400.0, 1.0, 1.0)
#: Default LQR weight on the command (control units^-2).
DEFAULT_R: float = 4.0


def _ns_to_s(ns: int) -> float:
    return ns * 1e-9


@dataclasses.dataclass(frozen=True)
class SensorNoise:
    """Standard deviations of the additive Gaussian sensor noise.

    The defaults are those of a decent encoder-based rig after differentiation:
    2 mm / 2 mrad (about 0.11 degrees) on positions and 0.02 m/s / 0.02 rad/s on
    velocities.

    Attributes:
        position_std: Noise std on ``x`` (metres) and ``theta`` (radians).
        velocity_std: Noise std on ``xdot`` (m/s) and ``thetadot`` (rad/s).
    """

    position_std: float = 0.002
    velocity_std: float = 0.02

    def stds(self) -> torch.Tensor:
        """Per-component noise std as a tensor.

        Returns:
            float64 tensor of shape ``(4,)``: ``[pos, pos, vel, vel]`` in
            ``[m, rad, m/s, rad/s]``.
        """
        p, v = self.position_std, self.velocity_std
        return torch.tensor([p, p, v, v], dtype=torch.float64)


def model_path() -> str:
    """Path of gymnasium's ``inverted_pendulum.xml``.

    Returns:
        Absolute path to the MJCF file shipped with the installed gymnasium.
    """
    return os.path.join(
        os.path.dirname(gymnasium.__file__), "envs/mujoco/assets/inverted_pendulum.xml"
    )


def load_model(timestep: float = 0.002) -> tuple[mujoco.MjModel, mujoco.MjData]:
    """Load the inverted pendulum and set the physics timestep.

    Args:
        timestep: Physics integration step in seconds (default 0.002 s, 500 Hz).
            The file's RK4 integrator is kept.

    Returns:
        ``(model, data)``; ``data`` is at the model's default (upright, at rest)
        state with ``mj_forward`` already run.
    """
    model = mujoco.MjModel.from_xml_path(model_path())
    model.opt.timestep = timestep
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    return model, data


def make_generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
    """Derive independent generators for the initial state and the sensor noise.

    The initial-state generator is seeded with ``2 * seed`` and the sensor one
    with ``2 * seed + 1`` so that the two streams never coincide across seeds.

    Args:
        seed: Non-negative run seed.

    Returns:
        ``(initial_state_generator, sensor_generator)``, both CPU generators.
    """
    g_init = torch.Generator().manual_seed(2 * seed)
    g_sensor = torch.Generator().manual_seed(2 * seed + 1)
    return g_init, g_sensor


def initial_state(
    generator: torch.Generator,
    theta_range: float = 0.05,
    x_range: float = 0.01,
    velocity_range: float = 0.05,
) -> torch.Tensor:
    """Draw a random initial state near upright.

    Each component is uniform in a symmetric interval: ``x`` in ``+-x_range`` m,
    ``theta`` in ``+-theta_range`` rad, ``xdot`` and ``thetadot`` in
    ``+-velocity_range`` (m/s, rad/s). Exactly 4 float64 draws are consumed.

    Args:
        generator: Torch generator providing the randomness.
        theta_range: Half-width of the pole-angle interval, radians.
        x_range: Half-width of the cart-position interval, metres.
        velocity_range: Half-width of both velocity intervals, m/s and rad/s.

    Returns:
        float64 tensor ``[x, theta, xdot, thetadot]`` of shape ``(4,)``.
    """
    u = torch.rand(STATE_DIM, generator=generator, dtype=torch.float64) * 2.0 - 1.0
    half = torch.tensor([x_range, theta_range, velocity_range, velocity_range], dtype=torch.float64)
    return u * half


def reset(
    model: mujoco.MjModel, data: mujoco.MjData, generator: torch.Generator
) -> torch.Tensor:
    """Reset the simulation to a random near-upright state at time 0 s.

    Args:
        model: Model from :func:`load_model`.
        data: Data to overwrite (time, state, control and warm-starts are reset).
        generator: Generator passed to :func:`initial_state`.

    Returns:
        The initial true state, float64 tensor ``(4,)``.
    """
    state = initial_state(generator)
    mujoco.mj_resetData(model, data)
    s = state.numpy()
    data.qpos[:] = s[:2]
    data.qvel[:] = s[2:]
    data.ctrl[:] = 0.0
    mujoco.mj_forward(model, data)
    return state


def true_state(data: mujoco.MjData) -> torch.Tensor:
    """Read the exact current state from MuJoCo.

    Args:
        data: Simulation data.

    Returns:
        float64 tensor ``[x, theta, xdot, thetadot]`` (m, rad, m/s, rad/s), a copy.
    """
    return torch.tensor(
        [data.qpos[0], data.qpos[1], data.qvel[0], data.qvel[1]], dtype=torch.float64
    )


def step_physics(
    model: mujoco.MjModel, data: mujoco.MjData, command: torch.Tensor | float
) -> None:
    """Advance the simulation by one physics step holding ``command``.

    Args:
        model: Model from :func:`load_model`.
        data: Data, advanced in place by ``model.opt.timestep`` seconds.
        command: Actuator command in control units (tensor of shape ``(1,)`` or a
            float); MuJoCo clamps it to ``[-3, 3]``, i.e. at most 300 N.
    """
    if isinstance(command, torch.Tensor):
        data.ctrl[0] = float(command.reshape(-1)[0])
    else:
        data.ctrl[0] = float(command)
    mujoco.mj_step(model, data)


def measure(
    state: torch.Tensor,
    generator: torch.Generator,
    noise: SensorNoise = SensorNoise(),
) -> torch.Tensor:
    """Noisy sensor reading of a state.

    Adds independent zero-mean Gaussian noise with the stds of ``noise``. Exactly 4
    float64 normal draws are consumed from ``generator`` per call.

    Args:
        state: True state ``[x, theta, xdot, thetadot]``, shape ``(4,)``.
        generator: Torch generator for the noise.
        noise: Noise standard deviations.

    Returns:
        float64 tensor of shape ``(4,)`` in ``[m, rad, m/s, rad/s]``.
    """
    eps = torch.randn(STATE_DIM, generator=generator, dtype=torch.float64)
    return state.to(torch.float64) + eps * noise.stds()


def _step_n(
    model: mujoco.MjModel, data: mujoco.MjData, state: np.ndarray, u: float, n: int
) -> np.ndarray:
    mujoco.mj_resetData(model, data)
    data.qpos[:] = state[:2]
    data.qvel[:] = state[2:]
    data.ctrl[0] = u
    for _ in range(n):
        mujoco.mj_step(model, data)
    return np.concatenate([data.qpos, data.qvel]).astype(np.float64)


def linearize(
    model: mujoco.MjModel, dt: float, eps: float = 1e-6
) -> tuple[np.ndarray, np.ndarray]:
    """Discrete linearisation of the plant about upright with zero-order hold.

    ``mujoco.mjd_transitionFD`` rejects the file's RK4 integrator, so this does the
    same thing by hand: centred finite differences of the map
    ``(state, u) -> state after n = round(dt / timestep) mj_step calls with u held``,
    about the equilibrium ``state = 0, u = 0``. Because ``u`` is held over the whole
    interval, ``B`` is the exact ZOH input matrix of the sampled plant (no separate
    ``A^k`` summation needed) and the result includes RK4, joint damping and gear.
    A scratch ``MjData`` is used so no caller state is touched.

    Args:
        model: Model from :func:`load_model`.
        dt: Sampling interval in seconds; must be a multiple of the physics
            timestep (e.g. 0.01 s for the 100 Hz controller).
        eps: Finite-difference perturbation (m, rad, m/s, rad/s, control units).

    Returns:
        ``(A, B)`` float64 arrays of shapes ``(4, 4)`` and ``(4, 1)`` such that
        ``s[k+1] ~= A s[k] + B u[k]`` with ``u`` in control units.

    Raises:
        ValueError: If ``dt`` is not a positive multiple of the timestep.
    """
    n = round(dt / model.opt.timestep)
    if n < 1 or abs(n * model.opt.timestep - dt) > 1e-12:
        raise ValueError(f"dt={dt} s is not a positive multiple of {model.opt.timestep} s")
    data = mujoco.MjData(model)
    zero = np.zeros(STATE_DIM)
    A = np.zeros((STATE_DIM, STATE_DIM))
    for i in range(STATE_DIM):
        d = np.zeros(STATE_DIM)
        d[i] = eps
        A[:, i] = (_step_n(model, data, d, 0.0, n) - _step_n(model, data, -d, 0.0, n)) / (2 * eps)
    B = ((_step_n(model, data, zero, eps, n) - _step_n(model, data, zero, -eps, n)) / (2 * eps))
    return A, B.reshape(STATE_DIM, 1)


def dlqr(
    A: np.ndarray,
    B: np.ndarray,
    Q: np.ndarray,
    R: np.ndarray,
    iterations: int = 5000,
    tol: float = 1e-12,
) -> tuple[np.ndarray, np.ndarray]:
    """Infinite-horizon discrete LQR by Riccati value iteration (no scipy).

    Iterates ``P <- Q + A'PA - A'PB (R + B'PB)^-1 B'PA`` from ``P = Q`` until the
    relative change drops below ``tol`` (about 1,080 iterations for this plant at
    10 ms with the default weights, because the slowest closed-loop mode has
    ``|eig| ~ 0.988``; after 400 iterations the gain is already within 0.1 %),
    then returns ``K = (R + B'PB)^-1 B'PA`` for the law ``u = -K s``.

    Args:
        A: State matrix ``(n, n)``.
        B: Input matrix ``(n, m)``.
        Q: State weight ``(n, n)``, symmetric positive semidefinite.
        R: Input weight ``(m, m)``, symmetric positive definite.
        iterations: Maximum number of Riccati iterations.
        tol: Convergence threshold on ``max|dP| / max|P|``.

    Returns:
        ``(K, P)``: gain ``(m, n)`` and the Riccati solution ``(n, n)``.

    Raises:
        RuntimeError: If the iteration does not converge or the closed loop is not
            Schur stable.
    """
    P = Q.copy()
    for _ in range(iterations):
        BtP = B.T @ P
        K = np.linalg.solve(R + BtP @ B, BtP @ A)
        P_next = Q + A.T @ P @ (A - B @ K)
        P_next = 0.5 * (P_next + P_next.T)
        done = np.max(np.abs(P_next - P)) <= tol * np.max(np.abs(P_next))
        P = P_next
        if done:
            break
    else:
        raise RuntimeError("discrete Riccati iteration did not converge")
    K = np.linalg.solve(R + B.T @ P @ B, B.T @ P @ A)
    rho = max(abs(np.linalg.eigvals(A - B @ K)))
    if rho >= 1.0:
        raise RuntimeError(f"LQR closed loop unstable (spectral radius {rho})")
    return K, P


def lqr_gain(
    model: mujoco.MjModel,
    dt_control: float = CONTROL_PERIOD_NS * 1e-9,
    q: tuple[float, float, float, float] = DEFAULT_Q,
    r: float = DEFAULT_R,
) -> torch.Tensor:
    """LQR state-feedback gain for the sampled pendulum.

    Method: :func:`linearize` gives the exact zero-order-hold discretisation
    ``(A, B)`` of the MuJoCo model (RK4, 2 ms substeps) at ``dt_control`` about
    upright; :func:`dlqr` solves the discrete algebraic Riccati equation for the
    cost ``sum_k s'Qs + r u^2`` with ``Q = diag(q)``. ``u`` is in control units
    (1 unit = 100 N), so the gain is in control units per ``[m, rad, m/s, rad/s]``.

    Args:
        model: Model from :func:`load_model`.
        dt_control: Controller sampling interval in seconds (default 0.01 s).
        q: Diagonal state weights for ``[x, theta, xdot, thetadot]``.
        r: Command weight.

    Returns:
        float64 tensor ``K`` of shape ``(1, 4)``; the control law is ``u = -K s``.
    """
    A, B = linearize(model, dt_control)
    K, _ = dlqr(A, B, np.diag(np.asarray(q, dtype=np.float64)), np.array([[float(r)]]))
    return torch.from_numpy(K.copy()).to(torch.float64)


def control(gain: torch.Tensor, observation: torch.Tensor) -> torch.Tensor:
    """State-feedback command ``u = clip(-K s, -3, 3)``.

    Args:
        gain: LQR gain ``(1, 4)`` from :func:`lqr_gain`.
        observation: Measured state ``[x, theta, xdot, thetadot]`` of shape
            ``(4,)`` (any float dtype; computed in the gain's dtype).

    Returns:
        Command tensor of shape ``(1,)`` in control units (force = 100 N x u),
        clipped to ``[-3, 3]``, dtype of ``gain``.
    """
    u = -(gain @ observation.to(gain.dtype))
    return u.clamp(-CTRL_LIMIT, CTRL_LIMIT)


class RunResult(NamedTuple):
    """Summary of one :func:`simulate` run.

    Attributes:
        seed: Run seed.
        max_abs_theta: Max ``|theta|`` over all physics samples, radians.
        max_abs_x: Max ``|x|`` over all physics samples, metres.
        max_abs_theta_after_1s: Max ``|theta|`` after the first simulated second
            (steady-state wobble due to noise), radians.
        max_abs_x_after_1s: Max ``|x|`` after the first simulated second, metres.
        max_abs_command: Max ``|u|`` commanded, control units.
        stayed_up: Whether ``|theta| < THETA_LIMIT_RAD`` at every physics sample.
        sim_time_s: Simulated time reached, seconds.
        wall_time_s: Wall-clock time of the loop, seconds.
    """

    seed: int
    max_abs_theta: float
    max_abs_x: float
    max_abs_theta_after_1s: float
    max_abs_x_after_1s: float
    max_abs_command: float
    stayed_up: bool
    sim_time_s: float
    wall_time_s: float


def simulate(
    seed: int,
    duration_ns: int = 60_000_000_000,
    gain: torch.Tensor | None = None,
    noise: SensorNoise = SensorNoise(),
    model: mujoco.MjModel | None = None,
    extra_sensor_delay_ns: int = 0,
) -> RunResult:
    """Run the reference closed loop in a plain integer-nanosecond schedule.

    Ticks: physics every ``PHYSICS_PERIOD_NS``, sensor every ``SENSOR_PERIOD_NS``,
    controller every ``CONTROL_PERIOD_NS``, all starting at ``t = 0``. At each tick
    time the newest value of every channel is snapshotted first, so each consumer
    only sees values produced strictly earlier; see the module docstring for the
    exact semantics. The run stops early if ``|theta| >= THETA_LIMIT_RAD``.

    Args:
        seed: Run seed; see :func:`make_generators`.
        duration_ns: Simulated duration in nanoseconds (default 60 s).
        gain: LQR gain ``(1, 4)``; computed with :func:`lqr_gain` if ``None``.
        noise: Sensor noise stds.
        model: Model to use (a fresh one from :func:`load_model` if ``None``).
        extra_sensor_delay_ns: Additional transport delay in nanoseconds applied to
            sensor samples before the controller may see them (stress testing only;
            must be a multiple of ``PHYSICS_PERIOD_NS``).

    Returns:
        A :class:`RunResult`.
    """
    if model is None:
        model, data = load_model(_ns_to_s(PHYSICS_PERIOD_NS))
    else:
        data = mujoco.MjData(model)
    if gain is None:
        gain = lqr_gain(model, _ns_to_s(CONTROL_PERIOD_NS))
    g_init, g_sensor = make_generators(seed)
    reset(model, data, g_init)

    # Published channels: (stamp_ns, value). None = nothing produced yet.
    state_msg: tuple[int, torch.Tensor] | None = None
    sensor_log: list[tuple[int, torch.Tensor]] = []  # only used with extra delay
    obs_msg: tuple[int, torch.Tensor] | None = None
    cmd_msg: tuple[int, torch.Tensor] = (-1, torch.zeros(1, dtype=torch.float64))

    max_th = max_x = max_th_late = max_x_late = max_u = 0.0
    stayed_up = True
    one_s = 1_000_000_000
    tick = math.gcd(PHYSICS_PERIOD_NS, SENSOR_PERIOD_NS, CONTROL_PERIOD_NS)
    t = 0
    wall0 = time.perf_counter()
    while t <= duration_ns:
        # Snapshot: everything currently published was produced strictly before t.
        snap_state, snap_obs, snap_cmd = state_msg, obs_msg, cmd_msg
        if extra_sensor_delay_ns:
            ready = [m for m in sensor_log if m[0] + extra_sensor_delay_ns < t]
            snap_obs = ready[-1] if ready else None

        if t % PHYSICS_PERIOD_NS == 0:
            if t > 0:
                step_physics(model, data, snap_cmd[1])
            s = true_state(data)
            state_msg = (t, s)
            th, x = abs(float(s[1])), abs(float(s[0]))
            max_th, max_x = max(max_th, th), max(max_x, x)
            if t >= one_s:
                max_th_late, max_x_late = max(max_th_late, th), max(max_x_late, x)
            if th >= THETA_LIMIT_RAD:
                stayed_up = False
                break
        if t % SENSOR_PERIOD_NS == 0 and snap_state is not None:
            obs_msg = (t, measure(snap_state[1], g_sensor, noise))
            if extra_sensor_delay_ns:
                sensor_log.append(obs_msg)
                del sensor_log[:-64]
        if t % CONTROL_PERIOD_NS == 0 and snap_obs is not None:
            u = control(gain, snap_obs[1])
            cmd_msg = (t, u)
            max_u = max(max_u, abs(float(u[0])))
        t += tick
    wall = time.perf_counter() - wall0
    return RunResult(
        seed=seed,
        max_abs_theta=max_th,
        max_abs_x=max_x,
        max_abs_theta_after_1s=max_th_late,
        max_abs_x_after_1s=max_x_late,
        max_abs_command=max_u,
        stayed_up=stayed_up,
        sim_time_s=float(data.time),
        wall_time_s=wall,
    )


def _main() -> None:
    model, _ = load_model(_ns_to_s(PHYSICS_PERIOD_NS))
    dt_c = _ns_to_s(CONTROL_PERIOD_NS)
    gain = lqr_gain(model, dt_c)
    A, B = linearize(model, dt_c)
    K = gain.numpy()
    noise = SensorNoise()
    print(f"LQR gain K (u = -K s, control units per [m, rad, m/s, rad/s]): {K.ravel().tolist()}")
    print(f"open-loop |eig| at 10 ms: {np.round(abs(np.linalg.eigvals(A)), 4).tolist()}")
    print(f"closed-loop |eig| at 10 ms: {np.round(abs(np.linalg.eigvals(A - B @ K)), 4).tolist()}")
    print(f"sensor noise std: position {noise.position_std}, velocity {noise.velocity_std}")
    print("seed  max|theta|[rad]  max|x|[m]  late max|theta|  late max|x|  max|u|  up  wall[s]")
    all_up = True
    for seed in range(10):
        r = simulate(seed, gain=gain, model=model, noise=noise)
        all_up &= r.stayed_up and r.sim_time_s >= 60.0 - 1e-9
        print(
            f"{r.seed:4d}  {r.max_abs_theta:15.5f}  {r.max_abs_x:9.5f}  "
            f"{r.max_abs_theta_after_1s:15.5f}  {r.max_abs_x_after_1s:11.5f}  "
            f"{r.max_abs_command:6.3f}  {'yes' if r.stayed_up else 'NO ':3s}  {r.wall_time_s:6.2f}"
        )
    print(f"all seeds stayed within {THETA_LIMIT_RAD} rad for 60 s: {all_up}")
    # Stress check: 30 ms of extra sensor transport delay on top of the 4-6 ms
    # inherent one (the loop tolerates about 40 ms extra before it falls).
    stress = [
        simulate(s, 10_000_000_000, gain=gain, model=model, extra_sensor_delay_ns=30_000_000)
        for s in range(10)
    ]
    print(
        "stress (+30 ms sensor delay, 10 s, seeds 0..9): all up "
        f"{all(r.stayed_up for r in stress)}, max|theta| "
        f"{max(r.max_abs_theta for r in stress):.5f} rad"
    )


if __name__ == "__main__":
    _main()
