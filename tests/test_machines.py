"""Placed runs across machines: convention members on loopback ports of this host.

Each member is a Thespian actor system of its own (`convention.Member`, as
`mujou worker` starts one) that joins the run's leader; the placement puts
groups on members by name. The data plane to them runs over TCP with the
run's secret (CURVE). Each test starts member systems and group processes
(spawn; each imports torch), so they are few and each checks much.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import mujou_actors as mujou
from mujou_actors.distributed.convention import Member
from mujou_actors.errors import HandshakeError
from tests import placed_support
from tests.test_placed import assert_same_tree, single

pytestmark = pytest.mark.timeout(240)

SECRET = "a test secret of the run, long enough"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def _pids_seen(*members: Member) -> Iterator[list[set[int]]]:
    """Every pid of each member's processes seen while inside (polled every 10 ms).

    A group's process ends with the run, which may be before the test looks:
    so its member's processes are watched all along.
    """
    seen: list[set[int]] = [set() for _ in members]
    stop = threading.Event()

    def watch() -> None:
        while True:
            for pids, member in zip(seen, members, strict=True):
                pids.update(member.pids())
            if stop.wait(0.01):
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        stop.set()
        watcher.join(10)


def test_groups_on_two_members_match_one_process_and_leave_nothing_behind(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    expected = single(0.2)
    port = _free_port()
    leader = f"127.0.0.1:{port}"
    with (Member("robot", leader) as robot, Member("gpu-box", leader) as gpu,
          _pids_seen(robot, gpu) as (on_robot, on_gpu)):
        run = mujou.run(placed_support.make_net,
                        placement={"sim": "robot:physics", "ctrl": "gpu-box:control"},
                        timer="simulated", duration=0.2, seed=7, workers=2, listen=leader,
                        join_timeout=30)
        stats = run.stats()
        run.join(60)
        assert_same_tree(run.state_dict(), expected)
        # Each group ran in a process of its member's (a child of its admin's).
        assert stats.groups["physics"].pid in on_robot
        assert stats.groups["control"].pid in on_gpu
    deadline = time.monotonic() + 10
    while _listening(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _listening(port)


def test_a_member_nobody_started_is_named_before_any_node_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    leader = f"127.0.0.1:{_free_port()}"
    with Member("robot", leader):
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="gpu-box") as info:
            mujou.run(placed_support.make_net,
                      placement={"sim": "robot:physics", "ctrl": "gpu-box:control"},
                      timer="simulated", duration=0.2, listen=leader, join_timeout=3)
        assert "robot" in str(info.value)  # the members known
        assert time.monotonic() - t0 < 30


def _worker(name: str, leader: str, secret: str, **env_vars: str) -> subprocess.Popen:
    """``mujou worker`` in a session of its own, with ``env_vars`` in its environment.

    Every process it starts inherits ``MUJOU_TEST_MACHINE`` (a name of its own
    for this worker): so `_machine` finds them all, the admin included, which
    leaves the worker's session (Thespian's daemonizing ``setsid``).
    """
    marker = f"{name}-{uuid.uuid4().hex}"
    env = {**os.environ, "MUJOU_SECRET": secret, "MUJOU_TEST_MACHINE": marker, **env_vars}
    cmd = [sys.executable, "-m", "mujou_actors", "worker", "--join", leader, "--name", name]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    proc.marker = marker  # type: ignore[attr-defined]
    line = proc.stdout.readline() if proc.stdout is not None else ""
    assert "listening on" in line, (line, proc.stderr.read() if proc.stderr else "")
    return proc


def _machine(proc: subprocess.Popen) -> set[int]:
    """Every live process the worker started, itself included (by their environment)."""
    entry = f"MUJOU_TEST_MACHINE={proc.marker}".encode()  # type: ignore[attr-defined]
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if entry in f.read().split(b"\0"):
                        found.add(int(name))
            except OSError:
                continue
    return found


def _stop_worker(proc: subprocess.Popen) -> None:
    """End a worker as Ctrl-C does (SIGTERM: it removes its folder); killed past 20 s."""
    proc.terminate()
    try:
        assert proc.wait(20) == 0
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        raise


def _signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _kill_tree(proc: subprocess.Popen) -> None:
    """The worker's machine vanishes: every process it started is stopped (SIGSTOP, until
    no new one is found, so that none can act on another's end), then SIGKILLed."""
    stopped: set[int] = set()
    while fresh := _machine(proc) - stopped:
        _signal_all(fresh, signal.SIGSTOP)
        stopped |= fresh
    _signal_all(stopped, signal.SIGKILL)
    proc.wait(10)
    deadline = time.monotonic() + 10
    while _machine(proc) and time.monotonic() < deadline:
        time.sleep(0.02)  # (the others are reaped by their parents)
    assert not _machine(proc)


