"""Crash capsules: the last seconds of every Output and a snapshot, written when a node fails,
and the failure reproduced from them, bit for bit, in simulated time.

The net of tests/nets/capsule_nets.py fails at 3.34 s of simulated time, once its
integrator (state) has summed enough seeded noise (messages): a rerun fails at the same
instant only if both come back exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import torch

import mujou_actors as mujou
from mujou_actors.recording import mcapfile
from mujou_actors.testing import reproduce_failure
from tests.nets.capsule_nets import Net, make_fixed_net, make_net

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETS = os.path.join(ROOT, "tests", "nets", "capsule_nets.py")
FAIL_NS = 3_340_000_000


def _fail(net: mujou.Node, path: str, **kwargs: Any) -> mujou.Run:
    """Run ``net`` in simulated time until it fails; the ended run."""
    kwargs.setdefault("record_on_failure", mujou.Capsule(path, seconds=0.5))
    run = mujou.run(net, timer="simulated", duration=10.0, **kwargs)
    with pytest.raises(mujou.NodeError, match="integrator wound up"):
        run.join(60)
    return run


def _facts(path: str) -> dict[str, Any]:
    end = mcapfile.info(path).end
    assert end is not None
    return json.loads(end["capsule"])


@pytest.fixture(scope="module")
def capsule(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The capsule of the failing net (2 workers), with its whole run recorded beside it."""
    folder = tmp_path_factory.mktemp("capsule")
    path = str(folder / "capsule.mcap")
    _fail(make_net(), path, workers=2, record=str(folder / "whole.mcap"))
    return path


@pytest.mark.timeout(120)
def test_a_failure_writes_the_failure_and_the_window_since_the_older_snapshot(
        capsule: str) -> None:
    facts = _facts(capsule)
    found = mcapfile.info(capsule)

    assert facts == {"node": "integ", "hook": "on_update", "t_ns": FAIL_NS, "delta": 0,
                     "exception": "tests.nets.capsule_nets.WindUp",
                     "message": "integrator wound up: 40.336533",
                     "snapshot_ns": 2_500_000_000}  # 3.0 s is the newer snapshot
    assert [a.name for a in found.attachments] == ["snapshot-2500000000.mujou"]
    # What was sent after the snapshot (the instant 2.5 s is in it): 2.51 .. 3.34 s.
    assert {c.topic: c.count for c in found.channels} == {"src.out": 84, "integ.total": 42}
    assert found.end is not None and found.end["failure"] == \
        "node 'integ' failed in on_update: integrator wound up: 40.336533"
    assert found.complete and found.drops == {}


@pytest.mark.timeout(120)
def test_the_capsule_holds_exactly_what_a_recording_of_the_same_window_holds(
        capsule: str) -> None:
    whole = os.path.join(os.path.dirname(capsule), "whole.mcap")

    kept = list(mcapfile.read(capsule))
    recorded = [r for r in mcapfile.read(whole) if 2_500_000_000 < r.t_ns <= FAIL_NS]

    assert len(kept) == len(recorded) == 84 + 42
    for a, b in zip(kept, recorded, strict=True):
        assert (a.topic, a.sequence, a.t_ns, a.delta) == (b.topic, b.sequence, b.t_ns, b.delta)
        if isinstance(a.message, torch.Tensor):
            assert torch.equal(a.message, b.message) and a.message.dtype == b.message.dtype
        else:
            assert a.message == b.message


@pytest.mark.timeout(300)
def test_the_failure_is_reproduced_ten_times_out_of_ten_whatever_the_workers(
        capsule: str) -> None:
    results = [reproduce_failure(capsule, make_net(), workers=1 + k % 4) for k in range(10)]

    assert [r.reproduced for r in results] == [True] * 10
    assert results[0].rerun == {**_facts(capsule)}
    assert results[0].summary == (
        "reproduced: WindUp('integrator wound up: 40.336533') in integ.on_update at "
        "t = 3.340000000 s (3340000000 ns), delta 0")
    assert isinstance(results[0].error, mujou.NodeError)


@pytest.mark.timeout(120)
def test_the_failure_is_reproduced_with_the_source_replayed_from_the_capsule(
        capsule: str) -> None:
    result = reproduce_failure(capsule, make_net(), replace=["src"], workers=2)

    assert result.reproduced, result.summary


@pytest.mark.timeout(120)
def test_a_net_that_no_longer_fails_or_fails_otherwise_is_not_a_reproduction(
        capsule: str) -> None:
    fixed = reproduce_failure(capsule, make_fixed_net())
    earlier = reproduce_failure(capsule, Net(limit=30.0))

    assert not fixed.reproduced and fixed.rerun is None and fixed.error is None
    assert fixed.diverged is None  # the same messages up to the failure's time
    assert fixed.summary.endswith("the rerun ran past the failure's time without a failure")
    assert not earlier.reproduced
    assert earlier.rerun is not None and earlier.rerun["t_ns"] < FAIL_NS
    assert "(t_ns, message differ)" in earlier.summary


