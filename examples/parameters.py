"""Retune a controller while the net runs: its gains are parameters, set with ``run.set_param``.

The net, in simulated time::

    Cart (1 kHz) --state--> Controller (100 Hz) --force--> Cart
    Hold (ticks once, at --at)

* ``Cart`` is a 1 kg cart on a rail with viscous friction, pushed by the
  controller's force; it sends its position and velocity every millisecond.
* ``Controller`` is a PID on the position. Its gains ``kp``, ``ki``, ``kd``
  and its ``setpoint`` are parameters (each with a range, a unit and a
  description); ``limit``, the force's bound, is read-only: set before the
  run, never while it goes on. Its ``on_param`` keeps the integral term's
  contribution (``ki * integral``) as it was when ``ki`` changes, so a new
  gain does not kick the cart (a "bumpless" change).
* ``Hold`` holds the simulation at ``--at`` seconds until the host has made
  its sets (its one update waits for the host): in simulated time the run
  does not wait for the host, so without it a set lands wherever the run has
  got to when the call comes. Held, the sets apply from the delta cycle
  after the held one, the same in every run.

The script runs the net once, recorded to an MCAP file; at ``--at`` seconds it
raises ``kp`` and ``ki`` with ``run.set_param`` (and shows two sets that are
refused). Then it replays the recording on a fresh net, built with the
classes' defaults: the replay sets the recorded start values (``--setpoint``
was set before the recorded run) and applies each recorded set at the
update that applied it before, and ``mujou.testing.assert_replay_matches``
checks every message, bit for bit.

Run it from the repository root::

    python examples/parameters.py                   # 4 s, retuned at 2 s
    python examples/parameters.py --duration 2 --at 1 --workers 2 --keep run.mcap

See docs/parameters.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
import tempfile
import threading
from typing import NamedTuple

import mujou_actors as mujou
from mujou_actors.recording import mcapfile
from mujou_actors.testing import assert_replay_matches

MASS_KG = 1.0
FRICTION = 0.5  # N per m/s


class CartState(NamedTuple):
    """Where the cart is (m) and how fast it goes (m/s)."""

    x: float
    v: float


class Cart(mujou.Node):
    """A cart on a rail, integrated at 1 kHz (semi-implicit Euler)."""

    force = mujou.Input(float, trigger=False)  # the newest command, held between updates
    state = mujou.Output(CartState)

    def __init__(self) -> None:
        super().__init__(period=0.001)
        self.x = 0.0
        self.v = 0.0
        self.trajectory: list[tuple[float, float]] = []

    def on_update(self, dt: float) -> None:
        u = self.force.read() or 0.0
        self.v += (u - FRICTION * self.v) / MASS_KG * dt
        self.x += self.v * dt
        self.trajectory.append((self.x, self.v))
        self.state.send(CartState(self.x, self.v))


class Controller(mujou.Node):
    """A PID on the cart's position; its gains and setpoint can change while it runs."""

    state = mujou.Input(CartState, trigger=False)
    force = mujou.Output(float)

    kp = mujou.Param(2.0, range=(0.0, 100.0), description="proportional gain, N/m")
    ki = mujou.Param(0.5, range=(0.0, 50.0), description="integral gain, N/(m s)")
    kd = mujou.Param(1.5, range=(0.0, 50.0), description="derivative gain, N s/m")
    setpoint = mujou.Param(1.0, range=(-5.0, 5.0), description="target position, m")
    limit = mujou.Param(10.0, range=(0.0, None), read_only=True,
                        description="bound of the force, N (set before the run)")

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.integral = 0.0
        self.t = 0.0
        self.changes: list[list[object]] = []  # [name, old, new, t of the update applying it]

    def on_param(self, name: str, old: object, new: object) -> None:
        # Called just before the on_update of the update that applies the set.
        if name == "ki" and isinstance(old, float) and isinstance(new, float) and new > 0.0:
            self.integral *= old / new  # the same ki * integral: the force does not jump
        self.changes.append([name, old, new, None])

    def on_update(self, dt: float) -> None:
        self.t += dt
        for change in self.changes:
            if change[3] is None:
                change[3] = self.t
        s = self.state.read()
        x, v = (0.0, 0.0) if s is None else (s.x, s.v)
        error = self.setpoint - x
        self.integral += error * dt
        u = self.kp * error + self.ki * self.integral - self.kd * v
        self.force.send(max(-self.limit, min(self.limit, u)))


class Hold(mujou.Node):
    """Holds the run at its first update until the host says go (None: never holds)."""

    def __init__(self, at: float, hold: bool) -> None:
        super().__init__(period=at)
        self.reached = threading.Event() if hold else None
        self.go = threading.Event()

    def on_update(self, dt: float) -> None:
        if self.reached is not None and not self.reached.is_set():
            self.reached.set()
            # Simulated time stands at this instant while the hook waits: the host's sets
            # get the key of the next delta cycle. Bounded, so a lost host cannot hang it.
            self.go.wait(timeout=60.0)


