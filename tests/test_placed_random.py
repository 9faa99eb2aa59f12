"""Property tests: a placed run of a random net is bit-identical to the single-process run.

For random nets (tests/random_nets.py: periodic and triggered nodes, fan-in,
fan-out, cycles, nested nodes, small QoS depths with drops, several messages
per hook, ints, floats, tensors and containers, on_start sends), random
placements into groups and random worker counts, the placed run (its groups
served in this process, the data plane over ZeroMQ: `InProcessSystem`) ends
with the state tree, drops and update counts of one process; a cut taken
while it runs goes on as one process does; a node that fails once restarts
as in one process under both strategies. The defects these properties found
are each kept below as a minimal test.

``MUJOU_RANDOM_EXAMPLES`` scales the number of examples (CI keeps the
default small; a hunt for defects runs thousands).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mujou_actors as mujou
from mujou_actors._runtime.build import Seams
from mujou_actors.distributed import placed
from mujou_actors.errors import NotRunningError
from mujou_actors.run import _check_arguments
from tests import random_nets
from tests.placed_support import InProcessSystem
from tests.random_nets import make_random_net, nets, placements
from tests.test_placed import assert_same_tree

SCALE = float(os.environ.get("MUJOU_RANDOM_EXAMPLES", "1"))


def _examples(n: int) -> int:
    """``n`` examples, scaled by ``MUJOU_RANDOM_EXAMPLES``."""
    return max(1, round(n * SCALE))


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                      HealthCheck.data_too_large])


def _args(duration: float | None, *, workers: int, seed: int, state: dict | None = None,
          supervisor: mujou.Supervisor | None = None) -> Any:
    """`mujou.run`'s checked arguments for a simulated placed run."""
    return _check_arguments(Seams(), workers=workers, timer="simulated", duration=duration,
                            seed=seed, state=state, supervisor=supervisor, trace=None,
                            cuda_sync="block", stats=True, stop_timeout=10.0,
                            start_timeout=60.0)


def _single(desc: dict, duration: float, *, seed: int, workers: int = 1,
            state: dict | None = None, supervisor: mujou.Supervisor | None = None,
            inputs: dict | None = None) -> tuple[dict, Any]:
    """The single-process run of ``desc``: its final tree and stats."""
    with mujou.run(make_random_net(**desc), timer="simulated", duration=duration, seed=seed,
                   workers=workers, state=state, supervisor=supervisor,
                   inputs=_values(inputs)) as run:
        run.join(60)
    return run.state_dict(), run.stats()


def _placed(desc: dict, placement: dict, duration: float | None, *, seed: int, workers: int,
            state: dict | None = None, supervisor: mujou.Supervisor | None = None,
            inputs: dict | None = None) -> placed.PlacedRun:
    """A placed run of ``desc``, its groups served in this process."""
    return placed.start(make_random_net, placement=mujou.Placement(placement, net_kwargs=desc),
                        args=_args(duration, workers=workers, seed=seed, state=state,
                                   supervisor=supervisor),
                        inputs=_values(inputs), state=state, make_system=InProcessSystem)


def _values(inputs: dict | None) -> dict | None:
    """``inputs=`` from Input paths and their types' names: a value of each (fresh)."""
    if inputs is None:
        return None
    make = {"int": lambda: 5, "float": lambda: 2.5, "tensor": lambda: torch.arange(2.0),
            "object": lambda: (3, torch.ones(2, dtype=torch.float64))}
    return {path: make[kind]() for path, kind in inputs.items()}


def _placed_end(desc: dict, placement: dict, duration: float, *, seed: int, workers: int,
                state: dict | None = None, supervisor: mujou.Supervisor | None = None,
                inputs: dict | None = None) -> tuple[dict, Any]:
    """A placed run of ``desc`` to its end: its final tree and stats (stopped whatever
    happens, so that a failed example leaves no run behind)."""
    run = _placed(desc, placement, duration, seed=seed, workers=workers, state=state,
                  supervisor=supervisor, inputs=inputs)
    try:
        run.join(60)
    finally:
        run.stop()
    return run.state_dict(), run.stats()


