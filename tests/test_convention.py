"""Convention membership: member actor systems, the leader's view of them, ``mujou worker``.

Several member systems on loopback ports of this one host stand in for
machines (as Thespian's own convention tests do; one on 127.0.0.2, which is
the loopback too, to show that a member binds to the address it is given). A
member or leader without an actor of the package imports no torch, so each
starts in a fraction of a second; the test that places a group actor on a
member pays three imports of the package (the leader's admin and the member's
check the actor class's capabilities, the group process runs it).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import pickle
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner
from thespian.actors import NoCompatibleSystemForActor

import mujou_actors as mujou
from mujou_actors.cli import main
from mujou_actors.distributed import actors
from mujou_actors.distributed._loopback import ANY, stat_fields
from mujou_actors.distributed.convention import (
    Leader,
    Member,
    check_listen,
    check_name,
    known_members,
    leader_admin,
    member_state,
    members,
    parse_address,
    requirement,
    wait_for_members,
)
from mujou_actors.distributed.placed import MEMBER_ANSWER_S
from mujou_actors.distributed.system import ProcessSystem, free_port
from mujou_actors.errors import GroupDied, JoinTimeoutError
from tests.procs_support import ROOT
from tests.test_system import children, listeners, listening, wait_gone

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="checks processes and sockets through /proc")


def ppid(pid: int) -> int:
    """A process's parent."""
    fields = stat_fields(pid)
    assert fields is not None, f"pid {pid} is gone"
    return int(fields[1])


def wait_until(condition: object, timeout: float, what: str) -> None:
    """Poll ``condition()`` every 20 ms until it is true; fail naming ``what`` past ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)


def read_line(stream: object, timeout: float) -> str:
    """One line of a child's pipe, waiting at most ``timeout`` for it."""
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, f"no line within {timeout} s"
    return stream.readline()  # type: ignore[attr-defined, no-any-return]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_leader_and_two_members_list_each_other_place_a_group_and_end_leaving_nothing(
        ) -> None:
    before = children()
    systems: list[Leader | Member] = []
    try:
        leader = Leader()
        systems.append(leader)
        robot = Member("robot", leader.address, listen="127.0.0.2",
                       capabilities={"arm": "ur5"})
        systems.append(robot)
        arm = Member("arm", f"{leader.address[0]}:{leader.address[1]}")
        systems.append(arm)

        known = leader.wait_for_members(["robot", "arm"], join_timeout=30)
        assert sorted(known) == ["arm", "robot"]
        assert known["robot"]["mujou.member"] == "robot"
        assert known["robot"]["arm"] == "ur5"
        assert known["robot"]["Admin Port"] == robot.port
        assert known["robot"]["mujou.pid"] == os.getpid()
        assert known["robot"]["mujou.host"] == socket.gethostname()
        assert known["arm"]["Process Startup Method"] == "spawn"
        listed = known_members(leader.address)
        assert [(m.name, m.address) for m in listed] == [
            ("arm", f"127.0.0.1:{arm.port}"), ("robot", f"127.0.0.2:{robot.port}")]
        assert members(leader.address) == known
        assert robot.joined() and arm.joined()
        # Every socket of the member is on the address it was given.
        assert {host for host, _ in listening(robot.pids())} == {"127.0.0.2"}
        assert {host for host, _ in listening(leader.pids() + arm.pids())} == {"127.0.0.1"}

        # A name that no member has: the clear error, within the join timeout.
        start = time.monotonic()
        with pytest.raises(JoinTimeoutError) as info:
            wait_for_members(leader.address, ["robot", "gpu-box"], join_timeout=0.3)
        assert time.monotonic() - start < 3
        assert info.value.missing == ("gpu-box",)
        assert sorted(info.value.known) == ["arm", "robot"]
        assert isinstance(info.value, TimeoutError)
        assert "'gpu-box'" in str(info.value) and "'arm', 'robot'" in str(info.value)

        # A group actor required on "robot" is created in a process of robot's system.
        asys = leader.actor_system
        group = asys.createActor(actors.GroupActor,
                                 targetActorRequirements=requirement("robot"))
        booting = asys.ask(group, actors.Init(1, "g", "tests.procs_support:make",
                                              pickle.dumps({"name": "g"}), (ROOT,)), 60)
        assert isinstance(booting, actors.Booting), booting
        started = asys.listen(60)
        assert isinstance(started, actors.Started), started
        answer = asys.ask(group, actors.Call(2, "g", pickle.dumps(("pid", None))), 30)
        pid = pickle.loads(answer.value)
        assert pid == booting.pid
        assert pid in robot.pids() and ppid(pid) in robot.pids()  # a child of robot's admin
        assert pid not in leader.pids() + arm.pids()
        # No member of that name: Thespian says so at once.
        with pytest.raises(NoCompatibleSystemForActor):
            asys.createActor(actors.GroupActor, targetActorRequirements=requirement("nobody"))

        # A member that ends deregisters at once; nothing of any of them is left.
        pids = leader.pids() + robot.pids() + arm.pids()
        ports = [leader.port, robot.port, arm.port]
        robot.close()
        assert sorted(leader.members()) == ["arm"]
        arm.close()
        leader.close()
        assert wait_gone(pids, 5) == []
        assert {port: listeners(port) for port in ports} == {port: {} for port in ports}
        assert robot.pids() == [] and not robot.running()
        assert children() - before == set()  # the processes that started each admin are reaped
    finally:
        for system in reversed(systems):
            system.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_either_side_may_start_first_and_a_process_system_leads() -> None:
    port = free_port()
    leader = ("127.0.0.1", port)
    robot = Member("robot", leader)  # before any leader: it keeps trying
    try:
        assert not robot.joined()
        stop = threading.Event()
        changes: list[bool] = []
        server = threading.Thread(target=robot.serve, args=(stop,),
                                  kwargs={"poll": 0.05, "on_change": changes.append})
        server.start()
        try:
            with ProcessSystem(admin=leader_admin(f"127.0.0.1:{port}")) as system:
                assert system.admin_port == port
                start = time.monotonic()
                known = wait_for_members(leader, ["robot"], join_timeout=30)
                joined_after = time.monotonic() - start
                assert known["robot"]["Admin Port"] == robot.port
                wait_until(lambda: changes == [True], 10, "serve's report of the join")
                print(f"a member started first joined {joined_after:.2f} s after the leader")
            # The leader went away (it deregistered): the member knows, and keeps trying.
            wait_until(lambda: not robot.joined(), 10, "the member's view of its lost leader")
            wait_until(lambda: changes == [True, False], 10, "serve's report of the loss")
            with Leader(f"127.0.0.1:{port}") as again:  # a new leader on the same address
                assert sorted(again.wait_for_members(["robot"], join_timeout=30)) == ["robot"]
        finally:
            stop.set()
            server.join(timeout=10)
        assert not server.is_alive()
        pids = robot.pids()
    finally:
        robot.close()
    assert wait_gone(pids, 5) == []
    assert listeners(robot.port) == {} and listeners(port) == {}


