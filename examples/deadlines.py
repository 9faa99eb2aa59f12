"""A controller with a budget and a deadline, in real time and in simulated time.

The net::

    Controller (100 Hz, budget 2 ms, deadline 5 ms, on_miss="safe") --command--> Motor

* ``Controller`` sends a command every 10 ms. Every ``--replan``-th update it
  also replans, a burst of 3 ms of CPU time: over its 2 ms budget, so that
  update misses, whatever the machine. Its ``on_deadline_miss`` (called after
  a missed update, in real time) makes it send the safe command (0.0) for the
  next few ticks, as a robot arm would hold still.
* ``Motor`` is triggered by every command and counts the safe ones.

Run it from the repository root::

    python examples/deadlines.py                  # 1 s of real time, then 1 s simulated
    python examples/deadlines.py --duration 3

It prints, for each timer, the updates, the budget and deadline misses that
``run.stats()`` counted, and the safe commands the motor got. In real time
each miss puts the controller in its safe state; in simulated time the same
misses are counted and logged but no policy is applied, so the motor gets no
safe command and the results never depend on how fast the machine ran the
hooks (docs/nodes-and-ports.md, "Deadlines and budgets").
"""

from __future__ import annotations

import argparse
import logging
import time

import mujou_actors as mujou

SAFE_TICKS = 3  # ticks of safe command after a miss


class Controller(mujou.Node):
    """Sends a command every 10 ms; every ``replan``-th update replans for 3 ms of CPU."""

    command = mujou.Output(float)

    def __init__(self, replan: int) -> None:
        super().__init__(period=0.01, budget=0.002, deadline=0.005, on_miss="safe")
        self.replan = replan
        self.n = 0
        self.safe_ticks = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n % self.replan == 0:
            _spend_cpu(0.003)
        if self.safe_ticks:
            self.safe_ticks -= 1
            self.command.send(0.0)
        else:
            self.command.send(1.0)

    def on_deadline_miss(self, miss: mujou.DeadlineMiss) -> None:
        # The next ticks hold still; a real controller would also latch an alarm.
        self.safe_ticks = SAFE_TICKS


class Motor(mujou.Node):
    """Counts the commands it gets, and the safe ones among them."""

    command = mujou.Input(float)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.commands = 0
        self.safe = 0

    def on_update(self, dt: float) -> None:
        for value in self.command.drain():
            self.commands += 1
            self.safe += value == 0.0


def _spend_cpu(seconds: float) -> None:
    """Busy for ``seconds`` of this thread's CPU time (what a budget measures)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def run_once(timer: str, duration: float, replan: int) -> tuple[mujou.NodeStats, Motor]:
    controller, motor = Controller(replan), Motor()
    mujou.connect(controller.command, motor.command)
    run = mujou.run({"controller": controller, "motor": motor}, timer=timer,
                    duration=duration)
    run.join()
    return run.stats().nodes["controller"], motor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=1.0, help="seconds of each run")
    ap.add_argument("--replan", type=int, default=20, help="replan every N updates")
    args = ap.parse_args()
    # Misses are logged as warnings: here the printed counts say it all.
    logging.getLogger("mujou_actors").setLevel(logging.ERROR)
    for timer in ("realtime", "simulated"):
        stats, motor = run_once(timer, args.duration, args.replan)
        print(f"{timer}")
        print(f"  updates          {stats.updates}")
        print(f"  budget misses    {stats.budget_misses}")
        print(f"  deadline misses  {stats.deadline_misses}")
        print(f"  safe commands    {motor.safe} of {motor.commands}")


if __name__ == "__main__":
    main()
