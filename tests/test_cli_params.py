"""`mujou run --param PATH=VALUE` and `--foxglove-params`.

The net is tests/nets/param_nets.py's; its ``sensor`` writes its parameters'
values to ``$MUJOU_TEST_PARAMS_OUT`` as it stops, which the tests read (a run
of another process, or a group's). What the command refuses is refused before
the run starts: no value written, nothing started.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mujou_actors as mujou

ROOT = Path(__file__).resolve().parent.parent
NETS = "tests/nets/param_nets.py"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cli_logging() -> Iterator[None]:
    """The command adds a handler to the library's logger: in-process, take it away again."""
    logger = logging.getLogger("mujou_actors")
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    """`mujou run` in a subprocess; its result and the sensor's values at its stop (or None)."""
    out = tmp_path / "params.json"
    result = subprocess.run(
        [sys.executable, "-m", "mujou_actors", "run", *args, "--timer", "simulated",
         "--duration", "0.1", "--quiet"], cwd=ROOT, capture_output=True, text=True,
        timeout=100, env={**os.environ, "MUJOU_TEST_PARAMS_OUT": str(out)})
    return result, json.loads(out.read_text()) if out.exists() else None


def _invoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    """`mujou run` in this process (click's runner): for what is refused before any run."""
    from click.testing import CliRunner

    from mujou_actors.cli import main

    monkeypatch.setenv("MUJOU_TEST_PARAMS_OUT", str(tmp_path / "params.json"))
    return CliRunner().invoke(main, ["run", *args, "--timer", "simulated", "--duration",
                                     "0.1", "--quiet"])


@pytest.mark.slow
def test_each_value_is_read_as_its_parameters_type_before_the_run_starts(
        tmp_path: Path) -> None:
    result, values = _run(tmp_path, NETS, "--param", "sensor.noise=0.25", "--param",
                          "sensor.samples=7", "--param", "sensor.enabled=FALSE", "--param",
                          "sensor.mode=slow")

    assert result.returncode == 0, result.stderr
    # samples is read-only: set before the start, as mujou.run(params=) allows
    assert values == {"noise": 0.25, "mode": "slow", "samples": 7, "enabled": False}


@pytest.mark.slow
def test_with_place_the_values_reach_the_nodes_group(tmp_path: Path) -> None:
    result, values = _run(tmp_path, f"{NETS}:make_net", "--place", "sensor=physics",
                          "--param", "sensor.noise=1", "--param", "sensor.samples=9")

    assert result.returncode == 0, result.stderr
    assert values == {"noise": 1.0, "mode": "fast", "samples": 9, "enabled": True}


@pytest.mark.parametrize("params, words", [
    (["sensor.noise=2"], "--param sensor.noise=2: parameter 'sensor.noise': 2.0 is above "
                         "the range's high bound 1.0"),
    (["sensor.noise=lots"], "--param sensor.noise=lots: parameter 'sensor.noise': 'lots' is "
                            "not a float"),
    (["sensor.samples=0"], "parameter 'sensor.samples': 0 is below the range's low bound 1"),
    (["sensor.enabled=maybe"], "parameter 'sensor.enabled': 'maybe' is not a bool"),
    (["sensor.nois=1"], "parameter 'sensor.nois': node 'sensor' (Sensor) has no parameter "
                        "'nois' (its parameters: ['enabled', 'mode', 'noise', 'samples'])"),
    (["idle.gain=1"], "no node 'idle' with parameters in this run (nodes with parameters: "
                      "['sensor'])"),
    (["sensor.noise"], "--param 'sensor.noise': write PATH=VALUE"),
    (["sensor.noise=0.1", "sensor.noise=0.2"], "--param sensor.noise: given twice"),
])
@pytest.mark.parametrize("place", [False, True], ids=["one process", "placed"])
def test_a_bad_path_or_value_is_one_line_and_exit_2_before_the_run_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_logging: None, params: list[str],
        words: str, place: bool) -> None:
    started: list[Any] = []
    monkeypatch.setattr(mujou, "run", lambda *a, **k: started.append(a))
    target = [f"{NETS}:make_net", "--place", "sensor=physics"] if place else [NETS]

    result = _invoke(tmp_path, monkeypatch, *target,
                     *[arg for p in params for arg in ("--param", p)])

    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert words in result.stderr
    assert started == [] and not (tmp_path / "params.json").exists()


@pytest.mark.parametrize("flags, allowed", [([], False), (["--foxglove-params"], True)])
def test_foxglove_params_lets_the_views_clients_set_parameters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_logging: None,
        flags: list[str], allowed: bool) -> None:
    pytest.importorskip("websockets")
    served: list[bool] = []
    serve = mujou.serve_foxglove

    def recorded(run: Any, *args: Any, **kwargs: Any) -> Any:
        served.append(kwargs["allow_params"])
        return serve(run, *args, **kwargs)

    monkeypatch.setattr(mujou, "serve_foxglove", recorded)

    result = _invoke(tmp_path, monkeypatch, NETS, "--foxglove=:0", *flags)

    assert result.exit_code == 0, result.output
    assert served == [allowed]


def test_foxglove_params_goes_with_foxglove(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            cli_logging: None) -> None:
    result = _invoke(tmp_path, monkeypatch, NETS, "--foxglove-params")

    assert result.exit_code == 2
    assert "--foxglove-publish, --foxglove-params and --foxglove-origin go with --foxglove" \
        in result.stderr
