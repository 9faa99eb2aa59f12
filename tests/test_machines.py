"""Placed runs across machines: convention members on loopback ports of this host.

Each member is a Thespian actor system of its own (`convention.Member`, as
`mujou worker` starts one) that joins the run's leader; the placement puts
groups on members by name. The data plane to them, and between their groups
when every node is placed (peer links), runs over TCP with the run's secret
(CURVE). Each test starts member systems and group processes
(spawn; each imports torch), so they are few and each checks much.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import mujou_actors as mujou
from mujou_actors.distributed.convention import Member
from mujou_actors.distributed.peers import pair_key
from mujou_actors.distributed.placed_run import machine_stats
from mujou_actors.distributed.realtime import AGE_SAMPLES, MessageAges
from mujou_actors.errors import JoinTimeoutError
from tests import placed_support
from tests.placed_support import in_order_once, make_counters
from tests.random_nets import make_random_net
from tests.test_placed import assert_same_tree, single
from tests.test_placed_random import RICH, _assert_same_counts, _single, _values

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
        placement = mujou.Placement({"sim": "robot:physics", "ctrl": "gpu-box:control"},
                                    listen=leader, join_timeout=30)
        run = mujou.run(placed_support.make_net, placement=placement,
                        timer="simulated", duration=0.2, seed=7, workers=2)
        stats = run.stats()
        run.join(60)
        assert_same_tree(run.state_dict(), expected)
        # Each group ran in a process of its member's (a child of its admin's).
        assert stats.groups["physics"].pid in on_robot
        assert stats.groups["control"].pid in on_gpu
        # Each machine's figures are its groups': the host's machine's bytes, the mirror
        # of the members' (every message between groups passes the host).
        final = run.stats()
        machines = final.machines
        assert list(machines)[0] == "" and set(machines) == {"", "robot", "gpu-box"}
        for name, group in [("robot", "physics"), ("gpu-box", "control")]:
            m, g = machines[name], final.groups[group]
            assert (m.name, m.groups, m.pids, m.cpu_time) == (name, (group,), (g.pid,),
                                                              g.cpu_time)
            assert m.bytes_in == g.bytes_in > 0 and m.bytes_out == g.bytes_out > 0
            assert m.hostname == socket.gethostname()  # loopback members: this host
            assert final.groups[group].machine == name
        host = machines[""]
        assert host.groups == ("host",) and host.pids == (os.getpid(),)
        assert host.bytes_in == sum(machines[n].bytes_out for n in ("robot", "gpu-box"))
        assert host.bytes_out == sum(machines[n].bytes_in for n in ("robot", "gpu-box"))
        assert host.clock_offset_ns is None and host.message_age_p50 is None
        assert machines["robot"].message_age_p50 is None  # simulated time: no ages
    deadline = time.monotonic() + 10
    while _listening(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _listening(port)


def test_every_node_on_groups_across_machines_talks_on_direct_links_and_matches_one_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node placed, groups on two members and on the host's machine: each pair of
    groups has a link of its own, TCP with the run's secret (CURVE, made before the
    timers start), and the host relays no message between them; the run ends as one
    process, for ``make_net`` (its stats counting what crossed each machine) and for the
    rich random net (a 1 MiB tensor a tick, inline, from a member to the host's machine;
    ``on_start`` sends; ``inputs=``)."""
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    expected = single(0.2)
    inputs = {"ctl.i1": "float", "box.i1": "tensor"}
    rich, rich_stats = _single(RICH, 0.02, seed=3, workers=2, inputs=inputs)
    leader = f"127.0.0.1:{_free_port()}"
    with Member("robot", leader), Member("gpu-box", leader):
        placement = mujou.Placement({"sim": "robot:physics", "ctrl": "gpu-box:control",
                                     "log": "logger"}, listen=leader, join_timeout=30)
        run = mujou.run(placed_support.make_net, placement=placement,
                        timer="simulated", duration=0.2, seed=7, workers=2)
        run.join(60)
        placement = mujou.Placement({"src": "robot:a", "ctl": "gpu-box:b", "log": "gpu-box:b",
                                     "box": "c"}, net_kwargs=RICH, listen=leader,
                                    join_timeout=30)
        again = mujou.run(make_random_net, placement=placement, timer="simulated",
                          duration=0.02, seed=3, workers=2, inputs=_values(inputs))
        try:
            again.join(120)
        finally:
            again.stop()
    assert_same_tree(run.state_dict(), expected)
    driver = run._driver  # type: ignore[attr-defined]
    timing = driver.timing
    assert timing.segments == timing.rounds > 0 and timing.unreachable is None
    assert (timing.cross.opened, timing.cross.links) == (1, 3)
    assert driver.relayed == 0  # nothing between groups through the host
    assert [g.link.messages_in for g in driver.groups.values()] == [0, 0, 0]
    stats = run.stats()
    ticks = expected["nodes"]["ctrl"]["n"]
    groups = stats.groups
    assert (groups["physics"].messages_out, groups["control"].messages_in) == (ticks, ticks)
    assert groups["logger"].messages_in == 2 * ticks
    # What crossed machines: every byte of a member's links (one group on each, its peers
    # all elsewhere); of the logger's, its peer links', not its link to the host (which is
    # on its machine). What one machine sent, another received.
    machines = stats.machines
    for name, group in [("robot", "physics"), ("gpu-box", "control")]:
        assert machines[name].bytes_in == groups[group].bytes_in > 0
        assert machines[name].bytes_out == groups[group].bytes_out > 0
    assert 0 < machines[""].bytes_in < groups["logger"].bytes_in
    assert sum(m.bytes_in for m in machines.values()) == sum(m.bytes_out
                                                             for m in machines.values())
    assert machines["robot"].refused == machines[""].refused == 0

    assert_same_tree(again.state_dict(), rich)
    _assert_same_counts(again.stats(), rich_stats)
    timing = again._driver.timing  # type: ignore[attr-defined]
    assert timing.segments > 0 and (timing.cross.opened, timing.cross.links) == (1, 3)


