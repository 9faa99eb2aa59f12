"""The inverted pendulum with a controller that crashes once, restarted by a supervisor.

The pipeline of ``inverted_pendulum.py`` runs under ``mujou.Supervisor("one_for_one")``,
which snapshots the net every second of simulated time (and writes the snapshots to
``--snapshot-dir``). At ``--fail-at`` seconds the controller raises; the supervisor
gives it ``on_stop``, ``on_start`` and its state from the latest snapshot, and the
other nodes never stop: the physics holds the last command for the one missed
control period. Run it from the repository root::

    python examples/pendulum_restart.py
    python examples/pendulum_restart.py --fail-at 5 --duration 10 --snapshot-dir snaps

The exit status is 0 when the pole stayed up and the controller restarted exactly once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile

import torch

import mujou_actors as mujou

# The pendulum's nodes live next to this file.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import inverted_pendulum as ip  # noqa: E402


class FlakyController(ip.Controller):
    """The LQR controller, raising once when its clock reaches ``fail_at`` seconds."""

    def __init__(self, fail_at: float) -> None:
        super().__init__()
        self.fail_at = fail_at
        # Plain Python attributes are not part of the state: a restart does not
        # rewind them, so the clock keeps counting and the node fails only once.
        self.clock = 0.0
        self.failed_at: float | None = None

    def on_update(self, dt: float) -> None:
        self.clock += dt
        if self.failed_at is None and self.clock >= self.fail_at:
            self.failed_at = self.clock
            raise RuntimeError(f"controller crashed at t = {self.clock:.3f} s")
        super().on_update(dt)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fail-at", type=float, default=20.0,
                        help="simulated second at which the controller raises (default: 20)")
    parser.add_argument("--duration", type=float, default=60.0,
                        help="simulated seconds (default: 60)")
    parser.add_argument("--snapshot-dir", default=None,
                        help="folder for the snapshot files (default: a new temporary folder)")
    parser.add_argument("--seed", type=int, default=0, help="run seed (default: 0)")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(name)s %(levelname)s: %(message)s")  # shows the restart
    snapshot_dir = args.snapshot_dir or tempfile.mkdtemp(prefix="mujou-snapshots-")

    net = {
        "physics": ip.Physics(seed=2 * args.seed),
        "sensor": ip.Sensor(seed=2 * args.seed + 1),
        "controller": FlakyController(args.fail_at),
        "recorder": ip.Recorder(),
    }
    mujou.connect(net["physics"].state, net["sensor"].state)
    mujou.connect(net["sensor"].measurement, net["controller"].measurement)
    mujou.connect(net["controller"].command, net["physics"].command)
    mujou.connect(net["physics"].state, net["recorder"].state)
    mujou.connect(net["controller"].command, net["recorder"].command)

    supervisor = mujou.Supervisor("one_for_one", snapshot_every=1.0, snapshot_dir=snapshot_dir)
    run = mujou.run(net, timer="simulated", duration=args.duration, seed=args.seed,
                    supervisor=supervisor)
    run.join()

    stats = run.stats()
    restarts = stats.nodes["controller"].restarts
    snaps = stats.snapshots
    crash = net["controller"].failed_at
    traj = net["recorder"].trajectory()
    theta = traj["theta"].abs()
    after = traj["t"] >= (crash if crash is not None else float("inf"))
    stayed_up = bool((theta < ip.pm.THETA_LIMIT_RAD).all())

    def peak(values: torch.Tensor) -> str:
        return f"{float(values.max()):.5f} rad" if len(values) else "-"

    print(f"pendulum with a crashing controller: {stats.time:g} s simulated")
    print(f"  controller crashed at  {'never' if crash is None else f't = {crash:.3f} s'}")
    print(f"  controller restarts    {restarts}")
    print(f"  snapshots              {snaps.count} taken, {snaps.files} files written; "
          f"pause mean {snaps.pause_mean * 1e3:.2f} ms, max {snaps.pause_max * 1e3:.2f} ms; "
          f"write mean {snaps.write_mean * 1e3:.2f} ms")
    print(f"  max |theta| before     {peak(theta[~after])}")
    print(f"  max |theta| after      {peak(theta[after])}")
    print(f"  stayed up              {'yes' if stayed_up else 'NO'} "
          f"(|theta| < {ip.pm.THETA_LIMIT_RAD} rad throughout)")
    print(f"  snapshot dir           {snapshot_dir}")
    for name in sorted(os.listdir(snapshot_dir)):
        print(f"    {name}")
    print(f"  latest snapshot        {os.path.basename(mujou.latest_snapshot(snapshot_dir))}")
    return 0 if stayed_up and restarts == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
