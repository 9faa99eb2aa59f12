"""Silent mistakes that the run warns of as it starts (or as the interpreter exits).

Each is logged on the ``mujou_actors`` logger, names the node, port or file,
and changes nothing else: the run goes on.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

import pytest
import torch

import mujou_actors as mujou
from tests.replay_support import record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Ticker(mujou.Node):
    out = mujou.Output(torch.Tensor, shape=(1,))

    def __init__(self, period: float | None = 0.01) -> None:
        super().__init__(period=period)

    def on_update(self, dt: float) -> None:
        self.out.send(torch.ones(1))


class Listener(mujou.Node):
    inp = mujou.Input(torch.Tensor, shape=(1,))

    def __init__(self) -> None:
        super().__init__(period=None)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1


class OtherListener(Listener):
    """Another class with the same ports: a replay's types match it."""


def _warnings(caplog: pytest.LogCaptureFixture, net: Any, **kwargs: Any) -> list[str]:
    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        run = mujou.run(net, timer="simulated", **kwargs)
        run.stop() if kwargs.get("duration") is None else run.join()
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_period_that_looks_like_a_rate_is_warned_of_with_its_updates(caplog) -> None:
    warned = _warnings(caplog, {"fast": Ticker(period=500), "ok": Ticker(period=10)},
                       duration=10)

    assert len(warned) == 1
    assert warned[0].startswith("node 'fast' (Ticker) has period=500 s, one update every "
                                "500 s (0 updates in duration=10 s): a rate in Hz?")
    assert warned[0].endswith("the seconds between updates (500 Hz is period=0.002)")


def test_a_triggering_input_connected_to_nothing_is_warned_of(caplog) -> None:
    lonely, fed, given = Listener(), Listener(), Listener()
    ticker = Ticker()
    mujou.connect(ticker.out, fed.inp)

    warned = _warnings(caplog, {"lonely": lonely, "fed": fed, "given": given, "t": ticker},
                       duration=0.05, inputs={"given.inp": torch.zeros(1)})

    assert warned == ["Input 'lonely.inp' triggers node 'lonely' but nothing is connected to "
                      "it: the node updates on it only if the host writes to it (run.write); "
                      "connect an Output to it (mujou.connect) or give the node a period"]


class Idle(mujou.Node):
    """period=None, and its one Input does not trigger: nothing calls its on_update."""

    inp = mujou.Input(torch.Tensor, shape=(1,), trigger=False)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1


class Mute(mujou.Node):
    """period=None and no Inputs at all, but an on_update."""

    def __init__(self) -> None:
        super().__init__(period=None)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1


class Box(mujou.Node):
    """A container: period=None, no on_update of its own, children that run."""

    def __init__(self) -> None:
        super().__init__(period=None)
        self.ticker = Ticker()
        self.listener = Listener()
        mujou.connect(self.ticker.out, self.listener.inp)


def test_a_node_that_nothing_ever_updates_is_warned_of_but_not_a_container(caplog) -> None:
    idle, mute, box, given = Idle(), Mute(), Box(), Box()
    given.on_update = lambda dt: None  # an on_update set on the node is its own too
    mujou.connect(box.ticker.out, idle.inp)

    warned = _warnings(caplog, {"idle": idle, "mute": mute, "box": box, "given": given},
                       duration=0.05)

    assert warned == [
        f"node {path!r} ({cls}) has period=None and no Input that triggers it: its "
        "on_update never runs; give it a period (period=0.01 is 100 updates a second) or an "
        "Input that triggers it (trigger=None or True), connected to an Output (mujou.connect)"
        for path, cls in [("idle", "Idle"), ("mute", "Mute"), ("given", "Box")]]
    assert idle.count == mute.count == 0 and box.listener.count == 5


class Typo(mujou.Node):
    """A hook's name mistyped: ``on_updte`` is never called."""

    def __init__(self) -> None:
        super().__init__(period=0.01)

    def on_updte(self, dt: float) -> None:
        pass