def _assert_same_counts(got: Any, expected: Any) -> None:
    """Every node's updates, drops (per Input) and restarts equal."""
    assert list(got.nodes) == list(expected.nodes)
    for path, want in expected.nodes.items():
        have = got.nodes[path]
        assert have.updates == want.updates, path
        assert have.drops == want.drops, path
        assert have.restarts == want.restarts, path


@st.composite
def _placed_nets(draw: st.DrawFn, nested: bool = True) -> tuple[dict, dict, dict]:
    """A random net, a placement of it, and ``inputs=`` for some of its Inputs (path ->
    the Input's type)."""
    desc = draw(nets(nested=nested))
    ins = {f"{n['path']}.i{k}": spec[0] for n in desc["nodes"] for k, spec in enumerate(n["ins"])}
    chosen = draw(st.lists(st.sampled_from(sorted(ins)), unique=True, max_size=3)
                  if ins else st.just([]))
    return desc, draw(placements(desc)), {p: ins[p] for p in chosen}


@pytest.mark.timeout(120 * max(1.0, SCALE))
@settings(max_examples=_examples(40), **SETTINGS)
@given(net=_placed_nets(), workers=st.integers(1, 3), single_workers=st.integers(1, 3),
       duration_ms=st.integers(1, 20), seed=st.integers(0, 2**32))
def test_a_placed_random_net_ends_bit_identical_to_one_process(
        net: tuple[dict, dict, dict], workers: int, single_workers: int, duration_ms: int,
        seed: int) -> None:
    """Any placement, any worker counts (here and in one process), ``inputs=`` written
    before the start: the same final tree, and the same updates and drops of every node."""
    desc, placement, inputs = net
    duration = duration_ms / 1000
    expected, expected_stats = _single(desc, duration, seed=seed, workers=single_workers,
                                       inputs=inputs)
    got, stats = _placed_end(desc, placement, duration, seed=seed, workers=workers,
                             inputs=inputs)
    assert_same_tree(got, expected)
    _assert_same_counts(stats, expected_stats)


@st.composite
def _clocked_nets(draw: st.DrawFn) -> tuple[dict, dict, dict]:
    """A random net with a periodic int source ``clock`` feeding some of its Inputs, and two
    placements of it."""
    desc = draw(nets(max_top=4))
    nodes = [*desc["nodes"], {"path": "clock", "period_us": draw(st.sampled_from([1000, 2000])),
                              "outs": ["int"], "ins": [], "sends": 1, "burst": 1,
                              "start": False}]
    edges = list(desc["edges"])
    readers = [(i, k) for i, n in enumerate(nodes) for k, spec in enumerate(n["ins"])
               if spec[0] in ("int", "float", "object")]
    for i, k in draw(st.lists(st.sampled_from(readers), unique=True, max_size=3)
                     if readers else st.just([])):
        edges.append([len(nodes) - 1, 0, i, k])
    desc = {"nodes": nodes, "edges": edges}
    return desc, draw(placements(desc)), draw(placements(desc))


@pytest.mark.timeout(120 * max(1.0, SCALE))
@settings(max_examples=_examples(12), **SETTINGS)
@given(net=_clocked_nets(), workers=st.integers(1, 3), ticks=st.integers(1, 8),
       duration_ms=st.one_of(st.none(), st.integers(30, 200)), more_ms=st.integers(1, 10),
       seed=st.integers(0, 2**32))
