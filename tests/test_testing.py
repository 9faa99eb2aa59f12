"""mujou.testing's helpers take mujou.run's deprecated keywords as mujou.run does.

`check_restore`, `assert_replay_matches` and `reproduce_failure` pass their
``**run_kwargs`` on to their runs: an old keyword (``replace=``, ``record_ports=``...)
warns with mujou.run's `DeprecationWarning`, at the line that called the helper, and
sets its field of ``record=``, ``replay=`` or ``placement=``, with mujou.run's errors.
One that sets a field of an argument the helper sets itself is refused as that
argument is (see tests/test_run_options.py for mujou.run's own).
"""

from __future__ import annotations

import pathlib
import warnings
from typing import Any

import pytest
import torch

import mujou_actors as mujou
from mujou_actors.recording import mcapfile
from mujou_actors.testing import assert_replay_matches, check_restore, reproduce_failure


class Counter(mujou.Node):
    """Sends a count every 10 ms, kept in a plain attribute: a restore loses it."""

    out = mujou.Output(float)

    def __init__(self) -> None:
        super().__init__(period=0.01, seed=1)
        self.k = 0

    def on_update(self, dt: float) -> None:
        self.k += 1
        self.out.send(float(self.k))


class Sum(mujou.Node):
    """Adds what it receives, in a tensor (its state), and sends the sum."""

    inp = mujou.Input(float, trigger=True, depth=None)
    total = mujou.Output(float)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.acc = torch.zeros(())

    def on_update(self, dt: float) -> None:
        for value in self.inp.drain():
            self.acc += value
        self.total.send(float(self.acc))


def counting() -> dict[str, mujou.Node]:
    """A counter feeding a sum."""
    counter, total = Counter(), Sum()
    mujou.connect(counter.out, total.inp)
    return {"c": counter, "s": total}


class Wearing(mujou.Node):
    """Fails when its count reaches 5 (t = 50 ms)."""

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.k = 0

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "k": self.k}

    def on_update(self, dt: float) -> None:
        self.k += 1
        if self.k == 5:
            raise RuntimeError("worn out")


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A recording of `counting`, 100 ms in simulated time."""
    path = str(tmp_path_factory.mktemp("golden") / "counting.mcap")
    mujou.run(counting(), timer="simulated", duration=0.1, seed=0, record=path).join(60)
    return path


@pytest.fixture(scope="module")
def capsule(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The crash capsule of `Wearing`'s failure."""
    path = str(tmp_path_factory.mktemp("capsule") / "capsule.mcap")
    run = mujou.run({"w": Wearing()}, timer="simulated", duration=1.0,
                    supervisor=mujou.Supervisor(snapshot_every=0.02),
                    record_on_failure=mujou.Capsule(path, seconds=0.02))
    with pytest.raises(mujou.NodeError, match="worn out"):
        run.join(60)
    return path


def _deprecations(warned: list[warnings.WarningMessage]) -> list[tuple[str, str]]:
    return [(str(w.message), w.filename) for w in warned
            if issubclass(w.category, DeprecationWarning)]


# -- check_restore ----------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_check_restore_takes_replace_as_mujou_run_does_warning_once(golden: str) -> None:
    made: list[dict[str, mujou.Node]] = []

    def make() -> dict[str, mujou.Node]:
        made.append(counting())
        return made[-1]

    alone = check_restore(counting, at=0.05, duration=0.1)
    new = check_restore(make, at=0.05, duration=0.1,
                        replay=mujou.Replay(golden, replace=["c"]))
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        old = check_restore(make, at=0.05, duration=0.1, replay=golden, replace=["c"])

    # one warning for the check's three runs, at this file's line, in mujou.run's words
    assert _deprecations(warned) == [("replace= is deprecated; use "
                                      "replay=mujou.Replay(path, replace=[...])", __file__)]
    # the counter replayed from the recording: its plain count, lost by a restore when it
    # runs, is never counted
    assert not alone.ok and alone.node == "c"
    assert old == new and old.ok and old.compared == new.compared > 0
    assert all(net["c"].k == 0 for net in made)


