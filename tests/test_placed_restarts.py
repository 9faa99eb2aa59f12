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
import time
from typing import Any

import pytest

import mujou_actors as mujou
from mujou_actors._runtime.build import Seams
from mujou_actors.distributed import dataplane, ending, group, placed, segments
from mujou_actors.distributed.convention import Member
from mujou_actors.distributed.system import GroupExit
from mujou_actors.errors import GroupDied
from mujou_actors.run import _check_arguments
from tests import placed_support
from tests.placed_support import InProcessSystem
from tests.test_machines import SECRET, _free_port, _kill_tree, _worker
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
    return placed.start(placed_support.make_net,
                        placement=mujou.Placement({"sim": "a", "ctrl": "b"}),
                        args=args, inputs=None, state=None,
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


def test_a_real_time_runs_first_snapshot_is_taken_before_the_clocks_run(
        caplog: pytest.LogCaptureFixture) -> None:
    """As one process takes it: the supervisor's first snapshot is the state at the start,
    before any group's clock runs, so a group that dies at its first cut (here: as it is
    held for one, the first periodic snapshot) is restored from it. It used to be a cut of
    running groups, taken once the driver began: a group dead by then (a crash at an early
    tick on a loaded machine, tests/test_realtime_peers.py) failed the run, no snapshot
    taken to restore from, and its death not the supervisor's."""
    caplog.set_level("WARNING", logger="mujou_actors")
    system = DyingSystem(victim="b", kind=group.Hold)  # the first hold: b dies
    run = _placed(system, 0.3, timer="realtime")
    assert run._driver.recovery.first_taken  # type: ignore[attr-defined]  # by the start

    run.join(60)

    assert system.deaths == 1
    assert run.failure is None
    assert any("restoring every group from the snapshot at t=0.000000 s" in r.getMessage()
               for r in caplog.records)  # the first, at the start: no clock had run
    assert run.state_dict()["time_ns"] >= 300_000_000
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


class _NoticedLate(InProcessSystem):
    """`InProcessSystem` whose group dies when the test says (`kill`: its server closed, as
    a process's end closes its sockets), its exit noticed only once `notice` is set."""

    def __init__(self, start_timeout: float = 30.0) -> None:
        super().__init__(start_timeout)
        self.exits: list[GroupExit] = []
        self.notice = threading.Event()
        self.deaths = 0

    def kill(self, name: str) -> None:
        self.servers[name].close(10.0)
        self.deaths += 1
        self.exits.append(GroupExit(name, os.getpid(), "killed (test)"))

    def take_exits(self) -> list[Any]:
        if not self.notice.is_set():
            return []
        exits, self.exits = self.exits, []
        return exits


def test_a_segment_paused_then_aborted_for_a_dead_peer_ends_and_the_restore_goes_on() -> None:
    """The hang of tests/test_params.py's restore after a death (1 run in 20 under load),
    scripted: on peer links, group b dies as its segment's grant reaches it, so group a
    runs the segment alone and waits to send to b; a host call pauses the segment (a's
    pause goes first) and only then is b found dead, so the host aborts it. a used to read
    the pause, look at the host no more while its send waited, and miss the abort: the
    restore then waited for a for good. a hears the abort behind the pause now, answers,
    and the run is restored and goes on."""
    system = _NoticedLate()
    args = _check_arguments(Seams(), workers=1, timer="simulated", duration=None, seed=7,
                            state=None,
                            supervisor=mujou.Supervisor("one_for_all", snapshot_every=10.0),
                            trace=None, cuda_sync="block", stats=True, stop_timeout=10.0,
                            start_timeout=60.0)
    run = placed.start(placed_support.make_net,
                       placement=mujou.Placement({"sim": "a", "ctrl": "b", "log": "b"}),
                       args=args, inputs=None, state=None,
                       make_system=lambda start_timeout: system)
    driver = run._driver  # type: ignore[attr-defined]
    timing = driver.timing
    assert isinstance(timing, segments.Segments) and timing.applies()
    killed = threading.Event()
    to_a, to_b = driver.groups["a"].link, driver.groups["b"].link
    send_a, send_b = to_a.send, to_b.send

    def grant_a(grant: dataplane.Grant) -> None:
        send_a(grant)
        if grant.segment == "pause" and killed.is_set():
            system.notice.set()  # b's death is found now, after a's pause went

    def grant_b(grant: dataplane.Grant) -> None:
        if isinstance(grant.segment, dataplane.Segment) and not killed.is_set():
            system.kill("b")  # dies with its segment's grant unread: a runs the segment
            killed.set()
            return
        send_b(grant)

    to_a.send, to_b.send = grant_a, grant_b  # (the driver's thread sends each grant)
    try:
        assert killed.wait(30)
        stats = run.stats()  # pauses a's segment; b is found dead, a's segment aborted
        assert system.notice.is_set() and system.deaths == 1
        assert set(stats.groups) == {"a", "b"}  # served after the restore: the new b too
        run.wait_for("ctrl.cmd", timeout=30)  # the restored groups run again
    finally:
        run.stop()
    run.join(60)
    assert run.failure is None
    assert {n.restarts for n in run.stats().nodes.values()} == {1}
    assert timing.segments > 0 and timing._generation >= 2  # the mesh reopened


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
    run = mujou.run(placed_support.make_crashing,
                    placement=mujou.Placement({"crasher": "fragile"},
                                              net_kwargs={"marker": marker, "at": last_tick}),
                    timer="simulated", duration=duration, seed=7,
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



def _pause_before(monkeypatch: pytest.MonkeyPatch, method: str
                  ) -> tuple[threading.Event, threading.Event]:
    """The driver's end waits, as it first calls its ``method`` (of `ending.Ending`), until
    the test sets ``go``; ``reached`` says it is there (the test then makes something
    happen at that moment)."""
    reached, go = threading.Event(), threading.Event()
    original = getattr(ending.Ending, method)

    def paused(self: ending.Ending, *args: Any, **kwargs: Any) -> Any:
        if not reached.is_set():
            reached.set()
            go.wait(60)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ending.Ending, method, paused)
    return reached, go


@pytest.mark.timeout(120)
@pytest.mark.parametrize("moment", ["last_cut", "_stop_groups"])
def test_a_worker_lost_as_the_run_ends_is_restored_on_the_fallback_or_fails_loudly(
        monkeypatch: pytest.MonkeyPatch, moment: str) -> None:
    """Issue 28, item 6: a real ``mujou worker`` vanishes (every process of it stopped,
    then killed: only the heartbeat can tell) within the heartbeat's timeout of the end,
    once the rounds are over: as the end's cut and final stats begin (``last_cut``), or
    as the groups stop (``_stop_groups``). Lost at the cut, the group is restored on
    the fallback and the run ends with the final state of a run without the loss; lost
    as the groups stop (the others' on_stop has run), it cannot be: the run fails loudly
    with GroupDied and has no final state. Never an end without an error and without
    its final state."""
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    duration = 0.3
    expected = single(duration)
    reached, go = _pause_before(monkeypatch, moment)
    leader = f"127.0.0.1:{_free_port()}"
    robot = _worker("robot", leader, SECRET)
    try:
        with Member("spare", leader):
            t0 = time.monotonic()
            run = mujou.run(placed_support.make_net,
                            placement=mujou.Placement({"sim": "robot,spare:physics"},
                                                      listen=leader, heartbeat_timeout=1.0),
                            timer="simulated", duration=duration, seed=7,
                            supervisor=mujou.Supervisor("one_for_all", snapshot_every=0.1))
            try:
                assert run.stats().groups["physics"].machine == "robot"
                assert reached.wait(60)  # the rounds are over: the end comes now
                _kill_tree(robot)
                go.set()
                ended = run.wait(60)
                took = time.monotonic() - t0
            finally:
                go.set()
                run.stop()
    finally:
        _kill_tree(robot)

    assert ended and took < 60
    if moment == "last_cut":
        assert run.failure is None
        assert_same_tree(run.state_dict(), expected)
        stats = run.stats()
        assert stats.groups["physics"].machine == "spare"
        assert {n.restarts for n in stats.nodes.values()} == {1}
    else:
        with pytest.raises(GroupDied, match=r"group 'physics' \(pid \d+\) died: lost: "
                                            r"machine 'robot' stopped answering"):
            run.join()
        with pytest.raises(GroupDied, match="no final state"):
            run.state_dict()
    print(f"the worker lost at {moment}: the run took {took:.1f} s")


class _StopFails(InProcessSystem):
    """`InProcessSystem` whose group ``victim`` cannot be stopped: its `group.Stop`
    request times out (its process stopped answering as the run ended)."""

    def __init__(self, start_timeout: float = 30.0, *, victim: str) -> None:
        super().__init__(start_timeout)
        self.victim = victim

    def ask(self, group_name: str, request: Any, timeout: float) -> Any:
        if group_name == self.victim and isinstance(request, group.Stop):
            self.servers[group_name].close(1.0)
            raise TimeoutError(f"the Stop request to group {group_name!r}: no answer within "
                               f"{timeout} s")
        return super().ask(group_name, request, timeout)


def test_a_group_whose_stop_fails_leaves_the_run_without_a_final_state_not_a_partial_one(
        ) -> None:
    # The end used to merge the other groups' trees: a final state without the group's
    # nodes, which would restore another net.
    run = _placed(_StopFails(victim="b"), 0.2)  # type: ignore[arg-type]

    with pytest.raises(TimeoutError, match="the Stop request to group 'b'"):
        run.join(60)
    with pytest.raises(mujou.NodeError, match=r"no final state \(group 'b': its stop failed: "
                                              r"TimeoutError"):
        run.state_dict()
