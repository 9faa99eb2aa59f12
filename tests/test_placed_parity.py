"""The host's API of a placed run behaves as one process's, call for call.

docs/processes.md promises that a `PlacedRun` has every member of `Run`,
"with the same arguments and errors" (its documented differences aside:
``read`` after the end, ``stats().workers``, ``groups``). Each scenario here
runs once in one process and once placed (the groups served in this process:
`InProcessSystem`), and returns what the host observes; the test asserts the
values, and that the placed run observes the same as one process.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from pathlib import Path
from typing import Any

import pytest

import mujou_actors as mujou
from mujou_actors._runtime.build import Seams
from mujou_actors.distributed import placed
from mujou_actors.errors import CallbackError, NotRunningError
from mujou_actors.run import _check_arguments
from tests import placed_support
from tests.placed_support import InProcessSystem
from tests.test_placed import assert_same_tree

pytestmark = pytest.mark.timeout(90)

KINDS = ["one process", "placed"]
PLACEMENTS = {placed_support.make_echo: {"echo": "a"},
              placed_support.make_net: {"sim": "a", "ctrl": "b"}}


def start(kind: str, factory: Any = placed_support.make_echo, *, duration: float | None = None,
          seed: int | None = 3, state: dict | None = None,
          supervisor: mujou.Supervisor | None = None) -> Any:
    """A simulated run of ``factory``'s net, in one process or placed."""
    if kind == "one process":
        return mujou.run(factory(), timer="simulated", duration=duration, seed=seed,
                         state=state, supervisor=supervisor, workers=1)
    args = _check_arguments(Seams(), workers=1, timer="simulated", duration=duration,
                            seed=seed, state=state, supervisor=supervisor, trace=None,
                            cuda_sync="block", stats=True, stop_timeout=10.0,
                            start_timeout=60.0)
    return placed.start(factory, placement=mujou.Placement(PLACEMENTS[factory]), args=args,
                        inputs=None, state=state, make_system=InProcessSystem)


class Gather:
    """A subscriber callback that keeps every message and tells when ``n`` have come."""

    def __init__(self) -> None:
        self.got: list[Any] = []
        self._cond = threading.Condition()

    def __call__(self, message: Any) -> None:
        with self._cond:
            self.got.append(message)
            self._cond.notify_all()

    def wait(self, n: int, timeout: float = 20.0) -> list[Any]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.got) >= n, timeout), self.got
            return list(self.got)


def _node_figures(stats: Any) -> dict[str, dict[str, Any]]:
    """Each node's figures but its wall-clock ones (hook time)."""
    return {p: {k: v for k, v in dataclasses.asdict(n).items() if k != "hook_time"}
            for p, n in stats.nodes.items()}


def _idle_scenario(kind: str) -> dict[str, Any]:
    """A run without duration, with nothing due: the host writes, reads, subscribes, stops."""
    run = start(kind)
    out: dict[str, Any] = {}
    # Nothing is due and there is no duration: the run waits for a write, its time still.
    out["ended at once"] = run.wait(0.3)
    out["before"] = (run.running, run.failure, run.time_ns, run.start_time)
    counted, echoed, written, timed = Gather(), Gather(), Gather(), Gather()
    run.subscribe("count.inp", counted)
    run.subscribe("echo.inp", written)  # an Input: it sees the host's writes too
    run.subscribe("echo.inp", lambda t, m: timed((t, m)), with_time=True)
    run.subscribe(run.nodes["echo"].out, echoed)  # a port object of the run: accepted
    run.write("echo.inp", 1)
    counted.wait(1)
    out["between writes"] = (run.wait(0.1), run.running, run.failure, run.time_ns)
    run.write(run.nodes["echo"].inp, 2)
    out["counted"] = counted.wait(2)
    out["echoed"] = echoed.wait(2)
    out["written"] = (written.wait(2), timed.wait(2))
    out["read"] = (run.read("echo.out"), run.read("count.inp"))
    out["live tree"] = run.state_dict(timeout=20)
    stats = run.stats()
    out["stats"] = (type(stats).__name__, stats.time, _node_figures(stats),
                    {p: (s.subscriptions, s.delivered) for p, s in stats.subscriptions.items()})
    run.stop()
    out["after"] = (run.running, run.failure, run.time_ns, run.wait(0))
    run.join()
    with pytest.raises(NotRunningError):
        run.write("echo.inp", 3)
    with pytest.raises(NotRunningError):
        run.subscribe("echo.out", print)
    with pytest.raises(NotRunningError):
        run.wait_for("echo.out", timeout=5)
    out["final tree"] = run.state_dict()
    out["final nodes"] = _node_figures(run.stats())
    return out


