"""Placed runs with real group processes: Thespian's control plane, ZeroMQ's data plane.

Each test starts group processes (spawn; each imports torch, about 1-2 s), so
they are few and each checks much: bit-identical results, a group killed and
restored, a stuck group stopped, and nothing left behind.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

import mujou_actors as mujou
from mujou_actors.errors import GroupDied, NodeError, StopTimeoutError
from tests import placed_support
from tests.test_placed import assert_same_tree, single

pytestmark = pytest.mark.timeout(180)


def _gone(pids: list[int], within: float = 10.0) -> bool:
    """Whether every pid has ended (or become a zombie nobody waits for) within ``within`` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split(") ")[1][0] != "Z":
                        alive.append(pid)
            except FileNotFoundError:
                pass
        if not alive:
            return True
        time.sleep(0.05)
    return False


def test_groups_in_processes_match_one_process_and_leave_nothing_behind() -> None:
    expected = single(0.2)
    threads = set(threading.enumerate())
    run = mujou.run(placed_support.make_net, placement={"sim": "physics", "ctrl": "control"},
                    timer="simulated", duration=0.2, seed=7, workers=2)
    stats = run.stats()
    port = run._driver.system.admin_port
    pids = run._driver.system.run_pids()
    run.join(60)
    assert_same_tree(run.state_dict(), expected)
    groups = [g.pid for name, g in stats.groups.items() if name != "host"]
    assert len(set(groups)) == 2 and os.getpid() not in groups and set(groups) <= set(pids)
    assert stats.groups["host"].pid == os.getpid()
    assert len(pids) >= 5  # Thespian's admin and logger, the coordinator, the two groups
    assert _gone(pids)
    deadline = time.monotonic() + 10
    while set(threading.enumerate()) - threads and time.monotonic() < deadline:
        time.sleep(0.05)  # the driver's and the host group's threads end as join returns
    assert set(threading.enumerate()) <= threads
    while port in _listening() and time.monotonic() < deadline + 10:
        time.sleep(0.05)
    assert port not in _listening()  # nothing listens on the run's admin port any more


