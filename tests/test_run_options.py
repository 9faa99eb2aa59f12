"""record=, replay= and placement= take one object each: Recording, Replay, Placement.

Their checks, their plain forms (a path, a mapping), the deprecated keywords that set
one field each, and the CLI flags that make the same objects.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import pathlib
from typing import Any

import pytest

import mujou_actors as mujou
from mujou_actors.recording import mcapfile

run_module = importlib.import_module("mujou_actors.run")  # mujou_actors.run is the function


class Src(mujou.Node):
    """Sends 1, 2, 3... every 10 ms, and half of it."""

    out = mujou.Output(int)
    half = mujou.Output(float)

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.out.send(self.n)
        self.half.send(self.n / 2)


class Sink(mujou.Node):
    """Keeps every message of ``src.out``, woken by each."""

    inp = mujou.Input(int, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.got: list[int] = []

    def on_update(self, dt: float) -> None:
        self.got.extend(self.inp.drain())


def make_net() -> dict[str, mujou.Node]:
    src, sink = Src(), Sink()
    mujou.connect(src.out, sink.inp)
    return {"src": src, "sink": sink}


def _recorded(path: pathlib.Path | str) -> list[tuple[str, int, int, Any]]:
    return [(r.topic, r.t_ns, r.delta, r.message) for r in mcapfile.read(path)]


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> str:
    """40 ms of the net, recorded: src.out sends 1..4 at 10..40 ms."""
    path = str(tmp_path_factory.mktemp("options") / "run.mcap")
    mujou.run(make_net(), timer="simulated", duration=0.04, seed=1, record=path).join(30)
    return path


# -- the objects' checks ------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"path": 3}, TypeError, r"Recording: path must be a non-empty str or os.PathLike"),
    ({"path": ""}, TypeError, r"Recording: path must be a non-empty"),
    ({"ports": "src.*"}, TypeError, r"Recording: ports must be a list of glob patterns"),
    ({"ports": ["src.*", 3]}, TypeError, r"Recording: ports holds 3, not a str pattern"),
    ({"ports": [""]}, ValueError, r"Recording: ports holds an empty pattern"),
    ({"snapshots": 1}, TypeError, r"Recording: snapshots must be a bool, got 1"),
    ({"view": "yes"}, TypeError, r"Recording: view must be a bool, got 'yes'"),
    ({"max_messages": 0}, ValueError, r"Recording: max_messages must be an int >= 1"),
])
def test_a_recording_refuses_a_bad_argument_naming_it(kwargs: dict, error: type,
                                                      match: str) -> None:
    arguments = {"path": "run.mcap", **kwargs}

    with pytest.raises(error, match=match):
        mujou.Recording(**arguments)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"path": None}, TypeError, r"Replay: path must be a non-empty str or os.PathLike"),
    ({"replace": "sim"}, TypeError, r"Replay: replace must be a list of node paths, not the "
                                    r"string 'sim' \(write \['sim'\]\)"),
    ({"replace": ["sim", 2]}, TypeError, r"Replay: replace must hold node paths \(str\), got 2"),
    ({"replace": 5}, TypeError, r"Replay: replace must be a list of node paths, got 5"),
    ({"speed": "2"}, TypeError, r"Replay: speed must be a number, got '2'"),
    ({"speed": True}, TypeError, r"Replay: speed must be a number, got True"),
    ({"speed": 0}, ValueError, r"Replay: speed must be a finite number > 0"),
    ({"speed": math.inf}, ValueError, r"Replay: speed must be a finite number > 0"),
    ({"loop": 1}, TypeError, r"Replay: loop must be a bool, got 1"),
    ({"allow_damaged": None}, TypeError, r"Replay: allow_damaged must be a bool, got None"),
])
def test_a_replay_refuses_a_bad_argument_naming_it(kwargs: dict, error: type,
                                                   match: str) -> None:
    arguments = {"path": "run.mcap", **kwargs}

    with pytest.raises(error, match=match):
        mujou.Replay(**arguments)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"groups": [("src", "a")]}, TypeError, r"Placement: groups must be a mapping of node "
                                            r"paths to group names, got list"),
    ({"groups": {1: "a"}}, TypeError, r"Placement: groups key 1 must be a node path"),
    ({"groups": {"src": 3}}, TypeError, r"Placement: groups\['src'\] must be a group name"),
    ({"groups": {"src": ""}}, ValueError, r"Placement: groups\['src'\] = '': a group name "
                                          r"must be a non-empty str"),
    ({"net_kwargs": {1: 2}}, TypeError, r"Placement: net_kwargs must be a mapping with str keys"),
    ({"net_kwargs": "n=2"}, TypeError, r"Placement: net_kwargs must be a mapping with str keys"),
    ({"join_timeout": 0}, ValueError, r"Placement: join_timeout must be a finite number > 0"),
    ({"join_timeout": "5"}, TypeError, r"Placement: join_timeout must be a number of seconds"),
    ({"heartbeat_timeout": -1.0}, ValueError, r"Placement: heartbeat_timeout must be a finite"),
    ({"allow_remote": "yes"}, TypeError, r"Placement: allow_remote must be True or False"),
    ({"groups": {"src": "robot:a"}}, ValueError, r"Placement: groups puts group 'a' on machine "
                                                 r"'robot': pass listen='HOST:PORT'"),
    ({"listen": "127.0.0.1:7000"}, ValueError, r"Placement: listen='127.0.0.1:7000' goes with "
                                               r"groups that put a group on another machine"),
])
def test_a_placement_refuses_a_bad_argument_naming_it(kwargs: dict, error: type,
                                                      match: str) -> None:
    arguments = {"groups": {"src": "a"}, **kwargs}

    with pytest.raises(error, match=match):
        mujou.Placement(**arguments)


def test_the_settings_are_frozen_values_shown_by_what_differs_from_the_defaults() -> None:
    groups = {"src": "a"}
    recording = mujou.Recording(pathlib.Path("run.mcap"), ports=["src.*"], view=True)
    replay = mujou.Replay("run.mcap", replace=["src"], speed=2)
    placement = mujou.Placement(groups, net_kwargs={"n": 2})

    groups["sink"] = "b"  # the placement keeps a copy

    assert repr(recording) == "Recording('run.mcap', ports=('src.*',), view=True)"
    assert repr(replay) == "Replay('run.mcap', replace=('src',), speed=2.0)"
    assert repr(placement) == "Placement({'src': 'a'}, net_kwargs={'n': 2})"
    assert recording == mujou.Recording("run.mcap", ports=("src.*",), view=True)
    assert hash(replay) == hash(mujou.Replay("run.mcap", replace=("src",), speed=2.0))
    assert placement == mujou.Placement({"src": "a"}, net_kwargs={"n": 2})
    with pytest.raises(dataclasses.FrozenInstanceError):
        recording.view = False  # type: ignore[misc]
    with pytest.raises(TypeError):
        placement.groups["sink"] = "b"  # type: ignore[index]


# -- the plain forms ----------------------------------------------------------------------


def test_a_path_records_what_a_recording_of_it_records(tmp_path: pathlib.Path) -> None:
    plain, settings = tmp_path / "plain.mcap", tmp_path / "settings.mcap"

    mujou.run(make_net(), timer="simulated", duration=0.05, seed=1, record=plain).join(30)
    mujou.run(make_net(), timer="simulated", duration=0.05, seed=1,
              record=mujou.Recording(settings)).join(30)

    assert _recorded(plain) == _recorded(settings)
    assert {topic for topic, *_ in _recorded(plain)} == {"src.out", "src.half"}


def test_a_path_replays_as_a_replay_of_it_that_replaces_nothing(recording: str) -> None:
    plain, settings = make_net(), make_net()

    mujou.run(plain, timer="simulated", duration=0.04, replay=recording).join(30)
    mujou.run(settings, timer="simulated", duration=0.04,
              replay=mujou.Replay(recording)).join(30)

    assert plain["sink"].got == settings["sink"].got == [1, 2, 3, 4]
    assert plain["src"].n == settings["src"].n == 4  # nothing replaced: src ran


def test_a_mapping_is_the_placement_of_it() -> None:
    from mujou_actors.distributed.placement import as_placement

    for placement in ({"src": "a"}, mujou.Placement({"src": "a"})):
        with pytest.raises(TypeError, match="pass the function that builds the net"):
            mujou.run(make_net(), timer="simulated", placement=placement)

    assert as_placement({"src": "a"}) == mujou.Placement({"src": "a"})
    with pytest.raises(TypeError, match=r"mujou.run: placement must be None, a mapping of "
                                        r"node paths to group names or a mujou.Placement"):
        mujou.run(make_net(), timer="simulated", placement=[("src", "a")])  # type: ignore[arg-type]


# -- the deprecated keywords --------------------------------------------------------------


def test_record_ports_warns_and_records_only_the_ports_it_names(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "run.mcap"

    with pytest.warns(DeprecationWarning, match=r"record_ports= is deprecated; use "
                                                r"record=mujou.Recording\(path, ports=\[...\]\)"):
        run = mujou.run(make_net(), timer="simulated", duration=0.03, record=path,
                        record_ports=["src.out"])
    run.join(30)

    assert [c.topic for c in mcapfile.info(path).channels] == ["src.out"]


def test_record_snapshots_warns_and_attaches_the_snapshots(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "run.mcap"

    with pytest.warns(DeprecationWarning, match=r"record_snapshots= is deprecated; use "
                                                r"record=mujou.Recording\(path, snapshots=True\)"):
        run = mujou.run(make_net(), timer="simulated", duration=0.02, record=path,
                        record_snapshots=True, supervisor=mujou.Supervisor(snapshot_every=0.01))
    run.join(30)

    assert [a.t_ns for a in mcapfile.info(path).attachments] == [0, 10_000_000, 20_000_000]


def test_record_view_warns_and_writes_the_view_channels(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "run.mcap"

    with pytest.warns(DeprecationWarning, match=r"record_view= is deprecated; use "
                                                r"record=mujou.Recording\(path, view=True\)"):
        run = mujou.run(make_net(), timer="simulated", duration=0.02, record=path,
                        record_view=True)
    run.join(30)

    assert [v.topic for v in mcapfile.info(path).views] == ["/view/src.out", "/view/src.half"]


def test_replace_warns_and_replays_the_nodes_it_names(recording: str) -> None:
    net = make_net()

    with pytest.warns(DeprecationWarning, match=r"replace= is deprecated; use "
                                                r"replay=mujou.Replay\(path, replace=\[...\]\)"):
        run = mujou.run(net, timer="simulated", duration=0.04, replay=recording,
                        replace=["src"])
    run.join(30)

    assert net["sink"].got == [1, 2, 3, 4]
    assert net["src"].n == 0  # replaced: its code never ran


def test_replay_speed_warns_and_replays_that_many_times_faster(recording: str) -> None:
    net = make_net()

    with pytest.warns(DeprecationWarning, match=r"replay_speed= is deprecated; use "
                                                r"replay=mujou.Replay\(path, speed=...\)"):
        run = mujou.run(net, timer="realtime", duration=0.01, workers=1,
                        replay=mujou.Replay(recording, replace=["src"]), replay_speed=4)
    run.join(30)

    # 40 ms of recording in 10 ms: at the recorded speed only the first message would come.
    assert net["sink"].got == [1, 2, 3, 4]


def test_replay_loop_warns_and_starts_the_recording_again(recording: str) -> None:
    net = make_net()

    with pytest.warns(DeprecationWarning, match=r"replay_loop= is deprecated; use "
                                                r"replay=mujou.Replay\(path, loop=True\)"):
        run = mujou.run(net, timer="simulated", duration=0.08,
                        replay=mujou.Replay(recording, replace=["src"]), replay_loop=True)
    run.join(30)

    assert net["sink"].got == [1, 2, 3, 4, 1, 2, 3, 4]


def test_replay_allow_damaged_warns_and_replays_up_to_the_damage(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "damaged.mcap"
    mujou.run(make_net(), timer="simulated", duration=0.1, seed=1,
              record=mujou.Recording(path, chunk_size=100)).join(30)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside a chunk: its checksum no longer matches
    path.write_bytes(bytes(data))
    with pytest.raises(mujou.RecordingError, match="damaged"):
        mujou.run(make_net(), timer="simulated", duration=0.1,
                  replay=mujou.Replay(path, replace=["src"]))
    net = make_net()

    with pytest.warns(DeprecationWarning, match=r"replay_allow_damaged= is deprecated; use "
                                                r"replay=mujou.Replay\(path, "
                                                r"allow_damaged=True\)"):
        run = mujou.run(net, timer="simulated", duration=0.1,
                        replay=mujou.Replay(path, replace=["src"]), replay_allow_damaged=True)
    run.join(30)

    got = net["sink"].got
    assert got == list(range(1, len(got) + 1)) and len(got) < 10  # what precedes the damage


@pytest.mark.parametrize(("old", "placement"), [
    ({"net_kwargs": {"n": 2}}, mujou.Placement({"src": "a"}, net_kwargs={"n": 2})),
    ({"listen": "127.0.0.1:7000"}, mujou.Placement({"src": "robot:a"}, listen="127.0.0.1:7000")),
    ({"join_timeout": 5}, mujou.Placement({"src": "a"}, join_timeout=5.0)),
    ({"allow_remote": True}, mujou.Placement({"src": "a"}, allow_remote=True)),
    ({"heartbeat_timeout": 2.5}, mujou.Placement({"src": "a"}, heartbeat_timeout=2.5)),
])
def test_a_placement_keyword_warns_and_sets_its_field_of_the_placement(
        monkeypatch: pytest.MonkeyPatch, old: dict, placement: mujou.Placement) -> None:
    started: dict[str, Any] = {}
    monkeypatch.setattr(run_module, "_start", lambda net, **kwargs: started.update(kwargs))
    name = next(iter(old))

    with pytest.warns(DeprecationWarning, match=rf"{name}= is deprecated; use "
                                                rf"placement=mujou.Placement\({{...}}, {name}="):
        mujou.run("tests.test_run_options:make_net", placement=dict(placement.groups), **old)

    assert started["placement"] == placement


def test_a_deprecated_keyword_warns_at_the_line_that_calls_run(tmp_path: pathlib.Path) -> None:
    with pytest.warns(DeprecationWarning) as warned:
        mujou.run(make_net(), timer="simulated", duration=0.01, record=tmp_path / "r.mcap",
                  record_view=True).join(30)

    assert [w.filename for w in warned] == [__file__]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"record": mujou.Recording("r.mcap", ports=["src.*"]), "record_ports": ["src.out"]},
     r"mujou.run: record_ports= and record=Recording\('r.mcap', ports=\('src.\*',\)\) both "
     r"set ports: use record=mujou.Recording\(path, ports=\[...\]\) alone"),
    ({"record": mujou.Recording("r.mcap", view=True), "record_view": True},
     r"record_view= and record=Recording\(.*\) both set view"),
    ({"replay": mujou.Replay("r.mcap", speed=2), "replay_speed": 3},
     r"replay_speed= and replay=Replay\('r.mcap', speed=2.0\) both set speed"),
    ({"replay": mujou.Replay("r.mcap", replace=["src"]), "replace": ["src"]},
     r"replace= and replay=Replay\(.*\) both set replace"),
    ({"placement": mujou.Placement({"src": "a"}, net_kwargs={"n": 1}), "net_kwargs": {"n": 2}},
     r"net_kwargs= and placement=Placement\(.*\) both set net_kwargs"),
])
def test_a_deprecated_keyword_and_an_object_that_sets_the_same_field_are_refused(
        kwargs: dict, match: str) -> None:
    net = make_net()

    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match=match):
        mujou.run(net, timer="simulated", **kwargs)

    assert net["src"]._mujou_run is None


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"record_ports": ["src.*"]}, r"mujou.run: record_ports= goes with record= \(it sets its "
                                  r"ports\): use record=mujou.Recording\(path, ports=\[...\]\)"),
    ({"record_snapshots": False}, r"record_snapshots= goes with record="),
    ({"replace": ["src"]}, r"replace= goes with replay="),
    ({"replay_loop": True}, r"replay_loop= goes with replay="),
    ({"listen": "127.0.0.1:7000"}, r"listen= goes with placement="),
    ({"join_timeout": 5.0}, r"join_timeout= goes with placement="),
])
def test_a_deprecated_keyword_without_its_argument_is_refused(kwargs: dict, match: str) -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match=match):
        mujou.run(make_net(), timer="simulated", **kwargs)


# -- the CLI ------------------------------------------------------------------------------


class _Started(Exception):
    """Raised by the stand-in for mujou.run, once it has what the command passed."""


def _invoke(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> dict[str, Any]:
    """What ``mujou ARGS`` passes to mujou.run (which it does not run)."""
    from click.testing import CliRunner

    from mujou_actors.cli import main

    passed: dict[str, Any] = {}

    def start(net: Any, **kwargs: Any) -> None:
        passed.update(kwargs)
        raise _Started

    monkeypatch.setattr(mujou, "run", start)
    result = CliRunner().invoke(main, args)
    assert "_Started" in result.output, result.output
    return passed


def test_the_cli_record_flags_make_one_recording(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: pathlib.Path) -> None:
    out = str(tmp_path / "out.mcap")

    passed = _invoke(monkeypatch, [
        "run", f"{__file__}:make_net", "--timer", "simulated", "--snapshot-every", "0.1",
        "--record", out, "--record-port", "src.*", "--record-port", "sink.*",
        "--record-snapshots", "--record-view", "--quiet"])

    assert passed["record"] == mujou.Recording(out, ports=["src.*", "sink.*"], snapshots=True,
                                               view=True)
    assert "record_ports" not in passed and "replay" not in passed


def test_the_cli_place_flags_make_one_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    passed = _invoke(monkeypatch, [
        "run", f"{__file__}:make_net", "--place", "src=robot:a", "--place", "sink=b",
        "--net-kwargs", '{"n": 2}', "--listen", "127.0.0.1:7000", "--join-timeout", "5",
        "--allow-remote", "--heartbeat-timeout", "2.5", "--quiet"])

    assert passed["placement"] == mujou.Placement(
        {"src": "robot:a", "sink": "b"}, net_kwargs={"n": 2}, listen="127.0.0.1:7000",
        join_timeout=5.0, allow_remote=True, heartbeat_timeout=2.5)
    assert "net_kwargs" not in passed and "listen" not in passed


def test_the_cli_replay_flags_make_one_replay_and_one_recording(
        monkeypatch: pytest.MonkeyPatch, recording: str, tmp_path: pathlib.Path) -> None:
    out = str(tmp_path / "out.mcap")

    passed = _invoke(monkeypatch, [
        "replay", recording, f"{__file__}:make_net", "--replace", "src", "--speed", "2",
        "--loop", "--duration", "0.1", "--record", out, "--record-port", "sink.*",
        "--record-view", "--quiet"])

    assert passed["replay"] == mujou.Replay(recording, replace=["src"], speed=2.0, loop=True)
    assert passed["record"] == mujou.Recording(out, ports=["sink.*"], view=True)
