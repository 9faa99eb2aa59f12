"""Placed runs with real group processes: Thespian's control plane, ZeroMQ's data plane.

Each test starts group processes (spawn; each imports torch, about 1-2 s), so
they are few and each checks much: bit-identical results, a group killed and
restored, a stuck group stopped, and nothing left behind.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import pytest
import torch

import mujou_actors as mujou
from mujou_actors import snapshot
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
    run = mujou.run(placed_support.make_crashing,
                    placement=mujou.Placement({"crasher": "fragile"},
                                              net_kwargs={"marker": marker, "at": 7}),
                    timer="simulated", duration=0.2,
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
    run = mujou.run(placed_support.make_crashing,
                    placement=mujou.Placement({"crasher": "fragile"}, net_kwargs={
                        "marker": marker, "at": 3, "how": "exit"}),
                    timer="simulated", duration=1.0, seed=7)
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


def test_a_load_state_dict_failure_in_a_group_process_is_a_node_error_naming_it(
        tmp_path) -> None:
    state = tmp_path / "half.mujou"
    snapshot.save(single(0.05, factory=placed_support.make_refusing), state)

    with pytest.raises(NodeError) as info:
        mujou.run(placed_support.make_refusing,
                  placement=mujou.Placement({"snk": "g"}, net_kwargs={"refuse": "load_state_dict"}),
                  timer="simulated", duration=0.1,
                  seed=7, state=str(state))

    err = info.value
    assert type(err) is NodeError and (err.path, err.hook) == ("snk", "load_state_dict")
    assert str(err) == ("node 'snk' raised in load_state_dict: ValueError: load_state_dict "
                        "refused (in group 'g')")
    assert "load_state_dict refused" in err.__cause__.traceback


@pytest.mark.timeout(60)
def test_a_script_without_the_main_guard_fails_at_once_with_the_guards_message(
        tmp_path) -> None:
    script = tmp_path / "rig.py"
    script.write_text("import mujou_actors as mujou\nfrom tests import placed_support\n\n"
                      "mujou.run(placed_support.make_net, placement={'sim': 'a'}, "
                      "timer='simulated', duration=0.1)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}

    t0 = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=50)
    took = time.monotonic() - t0

    # The host raises the refusal of the run's first process (Thespian's admin, which
    # imports the script as spawn does) once it is made, not after start_timeout (60 s).
    assert done.returncode == 1
    assert done.stderr.rstrip().splitlines()[-1] == (
        "RuntimeError: mujou.run(placement=...) was called while a new process of a placed "
        "run was importing the main script: put the code that starts the run under "
        "`if __name__ == \"__main__\":` (the group processes import the script again, as "
        "multiprocessing's spawn does)")
    assert "TimeoutError" not in done.stderr
    assert took < 30  # about 10 s on the loaded 2-core machine: two imports of torch


def _wait_for_file(path: str, timeout: float = 60.0) -> None:
    """Wait until ``path`` exists (a group's hook made it: `placed_support.Blocks`)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} was not made within {timeout} s"
        time.sleep(0.005)


def test_stop_while_a_group_is_stuck_waits_stop_timeout_once_and_names_node_and_group(
        tmp_path) -> None:
    # Issue 28, item 5's class: the grant's wait, then the group's stop, each waited a
    # whole stop_timeout for the stuck hook (8.2 s for a stop_timeout of 2).
    entered, release = str(tmp_path / "entered"), str(tmp_path / "release")
    stop_timeout = 5.0
    run = mujou.run(placed_support.make_blocking,
                    placement=mujou.Placement({"b": "s"},
                                              net_kwargs={"entered": entered, "release": release}),
                    timer="simulated", seed=7, stop_timeout=stop_timeout)
    try:
        pid = run.stats().groups["s"].pid
        _wait_for_file(entered)  # the hook is in (the run has no end)
        t0 = time.monotonic()
        run.stop()
        took = time.monotonic() - t0
        with pytest.raises(StopTimeoutError) as info:
            run.join(1)
        with pytest.raises(NodeError, match="group 's': stuck in a hook"):
            run.state_dict()  # a tree without the group's nodes would restore another net
    finally:
        open(release, "w").close()

    assert info.value.stuck == {"b": "on_update (in group 's')"}
    assert str(info.value) == (f"stop timed out after {stop_timeout} s: still running: "
                               f"'b' in on_update (in group 's')")
    # One stop_timeout, then the processes' shutdown (about a second on a loaded machine).
    print(f"stop() behind a stuck hook took {took:.2f} s (stop_timeout {stop_timeout} s)")
    assert stop_timeout <= took < 1.5 * stop_timeout
    assert _gone([pid])


def test_a_real_time_placed_run_reaching_its_duration_behind_a_stuck_hook_waits_once(
        tmp_path) -> None:
    # Issue 28, item 5's class: the hold for the end's cut, then the group's stop (and the
    # threads' exit) each waited a whole stop_timeout for the stuck hook.
    entered, release = str(tmp_path / "entered"), str(tmp_path / "release")
    stop_timeout, duration = 5.0, 0.5
    run = mujou.run(placed_support.make_blocking,
                    placement=mujou.Placement({"b": "s"},
                                              net_kwargs={"entered": entered, "release": release}),
                    timer="realtime", duration=duration, seed=7, stop_timeout=stop_timeout)
    end = time.monotonic() + duration  # at the latest: the clock started before the return
    try:
        _wait_for_file(entered)
        with pytest.raises(StopTimeoutError) as info:
            run.join(60)
        took = time.monotonic() - end
    finally:
        open(release, "w").close()

    assert info.value.stuck == {"b": "on_update (in group 's')"}
    assert str(info.value).endswith("'b' in on_update (in group 's')")
    print(f"the end behind a stuck hook took {took:.2f} s (stop_timeout {stop_timeout} s)")
    assert stop_timeout - 0.5 <= took < 1.5 * stop_timeout
    assert run.stats().nodes["sim"].updates >= 10  # the other groups ran on to the end


def test_a_hook_that_does_not_return_in_a_group_process_is_logged_on_the_hosts_stderr(
        tmp_path, capfd: pytest.CaptureFixture[str]) -> None:
    # Issue 28, item 9, in placed runs: the group's own watchdog warns, as one process's
    # does (its records reach the host's stderr through the run's Thespian logger).
    entered, release = str(tmp_path / "entered"), str(tmp_path / "release")
    warning = "node 'b' (in group 's') has been in on_update for "
    run = mujou.run(placed_support.make_blocking,
                    placement=mujou.Placement({"b": "s"},
                                              net_kwargs={"entered": entered, "release": release}),
                    timer="simulated", duration=0.1, seed=7, stop_timeout=1.0)
    err = ""
    try:
        _wait_for_file(entered)
        deadline = time.monotonic() + 30
        while err.count(warning) < 2:  # after 1 s, then after 2 s in all
            assert time.monotonic() < deadline, err
            err += capfd.readouterr().err
            time.sleep(0.01)
    finally:
        open(release, "w").close()  # the next warning would come after 4 s in all
    run.join(60)
    err += capfd.readouterr().err

    lines = [line for line in err.splitlines() if warning in line]
    assert len(lines) == 2, lines
    for line, after in zip(lines, ("2", "4"), strict=True):
        assert re.search(r"node 'b' \(in group 's'\) has been in on_update for [0-9.]+ s or "
                         r"more \(wall\), at t = 30000000 ns \(0\.03 s of the run's timer, "
                         r"delta cycle 0\), and has not returned; the run waits for it \(next "
                         rf"report after {after} s in all\)", line), line
    assert run.stats().nodes["b"].updates == 10  # it returned, and the run went on


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


def _fds_once_settled(at_most: int | None = None, bound_s: float = 10.0) -> int:
    """The host's open fds once libzmq's reaper has closed what a run closed.

    ``zmq_close`` hands a socket to the context's reaper thread, which closes its
    file descriptors a little later: the links share ``zmq.Context.instance()``,
    so a count taken the moment ``join`` returns may still hold a few. Polls
    (bounded) until the count is ``at_most`` or, without one, has not fallen for
    a quarter of a second; returns the last count.
    """
    deadline = time.monotonic() + bound_s
    low, low_since = _open_fds(), time.monotonic()
    while time.monotonic() < deadline:
        if at_most is not None and low <= at_most:
            return low
        if at_most is None and time.monotonic() - low_since > 0.25:
            return low
        time.sleep(0.01)
        n = _open_fds()
        if n < low:
            low, low_since = n, time.monotonic()
    return low


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts fds in /proc")
def test_placed_runs_leave_no_file_descriptor_behind_in_the_host() -> None:
    # Each placed run left its driver's wake pipe open: two fds a run, 1,000 in a
    # test session (then select() refused them). A leak of one fd a run leaves
    # three more than after the first run, however long the check waits.
    def one() -> None:
        run = mujou.run(placed_support.make_net, placement={"sim": "a", "ctrl": "b"},
                        timer="simulated", duration=0.1, seed=7)
        run.join(60)

    one()
    after_first = _fds_once_settled()
    for _ in range(3):
        one()

    assert _fds_once_settled(at_most=after_first) <= after_first


def test_a_group_process_computes_with_the_hosts_torch_settings() -> None:
    from mujou_actors.devices import apply_torch_settings, torch_settings
    before = torch_settings()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_float32_matmul_precision("medium")
    torch.backends.mkldnn.enabled = False
    try:
        run = mujou.run(placed_support.make_probe, placement={"probe": "a"},
                        timer="simulated", duration=0.05, seed=7)
        run.join(60)
        seen = run.state_dict()["nodes"]["probe"]["seen"]
    finally:
        apply_torch_settings(before, owner="test")
    assert run.stats().groups["a"].pid != os.getpid()
    assert seen["num_threads"] == 1
    assert seen["default_dtype"] == "float64" and seen["made"] == "torch.float64"
    assert seen["deterministic"] == [True, True]
    assert seen["float32_matmul_precision"] == "medium"
    assert seen["mkldnn_enabled"] is False
    assert torch_settings() == before
