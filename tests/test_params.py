"""Runtime parameters: declaration, checks, when a set applies, state, recording, placement."""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import mujou_actors as mujou
from mujou_actors.params import ParamState, params_of_class

pytestmark = pytest.mark.timeout(60)


class Gain(mujou.Node):
    """Sends its gain every tick; its hook at ``gate_ns`` waits for the test (a fixed cut)."""

    gain = mujou.Param(1.0, range=(0.0, 10.0), description="the gain, 1/s")
    mode = mujou.Param("fast", choices=("fast", "slow"))
    on = mujou.Param(True)
    count = mujou.Param(3, type=int, range=(0, None), read_only=True)

    def __init__(self, period: float = 0.01, gate_ns: int | None = None) -> None:
        super().__init__(period=period)
        self.out = mujou.Output(float)
        self.log: list[tuple[Any, ...]] = []
        self.gate_ns = gate_ns
        self.reached = threading.Event()
        self.go = threading.Event()
        self.started_with: float | None = None
        self.t_ns = torch.zeros((), dtype=torch.int64)  # state: a restored run goes on from it

    def on_start(self) -> None:
        self.started_with = self.gain

    def on_param(self, name: str, old: Any, new: Any) -> None:
        self.log.append(("param", name, old, new))

    def on_update(self, dt: float) -> None:
        self.t_ns += round(dt * 1e9)
        t_ns = int(self.t_ns)
        self.log.append(("update", t_ns / 1e9, self.gain, self.mode))
        self.out.send(self.gain)
        if t_ns == self.gate_ns:
            self.reached.set()
            assert self.go.wait(30), "the test never let the hook go on"


class Plain(mujou.Node):
    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.updates = 0

    def on_update(self, dt: float) -> None:
        self.updates += 1


def set_at_gate(node: Gain, run: mujou.Run, sets: list[tuple[str, Any]]) -> list[tuple[int, int]]:
    """Wait for the node's gated hook, make the sets while it holds its delta cycle, let go."""
    assert node.reached.wait(30)
    try:
        return [run.set_param(path, value) for path, value in sets]
    finally:
        node.go.set()


# -- declaring ------------------------------------------------------------------------------

def test_a_param_reads_its_default_and_each_instance_keeps_its_own_value() -> None:
    a, b = Gain(), Gain()
    a.gain = 2  # an int for a float parameter: made a float
    assert (a.gain, b.gain, type(a.gain)) == (2.0, 1.0, float)
    assert list(params_of_class(Gain)) == ["gain", "mode", "on", "count"]
    assert Gain.gain.describe() == {"type": "float", "default": 1.0, "range": [0.0, 10.0],
                                    "choices": None, "description": "the gain, 1/s",
                                    "read_only": False}
    assert a.state_dict()["gain"] == 2.0 and a.state_dict()["mode"] == "fast"


@pytest.mark.parametrize(("attr", "value", "rule"), [
    ("gain", 11.0, "above the range's high bound 10.0"),
    ("gain", "1", "is not a float"),
    ("gain", float("nan"), "is not finite"),
    ("mode", "medium", "not one of the choices ['fast', 'slow']"),
    ("on", 1, "is not a bool"),
    ("count", -1, "below the range's low bound 0"),
    ("count", True, "is not an int"),
])
def test_a_write_that_breaks_a_rule_is_refused_and_changes_nothing(
        attr: str, value: Any, rule: str) -> None:
    node = Gain()
    before = getattr(node, attr)
    with pytest.raises(mujou.ParamError, match=re.escape(rule)) as caught:
        setattr(node, attr, value)
    assert caught.value.param == f"parameter {attr!r} of Gain"
    assert getattr(node, attr) == before


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"default": [1.0]}, TypeError, "type must be one of bool, int, float, str"),
    ({"default": 1.0, "range": (2.0, 1.0)}, ValueError, "low > high"),
    ({"default": 5.0, "range": (0.0, 1.0)}, ValueError, "the default 5.0 is above"),
    ({"default": "a", "range": (0, 1)}, TypeError, "range applies to int and float"),
    ({"default": 1, "range": (0.5, 2)}, TypeError, "bound 0.5 is not an int"),
    ({"default": "a", "choices": "abc"}, TypeError, "choices must be a tuple or list"),
    ({"default": 1.0, "range": (0, 2), "choices": (1.0, 3.0)}, ValueError,
     "choice\\(s\\) \\[3.0\\] lie outside the range"),
    ({"default": float("nan")}, ValueError, "^Param: the default nan is not finite"),
    ({"default": "a", "choices": ()}, ValueError, "at least one value"),
    ({"default": 1.0, "type": int}, TypeError, "is not an int"),
])
def test_a_bad_declaration_is_refused(kwargs: dict[str, Any], error: type,
                                      match: str) -> None:
    default = kwargs.pop("default")
    with pytest.raises(error, match=match):
        mujou.Param(default, **kwargs)


