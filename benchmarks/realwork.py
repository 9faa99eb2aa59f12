"""Real work in a net against the same work in a plain loop: four workloads, one run.

What is measured
----------------
Every workload runs, in the same process and the same invocation, once per
repetition for each side (interleaved: every repetition runs every side once,
in the order of the table, so drifts in machine load hit every side). One short
run of each side comes first and is thrown away (torch's first calls, MuJoCo's
first steps, lazy imports). The table shows the median over repetitions and the
min–max; the JSON file keeps every sample. The net runs with
``timer="simulated"`` and the default workers (side *mujou*); side *mujou-2w*
runs the same net with ``workers=2``. Figures that compare two sides (overhead,
framework µs, vs floor) are computed per repetition, from the two samples of
that repetition, then summarised.

Results must be the same: the net's recording and the plain loop's are compared
after every repetition, bit for bit (every float compared as its integer bit
pattern, so ``-0.0`` differs from ``0.0`` and a NaN equals only the same NaN),
and any difference stops the benchmark with an ``AssertionError`` naming the
side, the field and the first index that differs. The JSON says how many
comparisons ran (``identical``).

What the timed window holds (the same on both sides): nothing that happens
before the first step or after the last one. Creating the environment or the
model, building the nodes and the policy, ``mujou.run(...)`` starting the net,
the reset at time 0 and the work at time 0 (the first observation, the first
action and their recording) are excluded; so are stopping the run and
``run.join()`` returning. The net's window opens when its recorder has recorded
everything of time 0 (a ``time.perf_counter_ns()`` read at the end of that
hook) and closes when it has recorded everything of the last step (read at the
end of that hook): it holds every step's updates, the framework's dispatch and
messages between them, and one clock comparison per recorder update. The plain
loop's window opens right after its own time-0 work and closes after its last
step. The hopper, hopper-trivial and pendulum sides also read the process's CPU
time (``resource.getrusage``, every thread) at the same two marks:
``cpu_us_per_step`` in the JSON, what the machine's other load does not stretch
(``benchmarks/targets.py`` shows it beside the wall figures).

1. **hopper** -- a reinforcement-learning loop on gymnasium's ``Hopper-v5``
   (``gymnasium.make``, so with its default wrappers) and a torch MLP policy,
   ``S`` steps. The net has three nodes: *env* (periodic, period ``env.dt`` =
   8 ms; ``on_start`` resets with seed 0 and sends the observation as a float32
   tensor of shape (11,); each update reads the newest action from a
   ``depth=1`` Input, steps the environment, resets it (without a seed) when
   the episode terminated or was truncated, and sends the next observation,
   ``torch.as_tensor(obs, dtype=torch.float32)``, and the reward as a
   ``float``), *policy* (triggered by the observation; an MLP 11-64-64-3 with
   tanh after every layer, float32, weights from ``torch.manual_seed(0)``,
   called under ``torch.no_grad()``; sends its output, the action, shape (3,))
   and *recorder* (triggered by all three ports, ``depth=None``; keeps every
   observation, reward and action). The plain loop does the same calls in a
   ``for`` loop: reset with the same seed, ``action = mlp(obs)``, step, the same
   conversions, appends to three lists. Both sides make ``S`` environment steps
   and ``S + 1`` policy calls, and record ``S + 1`` observations and actions
   and ``S`` rewards. Figures: **µs/step** = timed window / ``S``; **overhead
   %** = 100 * (net µs/step / plain µs/step - 1), per repetition (target of
   issue 15: at most 5 %); **env.step µs** and **policy µs** = the time of the
   user's own calls, measured around them in the hook and in the plain loop
   alike (``env.step`` plus the reset that follows an episode's end, over the
   ``S`` steps; the MLP call under ``no_grad``, over all ``S + 1`` calls), per
   call: what the same code costs inside the net and outside. Column
   *user +%* = 100 * (the sum of the two inside / the sum outside - 1).

2. **hopper-trivial** -- the same three nodes, ports, messages and recording
   with trivial hooks: *env* sends ``torch.full((11,), k)`` for its ``k``-th
   update and the reward ``float(k)`` without simulating, *policy* sends
   ``torch.full((3,), j)`` for its ``j``-th call without an MLP; the plain loop
   makes the same calls. Figure: **framework µs/step** = net µs/step - plain
   µs/step, per repetition: what the framework adds to one RL step (three
   updates: env, policy, and one or two of the recorder; three messages). Target
   of issue 15: at most 12 µs.

3. **pendulum** -- the 4-rate inverted pendulum of ``examples/``: the net of
   ``examples/inverted_pendulum.py`` (``make_net(seed=0)``: physics every 2 ms,
   sensor every 4 ms, LQR controller every 10 ms, a triggered recorder) for
   ``D`` simulated seconds, against a plain loop over the same physics ticks
   that calls the same functions of ``examples/_pendulum_model.py`` with the same
   generators (physics seed 0, sensor seed 1) and the net's rule that a reader
   sees only what was sent at an earlier time (so the sensor samples the state
   of 2 ms before, the controller the measurement of 2-6 ms before, the
   physics holds the command of the previous controller tick). (That module's
   ``simulate()`` follows the same schedule but keeps only maxima, not the
   trajectory, so it cannot be compared bit for bit; its maxima of
   ``|theta|``, ``|x|`` and ``|u|`` equal this loop's exactly.) Both record every true
   state (time 0 included) and every command; the recordings must be
   identical. The net's recorder is the example's, its ``on_update`` wrapped
   (an instance attribute: a run calls whatever callable is there) by a
   function that reads the clock for the window: one Python call per physics
   step, charged to the net. Figures: **µs/physics step** = timed window /
   (``D`` / 2 ms); **overhead %** as for hopper.

4. **ticks10** -- 10 nodes with a no-op ``on_update``, 10 ms period, ``D``
   simulated seconds; figure: no-op calls per wall second. *mujou*:
   ``mujou.run(nodes, timer="simulated", duration=D)``, updates from
   ``run.stats()`` over the wall time of ``run.join()`` (as ``run.py``'s
   *ticks*: starting the run is excluded, its end included; ``D`` is long enough
   that the end is well under 1 % of the time). *floor*: ``common.heap_floor``,
   a bare ``heapq`` loop calling the same no-op method. **vs floor** = mujou /
   floor, per repetition (target of issue 15: at least 0.6).

The *mujou/side* column is oriented as in ``benchmarks/run.py``: above 1 means
mujou is better (the side's time over mujou's for µs, mujou's rate over the
side's for ticks/s); for *plain* it is plain / net, 1 - overhead.

Usage::

    python benchmarks/realwork.py [--quick] [--only W[,W...]] [--repeat N] [--json PATH]

``benchmarks/run.py`` runs the same four workloads after its own six (same
sizes, same figures), so ``python benchmarks/run.py --quick`` runs them too.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from common import NoOp, cpu_s, heap_floor, repeat_and_only, summary

import mujou_actors as mujou

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "realwork.json"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
WAIT_S = 120.0  # bound on one run's join; a net that overruns it fails the benchmark
SEED = 0
OBS_DIM, ACT_DIM, HIDDEN = 11, 3, 64
HOPPER_DT = 0.008  # Hopper-v5's env.dt (frame_skip 4 x 2 ms), also the trivial net's period
TICK_NODES = 10
TICK_PERIOD_NS = 10_000_000
WARMUP = {"hopper": 50, "hopper-trivial": 200, "pendulum": 0.2, "ticks10": 1.0}
WORKLOADS = ("hopper", "hopper-trivial", "pendulum", "ticks10")
TARGETS = {  # issue 15's targets: (figure, side, compare, bound, text)
    "hopper": ("overhead_pct", "mujou", "<=", 5.0, "overhead <= 5 %"),
    "hopper-trivial": ("framework_us", "mujou", "<=", 12.0, "framework <= 12 µs per RL step"),
    "ticks10": ("vs_floor", "mujou", ">=", 0.6, "mujou/floor >= 0.6"),
}


class Timeout(RuntimeError):
    """A net did not finish within ``WAIT_S``."""


def join(run: mujou.Run, what: str) -> tuple[float, float]:
    """``run.join()`` bounded by ``WAIT_S``.

    Returns:
        tuple[float, float]: ``time.perf_counter()`` before and after, seconds.

    Raises:
        Timeout: the run was still going after ``WAIT_S`` (it is stopped first).
    """
    t0 = time.perf_counter()
    run.join(timeout=WAIT_S)
    t1 = time.perf_counter()
    if run.running:
        run.stop()
        raise Timeout(f"mujou {what} did not finish within {WAIT_S:g} s")
    return t0, t1


# --------------------------------------------------------------------------- bit identity


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as integers of the same width (a float's bit pattern).

    Args:
        t (torch.Tensor): any CPU tensor.

    Returns:
        torch.Tensor: ``t`` viewed as an integer dtype of the same element size
        (a bool or integer tensor as it is).
    """
    if not (t.is_floating_point() or t.is_complex()):
        return t
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    flat = t.contiguous().reshape(-1)
    if t.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    return flat.view(width[flat.element_size()])