class _Forgetful(Net):
    """The net with a source whose state_dict leaves out its generator (no super())."""

    def __init__(self) -> None:
        super().__init__()
        self.src.state_dict = lambda: {}  # type: ignore[method-assign]
        self.src.load_state_dict = lambda state: None  # type: ignore[method-assign]


@pytest.mark.timeout(120)
def test_a_state_the_snapshot_did_not_restore_is_named_by_the_first_message_that_differs(
        tmp_path) -> None:
    path = str(tmp_path / "forgetful.mcap")
    _fail(_Forgetful(), path)

    result = reproduce_failure(path, _Forgetful())

    assert not result.reproduced
    assert result.diverged is not None and result.diverged.startswith(
        "src.out, message 0 of the capsule (t = 2.510000000 s = 2510000000 ns, delta 0): "
        "a tensor of shape (3,) float64")
    assert "before it, the rerun first differs from the capsule at src.out" in result.summary
    assert "call super().state_dict()" in result.summary


@pytest.mark.timeout(120)
def test_the_window_is_bounded_and_what_was_evicted_is_counted(tmp_path) -> None:
    path = str(tmp_path / "small.mcap")
    seen: list[int] = []

    run = mujou.run(make_net(), timer="simulated", duration=10.0,
                    record_on_failure=mujou.Capsule(path, seconds=0.5, max_messages=40))
    run.subscribe("integ.total", lambda _: seen.append(run.stats().capsule.kept))
    with pytest.raises(mujou.NodeError):
        run.join(60)
    stats = run.stats().capsule
    facts = _facts(path)
    found = mcapfile.info(path)

    assert max(seen) <= 40
    assert stats is not None and stats.written and stats.evicted > 0
    # 0.5 s is 75 messages: the older snapshot's window lost some, so the capsule
    # starts at the newer one, whose 3.01 .. 3.34 s (34 + 17 messages, the failure's
    # instant included) do not fit either.
    assert facts["snapshot_ns"] == 3_000_000_000
    assert found.messages == 40
    assert sum(found.drops.values()) == 51 - 40  # the oldest let go


@pytest.mark.timeout(120)
def test_a_run_without_a_failure_writes_no_capsule(tmp_path) -> None:
    path = tmp_path / "none.mcap"

    run = mujou.run(make_fixed_net(), timer="simulated", duration=1.0,
                    record_on_failure=str(path))
    run.join(60)

    assert not path.exists()
    stats = run.stats().capsule
    assert stats is not None and not stats.written and stats.failure is None
    assert stats.kept == 0 and stats.snapshots == 0  # let go at the end


@pytest.mark.timeout(120)
def test_with_restarts_the_run_goes_on_and_the_capsule_keeps_the_first_failure(
        tmp_path) -> None:
    path = str(tmp_path / "first.mcap")
    supervisor = mujou.Supervisor("one_for_one", max_restarts=100)

    run = mujou.run(make_net(), timer="simulated", duration=4.0, supervisor=supervisor,
                    record_on_failure=mujou.Capsule(path, seconds=0.5))
    run.join(60)

    assert run.stats().nodes["integ"].restarts >= 2
    assert supervisor.snapshot_every is None  # the user's object is left as given
    assert _facts(path)["t_ns"] == FAIL_NS
    assert reproduce_failure(path, make_net(), supervisor=supervisor).reproduced