def test_a_bad_declaration_in_a_class_body_names_the_class_and_the_parameter() -> None:
    with pytest.raises(ValueError) as caught:
        class Controller(mujou.Node):
            kp = mujou.Param(1.0)
            gain = mujou.Param(5.0, range=(0, 1))

    assert str(caught.value) == ("Param 'gain' of Controller: the default 5.0 is above the "
                                 "range's high bound 1.0")
    assert type(caught.value) is ValueError  # not wrapped (as an error of __set_name__ is)

    with pytest.raises(TypeError) as typed:
        class Sensor(mujou.Node):
            mode: str = mujou.Param(
                "fast",
                choices="fast")

    assert str(typed.value).startswith("Param 'mode' of Sensor: choices must be a tuple or "
                                       "list of values, got the str 'fast'")
    # Not assigned to an attribute at once: the class alone; outside a class: Param alone.
    with pytest.raises(TypeError, match=r"^Param of Holder: range applies to int and float "
                                        r"parameters, not str$"):
        class Holder(mujou.Node):
            table = [mujou.Param("a", range=(0, 1))]
    with pytest.raises(ValueError, match=r"^Param: range \(2, 1\) has low > high$"):
        mujou.Param(1, range=(2, 1))


def test_parse_reads_a_command_line_value_by_the_parameter_s_type() -> None:
    assert Gain.gain.parse("0.5") == 0.5
    assert [Gain.on.parse(t) for t in ("TRUE", "false", "1", "0")] == [True, False, True, False]
    assert Gain.count.parse("7") == 7
    with pytest.raises(mujou.ParamError, match="'yes' is not a bool \\(true, false, 1 or 0\\)"):
        Gain.on.parse("yes")
    with pytest.raises(mujou.ParamError, match="'5.5' is not an int"):
        Gain.count.parse("5.5")
    with pytest.raises(mujou.ParamError, match="above the range"):
        Gain.gain.parse("12")


# -- setting on a running net ---------------------------------------------------------------

@pytest.mark.parametrize("workers", [1, 3])
def test_a_set_applies_at_the_node_s_next_update_for_any_worker_count(workers: int) -> None:
    node = Gain(gate_ns=30_000_000)
    others = {f"p{i}": Plain() for i in range(4)}
    run = mujou.run({"g": node, **others}, timer="simulated", duration=0.06,
                    workers=workers, seed=1)
    keys = set_at_gate(node, run, [("g.gain", 2.5), ("g.mode", "slow"), ("g.gain", 3.0)])
    run.join(30)

    # The gated update is the third (t = 0.03 s): the sets apply from the next delta
    # cycle of that instant, so the fourth update sees them, each with its on_param.
    assert keys == [(30_000_000, 1), (30_000_000, 1), (30_000_000, 1)]
    assert node.log == [
        ("update", 0.01, 1.0, "fast"), ("update", 0.02, 1.0, "fast"),
        ("update", 0.03, 1.0, "fast"),
        ("param", "gain", 1.0, 2.5), ("param", "mode", "fast", "slow"),
        ("param", "gain", 2.5, 3.0),
        ("update", 0.04, 3.0, "slow"), ("update", 0.05, 3.0, "slow"),
        ("update", 0.06, 3.0, "slow")]
    assert run.params()["g.gain"] == 3.0
    assert run.describe_params()["g.mode"]["value"] == "slow"


