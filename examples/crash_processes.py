"""A process of a placed run killed mid-run, restored from a snapshot, ending as if never killed.

The inverted pendulum of ``inverted_pendulum.py`` runs on the simulated timer with its
physics and its controller in processes of their own::

    process "physics":  physics (MuJoCo, 500 Hz)
    process "control":  controller (LQR, 100 Hz), which kills its own process once
    this process:       sensor (250 Hz), monitor (sums every state it sees)

At ``--crash-at`` seconds the controller sends its own process SIGKILL, the way an
out-of-memory kill or a segfault in C code would end it: no exception, no ``on_stop``,
its state gone. A marker file records the kill, so it happens once. The run's
``mujou.Supervisor("one_for_all", snapshot_every=...)`` has taken a snapshot of the
whole net at every multiple of ``--snapshot-every``: the host sees the process end,
starts a new one for the group, and rewinds every group to the latest snapshot, and
the run replays from there. Simulated time is deterministic across processes, so the
run ends in the same state, bit for bit, as a run in one process that was never
killed: the script prints both states' fingerprints and the restarts, and exits with 1
if the states differ or the process was not killed and restored exactly once.
Run it from the repository root::

    python examples/crash_processes.py
    python examples/crash_processes.py --crash-at 2.5 --duration 4 --snapshot-every 1

The net factory, ``make_net``, is a module-level function of this file: each group
process loads this file and calls it with ``net_kwargs`` (plain data), so the work of
the script stays under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

import torch

import mujou_actors as mujou

# The pendulum's nodes live next to this file (the group processes find them too: they
# load this file, which puts its folder on sys.path before the import).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import inverted_pendulum as ip  # noqa: E402

PLACEMENT = {"physics": "physics", "controller": "control"}


class KillingController(ip.Controller):
    """The LQR controller, killing its own process (SIGKILL) at ``crash_at`` seconds, once.

    Args:
        marker (str): a file that does not exist yet; the kill creates it (with the
            pid and the time), so the restored controller does not kill again. ``""``:
            never kill.
        crash_at (float): the simulated time of the kill, seconds.
    """

    def __init__(self, marker: str, crash_at: float) -> None:
        super().__init__()
        self.marker = marker
        self.crash_ns = round(crash_at * 1e9)
        self.now_ns = 0  # the controller's clock: the sum of its dt, in the state below

    def on_update(self, dt: float) -> None:
        self.now_ns += round(dt * 1e9)
        if self.marker and self.now_ns >= self.crash_ns and not os.path.exists(self.marker):
            with open(self.marker, "w") as f:
                f.write(f"{os.getpid()} {self.now_ns}")
            os.kill(os.getpid(), signal.SIGKILL)
        super().on_update(dt)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["now_ns"] = self.now_ns
        return state


class Monitor(mujou.Node):
    """Sums every true state it sees and keeps the largest |theta|: a digest of the run.

    Its attributes are tensors, so they are in its state without more code.
    """

    state = mujou.Input(torch.Tensor, shape=(4,), dtype=torch.float64, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.total = torch.zeros(4, dtype=torch.float64)
        self.count = torch.zeros((), dtype=torch.int64)
        self.peak_theta = torch.zeros((), dtype=torch.float64)

    def on_update(self, dt: float) -> None:
        for s in self.state.drain():
            self.total += s
            self.count += 1
            self.peak_theta = torch.maximum(self.peak_theta, s[1].abs())


def make_net(marker: str = "", crash_at: float = 1.5, seed: int = 0) -> dict[str, mujou.Node]:
    """The pendulum with a controller that kills its process; the same net in every process.

    Args:
        marker (str): the controller's marker file (``""``: it never kills).
        crash_at (float): when it kills, simulated seconds.
        seed (int): the seeds of physics (``2 * seed``) and sensor (``2 * seed + 1``).

    Returns:
        dict[str, mujou.Node]: physics, sensor, controller and monitor, wired.
    """
    net: dict[str, mujou.Node] = {
        "physics": ip.Physics(seed=2 * seed),
        "sensor": ip.Sensor(seed=2 * seed + 1),
        "controller": KillingController(marker, crash_at),
        "monitor": Monitor(),
    }
    mujou.connect(net["physics"].state, net["sensor"].state)
    mujou.connect(net["sensor"].measurement, net["controller"].measurement)
    mujou.connect(net["controller"].command, net["physics"].command)
    mujou.connect(net["physics"].state, net["monitor"].state)
    return net


def digest(tree: Any) -> str:
    """A short hex digest of a state tree: its structure, order, numbers and tensor bytes."""
    h = hashlib.sha256()

    def visit(value: Any) -> None:
        if isinstance(value, dict):
            h.update(b"{%d" % len(value))
            for key, item in value.items():
                h.update(repr(key).encode())
                visit(item)
        elif isinstance(value, (list, tuple)):
            h.update(b"[%d" % len(value) if isinstance(value, list) else b"(%d" % len(value))
            for item in value:
                visit(item)
        elif isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(f"{type(value).__name__}:{value!r}".encode())

    visit(tree)
    return h.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    """Run the net once in one process and once placed with a kill; 0 when they end equal."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0,
                        help="simulated seconds (default: 3)")
    parser.add_argument("--crash-at", type=float, default=1.5,
                        help="simulated second at which the controller's process is "
                             "killed (default: 1.5)")
    parser.add_argument("--snapshot-every", type=float, default=0.5,
                        help="simulated seconds between snapshots (default: 0.5)")
    parser.add_argument("--seed", type=int, default=0, help="run seed (default: 0)")
    args = parser.parse_args(argv)
    # The driver's warning names the dead group and the snapshot it restores.
    logging.basicConfig(format="%(name)s %(levelname)s: %(message)s")

    # 1. The reference: one process, no kill.
    t0 = time.perf_counter()
    reference = mujou.run(make_net(seed=args.seed), timer="simulated",
                          duration=args.duration, seed=args.seed)
    reference.join()
    expected = digest(reference.state_dict())
    reference_wall = time.perf_counter() - t0

    # 2. Placed, with the kill, under a supervisor that snapshots and restores.
    folder = tempfile.mkdtemp(prefix="mujou-crash-")
    marker = os.path.join(folder, "killed")
    t0 = time.perf_counter()
    try:
        supervisor = mujou.Supervisor("one_for_all", snapshot_every=args.snapshot_every)
        placement = mujou.Placement(PLACEMENT, net_kwargs={
            "marker": marker, "crash_at": args.crash_at, "seed": args.seed})
        run = mujou.run(make_net, placement=placement, timer="simulated",
                        duration=args.duration, seed=args.seed, supervisor=supervisor)
        started = time.perf_counter() - t0
        first_pid = run.stats().groups["control"].pid
        run.join()
        final = run.state_dict()
        stats = run.stats()
        killed = os.path.exists(marker)
        if killed:
            with open(marker) as f:
                pid_text, t_text = f.read().split()
            killed_pid, killed_ns = int(pid_text), int(t_text)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    placed_wall = time.perf_counter() - t0
    got = digest(final)

    restarts = {path: node.restarts for path, node in stats.nodes.items()}
    new_pid = stats.groups["control"].pid
    print(f"pendulum in processes, the controller's process killed once: {stats.time:g} s "
          f"simulated, seed {args.seed}")
    if killed:
        print(f"  killed       group 'control' (pid {killed_pid}) by SIGKILL at "
              f"t = {killed_ns / 1e9:.3f} s")
        # The latest snapshot before the kill: the grid's last instant that had ended.
        every_ns = round(args.snapshot_every * 1e9)
        restored_ns = (killed_ns - 1) // every_ns * every_ns
        print(f"  restored     every group from the snapshot at t = {restored_ns / 1e9:.3f} s "
              f"(one_for_all); 'control' is pid {new_pid} now")
    else:
        print("  killed       never")
    print("  restarts     " + ", ".join(f"{p} {n}" for p, n in restarts.items()))
    print(f"  snapshots    {stats.snapshots.count} taken, "
          f"pause mean {stats.snapshots.pause_mean * 1e3:.1f} ms")
    print(f"  peak |theta| {float(final['nodes']['monitor']['peak_theta']):.5f} rad over "
          f"{int(final['nodes']['monitor']['count'])} states")
    print(f"  wall time    one process {reference_wall:.2f} s, placed {placed_wall:.2f} s "
          f"({started:.2f} s to start the processes, the rest to run, restart included)")
    print(f"  fingerprint  {got} (placed, killed and restored)")
    print(f"  fingerprint  {expected} (one process, never killed)")
    same = got == expected
    print(f"  same final state {'yes' if same else 'NO'}")
    once = killed and new_pid != first_pid and set(restarts.values()) == {1}
    return 0 if same and once else 1


if __name__ == "__main__":
    sys.exit(main())
