"""check_read_only=True: a reader that changes a received message in place fails, named.

Messages are read-only (every reader of an Output gets the same object). With
the check on, a tensor's version counter moving during its reader's update,
or another message's fingerprint (a list, a dict, a numpy array, a dataclass)
changing, fails that node with MessageChangedError naming the node and the
Input, in one process and in each group of a placed run; with it off nothing
is checked (and nothing is installed).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, NamedTuple

import numpy as np
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
    from mujou_actors._runtime.kernel import Kernel

    with pytest.raises(TypeError, match="check_read_only must be True or False"):
        mujou.run(_net("none"), timer="simulated", duration=0.1, check_read_only=1)
    with pytest.raises(TypeError, match="Kernel: check_read_only must be True or False"):
        Kernel(_net("none"), check_read_only="yes")  # type: ignore[arg-type]


# -- messages other than tensors: lists, dicts, numpy arrays, dataclasses --------------


@dataclasses.dataclass
class Pose:
    x: float
    tags: list[str]


def _message(kind: str) -> Any:
    """A fresh message of ``kind``, as the source sends it."""
    if kind == "list":
        return [1.0, 2.0]
    if kind == "dict":
        return {"gain": 1.0, "limits": [0.0, 1.0]}
    if kind == "numpy":
        return np.zeros(3)
    if kind == "dataclass":
        return Pose(0.0, ["start"])
    return (1.0, torch.zeros(2))  # "tuple": nothing in it but a float and a tensor


def _change(kind: str, message: Any) -> None:
    """What a careless reader does to ``message`` of ``kind``."""
    if kind == "list":
        message.append(3.0)
    elif kind == "dict":
        message["gain"] = 2.0
    elif kind == "numpy":
        message[0] = 5.0
    elif kind == "dataclass":
        message.tags.append("seen")


class Sender(mujou.Node):
    """Sends a fresh message of ``kind`` every 10 ms."""

    out = mujou.Output(object)

    def __init__(self, kind: str) -> None:
        super().__init__(period=0.01)
        self.kind = kind

    def on_update(self, dt: float) -> None:
        self.out.send(_message(self.kind))


class Taker(mujou.Node):
    """Takes what arrives; ``change`` says whether it changes it in place."""

    inp = mujou.Input(object, depth=None)

    def __init__(self, kind: str, change: bool) -> None:
        super().__init__(period=None)
        self.kind = kind
        self.change = change
        self.seen: list[str] = []

    def on_update(self, dt: float) -> None:
        for message in self.inp.drain():
            self.seen.append(repr(message))
            if self.change:
                _change(self.kind, message)


def make_takers(kind: str = "list", change: bool = True) -> dict[str, mujou.Node]:
    """A sender read by a taker (``change``: it changes what it takes) and a careful one.

    Module level: a placed run's processes import it by name.
    """
    src, taker, careful = Sender(kind), Taker(kind, change), Taker(kind, False)
    mujou.connect(src.out, taker.inp)
    mujou.connect(src.out, careful.inp)
    return {"src": src, "taker": taker, "careful": careful}


KINDS = {"list": "list", "dict": "dict", "numpy": "numpy.ndarray",
         "dataclass": "tests.test_read_only.Pose"}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_reader_that_changes_a_received_message_fails_naming_node_and_input(
        kind: str) -> None:
    net = make_takers(kind)

    run = mujou.run(net, timer="simulated", duration=0.1, workers=1, check_read_only=True)
    with pytest.raises(mujou.NodeError) as caught:
        run.join()

    assert caught.value.path == "taker" and caught.value.hook == "on_update"
    cause = caught.value.__cause__
    assert isinstance(cause, MessageChangedError)
    assert (cause.path, cause.port, cause.kind) == ("taker", "taker.inp", KINDS[kind])
    assert str(cause).startswith(f"node 'taker' changed a {KINDS[kind]} received on "
                                 "'taker.inp' in place in on_update; messages are read-only")
    assert len(net["taker"].seen) == 1  # its first update failed


@pytest.mark.parametrize("kind", [*KINDS, "tuple"])
def test_a_reader_that_only_reads_a_message_passes_the_check(kind: str) -> None:
    net = make_takers(kind, change=False)

    run = mujou.run(net, timer="simulated", duration=0.1, check_read_only=True)
    run.join()

    assert len(net["taker"].seen) == len(net["careful"].seen) == 10


def test_without_the_check_a_changed_list_reaches_the_other_reader_unnoticed() -> None:
    net = make_takers("list")

    run = mujou.run(net, timer="simulated", duration=0.1, workers=1)
    run.join()

    # The careful reader, after the taker at each instant, saw what the taker appended.
    assert net["careful"].seen == ["[1.0, 2.0, 3.0]"] * 10


class Opaque:
    """Copied by reference (as a send's copy allows), but pickle refuses it."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Opaque:
        return self

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError("an Opaque does not pickle")


class Locked(mujou.Node):
    """Sends a dict that holds an `Opaque` (pickle cannot write it) and a tensor."""

    out = mujou.Output(dict)

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.opaque = Opaque()

    def on_update(self, dt: float) -> None:
        self.out.send({"opaque": self.opaque, "t": torch.zeros(1)})


class LockReader(mujou.Node):
    inp = mujou.Input(dict)

    def __init__(self, change: bool) -> None:
        super().__init__(period=None)
        self.change = change

    def on_update(self, dt: float) -> None:
        if self.change:
            self.inp.read()["t"].add_(1)


@pytest.mark.parametrize("change", [False, True])
def test_a_message_pickle_cannot_write_is_checked_for_its_tensors_and_logged_once(
        caplog, change: bool) -> None:
    src, reader = Locked(), LockReader(change)
    mujou.connect(src.out, reader.inp)

    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        run = mujou.run({"src": src, "reader": reader}, timer="simulated", duration=0.1,
                        check_read_only=True)
        if change:
            with pytest.raises(mujou.NodeError, match="changed a tensor received on "
                                                      "'reader.inp'"):
                run.join()
        else:
            run.join()

    logged = [r.getMessage() for r in caplog.records if "check_read_only" in r.getMessage()]
    assert logged == ["check_read_only: a dict received on 'reader.inp' cannot be pickled "
                      "(TypeError: an Opaque does not pickle): only the tensors "
                      "in it are checked"]


# -- placed runs: each group's kernel checks its own readers ---------------------------


def _placed(placement: dict[str, str], **net_kwargs: Any) -> Any:
    from mujou_actors._runtime.build import Seams
    from mujou_actors.distributed import placed
    from mujou_actors.run import _check_arguments
    from tests.placed_support import InProcessSystem

    args = dataclasses.replace(
        _check_arguments(Seams(), workers=1, timer="simulated", duration=0.1, seed=1,
                         state=None, supervisor=None, trace=None, cuda_sync="block",
                         stats=True, stop_timeout=10.0, start_timeout=60.0),
        check_read_only=True)
    return placed.start(make_takers, placement=mujou.Placement(placement, net_kwargs=net_kwargs),
                        args=args, inputs=None, state=None, make_system=InProcessSystem)


@pytest.mark.parametrize("placement", [{"src": "a", "taker": "b"},  # the taker in a group
                                       {"src": "a", "careful": "b"}],  # the taker in the host
                         ids=["group", "host"])
def test_a_placed_run_fails_the_reader_that_changes_a_message_naming_it(
        placement: dict[str, str]) -> None:
    run = _placed(placement)

    with pytest.raises(mujou.NodeError) as caught:
        run.join(30)

    assert caught.value.path == "taker" and caught.value.hook == "on_update"
    assert "node 'taker' changed a list received on 'taker.inp' in place" in str(caught.value)


def test_a_placed_run_whose_readers_only_read_passes_the_check() -> None:
    run = _placed({"src": "a", "taker": "b"}, change=False)

    run.join(30)


@pytest.mark.slow
def test_a_placed_run_in_processes_fails_the_reader_that_changes_a_message() -> None:
    with pytest.raises(mujou.NodeError) as caught:
        mujou.run("tests.test_read_only:make_takers", placement={"taker": "b"},
                  timer="simulated", duration=0.1, workers=1, check_read_only=True).join(60)

    assert caught.value.path == "taker" and caught.value.hook == "on_update"
    assert str(caught.value).startswith(
        "node 'taker' raised in on_update: MessageChangedError: node 'taker' changed a list "
        "received on 'taker.inp' in place")
    assert str(caught.value).endswith("(in group 'b')")


def test_off_the_check_installs_nothing_around_the_update() -> None:
    from mujou_actors._runtime.actor import Actor, guard_read_only

    reader = Reader("none")
    actor = Actor(reader, "reader", 0)
    actor.inputs = (reader.inp,)
    plain = actor.update

    guard_read_only(actor)

    assert plain is Reader.on_update and actor.update is not plain