def test_a_machine_with_another_secret_is_refused_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    leader = f"127.0.0.1:{_free_port()}"
    robot = _worker("robot", leader, "another secret, long enough too")
    try:
        t0 = time.monotonic()
        with pytest.raises(HandshakeError, match="secrets differ") as info:
            mujou.run(placed_support.make_net, placement={"sim": "robot:physics"},
                      timer="simulated", duration=0.2, seed=7, listen=leader,
                      start_timeout=60)
        took = time.monotonic() - t0
        assert "group 'physics' on machine 'robot'" in str(info.value)
        assert "MUJOU_SECRET" in str(info.value)
        print(f"another secret refused {took:.2f} s after mujou.run was called")
    finally:
        _stop_worker(robot)


def test_a_machine_that_builds_another_net_is_refused_naming_the_differences(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    leader = f"127.0.0.1:{_free_port()}"
    robot = _worker("robot", leader, SECRET, MUJOU_TEST_EXTRA_NODE="1")
    try:
        with pytest.raises(mujou.NetError, match=r"group 'physics' built another net than "
                                                 r"the host.*'extra'"):
            mujou.run(placed_support.make_net_by_machine, placement={"sim": "robot:physics"},
                      timer="simulated", duration=0.2, seed=7, listen=leader)
    finally:
        _stop_worker(robot)

@pytest.mark.parametrize("how", ["vanished", "worker killed"])
def test_a_lost_machine_restarts_its_group_on_the_fallback_and_ends_as_one_process(
        monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """The group's machine goes mid-run: at once, every process of it ("vanished": no
    ChildActorExited can come, only the heartbeat finds it), or its ``mujou worker`` is
    killed ("worker killed": its admin and group end by their watchdogs, the admin may
    tell of the group's end first and even take the restart's creation before it goes).
    Either way the group restarts on the fallback member from the latest snapshot, and
    the run ends as one process does."""
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    sup = lambda: mujou.Supervisor("one_for_all", snapshot_every=1.0)  # noqa: E731
    expected = single(20.0)  # a restart in simulated time ends as a run without one
    leader = f"127.0.0.1:{_free_port()}"
    robot = _worker("robot", leader, SECRET)
    try:
        with Member("spare", leader):
            run = mujou.run(placed_support.make_net,
                            placement={"sim": "robot,spare:physics"}, timer="simulated",
                            duration=20.0, seed=7, supervisor=sup(), listen=leader,
                            heartbeat_timeout=1.0)
            try:
                assert run.stats().groups["physics"].machine == "robot"
                run.wait_for("ctrl.cmd", timeout=60)  # it runs: its machine goes now
                t0 = time.monotonic()
                if how == "vanished":
                    _kill_tree(robot)
                else:
                    robot.kill()
                run.join(120)
                took = time.monotonic() - t0
                stats = run.stats()
                assert_same_tree(run.state_dict(), expected)
                assert stats.groups["physics"].machine == "spare"
                assert stats.nodes["sim"].restarts >= 1
                assert took < 60
            finally:
                run.stop()
        deadline = time.monotonic() + 15
        while _machine(robot) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _machine(robot)  # nothing of the machine is left
    finally:
        _kill_tree(robot)


def test_a_lost_machine_that_comes_back_gets_its_group_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No fallback: the restart waits (up to ``join_timeout``) for the group's machine,
    which comes back as a new ``mujou worker`` of the same name; the run ends as one
    process does."""
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    sup = lambda: mujou.Supervisor("one_for_all", snapshot_every=1.0)  # noqa: E731
    expected = single(20.0)
    leader = f"127.0.0.1:{_free_port()}"
    robot = _worker("robot", leader, SECRET)
    back = None
    try:
        run = mujou.run(placed_support.make_net, placement={"sim": "robot:physics"},
                        timer="simulated", duration=20.0, seed=7, supervisor=sup(),
                        listen=leader, heartbeat_timeout=1.0, join_timeout=60)
        try:
            first = run.stats().groups["physics"].pid
            run.wait_for("ctrl.cmd", timeout=60)
            _kill_tree(robot)
            back = _worker("robot", leader, SECRET)  # the machine is back
            run.join(120)
            stats = run.stats()
            assert_same_tree(run.state_dict(), expected)
            assert stats.groups["physics"].machine == "robot"  # the old one is gone
            assert stats.groups["physics"].pid != first
            assert stats.nodes["sim"].restarts >= 1
        finally:
            run.stop()
    finally:
        _kill_tree(robot)
        if back is not None:
            _stop_worker(back)
