"""Input synchronizers: ExactTime and ApproximateTime (mujou_actors/sync.py, docs/sync.md)."""

from __future__ import annotations

import importlib.util
import io
import logging
import pathlib
from contextlib import redirect_stdout
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mujou_actors as mujou
from mujou_actors.errors import NetError, NodeError
from tests.placed_support import InProcessSystem
from tests.replay_support import record

ROOT = pathlib.Path(__file__).resolve().parent.parent


# -- the nets -----------------------------------------------------------------------------


class Sensor(mujou.Node):
    """Sends ``(name, count)`` every period."""

    out = mujou.Output(tuple)

    def __init__(self, name: str, period: float) -> None:
        super().__init__(period=period)
        self.name, self.n = name, 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.out.send((self.name, self.n))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "n": self.n}


class Fuse(mujou.Node):
    """Keeps every matched set, as ``[camera message, imu message]`` lists, in its state."""

    def __init__(self, policy: str = "approximate", *, period: float | None = None,
                 trigger: bool | None = None, callback: bool = False, slop: float = 0.002,
                 queue: int = 10) -> None:
        super().__init__(period=period)
        self.camera = mujou.Input(tuple, trigger=trigger)
        self.imu = mujou.Input(tuple, trigger=trigger)
        on_set = self.on_set if callback else None
        if policy == "exact":
            self.sync: Any = mujou.ExactTime(self.camera, self.imu, queue=queue,
                                             callback=on_set)
        else:
            self.sync = mujou.ApproximateTime(self.camera, self.imu, slop=slop, queue=queue,
                                              callback=on_set)
        self.sets: list[list[list[Any]]] = []
        self.updates_seen: list[int] = []  # sets matched when each on_update began

    def on_set(self, camera: tuple, imu: tuple) -> None:
        self.sets.append([list(camera), list(imu)])

    def on_update(self, dt: float) -> None:
        self.updates_seen.append(len(self.sets))
        for camera, imu in self.sync.drain():
            self.sets.append([list(camera), list(imu)])

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["sets"] = [list(s) for s in self.sets]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.sets = [list(s) for s in state.pop("sets")]
        super().load_state_dict(state)


def make_rig(policy: str = "approximate", camera: float = 1 / 30, imu: float = 0.004,
             fuse_class: type[Fuse] = Fuse, **fuse: Any) -> dict[str, mujou.Node]:
    """camera and imu -> fuse (a module-level factory: a placed run builds it by name)."""
    net = {"camera": Sensor("c", camera), "imu": Sensor("i", imu),
           "fuse": fuse_class(policy, **fuse)}
    mujou.connect(net["camera"].out, net["fuse"].camera)
    mujou.connect(net["imu"].out, net["fuse"].imu)
    return net


def make_periodic_rig() -> dict[str, mujou.Node]:
    """make_rig with a 10 ms fuse whose Inputs never trigger it: messages wait at every cut."""
    return make_rig(period=0.01, trigger=False)


def run_rig(net: dict[str, mujou.Node], duration: float = 0.3, **kwargs: Any) -> mujou.Run:
    run = mujou.run(net, timer="simulated", duration=duration, seed=0, **kwargs)
    run.join()
    return run


class Pair(mujou.Node):
    """Three Inputs for the policies alone, fed by hand (no run)."""

    a = mujou.Input(object)
    b = mujou.Input(object)
    c = mujou.Input(object)

    def __init__(self) -> None:
        super().__init__(period=None)


def policy(cls: type, n: int = 2, **kwargs: Any) -> Any:
    node = Pair()
    node.sync = cls(*(node.a, node.b, node.c)[:n], **kwargs)
    return node.sync


def feed(sync: Any, arrivals: list[tuple[int, int]]) -> list[tuple[int, ...]]:
    """Each ``(input index, stamp)`` into the policy, in order, the stamp as message."""
    for i, stamp in arrivals:
        sync._match(i, stamp, stamp)
    return sync.drain()


# -- ExactTime -----------------------------------------------------------------------------


def test_exact_time_pairs_the_messages_sent_at_the_same_time() -> None:
    net = make_rig("exact", camera=0.01, imu=0.004)

    run = run_rig(net, duration=0.1)

    assert net["fuse"].sets == [[["c", 2], ["i", 5]], [["c", 4], ["i", 10]],
                                [["c", 6], ["i", 15]], [["c", 8], ["i", 20]],
                                [["c", 10], ["i", 25]]]
    stats = net["fuse"].sync.stats()
    assert stats.matched == 5
    assert stats.dropped == {"camera": 5, "imu": 20}  # the odd camera ticks, the other imu ones
    assert run.stats().nodes["fuse"].drops == {"camera": 5, "imu": 20}