def test_a_refused_set_names_the_parameter_and_the_rule_and_changes_nothing() -> None:
    node = Gain(gate_ns=10_000_000)
    run = mujou.run({"g": node, "p": Plain()}, timer="simulated", duration=0.03)
    assert node.reached.wait(30)
    cases = [("g.gain", 20.0, "parameter 'g.gain': 20.0 is above the range's high bound"),
             ("g.nope", 1.0, "node 'g' \\(Gain\\) has no parameter 'nope' \\(its parameters: "
                             "\\['count', 'gain', 'mode', 'on'\\]\\)"),
             ("p.gain", 1.0, "no node 'p' with parameters in this run \\(nodes with "
                             "parameters: \\['g'\\]\\)"),
             ("g.count", 4, "parameter 'g.count': is read-only"),
             ("g.on", "yes", "is not a bool"),
             (3, 1.0, "a parameter is named by its dotted path")]
    try:
        for path, value, match in cases:
            with pytest.raises(mujou.ParamError, match=match):
                run.set_param(path, value)  # type: ignore[arg-type]
    finally:
        node.go.set()
    run.join(30)
    assert [e for e in node.log if e[0] == "param"] == []
    assert run.params() == {"g.gain": 1.0, "g.mode": "fast", "g.on": True, "g.count": 3}
    with pytest.raises(mujou.NotRunningError, match="set_param 'g.gain': the run has ended"):
        run.set_param("g.gain", 2.0)


def test_a_set_on_a_net_without_parameters_says_the_net_declares_none() -> None:
    with mujou.run({"p": Plain()}, timer="simulated", duration=0.01) as run:
        with pytest.raises(mujou.ParamError) as caught:
            run.set_param("p.gain", 1.0)
        run.join(30)

    assert str(caught.value) == ("parameter 'p.gain': this net declares no parameters (a node "
                                 "declares one as a class attribute, mujou.Param)")


def test_params_are_set_before_on_start_and_may_set_read_only_ones() -> None:
    node = Gain()
    run = mujou.run({"g": node}, timer="simulated", duration=0.02,
                    params={"g.gain": 4.0, "g.count": 9})
    run.join(30)
    assert (node.started_with, node.count) == (4.0, 9)
    assert [e for e in node.log if e[0] == "param"] == []  # no on_param for a start value
    with pytest.raises(mujou.ParamError, match="'g.gain': 40.0 is above"):
        mujou.run({"g": Gain()}, timer="simulated", duration=0.02, params={"g.gain": 40.0})
    with pytest.raises(TypeError, match="params must be a mapping"):
        mujou.run({"g": Gain()}, timer="simulated", duration=0.02,
                  params=[("g.gain", 1.0)])  # type: ignore[arg-type]
    again = Gain()
    mujou.run({"g": again}, timer="simulated", duration=0.01).join(30)  # the node is free


def test_a_hook_s_own_write_out_of_range_fails_the_node_naming_the_parameter() -> None:
    class Wild(mujou.Node):
        gain = mujou.Param(1.0, range=(0.0, 2.0))

        def on_update(self, dt: float) -> None:
            self.gain = self.gain * 4

    run = mujou.run({"w": Wild()}, timer="simulated", duration=0.05)
    with pytest.raises(mujou.NodeError) as caught:
        run.join(30)
    assert isinstance(caught.value.__cause__, mujou.ParamError)
    assert "parameter 'w.gain': 4.0 is above the range's high bound 2.0" in str(
        caught.value.__cause__)