def test_a_cut_of_a_running_placed_random_net_goes_on_as_one_process(
        net: tuple[dict, dict, dict], workers: int, ticks: int, duration_ms: int | None,
        more_ms: int, seed: int) -> None:
    """A state_dict taken while a placed run runs is the single run's state at that time;
    restored (in one process, or another placement) it goes on as one run; and the run
    itself goes on undisturbed by it and by other host calls (subscribe, stats, read, a
    second cut): to its duration, or stopped, ending at a consistent cut."""
    desc, placement, other = net
    duration = None if duration_ms is None else duration_ms / 1000
    run = _placed(desc, placement, duration, seed=seed, workers=workers)
    try:
        count = iter(range(ticks))
        try:
            run.wait_for("clock.o0", lambda v: next(count, None) is None, timeout=30)
        except NotRunningError:  # a short run may end first: the cut is then its end
            assert duration is not None
        tree = run.state_dict(timeout=30)
        seen: list[int] = []
        if run.running:  # host calls between two cuts change nothing either
            run.subscribe("clock.o0", seen.append)
            run.stats()
            run.read("clock.o0")
        second = run.state_dict(timeout=30)
        if duration is not None:
            run.join(60)
    finally:
        run.stop()
    run.join(30)
    t = tree["time_ns"]
    assert t >= ticks * 1_000_000 and second["time_ns"] >= t
    at_cut, _ = _single(desc, t / 1e9, seed=seed)
    assert_same_tree(tree, at_cut)
    if second["time_ns"] != t:
        at_second, _ = _single(desc, second["time_ns"] / 1e9, seed=seed)
        assert_same_tree(second, at_second)
    final = run.state_dict()
    assert duration is None or final["time_ns"] == round(duration * 1e9)
    at_end, _ = _single(desc, final["time_ns"] / 1e9, seed=seed)
    assert_same_tree(final, at_end)
    more = more_ms / 1000
    expected, expected_stats = _single(desc, (t + more_ms * 1_000_000) / 1e9, seed=seed)
    restored, _ = _single(desc, more, seed=seed, state=tree)
    assert_same_tree(restored, expected)
    again, _ = _placed_end(desc, other, more, seed=seed, workers=workers, state=tree)
    assert_same_tree(again, expected)


@st.composite
def _failing_nets(draw: st.DrawFn) -> tuple[dict, dict]:
    """A random net one or two of whose nodes fail once each, at an early update; a
    placement."""
    desc = draw(nets())
    nodes = [dict(n) for n in desc["nodes"]]
    for i in draw(st.lists(st.sampled_from(range(len(nodes))), min_size=1, max_size=2,
                           unique=True)):
        nodes[i]["fail_at"] = draw(st.integers(1, 6))
    desc = {"nodes": nodes, "edges": desc["edges"]}
    return desc, draw(placements(desc))


def _supervised_single(desc: dict, duration: float, seed: int,
                       supervisor: mujou.Supervisor) -> tuple[dict, Any]:
    """`_single` with a supervisor, the failure count reset."""
    random_nets.reset_failures()
    return _single(desc, duration, seed=seed, supervisor=supervisor)


@pytest.mark.timeout(120 * max(1.0, SCALE))
@settings(max_examples=_examples(20), **SETTINGS)
@given(net=_failing_nets(), strategy=st.sampled_from(["one_for_all", "one_for_one"]),
       every_us=st.sampled_from([1000, 2000, 3000, 2500]), workers=st.integers(1, 3),
       duration_ms=st.integers(2, 15), seed=st.integers(0, 2**32))
def test_a_placed_random_net_with_a_node_that_fails_once_restarts_as_one_process(
        net: tuple[dict, dict], strategy: str, every_us: int, workers: int, duration_ms: int,
        seed: int) -> None:
    """Nodes failing once each (process-wide: the groups run in this process) restart
    under one_for_all and one_for_one as in one process: the same final tree, counts,
    restarts and snapshots."""
    desc, placement = net
    duration = duration_ms / 1000

    def supervisor() -> mujou.Supervisor:
        return mujou.Supervisor(strategy, snapshot_every=every_us / 1e6)

    expected, expected_stats = _supervised_single(desc, duration, seed, supervisor())
    random_nets.reset_failures()
    got, stats = _placed_end(desc, placement, duration, seed=seed, workers=workers,
                             supervisor=supervisor())
    assert_same_tree(got, expected)
    _assert_same_counts(stats, expected_stats)
    assert stats.snapshots.count == expected_stats.snapshots.count


