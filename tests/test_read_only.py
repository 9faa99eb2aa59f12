"""check_read_only=True: a reader that changes a received tensor in place fails, named.

Messages are read-only (every reader of an Output gets the same tensor). With
the check on, a tensor's version counter moving during its reader's update
fails that node with MessageChangedError naming the node and the Input; with
it off nothing is checked (and nothing is installed).
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch

import mujou_actors as mujou
from mujou_actors.errors import MessageChangedError


class Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


class Source(mujou.Node):
    out = mujou.Output(torch.Tensor, shape=(2,))
    pair = mujou.Output(Pair)

    def __init__(self) -> None:
        super().__init__(period=0.01)

    def on_update(self, dt: float) -> None:
        self.out.send(torch.zeros(2))
        self.pair.send(Pair(torch.zeros(1), torch.ones(1)))


class Reader(mujou.Node):
    """Reads what arrives; ``how`` says what it does to it."""

    inp = mujou.Input(torch.Tensor, shape=(2,), depth=None)
    pair = mujou.Input(Pair)

    def __init__(self, how: str) -> None:
        super().__init__(period=None)
        self.how = how
        self.sums: list[float] = []

    def on_update(self, dt: float) -> None:
        for x in self.inp.drain():
            if self.how == "add_":
                x += 1
            elif self.how == "clone":
                x = x.clone()
                x += 1
            elif self.how == "index":
                x[0] = 5.0
            self.sums.append(float(x.sum()))
        if self.how == "pair" and self.pair.read() is not None:
            self.pair.read().b.mul_(2)


def _net(how: str) -> dict[str, mujou.Node]:
    src, reader, other = Source(), Reader(how), Reader("none")
    mujou.connect(src.out, reader.inp)
    mujou.connect(src.out, other.inp)
    mujou.connect(src.pair, reader.pair)
    return {"src": src, "reader": reader, "other": other}


@pytest.mark.parametrize(("how", "port"), [("add_", "reader.inp"), ("index", "reader.inp"),
                                            ("pair", "reader.pair")])
def test_a_reader_that_changes_a_received_tensor_in_place_fails_naming_node_and_input(
        how: str, port: str) -> None:
    net = _net(how)

    run = mujou.run(net, timer="simulated", duration=0.1, check_read_only=True)
    with pytest.raises(mujou.NodeError) as caught:
        run.join()

    assert caught.value.path == "reader" and caught.value.hook == "on_update"
    cause = caught.value.__cause__
    assert isinstance(cause, MessageChangedError)
    assert (cause.path, cause.port) == ("reader", port)
    assert f"node 'reader' changed a tensor received on '{port}' in place" in str(cause)
    assert net["reader"].sums == {"add_": [2.0], "index": [5.0], "pair": [0.0]}[how]


def test_without_the_check_the_change_reaches_the_other_reader_unnoticed() -> None:
    net = _net("add_")

    run = mujou.run(net, timer="simulated", duration=0.1, workers=1)
    run.join()

    # The other reader, run after it at each instant, saw what "reader" added: 2.0, not 0.0.
    assert net["other"].sums == net["reader"].sums == [2.0] * 10


def test_a_reader_that_clones_first_passes_the_check() -> None:
    net = _net("clone")

    run = mujou.run(net, timer="simulated", duration=0.1, check_read_only=True)
    run.join()

    assert net["reader"].sums == [2.0] * 10 and net["other"].sums == [0.0] * 10


def test_check_read_only_is_checked_as_an_argument() -> None:
    with pytest.raises(TypeError, match="check_read_only must be True or False"):
        mujou.run(_net("none"), timer="simulated", duration=0.1, check_read_only=1)
    with pytest.raises(ValueError, match="check_read_only.*placement"):
        mujou.run(_net, timer="simulated", placement={"src": "a"}, check_read_only=True)


def test_off_the_check_installs_nothing_around_the_update() -> None:
    from mujou_actors._runtime.actor import Actor, guard_read_only

    reader = Reader("none")
    actor = Actor(reader, "reader", 0)
    actor.inputs = (reader.inp,)
    plain = actor.update

    guard_read_only(actor)

    assert plain is Reader.on_update and actor.update is not plain