def make_net(at: float = 2.0, hold: bool = False) -> dict[str, mujou.Node]:
    """The cart, its controller and the hold (ticking once at ``at`` s), connected.

    ``mujou run examples/parameters.py`` builds it with the defaults: the hold
    ticks at 2 s and holds nothing.
    """
    cart, controller = Cart(), Controller()
    mujou.connect(cart.state, controller.state)
    mujou.connect(controller.force, cart.force)
    return {"cart": cart, "controller": controller, "hold": Hold(at, hold)}


def fingerprint(cart: Cart) -> str:
    """The cart's trajectory as a short hash: equal only if every bit is."""
    data = b"".join(struct.pack("<dd", x, v) for x, v in cart.trajectory)
    return hashlib.sha256(data).hexdigest()[:16]


def error_at(cart: Cart, t: float, setpoint: float) -> float:
    """The position error, m, at the cart's update at ``t`` seconds."""
    return setpoint - cart.trajectory[round(t / 0.001) - 1][0]


def show_changes(controller: Controller) -> str:
    return "; ".join(f"{name} {old} -> {new} at t = {t:.3f} s"
                     for name, old, new, t in controller.changes)


def record(path: str, args: argparse.Namespace) -> tuple[str, Controller]:
    """Run the net once, recorded, retuned at ``args.at``; its fingerprint and controller."""
    net = make_net(args.at, hold=True)
    controller, hold = net["controller"], net["hold"]
    assert isinstance(controller, Controller) and isinstance(hold, Hold)
    assert hold.reached is not None
    controller.setpoint = args.setpoint  # a node's own write: checked, no on_param
    run = mujou.run(net, timer="simulated", duration=args.duration, workers=args.workers,
                    seed=0, record=path)
    try:
        print("parameters")
        for name, d in run.describe_params().items():
            bounds = "" if d["range"] is None else f" in {d['range']}"
            flag = ", read-only" if d["read_only"] else ""
            print(f"  {name:22s} {d['value']!r:6}{bounds}{flag}: {d['description']}")
        if not hold.reached.wait(timeout=60.0):
            run.stop()
        else:
            keys = [run.set_param("controller.kp", args.kp),
                    run.set_param("controller.ki", args.ki)]
            t_ns, delta = keys[0]
            print(f"set          kp = {args.kp:g}, ki = {args.ki:g} at the hold; they apply "
                  f"from t = {t_ns / 1e9:.9f} s, delta {delta}")
            for path_, value in (("controller.kp", 500.0), ("controller.limit", 2.0)):
                try:
                    run.set_param(path_, value)
                except mujou.ParamError as exc:  # a ValueError too
                    print(f"refused      {exc}")
    finally:
        hold.go.set()
    run.join()
    cart = net["cart"]
    assert isinstance(cart, Cart)
    print(f"on_param     {show_changes(controller)}")
    print(f"error        {error_at(cart, args.at, args.setpoint):+.4f} m at t = {args.at:g} s, "
          f"{error_at(cart, args.duration, args.setpoint):+.4f} m at t = {args.duration:g} s")
    return fingerprint(cart), controller


def show_recording(path: str) -> None:
    found = mcapfile.info(path)
    sets = [a.name for a in found.attachments if a.name.startswith("param-")]
    start = len(json.loads(found.run["params"]))
    print(f"recorded     {found.messages} messages, the start values of {start} parameters, "
          f"{len(sets)} sets: {', '.join(sets)}")


def replay(path: str, args: argparse.Namespace) -> tuple[str, int, Controller]:
    """A fresh net with the classes' defaults, replayed from the recording and compared."""
    net = make_net(args.at)  # no hold: the recorded keys say where each set applies
    compared = assert_replay_matches(path, net, workers=args.workers)
    cart, controller = net["cart"], net["controller"]
    assert isinstance(cart, Cart) and isinstance(controller, Controller)
    return fingerprint(cart), compared, controller


def main(argv: list[str] | None = None) -> int:
    """Record, retune, replay; 0 when the replay is bit-identical."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=4.0,
                        help="seconds of the run's timer (default: 4)")
    parser.add_argument("--at", type=float, default=2.0,
                        help="when the host retunes the controller, s (default: 2)")
    parser.add_argument("--kp", type=float, default=8.0, help="the new kp (default: 8)")
    parser.add_argument("--ki", type=float, default=2.0, help="the new ki (default: 2)")
    parser.add_argument("--setpoint", type=float, default=0.5,
                        help="the setpoint, set before the run, m (default: 0.5)")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker threads (default: mujou's choice)")
    parser.add_argument("--keep", metavar="PATH", help="write the recording here (kept)")
    args = parser.parse_args(argv)
    if not 0.0 < args.at < args.duration:
        parser.error("--at must be within the run: 0 < --at < --duration")

    print(f"cart and PID controller: {args.duration:g} s simulated, retuned at "
          f"t = {args.at:g} s")
    with tempfile.TemporaryDirectory() as folder:
        path = args.keep or os.path.join(folder, "parameters.mcap")
        recorded, _ = record(path, args)
        show_recording(path)
        replayed, compared, controller = replay(path, args)
    print(f"replayed     on_param {show_changes(controller)}")
    same = replayed == recorded
    print(f"fingerprint  {recorded} recorded, {replayed} replayed: "
          f"{'identical' if same else 'DIFFERENT'} ({compared} messages compared bit for bit)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