@st.composite
def _failing_clocked_nets(draw: st.DrawFn) -> tuple[dict, dict]:
    """A random net with a ``clock`` (`_clocked_nets`), up to two of its nodes failing once."""
    desc, placement, _ = draw(_clocked_nets())
    nodes = [dict(n) for n in desc["nodes"]]
    for i in draw(st.lists(st.sampled_from(range(len(nodes))), max_size=2, unique=True)):
        nodes[i]["fail_at"] = draw(st.integers(1, 6))
    return {"nodes": nodes, "edges": desc["edges"]}, placement


@pytest.mark.timeout(120 * max(1.0, SCALE))
@settings(max_examples=_examples(12), **SETTINGS)
@given(net=_failing_clocked_nets(), every_us=st.sampled_from([1000, 2000, 2500]),
       ticks=st.integers(1, 12), workers=st.integers(1, 3), seed=st.integers(0, 2**32))
def test_a_cut_of_a_supervised_placed_random_net_is_one_processs_state(
        net: tuple[dict, dict], every_us: int, ticks: int, workers: int, seed: int) -> None:
    """A cut of a running placed run whose nodes fail and restart (one_for_all: the net
    rewinds) is one process's state at the cut's time (which never saw a failure before
    it, or ends as if it had not), also when a hook fails on the way to the cut (the
    supervisor restarts it, then the cut is taken: the driver's private failure reached
    state_dict() and the node was never restarted)."""
    desc, placement = net

    def supervisor() -> mujou.Supervisor:
        return mujou.Supervisor("one_for_all", snapshot_every=every_us / 1e6)

    random_nets.reset_failures()
    run = _placed(desc, placement, None, seed=seed, workers=workers, supervisor=supervisor())
    try:
        count = iter(range(ticks))
        run.wait_for("clock.o0", lambda v: next(count, None) is None, timeout=30)
        tree = run.state_dict(timeout=30)
    finally:
        run.stop()
    with contextlib.suppress(mujou.NodeError):  # a failure in the stop's last instant
        run.join(30)
    expected, _ = _supervised_single(desc, tree["time_ns"] / 1e9, seed, supervisor())
    assert_same_tree(tree, expected)


# -- the defects the properties found, each minimised ------------------------------------

def _spec(path: str, period_us: int | None = None, outs: tuple = (), ins: tuple = (),
          sends: int = 1, start: bool = False, **more: Any) -> dict:
    """A node's description (see tests/random_nets.py)."""
    return {"path": path, "period_us": period_us, "outs": list(outs),
            "ins": [list(i) for i in ins], "sends": sends, "burst": 1, "start": start, **more}


@pytest.mark.timeout(60)
def test_a_child_placed_in_another_group_runs_only_there() -> None:
    """A path placed elsewhere than its parent's is no longer run by the parent's group too
    (each kernel ran its roots' whole subtrees: ``n1.c1`` ran twice, its on_start sent twice)."""
    desc = {"nodes": [_spec("n0", ins=[("float", None, None, "drain")]), _spec("n1"),
                      _spec("n1.c1", outs=["float"], start=True)],
            "edges": [[2, 0, 0, 0]]}
    expected, _ = _single(desc, 0.001, seed=0)
    for placement in ({"n1.c1": "a"}, {"n1": "a", "n1.c1": "host"}, {"n1": "a", "n1.c1": "b"}):
        got, _ = _placed_end(desc, placement, 0.001, seed=0, workers=1)
        assert_same_tree(got, expected)
        assert len(got["nodes"]["n0"]["log"]) == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("reader", ["n0", "n1"], ids=["same-group", "other-group"])