def test_a_slow_periodic_node_s_synchronizer_sees_every_message_that_waited_for_it() -> None:
    # 100 imu messages wait for each tick: far over the mailbox's bound for depth=1
    net = make_rig("exact", camera=0.01, imu=0.001, period=0.1, trigger=False, queue=200)

    run = run_rig(net, duration=0.3)

    assert len(net["fuse"].sets) == 29  # every camera message but the one sent at 0.3 s
    assert net["fuse"].camera.depth is None
    assert run.stats().nodes["fuse"].drops == {"camera": 0, "imu": 29 * 9}


def test_exact_time_drops_what_a_later_match_passed_and_a_replaced_stamp() -> None:
    sync = policy(mujou.ExactTime, queue=10)

    sets = feed(sync, [(0, 10), (1, 10), (0, 20), (1, 15), (1, 15), (0, 30), (1, 30),
                       (1, 25)])

    assert sets == [(10, 10), (30, 30)]
    # a's 20 and b's first 15 (replaced by the second), then the second 15 (older than 30),
    # and b's 25, stamped before the latest set
    assert sync.stats().dropped == {"a": 1, "b": 3}


def test_exact_time_over_its_queue_drops_the_oldest_waiting_message() -> None:
    net = make_rig("exact", camera=0.01, imu=1.0, queue=3)

    run = run_rig(net, duration=0.1)

    assert net["fuse"].sets == []
    assert run.stats().nodes["fuse"].drops == {"camera": 7, "imu": 0}  # 10 sent, 3 wait
    assert net["fuse"].sync.stats().dropped == {"camera": 7, "imu": 0}


# -- ApproximateTime: the algorithm ----------------------------------------------------------


def test_approximate_time_takes_for_each_pivot_the_smallest_set() -> None:
    sync = policy(mujou.ApproximateTime, queue=10)

    sets = feed(sync, [(1, 8), (0, 10), (1, 11), (1, 19), (0, 20), (1, 22)])

    # 10 is the pivot: 11 beats 8; then 20, for which 19 beats 22
    assert sets == [(10, 11), (20, 19)]
    assert sync.stats().dropped == {"a": 0, "b": 1}
    assert sync.stats().matched == 2


def test_approximate_time_hands_a_set_over_once_no_later_message_could_beat_it() -> None:
    sync = policy(mujou.ApproximateTime, n=3, queue=10)

    # a has sent nothing after 5 when the set is proven: any a of 5 or later and the
    # pivot 10 span at least as much as (5, 10, 5), since b's next is 30
    sets = feed(sync, [(2, 4), (2, 5), (2, 30), (1, 10), (0, 5)])

    assert sets == [(5, 10, 5)]
    assert sync.stats().dropped == {"a": 0, "b": 0, "c": 1}  # c's 4: (5, 10, 5) is smaller


def test_approximate_time_waits_while_a_later_message_could_still_beat_the_candidate() -> None:
    sync = policy(mujou.ApproximateTime, queue=10)

    assert feed(sync, [(1, 9), (0, 10)]) == []  # b's next might come at 10
    assert feed(sync, [(1, 12)]) == [(10, 9)]
    assert len(sync) == 0


def test_approximate_time_with_slop_drops_what_no_set_within_it_can_hold() -> None:
    sync = policy(mujou.ApproximateTime, slop=2e-9, queue=10)

    sets = feed(sync, [(0, 10), (1, 20), (0, 21), (1, 30), (0, 40), (1, 41), (0, 50)])

    assert sets == [(21, 20), (40, 41)]
    assert sync.stats().dropped == {"a": 1, "b": 1}  # a's 10, b's 30
    assert sync.slop == 2e-9


def test_approximate_time_over_its_queue_drops_the_oldest_and_searches_again() -> None:
    sync = policy(mujou.ApproximateTime, queue=2)

    sets = feed(sync, [(0, 1), (0, 2), (0, 3), (1, 3)])

    assert sets == [(3, 3)]
    assert sync.stats().dropped == {"a": 2, "b": 0}  # 1 for the queue, then 2 by the match


def reference_sets(seqs: list[list[int]], slop: int | None,
                   ) -> tuple[list[tuple[int, ...]], list[int]]:
    """The sets of message_filters' ApproximateTime, from its wiki's rules, by brute force.

    After the previous set: while the earliest messages of the Inputs span more than
    ``slop``, the earliest of them is dropped. Their latest (the last Input of equals) is
    the pivot, in the next set; for every time s up to the pivot's, the window of each
    Input's first message at s or later; the smallest window wins (the earliest of
    equals); what precedes it is dropped.
    """
    n = len(seqs)
    pos, sets, drops = [0] * n, [], [0] * n
    while all(pos[k] < len(seqs[k]) for k in range(n)):
        heads = [seqs[k][pos[k]] for k in range(n)]
        if slop is not None and max(heads) - min(heads) > slop:
            first = heads.index(min(heads))
            pos[first] += 1
            drops[first] += 1
            continue
        pivot = max(range(n), key=lambda k: (heads[k], k))
        best: tuple[int, list[int]] | None = None
        for s in sorted({t for k in range(n) for t in seqs[k][pos[k]:] if t <= heads[pivot]}):
            window = [next(j for j in range(pos[k], len(seqs[k])) if seqs[k][j] >= s)
                      for k in range(n)]
            stamps = [seqs[k][window[k]] for k in range(n)]
            if best is None or max(stamps) - min(stamps) < best[0]:
                best = (max(stamps) - min(stamps), window)
        assert best is not None
        for k in range(n):
            drops[k] += best[1][k] - pos[k]
            pos[k] = best[1][k] + 1
        sets.append(tuple(seqs[k][best[1][k]] for k in range(n)))
    return sets, drops


