"""Placed runs: the driver's protocol, state across groups, the host API, bad input.

Most tests run the groups' servers in this process (`InProcessSystem`: the
data plane still crosses ZeroMQ sockets), so the protocol is checked fast;
tests/test_processes.py runs real group processes.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
import torch

import mujou_actors as mujou
from mujou_actors._runtime.build import Seams
from mujou_actors.distributed import placed
from mujou_actors.distributed.placement import load_factory
from mujou_actors.errors import NetError, NodeError, RemoteError
from mujou_actors.run import _check_arguments
from tests import placed_support
from tests.placed_support import InProcessSystem, make_net

pytestmark = pytest.mark.timeout(60)


def _args(duration: float | None, state: dict | None = None, workers: int = 1,
          seed: int = 7, stop_timeout: float = 10.0) -> object:
    return _check_arguments(Seams(), workers=workers, timer="simulated", duration=duration,
                            seed=seed, state=state, supervisor=None, trace=None,
                            cuda_sync="block", stats=True, stop_timeout=stop_timeout,
                            start_timeout=60.0)


def placed_run(placement: dict, duration: float | None, *, factory=make_net,
               net_kwargs: dict | None = None, state: dict | None = None,
               workers: int = 1, inputs: dict | None = None) -> placed.PlacedRun:
    """A placed run whose groups are served in this process."""
    return placed.start(factory, placement=mujou.Placement(placement, net_kwargs=net_kwargs),
                        args=_args(duration, state, workers), inputs=inputs, state=state,
                        make_system=InProcessSystem)


def single(duration: float, *, state: dict | None = None, workers: int = 1,
           factory=make_net, **kwargs) -> dict:
    net = factory(**kwargs)
    with mujou.run(net, timer="simulated", duration=duration, seed=7, workers=workers,
                   state=state) as run:
        run.join()
    return run.state_dict()


def assert_same_tree(got: dict, expected: dict) -> None:
    """Two state trees equal in every section, tensors bit for bit, in the same order."""
    assert list(got) == list(expected)
    assert got["time_ns"] == expected["time_ns"]
    assert list(got["nodes"]) == list(expected["nodes"])
    assert got["seeds"] == expected["seeds"]
    assert got["schedule"] == expected["schedule"]
    for path, state in expected["nodes"].items():
        _assert_equal(got["nodes"][path], state, path)
    for section in ("inputs", "pending"):
        assert list(got[section]) == list(expected[section]), section
        for path, messages in expected[section].items():
            _assert_equal(got[section][path], messages, f"{section}[{path}]")


def _assert_equal(a: object, b: object, where: str) -> None:
    if isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(b, dict):
        assert isinstance(a, dict) and list(a) == list(b), where
        for k in b:
            _assert_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(b, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for x, y in zip(a, b, strict=True):
            _assert_equal(x, y, where)
    else:
        assert a == b, where


@pytest.mark.parametrize("placement", [
    {"sim": "physics"},
    {"sim": "a", "ctrl": "b"},
    {"sim": "a", "ctrl": "b", "log": "c"},
    {"ctrl": "b"},
    {"sim": "a", "ctrl": "a", "log": "a"},
], ids=["sim", "sim|ctrl|host", "three", "ctrl", "all-in-one-group"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_placed_run_matches_the_single_process_run_bit_for_bit(placement: dict,
                                                                 workers: int) -> None:
    expected = single(0.1)
    run = placed_run(placement, 0.1, workers=workers)
    run.join(30)
    got = run.state_dict()
    assert_same_tree(got, expected)
    assert got["nodes"]["ctrl"] == {"n": 10}
    assert len(got["nodes"]["log"]["seen"]) == 20


def test_a_tree_from_one_process_restores_into_a_placed_run_and_the_reverse() -> None:
    full = single(0.2)
    half = single(0.1)
    run = placed_run({"sim": "a", "log": "c"}, 0.1, state=half)
    run.join(30)
    assert_same_tree(run.state_dict(), full)
    run = placed_run({"ctrl": "b"}, 0.1)
    run.join(30)
    placed_half = run.state_dict()
    assert_same_tree(placed_half, half)
    assert_same_tree(single(0.1, state=placed_half), full)
    # and from one placement into another
    run = placed_run({"sim": "x", "ctrl": "y", "log": "z"}, 0.1, state=placed_half)
    run.join(30)
    assert_same_tree(run.state_dict(), full)


def test_a_cut_while_running_is_one_consistent_tree_that_goes_on_as_the_run_does() -> None:
    run = placed_run({"sim": "a", "ctrl": "b"}, None)
    try:
        run.wait_for("ctrl.cmd", lambda c: True, timeout=20)
        tree = run.state_dict(timeout=20)
    finally:
        run.stop()
    run.join()
    t = tree["time_ns"]
    assert t > 0 and t % 10_000_000 == 0  # at an instant's boundary: a tick of sim
    n = t // 10_000_000
    assert tree["nodes"]["ctrl"] == {"n": n}
    assert len(tree["nodes"]["log"]["seen"]) == 2 * n  # every message of the instant is in
    # The tree goes on exactly as a single run from the start does.
    end = (t + 50_000_000) / 1e9
    assert_same_tree(single(0.05, state=tree), single(end))


def test_the_host_api_reaches_every_group() -> None:
    run = placed_run({"sim": "a", "ctrl": "b"}, None)
    seen: list[torch.Tensor] = []
    timed: list[tuple[int, Any]] = []
    try:
        sub = run.subscribe("ctrl.cmd", seen.append)
        run.subscribe("sim.out", lambda t, m: timed.append((t, m)), with_time=True)
        first = run.wait_for("sim.out", timeout=20)
        assert isinstance(first, torch.Tensor) and first.shape == (3,)
        assert isinstance(run.read("sim.out"), torch.Tensor)
        run.write("log.cmd", torch.full((3,), 7.0))  # to the host's group
        run.write("ctrl.obs", torch.zeros(3))  # to a remote one: ctrl counts it
        run.wait_for("ctrl.cmd", timeout=20)
        stats = run.stats()
    finally:
        run.stop()
    run.join()
    assert set(stats.groups) == {"a", "b", "host"}
    assert stats.groups["a"].nodes == ("sim",) and stats.groups["host"].nodes == ("log",)
    assert stats.groups["a"].messages_out == stats.nodes["sim"].updates or \
        stats.groups["a"].messages_out >= 1
    assert list(stats.nodes) == ["sim", "ctrl", "log"]
    assert sub.delivered >= 1 and len(seen) == sub.delivered
    # with_time: each of sim's messages at its send's time, a tick of its 10 ms period
    times = [t for t, _ in timed]
    assert times and times == sorted(set(times)) and all(t % 10_000_000 == 0 for t in times)
    assert all(isinstance(m, torch.Tensor) for _, m in timed)
    # ctrl's every command crosses to log (host); the host's copies for subscribe() do not count
    # (one update sends a command per observation drained: the host's write adds one)
    assert stats.nodes["ctrl"].updates <= stats.groups["b"].messages_out \
        <= stats.nodes["ctrl"].updates + 1
    tree = run.state_dict()
    assert ["cmd", [7.0, 7.0, 7.0]] in tree["nodes"]["log"]["seen"]
    # ctrl saw (or has pending) every observation and the host's write: one more than sim ticks
    pending = len(tree["pending"].get("ctrl.obs", []))
    ticks = tree["schedule"]["sim"]["last_update_ns"] // 10**7
    assert tree["nodes"]["ctrl"]["n"] + pending == ticks + 1


class Boom(mujou.Node):
    """Raises at its third update."""

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == 3:
            raise RuntimeError("boom at three")


def make_boom() -> dict[str, mujou.Node]:
    return {"boom": Boom(), **make_net()}


def test_a_hooks_exception_in_a_group_reaches_join_with_the_remote_traceback() -> None:
    run = placed_run({"boom": "b"}, 1.0, factory=make_boom)
    with pytest.raises(NodeError) as info:
        run.join(30)
    err = info.value
    assert err.path == "boom" and err.hook == "on_update"
    assert "boom at three" in str(err) and "'b'" in str(err)
    assert isinstance(err.__cause__, placed.RemoteTraceback)
    assert "raise RuntimeError(\"boom at three\")" in err.__cause__.traceback
    assert not run.running


def _assert_from_group(err: BaseException, hook: str) -> None:
    """``err`` is the host's NodeError for snk's ``hook`` (a `placed_support.Refuses`) in 'g'."""
    assert type(err) is NodeError
    assert (err.path, err.hook) == ("snk", hook)
    assert str(err) == f"node 'snk' raised in {hook}: ValueError: {hook} refused (in group 'g')"
    assert isinstance(err.__cause__, placed.RemoteTraceback)
    assert err.__cause__.type_name == "ValueError"
    assert 'raise ValueError(f"{hook} refused")' in err.__cause__.traceback


@pytest.mark.parametrize("hook", ["on_start", "load_state_dict"])
def test_a_start_hooks_failure_in_a_group_is_a_node_error_naming_node_hook_and_group(
        hook: str) -> None:
    tree = single(0.05, factory=placed_support.make_refusing)

    with pytest.raises(NodeError) as info:
        placed_run({"snk": "g"}, 0.1, factory=placed_support.make_refusing,
                   net_kwargs={"refuse": hook}, state=tree)

    _assert_from_group(info.value, hook)


def test_a_start_that_times_out_in_a_group_is_a_start_timeout_error_as_in_one_process(
) -> None:
    """A group whose on_start outlasts start_timeout: the host raises StartTimeoutError
    naming the node and its hook, as one process does (it was a RemoteError)."""
    placed_support.STALL.clear()
    args = _check_arguments(Seams(), workers=1, timer="simulated", duration=0.1, seed=7,
                            state=None, supervisor=None, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=2.0, start_timeout=1.0)
    try:
        with pytest.raises(mujou.StartTimeoutError) as info:
            placed.start(placed_support.make_stalling, placement=mujou.Placement({"slow": "g"}),
                         args=args, inputs=None, state=None, make_system=InProcessSystem)
    finally:
        placed_support.STALL.set()
    err = info.value
    assert err.stuck == {"slow": "on_start"} and 0.5 < err.timeout <= 1.0  # what was left
    assert "'slow' in on_start" in str(err)
    assert isinstance(err.__cause__, RemoteError) and err.__cause__.group == "g"


def test_a_state_dict_failure_in_a_group_is_a_node_error_and_the_run_goes_on() -> None:
    run = placed_run({"snk": "g"}, None, factory=placed_support.make_refusing,
                     net_kwargs={"refuse": "state_dict"})

    with pytest.raises(NodeError) as cut:
        run.state_dict(30)
    running = run.running
    run.stop()
    with pytest.raises(NodeError) as end:  # the final state is taken as the group stops
        run.join(30)

    _assert_from_group(cut.value, "state_dict")
    assert running
    _assert_from_group(end.value, "state_dict")


def make_sized(n: int = 3, period: float = 0.01) -> dict[str, mujou.Node]:
    net = make_net(period)
    for i in range(n - 3):
        net[f"extra{i}"] = placed_support.Sim(period)
    return net


def test_net_kwargs_reach_every_process() -> None:
    run = placed_run({"sim": "a", "extra0": "b"}, 0.05, factory=make_sized,
                     net_kwargs={"n": 5, "period": 0.005})
    run.join(30)
    tree = run.state_dict()
    assert set(tree["nodes"]) == {"sim", "ctrl", "log", "extra0", "extra1"}
    assert tree["nodes"]["ctrl"] == {"n": 10}


@pytest.mark.parametrize("placement, error, match", [
    ({"nope": "a"}, ValueError, r"'nope', which is no node of the net \(nodes: 'sim', 'ctrl'"),
    ({"sim": 3}, TypeError, r"groups\['sim'\] must be a group name \(a str\), got int 3"),
    ({"sim": ""}, ValueError, "non-empty"),
    ({"sim": "box:physics"}, ValueError, "group 'physics' on machine 'box'"),
    ({"sim": "host"}, ValueError, "every node in the host's group"),
    ([("sim", "a")], TypeError, "groups must be a mapping"),
    ({1: "a"}, TypeError, "must be a node path"),
])
def test_a_bad_placement_is_refused_before_anything_starts(placement: object, error: type,
                                                           match: str) -> None:
    with pytest.raises(error, match=match):
        placed_run(placement, 0.1)  # type: ignore[arg-type]


@pytest.mark.parametrize("placement, machines", [
    ({"sim": "robot:physics"}, {"physics": ("robot",)}),
    ({"sim": "robot,spare:physics", "log": "physics"}, {"physics": ("robot", "spare")}),
    ({"sim": "robot:a", "ctrl": "gpu-box:b", "log": "c"}, {"a": ("robot",), "b": ("gpu-box",)}),
    ({"sim": "robot:a", "log": "robot:a"}, {"a": ("robot",)}),
])
def test_a_placement_names_the_machines_of_groups(placement: dict, machines: dict) -> None:
    from mujou_actors.distributed.placement import check_placement
    from mujou_actors.net import collect_ports, walk
    found = walk(make_net())
    for path, node in found:
        node._mujou_path = path
    plan = check_placement(mujou.Placement(placement, listen="127.0.0.1:7000"), found,
                           collect_ports(found))
    assert plan.machines == machines
    assert set(plan.groups) == {g.rpartition(":")[2] for g in placement.values()}


@pytest.mark.parametrize("placement, match", [
    ({"sim": ":physics"}, "a machine name must be a non-empty str"),
    ({"sim": "robot:"}, "a group name must be a non-empty str"),
    ({"sim": "robot,,spare:a"}, "a machine name must be a non-empty str"),
    ({"sim": "robot, spare:a"}, "without spaces around it"),
    ({"sim": "robot,robot:a"}, "a machine is named twice"),
    ({"sim": "robot:a", "log": "spare:a"}, "group 'a' is placed on 'robot' elsewhere"),
    ({"sim": "robot:host"}, r"the host's group \('host'\) runs in the host's process"),
])
def test_a_bad_machine_in_a_placement_is_refused_before_any_net(placement: dict,
                                                                  match: str) -> None:
    with pytest.raises(ValueError, match=rf"Placement: groups\[.*{match}"):
        mujou.Placement(placement, listen="127.0.0.1:7000")


def test_a_net_object_or_a_local_function_with_placement_is_refused() -> None:
    with pytest.raises(TypeError, match="pass the function that builds the net"):
        mujou.run(make_net(), placement={"sim": "a"}, timer="simulated")

    def local() -> dict:
        return make_net()

    with pytest.raises(TypeError, match="not a module-level function"):
        mujou.run(local, placement={"sim": "a"}, timer="simulated")
    with pytest.raises(TypeError, match="not a module-level function"):
        mujou.run(lambda: make_net(), placement={"sim": "a"}, timer="simulated")
    with pytest.raises(ValueError, match="cannot import 'no_such_module_x'"):
        mujou.run("no_such_module_x:make", placement={"sim": "a"}, timer="simulated")
    with pytest.raises(TypeError, match="net_kwargs must be plain data"):
        mujou.run(make_net, placement=mujou.Placement({"sim": "a"},
                                                      net_kwargs={"period": object()}),
                  timer="simulated")


_calls = {"n": 0}


def make_unstable() -> dict[str, mujou.Node]:
    """Builds a different net on its second call: as a factory reading process state would."""
    _calls["n"] += 1
    net = make_net()
    if _calls["n"] > 1:
        net["surprise"] = placed_support.Sim()
    return net


def test_a_group_that_builds_another_net_is_refused_naming_the_difference() -> None:
    _calls["n"] = 0
    with pytest.raises(NetError, match=r"group 'a' built another net.*'surprise' is extra"):
        placed_run({"sim": "a"}, 0.1, factory=make_unstable)


def _supervised(strategy: str, placement: dict | None, **sup: object) -> tuple[dict, object]:
    placed_support.Flaky.failures = 0
    supervisor = mujou.Supervisor(strategy, snapshot_every=0.03, **sup)  # type: ignore[arg-type]
    if placement is None:
        with mujou.run(placed_support.make_flaky(), timer="simulated", duration=0.1, seed=7,
                       supervisor=supervisor) as run:
            run.join()
        return run.state_dict(), run.stats()
    args = _check_arguments(Seams(), workers=1, timer="simulated", duration=0.1, seed=7,
                            state=None, supervisor=supervisor, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=10.0, start_timeout=60.0)
    prun = placed.start(placed_support.make_flaky, placement=mujou.Placement(placement),
                        args=args, inputs=None, state=None, make_system=InProcessSystem)
    prun.join(30)
    return prun.state_dict(), prun.stats()


@pytest.mark.parametrize("strategy, total, restarted", [
    ("one_for_all", 55, {"sim", "ctrl", "log", "flaky", "count"}),  # rewound to t=0.03
    ("one_for_one", 40, {"flaky"}),  # tick 5 is lost, flaky goes on from its t=0.03 state
])
@pytest.mark.parametrize("placement", [{"flaky": "a"}, {"flaky": "a", "count": "b", "sim": "b"}],
                         ids=["flaky-alone", "flaky|count+sim"])
def test_a_supervised_placed_run_restarts_as_one_process_does(
        strategy: str, total: int, restarted: set, placement: dict) -> None:
    expected, expected_stats = _supervised(strategy, None)
    got, stats = _supervised(strategy, placement)
    assert_same_tree(got, expected)
    assert got["nodes"]["count"]["total"] == total
    assert {p for p, n in stats.nodes.items() if n.restarts == 1} == restarted  # type: ignore[attr-defined]
    assert stats.snapshots.count == expected_stats.snapshots.count == 4  # type: ignore[attr-defined]


def test_the_restart_intensity_escalates_across_groups() -> None:
    placed_support.Flaky.failures = 0
    supervisor = mujou.Supervisor("one_for_all", snapshot_every=0.03, max_restarts=0)
    args = _check_arguments(Seams(), workers=1, timer="simulated", duration=0.1, seed=7,
                            state=None, supervisor=supervisor, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=10.0, start_timeout=60.0)
    run = placed.start(placed_support.make_flaky, placement=mujou.Placement({"flaky": "a"}),
                       args=args, inputs=None, state=None, make_system=InProcessSystem)
    with pytest.raises(NodeError, match=r"flaky at tick 5.*the supervisor gave up") as info:
        run.join(30)
    assert info.value.path == "flaky"
    assert isinstance(info.value.__cause__, placed.RemoteTraceback)


def _realtime_run(placement: dict, duration: float | None) -> placed.PlacedRun:
    args = _check_arguments(Seams(), workers=1, timer="realtime", duration=duration, seed=7,
                            state=None, supervisor=None, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=10.0, start_timeout=60.0)
    return placed.start(make_net, placement=mujou.Placement(placement), args=args, inputs=None,
                        state=None, make_system=InProcessSystem)


def _every_message_once(tree: dict) -> None:
    """sim's every tick reached ctrl and log once (seen or pending); ctrl's every command too."""
    ticks = tree["schedule"]["sim"]["last_update_ns"] and len(
        [1 for kind, _ in tree["nodes"]["log"]["seen"] if kind == "obs"]) + len(
        tree["pending"].get("log.obs", []))
    n = tree["nodes"]["ctrl"]["n"]
    assert n + len(tree["pending"].get("ctrl.obs", [])) == ticks
    cmds = len([1 for kind, _ in tree["nodes"]["log"]["seen"] if kind == "cmd"])
    assert cmds + len(tree["pending"].get("log.cmd", [])) == n


@pytest.mark.parametrize("placement", [{"sim": "a", "ctrl": "b"}, {"ctrl": "b", "log": "c"}])
def test_a_real_time_placed_run_relays_every_message_once_and_cuts_consistently(
        placement: dict) -> None:
    run = _realtime_run(placement, 0.3)
    got: list[torch.Tensor] = []
    run.subscribe("ctrl.cmd", got.append)
    run.wait_for("ctrl.cmd", timeout=20)
    tree = run.state_dict(timeout=10)
    _every_message_once(tree)
    assert 0 < tree["time_ns"] < 10**9
    stats = run.stats()
    run.join(20)
    assert 0.3 <= run.time < 10  # the end is on the host's clock (a loaded machine is slow)
    final = run.state_dict()
    _every_message_once(final)
    assert final["nodes"]["ctrl"]["n"] >= 5  # about 30 ticks of 10 ms, fewer when loaded
    assert stats.nodes["ctrl"].updates >= 1 and stats.nodes["sim"].lateness_p99 >= 0
    # every later command once, to the host too (the first may come before subscribe)
    n = final["nodes"]["ctrl"]["n"]
    assert n - 1 <= len(got) <= n
    # log's last command: seen, or still pending when the end cut came before log's hook
    # (a loaded machine): _every_message_once counts both
    cmds = [v for kind, v in final["nodes"]["log"]["seen"] if kind == "cmd"] + [
        m.tolist() for m in final["pending"].get("log.cmd", [])]
    assert got[-1].tolist() == cmds[-1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("placement", [{"sim": "a"}, {"ctrl": "b"}])
def test_a_real_time_write_is_delivered_at_once_on_the_host_or_in_a_group(
        placement: dict) -> None:
    """In real time a host write is delivered as in one process: to the host's own group
    (it used to fail waiting for a grant's reply no real-time group owes) or to another."""
    run = _realtime_run(placement, None)
    try:
        run.wait_for("ctrl.cmd", timeout=20)
        before = run.state_dict(timeout=10)["nodes"]["ctrl"]["n"]
        for _ in range(3):
            run.write("ctrl.obs", torch.zeros(3))
        deadline = time.monotonic() + 10
        while run.state_dict(timeout=10)["nodes"]["ctrl"]["n"] < before + 3 and (
                time.monotonic() < deadline):
            time.sleep(0.01)  # (its ticks come on too: at least the three writes)
        assert run.state_dict(timeout=10)["nodes"]["ctrl"]["n"] >= before + 3
    finally:
        run.stop()
    run.join(20)
    assert run.failure is None


def test_stop_with_a_hook_stuck_in_the_hosts_group_is_bounded_and_names_it() -> None:
    args = _check_arguments(Seams(), workers=1, timer="simulated", duration=None, seed=7,
                            state=None, supervisor=None, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=0.5, start_timeout=60.0)
    run = placed.start(placed_support.make_stuck, placement=mujou.Placement({"sim": "a"}),
                       args=args, inputs=None, state=None, make_system=InProcessSystem)
    stuck = next(a for a in run._driver.kernel.actors if a.path == "stuck")
    deadline = time.monotonic() + 20
    while not (stuck.busy and stuck.updates >= 2) and time.monotonic() < deadline:
        time.sleep(0.01)  # wall time until the hook is entered: the run has no end
    assert stuck.busy
    t0 = time.monotonic()
    run.stop()
    assert time.monotonic() - t0 < 10
    with pytest.raises(mujou.StopTimeoutError) as info:
        run.join(1)
    assert "stuck" in info.value.stuck


def test_a_hook_that_does_not_return_is_logged_by_its_group_naming_it(
        caplog: pytest.LogCaptureFixture) -> None:
    # Issue 28, item 9, in placed runs: each group's kernel has the watchdog of one
    # process (group.Watcher), a group process's and the host's own group's alike.
    caplog.set_level("WARNING", logger="mujou_actors")
    gates = placed_support.GATES
    gates.update(ga=threading.Event(), gh=threading.Event())
    args = _check_arguments(Seams(), workers=1, timer="simulated", duration=0.1, seed=7,
                            state=None, supervisor=None, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=0.5, start_timeout=60.0)
    run = placed.start(placed_support.make_gated, placement=mujou.Placement({"ga": "a"}),
                       args=args, inputs=None, state=None, make_system=InProcessSystem)
    warned = {"ga": "node 'ga' (in group 'a') has been in on_update for ",
              "gh": "node 'gh' (in group 'host') has been in on_update for "}

    def count(path: str) -> int:
        return sum(warned[path] in r.getMessage() for r in list(caplog.records))

    try:
        # One of them blocks the run (simulated time); once let go, the other does.
        deadline = time.monotonic() + 30
        while not all(gate.is_set() for gate in gates.values()):
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            for path, gate in gates.items():
                if count(path) == 2:  # after 0.5 s, then after 1 s in all
                    gate.set()  # before the next warning, after 2 s in all
            time.sleep(0.005)
    finally:
        for gate in gates.values():
            gate.set()
    run.join(30)

    assert count("ga") == count("gh") == 2
    text = next(r.getMessage() for r in caplog.records if warned["ga"] in r.getMessage())
    assert "at t = 30000000 ns (0.03 s of the run's timer, delta cycle 0)" in text
    assert run.stats().nodes["ga"].updates == run.stats().nodes["gh"].updates == 10


class StopsTheRun(mujou.Node):
    """Calls run.stop() from its own hook at its third tick (the run is in its args)."""

    run: object = None

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == 3:
            StopsTheRun.run.stop()  # type: ignore[attr-defined]


def make_stopper() -> dict[str, mujou.Node]:
    return {"stopper": StopsTheRun(), **make_net()}


def test_a_hook_of_the_hosts_group_may_stop_the_run() -> None:
    holder: dict = {}
    StopsTheRun.run = type("Later", (), {"stop": lambda self: holder["run"].stop()})()
    run = placed_run({"sim": "a"}, None, factory=make_stopper)
    holder["run"] = run
    run.join(20)
    assert run.stats().nodes["stopper"].updates >= 3  # its third update asked for the stop


_SCRIPT = '''
import mujou_actors as mujou


class Pulse(mujou.Node):
    out = mujou.Output(int)

    def __init__(self):
        super().__init__(period=0.01)


class Sink(mujou.Node):
    inp = mujou.Input(int)

    def __init__(self):
        super().__init__(period=None)


def make_net():
    net = {"pulse": Pulse(), "sink": Sink()}
    mujou.connect(net["pulse"].out, net["sink"].inp)
    return net


if __name__ == "__main__":
    raise SystemExit("the main block ran")
'''


def test_a_scripts_factory_builds_the_same_net_as_its_file_loaded_elsewhere(
        tmp_path, monkeypatch) -> None:
    """A script's classes are __main__.X in the host, __mp_main__.X where spawn imports it
    again and _mujou_file_<hash>.X where a group loads the factory's file: one net."""
    import importlib.util
    import sys

    from mujou_actors.distributed.placement import load_factory, net_signature
    from mujou_actors.net import walk

    script = tmp_path / "script.py"
    script.write_text(_SCRIPT)
    spec = importlib.util.spec_from_file_location("__mp_main__", script)
    assert spec is not None and spec.loader is not None
    main = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "__mp_main__", main)
    spec.loader.exec_module(main)

    def signature(net: object) -> list:
        found = walk(net)
        for path, node in found:
            node._mujou_path = path
        return net_signature(found)

    here = signature(main.make_net())
    there = signature(load_factory(f"{script}:make_net")())
    assert here == there
    assert here[0][1] == f"{script.resolve()}.Pulse"