@contextmanager
def _peer_folders(member: Member) -> Iterator[dict[str, int]]:
    """Every peer-link folder seen in ``member``'s private folder while inside, with its
    mode (polled every 5 ms: a group makes one as its mesh opens, removes it at its end)."""
    seen: dict[str, int] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.005):
            try:
                names = os.listdir(member._folder)
            except OSError:
                continue
            for name in names:
                path = os.path.join(member._folder, name)
                if name.startswith("mujou-peers-") and path not in seen:
                    try:
                        seen[path] = stat.S_IMODE(os.stat(path).st_mode)
                    except FileNotFoundError:
                        pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        stop.set()
        watcher.join(10)


def test_two_groups_of_one_member_talk_over_ipc_in_a_private_folder_there(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node placed, groups ``physics`` and ``control`` on ``robot``, ``logger`` on
    ``gpu-box``: the link between robot's two groups is ``ipc://`` in a private folder
    (0700) that its listening group makes in robot's member folder and removes at its
    end; the links to gpu-box stay TCP with the run's secret; the host relays nothing
    between groups, and the run ends as one process."""
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    expected = single(1.0)
    leader = f"127.0.0.1:{_free_port()}"
    with Member("robot", leader) as robot, Member("gpu-box", leader):
        with _peer_folders(robot) as seen:
            placement = mujou.Placement({"sim": "robot:physics", "ctrl": "robot:control",
                                         "log": "gpu-box:logger"}, listen=leader,
                                        join_timeout=30)
            run = mujou.run(placed_support.make_net, placement=placement,
                            timer="simulated", duration=1.0, seed=7, workers=2)
            run.join(60)
        left = [n for n in os.listdir(robot._folder) if n.startswith("mujou-peers-")]
        stats = run.stats()
    assert_same_tree(run.state_dict(), expected)
    driver = run._driver  # type: ignore[attr-defined]
    timing = driver.timing
    assert timing.segments == timing.rounds > 0 and timing.unreachable is None
    cross = timing.cross
    assert (cross.opened, cross.links, cross.local) == (1, 2, 1)
    names = ["control", "logger", "physics"]
    ipc = cross.endpoints[pair_key(names, "control", "physics")]
    folder = os.path.dirname(ipc.removeprefix("ipc://"))
    assert ipc.startswith(f"ipc://{robot._folder}/mujou-peers-")
    assert seen == {folder: 0o700}  # control's (first in the mesh's order: it listens)
    assert left == []  # removed at the end
    for a, b in [("control", "logger"), ("logger", "physics")]:
        assert cross.endpoints[pair_key(names, a, b)].startswith("tcp://")
    assert driver.relayed == 0
    # What crossed machines: robot's bytes are those of its links to gpu-box's logger
    # (and to the host), not of the ipc:// link between its own groups.
    machines, groups = stats.machines, stats.groups
    assert machines["gpu-box"].bytes_in == groups["logger"].bytes_in > 0
    assert machines["robot"].bytes_out < groups["physics"].bytes_out + groups["control"].bytes_out


@pytest.mark.timeout(120)
def test_real_time_across_machines_sends_straight_to_the_reading_group_in_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Real time, every node placed (two groups on one member, one on another): each
    message goes straight from its group to the reader's on their link (TCP with CURVE
    between the members, ``ipc://`` between the two groups of one), once and in order, or
    counted as dropped; the host's links carry none, and the cuts hold each message once."""
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    leader = f"127.0.0.1:{_free_port()}"
    with Member("robot", leader), Member("gpu-box", leader):
        placement = mujou.Placement({"c1": "robot:a", "c2": "gpu-box:b", "k": "robot:c"},
                                    listen=leader, join_timeout=30)
        run = mujou.run(make_counters, placement=placement, timer="realtime", duration=1.0,
                        seed=7, workers=1)
        mid = run.state_dict(timeout=30)
        run.join(60)
    final = run.state_dict()
    drops = run.stats().nodes["k"].drops["a"]
    in_order_once(final, drops)
    driver = run._driver  # type: ignore[attr-defined]
    timing = driver.timing
    assert timing.live and timing.unreachable is None
    assert (timing.cross.opened, timing.cross.links, timing.cross.local) == (1, 2, 1)
    assert timing.cross.endpoints[pair_key(["a", "b", "c"], "a", "c")].startswith("ipc://")
    assert driver.relayed == 0
    assert [g.link.messages_in for g in driver.groups.values()] == [0, 0, 0]
    assert final["nodes"]["c2"]["sent"] >= 100 and final["nodes"]["c1"]["sent"] >= 100
    for which in (1, 2):
        assert mid["nodes"][f"c{which}"]["sent"] <= final["nodes"][f"c{which}"]["sent"]
    groups = run.stats().groups
    assert groups["c"].messages_in == final["nodes"]["c1"]["sent"] + final["nodes"]["c2"]["sent"]
    # a and c share robot: their link crossed no network, b's did.
    machines = run.stats().machines
    assert machines["gpu-box"].bytes_out == groups["b"].bytes_out > 0
    assert machines["robot"].bytes_in < groups["a"].bytes_in + groups["c"].bytes_in


@pytest.mark.timeout(120)
def test_stats_and_the_trace_of_a_real_time_run_carry_each_machines_clock_offset(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Real time on two members: each machine's clock offset (0 on one host, within its
    uncertainty), its heartbeat bytes, the age of its groups' messages at the host; and
    the trace's processes on members shifted onto the host's clock by it, their arrows
    from a send to its read in order within the bounds, the offsets in its metadata."""
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    path = tmp_path / "t.json"
    leader = f"127.0.0.1:{_free_port()}"
    with Member("robot", leader), Member("gpu-box", leader):
        placement = mujou.Placement({"sim": "robot:physics", "ctrl": "gpu-box:control"},
                                    listen=leader)
        run = mujou.run(placed_support.make_net, placement=placement, timer="realtime",
                        duration=1.5, seed=7, workers=1, trace=path)
        run.join(60)
    stats = run.stats()
    for name, group in [("robot", "physics"), ("gpu-box", "control")]:
        m, g = stats.machines[name], stats.groups[group]
        assert m.clock_offset_ns == g.clock_offset_ns is not None  # its one group's
        assert m.clock_uncertainty_ns == g.clock_uncertainty_ns is not None
        assert abs(m.clock_offset_ns) <= m.clock_uncertainty_ns < 50_000_000  # one clock
        assert m.rtt_ns is not None and m.rtt_ns > 0
        assert m.heartbeat_bytes_in > 0 and m.heartbeat_bytes_out > m.heartbeat_bytes_in
        # The ages of its messages (100 ticks of sim, as many commands) at the host.
        assert m.message_age_p50 is not None and m.message_age_p99 is not None
        slack = m.clock_uncertainty_ns / 1e9
        assert -slack <= m.message_age_p50 <= m.message_age_p99 < 1.0
    host = stats.machines[""]
    assert host.heartbeat_bytes_in == sum(stats.machines[n].heartbeat_bytes_out
                                          for n in ("robot", "gpu-box"))

    doc = json.loads(path.read_text())
    groups = doc["otherData"]["groups"]
    labels = {e["pid"]: e["args"]["labels"] for e in doc["traceEvents"]
              if e["ph"] == "M" and e["name"] == "process_labels"}
    uncertainty = {os.getpid(): 0}
    for name, group in [("robot", "physics"), ("gpu-box", "control")]:
        facts = groups[group]
        assert facts["machine"] == name and facts["clock_uncertainty_ns"] > 0
        assert abs(facts["clock_offset_ns"]) <= facts["clock_uncertainty_ns"]
        assert f"machine {name}, clock shifted by" in labels[facts["pid"]]
        uncertainty[facts["pid"]] = facts["clock_uncertainty_ns"]
    assert labels[os.getpid()] == f"pid {os.getpid()}"
    assert "shifted onto the host's" in doc["otherData"]["clock"]
    starts = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "s"}
    crossing = [(starts[e["id"]], e) for e in doc["traceEvents"]
                if e["ph"] == "f" and starts[e["id"]]["pid"] != e["pid"]]
    assert len(crossing) > 50  # sim -> ctrl, sim -> log, ctrl -> log, on three machines
    for s, f in crossing:  # read after sent, to within both clocks' bounds
        assert f["ts"] >= s["ts"] - (uncertainty[s["pid"]] + uncertainty[f["pid"]]) / 1e3


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_real_time_on_peer_links_across_machines_measures_the_ages_where_messages_arrive(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Real time, every node placed, two groups on two members that message each other
    on their peer link (sim -> ctrl, ctrl -> log), none through the host: each group
    notes the ages of what comes from the other machine, and each member reports its
    messages' ages (within the two clocks' bounds of the true ones)."""
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    leader = f"127.0.0.1:{_free_port()}"
    with Member("robot", leader), Member("gpu-box", leader):
        placement = mujou.Placement({"sim": "robot:physics", "log": "robot:physics",
                                     "ctrl": "gpu-box:control"}, listen=leader,
                                    join_timeout=30)
        run = mujou.run(placed_support.make_net, placement=placement, timer="realtime",
                        duration=1.5, seed=7, workers=1)
        run.join(60)
    driver = run._driver  # type: ignore[attr-defined]
    timing = driver.timing
    assert timing.live and timing.unreachable is None
    assert driver.relayed == 0  # every message between the groups on their peer link
    assert all(g.link.messages_in == 0 for g in driver.groups.values())
    stats = run.stats()
    groups, machines = stats.groups, stats.machines
    raw = driver.final_stats
    for group, sender in [("physics", "gpu-box"), ("control", "robot")]:
        assert not raw[group].get("ages")  # none reached the host's relay
        # What came from the other machine on the link: one age each, from the moment the
        # host told the senders' clocks (a few messages may come before), the newest kept.
        ages = raw[group]["peer_ages"]
        assert list(ages) == [sender]
        came = min(groups[group].messages_in, AGE_SAMPLES)
        assert came >= 50 and came - 30 <= len(ages[sender]) <= came
        # The stand-in machines share one clock: a raw age is the true age.
        assert all(0 < a < 1_000_000_000 for a in ages[sender])
    for name in ("robot", "gpu-box"):
        m = machines[name]
        assert m.message_age_p50 is not None and m.message_age_p99 is not None
        slack = 2 * max(machines[n].clock_uncertainty_ns or 0 for n in ("robot", "gpu-box"))
        assert -slack / 1e9 < m.message_age_p50 <= m.message_age_p99 < 1.0
    assert machines[""].message_age_p50 is None  # the host's machine runs no group


def test_a_groups_peer_links_note_the_raw_ages_of_what_comes_from_other_machines(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The receiving group's raw age is its clock at the frame's arrival minus the send's
    stamp put on the sender's clock (its timer origin added); `machine_stats` takes the
    receiver's clock offset out and puts the sender's in: the true age."""
    from types import SimpleNamespace

    from mujou_actors.distributed import dataplane, peers

    ITEMS = dataplane.PEER_ITEMS  # noqa: N806
    ms = 1_000_000
    offset = {"": 0, "robot": 5 * ms, "gpu": 2 * ms}  # each clock minus the host's

    class Link:
        def __init__(self) -> None:
            self.frames: list[tuple] = []

        def receive(self) -> tuple | None:
            return self.frames.pop(0) if self.frames else None

    links = {"a": Link(), "b": Link(), "h": Link()}  # a: robot, b: gpu (c's own), h: host
    mesh = SimpleNamespace(links=links, generation=3, ins=["a", "b", "h"])
    routes = SimpleNamespace(local_readers=lambda output: ["c.inp"])
    written: list[tuple] = []
    kernel = SimpleNamespace(write=lambda reader, message, key, owned: written.append(key))
    rt = peers.RealTimePeers(mesh, routes)  # type: ignore[arg-type]
    origin = {"a": 40 * ms, "h": 70 * ms}  # each sender's timer origin on its clock
    rings = {"robot": peers.AgeRing(), "": peers.AgeRing()}
    host_now = 1_000 * ms

    # Before the host told the clocks: nothing noted.
    monkeypatch.setattr(peers.time, "monotonic_ns", lambda: host_now + offset["gpu"])
    links["a"].frames.append((ITEMS, 3, 0, (-1, 0), [(1, 0, 1, 0, "m")]))
    rt.take(kernel)  # type: ignore[arg-type]
    assert written == [(1, 0, 1)] and rings["robot"].count == 0
    rt.clocks = {"a": (origin["a"], rings["robot"]), "h": (origin["h"], rings[""])}
    # a (robot) sent at run time t: robot's monotonic t + origin, the host's that less
    # robot's offset; it arrives `age` later on the host's clock, on c's plus gpu's offset.
    for p, machine, t, age in [("a", "robot", 900 * ms, 1 * ms), ("a", "robot", 901 * ms, 3 * ms),
                               ("h", "", 850 * ms, 2 * ms)]:
        sent_host = t + origin[p] - offset[machine]
        monkeypatch.setattr(peers.time, "monotonic_ns",
                            lambda s=sent_host, a=age: s + a + offset["gpu"])
        links[p].frames.append((ITEMS, 3, 0, (-1, 0), [(t, 0, 1, 0, "m")]))
        rt.take(kernel)  # type: ignore[arg-type]
    # b is on c's machine (no clock told) and a frame of an abandoned generation: not noted.
    links["b"].frames.append((ITEMS, 3, 0, (-1, 0), [(5, 0, 1, 0, "m")]))
    links["a"].frames.append((ITEMS, 2, 0, (-1, 0), [(5, 0, 1, 0, "m")]))
    rt.take(kernel)  # type: ignore[arg-type]
    assert (rings["robot"].count, rings[""].count) == (2, 1)
    # raw = age + c's offset - the sender's
    assert rings["robot"].raw() == [1 * ms + 2 * ms - 5 * ms, 3 * ms + 2 * ms - 5 * ms]
    assert rings[""].raw() == [2 * ms + 2 * ms]

    groups = {"a": _group("a", "robot", 11, clock_offset_ns=offset["robot"],
                          clock_uncertainty_ns=100_000),
              "c": _group("c", "gpu", 12, clock_offset_ns=offset["gpu"],
                          clock_uncertainty_ns=100_000),
              "h": _group("h", "", 13)}
    raw = {"c": {"peer_ages": {"robot": rings["robot"].raw(), "": rings[""].raw()}},
           "a": {"ages": [10 * ms - offset["robot"]]},  # one at the host's relay: 10 ms
           "h": {}}
    machines = machine_stats(groups, raw)
    robot, host, gpu = machines["robot"], machines[""], machines["gpu"]
    # robot's: 1 and 3 ms on the peer link to c, 10 ms at the host's relay.
    assert (robot.message_age_p50, robot.message_age_p99) == (pytest.approx(0.003),
                                                              pytest.approx(0.010))
    # The host's machine's: its group's message on the peer link to c (2 ms).
    assert host.message_age_p50 == pytest.approx(0.002) == host.message_age_p99
    assert gpu.message_age_p50 is None  # nothing of gpu's was measured
    # The receiver's machine without a clock offset yet: its rings are left out.
    unclocked = {**groups, "c": _group("c", "gpu", 12)}
    machines = machine_stats(unclocked, raw)
    assert machines["robot"].message_age_p50 == pytest.approx(0.010)
    assert machines[""].message_age_p50 is None


def test_an_age_ring_keeps_the_newest_raw_ages_in_a_fixed_array() -> None:
    from mujou_actors.distributed.peers import AgeRing

    ring = AgeRing()
    assert ring.raw() == [] and ring.count == 0
    ring.note(1_000, [(10, 0, 1, 0, "a"), (400, 0, 1, 0, "b")])
    assert ring.raw() == [990, 600] and ring.count == 2
    for i in range(AGE_SAMPLES + 5):
        ring.note(i, [(0,)])
    assert ring.count == AGE_SAMPLES + 7
    assert ring.raw() == list(range(5, AGE_SAMPLES + 5))


def test_message_ages_are_the_raw_ages_of_the_newest_messages_with_the_offset_added(
        ) -> None:
    ages = MessageAges(origin_ns=1_000)
    # A reply of two messages stamped 10 and 20 (run time), taken in at monotonic 5_000:
    # sent at the member's monotonic 1_010 and 1_020.
    ages.add(5_000, [(10, 0, 1, 0, "a"), (20, 0, 1, 0, "b")])
    assert ages.raw() == [3_990, 3_980]
    for i in range(AGE_SAMPLES):
        ages.add(10_000 + i, [(0, 0, 1, 0, None)])
    raw = ages.raw()
    assert len(raw) == AGE_SAMPLES and raw[0] == 9_000 and raw[-1] == 9_000 + AGE_SAMPLES - 1


def _group(name: str, machine: str, pid: int, **kw) -> mujou.GroupStats:
    figures = {"cpu_time": 1.5, "nodes": (), "messages_in": 3, "messages_out": 4,
               "bytes_in": 100, "bytes_out": 200, "drops": 0, **kw}
    return mujou.GroupStats(name=name, pid=pid, machine=machine, **figures)


def test_each_machine_sums_its_groups_and_takes_its_tightest_clock() -> None:
    groups = {
        "a": _group("a", "robot", 11, clock_offset_ns=5_000_000, clock_uncertainty_ns=300_000,
                    rtt_ns=600_000),
        "b": _group("b", "robot", 12, bytes_in=1_000, clock_offset_ns=5_100_000,
                    clock_uncertainty_ns=100_000, rtt_ns=200_000, refused=2),
        "c": _group("c", "gpu", 13, refused=1),  # no heartbeat answer yet
        "host": _group("host", "", os.getpid(), bytes_in=0, bytes_out=0),
    }
    # Raw ages (the offset not added): the member's clock is 5.1 ms ahead of the host's, so
    # a message 1 ms old looks 5.1 ms younger than it is on the member's clock.
    raw = {"a": {"host": "robot-pc", "ages": [-4_100_000, -3_100_000],
                 "heartbeat_in": 19, "heartbeat_out": 46},
           "b": {"host": "robot-pc", "ages": [-2_100_000], "heartbeat_in": 38,
                 "heartbeat_out": 92},
           "c": {"host": "gpu-pc", "ages": [123], "heartbeat_in": 19}, "host": {}}

    machines = machine_stats(groups, raw)

    assert list(machines) == ["", "robot", "gpu"]
    robot = machines["robot"]
    assert (robot.name, robot.hostname, robot.groups, robot.pids) == (
        "robot", "robot-pc", ("a", "b"), (11, 12))
    assert (robot.cpu_time, robot.bytes_in, robot.bytes_out) == (3.0, 1_100, 400)
    assert (robot.heartbeat_bytes_in, robot.heartbeat_bytes_out) == (57, 138)
    # b's estimate is the tighter: it is the machine's, for every group's ages.
    assert (robot.clock_offset_ns, robot.clock_uncertainty_ns, robot.rtt_ns) == (
        5_100_000, 100_000, 200_000)
    assert robot.message_age_p50 == pytest.approx(0.002)  # 1, 2 and 3 ms
    assert robot.message_age_p99 == pytest.approx(0.003)
    gpu = machines["gpu"]  # no offset known: no ages either
    assert gpu.clock_offset_ns is gpu.message_age_p50 is gpu.message_age_p99 is None
    host = machines[""]
    assert (host.groups, host.pids, host.cpu_time) == (("host",), (os.getpid(),), 1.5)
    assert host.hostname == socket.gethostname()
    assert (host.bytes_in, host.bytes_out) == (600, 1_200)  # the members' out, in
    assert (host.heartbeat_bytes_in, host.heartbeat_bytes_out) == (138, 76)
    assert host.clock_offset_ns is None and host.message_age_p50 is None
    # Connections refused at the host's data-plane listeners: by member, and in all.
    assert (robot.refused, gpu.refused, host.refused) == (2, 1, 3)


def test_peer_links_count_toward_a_machine_only_the_bytes_that_crossed_to_another(
        ) -> None:
    """With peer links, a member's groups talk to other members' directly: a machine's
    bytes are those of its groups' links to the host, and of their peer links to groups
    on other machines (a link between two groups of one machine crosses no network);
    the host's machine's, the mirror of the members' links to it and its own groups'
    peer links to theirs."""
    groups = {"a": _group("a", "robot", 11, bytes_in=1_000, bytes_out=2_000),
              "b": _group("b", "robot", 12, bytes_in=300, bytes_out=400),
              "c": _group("c", "gpu", 13, bytes_in=5_000, bytes_out=6_000),
              "d": _group("d", "", 14, bytes_in=70, bytes_out=80)}
    raw = {"a": {"link_bytes": [10, 20],  # a: 100/200 with b (robot), 870/1780 with c
                 "peer_bytes": {"b": [120, 200], "c": [870, 1780]}},
           "b": {"link_bytes": [30, 40], "peer_bytes": {"a": [200, 120], "d": [70, 240]}},
           "c": {"link_bytes": [50, 60], "peer_bytes": {"a": [1780, 870],
                                                         "d": [3170, 5070]}},
           "d": {"link_bytes": [0, 0], "peer_bytes": {"b": [240, 70], "c": [5070, 3170]}}}

    machines = machine_stats(groups, raw)

    robot, gpu, host = machines["robot"], machines["gpu"], machines[""]
    # robot: its links to the host (10+30 in) and its peer links to c and d, not a-b.
    assert (robot.bytes_in, robot.bytes_out) == (10 + 30 + 870 + 70, 20 + 40 + 1780 + 240)
    assert (gpu.bytes_in, gpu.bytes_out) == (50 + 1780 + 3170, 60 + 870 + 5070)
    # The host's machine: the members' links to the host, mirrored, and d's peer links.
    assert (host.bytes_in, host.bytes_out) == (20 + 40 + 60 + 240 + 5070, 10 + 30 + 50
                                                + 70 + 3170)
    # What one machine sent another, it received: the totals agree.
    assert sum(m.bytes_in for m in machines.values()) == sum(m.bytes_out
                                                             for m in machines.values())


def test_a_group_on_other_cpu_kernels_than_the_host_is_warned_about(
        caplog: pytest.LogCaptureFixture) -> None:
    from mujou_actors.devices import numerics
    from mujou_actors.distributed.recovery import _warn_other_kernels

    here = numerics()
    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        _warn_other_kernels("g1", dict(here))
        _warn_other_kernels("g2", None)               # a member of an older version
        _warn_other_kernels("g3", {**here, "cpu_capability": "OTHER", "mkl_cbwr": "AVX2"})

    assert len(caplog.records) == 1
    text = caplog.records[0].getMessage()
    assert text.startswith("group 'g3' computes with other CPU kernels than the host "
                           f"(cpu_capability OTHER there, {here['cpu_capability']} here, "
                           f"mkl_cbwr AVX2 there, {here['mkl_cbwr'] or 'unset'} here)")
    assert "MKL_CBWR=COMPATIBLE" in text


def test_a_placed_run_on_one_machine_has_the_hosts_machine_only() -> None:
    machines = machine_stats({"a": _group("a", "", 11)}, {"a": {}})
    assert list(machines) == [""]
    assert machines[""].groups == ("a",) and (machines[""].bytes_in,
                                              machines[""].bytes_out) == (0, 0)


def test_a_member_nobody_started_is_named_before_any_node_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    leader = f"127.0.0.1:{_free_port()}"
    with Member("robot", leader):
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="gpu-box") as info:
            mujou.run(placed_support.make_net,
                      placement=mujou.Placement(
                          {"sim": "robot:physics", "ctrl": "gpu-box:control"}, listen=leader,
                          join_timeout=3),
                      timer="simulated", duration=0.2)
        assert "robot" in str(info.value)  # the members known
        assert time.monotonic() - t0 < 30


def _worker(name: str, leader: str, secret: str, **env_vars: str) -> subprocess.Popen:
    """``mujou worker`` in a session of its own, with ``env_vars`` in its environment.

    Every process it starts inherits ``MUJOU_TEST_MACHINE`` (a name of its own
    for this worker): so `_machine` finds them all, the admin included, which
    leaves the worker's session (Thespian's daemonizing ``setsid``).
    """
    marker = f"{name}-{uuid.uuid4().hex}"
    # Its own TMPDIR: what a SIGKILLed machine cannot clean up (its admin's
    # folder) is removed with it (`_forget`).
    folder = tempfile.mkdtemp(prefix="mujou-test-machine-")
    env = {**os.environ, "MUJOU_SECRET": secret, "MUJOU_TEST_MACHINE": marker,
           "TMPDIR": folder, **env_vars}
    cmd = [sys.executable, "-m", "mujou_actors", "worker", "--join", leader, "--name", name]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    proc.marker = marker  # type: ignore[attr-defined]
    proc.folder = folder  # type: ignore[attr-defined]
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
    finally:
        _forget(proc)


def _forget(proc: subprocess.Popen) -> None:
    """Remove the worker's TMPDIR (empty after a clean end; a killed machine's leftovers)."""
    shutil.rmtree(proc.folder, ignore_errors=True)  # type: ignore[attr-defined]


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
    _forget(proc)


def test_a_machine_with_another_secret_is_refused_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    leader = f"127.0.0.1:{_free_port()}"
    robot = _worker("robot", leader, "another secret, long enough too")
    try:
        t0 = time.monotonic()
        with pytest.raises(JoinTimeoutError, match="no member named 'robot'") as info:
            mujou.run(placed_support.make_net,
                      placement=mujou.Placement({"sim": "robot:physics"}, listen=leader,
                                                join_timeout=5),
                      timer="simulated", duration=0.2, seed=7, start_timeout=60)
        took = time.monotonic() - t0
        # the leader refuses every frame of it: it never joins, and both sides say why
        assert "MUJOU_SECRET" in "".join(info.value.__notes__)
        told = _stderr_line(robot, "refuses this machine's frames", 30)
        assert "its MUJOU_SECRET is not this machine's" in told
        print(f"another secret refused {took:.2f} s after mujou.run was called")
    finally:
        _stop_worker(robot)


def _stderr_line(proc: subprocess.Popen, want: str, timeout: float) -> str:
    """The first line of a worker's stderr that holds ``want`` (within ``timeout`` s), or ''."""
    import select

    deadline = time.monotonic() + timeout
    while proc.stderr is not None and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], deadline - time.monotonic())
        line = proc.stderr.readline() if ready else ""
        if want in line:
            return line
        if ready and not line:
            break
    return ""