def test_the_inputs_of_one_node_stay_in_one_processs_order_in_a_placed_tree(reader: str) -> None:
    """``pending`` lists a node's Inputs in the order one process does (the order their
    Output was connected to them: ``o0`` to ``i1`` first), not sorted by name: neither the
    merged tree nor a message from another group (its readers were sorted) reorders them."""
    desc = {"nodes": [_spec("n0", 1000, outs=["float"], ins=[("float", None, None, "drain")] * 2),
                      _spec("n1", 1000, ins=[("float", None, None, "drain")] * 2)],
            "edges": [[0, 0, 0 if reader == "n0" else 1, 1], [0, 0, 0 if reader == "n0" else 1, 0]]}
    expected, _ = _single(desc, 0.001, seed=0)
    assert list(expected["pending"]) == [f"{reader}.i1", f"{reader}.i0"]
    got, _ = _placed_end(desc, {"n0": "a"}, 0.001, seed=0, workers=1)
    assert_same_tree(got, expected)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["a", "host"])
def test_host_calls_and_a_stop_reach_a_group_that_never_sends_out(where: str) -> None:
    """A group alone with no end whose nodes never send to another group gives the driver
    its turn back (a grant yields after `group.SLICE_S`): state_dict, stop and join do not
    hang (they did: state_dict timed out, stop reported the group stuck, or never ended)."""
    desc = {"nodes": [_spec("n0"), _spec("clock", 1000, outs=["int"])], "edges": []}
    run = _placed(desc, {"clock": "a"} if where == "a" else {"n0": "a"}, None, seed=0, workers=1)
    try:
        # A message sent after the call: the run went on (the clock's first tick is at
        # 1 ms); then a cut, which must come at that time or later, not hang.
        assert run.wait_for("clock.o0", timeout=10) >= 0
        tree = run.state_dict(timeout=10)
        assert tree["time_ns"] >= 1_000_000
    finally:
        run.stop()
    run.join(10)


@pytest.mark.timeout(60)
def test_a_one_for_all_restore_from_the_first_snapshot_counts_dt_from_the_start() -> None:
    """One process: after a one_for_all restore from the first snapshot (taken before the timer
    started: no last update), the first update's dt counts from the start again, not from the
    update that failed (it was 0): the run ends as a run without the failure does."""
    random_nets.reset_failures()
    sup = mujou.Supervisor("one_for_all", snapshot_every=0.001)
    flaky = {"nodes": [_spec("n0"), _spec("n1", 1000, fail_at=1)], "edges": []}
    got, stats = _single(flaky, 0.002, seed=0, supervisor=sup)
    clean, _ = _single({"nodes": [_spec("n0"), _spec("n1", 1000)], "edges": []}, 0.002, seed=0)
    assert stats.nodes["n1"].restarts == 1
    assert got["nodes"]["n1"]["acc"] == clean["nodes"]["n1"]["acc"]  # acc folds every dt


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy", ["one_for_all", "one_for_one"])
def test_a_restart_in_a_group_keeps_every_count_of_one_process(strategy: str) -> None:
    """A placed one_for_all restart no longer starts the groups' counts afresh (a new kernel),
    and the other groups finish the failed instant first, as one process does."""
    desc = {"nodes": [_spec("n0", 1000, fail_at=1), _spec("n1", 700), _spec("n1.c0", 1000)],
            "edges": []}
    sup = lambda: mujou.Supervisor(strategy, snapshot_every=0.001)  # noqa: E731
    expected, expected_stats = _supervised_single(desc, 0.002, 0, sup())
    random_nets.reset_failures()
    got, stats = _placed_end(desc, {"n1.c0": "a"}, 0.002, seed=0, workers=1, supervisor=sup())
    assert_same_tree(got, expected)
    _assert_same_counts(stats, expected_stats)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["a", "host"])