def test_check_restore_refuses_an_old_keyword_without_its_argument_as_mujou_run_does(
        ) -> None:
    with pytest.warns(DeprecationWarning, match=r"record_ports= is deprecated") as warned, \
            pytest.raises(TypeError, match=r"check_restore: record_ports= goes with record= "
                                           r"\(it sets its ports\): use record=mujou."
                                           r"Recording\(path, ports=\[...\]\)"):
        check_restore(counting, at=0.05, duration=0.1, record_ports=["c.out"])

    assert [w.filename for w in warned] == [__file__]


def test_check_restore_takes_an_old_keyword_of_none_as_not_given() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        found = check_restore(counting, at=0.05, duration=0.1, replace=None)

    assert found.node == "c"  # the counter ran, and its count was lost


# -- assert_replay_matches --------------------------------------------------------------


@pytest.mark.timeout(120)
def test_assert_replay_matches_takes_record_ports_as_mujou_run_does(
        golden: str, tmp_path: pathlib.Path) -> None:
    rerun = tmp_path / "rerun.mcap"

    deprecated = r"record_ports= is deprecated; use record=mujou.Recording\(path, ports=\[...\]\)"
    with pytest.warns(DeprecationWarning, match=deprecated) as warned:
        compared = assert_replay_matches(golden, counting(), replace=["c"], record=rerun,
                                         record_ports=["s.total"])

    assert compared == 20 and [w.filename for w in warned] == [__file__]
    assert [c.topic for c in mcapfile.info(rerun).channels] == ["s.total"]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"replay": "other.mcap"}, r"assert_replay_matches: the rerun replays golden itself; "
                               r"leave out replay="),
    ({"replay_speed": 2.0}, r"assert_replay_matches: replay_speed= sets the speed of replay=, "
                            r"which assert_replay_matches sets itself; leave it out"),
    ({"replay_loop": True}, r"replay_loop= sets the loop of replay="),
])
def test_assert_replay_matches_refuses_the_old_keywords_of_its_replay_as_replay_itself(
        golden: str, kwargs: dict[str, Any], match: str) -> None:
    net = counting()
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=match):
            assert_replay_matches(golden, net, **kwargs)

    old = [name for name in kwargs if name != "replay"]
    assert [message.split("=")[0] for message, _ in _deprecations(warned)] == old
    assert net["c"]._mujou_run is None  # refused before anything ran


# -- reproduce_failure ------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"record": "mine.mcap"}, r"reproduce_failure: the capsule sets record=; leave it out"),
    ({"record_ports": ["w.*"]}, r"reproduce_failure: record_ports= sets the ports of record=, "
                                r"which reproduce_failure sets itself; leave it out"),
    ({"record_view": True}, r"record_view= sets the view of record="),
    ({"replay_loop": True}, r"replay_loop= sets the loop of replay="),
    ({"replay_allow_damaged": True}, r"replay_allow_damaged= sets the allow_damaged of replay="),
])
def test_reproduce_failure_refuses_the_old_keywords_of_its_record_and_replay_as_those(
        capsule: str, kwargs: dict[str, Any], match: str) -> None:
    # Before, they passed its check and changed the rerun's own recording or replay.
    net = {"w": Wearing()}
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=match):
            reproduce_failure(capsule, net, **kwargs)

    old = [name for name in kwargs if name != "record"]
    assert [(message.split("=")[0], where) for message, where in _deprecations(warned)] == [
        (name, __file__) for name in old]
    assert net["w"]._mujou_run is None


@pytest.mark.timeout(120)
def test_reproduce_failure_still_reproduces_with_an_old_keyword_of_none(capsule: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        found = reproduce_failure(capsule, {"w": Wearing()}, record_ports=None)

    assert found.reproduced, found.summary