@st.composite
def arrivals(draw: Any) -> tuple[list[list[int]], list[int], int | None]:
    """Rising stamps per Input, each ending with one far later (so every set is decided),
    and an order of arrival that keeps each Input's order."""
    n = draw(st.integers(2, 3))
    seqs = [sorted(set(draw(st.lists(st.integers(0, 60), max_size=12)))) for _ in range(n)]
    for seq in seqs:
        seq.append(1000)
    order = draw(st.permutations([k for k in range(n) for _ in seqs[k]]))
    slop = draw(st.none() | st.integers(0, 20))
    return seqs, order, slop


@settings(max_examples=300, deadline=None)
@given(arrivals())
def test_approximate_time_gives_the_brute_force_sets_whatever_the_order_of_arrival(
        case: tuple[list[list[int]], list[int], int | None]) -> None:
    seqs, order, slop = case
    sync = policy(mujou.ApproximateTime, n=len(seqs), queue=100,
                  slop=None if slop is None else slop / 1e9)
    next_of = [iter(seq) for seq in seqs]

    sets = feed(sync, [(k, next(next_of[k])) for k in order])

    expected, drops = reference_sets(seqs, slop)
    assert sets == expected
    assert list(sync.stats().dropped.values()) == drops


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), max_size=10), min_size=2, max_size=3))
def test_exact_time_matches_every_stamp_all_inputs_have(stamps: list[list[int]]) -> None:
    seqs = [sorted(set(s)) for s in stamps]
    sync = policy(mujou.ExactTime, n=len(seqs), queue=100)
    arrivals_ = sorted((t, k) for k, seq in enumerate(seqs) for t in seq)

    sets = feed(sync, [(k, t) for t, k in arrivals_])

    common = sorted(set.intersection(*map(set, seqs)))
    assert sets == [(t,) * len(seqs) for t in common]
    last = common[-1] if common else None
    assert list(sync.stats().dropped.values()) == [
        sum(1 for t in seq if last is not None and t < last and t not in common)
        for seq in seqs]


# -- in a run -----------------------------------------------------------------------------


def test_approximate_time_in_a_run_matches_each_frame_with_the_nearest_imu_message(
        workers: int) -> None:
    net = make_rig()

    run = run_rig(net, workers=workers)

    sets = net["fuse"].sets
    # camera every 33.3 ms, imu every 4 ms: 32 ms beats 36, 68 beats 64, 100 is exact
    assert sets[:3] == [[["c", 1], ["i", 8]], [["c", 2], ["i", 17]], [["c", 3], ["i", 25]]]
    assert len(sets) == 8 and [c for (_, c), _ in sets] == list(range(1, 9))
    # 75 imu messages: 8 matched, the 75th (300 ms) waits to beat the candidate's 296
    assert run.stats().nodes["fuse"].drops == {"camera": 0, "imu": 66}