def test_a_one_for_one_restart_in_a_group_is_done_before_the_driver_goes_on(where: str) -> None:
    """The restart's envelopes ran on a worker while the driver asked for the group's next
    key: about half the time it got none, and the restarted node never ticked again; and
    what its on_start sent (stamped at the failed cycle) came to its readers too late."""
    desc = {"nodes": [_spec("n0", 1000, outs=["float"], start=True, fail_at=1),
                      _spec("n1", 1000), _spec("n2", ins=[("float", None, None, "drain")])],
            "edges": [[0, 0, 2, 0]]}
    placement = {"n0": "b"} if where == "host" else {"n0": "b", "n2": "a"}
    sup = lambda: mujou.Supervisor("one_for_one", snapshot_every=0.001)  # noqa: E731
    expected, expected_stats = _supervised_single(desc, 0.003, 0, sup())
    for _ in range(5):
        random_nets.reset_failures()
        got, stats = _placed_end(desc, placement, 0.003, seed=0, workers=1, supervisor=sup())
        assert_same_tree(got, expected)
        _assert_same_counts(stats, expected_stats)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("placement", [{"a": "g"}, {"b": "g"}, {"a": "g", "b": "h"}])
def test_an_idle_readers_crowded_mailbox_is_pruned_as_in_one_process(placement: dict) -> None:
    """An idle reader's mailbox is pruned at the end of the same delta cycles as in one process.

    ``a`` sends 3 floats per 1 ms tick to ``b.i0`` (depth 2, not triggering)
    of ``b`` (triggered only: it never updates). One process prunes b's
    crowded mailbox at the end of the cycle that took it over its bound
    (`Dispatcher._prune_crowded`): at 9 ms it holds 8, 19 dropped. b's
    group, with no work of its own, runs no cycle: it was pruned as the
    messages came, below their instant, and held 11 (and had dropped 16).
    Now the driver tells every group which cycles are over everywhere
    (`Kernel.settle`), and each prunes as one process did at each of them.
    """
    desc = {"nodes": [_spec("b", ins=[("float", 2, False, "drain")]),
                      _spec("a", 1000, outs=["float"], sends=3)],
            "edges": [[1, 0, 0, 0]]}
    expected, expected_stats = _single(desc, 0.009, seed=1)
    assert len(expected["pending"]["b.i0"]) == 8 and expected_stats.nodes["b"].drops["i0"] == 19
    got, stats = _placed_end(desc, placement, 0.009, seed=1, workers=1)
    assert_same_tree(got, expected)
    _assert_same_counts(stats, expected_stats)


@pytest.mark.timeout(60)
def test_a_cut_of_an_idle_readers_crowded_mailbox_is_one_processs() -> None:
    """Cuts while it runs (every 1 ms: the supervisor's snapshots) hold what one process's do.

    Two writers in two groups send to one idle reader in a third at the same
    instants, so a cycle's messages come from two replies; the reader's
    mailbox is looked at only once both are in."""
    desc = {"nodes": [_spec("b", ins=[("float", 2, False, "drain"), ("int", 1, False, "drain")]),
                      _spec("a", 1000, outs=["float"], sends=3),
                      _spec("c", 1000, outs=["int"], sends=2)],
            "edges": [[1, 0, 0, 0], [2, 0, 0, 1]]}
    sup = lambda: mujou.Supervisor("one_for_all", snapshot_every=0.001)  # noqa: E731
    expected, expected_stats = _supervised_single(desc, 0.012, 1, sup())
    got, stats = _placed_end(desc, {"a": "g", "c": "h", "b": "k"}, 0.012, seed=1, workers=2,
                             supervisor=sup())
    assert_same_tree(got, expected)
    _assert_same_counts(stats, expected_stats)