def test_listening_beyond_the_loopback_needs_allow_remote_and_addresses_are_checked() -> None:
    before = children()
    for make in (lambda: Member("robot", "127.0.0.1:1900", listen="0.0.0.0"),
                 lambda: Leader("0.0.0.0:5555"), lambda: leader_admin("0.0.0.0")):
        with pytest.raises(ValueError, match="allow_remote=True") as info:
            make()
        assert "not encrypted" in str(info.value)
    assert check_listen("0.0.0.0", True, "x") == ANY
    assert check_listen("localhost", False, "x") == "127.0.0.1"
    with pytest.raises(ValueError, match="another machine"):  # it could not reach us
        Member("robot", "192.0.2.1:1900")
    with pytest.raises(ValueError, match="set by Member"):
        Member("robot", "127.0.0.1:1900", capabilities={"mujou.member": "arm"})
    assert parse_address("robot.local:1900") == ("robot.local", 1900)
    assert parse_address("127.0.0.1", default_port=0, free=True) == ("127.0.0.1", 0)
    for text, message in (("127.0.0.1", "no port"), ("127.0.0.1:0", "out of range"),
                          ("127.0.0.1:65536", "out of range"), (":80", "no address"),
                          ("host:port", "not a number")):
        with pytest.raises(ValueError, match=message):
            parse_address(text)
    for name in ("", "a:b", "two words", 3):
        with pytest.raises(ValueError, match="a member's name"):
            check_name(name)
    with pytest.raises(ValueError, match="a member's name"):
        wait_for_members("127.0.0.1:1900", ["a:b"], join_timeout=0.1)
    assert children() == before  # nothing was started


