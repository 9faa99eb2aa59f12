"""The inverted pendulum with its physics and its controller in processes of their own.

The net of ``inverted_pendulum.py``, unchanged, run twice on the simulated timer:
first in one process, as ``inverted_pendulum.py`` runs it, then placed over three
processes::

    process "physics":  physics (MuJoCo, 500 Hz)
    process "control":  controller (LQR, 100 Hz)
    this process:       sensor (250 Hz), recorder, and the root that holds them

Every message between them crosses a process boundary (ZeroMQ over ``ipc://``),
and the driver in this process runs the groups in global delta cycles, so the
placed run records the same trajectory, bit for bit: the script prints both
fingerprints, the same one that ``inverted_pendulum.py`` prints for the same
``--seed`` and ``--duration``, and exits with 1 if they differ.

``mujou.run`` gets the function that builds the net (``inverted_pendulum.make_net``),
never the net: every process calls it with ``net_kwargs`` and builds the net itself.
Run it from the repository root::

    python examples/pendulum_processes.py                 # 5 s simulated, seed 0
    python examples/pendulum_processes.py --duration 2 --workers 2

The same placed run from the command line::

    mujou run examples/inverted_pendulum.py:make_net --timer simulated --duration 5 \\
        --seed 0 --place physics=physics --place controller=control --net-kwargs '{"seed": 0}'

The work of the script is under ``if __name__ == "__main__":``: the group processes
are started with ``spawn``, which imports this file again in each of them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import mujou_actors as mujou

# The pendulum's nodes live next to this file. The folder stays on sys.path for the
# group processes too: they start with this process's sys.path and import the
# factory, inverted_pendulum.make_net, by its module's name.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import inverted_pendulum as ip  # noqa: E402

PLACEMENT = {"physics": "physics", "controller": "control"}


def main(argv: list[str] | None = None) -> int:
    """Run the pendulum in one process and placed; 0 when both record the same trajectory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0,
                        help="seconds of simulated time (default: 5)")
    parser.add_argument("--seed", type=int, default=0, help="run seed (default: 0)")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker threads of each process (default: mujou's choice)")
    args = parser.parse_args(argv)

    # 1. One process, exactly as inverted_pendulum.py runs it.
    t0 = time.perf_counter()
    net = ip.make_net(seed=args.seed)
    single = mujou.run(net, timer="simulated", duration=args.duration, seed=args.seed,
                       workers=args.workers)
    single.join()
    single_wall = time.perf_counter() - t0
    expected = ip.fingerprint(net.recorder.trajectory())

    # 2. Placed: the function that builds the net, and its keyword arguments.
    t0 = time.perf_counter()
    placement = mujou.Placement(PLACEMENT, net_kwargs={"seed": args.seed})
    run = mujou.run(ip.make_net, placement=placement, timer="simulated",
                    duration=args.duration, seed=args.seed, workers=args.workers)
    started = time.perf_counter() - t0  # the processes started, the nets built and checked
    run.join()
    placed_wall = time.perf_counter() - t0
    stats = run.stats()
    # The recorder runs in this process (the group "host"): its node is the live one.
    traj = run.nodes["recorder"].trajectory()
    got = ip.fingerprint(traj)
    stayed_up = len(traj["theta"]) > 0 and bool(
        (traj["theta"].abs() < ip.pm.THETA_LIMIT_RAD).all())

    print(f"inverted pendulum in processes: {stats.time:g} s simulated, seed {args.seed}")
    print(f"  {'group':<9}{'pid':>8}{'CPU [s]':>9}{'msgs in':>9}{'msgs out':>10}"
          f"{'kB in':>8}{'kB out':>8}  nodes")
    for name, g in stats.groups.items():
        nodes = ", ".join(p for p in g.nodes if p) or "-"  # the root "" holds the others
        print(f"  {name:<9}{g.pid:>8}{g.cpu_time:>9.2f}{g.messages_in:>9}{g.messages_out:>10}"
              f"{g.bytes_in / 1e3:>8.0f}{g.bytes_out / 1e3:>8.0f}  {nodes}")
    print(f"  {'node':<12}{'updates':>9}  drops (newest kept)")
    for path, node in stats.nodes.items():
        if path:
            drops = ", ".join(f"{name} {n}" for name, n in node.drops.items() if n) or "-"
            print(f"  {path:<12}{node.updates:>9}  {drops}")
    print(f"  stayed up    {'yes' if stayed_up else 'NO'}")
    print(f"  wall time    one process {single_wall:.2f} s, placed {placed_wall:.2f} s "
          f"({started:.2f} s to start the processes, {placed_wall - started:.2f} s to run)")
    print(f"  fingerprint  {got} (placed)")
    print(f"  fingerprint  {expected} (one process)")
    same = got == expected
    print(f"  bit-identical {'yes' if same else 'NO'}")
    return 0 if same and stayed_up else 1


if __name__ == "__main__":
    sys.exit(main())