class StampedFuse(Fuse):
    """A `Fuse` that also keeps the stamp its synchronizer took each message in with."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stamps: dict[tuple, int] = {}  # message -> stamp (ns); no two messages are equal
        match = self.sync._match

        def taken(i: int, stamp: int, message: Any) -> None:
            self.stamps[message] = stamp
            match(i, stamp, message)

        # Every arrival goes through _match once, in the node's hook, with the stamp the
        # policy matches on: the send time, not a time the test assumes.
        self.sync._match = taken


def test_in_real_time_each_frame_meets_an_imu_message_sent_close_to_it() -> None:
    # A queue that holds every message of the run: the sets then depend on the stamps
    # alone, not on how late a busy machine delivers one Input's messages after the other's
    net = make_rig(fuse_class=StampedFuse, queue=1000)
    fuse = net["fuse"]

    run = mujou.run(net, timer="realtime", duration=0.5, seed=0, workers=2)
    run.join()

    # A busy machine makes the sensors skip ticks, so a message's count does not say when
    # it was sent: what is checked is the stamps each message arrived with.
    stamps, seqs = fuse.stamps, []
    for name, sensor in (("c", net["camera"]), ("i", net["imu"])):
        period = round(sensor.period * 1e9)
        sent = [stamps[m] for m in sorted(m for m in stamps if m[0] == name)]
        # the due time of a tick on the sender's grid (lateness skips ticks, never moves
        # one), rising with the count
        assert sent and all(t % period == 0 for t in sent)
        assert sent == sorted(set(sent))
        seqs.append(sent)
    slop = round(fuse.sync.slop * 1e9)
    assert slop == 2_000_000  # the rig's
    pairs = [(stamps[tuple(camera)], stamps[tuple(imu)]) for camera, imu in fuse.sets]
    assert len(pairs) >= 3
    # each frame with an imu message stamped within the slop of it; each Input's messages
    # in stamp order, none in two sets
    assert all(abs(camera - imu) <= slop for camera, imu in pairs)
    for k in (0, 1):
        assert [pair[k] for pair in pairs] == sorted({pair[k] for pair in pairs})
    # and exactly the policy's sets for those stamps (a message far later on each Input
    # decides the last, which the run may have left waiting for a message that never came)
    end = 10 ** 12
    expected, _ = reference_sets([seq + [end] for seq in seqs], slop)
    expected = [pair for pair in expected if end not in pair]
    assert pairs == expected[:len(pairs)] and len(expected) - len(pairs) <= 1


def test_the_sets_are_the_same_for_any_worker_count(workers: int) -> None:
    runs = {}
    for w in (1, workers):
        net = make_periodic_rig()
        run = run_rig(net, duration=0.5, workers=w)
        runs[w] = (net["fuse"].sets, run.stats().nodes["fuse"].drops, run.state_dict()["sync"])

    assert runs[workers] == runs[1]
    assert len(runs[1][0]) == 14


def test_a_callback_gets_each_set_in_the_node_s_update_before_on_update(
        caplog: pytest.LogCaptureFixture) -> None:
    net = make_rig(callback=True)

    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        run_rig(net, duration=0.1)

    fuse = net["fuse"]
    assert fuse.sets == [[["c", 1], ["i", 8]], [["c", 2], ["i", 17]]]
    assert fuse.sync.drain() == [] and fuse.sync.read() is None  # the callback took them
    # the update that follows a set's last message sees it already handed over
    assert fuse.updates_seen.count(2) >= 1 and fuse.updates_seen[-1] == 2
    assert "on_set is not a hook" not in caplog.text  # named like a hook, but called


def test_a_callback_that_raises_fails_the_node_in_on_update() -> None:
    net = make_rig(callback=True)

    def broken(camera: tuple, imu: tuple) -> None:
        raise RuntimeError("fusion failed")

    net["fuse"].sync._callback = broken
    run = mujou.run(net, timer="simulated", duration=0.1, seed=0)

    with pytest.raises(NodeError, match="'fuse' raised in on_update") as info:
        run.join()
    assert isinstance(info.value.__cause__, RuntimeError)


def test_read_returns_the_newest_set_and_unread_sets_pushed_out_are_counted() -> None:
    net = make_rig("exact", camera=0.01, imu=0.004, queue=2)
    net["fuse"].on_update = lambda dt: None  # never drains

    run_rig(net, duration=0.1)

    sync = net["fuse"].sync
    assert len(sync) == 2
    assert sync.read() == (("c", 10), ("i", 25))
    assert sync.stats().matched == 5 and sync.stats().sets_dropped == 3
    assert sync.drain() == [(("c", 8), ("i", 20)), (("c", 10), ("i", 25))]
    assert sync.read() is None and len(sync) == 0


def test_a_stamp_function_matches_the_time_messages_carry_not_their_send_time() -> None:
    net = make_rig("exact", camera=0.01, imu=0.004)
    fuse = net["fuse"]
    # the count of the camera (10 ms) and of the imu (4 ms) as a time: 1 ms each
    fuse.sync._stamp = lambda m: m[1] * 1e-3

    run_rig(net, duration=0.03)

    assert fuse.sets == [[["c", k], ["i", k]] for k in (1, 2, 3)]


def test_a_stamp_function_that_returns_no_number_fails_the_node_naming_the_input() -> None:
    net = make_rig()
    net["fuse"].sync._stamp = lambda m: "soon"
    run = mujou.run(net, timer="simulated", duration=0.1, seed=0)

    with pytest.raises(NodeError) as info:
        run.join()
    assert "stamp() returned 'soon' for a message of 'fuse." in str(info.value.__cause__)


def test_inputs_given_at_the_start_are_stamped_with_the_start_time() -> None:
    net = make_rig("exact", camera=1.0, imu=1.0)

    tree = run_rig(net, duration=0.1, inputs={"fuse.camera": ("w", 0),
                                              "fuse.imu": ("w", 0)}).state_dict()
    restored = run_rig(make_rig("exact", camera=1.0, imu=1.0), duration=0.0, state=tree,
                       inputs={"fuse.camera": ("w", 1)}).state_dict()

    assert net["fuse"].sets == [[["w", 0], ["w", 0]]]
    assert restored["sync"]["fuse.sync"]["queued"] == [[0, 100_000_000, ("w", 1)]]


# -- state, restore, replay, placement ----------------------------------------------------


@pytest.mark.parametrize("policy_", ["exact", "approximate"])
def test_a_run_restored_from_a_file_mid_search_gives_the_sets_of_the_whole_run(
        tmp_path: pathlib.Path, policy_: str) -> None:
    camera = 0.01 if policy_ == "exact" else 1 / 30
    whole = make_rig(policy_, camera=camera, period=0.01, trigger=False)
    run_rig(whole, duration=1.0)
    first = make_rig(policy_, camera=camera, period=0.01, trigger=False)
    run = run_rig(first, duration=0.505)
    tree = run.state_dict()
    mujou.save(tree, tmp_path / "half.mujou")

    second = make_rig(policy_, camera=camera, period=0.01, trigger=False)
    run_rig(second, duration=0.495, state=tmp_path / "half.mujou")

    assert second["fuse"].sets == whole["fuse"].sets
    assert len(whole["fuse"].sets) > 20
    # the cut held messages on their way (send time and message) and waiting ones
    assert tree["pending"]["fuse.imu"] == [(500_000_000, ("i", 125)), (504_000_000, ("i", 126))]
    assert tree["sync"]["fuse.sync"]["queued"]


def test_check_restore_finds_the_synchronizer_restores() -> None:
    found = mujou.testing.check_restore(make_periodic_rig, at=0.25, duration=0.5)

    assert found.ok, found


def test_a_one_for_all_restart_rewinds_the_synchronizer_with_the_net() -> None:
    class Flaky(Fuse):
        failed = False

        def on_update(self, dt: float) -> None:
            super().on_update(dt)
            if len(self.sets) >= 6 and not Flaky.failed:
                Flaky.failed = True
                raise RuntimeError("once")

    whole = make_periodic_rig()
    run_rig(whole, duration=0.5)
    net = make_rig(fuse_class=Flaky, period=0.01, trigger=False)

    run = run_rig(net, duration=0.5,
                  supervisor=mujou.Supervisor("one_for_all", snapshot_every=0.1))

    assert run.stats().nodes["fuse"].restarts == 1
    assert net["fuse"].sets == whole["fuse"].sets


def test_a_replay_of_the_sensors_gives_the_sets_of_the_recorded_run(
        tmp_path: pathlib.Path) -> None:
    recorded = make_rig()
    record(recorded, str(tmp_path / "rig.mcap"), timer="simulated", duration=0.5, seed=0)
    replayed = make_rig()

    run = mujou.run(replayed, timer="simulated", duration=0.5,
                    replay=mujou.Replay(tmp_path / "rig.mcap", replace=["camera", "imu"]))
    run.join()

    assert replayed["fuse"].sets == recorded["fuse"].sets
    assert len(recorded["fuse"].sets) == 14
    assert replayed["camera"].n == 0  # the sensors did not run


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_placed_run_gives_the_sets_of_one_process() -> None:
    from mujou_actors._runtime.build import Seams
    from mujou_actors.distributed import placed
    from mujou_actors.run import _check_arguments

    one_run = run_rig(make_periodic_rig(), duration=0.5)
    one = one_run.state_dict()
    args = _check_arguments(Seams(), workers=1, timer="simulated", duration=0.5, seed=0,
                            state=None, supervisor=None, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=10.0, start_timeout=60.0)
    run = placed.start(make_periodic_rig,
                       placement=mujou.Placement({"camera": "a", "imu": "b", "fuse": "c"}),
                       args=args, inputs=None, state=None, make_system=InProcessSystem)
    run.join()
    tree = run.state_dict()

    assert tree["nodes"]["fuse"]["sets"] == one["nodes"]["fuse"]["sets"]
    assert tree["sync"] == one["sync"]
    assert tree["pending"] == one["pending"]
    assert run.stats().nodes["fuse"].drops == one_run.stats().nodes["fuse"].drops == {
        "camera": 0, "imu": 110}
    assert len(tree["nodes"]["fuse"]["sets"]) == 14
    # each synchronizer's counts come back from its group as one process counts them
    assert run.stats().syncs == one_run.stats().syncs
    assert run.stats().syncs["fuse.sync"].matched == 14


# -- declaring one wrongly -----------------------------------------------------------------


def test_bad_declarations_raise_errors_that_say_what_was_expected() -> None:
    node, other = Pair(), Pair()
    cases = [
        (lambda: mujou.ApproximateTime(node.a, node.b, slop=-0.1), ValueError,
         "slop must be a finite number of seconds >= 0, got -0.1"),
        (lambda: mujou.ApproximateTime(node.a, node.b, slop="1"), TypeError,
         "slop must be a number of seconds or None"),
        (lambda: mujou.ExactTime(node.a, node.b, queue=0), ValueError,
         "queue must be an int >= 1, got 0"),
        (lambda: mujou.ExactTime(node.a, node.b, queue=1.5), TypeError, "queue must be an int"),
        (lambda: mujou.ExactTime(node.a), ValueError, "needs two Inputs or more"),
        (lambda: mujou.ExactTime(node.a, node.a), ValueError,
         "Input 'Pair.a' is given twice"),
        (lambda: mujou.ExactTime(node.a, mujou.Output(int)), TypeError,
         r"argument 1 \(Output\) is not an Input"),
        (lambda: mujou.ExactTime(node.a, other.b), ValueError,
         r"the Inputs \['Pair.a', 'Pair.b'\] belong to different nodes"),
        (lambda: mujou.ExactTime(node.a, node.b, callback=3), TypeError,
         "callback must be a callable or None"),
    ]
    for make, kind, message in cases:
        with pytest.raises(kind, match=message):
            make()
    node.sync = mujou.ExactTime(node.a, node.b)
    with pytest.raises(ValueError, match="Input 'Pair.b' already feeds ExactTime 'Pair.sync'"):
        mujou.ApproximateTime(node.b, node.c)


@pytest.mark.timeout(60)
def test_a_bad_declaration_names_the_node_class_and_the_attribute_where_known() -> None:
    # Inputs made in __init__ learn their node only as it returns: the statement tells.
    with pytest.raises(ValueError) as caught:
        make_rig(slop=-0.1)
    assert str(caught.value) == ("ApproximateTime 'Fuse.sync': slop must be a finite number "
                                 "of seconds >= 0, got -0.1")
    with pytest.raises(ValueError, match=r"^ExactTime 'Fuse.sync': queue must be an int >= 1, "
                                         r"got 0$"):
        make_rig("exact", queue=0)

    class Listed(mujou.Node):  # Inputs of the class, bound; not assigned to an attribute
        a = mujou.Input(int)
        b = mujou.Input(int)

        def __init__(self) -> None:
            super().__init__(period=None)
            self.syncs = [mujou.ExactTime(self.a, self.b, callback=3)]

    with pytest.raises(TypeError, match=r"^ExactTime of Listed: callback must be a callable "
                                        r"or None, got 3$"):
        Listed()
    node = Pair()  # outside a node's method: the node of the Inputs, the attribute assigned
    with pytest.raises(ValueError, match=r"^ExactTime 'Pair.sync': needs two Inputs or more"):
        node.sync = mujou.ExactTime(node.a)
    with pytest.raises(TypeError, match=r"^ExactTime: queue must be an int >= 1, got '1'$"):
        mujou.ExactTime(mujou.Input(int), mujou.Input(int), queue="1")


def test_a_synchronizer_its_node_does_not_hold_is_refused_before_the_run_starts() -> None:
    net = make_rig()
    holder = Pair()
    net["holder"] = holder
    fuse = net["fuse"]
    fuse.camera._sync = fuse.imu._sync = None
    holder.sync = mujou.ExactTime(fuse.camera, fuse.imu)  # another node holds it
    del fuse.sync

    with pytest.raises(NetError, match="ExactTime of \\['fuse.camera', 'fuse.imu'\\] is not an "
                                       "attribute of node 'fuse'"):
        mujou.run(net, timer="simulated", duration=0.1)
    assert fuse._mujou_run is None  # nothing was claimed


def test_inputs_of_two_nodes_are_refused_as_the_run_starts() -> None:
    net = make_rig()
    camera_reader = Pair()
    net["other"] = camera_reader

    class Split(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.inp = mujou.Input(tuple)  # not bound yet when the synchronizer is made
            self.sync = mujou.ExactTime(self.inp, camera_reader.a)

    net["split"] = Split()

    with pytest.raises(NetError, match="a synchronizer matches Inputs of one node"):
        mujou.run(net, timer="simulated", duration=0.1)


def test_a_synchronizer_whose_node_never_updates_is_warned_of(
        caplog: pytest.LogCaptureFixture) -> None:
    net = make_rig(trigger=False)

    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        run_rig(net, duration=0.05)

    assert "ApproximateTime 'fuse.sync': node 'fuse' has period=None and none of the " \
           "synchronized Inputs triggers it" in caplog.text


def test_a_tree_without_the_synchronizer_s_state_or_with_another_s_does_not_fit() -> None:
    tree = run_rig(make_rig(), duration=0.05).state_dict()
    exact = run_rig(make_rig("exact"), duration=0.05).state_dict()
    del tree["sync"]
    with pytest.raises(mujou.SnapshotError,
                       match=r"no state for synchronizer\(s\) \['fuse.sync'\]"):
        mujou.run(make_rig(), timer="simulated", duration=0.05, state=tree)

    tree["sync"] = exact["sync"]
    tree["pending"] = {"fuse.imu": [("i", 1)]}
    with pytest.raises(mujou.SnapshotError) as info:
        mujou.run(make_rig(), timer="simulated", duration=0.05, state=tree)

    assert "sync['fuse.sync'] is the state of a 'exact' policy, not 'approximate'" in str(
        info.value)
    assert "pending['fuse.imu'][0] is ('i', 1), not a pair (send time ns, message)" in str(
        info.value)


# -- the example ---------------------------------------------------------------------------


def test_the_fusion_example_pairs_frames_by_capture_time_within_the_slop() -> None:
    spec = importlib.util.spec_from_file_location("sync_fusion", ROOT / "examples" /
                                                  "sync_fusion.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = io.StringIO()

    with redirect_stdout(out):
        assert example.main(["--duration", "1", "--workers", "2"]) == 0

    lines = out.getvalue().splitlines()
    assert lines[0] == "camera and IMU fused: 1 s simulated"
    assert lines[1].split() == ["fusion", "by", "capture", "30", "pairs,", "offset", "from",
                                "capture", "mean", "1.22", "ms,", "max", "2.00", "ms;",
                                "dropped", "0", "frames,", "168", "readings"]
    assert "offset from capture mean 12.00 ms" in lines[2]


def test_a_synchronized_tensor_keeps_its_value_and_the_plain_inputs_carry_no_stamp() -> None:
    class Both(mujou.Node):
        x = mujou.Input(torch.Tensor)
        y = mujou.Input(torch.Tensor)
        plain = mujou.Input(torch.Tensor)

        def __init__(self) -> None:
            super().__init__(period=None)
            self.sync = mujou.ExactTime(self.x, self.y)
            self.got: list[Any] = []

        def on_update(self, dt: float) -> None:
            self.got += [("set", s) for s in self.sync.drain()]
            self.got += [("plain", m) for m in self.plain.drain()]

    class Emit(mujou.Node):
        out = mujou.Output(torch.Tensor)

        def __init__(self) -> None:
            super().__init__(period=0.01)

        def on_update(self, dt: float) -> None:
            self.out.send(torch.ones(2))

    emit, both = Emit(), Both()
    for port in (both.x, both.y, both.plain):
        mujou.connect(emit.out, port)

    run = mujou.run({"emit": emit, "both": both}, timer="simulated", duration=0.01)
    run.join()

    assert [kind for kind, _ in both.got] == ["set", "plain"]
    assert all(torch.equal(t, torch.ones(2)) for t in both.got[0][1])
    assert torch.equal(both.got[1][1], torch.ones(2))


# -- on (fake) CUDA --------------------------------------------------------------------------


def test_a_cuda_node_s_sets_and_restored_queues_are_on_its_device() -> None:
    from tests import fake_cuda

    gpu = torch.device("cuda", 0)

    class Emit(mujou.Node):
        out = mujou.Output(torch.Tensor)

        def __init__(self, rt: Any, period: float) -> None:
            super().__init__(period=period)
            self.rt, self.n = rt, 0

        def on_update(self, dt: float) -> None:
            self.n += 1
            self.out.send(self.rt.cuda(torch.full((2,), float(self.n)), self.device))

    class Join(mujou.Node):
        x = mujou.Input(torch.Tensor)
        y = mujou.Input(torch.Tensor)

        def __init__(self) -> None:
            super().__init__(period=None)
            self.sync = mujou.ExactTime(self.x, self.y)
            self.got: list[tuple[torch.device, list[float]]] = []

        def on_update(self, dt: float) -> None:
            for x, y in self.sync.drain():  # used on the node's stream: a stale read raises
                self.got.append((x.device, fake_cuda.shadow(x * 1).tolist()
                                 + fake_cuda.shadow(y * 1).tolist()))

    def net(rt: Any) -> dict[str, mujou.Node]:
        nodes = {"fast": Emit(rt, 0.01), "slow": Emit(rt, 0.02), "join": Join()}
        for node in nodes.values():
            node._mujou_device = gpu  # what device="cuda:0" gives on a machine with a GPU
        mujou.connect(nodes["fast"].out, nodes["join"].x)
        mujou.connect(nodes["slow"].out, nodes["join"].y)
        return nodes

    rt, _, start = fake_cuda.fakes()
    first = net(rt)
    run = start(first, timer="simulated", duration=0.03)
    run.join()
    tree = run.state_dict()
    rt2, _, start2 = fake_cuda.fakes()
    second = net(rt2)
    start2(second, timer="simulated", duration=0.0, state=tree).join()

    assert first["join"].got == [(gpu, [2.0, 2.0, 1.0, 1.0])]  # x's 2nd and y's 1st at 20 ms
    assert [(i, t) for i, t, _ in tree["sync"]["join.sync"]["queued"]] == [(0, 30_000_000)]
    assert tree["sync"]["join.sync"]["queued"][0][2].device.type == "cpu"  # the host's copy
    queued = second["join"].sync._q[0][30_000_000]
    assert queued.device == gpu and torch.equal(fake_cuda.shadow(queued), torch.full((2,), 3.0))


def test_run_stats_hold_each_synchronizer_s_counts() -> None:
    run = run_rig(make_periodic_rig(), duration=0.5)
    syncs = run.stats().syncs
    assert list(syncs) == ["fuse.sync"]
    assert syncs["fuse.sync"].matched == 14
    assert syncs["fuse.sync"].dropped == run.stats().nodes["fuse"].drops == {
        "camera": 0, "imu": 110}


# -- each set's stamps ---------------------------------------------------------------------


def test_read_and_drain_give_each_message_with_the_stamp_it_was_matched_on() -> None:
    sync = policy(mujou.ApproximateTime, slop=None)
    sync._attach()
    for i, stamp in [(0, 10), (1, 12), (0, 20), (1, 21), (0, 30), (1, 35)]:
        sync._match(i, stamp * 1_000_000, f"m{i}@{stamp}")
    assert sync.read(stamped=True) == ((0.02, "m0@20"), (0.021, "m1@21"))
    assert sync.read() == ("m0@20", "m1@21")
    assert sync.drain(stamped=True) == [((0.01, "m0@10"), (0.012, "m1@12")),
                                        ((0.02, "m0@20"), (0.021, "m1@21"))]
    assert sync.drain(stamped=True) == [] and sync.read(stamped=True) is None


def test_a_callback_reads_the_stamps_of_the_set_it_is_given() -> None:
    seen: list[tuple[Any, ...]] = []
    node = Pair()
    node.sync = mujou.ExactTime(node.a, node.b, callback=lambda a, b: seen.append(
        (a, b, node.sync.stamps)))
    node.sync._attach()
    for i, stamp in [(0, 5), (1, 7), (1, 5)]:
        node.sync._match(i, stamp * 1_000_000_000, f"m{i}")
    node.sync._settle()
    assert seen == [("m0", "m1", (5.0, 5.0))]
    assert node.sync.stamps is None  # outside the callback


def test_the_stamps_of_kept_sets_survive_a_snapshot_and_an_old_tree_without_them_loads(
        tmp_path: pathlib.Path) -> None:
    class Keep(Fuse):
        def on_update(self, dt: float) -> None:  # leaves the sets in the synchronizer
            pass

    net = make_rig(fuse_class=Keep, period=0.01, trigger=False, queue=100)
    run = run_rig(net, duration=0.2)
    tree = run.state_dict()
    entry = tree["sync"]["fuse.sync"]
    assert len(entry["set_stamps"]) == len(entry["sets"]) > 3
    assert all(abs(c - i) <= 2_000_000 for c, i in entry["set_stamps"])  # within the slop

    again = make_rig(fuse_class=Keep, period=0.01, trigger=False, queue=100)
    restored = mujou.run(again, timer="simulated", duration=0.0, state=tree)
    restored.join()
    kept = again["fuse"].sync.drain(stamped=True)
    assert [[round(t * 1e9) for t, _ in s] for s in kept][:len(entry["sets"])] == \
        entry["set_stamps"]

    old = dict(tree, sync={"fuse.sync": {k: v for k, v in entry.items()
                                         if k != "set_stamps"}})
    older = make_rig(fuse_class=Keep, period=0.01, trigger=False, queue=100)
    mujou.run(older, timer="simulated", duration=0.0, state=old).join()
    assert older["fuse"].sync.drain(stamped=True)[0][0][0] is None  # unknown, not invented


def test_a_synchronizer_of_inputs_that_are_not_its_node_s_own_is_refused_as_the_run_starts(
        ) -> None:
    class Templates(mujou.Node):
        a = mujou.Input(int)
        b = mujou.Input(int)

        def __init__(self) -> None:
            super().__init__(period=None)
            self.sync = mujou.ExactTime(Templates.a, Templates.b)  # the class's, not its own

    class Loose(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.sync = mujou.ExactTime(mujou.Input(int), mujou.Input(int))  # never assigned

    for node in (Templates(), Loose()):
        with pytest.raises(NetError, match="node '<root>': its ExactTime 'sync' matches Inputs "
                                           "that are not the node's own"):
            mujou.run(node, timer="simulated", duration=0.1)
        assert node.path is None  # a refused run leaves the node as it was


def test_the_command_line_s_stats_json_holds_the_synchronizers() -> None:
    from mujou_actors.cli import _stats_json

    out = _stats_json(run_rig(make_periodic_rig(), duration=0.5).stats())
    assert out["syncs"] == {"fuse.sync": {"path": "fuse.sync", "matched": 14,
                                          "dropped": {"camera": 0, "imu": 110},
                                          "sets_dropped": 0}}