class Rig(mujou.Node):
    """A root that holds the net of `make_net` as its children (no period of its own)."""

    def __init__(self) -> None:
        super().__init__(period=None)
        self.sim = placed_support.Sim()
        self.ctrl = placed_support.Ctrl()
        self.log = placed_support.Log()
        mujou.connect(self.sim.out, self.ctrl.obs)
        mujou.connect(self.sim.out, self.log.obs)
        mujou.connect(self.ctrl.cmd, self.log.cmd)


def make_rig() -> Rig:
    return Rig()


@pytest.mark.parametrize("placement", [
    {"sim": "a"},  # the root stays in the host, a child of it goes
    {"": "a", "ctrl": "b", "log": "host"},  # deeper paths win, "host" included
])
def test_a_node_placed_elsewhere_runs_only_there_not_in_its_parents_group(
        placement: dict) -> None:
    expected = single(0.1, factory=make_rig)
    run = placed_run(placement, 0.1, factory=make_rig)
    run.join(30)
    assert_same_tree(run.state_dict(), expected)
    stats = run.stats()
    ran = {name: set(g.nodes) for name, g in stats.groups.items()}
    assert {path for nodes in ran.values() for path in nodes} == {"", "sim", "ctrl", "log"}
    assert sum(len(nodes) for nodes in ran.values()) == 4  # each node in one group only
    assert "sim" in ran["a"] and stats.nodes["sim"].updates == 10