@functools.cache
def _one_process_idle() -> dict[str, Any]:
    return _idle_scenario("one process")


@pytest.mark.parametrize("kind", KINDS)
def test_a_simulated_run_without_duration_waits_for_the_hosts_writes_as_one_process(
        kind: str) -> None:
    got = _idle_scenario(kind)

    expected = _one_process_idle()
    assert got["ended at once"] is False
    assert got["before"] == (True, None, 0, 0.0)
    assert got["between writes"] == (False, True, None, 0)  # still waiting, time standing
    assert got["counted"] == got["echoed"] == [2, 4]
    assert got["written"] == ([1, 2], [(0, 1), (0, 2)])
    assert got["read"] == (4, None)  # count drained its Input: nothing is kept
    assert got["after"] == (False, None, 0, True)
    assert got["final tree"]["nodes"]["echo"]["n"] == 2
    assert got["final tree"]["nodes"]["count"] == {"total": 6, "got": [2, 4]}
    for key in ("before", "between writes", "counted", "echoed", "written", "read", "stats",
                "after", "final nodes"):
        assert got[key] == expected[key], key
    assert_same_tree(got["live tree"], expected["live tree"])
    assert_same_tree(got["final tree"], expected["final tree"])


def _seeds_scenario(kind: str, tree: dict, snapshots: Path) -> dict[str, Any]:
    """Runs that settle seeds: none given, and a restore under another seed (or none)."""
    out: dict[str, Any] = {}
    run = start(kind, placed_support.make_net, duration=0.02, seed=None)
    run.join(30)
    out["unseeded"] = (dict(run.seeds), run.state_dict()["seeds"])
    for seed in (None, 5):
        folder = snapshots / f"{kind}-{seed}"
        supervisor = mujou.Supervisor("one_for_all", snapshot_every=0.02,
                                      snapshot_dir=str(folder), keep=10)
        run = start(kind, placed_support.make_net, duration=0.05, seed=seed, state=tree,
                    supervisor=supervisor)
        run.join(30)
        files = sorted(f for f in folder.iterdir() if f.suffix == ".mujou")
        out[seed] = {"seeds": dict(run.seeds), "final": run.state_dict(),
                     "snapshots": [mujou.load(f)["seeds"] for f in files],
                     "times": (run.start_time, run.time)}
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_every_tree_of_a_restored_run_carries_the_restored_seeds_on(kind: str,
                                                                      tmp_path: Path) -> None:
    tree = start("one process", placed_support.make_net, duration=0.05, seed=11)
    tree.join()
    tree = tree.state_dict()

    got = _seeds_scenario(kind, tree, tmp_path)

    expected = _seeds_scenario("one process", tree, tmp_path / "reference")
    run_seeds, tree_seeds = got["unseeded"]
    assert run_seeds == tree_seeds  # run.seeds are those the nodes were seeded with
    for seed in (None, 5):
        restored = got[seed]
        assert restored["seeds"] == tree["seeds"]
        assert restored["final"]["seeds"] == tree["seeds"]
        assert len(restored["snapshots"]) >= 3  # the start's (at 0.05), then every 0.02 s
        assert all(s == tree["seeds"] for s in restored["snapshots"])
        assert restored["times"] == (0.05, 0.1)
        assert restored["snapshots"] == expected[seed]["snapshots"]
        assert_same_tree(restored["final"], expected[seed]["final"])


