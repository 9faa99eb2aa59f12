"""Replay: replaced nodes send their recorded messages at their recorded keys, bit for bit.

A small pendulum-like net (a plant, a noisy sensor, a controller, a triggered
log) is recorded in simulated time, then replayed with its plant replaced: the
rest of the net gets exactly what it got, for 1 and 4 workers, and
`assert_replay_matches` says so, or names the first divergence of a changed
controller. Random nets (tests/random_nets.py) do the same with a random node
replaced. Then the stand-in's rules (its Inputs, a loaded state, real time,
loops) and the errors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mujou_actors as mujou
from mujou_actors.recording import mcapfile
from mujou_actors.recording.checks import diff_values
from mujou_actors.testing import assert_replay_matches
from tests.nets.replay_nets import Pendulum, Plant, loop_net
from tests.random_nets import make_random_net, nets
from tests.replay_support import capture, record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Pendulum]:
    """A 0.5 s recording of the pendulum (seed 3, 2 workers) and the net that made it."""
    path = str(tmp_path_factory.mktemp("golden") / "pendulum.mcap")
    net = Pendulum()
    record(net, path, timer="simulated", duration=0.5, seed=3, workers=2)
    return path, net


# -- bit for bit ------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 4])
def test_a_replayed_plant_gives_the_rest_of_the_net_every_message_bit_for_bit(
        golden: tuple[str, Pendulum], workers: int) -> None:
    path, recorded = golden
    net = Pendulum()

    run = mujou.run(net, timer="simulated", duration=0.5, workers=workers,
                    replay=mujou.Replay(path, replace=["plant"]))
    run.join()

    assert net.log.seen == recorded.log.seen
    assert len(net.log.seen) > 300
    assert net.plant.calls == []  # the replaced node's code never ran
    assert run.stats().nodes["plant"].updates == 250  # a wakeup per recorded tick


@pytest.mark.parametrize("workers", [1, 4])
def test_assert_replay_matches_passes_for_the_same_net_replayed_or_whole(
        golden: tuple[str, Pendulum], workers: int) -> None:
    path, _ = golden

    replayed = assert_replay_matches(path, Pendulum(), replace=["plant"], workers=workers)
    whole = assert_replay_matches(path, Pendulum(), workers=workers)

    assert replayed == whole == 251 + 125 + 50  # every message of every channel compared


def test_a_changed_controller_is_reported_at_its_first_divergence(
        golden: tuple[str, Pendulum]) -> None:
    path, _ = golden

    with pytest.raises(AssertionError) as caught:
        assert_replay_matches(path, Pendulum(gain=(44.0, 8.0)), replace=["plant"])

    text = str(caught.value)
    assert "first divergence is at controller.command, message 0 " \
           "(t = 0.010000000 s = 10000000 ns, delta 0)" in text
    assert "a tensor of shape (1,) float64: 1 of 1 element(s) differ, max abs difference" in text
    assert "the first at index [0]:" in text
    assert "controller.command: 50 message(s) differ" in text
    assert "plant.state" not in text  # replayed: the recording's own messages


def test_a_changed_controller_without_a_replaced_plant_diverges_everywhere_downstream(
        golden: tuple[str, Pendulum]) -> None:
    path, _ = golden

    with pytest.raises(AssertionError) as caught:
        assert_replay_matches(path, Pendulum(gain=(44.0, 8.0)))

    lines = str(caught.value).splitlines()
    assert "controller.command, message 0" in lines[0]
    assert [line.split(":")[0].strip() for line in lines[3:]] == [
        "plant.state", "sensor.measurement", "controller.command"]


def test_a_divergence_on_other_cpu_kernels_than_recorded_says_how_to_compare_across_machines(
        golden: tuple[str, Pendulum], monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = golden
    recorded = json.loads(mcapfile.info(path).run["numerics"])
    other = {**recorded, "cpu": "Another CPU", "cpu_capability": "AVX2"}

    with pytest.raises(AssertionError) as same:
        assert_replay_matches(path, Pendulum(gain=(44.0, 8.0)), replace=["plant"])
    monkeypatch.setattr(mujou.devices, "numerics", lambda: other)
    with pytest.raises(AssertionError) as elsewhere:
        assert_replay_matches(path, Pendulum(gain=(44.0, 8.0)), replace=["plant"])

    assert "note:" not in str(same.value)  # the same kernels: a real difference
    note = str(elsewhere.value).splitlines()[-1]
    assert note.startswith(f"note: {path} was recorded on {recorded['cpu'] or 'an unnamed'}")
    assert "rerun on Another CPU (torch's kernels AVX2, MKL_CBWR=" in note
    assert "MKL_CBWR=COMPATIBLE (and ATEN_CPU_CAPABILITY=default)" in note


def test_messages_missing_from_the_rerun_are_counted(golden: tuple[str, Pendulum]) -> None:
    path, _ = golden

    with pytest.raises(AssertionError) as caught:
        assert_replay_matches(path, Pendulum(stop_after=20), replace=["plant"])

    text = str(caught.value)
    assert "controller.command, message 20 (t = 0.210000000 s = 210000000 ns, delta 0): " \
           f"{path} recorded it, the rerun did not send it (it sent 20)" in text
    assert "controller.command: 30 missing (the rerun sent 20, 50 recorded)" in text


def test_the_diff_of_two_messages_names_the_first_difference() -> None:
    a = (1, {"v": torch.tensor([[1.0, 2.0], [3.0, 4.0]])})
    b = (1, {"v": torch.tensor([[1.0, 2.0], [3.5, 4.25]])})

    assert diff_values(a, a) is None
    assert diff_values(a, b) == (
        "a tensor of shape (2, 2) float32 at [1]['v']: 2 of 4 element(s) differ, max abs "
        "difference 0.5; the first at index [1, 0]: 3.0 in the recording, 3.5 in the rerun")
    assert diff_values(0.0, -0.0) == "0.0 in the recording, -0.0 in the rerun (difference -0.0)"
    assert diff_values(float("nan"), float("nan")) is None
    assert diff_values([1, 2], [1, 2, 3]).startswith("2 items in the recording, 3 in the rerun")
    assert diff_values(torch.zeros(2), torch.zeros(3)) == (
        "a tensor of shape (2,) float32 in the recording, (3,) float32 in the rerun")


# -- random nets --------------------------------------------------------------------------


def _without(tree: dict, replaced: set[str]) -> dict:
    """The sections of a tree that belong to the nodes that ran (not those replaced)."""
    def ran(port_or_node: str, node_paths: bool) -> bool:
        node = port_or_node if node_paths else port_or_node.rpartition(".")[0]
        return not any(node == r or node.startswith(r + ".") for r in replaced)

    return {
        "nodes": {p: s for p, s in tree["nodes"].items() if ran(p, True)},
        "schedule": {p: s for p, s in tree["schedule"].items() if ran(p, True)},
        "inputs": {p: m for p, m in tree["inputs"].items() if ran(p, False)},
        "pending": {p: m for p, m in tree["pending"].items() if ran(p, False)},
        "time_ns": tree["time_ns"],
    }


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(desc=nets(max_top=4), pick=st.integers(0, 63), seed=st.integers(0, 2**32))
@pytest.mark.timeout(120)
def test_a_random_net_with_a_node_replayed_runs_as_recorded(tmp_path: Any, desc: dict,
                                                             pick: int, seed: int) -> None:
    senders = [n["path"] for n in desc["nodes"] if n["outs"]]
    replaced = senders[pick % len(senders)] if senders else desc["nodes"][0]["path"]
    path = str(tmp_path / f"random-{seed}.mcap")
    recorded = record(make_random_net(**desc), path, timer="simulated", duration=0.012,
                      seed=seed, workers=2)
    expected = _without(recorded.state_dict(), {replaced})

    for workers in (1, 4):
        with mujou.run(make_random_net(**desc), timer="simulated", duration=0.012,
                       workers=workers, replay=mujou.Replay(path, replace=[replaced])) as run:
            run.join(60)
        assert diff_values(_without(run.state_dict(), {replaced}), expected) is None
    if recorded_messages(path):  # an empty file is no golden file
        assert assert_replay_matches(path, make_random_net(**desc), replace=[replaced],
                                     workers=4) == recorded_messages(path)


def recorded_messages(path: str) -> int:
    """How many messages a recording holds."""
    return mcapfile.info(path).messages


# -- the stand-in -------------------------------------------------------------------------


def test_a_replaced_node_sends_at_its_recorded_keys_and_its_inputs_never_wake_it(
        tmp_path: Any) -> None:
    path = str(tmp_path / "loop.mcap")
    recorded = record(loop_net(), path, timer="simulated", duration=0.05, seed=1, workers=1)
    net = loop_net()

    run, sent = capture(net, ["source.out", "echo.out"], timer="simulated", duration=0.05,
                        workers=1, replay=mujou.Replay(path, replace=["source"]))

    assert [(t, d, v) for t, d, v in sent["source.out"]] == [
        (t, 0, n) for n, t in enumerate(range(10_000_000, 50_000_001, 10_000_000), 1)]
    assert [(t, d, v) for t, d, v in sent["echo.out"]] == [
        (t, 1, 2 * n) for n, t in enumerate(range(10_000_000, 50_000_001, 10_000_000), 1)]
    assert net["source"].updates == 0  # its code never ran
    # The echo's messages reach its Input, taken in at the stand-in's wakeups (the last
    # one, sent after the last wakeup, waits), but never wake it (they did when recorded).
    tree = run.state_dict()
    assert run.read("source.back") == 8
    assert tree["pending"]["source.back"] == [10]
    assert recorded.stats().nodes["source"].updates == 10
    assert run.stats().nodes["source"].updates == 5
    assert tree["nodes"]["source"] == {}


def test_a_replay_from_a_state_resumes_after_the_tree_time(golden: tuple[str, Pendulum]) -> None:
    path, recorded = golden
    first = mujou.run(Pendulum(), timer="simulated", duration=0.25, seed=3)
    first.join()
    tree = first.state_dict()
    at = tree["time_ns"]
    net = Pendulum()

    run = mujou.run(net, timer="simulated", duration=0.25, state=tree,
                    replay=mujou.Replay(path, replace=["plant"]))
    run.join()

    # The log's clock (a plain int, not in the state) starts at 0 again.
    assert net.log.seen == [(t - at, kind, v) for t, kind, v in recorded.log.seen if t > at]
    # A wakeup per recorded tick after the tree's time, and one as it resumes (sending none).
    assert run.stats().nodes["plant"].updates == 125 + 1


def test_real_time_replays_at_the_recorded_times_divided_by_the_speed(tmp_path: Any) -> None:
    path = str(tmp_path / "loop.mcap")
    record(loop_net(), path, timer="simulated", duration=0.2, seed=1, workers=1)
    started = time.perf_counter()

    _, sent = capture(loop_net(), ["source.out"], timer="realtime", duration=0.05,
                      workers=1, replay=mujou.Replay(path, replace=["source"], speed=4))

    assert time.perf_counter() - started >= 0.05
    assert [(t, d, v) for t, d, v in sent["source.out"]] == [
        (t // 4, 0, n) for n, t in enumerate(range(10_000_000, 200_000_001, 10_000_000), 1)]


def test_a_loop_starts_the_recording_again_one_length_later(tmp_path: Any) -> None:
    path = str(tmp_path / "loop.mcap")
    record(loop_net(), path, timer="simulated", duration=0.03, seed=1, workers=1)

    _, sent = capture(loop_net(), ["source.out"], timer="simulated", duration=0.08,
                      workers=1, replay=mujou.Replay(path, replace=["source"], loop=True))

    assert [(t, v) for t, _, v in sent["source.out"]] == [
        (10_000_000, 1), (20_000_000, 2), (30_000_000, 3),
        (40_000_000, 1), (50_000_000, 2), (60_000_000, 3),
        (70_000_000, 1), (80_000_000, 2)]


# -- errors -----------------------------------------------------------------------------------


def test_a_replaced_path_that_is_no_node_lists_the_nodes(golden: tuple[str, Pendulum]) -> None:
    path, _ = golden

    with pytest.raises(ValueError, match=r"Replay\(replace=\) names 'plnt', which is no node of "
                                         r"the net \(nodes: '', 'plant', 'sensor', 'controller', "
                                         r"'log'\)"):
        mujou.run(Pendulum(), timer="simulated", replay=mujou.Replay(path, replace=["plnt"]))


def test_outputs_missing_from_the_recording_are_named(tmp_path: Any) -> None:
    path = str(tmp_path / "part.mcap")
    record(Pendulum(), path, only=["plant.*"], timer="simulated", duration=0.02, seed=1)
    net = Pendulum()

    with pytest.raises(ValueError) as caught:
        mujou.run(net, timer="simulated",
                  replay=mujou.Replay(path, replace=["sensor", "controller"]))

    # sensor.measurement is read by the controller only, which is replaced too: not needed.
    assert str(caught.value) == (
        f"mujou.run: replace=['sensor', 'controller'] needs what {path} did not record: "
        "controller.command (read by plant.command, log.command) (its channels: "
        "plant.state); record them (Recording(ports=))")
    run = mujou.run(net, timer="simulated", duration=0.01)  # the nodes were given back
    run.join()


def test_an_output_that_sent_nothing_is_a_recorded_channel_all_the_same(tmp_path: Any) -> None:
    path = str(tmp_path / "quiet.mcap")
    record(Pendulum(stop_after=0), path, timer="simulated", duration=0.05, seed=1)
    net = Pendulum()

    channels = {c.topic: c.count for c in mcapfile.info(path).channels}
    run = mujou.run(net, timer="simulated", duration=0.05,
                    replay=mujou.Replay(path, replace=["controller"]))
    run.join()

    assert channels == {"plant.state": 26, "sensor.measurement": 12, "controller.command": 0}
    assert [kind for _, kind, _ in net.log.seen] == ["state"] * 26


def test_a_file_that_is_not_a_recording_is_a_recording_error(tmp_path: Any) -> None:
    path = tmp_path / "notes.mcap"
    path.write_text("not an MCAP file\n")

    with pytest.raises(mujou.RecordingError, match="not an MCAP file"):
        mujou.run(Pendulum(), timer="simulated", replay=mujou.Replay(path, replace=["plant"]))


@pytest.mark.parametrize(("kwargs", "error", "text"), [
    ({"replay": 3}, TypeError, "replay must be None, a path"),
    ({"replay": mujou.Replay("x.mcap", speed=2.0), "timer": "simulated"},
     ValueError, "applies to the real-time timer"),
    ({"replay": "x.mcap", "placement": {"plant": "a"}}, ValueError, "one process"),
])
def test_bad_replay_arguments_are_refused_before_anything_runs(kwargs: dict, error: type,
                                                                 text: str) -> None:
    net = Pendulum()

    with pytest.raises(error, match=text):
        mujou.run(net, **kwargs)

    assert net.plant._mujou_run is None


def test_a_golden_file_recorded_in_real_time_is_refused(tmp_path: Any) -> None:
    path = str(tmp_path / "rt.mcap")
    record(Pendulum(), path, timer="realtime", duration=0.02, seed=1)

    with pytest.raises(ValueError, match="recorded with the realtime timer"):
        assert_replay_matches(path, Pendulum())


# -- the command ---------------------------------------------------------------------------------


def _mujou(*args: str, cwd: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "mujou_actors", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


NET_FILE = """
import sys
sys.path.insert(0, {root!r})
from tests.nets.replay_nets import Pendulum
net = Pendulum()
"""


@pytest.mark.slow
def test_mujou_replay_runs_the_net_with_the_recording_in_place_of_a_node(
        golden: tuple[str, Pendulum], tmp_path: Any) -> None:
    path, _ = golden
    (tmp_path / "net.py").write_text(NET_FILE.format(root=ROOT))

    done = _mujou("replay", path, "net.py", "--replace", "plant", "--speed", "0",
                  "--record", "again.mcap", cwd=str(tmp_path))

    assert done.returncode == 0, done.stderr
    assert f"replayed {path} for plant: 0.500 s of the run's timer" in done.stderr
    assert "recorded 426 messages to again.mcap" in done.stderr  # as mujou run says it
    rows = {line.split("\t")[0]: line.split("\t") for line in done.stdout.splitlines()}
    assert rows["plant"][0] == "plant" and rows["log"][0] == "log"
    # The replay, recorded: the recording's messages again, at the same keys, bit for bit.
    again = [tuple(r)[:1] + tuple(r)[2:] for r in mcapfile.read(tmp_path / "again.mcap")]
    first = [tuple(r)[:1] + tuple(r)[2:] for r in mcapfile.read(path)]
    assert len(again) == len(first) == 426
    assert diff_values(again, first) is None


@pytest.mark.slow
def test_mujou_replay_records_view_channels_and_serves_the_foxglove_live_view(
        golden: tuple[str, Pendulum], tmp_path: Any) -> None:
    pytest.importorskip("websockets")
    path, _ = golden
    (tmp_path / "net.py").write_text(NET_FILE.format(root=ROOT))

    done = _mujou("replay", path, "net.py", "--replace", "plant", "--speed", "0", "--quiet",
                  "--record", "again.mcap", "--record-view", "--foxglove=:0",
                  cwd=str(tmp_path))

    assert done.returncode == 0, done.stderr
    info = mcapfile.info(tmp_path / "again.mcap")
    assert [v.view_of for v in info.views] == [c.topic for c in info.channels]
    assert len(info.views) == 3  # plant.state, sensor.reading, controller.command
    served = _mujou("replay", path, "net.py", "--replace", "plant", "--speed", "0",
                    "--foxglove=:0", cwd=str(tmp_path))
    assert served.returncode == 0, served.stderr
    assert "foxglove: live view at ws://127.0.0.1:" in served.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("args", "text"), [
    (["--speed", "0"], "name the nodes the recording stands in for with --replace"),
    (["--replace", "plant", "--replace", "nothing"], "which is no node of the net"),
])
def test_mujou_replay_usage_errors_are_one_line_and_exit_2(
        golden: tuple[str, Pendulum], tmp_path: Any, args: list[str], text: str) -> None:
    path, _ = golden
    (tmp_path / "net.py").write_text(NET_FILE.format(root=ROOT))

    done = _mujou("replay", path, "net.py", *args, cwd=str(tmp_path))

    assert done.returncode == 2
    assert text in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_mujou_replay_of_a_file_that_is_not_mcap_exits_2(tmp_path: Any) -> None:
    (tmp_path / "net.py").write_text(NET_FILE.format(root=ROOT))
    (tmp_path / "x.mcap").write_bytes(b"\x00" * 64)

    done = _mujou("replay", "x.mcap", "net.py", "--replace", "plant", cwd=str(tmp_path))

    assert done.returncode == 2
    assert "not an MCAP file" in done.stderr



class _Shapes(mujou.Node):
    """Sends a float tensor every 10 ms: of 2 elements, but of 3 at its 3rd update."""

    out = mujou.Output(torch.Tensor)

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.out.send(torch.full((3 if self.n == 3 else 2,), float(self.n)))


class _Strict(_Shapes):
    """The same node, its Output declared of 2 elements: the 3rd recorded message fails it."""

    out = mujou.Output(torch.Tensor, shape=(2,))


class _Taker(mujou.Node):
    """Keeps the first element of every tensor it gets (triggered)."""

    inp = mujou.Input(torch.Tensor, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.got: list[float] = []

    def on_update(self, dt: float) -> None:
        self.got += [float(m[0]) for m in self.inp.drain()]


def _shapes_net(sender: mujou.Node) -> dict[str, mujou.Node]:
    net = {"src": sender, "sink": _Taker()}
    mujou.connect(net["src"].out, net["sink"].inp)
    return net


def test_a_stand_in_restarted_alone_goes_on_after_the_restart(tmp_path: Any) -> None:
    path = str(tmp_path / "shapes.mcap")
    record(_shapes_net(_Shapes()), path, timer="simulated", duration=0.06, seed=1)
    net = _shapes_net(_Strict())

    run, sent = capture(net, ["src.out"], timer="simulated", duration=0.06,
                        replay=mujou.Replay(path, replace=["src"]),
                        supervisor=mujou.Supervisor(restart="one_for_one"))

    # The 3rd message does not fit the Output: the stand-in's hook raises at 30 ms and
    # is restarted alone; it goes on with the 4th at 40 ms (none sent twice or early).
    assert [(t, float(m[0])) for t, _, m in sent["src.out"]] == [
        (10_000_000, 1.0), (20_000_000, 2.0), (40_000_000, 4.0), (50_000_000, 5.0),
        (60_000_000, 6.0)]
    assert net["sink"].got == [1.0, 2.0, 4.0, 5.0, 6.0]
    assert run.stats().nodes["src"].restarts == 1


class _Wide(Plant):
    """The plant with its state declared of 3 elements."""

    state = mujou.Output(torch.Tensor, shape=(3,), dtype=torch.float64)


def test_an_output_recorded_with_another_declared_shape_is_refused(
        golden: tuple[str, Pendulum]) -> None:
    path, _ = golden
    net = {"plant": _Wide(), "log": _Taker()}
    mujou.connect(net["plant"].state, net["log"].inp)

    with pytest.raises(ValueError, match=r"recorded 'plant.state' with shape \[2\], but the "
                                         r"net declares \[3\]"):
        mujou.run(net, timer="simulated", replay=mujou.Replay(path, replace=["plant"]))
