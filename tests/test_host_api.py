"""The host's API, one suite for every placement: a run in this process and a placed run.

`mujou.run` returns a `Run` wherever the nodes run (`host.Run`); each test here
runs once with the whole net in this process (``local``) and once placed over
groups (``placed``: groups served in this process by `InProcessSystem`, their
messages crossing ZeroMQ sockets as between processes), and asserts the same
values, errors and states for both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

import mujou_actors as mujou
from mujou_actors.distributed import placed
from mujou_actors.errors import NodeError, NotRunningError, PortTypeError
from tests.placed_support import Echo, InProcessSystem, make_echo, make_net
from tests.test_placed import _args, make_boom

pytestmark = pytest.mark.timeout(60)

KINDS = ["local", "placed"]
# Where each net's nodes run when placed: the rest stays in the host's group.
PLACEMENTS = {"make_net": {"sim": "a", "ctrl": "b"}, "make_echo": {"echo": "a"},
              "make_boom": {"boom": "b"}}


def start(kind: str, factory: Callable[[], dict[str, mujou.Node]],
          duration: float | None) -> mujou.Run:
    """The net of ``factory``, simulated, seed 7: in this process or placed."""
    if kind == "local":
        return mujou.run(factory(), timer="simulated", duration=duration, seed=7)
    return placed.start(factory, placement=mujou.Placement(PLACEMENTS[factory.__name__]),
                        args=_args(duration), inputs=None, state=None,
                        make_system=InProcessSystem)


def collect(run: mujou.Run, port: str, n: int) -> tuple[list[Any], threading.Event, Any]:
    """Subscribe to ``port``: the messages, an event set at the ``n``-th, the subscription."""
    got: list[Any] = []
    done = threading.Event()

    def seen(message: Any) -> None:
        got.append(message)
        if len(got) == n:
            done.set()

    return got, done, run.subscribe(port, seen)


@pytest.mark.parametrize("kind", KINDS)
def test_mujou_run_returns_a_run_with_the_same_members(kind: str) -> None:
    run = start(kind, make_net, None)
    try:
        assert isinstance(run, mujou.Run)
        assert run.running and run.failure is None and run.start_time == 0.0
        assert set(run.nodes) == {"sim", "ctrl", "log"}
        assert sorted(run.ports) == ["ctrl.cmd", "ctrl.obs", "log.cmd", "log.obs", "sim.out"]
        assert all(p.path == path for path, p in run.ports.items())
        groups = {"host": ["sim", "ctrl", "log"]} if kind == "local" else \
            {"a": ["sim"], "b": ["ctrl"], "host": ["log"]}
        assert {g: sorted(paths) for g, paths in run.groups.items()} == \
            {g: sorted(paths) for g, paths in groups.items()}
        assert set(run.seeds) == {"sim", "ctrl", "log"}
        first = run.wait_for("sim.out", timeout=20)
        assert isinstance(first, torch.Tensor) and first.shape == (3,)
        assert run.time_ns >= 0 and run.time == run.time_ns / 1e9
    finally:
        run.stop()
    assert not run.running and run.failure is None
    run.join()
    assert run.time == run.time  # frozen once ended
    assert run.stop() is None  # idempotent


@pytest.mark.parametrize("kind", KINDS)
def test_writes_arrive_in_order_and_a_subscriber_sees_every_message(kind: str) -> None:
    with start(kind, make_echo, None) as run:
        got, done, sub = collect(run, "echo.out", 5)
        for k in range(1, 6):
            run.write("echo.inp", k)
        assert done.wait(20)
        assert got == [2, 4, 6, 8, 10]
        assert run.read("echo.out") == 10
        tree = run.state_dict(timeout=20)
        assert set(tree) >= {"format", "time_ns", "seeds", "nodes", "inputs", "pending",
                             "schedule"}
        assert tree["nodes"]["echo"]["n"] == 5
        stats = run.stats()
        assert stats.nodes["echo"].updates >= 1
        assert stats.subscriptions["echo.out"].subscriptions == 1
    assert sub.delivered == 5 and sub.dropped == 0
    with pytest.raises(NotRunningError):
        run.write("echo.inp", 6)
    with pytest.raises(NotRunningError):
        run.subscribe("echo.out", print)
    assert run.state_dict()["nodes"]["echo"]["n"] == 5  # the final state


@pytest.mark.parametrize("kind", KINDS)
def test_bad_ports_and_arguments_are_refused_alike_and_leave_the_run_going(kind: str) -> None:
    with start(kind, make_echo, None) as run:
        with pytest.raises(ValueError, match="nope"):
            run.read("nope")
        with pytest.raises(TypeError, match="echo.out"):
            run.write("echo.out", 1)  # an Output
        with pytest.raises(PortTypeError):
            run.write("echo.inp", "one")
        with pytest.raises(ValueError, match="not part of this run"):
            run.write(Echo().inp, 1)  # a port of another net
        with pytest.raises(TypeError, match="callable"):
            run.subscribe("echo.out", 3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="depth"):
            run.subscribe("echo.out", print, depth=0)
        with pytest.raises(TimeoutError, match="echo.out"):
            run.wait_for("echo.out", timeout=0.2)
        # Nothing was delivered by the refused calls; the run goes on.
        got, done, _ = collect(run, "echo.out", 1)
        run.write("echo.inp", 21)
        assert done.wait(20) and got == [42]
        assert run.state_dict(timeout=20)["nodes"]["echo"]["n"] == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_hooks_failure_reaches_join_failure_and_the_with_block(kind: str) -> None:
    with pytest.raises(NodeError) as info:
        with start(kind, make_boom, 1.0) as run:
            assert run.wait(30)
    err = info.value
    assert err.path == "boom" and err.hook == "on_update" and "boom at three" in str(err)
    assert isinstance(run.failure, NodeError) and run.failure.path == "boom"
    with pytest.raises(NodeError):
        run.join()  # raised again to whoever joins



@pytest.mark.parametrize("kind", KINDS)
def test_a_watch_keeps_later_messages_for_the_taker_and_counts_what_it_pushes_out(
        kind: str) -> None:
    with start(kind, make_echo, None) as run:
        timed = run.watch("echo.out", with_time=True)
        small = run.watch("echo.out", depth=2)
        stamps = run.watch("echo.out", with_time=True, messages=False)
        written = run.watch("echo.inp")
        # Attached last, and timed: called after every watch's listener has the message
        # (a placed run's driver calls the timed listeners after the others).
        seen = {10: threading.Event(), 12: threading.Event()}

        def sentinel(t_ns: int, message: int) -> None:
            if message in seen:
                seen[message].set()

        run.subscribe("echo.out", sentinel, with_time=True)
        for k in range(1, 6):
            run.write("echo.inp", k)
        assert seen[10].wait(20)
        assert small.pending == 2 and small.dropped == 3
        pairs = timed.take()
        assert [m for _, m in pairs] == [2, 4, 6, 8, 10]
        times = [t for t, _ in pairs]
        assert all(t >= 0 for t in times) and times == sorted(times)
        assert stamps.take() == times
        assert small.take() == [8, 10] and small.take() == []
        assert written.take() == [1, 2, 3, 4, 5]
        stats = run.stats().subscriptions
        assert (stats["echo.out"].watches, stats["echo.out"].watch_taken,
                stats["echo.out"].watch_dropped) == (3, 12, 3)
        assert stats["echo.inp"].watches == 1 and stats["echo.inp"].watch_taken == 5
        small.cancel()
        run.write("echo.inp", 6)
        assert seen[12].wait(20)
        assert not small.active and small.take() == [] and small.pending == 0
        assert small.taken == 2 and small.dropped == 3  # its counts stay
        assert timed.pending == 1
    # What was queued before the end can still be taken once the run has ended.
    assert written.active and written.take() == [6]
    assert [m for _, m in timed.take()] == [12]
    final = run.stats().subscriptions["echo.out"]
    assert (final.watches, final.watch_taken, final.watch_dropped) == (3, 13, 3)
    with pytest.raises(NotRunningError):
        run.watch("echo.out")
    timed.cancel()
    timed.cancel()  # idempotent
    assert run.stats().subscriptions["echo.out"].watch_taken == 13


@pytest.mark.parametrize("kind", KINDS)
def test_bad_watches_are_refused_alike(kind: str) -> None:
    with start(kind, make_echo, None) as run:
        with pytest.raises(ValueError, match="nope"):
            run.watch("nope")
        with pytest.raises(ValueError, match="depth"):
            run.watch("echo.out", depth=0)
        with pytest.raises(TypeError, match="depth"):
            run.watch("echo.out", depth=1.5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="with_time"):
            run.watch("echo.out", with_time=1)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="with_time=True"):
            run.watch("echo.out", messages=False)
        assert "echo.out" not in run.stats().subscriptions  # nothing was made