def _errors_scenario(kind: str) -> list[str]:
    """The argument errors and timeouts of the host's calls, by exception type."""
    run = start(kind)
    other = placed_support.make_echo()  # a net of its own: its ports are not the run's
    calls = [
        lambda: run.write("echo.out", 1),  # an Output
        lambda: run.write("echo.inp", "one"),  # not an int
        lambda: run.write("echo.nothing", 1),
        lambda: run.write(other["echo"].inp, 1),
        lambda: run.read(other["echo"].out),
        lambda: run.subscribe("echo.out", 42),
        lambda: run.subscribe("echo.out", print, depth=0),
        lambda: run.subscribe("echo.out", print, with_time=1),
        lambda: run.wait_for("echo.out", timeout=0.05),
        lambda: run.join(timeout=0.05),
        lambda: run.read(3),
    ]
    raised = []
    try:
        for call in calls:
            try:
                call()
                raised.append("nothing")
            except Exception as exc:  # noqa: BLE001 - the type is what is compared
                raised.append(type(exc).__name__)
    finally:
        run.stop()
    run.join()
    return raised


@pytest.mark.parametrize("kind", KINDS)
def test_the_hosts_calls_refuse_bad_arguments_with_the_same_errors(kind: str) -> None:
    raised = _errors_scenario(kind)

    assert raised == ["TypeError", "PortTypeError", "ValueError", "ValueError", "ValueError",
                      "TypeError", "ValueError", "TypeError", "TimeoutError", "TimeoutError",
                      "TypeError"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_callback_may_stop_the_run_but_not_wait_for_it_and_one_that_raises_ends_it(
        kind: str) -> None:
    run = start(kind)
    refused: list[str] = []
    stopped = threading.Event()

    def stop_from_inside(message: Any) -> None:
        for wait in (run.join, run.wait, lambda: run.wait_for("echo.out")):
            try:
                wait()
            except RuntimeError as exc:
                refused.append(type(exc).__name__)
        run.stop()  # only asks: returns at once
        stopped.set()

    run.subscribe("echo.out", stop_from_inside)
    run.write("echo.inp", 1)
    assert stopped.wait(20)
    run.join(30)
    assert refused == ["RuntimeError"] * 3
    assert not run.running and run.failure is None

    run = start(kind)
    run.subscribe("echo.out", lambda m: 1 / 0)
    run.write("echo.inp", 1)
    with pytest.raises(CallbackError) as info:
        run.join(30)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert not run.running and run.failure is info.value


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_with_a_duration_ends_at_it_with_the_same_figures(kind: str) -> None:
    with start(kind, placed_support.make_net, duration=0.1, seed=7) as run:
        run.join(30)
    stats = run.stats()

    assert (run.running, run.failure, run.time_ns, run.start_time) == (False, None,
                                                                       100_000_000, 0.0)
    assert list(stats.nodes) == ["sim", "ctrl", "log"] == list(run.nodes)
    assert stats.nodes["sim"].updates == 10 and stats.nodes["ctrl"].updates == 10
    reference = start("one process", placed_support.make_net, duration=0.1, seed=7)
    reference.join()
    assert _node_figures(stats) == _node_figures(reference.stats())
    assert dict(run.seeds) == dict(reference.seeds)
    assert_same_tree(run.state_dict(), reference.state_dict())
    assert run.stats().snapshots == reference.stats().snapshots


@pytest.mark.parametrize("kind", KINDS)
def test_a_wait_for_predicate_may_change_its_message_without_touching_a_subscribers(
        kind: str) -> None:
    run = start(kind, placed_support.make_net)
    changed = threading.Event()
    got: list[list[float]] = []

    def slow(message: Any) -> None:  # holds the callbacks' thread until the change is made
        changed.wait(20)
        got.append(message.tolist())

    def zero_the_second(message: Any) -> bool:
        seen.append(message.tolist())
        if len(seen) < 2:
            return False
        message.zero_()
        changed.set()
        return True

    seen: list[list[float]] = []
    try:
        run.subscribe("sim.out", slow)
        found = run.wait_for("sim.out", zero_the_second, timeout=20)
        while seen[1] not in got:  # the subscriber's copy of the message zeroed
            assert run.running
            changed.wait(0.01)
    finally:
        run.stop()
    run.join()

    assert found.tolist() == [0.0, 0.0, 0.0]
    # Every message the predicate saw reached the subscriber too, in order and as it
    # was sent. The subscriber may have got more before wait_for began (the net runs
    # meanwhile), so the two are matched where the predicate's first one is.
    first = got.index(seen[0])
    assert got[first:first + 2] == seen[:2] and [0.0, 0.0, 0.0] not in got
