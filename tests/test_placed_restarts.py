"""A group that dies as the host looks at it, or as the run ends, is restored; the run ends
as if nothing had happened.

A death races the run's other business: a ``stats()`` call may meet the
dying process before its exit notice is taken, and the run may reach its end
between the death and the notice (or the heartbeat's verdict on a lost
machine). Either way the supervisor restores the group and the run finishes
with the final state of an uninterrupted run (docs/processes.md, "Supervision
across processes"). The first tests make the races happen on purpose
(`DyingSystem`: a group that "dies" as a given request reaches it); the last
kills real group processes at seeded random moments while ``stats()`` is
polled, as the live view does.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from typing import Any

import pytest

import mujou_actors as mujou
from mujou_actors._runtime.build import Seams
from mujou_actors.distributed import group, placed
from mujou_actors.distributed.system import GroupExit
from mujou_actors.errors import GroupDied
from mujou_actors.run import _check_arguments
from tests import placed_support
from tests.placed_support import InProcessSystem
from tests.test_placed import assert_same_tree, single

pytestmark = pytest.mark.timeout(180)


class DyingSystem(InProcessSystem):
    """`InProcessSystem` whose group ``victim`` dies as the ``nth`` request of type
    ``kind`` reaches it: its server is closed, the request raises `GroupDied` (as a
    request to a process found gone does) and its exit is noticed next
    (`take_exits`), as the coordinator's notice comes a little later."""

    def __init__(self, start_timeout: float = 30.0, *, victim: str, kind: type,
                 nth: int = 1) -> None:
        super().__init__(start_timeout)
        self.victim, self.kind, self.left = victim, kind, nth
        self.exits: list[GroupExit] = []
        self.deaths = 0
        self.pids: dict[str, int] = {}

    def start_group(self, group_name: str, target: str, kwargs: dict[str, Any],
                    timeout: float) -> int:
        super().start_group(group_name, target, kwargs, timeout)
        self.pids[group_name] = 1_000_000 + len(self.pids) + 100 * self.deaths  # a new process
        return self.pids[group_name]

    def ask(self, group_name: str, request: Any, timeout: float) -> Any:
        if group_name == self.victim and isinstance(request, self.kind):
            self.left -= 1
            if self.left == 0:
                self.deaths += 1
                self.servers[group_name].close(1.0)
                pid = self.pids[group_name]
                self.exits.append(GroupExit(group_name, pid, "killed (test)"))
                raise GroupDied(group_name, pid, "its process is gone")
        return super().ask(group_name, request, timeout)

    def take_exits(self) -> list[Any]:
        exits, self.exits = self.exits, []
        return exits


def _placed(system: DyingSystem, duration: float, timer: str = "simulated"
            ) -> placed.PlacedRun:
    supervisor = mujou.Supervisor("one_for_all", snapshot_every=0.05)
    args = _check_arguments(Seams(), workers=1, timer=timer, duration=duration, seed=7,
                            state=None, supervisor=supervisor, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=10.0, start_timeout=60.0)
    return placed.start(placed_support.make_net, placement={"sim": "a", "ctrl": "b"},
                        net_kwargs=None, args=args, inputs=None, state=None,
                        make_system=lambda start_timeout: system)


def test_a_group_that_dies_under_a_stats_call_is_restored_and_ends_with_the_final_state(
        ) -> None:
    system = DyingSystem(victim="b", kind=group.Stats)
    run = _placed(system, 1.0)

    stats = run.stats()  # meets the dying group: its figures are its last known (none yet)
    run.join(60)

    assert system.deaths == 1
    assert "b" not in stats.groups and "a" in stats.groups
    assert run.failure is None
    assert_same_tree(run.state_dict(), single(1.0))
    assert {n.restarts for n in run.stats().nodes.values()} == {1}
    assert run.stats().groups["b"].nodes == ("ctrl",)


def test_a_group_that_dies_as_the_run_ends_is_restored_and_the_run_finished() -> None:
    # The first Stats request is the end's (nobody else asks): the group dies there,
    # after its last round, before its stop.
    system = DyingSystem(victim="a", kind=group.Stats)
    run = _placed(system, 0.2)

    run.join(60)

    assert system.deaths == 1
    assert run.failure is None
    assert_same_tree(run.state_dict(), single(0.2))
    assert {n.restarts for n in run.stats().nodes.values()} == {1}


def test_a_group_that_dies_as_a_real_time_run_ends_is_restored_and_the_run_finished(
        ) -> None:
    # In real time the clock cannot rewind: the restored groups end at once, and the
    # run's final state is taken from them (never an end without it).
    system = DyingSystem(victim="a", kind=group.Stats)
    run = _placed(system, 0.3, timer="realtime")

    run.join(60)

    assert system.deaths == 1
    assert run.failure is None
    tree = run.state_dict()
    assert list(tree["nodes"]) == ["sim", "ctrl", "log"]
    assert tree["time_ns"] >= 300_000_000
    assert {n.restarts for n in run.stats().nodes.values()} == {1}


def test_a_group_that_dies_as_the_run_stops_fails_the_run_loudly() -> None:
    # A death the run cannot restore from (the host asked for the stop) is never an end
    # "without an error": join raises, and the state says why there is none.
    system = DyingSystem(victim="a", kind=group.Stats)
    run = _placed(system, None)  # type: ignore[arg-type]

    run.stop()

    with pytest.raises(GroupDied, match="'a'"):
        run.join(60)
    with pytest.raises(GroupDied, match="no final state"):
        run.state_dict()


def test_groups_killed_at_random_moments_while_stats_are_polled_end_as_if_nothing_happened(
        tmp_path) -> None:
    duration = 0.4
    reference = single(duration, factory=placed_support.make_crashing)  # no marker: no crash
    # Two SIGKILLs at seeded random times of the run, and the crasher's own death at its
    # last tick (the run's last instant: within its last heartbeat period).
    rng = random.Random(29)  # kills at 0.151 s and 0.215 s
    targets = sorted(rng.uniform(0.1, 0.9) * duration for _ in range(2))
    marker = str(tmp_path / "crashed")
    last_tick = round(duration / 0.01)
    run = mujou.run(placed_support.make_crashing, placement={"crasher": "fragile"},
                    net_kwargs={"marker": marker, "at": last_tick}, timer="simulated",
                    duration=duration, seed=7,
                    supervisor=mujou.Supervisor("one_for_all", snapshot_every=0.05,
                                                max_restarts=10))
    killed: list[int] = []
    polled = threading.Event()

    def kill_as_the_time_comes() -> None:
        # Polls stats() all along (as the live view does): one meets each dying process.
        pending = list(targets)
        while run.running:
            stats = run.stats()
            polled.set()
            pid = stats.groups["fragile"].pid if "fragile" in stats.groups else 0
            if pending and stats.time >= pending[0] and pid and pid not in killed:
                pending.pop(0)
                killed.append(pid)
                os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_as_the_time_comes, daemon=True)
    killer.start()
    run.join(150)
    killer.join(30)

    assert polled.is_set() and os.path.exists(marker) and len(killed) == 2
    assert run.failure is None
    assert_same_tree(run.state_dict(), reference)
    restarts = run.stats().nodes["crasher"].restarts
    assert restarts == len(killed) + 1  # every kill, and the crasher's own death
    assert run.stats().groups["fragile"].pid not in killed + [int(open(marker).read())]
