"""`mujou param list/get/set`: a running net's parameters from another process.

As tests/test_attach.py: each command runs in a subprocess, as from a second
terminal, against a runtime folder of the test's own. The net is
tests/nets/param_nets.py's, in real time: ``sensor`` updates every 20 ms, so a
set applies within a period (waited for, bounded, on the node's ``changes``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import mujou_actors as mujou
from mujou_actors import attach
from mujou_actors.cli_attach import param_text
from mujou_actors.errors import AttachError
from tests.nets import param_nets
from tests.test_attach import _mujou, runtime  # noqa: F401 - runtime: a fixture

pytestmark = pytest.mark.timeout(300)


def _until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.fixture
def running(runtime: Path) -> Iterator[tuple[Any, Any]]:  # noqa: F811 - the fixture
    net = param_nets.make_net()
    run = mujou.run(net, timer="realtime")
    try:
        yield run, net["sensor"]
    finally:
        run.stop()
        run.join(timeout=20)


def test_list_shows_each_parameter_and_json_its_declaration_and_value(running: Any) -> None:
    run, _ = running
    me = str(os.getpid())

    table = _mujou("param", "list", me)
    listed = _mujou("param", "list", me, "--json")

    assert table.returncode == 0, table.stderr
    assert [line.split() for line in table.stdout.splitlines()] == [
        ["parameter", "type", "value", "default", "range/choices", "description"],
        ["sensor.noise", "float", "0.01", "0.01", "[0.0,", "1.0]", "std", "of", "the", "noise,",
         "m"],
        ["sensor.mode", "str", '"fast"', '"fast"', '"fast"', "|", '"slow"', "how", "it",
         "samples"],
        ["sensor.samples", "int", "(read-only)", "3", "3", "[1,", "100]", "per", "update"],
        ["sensor.enabled", "bool", "true", "true", "-", "-"]]
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == run.describe_params()


def test_get_prints_the_value_and_set_parses_the_text_by_the_parameters_type(
        running: Any) -> None:
    run, sensor = running
    me = str(os.getpid())

    got = _mujou("param", "get", me, "sensor.noise")
    noise = _mujou("param", "set", me, "sensor.noise", "0.5")
    off = _mujou("param", "set", me, "sensor.enabled", "FALSE")
    mode = _mujou("param", "set", me, "sensor.mode", "slow", "--json")
    _until(lambda: len(sensor.changes) == 3, "the three sets applied")  # at next updates
    after = _mujou("param", "get", me, "sensor.noise", "--json")

    assert (got.returncode, got.stdout) == (0, "0.01\n")
    assert noise.returncode == 0, noise.stderr
    assert noise.stdout == ("sensor.noise: 0.01 -> 0.5 (set; the node applies it at its next "
                            "update)\n")
    assert off.returncode == 0 and off.stdout.startswith("sensor.enabled: true -> false")
    answer = json.loads(mode.stdout)
    assert (answer["path"], answer["old"], answer["value"]) == ("sensor.mode", "fast", "slow")
    assert answer["key"][0] > 0 and answer["key"][1] >= 0  # (t_ns, delta) it applies from
    assert sorted(sensor.changes) == [("enabled", True, False), ("mode", "fast", "slow"),
                                      ("noise", 0.01, 0.5)]
    assert json.loads(after.stdout) == {"path": "sensor.noise",
                                        **run.describe_params()["sensor.noise"]}
    assert json.loads(after.stdout)["value"] == 0.5


@pytest.mark.parametrize("args, words", [
    (["set", "sensor.noise", "-0.5"], "parameter 'sensor.noise': -0.5 is below the range's "
                                      "low bound 0.0"),
    (["set", "sensor.noise", "lots"], "parameter 'sensor.noise': 'lots' is not a float"),
    (["set", "sensor.enabled", "maybe"], "parameter 'sensor.enabled': 'maybe' is not a bool"),
    (["set", "sensor.mode", "medium"], "is not one of the choices ['fast', 'slow']"),
    (["set", "sensor.samples", "4"], "parameter 'sensor.samples': is read-only"),
    (["set", "sensor.nois", "1"], "has no parameter 'nois' (its parameters: ['enabled', "
                                  "'mode', 'noise', 'samples'])"),
    (["get", "idle.gain"], "no node 'idle' with parameters in this run (nodes with "
                           "parameters: ['sensor'])"),
])
def test_what_the_run_refuses_is_one_line_and_exit_2_and_changes_nothing(
        running: Any, args: list[str], words: str) -> None:
    run, sensor = running
    before = run.params()

    result = _mujou("param", args[0], str(os.getpid()), *args[1:])

    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert words in result.stderr and result.stdout == ""
    assert run.params() == before and sensor.changes == []


def test_the_requests_answer_the_runs_declarations_and_refuse_a_value_that_is_no_text(
        running: Any) -> None:
    run, _ = running
    entry = attach.list_runs()[0]

    with attach.Connection(entry) as conn:
        described = conn.request("params")["params"]
        with pytest.raises(AttachError, match="value must be the value's text") as not_text:
            conn.request("set_param", path="sensor.noise", value=0.5)
        with pytest.raises(attach.Refused, match="'sensor.x'") as no_such:
            conn.request("params", path="sensor.x")

    assert described == run.describe_params()
    assert not isinstance(not_text.value, attach.Refused)  # a client's bug, not the user's
    assert "node 'sensor' (Sensor) has no parameter 'x'" in str(no_such.value)


def test_a_run_without_parameters_says_so(runtime: Path) -> None:  # noqa: F811 - the fixture
    run = mujou.run({"idle": param_nets.Idle()}, timer="realtime")
    try:
        table = _mujou("param", "list", str(os.getpid()))
        listed = _mujou("param", "list", str(os.getpid()), "--json")
    finally:
        run.stop()
        run.join(timeout=20)

    assert (table.returncode, table.stdout) == (0, "")
    assert table.stderr.endswith("has no parameters\n") and str(os.getpid()) in table.stderr
    assert (listed.returncode, json.loads(listed.stdout)) == (0, {})


@pytest.mark.parametrize("value, text", [(True, "true"), (False, "false"), (0.5, "0.5"),
                                         (1.0, "1.0"), (3, "3"), ("fast", "fast")])
def test_a_value_is_printed_as_set_takes_it_back(value: Any, text: str) -> None:
    assert param_text(value) == text


@pytest.mark.slow
def test_a_placed_runs_parameters_are_listed_and_set_in_their_group(
        runtime: Path) -> None:  # noqa: F811 - the fixture
    run = mujou.run(param_nets.make_net, placement={"sensor": "physics"}, timer="realtime")
    try:
        me = str(os.getpid())
        listed = _mujou("param", "list", me, "--json")
        result = _mujou("param", "set", me, "sensor.noise", "0.25")
        stats = run.stats()
        # The group's node applies it at its next update (20 ms): its readings say when.
        applied = run.wait_for("sensor.reading", lambda r: r["noise"] == 0.25, timeout=30)
        params = run.params()
    finally:
        run.stop()
        run.join(timeout=30)

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("sensor.noise: 0.01 -> 0.25")
    assert json.loads(listed.stdout)["sensor.noise"]["value"] == 0.01
    assert stats.groups["physics"].nodes == ("sensor",)
    assert applied["noise"] == 0.25 and params["sensor.noise"] == 0.25