def test_a_machine_that_builds_another_net_is_refused_naming_the_differences(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    leader = f"127.0.0.1:{_free_port()}"
    robot = _worker("robot", leader, SECRET, MUJOU_TEST_EXTRA_NODE="1")
    try:
        with pytest.raises(mujou.NetError, match=r"group 'physics' built another net than "
                                                 r"the host.*'extra'"):
            mujou.run(placed_support.make_net_by_machine,
                      placement=mujou.Placement({"sim": "robot:physics"}, listen=leader),
                      timer="simulated", duration=0.2, seed=7)
    finally:
        _stop_worker(robot)


@pytest.mark.parametrize("how, placed", [("vanished", {}), ("worker killed", {}),
                                         ("vanished", {"ctrl": "control", "log": "control"})],
                         ids=["vanished", "worker killed", "vanished, on peer links"])
def test_a_lost_machine_restarts_its_group_on_the_fallback_and_ends_as_one_process(
        monkeypatch: pytest.MonkeyPatch, how: str, placed: dict[str, str]) -> None:
    """The group's machine goes mid-run: at once, every process of it ("vanished": no
    ChildActorExited can come, only the heartbeat finds it), or its ``mujou worker`` is
    killed ("worker killed": its admin and group end by their watchdogs, the admin may
    tell of the group's end first and even take the restart's creation before it goes).
    Either way the group restarts on the fallback member from the latest snapshot, and
    the run ends as one process does. With every node placed ("on peer links") the
    groups talk on their own link, TCP with CURVE, which the restore makes again to the
    group's new machine."""
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    sup = lambda: mujou.Supervisor("one_for_all", snapshot_every=1.0)  # noqa: E731
    expected = single(20.0)  # a restart in simulated time ends as a run without one
    leader = f"127.0.0.1:{_free_port()}"
    robot = _worker("robot", leader, SECRET)
    try:
        with Member("spare", leader):
            run = mujou.run(placed_support.make_net,
                            placement=mujou.Placement({"sim": "robot,spare:physics", **placed},
                                                      listen=leader, heartbeat_timeout=1.0),
                            timer="simulated", duration=20.0, seed=7, supervisor=sup())
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
                timing = run._driver.timing  # type: ignore[attr-defined]
                if placed:  # the link to the new process, on spare, was made again
                    assert timing.segments > 0 and timing.unreachable is None
                    assert timing.cross.opened >= 2 and run._driver.relayed == 0
                else:
                    assert timing.segments == 0  # a node on the host's: the rounds
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
        run = mujou.run(placed_support.make_net,
                        placement=mujou.Placement({"sim": "robot:physics"}, listen=leader,
                                                  join_timeout=60, heartbeat_timeout=1.0),
                        timer="simulated", duration=20.0, seed=7, supervisor=sup())
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