@pytest.mark.timeout(120)
def test_a_failing_on_start_is_reproduced_from_the_start(tmp_path) -> None:
    class Bad(Exception):
        def __str__(self) -> str:
            raise RuntimeError("its own str fails")

    class StartFails(mujou.Node):
        out = mujou.Output(float)

        def __init__(self) -> None:
            super().__init__(period=0.1)

        def on_start(self) -> None:
            self.out.send(1.0)
            raise Bad()

    path = str(tmp_path / "start.mcap")
    with pytest.raises(mujou.NodeError):
        mujou.run(StartFails(), timer="simulated", duration=1.0, record_on_failure=path)
    facts = _facts(path)
    result = reproduce_failure(path, StartFails())

    assert facts["t_ns"] == facts["snapshot_ns"] == -1 and facts["hook"] == "on_start"
    assert facts["message"] == "<Bad: its str() raised>"
    assert [r.message for r in mcapfile.read(path)] == [1.0]
    assert result.reproduced, result.summary
    assert result.summary.endswith("in <root>.on_start before the timer started")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kwargs, error, match", [
    ({"seconds": 0}, ValueError, "seconds must be a finite number > 0, got 0"),
    ({"seconds": True}, TypeError, "seconds must be a number of seconds"),
    ({"max_bytes": 0}, ValueError, "max_bytes must be an int >= 1"),
    ({"max_messages": 1.5}, TypeError, "max_messages must be an int"),
])
def test_bad_capsule_settings_are_refused_naming_them(tmp_path, kwargs: dict[str, Any],
                                                     error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        mujou.Capsule(tmp_path / "c.mcap", **kwargs)


@pytest.mark.timeout(60)
def test_a_capsule_that_cannot_be_written_or_placed_is_refused_before_anything_starts(
        tmp_path) -> None:
    net = make_net()

    with pytest.raises(TypeError, match="record_on_failure must be None, a path"):
        mujou.run(net, timer="simulated", duration=1.0, record_on_failure=3)
    with pytest.raises(IsADirectoryError, match="record_on_failure file"):
        mujou.run(net, timer="simulated", duration=1.0, record_on_failure=tmp_path)
    with pytest.raises(ValueError, match="placement is not supported with it"):
        mujou.run("tests.nets.capsule_nets:make_net", timer="simulated", duration=1.0,
                  placement={"src": "a"}, record_on_failure=str(tmp_path / "c.mcap"))

    assert net._mujou_run is None  # not claimed: it runs at once
    mujou.run(net, timer="simulated", duration=0.1).join(30)


@pytest.mark.timeout(60)
def test_reproducing_a_recording_that_is_no_capsule_is_refused(tmp_path) -> None:
    path = str(tmp_path / "plain.mcap")
    mujou.run(make_fixed_net(), timer="simulated", duration=0.1, record=path).join(30)

    with pytest.raises(ValueError, match="is a recording, not a crash capsule"):
        reproduce_failure(path, make_fixed_net())
    with pytest.raises(ValueError, match="the capsule sets timer="):
        reproduce_failure(path, make_fixed_net(), timer="realtime")


def _mujou(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mujou_actors", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_command_line_writes_inspects_and_reproduces_a_capsule(tmp_path) -> None:
    path = str(tmp_path / "cli.mcap")

    ran = _mujou("run", f"{NETS}:make_net", "--timer", "simulated", "--duration", "10",
                 "--quiet", "--capsule", path, "--capsule-seconds", "0.5")
    inspected = _mujou("inspect", path)
    replayed = _mujou("replay", path, f"{NETS}:make_net", "--workers", "2")
    fixed = _mujou("replay", path, f"{NETS}:make_fixed_net")
    refused = _mujou("replay", path, f"{NETS}:make_net", "--loop")

    assert ran.returncode == 1, ran.stderr
    assert f"crash capsule written to {path}: reproduce the failure with `mujou replay " \
           f"{path} {NETS}:make_net`" in ran.stderr
    assert inspected.returncode == 0, inspected.stderr
    assert "crash capsule: from the snapshot at 2.500 s to the failure at 3.340000000 s, " \
           "delta 0" in inspected.stdout
    assert replayed.returncode == 1, replayed.stderr
    assert replayed.stdout.startswith("reproduced: WindUp('integrator wound up: 40.336533') "
                                      "in integ.on_update at t = 3.340000000 s")
    assert "integrator wound up" in replayed.stderr  # the failure, as `mujou run` says it
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout.startswith("not reproduced:")
    assert refused.returncode == 2 and "--speed, --loop, --duration, --seed and --record" \
        in refused.stderr
    sped = _mujou("replay", path, f"{NETS}:make_net", "--speed", "3")
    assert sped.returncode == 2 and "--speed, --loop" in sped.stderr
    # The CLI names the file's module by its stem, as `import capsule_nets` does: the
    # capsule's exception is the one a script importing the file raises, and reproduces.
    assert _facts(path)["exception"] == "capsule_nets.WindUp"
    script = ("import sys; sys.path.insert(0, sys.argv[1]); from capsule_nets import make_net; "
              "from mujou_actors.testing import reproduce_failure; "
              "print(reproduce_failure(sys.argv[2], make_net()).summary)")
    python = subprocess.run([sys.executable, "-c", script, os.path.dirname(NETS), path],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert python.stdout.startswith("reproduced: WindUp("), python.stdout + python.stderr


@pytest.mark.timeout(60)
def test_a_capsule_is_no_golden_file(capsule: str) -> None:
    from mujou_actors.testing import assert_replay_matches

    with pytest.raises(ValueError, match="is a crash capsule .*reproduce_failure"):
        assert_replay_matches(capsule, make_net())


@pytest.mark.timeout(60)
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_capsule_that_cannot_be_written_leaves_what_its_path_names(tmp_path) -> None:
    import stat

    link = tmp_path / "capsule.mcap"
    os.symlink("/dev/full", link)  # every write: no space left

    run = mujou.run(make_net(), timer="simulated", duration=10.0,
                    record_on_failure=mujou.Capsule(str(link), seconds=0.5))
    with pytest.raises((mujou.NodeError, OSError)):
        run.join(60)

    # Not a half-written capsule of the writer's making: left as it was.
    assert os.path.islink(link) and os.readlink(link) == "/dev/full"
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    assert run.stats().capsule is not None and run.stats().capsule.error is not None