def test_mujou_worker_without_a_usable_secret_is_refused_as_it_starts(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    monkeypatch.delenv("MUJOU_SECRET", raising=False)
    monkeypatch.delenv("MUJOU_SECRET_FILE", raising=False)
    args = ["worker", "--join", "127.0.0.1:1900", "--name", "robot"]
    open_file = tmp_path / "secret"
    open_file.write_text("a secret of twenty bytes\n")
    open_file.chmod(0o644)
    before = children()

    missing = runner.invoke(main, args)
    short = runner.invoke(main, args, env={"MUJOU_SECRET": "abc"})
    readable = runner.invoke(main, args, env={"MUJOU_SECRET_FILE": str(open_file)})

    for result in (missing, short, readable):
        assert result.exit_code == 2, result.output
        assert result.output.startswith("error: worker 'robot': ")
    assert "no secret for the data plane between machines" in missing.output
    assert "MUJOU_SECRET" in short.output and "3 bytes" in short.output
    assert "chmod 600" in readable.output
    assert children() == before  # refused before anything started


def test_a_bad_option_of_mujou_worker_or_workers_is_an_error_naming_it() -> None:
    runner = CliRunner()
    closed = free_port()  # nothing listens there
    for args, option, message in (
            (["worker", "--join", "nohost", "--name", "r"], "'--join'", "no port"),
            (["worker", "--join", "127.0.0.1:70000", "--name", "r"], "'--join'",
             "out of range"),
            (["worker", "--join", "127.0.0.1:1900", "--name", "a:b"], "'--name'",
             "a member's name"),
            (["worker", "--join", "127.0.0.1:1900", "--name", "r", "--listen", "0.0.0.0"],
             "'--listen'", "allow_remote"),
            (["worker", "--join", "127.0.0.1:1900", "--name", "r", "--listen", "h:x"],
             "'--listen'", "not a number"),
            (["workers", "--leader", "127.0.0.1"], "'--leader'", "no port")):
        result = runner.invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        assert option in result.output and message in result.output, (args, result.output)
    result = runner.invoke(main, ["workers", "--leader", f"127.0.0.1:{closed}"])
    assert result.exit_code == 1
    assert f"no Thespian admin answers at 127.0.0.1:{closed}" in result.output
    assert "leader listens only while that run goes" in result.output  # the hint
    assert f"--listen 127.0.0.1:{closed}" in " ".join(result.output.split())
    # --listen is for other machines: a --place that names none is told so, in CLI terms
    result = runner.invoke(main, ["run", "tests/placed_support.py:make_net", "--place",
                                  "sim=physics", "--listen", f"127.0.0.1:{closed}"])
    assert result.exit_code == 2, result.output
    assert "PATH=MACHINE:GROUP" in result.output and "mujou.run" not in result.output


# What pip writes as the `mujou` console script (a file run as __main__, not `-m`).
CONSOLE_SCRIPT = """import sys
import mujou_actors as mujou
from mujou_actors.cli import main
if __name__ == "__main__":
    sys.exit(main())
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_mujou_worker_says_where_it_listens_is_listed_and_ends_cleanly_on_sigterm(
        tmp_path: pathlib.Path) -> None:
    script = tmp_path / "mujou"
    script.write_text(CONSOLE_SCRIPT)
    with Leader() as leader:
        host, port = leader.address
        worker = subprocess.Popen(
            [sys.executable, str(script), "worker", "--join", f"{host}:{port}",
             "--name", "robot"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": ROOT})  # the leader's MUJOU_SECRET (conftest)
        try:
            line = read_line(worker.stdout, 60)
            found = re.fullmatch(
                rf"worker robot listening on (\S+):(\d+) \(leader {host}:{port}\)\n", line)
            assert found, line
            assert found[1] == "127.0.0.1"
            admin_port = int(found[2])
            (admin,) = listeners(admin_port)  # the member's admin listens there
            known = leader.wait_for_members(["robot"], join_timeout=30)
            assert known["robot"]["Admin Port"] == admin_port
            assert known["robot"]["mujou.pid"] == worker.pid

            listed = CliRunner().invoke(main, ["workers", "--leader", f"{host}:{port}", "--json"])
            assert listed.exit_code == 0, listed.output
            entries = json.loads(listed.output)
            assert [(e["name"], e["address"]) for e in entries] == [
                ("robot", f"127.0.0.1:{admin_port}")]
            assert entries[0]["capabilities"]["mujou.member"] == "robot"
            table = CliRunner().invoke(main, ["workers", "--leader", f"{host}:{port}"])
            assert table.exit_code == 0 and "robot" in table.output
            assert f"127.0.0.1:{admin_port}" in table.output

            group = int(stat_fields(admin)[2])  # type: ignore[index]
            pids = [int(p) for p in os.listdir("/proc") if p.isdigit()
                    and (stat_fields(int(p)) or ["", "", ""])[2] == str(group)]
            assert admin in pids
            # The admin and the logger did not import the script, nor torch with it.
            assert len(pids) == 2
            for pid in pids:
                assert "libtorch" not in pathlib.Path(f"/proc/{pid}/maps").read_text()
            # It says so when it sees itself in the convention (it checks every 0.5 s).
            assert read_line(worker.stderr, 30) == "worker robot: joined the leader at " \
                f"{host}:{port}\n"
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=30) == 0
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(timeout=10)
        assert worker.stderr.read() == "worker robot: stopped\n"  # type: ignore[union-attr]
        assert wait_gone(pids, 5) == []
        assert listeners(admin_port) == {}
        assert leader.members() == {}  # it deregistered on its way out


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_start_on_a_machine_that_stops_answering_fails_then_and_may_be_tried_again() -> None:
    """The coordinator hands the creation to the member the start names; if that machine
    stops answering (`ProcessSystem.member_check`; here its processes are frozen with
    SIGSTOP after it joined), the start fails within a check period and its ask, naming
    the machine, not at its timeout; the group is forgotten, so that a start of it on
    another machine goes on."""
    port = free_port()
    leader = ("127.0.0.1", port)
    with ProcessSystem(admin=leader_admin(f"127.0.0.1:{port}")) as system, \
            Member("frozen", leader) as frozen, Member("spare", leader):
        wait_for_members(leader, ["frozen", "spare"], join_timeout=30)
        asked: list[tuple[str, bool]] = []

        def answers(member: str) -> bool:
            up = member in members(leader, timeout=MEMBER_ANSWER_S)
            asked.append((member, up))
            return up

        system.member_check = answers
        pids = frozen.pids()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            assert member_state(leader, "frozen", 1.0) is None  # silent, not gone
            assert member_state(leader, "spare", 5.0) is True
            assert member_state(leader, "nobody", 5.0) is False  # no member of that name
            started = time.monotonic()
            with pytest.raises(GroupDied, match="machine 'frozen' stopped answering") as info:
                system.start_group("g", "tests.procs_support:make", {"name": "g"}, 60.0,
                                   member="frozen")
            took = time.monotonic() - started
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        assert info.value.group == "g"
        assert asked == [("frozen", False)] * 2  # two misses in a row
        assert took < 30  # two check periods (1 s) and asks (<= 5 s), not the 60 s timeout
        # Tried again elsewhere (the coordinator forgot it); no check, so that a loaded
        # machine's slow answer cannot fail this start.
        system.member_check = None
        pid = system.start_group("g", "tests.procs_support:make", {"name": "g"}, 60.0,
                                 member="spare")
        assert system.ask("g", ("pid", None), 30.0) == pid


def test_a_place_with_an_empty_path_or_group_is_a_usage_error_naming_it() -> None:
    runner = CliRunner()

    results = {item: runner.invoke(main, ["run", "tests/placed_support.py:make_net", "--place",
                                          item, "--listen", "127.0.0.1:1900"])
               for item in ("arm=", "=control", "arm")}

    assert all(r.exit_code == 2 for r in results.values()), results
    assert "--place 'arm=': GROUP is empty" in results["arm="].output
    assert "--place '=control': PATH is empty" in results["=control"].output
    assert "expected PATH=GROUP" in results["arm"].output


def test_fallback_machines_without_a_restarting_supervisor_are_warned_about(
        caplog: pytest.LogCaptureFixture) -> None:
    from mujou_actors.distributed.placed import _warn_unused_fallbacks

    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        _warn_unused_fallbacks({"control": ("robot", "spare")}, None)
        _warn_unused_fallbacks({"control": ("robot", "spare")}, mujou.Supervisor())
        _warn_unused_fallbacks({"control": ("robot", "spare")}, mujou.Supervisor("one_for_all"))
        _warn_unused_fallbacks({"control": ("robot",)}, None)  # no fallback named

    assert [r.getMessage()[:88] for r in caplog.records] == [
        "placement names 'spare' as fallback machine(s) of group 'control', but the run's "
        "supervi"] * 2
    assert "--restart one_for_all" in caplog.records[0].getMessage()


def test_mujou_run_restart_gives_the_run_a_restarting_supervisor(tmp_path: pathlib.Path) -> None:
    stats = tmp_path / "stats.json"

    result = CliRunner().invoke(main, [
        "run", "tests/nets/capsule_nets.py:make_net", "--timer", "simulated", "--duration",
        "4", "--restart", "one_for_one", "--max-restarts", "100", "--quiet",
        "--stats-json", str(stats)])

    assert result.exit_code == 0, result.output
    # From the first snapshot (the start, zero) it does not wind up again within 4 s.
    assert json.loads(stats.read_text())["nodes"]["integ"]["restarts"] == 1