@pytest.mark.timeout(60)
def test_a_placed_run_that_fails_or_is_stopped_ends_at_a_consistent_cut() -> None:
    """One process ends (a stop, a failure with no supervisor) at the end of the instant it
    is in; every group now finishes the latest instant any group reached before the final
    tree is taken (a group could be left an instant or more behind: ``b``'s 3 ms tick)."""
    desc = {"nodes": [_spec("a", 1000, outs=["int"], fail_at=3),
                      _spec("b", 3000, ins=[("int", None, None, "drain")]), _spec("c", 700)],
            "edges": [[0, 0, 1, 0]]}
    random_nets.reset_failures()
    with mujou.run(make_random_net(**desc), timer="simulated", duration=0.02, seed=0) as one:
        with pytest.raises(mujou.NodeError, match="a fails at its update 3"):
            one.join(30)
    random_nets.reset_failures()
    run = _placed(desc, {"b": "x"}, 0.02, seed=0, workers=1)
    with pytest.raises(mujou.NodeError, match="a fails at its update 3"):
        run.join(30)
    assert_same_tree(run.state_dict(), one.state_dict())
    del desc["nodes"][0]["fail_at"]
    for _ in range(3):
        run = _placed(desc, {"a": "x", "c": "y"}, None, seed=0, workers=1)
        try:
            run.wait_for("a.o0", timeout=10)
        finally:
            run.stop()
        run.join(10)
        tree = run.state_dict()
        expected, _ = _single(desc, tree["time_ns"] / 1e9, seed=0)
        assert_same_tree(tree, expected)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["host", "a"])
def test_every_write_of_inputs_comes_in_before_the_timers_start(where: str) -> None:
    """``inputs=`` are host writes before the start, sorted before what on_start sent. The
    first write to a group refreshed it, which started its timer: its next write came in
    at the timer's first delta cycle, after ``c``'s own on_start message."""
    desc = {"nodes": [_spec("n0", ins=[("float", None, None, "drain")]),
                      _spec("c", outs=["float"], ins=[("float", None, None, "drain")],
                            start=True), _spec("x")],
            "edges": [[1, 0, 1, 0]]}
    inputs = {"n0.i0": "float", "c.i0": "float"}
    expected, _ = _single(desc, 0.001, seed=0, inputs=inputs)
    assert [m[2][1] for m in expected["nodes"]["c"]["log"]][0] == 2.5
    placement = {"x": "a"} if where == "host" else {"n0": "a", "c": "a"}
    got, _ = _placed_end(desc, placement, 0.001, seed=0, workers=1, inputs=inputs)
    assert_same_tree(got, expected)


RICH = {"nodes": [
    _spec("src", 1000, outs=["tensor", "big", "int"], sends=2, start=True),
    _spec("ctl", None, outs=["float", "object"], sends=2,
          ins=[("tensor", 1, None, "drain"), ("float", 2, True, "read"), ("int", None, None,
                                                                         "drain")]),
    _spec("box", 3000, outs=["float"], ins=[("object", 2, None, "skip"),
                                            ("tensor", None, None, "drain")]),
    _spec("box.kid", None, outs=["int"], ins=[("float", 1, None, "drain")], start=True),
    _spec("box.kid.leaf", 700, outs=["float"], ins=[("int", 3, True, "drain")], seed=11),
    _spec("log", None, ins=[("object", None, None, "drain"), ("float", None, None, "drain")],
          dedicated=True)],
    # src -> ctl, box; ctl -> box, log, and back to itself (a cycle of triggered updates);
    # box.kid <-> box.kid.leaf (a cycle across groups); box -> log
    "edges": [[0, 0, 1, 0], [0, 1, 2, 1], [0, 2, 1, 2], [1, 0, 1, 1], [1, 1, 2, 0],
              [1, 1, 5, 0], [2, 0, 3, 0], [3, 0, 4, 0], [4, 0, 3, 0], [2, 0, 5, 1]]}


