"""mujou.testing.check_restore: state kept outside state_dict() found before it bites.

A node that counts in a plain attribute (``self.k += 1``) loses the count on a
restore, a restart or a capsule's reproduction; `check_restore` cuts a run,
restores the cut into a fresh net and compares the continuation with the
uninterrupted run, naming the node and the attribute.
"""

from __future__ import annotations

import pathlib

import pytest
import torch

import mujou_actors as mujou
from mujou_actors.testing import check_restore, reproduce_failure


class Counter(mujou.Node):
    """Sends a count every 10 ms, kept in a tensor (``tensor=True``) or a plain int."""

    out = mujou.Output(float)

    def __init__(self, tensor: bool) -> None:
        super().__init__(period=0.01, seed=1)
        self.tensor = tensor
        self.k = 0
        self.t = torch.zeros(())
        self.label = "unchanged"

    def on_update(self, dt: float) -> None:
        self.k += 1
        self.t += 1
        self.out.send(float(self.t) if self.tensor else float(self.k))


class Sum(mujou.Node):
    """Adds what it receives, in a tensor."""

    inp = mujou.Input(float, trigger=True, depth=None)
    total = mujou.Output(float)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.acc = torch.zeros(())

    def on_update(self, dt: float) -> None:
        for value in self.inp.drain():
            self.acc += value
        self.total.send(float(self.acc))


def counting(tensor: bool) -> dict[str, mujou.Node]:
    """A counter feeding a sum."""
    counter, total = Counter(tensor), Sum()
    mujou.connect(counter.out, total.inp)
    return {"c": counter, "s": total}


@pytest.mark.timeout(120)
def test_a_net_whose_state_is_all_in_its_state_dict_restores_exactly() -> None:
    found = check_restore(lambda: counting(True), at=0.05, duration=0.1)

    assert found.ok and found.node is None and found.difference is None
    assert found.compared == 10  # c.out and s.total at 60, 70, 80, 90, 100 ms
    assert found.unsaved == {"c": ("k",)}  # changed, unsaved, but harmless here: said anyway
    assert "c: k" in found.report


@pytest.mark.timeout(120)
def test_a_count_in_a_plain_attribute_is_named_with_the_first_difference() -> None:
    found = check_restore(lambda: counting(False), at=0.05, duration=0.1, workers=2)

    assert not found.ok
    assert found.node == "c" and found.unsaved == {"c": ("k",)}
    assert found.difference is not None
    assert found.difference.startswith("c.out, message 0 after the cut (t = 0.060000000 s")
    assert "6.0 uninterrupted, 1.0 restored" in found.difference
    assert "Node 'c' keeps k outside its state_dict()" in str(found)


def test_a_cut_outside_the_run_is_refused() -> None:
    for at, duration in ((0.0, 1.0), (1.0, 1.0), (-1.0, 1.0), (float("nan"), 1.0)):
        with pytest.raises(ValueError, match="within \\(0, duration\\)"):
            check_restore(lambda: counting(True), at=at, duration=duration)
    with pytest.raises(ValueError, match="state="):
        check_restore(lambda: counting(True), at=0.5, duration=1.0, state={})


class Wearing(mujou.Node):
    """Fails when its plain counter reaches 350 (t = 3.5 s)."""

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.k = 0

    def on_update(self, dt: float) -> None:
        self.k += 1
        if self.k == 350:
            raise RuntimeError("worn out")


@pytest.mark.timeout(120)
def test_a_capsule_that_does_not_reproduce_names_the_state_outside_state_dict(
        tmp_path: pathlib.Path) -> None:
    capsule = str(tmp_path / "capsule.mcap")
    run = mujou.run({"w": Wearing()}, timer="simulated", duration=10.0,
                    supervisor=mujou.Supervisor(snapshot_every=1.0),
                    record_on_failure=mujou.Capsule(capsule, seconds=1.0))
    with pytest.raises(mujou.NodeError, match="worn out"):
        run.join(60)

    again = reproduce_failure(capsule, {"w": Wearing()})

    assert not again.reproduced
    assert again.summary.startswith("not reproduced:")
    assert "not in their node's state_dict()" in again.summary and "w: k" in again.summary