class Odd(mujou.Node):
    """Sends ints on an Output(object), and a complex (which cannot cross) at tick 3."""

    out = mujou.Output(object)

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.out.send(complex(1, 2) if self.n == 3 else self.n)


class Anything(mujou.Node):
    inp = mujou.Input(object, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)


def make_odd() -> dict[str, mujou.Node]:
    net = {"odd": Odd(), "sink": Anything()}
    mujou.connect(net["odd"].out, net["sink"].inp)
    return net


def test_a_message_that_cannot_cross_fails_the_run_naming_its_port() -> None:
    run = placed_run({"odd": "a"}, 1.0, factory=make_odd)
    with pytest.raises(NodeError, match=r"'odd.out' cannot cross to another group process: "
                                        r".*unsupported type complex") as info:
        run.join(30)
    assert info.value.path == "odd"
    assert isinstance(info.value.__cause__, placed.RemoteTraceback)


@pytest.mark.parametrize("strategy", ["one_for_one", "one_for_all"])
def test_a_real_time_placed_run_restarts_a_failed_node_and_keeps_its_snapshots(
        strategy: str) -> None:
    placed_support.Flaky.failures = 0
    supervisor = mujou.Supervisor(strategy, snapshot_every=0.05)
    args = _check_arguments(Seams(), workers=1, timer="realtime", duration=0.4, seed=7,
                            state=None, supervisor=supervisor, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=10.0, start_timeout=60.0)
    run = placed.start(placed_support.make_flaky,
                       placement=mujou.Placement({"flaky": "a", "sim": "b"}),
                       args=args, inputs=None, state=None, make_system=InProcessSystem)
    run.join(30)
    stats = run.stats()
    tree = run.state_dict()
    assert placed_support.Flaky.failures == 1
    assert stats.nodes["flaky"].restarts == 1
    restarted = {p for p, n in stats.nodes.items() if n.restarts}
    assert restarted == ({"flaky"} if strategy == "one_for_one" else set(stats.nodes))
    assert stats.snapshots.count >= 3  # the first, then about every 50 ms
    got = tree["nodes"]["count"]["got"]
    n = tree["nodes"]["flaky"]["n"]
    if strategy == "one_for_all":
        assert got == list(range(1, len(got) + 1))  # both rewound together: no repeat
    else:
        # flaky alone went back to its latest snapshot's count; count saw it go on
        # from there (a count of the snapshot's, plus one), then every one after it.
        # (When the latest snapshot came just before the failure, nothing repeats.)
        jumps = [i for i in range(1, len(got)) if got[i] != got[i - 1] + 1]
        assert got[0] == 1 and len(jumps) <= 1
        assert all(got[i] <= got[i - 1] for i in jumps)
    # What count had not taken in when the run ended is in the tree too (kept or
    # pending): a loaded machine may leave a few of flaky's last messages there.
    seen = (got + list(tree["inputs"].get("count.inp", []))
            + list(tree["pending"].get("count.inp", [])))
    assert seen[-1] == n or seen[-1] == n - 1  # the last may still be on its way
    _every_message_once(tree)