def test_what_on_param_raises_fails_the_node_in_the_update_that_applies_the_set() -> None:
    class Picky(Gain):
        def on_param(self, name: str, old: Any, new: Any) -> None:
            raise RuntimeError(f"cannot take {name}={new}")

    node = Picky(gate_ns=10_000_000)
    run = mujou.run({"g": node}, timer="simulated", duration=0.05)
    set_at_gate(node, run, [("g.gain", 2.0)])
    with pytest.raises(mujou.NodeError, match="on_update") as caught:
        run.join(30)
    assert str(caught.value.__cause__) == "cannot take gain=2.0"
    assert node.gain == 2.0 and len([e for e in node.log if e[0] == "update"]) == 1


def test_a_node_without_parameters_keeps_its_update_unwrapped() -> None:
    plain, gain = Plain(), Gain()
    run = mujou.run({"p": plain, "g": gain}, timer="simulated", duration=0.01)
    run.join(30)
    actors = {a.path: a for a in run._actors}  # type: ignore[attr-defined]
    assert actors["p"].update is Plain.on_update
    assert actors["g"].update is not Gain.on_update
    assert "_mujou_param_sets" not in vars(plain) and "_mujou_param_sets" in vars(gain)


# -- state, recording, replay ---------------------------------------------------------------

def test_a_set_not_yet_applied_is_in_the_tree_and_a_restored_run_applies_it() -> None:
    node = Gain(period=1.0, gate_ns=1_000_000_000)
    run = mujou.run({"g": node}, timer="simulated", duration=1.5)
    assert set_at_gate(node, run, [("g.gain", 6.0)]) == [(1_000_000_000, 1)]
    run.join(30)
    tree = run.state_dict()
    assert tree["params"] == {"g": [[1_000_000_000, 1, "gain", 6.0]]}
    assert tree["nodes"]["g"]["gain"] == 1.0

    again = Gain(period=1.0)
    restored = mujou.run({"g": again}, timer="simulated", duration=1.0, state=tree)
    restored.join(30)
    assert again.log == [("param", "gain", 1.0, 6.0), ("update", 2.0, 6.0, "fast")]
    assert "params" not in restored.state_dict()


def test_a_tree_s_params_section_is_checked_against_the_net(tmp_path: Path) -> None:
    node = Gain(period=1.0)
    run = mujou.run({"g": node}, timer="simulated", duration=1.0)
    run.join(30)
    tree = run.state_dict()
    tree["params"] = {"g": [[5, 0, "gain", 50.0], [5, 0, "nope", 1]], "x": []}
    with pytest.raises(mujou.SnapshotError) as caught:
        mujou.run({"g": Gain(period=1.0)}, timer="simulated", duration=1.0, state=tree)
    text = str(caught.value)
    assert "params['g'][0] (parameter 'gain'): 50.0 is above" in text
    assert "params['g'][1]: node 'g' has no parameter 'nope'" in text
    assert "params['x']: no node with parameters at that path" in text
    tree["params"] = {"g": [[5, 0, "gain", 5.0]]}
    mujou.save(tree, tmp_path / "t.mujou")
    assert mujou.load(tmp_path / "t.mujou")["params"] == {"g": [[5, 0, "gain", 5.0]]}


def test_a_replay_applies_the_recorded_start_values_and_sets_at_the_same_updates(
        tmp_path: Path) -> None:
    path = tmp_path / "run.mcap"
    node = Gain(gate_ns=20_000_000)
    run = mujou.run({"g": node, "p": Plain()}, timer="simulated", duration=0.05, seed=3,
                    record=path, params={"g.mode": "slow"})
    set_at_gate(node, run, [("g.gain", 7.5), ("g.on", False)])
    run.join(30)
    info = mujou.recording.mcapfile.info(path)
    assert [a.name for a in info.attachments] == ["param-20000000-1-0.json",
                                                  "param-20000000-1-1.json"]

    again = Gain()
    second = tmp_path / "replayed.mcap"
    replayed = mujou.run({"g": again, "p": Plain()}, timer="simulated", duration=0.05,
                         replay=path, record=second)
    replayed.join(30)
    assert again.log == node.log
    # The replay's own recording keeps the sets it replayed: replayed in turn, the same.
    third = Gain()
    mujou.run({"g": third, "p": Plain()}, timer="simulated", duration=0.05,
              replay=second).join(30)
    assert third.log == node.log
    assert [e for e in again.log if e[0] == "param"] == [("param", "gain", 1.0, 7.5),
                                                          ("param", "on", True, False)]
    assert again.log[0] == ("update", 0.01, 1.0, "slow")  # the recorded start value