def _listening() -> set[int]:
    """The TCP ports some socket of this machine listens on (/proc/net/tcp, state 0A)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A":
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_three_groups_and_a_tree_that_crosses_placements() -> None:
    half = single(0.1)
    run = mujou.run(placed_support.make_net, placement={"sim": "a", "ctrl": "b", "log": "c"},
                    timer="simulated", duration=0.1, seed=7, state=half)
    run.join(60)
    assert_same_tree(run.state_dict(), single(0.2))


def test_a_killed_group_is_restored_from_the_latest_snapshot_and_ends_equal(tmp_path) -> None:
    reference = single(0.2, factory=placed_support.make_crashing)  # no marker: no crash
    marker = str(tmp_path / "crashed")
    run = mujou.run(placed_support.make_crashing, placement={"crasher": "fragile"},
                    net_kwargs={"marker": marker, "at": 7}, timer="simulated", duration=0.2,
                    seed=7, supervisor=mujou.Supervisor("one_for_all", snapshot_every=0.05))
    run.join(120)
    assert os.path.exists(marker)  # it did crash, once
    tree = run.state_dict()
    assert_same_tree(tree, reference)
    stats = run.stats()
    assert stats.nodes["crasher"].restarts == 1 and stats.nodes["sim"].restarts == 1
    assert stats.groups["fragile"].pid != int(open(marker).read())  # a new process


def test_a_dead_group_without_a_supervisor_ends_the_run_with_group_died(tmp_path) -> None:
    marker = str(tmp_path / "crashed")
    run = mujou.run(placed_support.make_crashing, placement={"crasher": "fragile"},
                    net_kwargs={"marker": marker, "at": 3, "how": "exit"}, timer="simulated",
                    duration=1.0, seed=7)
    t0 = time.monotonic()
    with pytest.raises(GroupDied, match="'fragile'") as info:
        run.join(60)
    assert time.monotonic() - t0 < 10
    assert info.value.pid == int(open(marker).read())
    stats = run.stats()  # the survivors' figures are kept, and the dead group's last ones
    assert "host" in stats.groups and stats.groups["host"].pid == os.getpid()
    assert stats.nodes["sim"].updates > 0
    with pytest.raises(GroupDied, match="no final state"):
        run.state_dict()  # its nodes' state died with it: no partial tree


def test_a_hooks_exception_crosses_processes_with_its_traceback() -> None:
    run = mujou.run(placed_support.make_flaky, placement={"flaky": "b"}, timer="simulated",
                    duration=1.0, seed=7)
    with pytest.raises(NodeError) as info:
        run.join(60)
    assert info.value.path == "flaky" and info.value.hook == "on_update"
    assert "flaky at tick 5" in info.value.__cause__.traceback


def test_stop_while_a_group_is_stuck_is_bounded_and_reports_it() -> None:
    run = mujou.run(placed_support.make_stuck, placement={"stuck": "s"}, timer="simulated",
                    seed=7, stop_timeout=1.0)
    pid = run.stats().groups["s"].pid
    time.sleep(0.5)  # wall time for the stuck hook to be entered (the run has no end)
    t0 = time.monotonic()
    run.stop()
    assert time.monotonic() - t0 < 15
    with pytest.raises(StopTimeoutError):
        run.join(1)
    assert _gone([pid])


def test_a_real_time_placed_run_in_processes() -> None:
    run = mujou.run(placed_support.make_net, placement={"sim": "a", "ctrl": "b"},
                    timer="realtime", duration=0.5, seed=7)
    cmd = run.wait_for("ctrl.cmd", timeout=30)
    assert isinstance(cmd, torch.Tensor)
    tree = run.state_dict(timeout=10)
    run.join(30)
    final = run.state_dict()
    for t in (tree, final):
        n = t["nodes"]["ctrl"]["n"]
        cmds = sum(1 for kind, _ in t["nodes"]["log"]["seen"] if kind == "cmd")
        assert cmds + len(t["pending"].get("log.cmd", [])) == n
    assert final["nodes"]["ctrl"]["n"] >= 20




def test_every_host_api_call_reaches_group_processes() -> None:
    run = mujou.run(placed_support.make_net, placement={"sim": "a", "ctrl": "b"},
                    timer="simulated", seed=7)
    seen: list[torch.Tensor] = []
    try:
        sub = run.subscribe("ctrl.cmd", seen.append)
        assert isinstance(run.wait_for("sim.out", timeout=30), torch.Tensor)
        assert isinstance(run.read("sim.out"), torch.Tensor)
        run.write("ctrl.obs", torch.zeros(3))  # into a group process
        run.write("log.cmd", torch.full((3,), 7.0))  # into the host's group
        run.wait_for("ctrl.cmd", timeout=30)
        mid = run.state_dict(timeout=30)
        stats = run.stats()
        assert run.running
    finally:
        run.stop()
    run.join(30)
    assert set(stats.groups) == {"a", "b", "host"}
    assert stats.groups["a"].messages_out > 0 and stats.groups["b"].messages_in > 0
    assert stats.groups["b"].bytes_in > 0 and stats.groups["a"].cpu_time > 0
    assert stats.nodes["sim"].updates > 0 and list(stats.nodes) == ["sim", "ctrl", "log"]
    assert sub.delivered == len(seen) >= 1
    n = mid["nodes"]["ctrl"]["n"]
    assert n + len(mid["pending"].get("ctrl.obs", [])) == mid["time_ns"] // 10**7 + 1
    final = run.state_dict()
    assert ["cmd", [7.0, 7.0, 7.0]] in final["nodes"]["log"]["seen"]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts fds in /proc")
def test_placed_runs_leave_no_file_descriptor_behind_in_the_host() -> None:
    # Each placed run left its driver's wake pipe open: two fds a run, 1,000 in a
    # test session (then select() refused them).
    def one() -> None:
        run = mujou.run(placed_support.make_net, placement={"sim": "a", "ctrl": "b"},
                        timer="simulated", duration=0.1, seed=7)
        run.join(60)

    one()
    after_first = _open_fds()
    for _ in range(3):
        one()

    assert _open_fds() <= after_first