class EarlyDraw(Ticker):
    """Draws from its generator in ``__init__``, before any run seeded it."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.rand(1, generator=self.generator)


def make_mistakes() -> dict[str, mujou.Node]:
    """A net with a mistake of each kind the start warns of (module level: placeable)."""
    return {"fast": Ticker(period=500), "lonely": Listener(), "mute": Mute(),
            "rig": Rig(), "typo": Typo(), "early": EarlyDraw()}


def test_a_placed_run_warns_as_one_process_does_once_in_the_host(caplog) -> None:
    from mujou_actors._runtime.build import Seams
    from mujou_actors.distributed import placed
    from mujou_actors.run import _check_arguments
    from tests.placed_support import InProcessSystem

    one = _warnings(caplog, make_mistakes(), duration=0.05)
    caplog.clear()
    args = _check_arguments(Seams(), workers=1, timer="simulated", duration=0.05, seed=None,
                            state=None, supervisor=None, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=10.0, start_timeout=60.0)
    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        # The groups are served in this process: what they logged would be caught too.
        run = placed.start(make_mistakes, placement=mujou.Placement({"fast": "a", "mute": "a",
                                                                     "rig": "b", "early": "b"}),
                           args=args, inputs=None, state=None, make_system=InProcessSystem)
        run.join(30)
    placed_ = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    assert len(one) == 7  # fast, lonely, mute, rig twice, typo, early
    assert placed_ == one


class Helper:
    def __init__(self) -> None:
        self.sensor = Ticker()


class Rig(mujou.Node):
    def __init__(self) -> None:
        super().__init__(period=None)
        self.rows = [[Ticker(), Ticker()]]        # a list inside a list: not walked
        self.parts = Helper()                      # a helper object: not walked
        self.flat = [Ticker()]                     # walked: part of the net
        self.numbers = [[1, 2], [3]]               # no nodes: nothing to say


def test_nodes_held_where_the_walk_does_not_look_are_warned_of(caplog) -> None:
    rig = Rig()

    warned = _warnings(caplog, rig, duration=0.05)

    assert warned == [
        "node '<root>' (Rig) holds a Node in self.rows (a container inside a container): it is "
        "not part of the net and never runs; hold nodes in attributes, or in lists, tuples or "
        "dicts of nodes directly (docs/nodes-and-ports.md, 'Composition and paths')",
        "node '<root>' (Rig) holds a Node in self.parts (an attribute of a Helper): it is not "
        "part of the net and never runs; hold nodes in attributes, or in lists, tuples or "
        "dicts of nodes directly (docs/nodes-and-ports.md, 'Composition and paths')"]
    assert rig.flat[0].out.path == "flat.0.out"


@pytest.mark.slow
def test_a_run_left_running_when_the_script_exits_is_warned_of(tmp_path) -> None:
    script = tmp_path / "forgot_join.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {ROOT!r})\n"
        "import mujou_actors as mujou\n"
        "from tests.test_warnings import Ticker\n"
        "run = mujou.run({'a': Ticker(), 'b': Ticker()}, duration=30)\n")

    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=str(tmp_path))

    assert done.returncode == 0, done.stderr
    assert "a run of 'a', 'b' was still running when the interpreter exited" in done.stderr
    assert "call run.join()" in done.stderr


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> str:
    """0.1 s of a ticker feeding a listener."""
    path = str(tmp_path_factory.mktemp("rec") / "run.mcap")
    ticker, listener = Ticker(), Listener()
    mujou.connect(ticker.out, listener.inp)
    record({"t": ticker, "l": listener}, path, timer="simulated", duration=0.1, seed=1)
    return path


def _replayed(listener: Listener) -> dict[str, mujou.Node]:
    ticker = Ticker()
    mujou.connect(ticker.out, listener.inp)
    return {"t": ticker, "l": listener}


def test_a_replay_without_duration_is_warned_of_with_the_recording_length(
        caplog, recording: str) -> None:
    warned = _warnings(caplog, _replayed(Listener()), replay=mujou.Replay(recording, replace=["t"]))
    quiet = _warnings(caplog, _replayed(Listener()), replay=mujou.Replay(recording, replace=["t"]),
                      duration=0.1)

    assert len(warned) == 1
    assert warned[0].startswith(f"replay of {recording} without duration: the recording "
                                "ends at t = 0.1 s")
    assert warned[0].endswith("pass duration=0.1 to end with the recording")
    assert quiet == warned  # caplog keeps the first run's; the second added nothing


def test_a_recording_replayed_into_another_net_is_warned_of(caplog, recording: str) -> None:
    warned = _warnings(caplog, _replayed(OtherListener()),
                       replay=mujou.Replay(recording, replace=["t"]), duration=0.1)

    assert warned == [
        f"replay of {recording} into another net than the one recorded: 'l' was a "
        "tests.test_warnings:Listener, is a tests.test_warnings:OtherListener (the replayed "
        "types match, so it runs; is it the net you meant?)"]