def differences(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> list[str]:
    """Where two recordings differ, bit for bit; an empty list when they are identical.

    Args:
        got (dict[str, torch.Tensor]): one recording, a tensor per field
            (first dimension: the order of recording).
        want (dict[str, torch.Tensor]): the reference recording.

    Returns:
        list[str]: one line per field that differs (missing, other shape or
        dtype, or the first index whose bits differ).
    """
    out = []
    for key in sorted(set(got) | set(want)):
        if key not in got or key not in want:
            out.append(f"{key}: only in {'the reference' if key in want else 'this side'}")
            continue
        a, b = got[key], want[key]
        if a.shape != b.shape or a.dtype != b.dtype:
            out.append(f"{key}: {tuple(a.shape)} {a.dtype} against {tuple(b.shape)} {b.dtype}")
            continue
        if torch.equal(bits(a), bits(b)):
            continue
        rows_a, rows_b = bits(a).reshape(a.shape[0], -1), bits(b).reshape(b.shape[0], -1)
        first = int((rows_a != rows_b).any(dim=1).nonzero()[0, 0]) if a.shape[0] else 0
        out.append(f"{key}[{first}]: {a[first].tolist()} against {b[first].tolist()}")
    return out


def check_identical(workload: str, side: str, got: dict[str, torch.Tensor],
                    want: dict[str, torch.Tensor]) -> None:
    """Raise unless ``got`` is bit-identical to ``want``.

    Args:
        workload (str): the workload's name, for the message.
        side (str): the side that recorded ``got``, for the message.
        got (dict[str, torch.Tensor]): that side's recording.
        want (dict[str, torch.Tensor]): the plain loop's recording.

    Raises:
        AssertionError: the recordings differ; the message lists where.
    """
    diff = differences(got, want)
    if diff:
        raise AssertionError(f"{workload}: {side} differs from the plain loop: " + "; ".join(diff))


# --------------------------------------------------------------------------- 1-2. hopper


def make_policy() -> torch.nn.Module:
    """The MLP 11-64-64-3, tanh after every layer, float32; weights from seed 0.

    Returns:
        torch.nn.Module: the policy (the global RNG is left as it was).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return torch.nn.Sequential(
            torch.nn.Linear(OBS_DIM, HIDDEN), torch.nn.Tanh(),
            torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh(),
            torch.nn.Linear(HIDDEN, ACT_DIM), torch.nn.Tanh())


def make_env() -> Any:
    """A fresh ``gymnasium.make("Hopper-v5")``."""
    import gymnasium

    return gymnasium.make("Hopper-v5")


def hopper_missing() -> str | None:
    """Why the hopper workloads cannot run here, or None when they can."""
    try:
        import gymnasium  # noqa: F401
        import mujoco  # noqa: F401
    except ImportError as exc:
        return f"missing: {exc.name} is not installed (pip install -e '.[examples]')"
    return None


class HopperEnv(mujou.Node):
    """The environment: one ``env.step`` per tick with the newest action.

    With ``env=None`` it is the trivial variant: it sends ``torch.full((11,), k)``
    and ``float(k)`` for its ``k``-th update without simulating.
    """

    action = mujou.Input(torch.Tensor, shape=(ACT_DIM,), dtype=torch.float32, depth=1)
    obs = mujou.Output(torch.Tensor, shape=(OBS_DIM,), dtype=torch.float32)
    reward = mujou.Output(float)

    def __init__(self, env: Any | None) -> None:
        super().__init__(period=env.unwrapped.dt if env is not None else HOPPER_DT)
        self.env = env
        self.k = 0
        self.env_ns = 0  # time in env.step (and the reset after an episode), ns

    def on_start(self) -> None:
        if self.env is None:
            self.obs.send(torch.full((OBS_DIM,), 0.0))
            return
        obs, _ = self.env.reset(seed=SEED)
        self.obs.send(torch.as_tensor(obs, dtype=torch.float32))

    def on_update(self, dt: float) -> None:
        a = self.action.read()
        if self.env is None:
            self.k += 1
            self.obs.send(torch.full((OBS_DIM,), float(self.k)))
            self.reward.send(float(self.k))
            return
        t = time.perf_counter_ns()
        obs, r, terminated, truncated, _ = self.env.step(a.numpy())
        if terminated or truncated:
            obs, _ = self.env.reset()
        self.env_ns += time.perf_counter_ns() - t
        self.obs.send(torch.as_tensor(obs, dtype=torch.float32))
        self.reward.send(float(r))


class HopperPolicy(mujou.Node):
    """The policy, triggered by each observation: ``action = mlp(obs)`` under no_grad.

    With ``mlp=None`` it is the trivial variant: it sends ``torch.full((3,), j)``
    for its ``j``-th call.
    """

    obs = mujou.Input(torch.Tensor, shape=(OBS_DIM,), dtype=torch.float32, depth=1)
    action = mujou.Output(torch.Tensor, shape=(ACT_DIM,), dtype=torch.float32)

    def __init__(self, mlp: torch.nn.Module | None) -> None:
        super().__init__(period=None)
        self.mlp = mlp
        self.j = 0
        self.policy_ns = 0  # time in the MLP call, ns

    def on_update(self, dt: float) -> None:
        o = self.obs.read()
        if self.mlp is None:
            self.action.send(torch.full((ACT_DIM,), float(self.j)))
            self.j += 1
            return
        t = time.perf_counter_ns()
        with torch.no_grad():
            a = self.mlp(o)
        self.policy_ns += time.perf_counter_ns() - t
        self.action.send(a)


class HopperRecorder(mujou.Node):
    """Keeps every observation, reward and action; reads the clock for the timed window.

    The window opens at the end of the update that records the first action
    (everything of time 0 is recorded) and closes at the end of the update that
    records the last one (action ``steps``).
    """

    obs = mujou.Input(torch.Tensor, shape=(OBS_DIM,), dtype=torch.float32, depth=None)
    reward = mujou.Input(float, depth=None)
    action = mujou.Input(torch.Tensor, shape=(ACT_DIM,), dtype=torch.float32, depth=None)

    def __init__(self, steps: int) -> None:
        super().__init__(period=None)
        self.last = steps + 1
        self.observations: list[torch.Tensor] = []
        self.rewards: list[float] = []
        self.actions: list[torch.Tensor] = []
        self.t0_ns = self.t1_ns = 0
        self.cpu0 = self.cpu1 = 0.0  # the process's CPU seconds at the same two marks

    def on_update(self, dt: float) -> None:
        self.observations.extend(self.obs.drain())
        self.rewards.extend(self.reward.drain())
        self.actions.extend(self.action.drain())
        n = len(self.actions)
        if n == self.last:
            self.t1_ns = time.perf_counter_ns()
            self.cpu1 = cpu_s()
        elif n == 1 and not self.t0_ns:
            self.t0_ns = time.perf_counter_ns()
            self.cpu0 = cpu_s()


def recording(obs: list[torch.Tensor], rewards: list[float],
              actions: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """A hopper recording as tensors: ``obs`` (S+1, 11), ``reward`` (S,), ``action`` (S+1, 3)."""
    return {"obs": torch.stack(obs), "reward": torch.tensor(rewards, dtype=torch.float64),
            "action": torch.stack(actions)}


def hopper_result(steps: int, window_ns: int, rec: dict[str, torch.Tensor],
                  env_ns: int = 0, policy_ns: int = 0, trivial: bool = False,
                  cpu_window_s: float = 0.0) -> dict:
    """One sample of a hopper side: count, µs/step, CPU µs/step, user-call µs, the recording.

    ``cpu_us_per_step`` is the process's CPU time over the same window
    (`common.cpu_s`), per step: what the machine's load does not stretch.
    """
    out: dict[str, Any] = {"count": steps, "us_per_step": window_ns / steps / 1e3,
                           "cpu_us_per_step": cpu_window_s / steps * 1e6, "record": rec}
    if not trivial:
        out["env_us"] = env_ns / steps / 1e3
        out["policy_us"] = policy_ns / (steps + 1) / 1e3
    return out


def hopper_mujou(steps: int, trivial: bool = False, workers: int | None = None) -> dict:
    """The net of ``steps`` RL steps (see the module docstring); one sample."""
    env = None if trivial else make_env()
    env_node = HopperEnv(env)
    policy = HopperPolicy(None if trivial else make_policy())
    rec = HopperRecorder(steps)
    mujou.connect(env_node.obs, policy.obs)
    mujou.connect(policy.action, env_node.action)
    mujou.connect(env_node.obs, rec.obs)
    mujou.connect(env_node.reward, rec.reward)
    mujou.connect(policy.action, rec.action)
    period_ns = round(env_node.period * 1e9)
    gc.collect()
    run = mujou.run({"env": env_node, "policy": policy, "recorder": rec}, timer="simulated",
                    duration=steps * period_ns / 1e9, workers=workers)
    join(run, "hopper")
    if env is not None:
        env.close()
    got = (len(rec.observations), len(rec.rewards), len(rec.actions))
    if got != (steps + 1, steps, steps + 1) or not (rec.t0_ns and rec.t1_ns):
        raise RuntimeError(f"hopper net recorded (obs, rewards, actions) {got} for "
                           f"{steps} steps")
    return hopper_result(steps, rec.t1_ns - rec.t0_ns,
                         recording(rec.observations, rec.rewards, rec.actions),
                         env_node.env_ns, policy.policy_ns, trivial, rec.cpu1 - rec.cpu0)


def hopper_plain(steps: int, trivial: bool = False) -> dict:
    """The same ``steps`` RL steps as a hand-written loop; one sample."""
    if trivial:
        return hopper_plain_trivial(steps)
    env, mlp = make_env(), make_policy()
    perf = time.perf_counter_ns
    obs, _ = env.reset(seed=SEED)
    o = torch.as_tensor(obs, dtype=torch.float32)
    observations, rewards, actions = [o], [], []
    t = perf()
    with torch.no_grad():
        a = mlp(o)
    policy_ns, env_ns = perf() - t, 0
    actions.append(a)
    gc.collect()
    c0 = cpu_s()
    t0 = perf()
    for _ in range(steps):
        t = perf()
        obs, r, terminated, truncated, _ = env.step(a.numpy())
        if terminated or truncated:
            obs, _ = env.reset()
        env_ns += perf() - t
        o = torch.as_tensor(obs, dtype=torch.float32)
        observations.append(o)
        rewards.append(float(r))
        t = perf()
        with torch.no_grad():
            a = mlp(o)
        policy_ns += perf() - t
        actions.append(a)
    t1 = perf()
    c1 = cpu_s()
    env.close()
    return hopper_result(steps, t1 - t0, recording(observations, rewards, actions),
                         env_ns, policy_ns, cpu_window_s=c1 - c0)


def hopper_plain_trivial(steps: int) -> dict:
    """The trivial hooks' calls as a hand-written loop; one sample."""
    perf = time.perf_counter_ns
    o = torch.full((OBS_DIM,), 0.0)
    observations, rewards, actions = [o], [], [torch.full((ACT_DIM,), 0.0)]
    gc.collect()
    c0 = cpu_s()
    t0 = perf()
    for k in range(1, steps + 1):
        observations.append(torch.full((OBS_DIM,), float(k)))
        rewards.append(float(k))
        actions.append(torch.full((ACT_DIM,), float(k)))
    t1 = perf()
    c1 = cpu_s()
    return hopper_result(steps, t1 - t0, recording(observations, rewards, actions),
                         trivial=True, cpu_window_s=c1 - c0)


# --------------------------------------------------------------------------- 3. pendulum


def pendulum_modules() -> tuple[Any, Any]:
    """``examples/inverted_pendulum.py`` and ``examples/_pendulum_model.py``, imported."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    import _pendulum_model as pm
    import inverted_pendulum as ip

    return ip, pm


_GAIN: list[torch.Tensor] = []  # the plain loop's LQR gain, computed once per process


def pendulum_counts(duration_ns: int) -> tuple[int, int]:
    """Physics steps and controller ticks in ``duration_ns`` (time 0 excluded)."""
    ip, pm = pendulum_modules()
    return duration_ns // pm.PHYSICS_PERIOD_NS, duration_ns // pm.CONTROL_PERIOD_NS


def pendulum_mujou(duration_ns: int, workers: int | None = None) -> dict:
    """The example's net for ``duration_ns`` of simulated time; one sample."""
    ip, pm = pendulum_modules()
    steps, ticks = pendulum_counts(duration_ns)
    net = ip.make_net(seed=SEED)
    rec = net.recorder
    marks = [0, 0]
    cpu = [0.0, 0.0]  # the process's CPU seconds at the same two marks
    recorder_update = rec.on_update  # the example's own hook, called by the wrapper

    def timed_update(dt: float) -> None:
        recorder_update(dt)
        if len(rec.states) == steps + 1 and len(rec.commands) == ticks:
            marks[1] = time.perf_counter_ns()
            cpu[1] = cpu_s()
        elif not marks[0]:  # the first update records the state of time 0
            marks[0] = time.perf_counter_ns()
            cpu[0] = cpu_s()

    rec.on_update = timed_update
    gc.collect()
    run = mujou.run(net, timer="simulated", duration=duration_ns / 1e9, seed=SEED,
                    workers=workers)
    join(run, "pendulum")
    if len(rec.states) != steps + 1 or len(rec.commands) != ticks or not all(marks):
        raise RuntimeError(f"pendulum net recorded {len(rec.states)} states and "
                           f"{len(rec.commands)} commands for {steps} steps")
    record = {"state": torch.stack(rec.states), "command": torch.cat(rec.commands)}
    return {"count": steps, "us_per_step": (marks[1] - marks[0]) / steps / 1e3,
            "cpu_us_per_step": (cpu[1] - cpu[0]) / steps * 1e6, "record": record}


def pendulum_plain(duration_ns: int) -> dict:
    """The same physics, sensor and controller ticks as a hand-written loop; one sample.

    At each physics tick ``t`` the loop first takes what the net's readers
    would see (values sent before ``t``), then runs physics, sensor (every
    second tick) and controller (every fifth) in that order.
    """
    ip, pm = pendulum_modules()
    steps, ticks = pendulum_counts(duration_ns)
    model, data = pm.load_model(timestep=pm.PHYSICS_PERIOD_NS / 1e9)
    if not _GAIN:
        _GAIN.append(pm.lqr_gain(model, dt_control=pm.CONTROL_PERIOD_NS / 1e9))
    gain, noise = _GAIN[0], pm.SensorNoise()
    g_physics = torch.Generator().manual_seed(2 * SEED)
    g_sensor = torch.Generator().manual_seed(2 * SEED + 1)
    sensor_every = pm.SENSOR_PERIOD_NS // pm.PHYSICS_PERIOD_NS
    control_every = pm.CONTROL_PERIOD_NS // pm.PHYSICS_PERIOD_NS
    state = pm.reset(model, data, g_physics)
    states, commands = [state], []
    measurement = command = None
    gc.collect()
    c0 = cpu_s()
    t0 = time.perf_counter_ns()
    for k in range(1, steps + 1):
        seen_state, seen_measurement = state, measurement  # sent before this tick
        pm.step_physics(model, data, 0.0 if command is None else command)
        state = pm.true_state(data)
        states.append(state)
        if k % sensor_every == 0:
            measurement = pm.measure(seen_state, g_sensor, noise)
        if k % control_every == 0 and seen_measurement is not None:
            command = pm.control(gain, seen_measurement)
            commands.append(command)
    t1 = time.perf_counter_ns()
    c1 = cpu_s()
    if len(commands) != ticks:
        raise RuntimeError(f"pendulum plain loop made {len(commands)} commands, not {ticks}")
    return {"count": steps, "us_per_step": (t1 - t0) / steps / 1e3,
            "cpu_us_per_step": (c1 - c0) / steps * 1e6,
            "record": {"state": torch.stack(states), "command": torch.cat(commands)}}


# --------------------------------------------------------------------------- 4. ticks10


def ticks_mujou(end_ns: int) -> dict:
    """``TICK_NODES`` no-op nodes for ``end_ns``: updates per wall second of ``join()``."""
    nodes = [NoOp(period=TICK_PERIOD_NS / 1e9) for _ in range(TICK_NODES)]
    gc.collect()
    run = mujou.run(nodes, timer="simulated", duration=end_ns / 1e9)
    t0, t1 = join(run, "ticks10")
    updates = sum(s.updates for s in run.stats().nodes.values())
    return {"count": updates, "rate": updates / (t1 - t0)}


def ticks_floor(end_ns: int) -> dict:
    """The heap floor for the same schedule."""
    floor = heap_floor([TICK_PERIOD_NS] * TICK_NODES, end_ns)
    return {"count": floor["updates"], "rate": floor["rate"]}


# --------------------------------------------------------------------------- measuring


def measure(name: str, unit: str, size: dict, sides: dict[str, Callable[[], dict] | str],
            repeat: int, base: str, main: str = "us_per_step", lower_better: bool = True,
            warmup: dict[str, Callable[[], dict]] | None = None) -> dict:
    """Run every side ``repeat`` times, interleaved, and compare each with ``base``.

    Args:
        name (str): the workload, for messages.
        unit (str): the unit of the main figure, for the table.
        size (dict): the workload's sizes, for the table and the JSON.
        sides (dict[str, Callable[[], dict] | str]): side -> a function that
            runs it once and returns ``count``, the figure ``main``, other
            figures, and optionally ``record`` (a recording, compared bit for bit
            with ``base``'s of the same repetition); a str is the reason the
            side is absent.
        repeat (int): repetitions.
        base (str): the side the others are compared with (plain loop, floor).
        main (str): the figure shown and compared.
        lower_better (bool): whether a lower ``main`` is better (µs) or a higher
            one (rates).
        warmup (dict[str, Callable[[], dict]] | None): short runs of each side,
            made once before the repetitions and thrown away.

    Returns:
        dict: as ``benchmarks/run.py``'s ``measure`` (``unit``, ``main``,
        ``lower_better``, ``size``, ``results`` per side with ``count`` and
        summaries, ``ratios`` against mujou), and ``identical``: the number of
        recordings compared (all passed, or this raised).

    Raises:
        AssertionError: sides did different amounts of work, or a recording
            differs from ``base``'s.
    """
    runnable = {side: fn for side, fn in sides.items() if callable(fn)}
    for fn in (warmup or {}).values():
        fn()
    samples: dict[str, list[dict]] = {side: [] for side in runnable}
    compared = 0
    for _ in range(repeat):
        records = {}
        for side, fn in runnable.items():
            out = dict(fn())
            if "record" in out:
                records[side] = out.pop("record")
            samples[side].append(out)
        for side, rec in records.items():
            if side != base:
                check_identical(name, side, rec, records[base])
                compared += 1
    counts = {side: s[0]["count"] for side, s in samples.items()}
    if len({c for s in samples.values() for c in (r["count"] for r in s)}) > 1:
        raise AssertionError(f"{name}: sides did different amounts of work: {counts}")
    results: dict[str, dict] = {}
    for side, fn in sides.items():
        if not callable(fn):
            results[side] = {"absent": fn}
            continue
        runs = samples[side]
        entry = {"count": runs[0]["count"], **summary([r[main] for r in runs])}
        for key in runs[0]:
            if key not in ("count", main):
                entry[key] = summary([r[key] for r in runs])
        if side != base:  # paired with the base side's sample of the same repetition
            pairs = list(zip(runs, samples[base], strict=True))
            if lower_better:
                entry["overhead_pct"] = summary([100 * (r[main] / b[main] - 1) for r, b in pairs])
                entry["framework_us"] = summary([r[main] - b[main] for r, b in pairs])
            else:
                entry["vs_floor"] = summary([r[main] / b[main] for r, b in pairs])
            if "env_us" in runs[0]:
                entry["user_pct"] = summary([
                    100 * ((r["env_us"] + r["policy_us"]) / (b["env_us"] + b["policy_us"]) - 1)
                    for r, b in pairs])
        results[side] = entry
    mj = results["mujou"]["median"]
    ratios = {side: (r["median"] / mj if lower_better else mj / r["median"])
              for side, r in results.items()
              if side != "mujou" and "median" in r and r["median"] > 0 and mj > 0}
    out = {"unit": unit, "main": main, "lower_better": lower_better, "size": size,
           "results": results, "ratios": ratios,
           "identical": {"compared": compared, "passed": True}}
    notes = [f"bit-identical to the {base} loop: {compared} recordings compared"
             ] if compared else []
    if name in TARGETS:
        key, side, op, bound, text = TARGETS[name]
        value = results[side][key]["median"]
        met = value <= bound if op == "<=" else value >= bound
        out["target"] = {"figure": key, "side": side, "bound": bound, "text": text,
                         "median": value, "met": met}
        notes.append(f"target (issue 15): {text}; median {value:.3g}: "
                     f"{'met' if met else 'NOT met'}")
    if notes:
        out["note"] = "; ".join(notes)
    return out


def absent_workload(unit: str, size: dict, sides: Iterable[str], why: str) -> dict:
    """A workload that cannot run here: every side absent with the reason."""
    return {"unit": unit, "main": "us_per_step", "lower_better": True, "size": size,
            "results": {side: {"absent": why} for side in sides}, "ratios": {},
            "identical": {"compared": 0, "passed": None}}


def sizes(quick: bool) -> dict[str, int]:
    """Steps (hopper), simulated ns (pendulum, ticks10) per repetition."""
    return {"hopper": 2000 if quick else 10_000,
            "hopper-trivial": 3000 if quick else 30_000,
            "pendulum": (4 if quick else 40) * 1_000_000_000,
            "ticks10": (200 if quick else 1000) * 1_000_000_000}


def hopper_workload(name: str, steps: int, repeat: int) -> dict:
    """hopper (sides mujou, mujou-2w, plain) or hopper-trivial (mujou, plain)."""
    trivial = name == "hopper-trivial"
    size = {"steps": steps, "env": "none (trivial hooks)" if trivial else "Hopper-v5",
            "policy": "none" if trivial else f"MLP {OBS_DIM}-{HIDDEN}-{HIDDEN}-{ACT_DIM}"}
    missing = None if trivial else hopper_missing()
    if missing:
        return absent_workload("µs/step", size, ("mujou", "mujou-2w", "plain"), missing)
    sides: dict[str, Callable[[], dict] | str] = {"mujou": lambda: hopper_mujou(steps, trivial)}
    if not trivial:
        sides["mujou-2w"] = lambda: hopper_mujou(steps, trivial, workers=2)
    sides["plain"] = lambda: hopper_plain(steps, trivial)
    w = WARMUP[name]
    warm = {"mujou": lambda: hopper_mujou(w, trivial), "plain": lambda: hopper_plain(w, trivial)}
    return measure(name, "µs/step", size, sides, repeat, base="plain", warmup=warm)


def pendulum_workload(name: str, duration_ns: int, repeat: int) -> dict:
    """pendulum: the example's net (mujou) against the plain loop."""
    size = {"duration_s": duration_ns / 1e9, "physics_steps": duration_ns // 2_000_000}
    missing = hopper_missing()
    if missing:
        return absent_workload("µs/physics step", size, ("mujou", "plain"), missing)
    w = round(WARMUP[name] * 1e9)
    return measure(name, "µs/physics step", size,
                   {"mujou": lambda: pendulum_mujou(duration_ns),
                    "plain": lambda: pendulum_plain(duration_ns)},
                   repeat, base="plain",
                   warmup={"mujou": lambda: pendulum_mujou(w), "plain": lambda: pendulum_plain(w)})


def ticks10_workload(name: str, end_ns: int, repeat: int) -> dict:
    """ticks10: ``TICK_NODES`` no-op nodes (mujou) against the heap floor."""
    w = round(WARMUP[name] * 1e9)
    return measure(name, "ticks/s", {"nodes": TICK_NODES, "period_s": TICK_PERIOD_NS / 1e9,
                                     "duration_s": end_ns / 1e9},
                   {"mujou": lambda: ticks_mujou(end_ns), "floor": lambda: ticks_floor(end_ns)},
                   repeat, base="floor", main="rate", lower_better=False,
                   warmup={"mujou": lambda: ticks_mujou(w), "floor": lambda: ticks_floor(w)})


PLANS: dict[str, Callable[[str, int, int], dict]] = {
    "hopper": hopper_workload, "hopper-trivial": hopper_workload,
    "pendulum": pendulum_workload, "ticks10": ticks10_workload}


def run_workload(name: str, quick: bool, repeat: int) -> dict:
    """Measure one of ``WORKLOADS`` (sizes per ``sizes``).

    Args:
        name (str): the workload.
        quick (bool): the small sizes of ``--quick``.
        repeat (int): repetitions.

    Returns:
        dict: the workload's figures (see ``measure``).
    """
    return PLANS[name](name, sizes(quick)[name], repeat)


def suite(quick: bool, repeat: int, only: Iterable[str] = WORKLOADS) -> dict:
    """Measure the workloads named in ``only``, in the order of ``WORKLOADS``."""
    return {name: run_workload(name, quick, repeat) for name in WORKLOADS if name in only}


# --------------------------------------------------------------------------- output

# The figures each table shows besides the main one: key, header, format.
# benchmarks/run.py shows the same columns.
COLUMNS = {
    "hopper": [("overhead_pct", "overhead %", "{:+.1f}"), ("env_us", "env.step µs", "{:.1f}"),
               ("policy_us", "policy µs", "{:.1f}"), ("user_pct", "user +%", "{:+.1f}")],
    "hopper-trivial": [("framework_us", "framework µs/step", "{:.1f}"),
                       ("overhead_pct", "overhead %", "{:+.0f}")],
    "pendulum": [("framework_us", "framework µs/step", "{:.2f}"),
                 ("overhead_pct", "overhead %", "{:+.1f}")],
    "ticks10": [("vs_floor", "vs floor", "{:.3f}")],
}


def fmt_main(w: dict, x: float) -> str:
    """The main figure as the table shows it (rates in thousands)."""
    if not w["lower_better"]:
        return f"{x / 1e3:,.1f}k"
    return f"{x:,.2f}" if x < 100 else f"{x:,.1f}"


def print_tables(workloads: dict, title: str) -> None:
    """One rich table per workload: median (min–max) of the main figure, extras, ratio."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # a pipe or a file: no 80-column wrapping
        console = Console(width=160)
    for name, w in workloads.items():
        cols = COLUMNS.get(name, [])
        table = Table(title=f"{name}: " + ", ".join(f"{k}={v}" for k, v in w["size"].items()),
                      title_justify="left")
        for i, header in enumerate(["side", f"{w['unit']} (median, min–max)",
                                    *(h for _, h, _ in cols), "mujou/side"]):
            table.add_column(header, justify="left" if i < 2 else "right")
        absent = []
        for side, r in w["results"].items():
            if "absent" in r:
                absent.append(f"{side}: {r['absent']}")
                continue
            extras = [f.format(r[k]["median"]) if k in r else "" for k, _, f in cols]
            ratio = f"{w['ratios'][side]:.3f}" if side in w["ratios"] else ""
            table.add_row(side, f"{fmt_main(w, r['median'])} ({fmt_main(w, r['min'])}–"
                                f"{fmt_main(w, r['max'])})", *extras, ratio)
        console.print(table)
        for line in absent:
            console.print(f"  {line}")
        if "note" in w:
            console.print(f"  {w['note']}")
    console.print(title)


def versions() -> dict[str, str | None]:
    """Versions of what the workloads run on (None: not installed)."""
    out: dict[str, str | None] = {"torch": torch.__version__, "mujou": mujou.__version__}
    for module in ("gymnasium", "mujoco"):
        try:
            out[module] = __import__(module).__version__
        except ImportError:
            out[module] = None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 2 reps: a CI smoke run")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON,
                    help=f"where to write every sample (default {DEFAULT_JSON})")
    ap.add_argument("--repeat", type=int, default=None, help="default 5; quick 2")
    ap.add_argument("--only", type=lambda v: [w.strip() for w in v.split(",") if w.strip()],
                    default=None, metavar="W[,W...]",
                    help="measure only these workloads: " + ", ".join(WORKLOADS))
    args = ap.parse_args()
    repeat, only = repeat_and_only(ap, args, WORKLOADS)
    t_start = time.perf_counter()
    workloads = suite(args.quick, repeat, only)
    elapsed = time.perf_counter() - t_start
    print_tables(workloads, f"mujou_actors {mujou.__version__}: real work against a plain loop, "
                            f"{repeat} reps{' (quick)' if args.quick else ''}, "
                            f"{elapsed:.1f} s; mujou/side > 1 means mujou better")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "realwork", "repeat": repeat, "quick": args.quick,
           "python": platform.python_version(), "platform": platform.platform(),
           "versions": versions(), "torch_threads": torch.get_num_threads(),
           "elapsed_s": elapsed, "workloads": workloads}
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
