"""Real-time placed runs on peer links: each group sends its port messages straight to the
groups that read them, one hop, the host on no message's path (distributed/peers.py,
`RealTimePeers`; distributed/realtime.py, `PeerRelay`).

What must hold as on the host's relay: every message from one group to another arrives
once and in the order it was sent (or is counted as dropped by its Input's depth), a cut
(``state_dict``, the supervisor's snapshots, the end) holds every message exactly once,
kept or pending, and a restore goes on from the snapshot's messages only (a new mesh
generation drops the abandoned timeline's frames). Across machines (groups of this
process standing in for them: TCP with CURVE) the same holds, and a link that cannot be
made keeps the host's relay.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

import mujou_actors as mujou
from mujou_actors._runtime.build import Seams
from mujou_actors.distributed import group, peers, placed, segments
from mujou_actors.distributed.realtime import PeerRelay, RealTimeRelay
from mujou_actors.run import _check_arguments
from tests import placed_support
from tests.placed_support import InProcessSystem, across_machines, in_order_once, make_counters
from tests.test_placed import _every_message_once
from tests.test_placed_restarts import DyingSystem

pytestmark = pytest.mark.timeout(120)

COUNTERS = {"c1": "a", "c2": "b", "k": "c"}
ALL_PLACED = {"sim": "a", "ctrl": "b", "log": "c"}


def _start(factory: Any, placement: dict, duration: float | None, *,
           system: Any = InProcessSystem, supervisor: mujou.Supervisor | None = None
           ) -> placed.PlacedRun:
    args = _check_arguments(Seams(), workers=1, timer="realtime", duration=duration, seed=7,
                            state=None, supervisor=supervisor, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=10.0, start_timeout=60.0)
    return placed.start(factory, placement=mujou.Placement(placement), args=args, inputs=None,
                        state=None, make_system=system)


def test_every_node_placed_sends_group_to_group_and_cuts_hold_each_message_once() -> None:
    run = _start(placed_support.make_net, ALL_PLACED, 0.4)
    timing = run._driver.timing  # type: ignore[attr-defined]
    got: list[Any] = []
    run.subscribe("ctrl.cmd", got.append)  # published copies still reach the host
    run.wait_for("ctrl.cmd", timeout=20)
    assert isinstance(timing, PeerRelay) and timing.live and timing.generation == 1
    tree = run.state_dict(timeout=10)
    _every_message_once(tree)
    run.join(30)
    final = run.state_dict()
    _every_message_once(final)
    assert final["nodes"]["ctrl"]["n"] >= 5 and got


def test_messages_from_two_groups_arrive_once_in_order_or_counted_as_dropped() -> None:
    """Each counter sends 3 messages a tick: the first from its hook's thread (the direct
    hop), the other two by its group's data-plane thread; they arrive in order all the
    same."""
    run = _start(make_counters, COUNTERS, 0.5)
    mid = run.state_dict(timeout=10)
    mid_drops = run.stats().nodes["k"].drops["a"]
    run.join(30)
    final = run.state_dict()
    drops = run.stats().nodes["k"].drops["a"]
    assert isinstance(run._driver.timing, PeerRelay)  # type: ignore[attr-defined]
    assert run._driver.timing.live  # type: ignore[attr-defined]
    in_order_once(final, drops)
    assert final["nodes"]["c2"]["sent"] >= 30
    # No port message crossed through the host (its links carried nothing: no copy was
    # asked for either); the peer links carried each once, all of them in by the end.
    links = [g.link for g in run._driver.groups.values()]  # type: ignore[attr-defined]
    assert sum(link.messages_in for link in links) == 0
    groups = run.stats().groups
    sent = [final["nodes"][c]["sent"] for c in ("c1", "c2")]
    assert [groups["a"].messages_out, groups["b"].messages_out] == sent
    assert groups["c"].messages_in == sum(sent) and groups["c"].messages_out == 0
    assert mid_drops <= drops
    servers = run._driver.system.servers  # type: ignore[attr-defined]
    assert servers["a"].direct_ships >= 10 and servers["b"].direct_ships >= 10
    assert servers["c"].direct_ships == 0  # it sends nothing
    # Most of what c read, its idle worker read itself (one wake-up between socket and hook).
    assert servers["c"].idle_reads >= 10
    for which in (1, 2):
        assert mid["nodes"][f"c{which}"]["sent"] <= final["nodes"][f"c{which}"]["sent"]


RELEASE = threading.Event()  # lets Blocked's hook return (its group runs in this process)


class Blocked(mujou.Node):
    """Its first update blocks until `RELEASE` (bounded): every worker of its group busy."""

    inp = mujou.Input(int, depth=2)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.hooks: list[list[int]] = []  # what each update drained

    def on_update(self, dt: float) -> None:
        if not self.hooks:
            RELEASE.wait(60)
        self.hooks.append(list(self.inp.drain()))

    def state_dict(self) -> dict:
        return {"hooks": [list(h) for h in self.hooks]}


def make_blocked() -> dict[str, mujou.Node]:
    """A counter (one message every 2 ms) -> a reader whose first hook blocks."""
    net: dict[str, mujou.Node] = {"c1": placed_support.Counter(1, burst=1), "blk": Blocked()}
    mujou.connect(net["c1"].out, net["blk"].inp)
    return net


def test_what_comes_while_every_worker_is_busy_reaches_the_mailbox_not_the_socket() -> None:
    """The reading group's only worker blocks in a hook: its data-plane thread still moves
    what comes into the mailbox (`grouprt.COVER_MS`), where the Input's depth keeps the
    newest and counts the rest as dropped, instead of leaving it in the socket to push
    back on the sender."""
    RELEASE.clear()
    run = _start(make_blocked, {"c1": "a", "blk": "b"}, None)
    try:
        deadline = time.monotonic() + 30
        while run.stats().nodes["blk"].drops.get("inp", 0) < 20:
            assert time.monotonic() < deadline, "nothing reached the blocked reader's mailbox"
            time.sleep(0.01)
        drops = run.stats().nodes["blk"].drops["inp"]
    finally:
        RELEASE.set()
    try:
        while len(run.state_dict(timeout=10)["nodes"]["blk"]["hooks"]) < 2:  # the next update
            assert time.monotonic() < deadline, "the reader's second update did not run"
            time.sleep(0.01)
    finally:
        run.stop()
    hooks = [[v - placed_support.STRIDE for v in h]
             for h in run.state_dict()["nodes"]["blk"]["hooks"]]
    # The first message triggered the update that blocked; the next update got the two
    # newest of what came meanwhile, the rest dropped (depth 2).
    assert hooks[0][0] == 0 and len(hooks[0]) <= 2
    second = hooks[1]
    assert len(second) == 2 and second[1] - second[0] == 1 and second[0] >= drops


def test_peer_links_off_keeps_the_hosts_relay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(segments.ENV, "0")
    run = _start(make_counters, COUNTERS, 0.2)
    run.join(30)
    timing = run._driver.timing  # type: ignore[attr-defined]
    assert type(timing) is RealTimeRelay
    in_order_once(run.state_dict(), run.stats().nodes["k"].drops["a"])
    links = [g.link for g in run._driver.groups.values()]  # type: ignore[attr-defined]
    assert sum(link.messages_in for link in links) > 0  # through the host


def test_a_node_in_the_hosts_group_keeps_the_hosts_relay() -> None:
    run = _start(make_counters, {"c1": "a", "c2": "b"}, 0.2)  # k in the host's group
    run.join(30)
    timing = run._driver.timing  # type: ignore[attr-defined]
    assert isinstance(timing, PeerRelay) and not timing.live
    in_order_once(run.state_dict(), run.stats().nodes["k"].drops["a"])


def test_a_group_that_dies_is_restored_on_a_new_mesh_and_the_run_finished() -> None:
    # The group's death as the end's stats reach it: every group rewinds to the latest
    # snapshot, the mesh is reopened (generation 2), the run ends with its final state.
    system = DyingSystem(victim="a", kind=group.Stats)
    run = _start(make_counters, COUNTERS, 0.3, system=lambda start_timeout: system,
                 supervisor=mujou.Supervisor("one_for_all", snapshot_every=0.05))
    run.join(60)
    assert system.deaths == 1 and run.failure is None
    timing = run._driver.timing  # type: ignore[attr-defined]
    assert timing.live and timing.generation == 2
    final = run.state_dict()
    in_order_once(final, run.stats().nodes["k"].drops["a"])
    assert final["time_ns"] >= 300_000_000
    assert {n.restarts for n in run.stats().nodes.values()} == {1}


def test_a_killed_group_process_is_restored_and_every_message_is_once_in_the_end(
        tmp_path) -> None:
    """SIGKILL of a real group process (it kills itself at its 7th tick): the others may
    be blocked sending to it or waiting for its flush marker; the restore resets them,
    their links are given up, a new mesh opens, and the final tree is consistent."""
    marker = str(tmp_path / "crashed")
    run = mujou.run(placed_support.make_crashing,
                    placement=mujou.Placement({"crasher": "fragile", "count": "a", "sim": "a",
                                               "ctrl": "b", "log": "b"},
                                              net_kwargs={"marker": marker, "at": 7}),
                    timer="realtime", duration=0.5,
                    seed=7, supervisor=mujou.Supervisor("one_for_all", snapshot_every=0.05))
    run.join(120)
    assert os.path.exists(marker)  # it did crash, once
    assert run.failure is None
    timing = run._driver.timing  # type: ignore[attr-defined]
    assert isinstance(timing, PeerRelay) and timing.live and timing.generation >= 2
    final = run.state_dict()
    _every_message_once(final)
    got = final["nodes"]["count"]["got"] + final["pending"].get("count.inp", [])
    assert got == list(range(1, final["nodes"]["crasher"]["n"] + 1))
    stats = run.stats()
    assert stats.nodes["crasher"].restarts == 1 and stats.nodes["sim"].restarts == 1


# -- across machines (groups of this process standing in for them: TCP with CURVE) -----------

def test_groups_on_three_machines_send_straight_to_their_readers_over_curve() -> None:
    with across_machines():
        run = _start(make_counters, COUNTERS, 0.5)
        mid = run.state_dict(timeout=10)
        run.join(30)
    final = run.state_dict()
    drops = run.stats().nodes["k"].drops["a"]
    timing = run._driver.timing  # type: ignore[attr-defined]
    assert isinstance(timing, PeerRelay) and timing.live and timing.unreachable is None
    assert (timing.cross.opened, timing.cross.links) == (1, 3)
    servers = run._driver.system.servers  # type: ignore[attr-defined]
    assert {e.partition("://")[0] for s in servers.values() for e in s._mesh.endpoints.values()
            } == {"tcp"}
    in_order_once(final, drops)
    assert final["nodes"]["c2"]["sent"] >= 30
    for which in (1, 2):
        assert mid["nodes"][f"c{which}"]["sent"] <= final["nodes"][f"c{which}"]["sent"]
    # Nothing through the host: its links carried no port message, its driver routed none.
    links = [g.link for g in run._driver.groups.values()]  # type: ignore[attr-defined]
    assert sum(link.messages_in for link in links) == 0 and run._driver.relayed == 0
    groups = run.stats().groups
    sent = [final["nodes"][c]["sent"] for c in ("c1", "c2")]
    assert [groups["a"].messages_out, groups["b"].messages_out] == sent
    assert groups["c"].messages_in == sum(sent)
    # c notes the ages of what comes from each other machine (a, b), once told their
    # timers' origins, on its one clock here: each raw age is a true age.
    ages = servers["c"]._peer_ages
    assert set(ages) == {"a", "b"} and servers["a"]._peer_ages == {}
    for machine, c in (("a", "c1"), ("b", "c2")):
        raw = ages[machine].raw()
        assert 0 < len(raw) <= min(final["nodes"][c]["sent"], peers.AGE_SAMPLES)
        assert all(0 < a < 1_000_000_000 for a in raw)


def test_a_group_that_dies_across_machines_is_restored_on_new_links_between_them() -> None:
    system = DyingSystem(victim="a", kind=group.Stats)
    with across_machines():
        run = _start(make_counters, COUNTERS, 0.3, system=lambda start_timeout: system,
                     supervisor=mujou.Supervisor("one_for_all", snapshot_every=0.05))
        run.join(60)
    assert system.deaths == 1 and run.failure is None
    timing = run._driver.timing  # type: ignore[attr-defined]
    assert timing.live and timing.generation == 2
    assert (timing.cross.opened, timing.cross.links) == (2, 6)  # made again for the new mesh
    final = run.state_dict()
    in_order_once(final, run.stats().nodes["k"].drops["a"])
    assert final["time_ns"] >= 300_000_000
    assert run._driver.relayed == 0  # type: ignore[attr-defined]
    # The restart's new timers were told to c with the new mesh (its ages go on).
    c = system.servers["c"]
    assert c._peer_clocks[0] == 2 and set(c._peer_clocks[1]) == {"a", "b"}
    assert c._peer_ages["a"].count > 0 and c._peer_ages["b"].count > 0


def test_a_link_between_machines_that_cannot_be_made_keeps_the_hosts_relay(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(peers.CrossLinks, "_host", lambda self, m, toward: "192.0.2.1")
    with across_machines(), caplog.at_level("WARNING", "mujou_actors"):
        run = _start(make_counters, COUNTERS, 0.2)
        run.join(30)
    timing = run._driver.timing  # type: ignore[attr-defined]
    assert isinstance(timing, PeerRelay) and not timing.live and timing.cross.opened == 0
    assert "could not listen for its peer links on ['192.0.2.1']" in timing.unreachable
    assert [r.getMessage() for r in caplog.records if "relays every message" in r.message]
    in_order_once(run.state_dict(), run.stats().nodes["k"].drops["a"])
    links = [g.link for g in run._driver.groups.values()]  # type: ignore[attr-defined]
    assert sum(link.messages_in for link in links) > 0  # through the host
    assert run._driver.relayed > 0  # type: ignore[attr-defined]