def test_a_replay_warns_of_recorded_parameters_the_net_no_longer_has(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "run.mcap"
    node = Gain(gate_ns=10_000_000)
    run = mujou.run({"g": node}, timer="simulated", duration=0.02, record=path)
    set_at_gate(node, run, [("g.gain", 2.0)])
    run.join(30)

    class Older(mujou.Node):  # the same path, no parameters any more
        def __init__(self) -> None:
            super().__init__(period=0.01)
            self.out = mujou.Output(float)

    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        mujou.run({"g": Older()}, timer="simulated", duration=0.02, replay=path).join(30)
    assert "no parameter(s) ['g.count', 'g.gain', 'g.mode', 'g.on']" in caplog.text


def test_a_replayed_set_attachment_that_is_not_a_set_is_refused(tmp_path: Path) -> None:
    from mujou_actors.recording.mcapfile import AttachmentInfo, read_param

    info = AttachmentInfo("param-1-0.json", "application/json", 1, 10)
    assert read_param("f", info, b'{"t_ns": 1, "delta": 0, "node": "g", "name": "gain", '
                                 b'"value": 2.0}') == (1, 0, "g", "gain", 2.0)
    for data, match in [(b"[", "is not JSON"), (b'{"t_ns": 1}', "exactly the fields"),
                        (b'{"t_ns": "1", "delta": 0, "node": "g", "name": "x", "value": 1}',
                         "ints of a key"),
                        (b'{"t_ns": 1, "delta": 0, "node": "g", "name": "x", "value": [1]}',
                         "value a bool, int, float or str"),
                        (b" " * 70_000, "more than a set's")]:
        with pytest.raises(mujou.RecordingError, match=match):
            read_param("f", info, data)


# -- the queue of one node ------------------------------------------------------------------

def test_the_queue_gives_the_sets_due_at_a_key_in_key_order_equal_keys_as_they_came() -> None:
    sets = ParamState()
    for t, d, name, value in [(5, 1, "a", 1), (2, 0, "b", 2), (5, 1, "c", 3), (9, 0, "d", 4)]:
        sets.add(t, d, name, value)
    assert sets.due((1, 9)) == []
    assert sets.due((5, 1)) == [("b", 2), ("a", 1), ("c", 3)]
    assert sets.pending() == [[9, 0, "d", 4]] and sets
    assert sets.due((9, 0)) == [("d", 4)] and not sets


# -- placed ---------------------------------------------------------------------------------

def make_placed() -> dict[str, mujou.Node]:
    return {"g": Gain(), "p": Plain()}


def applied_after(log: list[tuple[Any, ...]], key: tuple[int, int]) -> list[tuple[Any, ...]]:
    """The update before the set's ``on_param`` and the one after it (the key rule's check)."""
    i = next(i for i, e in enumerate(log) if e[0] == "param")
    return [log[i - 1], log[i], log[i + 1]]


def test_a_placed_run_sets_a_parameter_in_the_node_s_group_at_its_next_delta_cycle() -> None:
    import dataclasses

    from mujou_actors.distributed import placed
    from tests.placed_support import InProcessSystem
    from tests.test_placed import _args

    args = dataclasses.replace(_args(None), params={"g.mode": "slow"})
    run = placed.start(make_placed, placement=mujou.Placement({"g": "a"}), args=args,
                       inputs=None, state=None, make_system=InProcessSystem)
    try:
        node = run._driver.system.servers["a"].kernel.actors[0].node  # type: ignore[attr-defined]
        assert run.params()["g.mode"] == "slow"  # params= reached the group's process
        key = run.set_param("g.gain", 2.5)
        run.wait_for("g.out", lambda m: m == 2.5, timeout=30)
        assert run.params()["g.gain"] == 2.5
        with pytest.raises(mujou.ParamError, match="is read-only"):
            run.set_param("g.count", 1)
    finally:
        run.stop()
    before, param, after = applied_after(node.log, key)
    # Simulated time: the key is the delta cycle after the latest any group had entered;
    # ticks are at delta 0, so the first tick past the key's instant applies the set.
    assert param == ("param", "gain", 1.0, 2.5)
    assert before[1] * 1e9 <= key[0] < after[1] * 1e9 and after[2] == 2.5
    assert before[2] == 1.0 and before[3] == after[3] == "slow"


def test_in_real_time_a_set_applies_at_the_node_s_next_update() -> None:
    node = Gain(period=0.005)
    run = mujou.run({"g": node}, timer="realtime")
    try:
        run.wait_for("g.out", timeout=30)
        key = run.set_param("g.gain", 4.0)
        run.wait_for("g.out", lambda m: m == 4.0, timeout=30)
    finally:
        run.stop()
    before, param, after = applied_after(node.log, key)
    assert key[1] == 0 and param == ("param", "gain", 1.0, 4.0)
    assert (before[2], after[2]) == (1.0, 4.0)


# -- restarts keep what was set -------------------------------------------------------------

class Fragile(Gain):
    """Fails once, in its update at ``fail_ns``."""

    def __init__(self, fail_ns: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail_ns = fail_ns
        self.failed = False

    def on_update(self, dt: float) -> None:
        super().on_update(dt)
        if int(self.t_ns) == self.fail_ns and not self.failed:
            self.failed = True
            raise RuntimeError("one failure")


@pytest.mark.parametrize("strategy", ["one_for_one", "one_for_all"])
def test_a_restart_from_a_snapshot_keeps_the_parameters_set_after_it(strategy: str) -> None:
    node = Fragile(fail_ns=50_000_000, gate_ns=20_000_000)
    run = mujou.run({"g": node}, timer="simulated", duration=0.08,
                    supervisor=mujou.Supervisor(strategy, snapshot_every=1.0))
    set_at_gate(node, run, [("g.gain", 5.0)])
    run.join(30)
    # The snapshot is the start's (gain 1.0); the set came after it and survives the
    # restart at 0.05 s: every later update sends 5.0.
    i = node.log.index(("param", "gain", 1.0, 5.0))
    after = [e for e in node.log[i:] if e[0] == "update"]
    assert len(after) >= 5 and all(e[2] == 5.0 for e in after)
    assert [e for e in node.log if e[0] == "param"] == [("param", "gain", 1.0, 5.0)]
    assert run.params()["g.gain"] == 5.0 and run.stats().nodes["g"].restarts == 1


def test_a_crash_capsule_keeps_the_sets_after_its_snapshot_and_reproduces_with_them(
        tmp_path: Path) -> None:
    from mujou_actors.testing import reproduce_failure

    capsule = tmp_path / "crash.mcap"
    node = Fragile(fail_ns=50_000_000, gate_ns=20_000_000)
    run = mujou.run({"g": node}, timer="simulated", duration=0.08, seed=5,
                    record_on_failure=mujou.Capsule(capsule, seconds=1.0))
    set_at_gate(node, run, [("g.gain", 5.0)])
    with pytest.raises(mujou.NodeError):
        run.join(30)
    info = mujou.recording.mcapfile.info(capsule)
    names = [a.name for a in info.attachments]
    assert names == ["snapshot-0.mujou", "param-20000000-1-0.json"]  # the set came after it

    again = Fragile(fail_ns=50_000_000)
    report = reproduce_failure(capsule, {"g": again})
    assert report.reproduced, str(report)
    assert ("param", "gain", 1.0, 5.0) in again.log  # queued from the capsule, at its key
    assert [e[2] for e in again.log if e[0] == "update"][-1] == 5.0


def test_inspect_of_a_snapshot_lists_the_sets_not_yet_applied(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from mujou_actors.cli import main

    node = Gain(period=1.0, gate_ns=1_000_000_000)
    run = mujou.run({"g": node}, timer="simulated", duration=1.5)
    set_at_gate(node, run, [("g.gain", 6.0)])
    run.join(30)
    mujou.save(run.state_dict(), tmp_path / "s.mujou")
    result = CliRunner().invoke(main, ["inspect", str(tmp_path / "s.mujou")])
    assert result.exit_code == 0, result.output
    assert "parameter sets not yet applied: 1\n  g.gain = 6.0 from t=1.000000000 s, delta 1" \
        in result.output
    assert "    gain: 1.0" in result.output  # the value applied, in the node's state


def make_placed_pair() -> dict[str, mujou.Node]:
    return {"g": Gain(), "p": Plain()}


@pytest.mark.parametrize("victim", ["a", "b"])
def test_a_placed_run_restored_after_a_group_died_keeps_the_parameters_set(
        victim: str) -> None:
    from mujou_actors._runtime.build import Seams
    from mujou_actors.distributed import group, placed
    from mujou_actors.run import _check_arguments
    from tests.test_placed_restarts import DyingSystem

    system = DyingSystem(victim=victim, kind=group.Stats)
    args = _check_arguments(Seams(), workers=1, timer="simulated", duration=None, seed=7,
                            state=None,
                            supervisor=mujou.Supervisor("one_for_all", snapshot_every=10.0),
                            trace=None, cuda_sync="block", stats=True, stop_timeout=10.0,
                            start_timeout=60.0)
    run = placed.start(make_placed_pair, placement=mujou.Placement({"g": "a", "p": "b"}),
                       args=args, inputs=None, state=None,
                       make_system=lambda start_timeout: system)
    try:
        run.set_param("g.gain", 2.5)
        run.wait_for("g.out", lambda m: m == 2.5, timeout=30)
        run.stats()  # meets the dying group: every group is restored from the t=0 snapshot
        assert system.deaths == 1
        run.wait_for("g.out", timeout=30)
        assert run.params()["g.gain"] == 2.5  # the rewind did not undo the set
        node = system.servers["a"].kernel.actors[0].node
        assert node.gain == 2.5
        assert all(e[2] == 2.5 for e in node.log if e[0] == "update")  # the rebuilt net's
    finally:
        run.stop()


def make_gated_pair() -> dict[str, mujou.Node]:
    """``g``, whose hook at t = 0.2 s waits for the test, and ``p`` (for two groups)."""
    return {"g": Gain(gate_ns=200_000_000), "p": Plain()}


@pytest.mark.timeout(120)
def test_a_placed_run_s_recorded_sets_replay_bit_for_bit_as_one_process_runs_them(
        tmp_path: Path) -> None:
    import dataclasses
    import time

    from mujou_actors._runtime.build import Seams
    from mujou_actors.distributed import placed
    from mujou_actors.run import _check_arguments
    from mujou_actors.testing import assert_replay_matches
    from tests.placed_support import InProcessSystem

    path = tmp_path / "placed.mcap"
    args = _check_arguments(Seams(), workers=1, timer="simulated", duration=0.5, seed=3,
                            state=None, supervisor=None, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=10.0, start_timeout=60.0, record=path)
    run = placed.start(make_gated_pair, placement=mujou.Placement({"g": "a", "p": "b"}),
                       args=dataclasses.replace(args, params={"g.mode": "slow"}), inputs=None,
                       state=None, make_system=InProcessSystem)
    node = run._driver.system.servers["a"].kernel.actors[0].node  # type: ignore[attr-defined]
    keys: list[tuple[int, int]] = []

    def sets() -> None:  # each waits for the driver, which waits for the held hook
        for param, value in [("g.gain", 7.5), ("g.on", False), ("g.gain", 2.0)]:
            keys.append(run.set_param(param, value))

    assert node.reached.wait(30)
    setter = threading.Thread(target=sets)
    setter.start()
    end = time.monotonic() + 30
    while run._driver.requests.empty() and time.monotonic() < end:  # type: ignore[attr-defined]
        time.sleep(0.001)  # the first set is queued: it comes while the run is held
    node.go.set()
    setter.join(30)
    run.join(60)

    # Mid-run: each set applies at a key between the held hook's and the run's end.
    assert len(keys) == 3 and keys == sorted(keys), keys
    assert all(200_000_000 <= t < 500_000_000 for t, _ in keys), keys
    info = mujou.recording.mcapfile.info(path)
    assert [a.name for a in info.attachments] == [
        f"param-{t}-{d}-{n}.json" for n, (t, d) in enumerate(keys)]
    params = [e for e in node.log if e[0] == "param"]
    assert params == [("param", "gain", 1.0, 7.5), ("param", "on", True, False),
                      ("param", "gain", 7.5, 2.0)]
    updates = [e for e in node.log if e[0] == "update"]
    assert len(updates) == 50 and updates[0] == ("update", 0.01, 1.0, "slow")
    assert updates[-1] == ("update", 0.5, 2.0, "slow")

    # One process, replaying the file: the whole net runs again with the recorded start
    # values and sets, each applied by the update that applied it in the groups.
    assert assert_replay_matches(path, make_placed_pair()) == 50
    again, second = Gain(), tmp_path / "one.mcap"
    mujou.run({"g": again, "p": Plain()}, timer="simulated", duration=0.5, replay=path,
              record=second).join(30)
    assert again.log == node.log
    third = Gain()  # and the one-process run's recording of the same sets, replayed in turn
    mujou.run({"g": third, "p": Plain()}, timer="simulated", duration=0.5,
              replay=second).join(30)
    assert third.log == node.log
    assert [a.name for a in mujou.recording.mcapfile.info(second).attachments] == [
        a.name for a in info.attachments]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_placed_over_processes_replays_its_recorded_sets_in_one_process(
        tmp_path: Path) -> None:
    from mujou_actors.testing import assert_replay_matches

    path = tmp_path / "placed.mcap"
    run = mujou.run("tests.test_params:make_placed_pair", placement={"g": "a", "p": "b"},
                    timer="simulated", seed=3, record=path, params={"g.mode": "slow"})
    try:  # no duration: the sets come while it runs, and it ends when stopped
        run.wait_for("g.out", timeout=60)
        first = run.set_param("g.gain", 7.5)
        run.wait_for("g.out", lambda m: m == 7.5, timeout=60)
        second = run.set_param("g.gain", 2.0)
        run.wait_for("g.out", lambda m: m == 2.0, timeout=60)
    finally:
        run.stop()

    assert first < second
    compared = assert_replay_matches(path, make_placed_pair())
    again = Gain()
    mujou.run({"g": again, "p": Plain()}, timer="simulated", replay=path,
              duration=mujou.recording.replay.recording_length(
                  mujou.recording.mcapfile.info(path)) / 1e9).join(30)
    updates = [e for e in again.log if e[0] == "update"]
    assert len(updates) == compared > 2
    # Each update sees the value of the latest set whose key is not after its own time
    # (ticks are at delta 0: a set at (t, 1) applies from the first tick after t).
    for _, t, gain, mode in updates:
        t_ns = round(t * 1e9)
        assert mode == "slow"
        assert gain == (2.0 if t_ns > second[0] else 7.5 if t_ns > first[0] else 1.0), t_ns
    assert [e for e in again.log if e[0] == "param"] == [("param", "gain", 1.0, 7.5),
                                                        ("param", "gain", 7.5, 2.0)]