def test_a_factory_under_the_main_guard_of_a_script_is_refused_at_once(tmp_path) -> None:
    from mujou_actors.distributed.placement import _defined_at_top

    script = tmp_path / "rig.py"
    script.write_text("import mujou_actors as mujou\nfrom os import path as helper\n"
                      "def make_net():\n    return {}\nOTHER = 1\n"
                      "if __name__ == '__main__':\n    def nested():\n        return {}\n")
    assert _defined_at_top(str(script), "make_net") and _defined_at_top(str(script), "OTHER")
    assert _defined_at_top(str(script), "helper")
    assert not _defined_at_top(str(script), "nested")
    with pytest.raises(ValueError, match=r"no function 'nested' at its top level"):
        load_factory(f"{script}:nested")
    with pytest.raises(ValueError, match=r"'OTHER' is a int, not a function"):
        load_factory(f"{script}:OTHER")


def test_a_script_read_from_standard_input_is_not_imported_by_the_groups(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python - < rig.py``: the groups skip the script (no file to import; spawn would
    fail on it in each), and a factory defined in it is refused at once, by name."""
    import sys
    import types

    from mujou_actors.distributed._mainscript import main_of_this_process
    from mujou_actors.distributed.placement import resolve_factory

    script = tmp_path / "rig.py"
    script.write_text("X = 1\n")
    main = types.ModuleType("__main__")
    main.__spec__ = None
    monkeypatch.setitem(sys.modules, "__main__", main)
    main.__file__ = str(script)
    assert main_of_this_process() == (("init_main_from_path", str(script)),)
    main.__file__ = "<stdin>"  # what Python sets for a script on standard input
    assert main_of_this_process() == ()

    def make() -> dict[str, Any]:
        return {}

    make.__module__, make.__qualname__ = "__main__", "make"
    main.make = make  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=r"'make' is defined in __main__, which has no file "
                                        r"\(<stdin>: a script read from standard input\?\)"):
        resolve_factory(make, None)
    with pytest.raises(TypeError, match=r"'make' is defined in __main__, which has no file "
                                        r"\(<stdin>"):  # named by a string: the same, at once
        resolve_factory("__main__:make", None)
    del main.__file__  # python -c, or an interactive session
    with pytest.raises(TypeError, match=r"which has no file \(an interactive session, or "
                                        r"python -c\?\)"):
        resolve_factory(make, None)
    main.__file__ = str(script)  # a script's file: "__main__:make" becomes its path
    script.write_text("def make():\n    return {}\n")
    assert resolve_factory("__main__:make", None)[1].ref == f"{script}:make"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_placed_run_started_from_a_script_on_standard_input_runs(tmp_path) -> None:
    import subprocess
    import sys

    from tests.procs_support import ROOT

    script = ("import mujou_actors as mujou\n"
              "from tests.placed_support import make_net\n"
              "run = mujou.run(make_net, placement={'sim': 'a', 'ctrl': 'b'}, "
              "timer='simulated', duration=0.05, seed=3)\n"
              "run.join(60)\nprint('time', run.stats().time)\n")
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT}, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "time 0.05"


def test_a_machines_run_listens_on_a_port_its_workers_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUJOU_SECRET", "a secret long enough for the test")
    with pytest.raises(ValueError, match=r"listen='127.0.0.1': .*port.*`mujou worker --join`"):
        mujou.Placement({"sim": "robot:physics"}, listen="127.0.0.1")
    monkeypatch.delenv("MUJOU_SECRET")
    monkeypatch.delenv("MUJOU_SECRET_FILE", raising=False)
    with pytest.raises(ValueError, match="MUJOU_SECRET"):
        mujou.run(make_net, placement=mujou.Placement({"sim": "robot:physics"},
                                                      listen="127.0.0.1:7000"),
                  timer="simulated")


def test_listen_and_machines_go_together() -> None:
    with pytest.raises(ValueError, match=r"group 'physics' on machine 'robot': pass "
                                         r"listen='HOST:PORT'"):
        mujou.run(make_net, placement={"sim": "robot:physics"}, timer="simulated")
    with pytest.raises(ValueError, match=r"listen='127.0.0.1:7000' goes with groups that put "
                                         r"a group on another machine"):
        mujou.Placement({"sim": "a"}, listen="127.0.0.1:7000")
    with pytest.raises(TypeError, match="listen must be a 'HOST:PORT' str, got int"):
        mujou.Placement({"sim": "a"}, listen=7000)  # type: ignore[arg-type]


def test_an_on_start_failure_seen_on_the_data_plane_first_is_the_node_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Real time: a group reports a hook's failure as it goes, so an on_start that raised
    may reach the host on the data plane (a `Failed`, the supervisor's) before the group's
    answer to Start; mujou.run raises its NodeError, as one process does."""
    from mujou_actors.distributed import rounds
    from mujou_actors.distributed.failures import Failed, RemoteTraceback, node_error

    error = node_error("g", {"type": "ValueError", "message": "bad start", "path": "snk",
                             "hook": "on_start", "traceback": "Traceback ...\n"})

    def start_sends(self: object, left: float) -> None:
        raise Failed(error, "g", "snk")

    monkeypatch.setattr(rounds.SimulatedRounds, "start_sends", start_sends)
    with pytest.raises(NodeError) as info:
        placed_run({"snk": "g"}, 0.1, factory=placed_support.make_refusing)
    assert info.value is error and (info.value.path, info.value.hook) == ("snk", "on_start")
    assert isinstance(info.value.__cause__, RemoteTraceback)


@pytest.mark.timeout(60)
def test_a_real_time_end_after_a_failed_on_start_does_not_wait_for_groups_that_never_ran(
        caplog: pytest.LogCaptureFixture) -> None:
    """The groups whose on_start succeeded never ran their clocks: the end's cut takes them
    as they are (it waited a whole stop_timeout for them, then said they had hooks in
    flight), and the run raises the failing node's NodeError."""
    args = _check_arguments(Seams(), workers=1, timer="realtime", duration=1.0, seed=7,
                            state=None, supervisor=None, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=600.0, start_timeout=60.0)
    with caplog.at_level("DEBUG", logger="mujou_actors"), pytest.raises(NodeError) as info:
        placed.start(placed_support.make_refusing,
                     placement=mujou.Placement({"snk": "gx", "sim": "a"},
                                               net_kwargs={"refuse": "on_start"}),
                     args=args, inputs=None, state=None, make_system=InProcessSystem)
    assert (info.value.path, info.value.hook) == ("snk", "on_start")
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "could not be delivered" in m or "_NotHeld" in m], said