@pytest.mark.timeout(180)
def test_a_rich_net_in_group_processes_ends_bit_identical_to_one_process() -> None:
    """The property with real group processes (Thespian, spawn), for one net with every
    feature of the random ones: the description crosses as net_kwargs, every process
    builds the net from it."""
    placement = {"src": "a", "box": "b", "box.kid": "c", "box.kid.leaf": "host"}
    inputs = {"ctl.i1": "float", "box.i1": "tensor"}
    expected, expected_stats = _single(RICH, 0.02, seed=3, workers=2, inputs=inputs)
    run = mujou.run(make_random_net, placement=mujou.Placement(placement, net_kwargs=RICH),
                    timer="simulated", duration=0.02, seed=3, workers=2, inputs=_values(inputs))
    try:
        run.join(120)
    finally:
        run.stop()
    assert_same_tree(run.state_dict(), expected)
    _assert_same_counts(run.stats(), expected_stats)
    assert expected_stats.nodes["log"].updates > 0 and expected_stats.nodes["box"].updates


@pytest.mark.timeout(60)
def test_a_hook_failing_on_the_way_to_a_cut_goes_to_the_supervisor() -> None:
    """A state_dict() asked for at once is served before the first round: its cut runs
    instant 0, where ``n1`` (triggered by inputs=) fails. The failure reached state_dict()
    as the driver's private _Failed, and n1 was never restarted; now the supervisor
    restarts the net (one_for_all), then the cut is taken."""
    desc = {"nodes": [_spec("n0", 1000), _spec("n1", ins=[("float", None, None, "drain")],
                                               fail_at=1)], "edges": []}
    for _ in range(3):
        random_nets.reset_failures()
        run = _placed(desc, {"n0": "a"}, None, seed=0, workers=1, inputs={"n1.i0": "float"},
                      supervisor=mujou.Supervisor("one_for_all", snapshot_every=0.001))
        try:
            tree = run.state_dict(timeout=30)
        finally:
            run.stop()
        run.join(30)
        assert tree["nodes"]["n1"]["n"] == 1 and tree["nodes"]["n1"]["log"][0][2] == [
            "float", 2.5]
        assert run.stats().nodes["n1"].restarts == 1


@pytest.mark.timeout(90)
@pytest.mark.parametrize("strategy", ["one_for_all", "one_for_one"])
@pytest.mark.parametrize("placement", [{"n0": "a", "n1": "a"}, {"n0": "a", "n1": "b"}])
@pytest.mark.parametrize("peer_links", ["0", "1"])
def test_two_hooks_failing_in_one_delta_cycle_are_each_the_supervisors(
        strategy: str, placement: dict, peer_links: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the peer-link hunt: two hooks failing in one delta cycle (in one group or
    two) were one failure for the host, the other dropped: under one_for_one that node was
    never restarted and ticked no more. Each is now the supervisor's, as in one process:
    each restarted (one_for_one), or counted and the net restored once (one_for_all).
    On the host's rounds and on peer links alike."""
    monkeypatch.setenv("MUJOU_PEER_LINKS", peer_links)
    desc = {"nodes": [_spec("n0", 1000, fail_at=5), _spec("n1", 2500, fail_at=2)],
            "edges": []}  # both fail at t = 5 ms
    sup = lambda: mujou.Supervisor(strategy, snapshot_every=0.001)  # noqa: E731
    expected, expected_stats = _supervised_single(desc, 0.006, 0, sup())
    random_nets.reset_failures()
    got, stats = _placed_end(desc, placement, 0.006, seed=0, workers=1, supervisor=sup())
    assert_same_tree(got, expected)
    _assert_same_counts(stats, expected_stats)
    assert [stats.nodes[p].restarts for p in ("n0", "n1")] == [1, 1]
    assert expected["schedule"]["n0"]["last_update_ns"] == 6_000_000
