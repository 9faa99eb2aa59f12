"""Typed ports: connect checks, send/write/inputs checks, value semantics, QoS."""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, NamedTuple

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import mujou_actors as mujou
from mujou_actors.messages import copy_message
from tests.conftest import Collector, Source


@dataclasses.dataclass
class Pose:
    xyz: torch.Tensor
    frame: str


class Twist(NamedTuple):
    linear: float
    angular: float


def _pair(out_port: mujou.Output, in_port: mujou.Input) -> tuple[mujou.Node, mujou.Node]:
    class Tx(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.out = out_port

    class Rx(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.inp = in_port

    return Tx(), Rx()


@pytest.mark.parametrize(
    "out_port, in_port",
    [
        (mujou.Output(int), mujou.Input(str)),
        (mujou.Output(torch.Tensor, dtype=torch.float32),
         mujou.Input(torch.Tensor, dtype=torch.int64)),
        (mujou.Output(torch.Tensor, shape=(4,)), mujou.Input(torch.Tensor, shape=(3,))),
        (mujou.Output(torch.Tensor, shape=(4,)), mujou.Input(torch.Tensor, shape=(4, 1))),
        (mujou.Output(Pose), mujou.Input(Twist)),
        (mujou.Output(float), mujou.Input(int)),
    ],
)
def test_connect_refuses_incompatible_types_naming_both_ports(out_port, in_port) -> None:
    tx, rx = _pair(out_port, in_port)

    with pytest.raises(mujou.PortTypeError, match=r"Tx\.out.*Rx\.inp"):
        mujou.connect(tx.out, rx.inp)


@pytest.mark.parametrize(
    "out_port, in_port",
    [
        (mujou.Output(int), mujou.Input(float)),
        (mujou.Output(bool), mujou.Input(int)),
        (mujou.Output(object), mujou.Input(str)),
        (mujou.Output(str), mujou.Input(object)),
        (mujou.Output(torch.Tensor, shape=(4,)), mujou.Input(torch.Tensor, shape=(None,))),
        (mujou.Output(torch.Tensor), mujou.Input(torch.Tensor, shape=(2, 2), dtype=torch.float64)),
    ],
)
def test_connect_accepts_compatible_types(out_port, in_port) -> None:
    tx, rx = _pair(out_port, in_port)

    mujou.connect(tx.out, rx.inp)

    assert tx.out.readers == (rx.inp,)


def test_connect_checks_the_argument_order() -> None:
    tx, rx = _pair(mujou.Output(int), mujou.Input(int))

    with pytest.raises(TypeError, match="Output then an Input"):
        mujou.connect(rx.inp, tx.out)  # type: ignore[arg-type]


def test_ports_declared_on_the_class_are_per_instance() -> None:
    a, b = Source(), Source()

    assert a.out is not b.out
    assert a.out.node is a and b.out.node is b
    assert Source.out is not a.out


def test_port_declaration_errors() -> None:
    with pytest.raises(TypeError, match="shape and dtype"):
        mujou.Input(int, shape=(3,))
    with pytest.raises(TypeError, match="class"):
        mujou.Input("int")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="depth"):
        mujou.Input(int, depth=0)
    for wrong_type in (1.5, "2", True):  # a wrong type is a TypeError, as everywhere else
        with pytest.raises(TypeError, match="Input depth must be an int"):
            mujou.Input(int, depth=wrong_type)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dtype"):
        mujou.Output(torch.Tensor, dtype="float32")


class TensorSender(mujou.Node):
    out = mujou.Output(torch.Tensor, shape=(3,), dtype=torch.float32)

    def __init__(self, value: object) -> None:
        super().__init__(period=0.01)
        self.value = value
        self.error: BaseException | None = None

    def on_update(self, dt: float) -> None:
        try:
            self.out.send(self.value)
        except mujou.PortTypeError as exc:
            self.error = exc


@pytest.mark.parametrize(
    "value, got",
    [
        (torch.zeros(4), "shape=(4,)"),
        (torch.zeros(3, dtype=torch.float64), "dtype=torch.float64"),
        ([0.0, 0.0, 0.0], "got list"),
    ],
)
def test_send_checks_type_and_names_port_expected_and_got(value: object, got: str) -> None:
    node = TensorSender(value)

    mujou.run(node, timer="simulated", duration=0.01).join()

    assert node.error is not None
    text = str(node.error)
    assert "'out'" in text and "Tensor(dtype=torch.float32, shape=(3,))" in text and got in text


def test_send_checks_a_narrower_reader_type_and_delivers_nothing_on_failure() -> None:
    class Tx(mujou.Node):
        out = mujou.Output(object)

        def __init__(self) -> None:
            super().__init__(period=0.01)
            self.errors: list[str] = []

        def on_update(self, dt: float) -> None:
            for value in ("ok", 3):
                try:
                    self.out.send(value)
                except mujou.PortTypeError as exc:
                    self.errors.append(str(exc))

    class Net(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.tx = Tx()
            self.loose = Collector()
            self.strict = Collector()
            self.strict.inp = mujou.Input(str, depth=None)
            mujou.connect(self.tx.out, self.loose.inp)
            mujou.connect(self.tx.out, self.strict.inp)

    net = Net()

    mujou.run(net, timer="simulated", duration=0.02).join()

    assert net.loose.received == ["ok", "ok"]
    assert net.strict.received == ["ok", "ok"]
    assert net.tx.errors == ["output 'tx.out' sent to port 'strict.inp': expected str, got int"] * 2


@pytest.mark.parametrize("sent_on", [object, int])
@pytest.mark.parametrize("readers", ["float", "float+object", "float traced"])
def test_a_narrower_reader_gets_the_value_as_its_own_check_gives_it(
        readers, sent_on, tmp_path) -> None:
    # One untraced reader takes the lean send; the other cases the general one.
    class Tx(mujou.Node):
        out = mujou.Output(sent_on)

        def __init__(self) -> None:
            super().__init__(period=0.01)

        def on_update(self, dt: float) -> None:
            self.out.send(3)

    tx, as_float, as_is = Tx(), Collector(), Collector()
    as_float.inp = mujou.Input(float, depth=None)
    mujou.connect(tx.out, as_float.inp)
    nodes = [tx, as_float]
    if "object" in readers:
        mujou.connect(tx.out, as_is.inp)
        nodes.append(as_is)
    trace = tmp_path / "t.json" if "traced" in readers else None

    with mujou.run(nodes, timer="simulated", duration=0.02, trace=trace) as run:
        run.join()
        sent = run.read(tx.out)

    assert (sent, type(sent)) == (3, int)  # the host sees what was sent, on every path
    assert [(m, type(m)) for m in as_float.received] == [(3.0, float)] * 2
    if "object" in readers:
        assert [(m, type(m)) for m in as_is.received] == [(3, int)] * 2


def test_send_from_the_host_while_running_and_after_the_run_names_the_problem() -> None:
    class Keeper(mujou.Node):
        out = mujou.Output(int)

        def __init__(self) -> None:
            super().__init__(period=None)
            self.kept: Any = None

        def on_start(self) -> None:
            self.kept = self.out.send  # the run's send, kept past the run

    node, rx = Keeper(), Collector()
    mujou.connect(node.out, rx.inp)

    with mujou.run([node, rx], timer="simulated") as run:
        with pytest.raises(mujou.NotRunningError,
                           match="'0.out': send\\(\\) from outside a hook of node '0'"):
            node.out.send(1)
        with pytest.raises(mujou.NotRunningError, match="outside a hook"):
            mujou.Output.send(node.out, 1)  # the class's method hands over to the run's
        run.stop()

    assert node.out.send.__func__ is mujou.Output.send  # the run's send is gone
    with pytest.raises(mujou.NotRunningError, match="'0.out': send\\(\\) needs a running net"):
        node.kept(1)
    assert rx.received == []


class Holding(mujou.Node):
    """Sends 1 in its first update, then holds that update until ``release`` is set."""

    out = mujou.Output(int)

    def __init__(self, inside: threading.Event, release: threading.Event) -> None:
        super().__init__(period=0.01)
        self.inside, self.release = inside, release

    def on_update(self, dt: float) -> None:
        if not self.inside.is_set():
            self.out.send(1)
            self.inside.set()
            self.release.wait(10)


class Intruder(mujou.Node):
    """Once ``inside`` is set, tries to send on another node's Output from its own hook."""

    def __init__(self, victim: Holding) -> None:
        super().__init__(period=0.01)
        self.victim = lambda: victim  # not an attribute: the net would see the node twice
        self.errors: list[str] = []

    def on_update(self, dt: float) -> None:
        victim = self.victim()
        if victim.inside.wait(10) and not victim.release.is_set():
            try:
                victim.out.send(2)
            except mujou.NotRunningError as exc:
                self.errors.append(str(exc))
            victim.release.set()


@pytest.mark.parametrize("caller", ["host", "another node"])
def test_only_the_nodes_own_hook_may_send_even_while_that_hook_runs(caller) -> None:
    inside, release, got = threading.Event(), threading.Event(), threading.Event()

    class Telling(Collector):
        def on_update(self, dt: float) -> None:
            super().on_update(dt)
            got.set()

    node, rx = Holding(inside, release), Telling()
    mujou.connect(node.out, rx.inp)
    nodes: list[mujou.Node] = [node, rx]
    if caller == "another node":
        intruder = Intruder(node)
        nodes.append(intruder)

    with mujou.run(nodes, timer="realtime", workers=2) as run:
        assert inside.wait(10)  # the node's first update is in flight
        if caller == "host":
            with pytest.raises(mujou.NotRunningError, match="from outside a hook of node '0'"):
                node.out.send(3)
            release.set()
        assert release.wait(10) and got.wait(10)
        assert run.read(node.out) == 1  # the newest message sent: none got through after it
        run.stop()

    if caller == "another node":
        assert intruder.errors == [
            "output '0.out': send() from outside a hook of node '0' "
            "(from the host, or from another node's hook)"]
    assert rx.received == [1]


def test_a_subclass_overriding_send_is_called_during_the_run() -> None:
    class Counting(mujou.Output):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            self.calls = 0

        def _template_copy(self) -> Counting:
            return Counting(self._spec.type)

        def send(self, value: Any) -> None:
            self.calls += 1
            super().send(value)

    class Tx(mujou.Node):
        out = Counting(int)

        def __init__(self) -> None:
            super().__init__(period=0.01)

        def on_update(self, dt: float) -> None:
            self.out.send(7)

    tx, rx = Tx(), Collector()
    mujou.connect(tx.out, rx.inp)

    mujou.run([tx, rx], timer="simulated", duration=0.03).join()

    assert tx.out.calls == 3 and rx.received == [7, 7, 7]


def test_value_semantics_sender_may_reuse_its_buffer() -> None:
    class Reuser(mujou.Node):
        out = mujou.Output(torch.Tensor)

        def __init__(self) -> None:
            super().__init__(period=0.01)
            self.buf = torch.zeros(2)

        def on_update(self, dt: float) -> None:
            self.buf += 1
            self.out.send(self.buf)

    class Net(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.tx = Reuser()
            self.rx = Collector()
            mujou.connect(self.tx.out, self.rx.inp)

    net = Net()

    mujou.run(net, timer="simulated", duration=0.03).join()

    assert [m.tolist() for m in net.rx.received] == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]


def test_copy_message_clones_tensors_inside_containers_and_detaches() -> None:
    w = torch.ones(2, requires_grad=True)
    y = w * 2
    msg = {"pose": Pose(torch.zeros(3), "map"), "list": [y], "twist": Twist(1.0, 2.0)}

    out = copy_message(msg)
    msg["pose"].xyz += 1

    assert torch.equal(out["pose"].xyz, torch.zeros(3))
    assert out["pose"].frame == "map"
    assert out["list"][0].requires_grad is False
    assert out["twist"] == Twist(1.0, 2.0) and type(out["twist"]) is Twist


def test_int_on_a_float_port_arrives_as_float_and_bool_is_refused() -> None:
    port = mujou.Input(float)
    port._bind(object(), "x")

    assert port.check(3) == 3.0 and type(port.check(3)) is float
    with pytest.raises(mujou.PortTypeError, match="expected float, got bool"):
        port.check(True)


def test_qos_depth_drops_oldest_and_counts_drops() -> None:
    class Burst(mujou.Node):
        out = mujou.Output(int)

        def __init__(self) -> None:
            super().__init__(period=0.01)
            self.n = 0

        def on_update(self, dt: float) -> None:
            for _ in range(5):
                self.n += 1
                self.out.send(self.n)

    class Slow(mujou.Node):
        inp = mujou.Input(int, depth=2)

        def __init__(self) -> None:
            super().__init__(period=0.02)
            self.seen: list[list[int]] = []

        def on_update(self, dt: float) -> None:
            self.seen.append(self.inp.drain())

    class Net(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.tx = Burst()
            self.rx = Slow()
            mujou.connect(self.tx.out, self.rx.inp)

    net = Net()

    run = mujou.run(net, timer="simulated", duration=0.04)
    run.join()

    # t=0.02 sees the 5 messages of t=0.01 (those of t=0.02 are not visible yet),
    # keeps the newest 2; t=0.04 sees the 10 of t=0.02 and t=0.03.
    assert net.rx.seen == [[4, 5], [14, 15]]
    assert run.stats().nodes["rx"].drops == {"inp": 3 + 8}


@pytest.mark.parametrize("depth", [None, 1, 3])
def test_messages_pushed_together_keep_and_drop_as_one_by_one(depth, caplog) -> None:
    one, many = mujou.Input(int, depth=depth), mujou.Input(int, depth=depth)
    one._bind(object(), "one")
    many._bind(object(), "many")

    with caplog.at_level(logging.INFO, logger="mujou_actors"):
        for batch in ([1, 2], [3, 4, 5, 6], [7]):
            for m in batch:
                one._push(m)
            many._push_many(batch)

    assert list(many._buffer) == list(one._buffer)
    assert many.drops == one.drops == (0 if depth is None else 7 - depth)
    logged = [r.getMessage() for r in caplog.records]
    assert sum("'object.many' is full" in m for m in logged) == (depth is not None)  # once


def test_deliveries_for_two_inputs_keep_their_order_per_input() -> None:
    from mujou_actors._runtime.actor import Actor

    class Two(mujou.Node):
        a = mujou.Input(int, depth=None)
        b = mujou.Input(int, depth=None)

        def __init__(self) -> None:
            super().__init__(period=None)

    node = Two()
    ports = node._mujou_ports()
    actor = Actor(node, "two", 0)
    actor.inputs = (ports["a"], ports["b"])
    for seq, (name, m) in enumerate([("a", 1), ("a", 2), ("b", 10), ("a", 3), ("b", 11)]):
        actor.deliveries.append((seq, actor.slot(ports[name]), m))

    actor.apply_deliveries(None)

    assert node.a.drain() == [1, 2, 3] and node.b.drain() == [10, 11]


def test_read_returns_newest_kept_and_none_after_drain() -> None:
    inp = mujou.Input(int, depth=3)
    inp._bind(object(), "inp")

    assert inp.read() is None and len(inp) == 0
    for i in range(4):
        inp._push(i)

    assert inp.read() == 3 and len(inp) == 3
    assert inp.drain() == [1, 2, 3]
    assert inp.read() is None and len(inp) == 0
    assert bool(inp) is True


def test_unbounded_depth_keeps_everything() -> None:
    inp = mujou.Input(int, depth=None)
    inp._bind(object(), "inp")

    for i in range(10_000):
        inp._push(i)

    assert len(inp) == 10_000 and inp.drops == 0


def test_send_outside_a_running_net_is_an_error() -> None:
    node = Source()

    with pytest.raises(mujou.NotRunningError, match="running net"):
        node.out.send(1)


def test_dataclass_and_namedtuple_ports() -> None:
    class Tx(mujou.Node):
        pose = mujou.Output(Pose)
        twist = mujou.Output(Twist)

        def __init__(self) -> None:
            super().__init__(period=0.01)

        def on_update(self, dt: float) -> None:
            self.pose.send(Pose(torch.ones(3), "odom"))
            self.twist.send(Twist(0.5, -0.5))

    class Net(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.tx = Tx()
            self.a = Collector()
            self.b = Collector()
            mujou.connect(self.tx.pose, self.a.inp)
            mujou.connect(self.tx.twist, self.b.inp)

    net = Net()

    mujou.run(net, timer="simulated", duration=0.01).join()

    assert net.a.received[0].frame == "odom" and torch.equal(net.a.received[0].xyz, torch.ones(3))
    assert net.b.received == [Twist(0.5, -0.5)]


# ---------------------------------------------------------------------------
# Drops: messages discarded before any read() or drain() returned them


def _bound_input(depth: int | None) -> mujou.Input:
    inp = mujou.Input(int, depth=depth)
    inp._bind(object(), "inp")
    return inp


def test_a_depth_one_input_whose_every_message_is_read_reports_no_drops() -> None:
    class Reader(mujou.Node):
        inp = mujou.Input(int)  # depth=1: the newest value

        def __init__(self, period: float) -> None:
            super().__init__(period=period)
            self.got: list[int | None] = []

        def on_update(self, dt: float) -> None:
            self.got.append(self.inp.read())

    class Net(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.tx = Source(period=0.01)
            self.every = Reader(period=0.01)   # reads each message once
            self.half = Reader(period=0.02)    # reads every other one
            mujou.connect(self.tx.out, self.every.inp)
            mujou.connect(self.tx.out, self.half.inp)

    net = Net()

    run = mujou.run(net, timer="simulated", duration=1.0)
    run.join()
    nodes = run.stats().nodes

    # Each reader sees the message of the previous tick (delta cycles).
    assert net.every.got == [None, *range(1, 100)] and net.every.inp.drops == 0
    assert nodes["every"].drops == {"inp": 0}
    # The half-rate reader reads 1, 3, 5, ...: 2, 4, ..., 98 were replaced unseen.
    assert net.half.got == [1, *range(3, 100, 2)]
    assert nodes["half"].drops == {"inp": 49}


def test_drops_count_only_the_messages_no_read_or_drain_returned() -> None:
    inp = _bound_input(3)

    inp._push(1)
    assert inp.read() == 1
    inp._push(2)
    inp._push(3)
    assert inp.read() == 3
    inp._push(4)          # kept: 2 3 4
    inp._push(5)          # 2 goes, never read
    assert inp.drops == 1
    inp._push(6)          # 3 goes, it was read
    assert inp.drops == 1
    inp._push_many([7, 8, 9, 10])  # 4 5 6 go unread, and 7 never got in
    assert inp.drops == 5 and list(inp._buffer) == [8, 9, 10]
    assert inp.read() == 10 and inp.drain() == [8, 9, 10]
    inp._push_many([11, 12, 13, 14])  # 11 never got in
    assert inp.drops == 6

    one = _bound_input(1)
    one._push(1)
    one.read()
    one.read()
    one._push_many([2, 3])  # 1 was read; 2 was not
    one._push(4)            # 3 was not
    assert one.drops == 2
    assert one.drain() == [4]
    one._push(5)            # 4 was drained
    assert one.drops == 2


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_pushing_together_or_one_by_one_counts_the_same_drops_whatever_the_reads(
        depth: int) -> None:
    one, many = _bound_input(depth), _bound_input(depth)
    pattern = [([1, 2], "read"), ([3, 4, 5, 6], None), ([7], "read"), ([8, 9], "drain"),
               ([10, 11, 12], "read"), ([13], "read"), ([14, 15, 16, 17, 18, 19], None)]

    for batch, call in pattern:
        for m in batch:
            one._push(m)
        many._push_many(batch)
        if call == "read":
            assert one.read() == many.read()
        elif call == "drain":
            assert one.drain() == many.drain()
        assert (many.drops, list(many._buffer)) == (one.drops, list(one._buffer))


def test_messages_restored_into_an_input_count_as_read() -> None:
    for depth in (1, 3):
        inp = _bound_input(depth)
        inp._restore([7, 8, 9])
        new = list(range(10, 10 + depth))
        inp._push_many(new)  # pushes the restored ones out
        assert inp.drops == 0 and list(inp._buffer) == new


# ---------------------------------------------------------------------------
# The mailbox is bounded by the depths of the Inputs


def test_a_reader_that_never_runs_holds_a_bounded_mailbox_and_counts_drops() -> None:
    from mujou_actors._runtime.mailbox import prune_limit

    go = threading.Event()
    n_ticks, burst = 1000, 100

    class Tx(mujou.Node):
        out = mujou.Output(int)

        def __init__(self) -> None:
            super().__init__(period=0.001)
            self.n = 0
            self.box: Any = None
            self.pending: list[int] = []  # the reader's mailbox as each tick starts

        def on_update(self, dt: float) -> None:
            assert go.wait(10)
            self.pending.append(len(self.box))
            for _ in range(burst):
                self.n += 1
                self.out.send(self.n)

    class Rx(mujou.Node):
        inp = mujou.Input(int, depth=4, trigger=False)

        def __init__(self) -> None:
            super().__init__(period=None)  # never updates

    class Net(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.tx = Tx()
            self.rx = Rx()
            mujou.connect(self.tx.out, self.rx.inp)

    net = Net()

    run = mujou.run(net, timer="simulated", duration=n_ticks * 0.001)
    net.tx.box = run._actor_of[id(net.rx)].deliveries
    go.set()
    run.join(timeout=60)
    pending = len(run.state_dict()["pending"]["rx.inp"])

    assert net.tx.n == n_ticks * burst
    # Between instants only the newest 4 wait: the mailbox never grows past
    # its bound, however many messages come.
    assert max(net.tx.pending) <= prune_limit((4,)) and pending == 4
    assert net.rx.inp.drops == n_ticks * burst - 4
    assert run.stats().nodes["rx"].drops == {"inp": n_ticks * burst - 4}


def test_a_slow_simulated_reader_holds_a_bounded_mailbox_between_its_updates(
        workers: int) -> None:
    from mujou_actors._runtime.mailbox import prune_limit

    go = threading.Event()

    class Tx(mujou.Node):
        out = mujou.Output(int)

        def __init__(self) -> None:
            super().__init__(period=0.001)
            self.n = 0
            self.box: Any = None
            self.most = 0

        def on_update(self, dt: float) -> None:
            assert go.wait(10)
            self.most = max(self.most, len(self.box))
            for _ in range(3):
                self.n += 1
                self.out.send(self.n)

    class Slow(mujou.Node):
        inp = mujou.Input(int, depth=4)

        def __init__(self) -> None:
            super().__init__(period=0.5)  # 500 sender ticks between its updates
            self.got: list[list[int]] = []

        def on_update(self, dt: float) -> None:
            self.got.append(self.inp.drain())

    class Net(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.tx = Tx()
            self.rx = Slow()
            mujou.connect(self.tx.out, self.rx.inp)

    net = Net()

    run = mujou.run(net, timer="simulated", duration=1.0, workers=workers)
    net.tx.box = run._actor_of[id(net.rx)].deliveries
    go.set()
    run.join(timeout=60)

    # At 0.5 s the reader finds the newest 4 of the 499 ticks before (the
    # 500th is of its own instant), as with a mailbox that kept all 1,497.
    assert net.rx.got == [[1494, 1495, 1496, 1497], [2994, 2995, 2996, 2997]]
    assert net.tx.most <= prune_limit((4,))
    assert net.rx.inp.drops == 1497 - 4 + 1500 - 4


@pytest.mark.parametrize("timer", ["simulated", "realtime"])
def test_host_writes_into_an_idle_reader_keep_its_mailbox_bounded(timer: str) -> None:
    from mujou_actors._runtime.mailbox import prune_limit

    class Rx(mujou.Node):
        inp = mujou.Input(int, depth=2, trigger=False)

        def __init__(self) -> None:
            super().__init__(period=None)  # never updates: the net stays idle

    rx = Rx()

    with mujou.run(rx, timer=timer) as run:
        box = run._actor_of[id(rx)].deliveries
        most = 0
        for n in range(1000):
            run.write(rx.inp, n)
            most = max(most, len(box))
        left = [m for _, _, m, *_ in box]

    assert most <= prune_limit((2,))
    assert left[-2:] == [998, 999] and rx.inp.drops == 1000 - len(left)


def test_a_realtime_reader_stuck_in_a_hook_has_its_mailbox_pruned_as_messages_come() -> None:
    from mujou_actors._runtime.mailbox import prune_limit

    ready, stuck, sent, again = (threading.Event() for _ in range(4))
    seen: dict[str, Any] = {}  # what the sender saw of the reader's mailbox

    class Tx(mujou.Node):
        out = mujou.Output(int)

        def __init__(self) -> None:
            super().__init__(period=0.01)
            self.ticks = 0

        def on_update(self, dt: float) -> None:
            self.ticks += 1
            if self.ticks == 1:
                self.out.send(1)  # triggers the reader, which then blocks
            elif self.ticks == 2:
                assert ready.wait(10) and stuck.wait(10)
                box, most = seen["box"], 0
                for n in range(2, 201):
                    self.out.send(n)
                    most = max(most, len(box))
                seen.update(most=most, left=len(box), drops=seen["inp"].drops)
                sent.set()

    class Rx(mujou.Node):
        inp = mujou.Input(int, depth=4)

        def __init__(self) -> None:
            super().__init__(period=None)
            self.got: list[list[int]] = []

        def on_update(self, dt: float) -> None:
            self.got.append(self.inp.drain())
            if len(self.got) == 1:
                stuck.set()
                assert sent.wait(10)
            else:
                again.set()

    class Net(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.tx = Tx()
            self.rx = Rx()
            mujou.connect(self.tx.out, self.rx.inp)

    net = Net()

    run = mujou.run(net, workers=2)
    seen.update(box=run._actor_of[id(net.rx)].deliveries, inp=net.rx.inp)
    ready.set()
    assert sent.wait(20)
    assert again.wait(20)
    run.stop()

    # The 199 messages sent while the reader was stuck were pruned as they
    # came and counted at once; the reader then finds the newest 4, as before.
    assert seen["most"] <= prune_limit((4,))
    assert seen["drops"] == 199 - seen["left"]
    assert net.rx.got[:2] == [[1], [197, 198, 199, 200]]
    assert run.stats().nodes["rx"].drops == {"inp": 195}


class _Burst(mujou.Node):
    out = mujou.Output(int)

    def __init__(self, period: float, burst: int, tag: int) -> None:
        super().__init__(period=period)
        self.burst, self.tag, self.n = burst, tag, 0

    def on_update(self, dt: float) -> None:
        for _ in range(self.burst):
            self.n += 1
            self.out.send(self.tag * 1_000_000 + self.n)


def _qos_run(senders, reader, workers: int) -> tuple[Any, ...]:
    """Run a random net into one reader; what it saw, its drops and its pending messages."""
    (period, depth_a, trigger_a, depth_b, trigger_b) = reader

    class Reader(mujou.Node):
        a = mujou.Input(int, depth=depth_a, trigger=trigger_a)
        b = mujou.Input(int, depth=depth_b, trigger=trigger_b)

        def __init__(self) -> None:
            super().__init__(period=period)
            self.log: list[Any] = []

        def on_update(self, dt: float) -> None:
            n = len(self.log)
            # Reads and drains mixed: which messages count as read matters.
            self.log.append((dt, self.a.drain() if n % 3 else [self.a.read()],
                             self.b.read() if n % 2 else self.b.drain()))

    rx = Reader()
    nodes: dict[str, mujou.Node] = {"rx": rx}
    for i, (p, burst, to_b) in enumerate(senders):
        tx = nodes[f"tx{i}"] = _Burst(p, burst, i)
        mujou.connect(tx.out, rx.b if to_b else rx.a)
    run = mujou.run(nodes, workers=workers, timer="simulated", duration=0.03)
    run.join(timeout=60)
    pending = {k: len(v) for k, v in run.state_dict()["pending"].items()}
    return rx.log, run.stats().nodes["rx"].drops, pending


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    senders=st.lists(st.tuples(st.sampled_from([0.001, 0.002, 0.003]), st.integers(1, 6),
                               st.booleans()), min_size=1, max_size=4),
    reader=st.tuples(st.sampled_from([None, 0.004, 0.01]), st.sampled_from([1, 2, 3]),
                     st.sampled_from([None, True, False]), st.sampled_from([1, 4, None]),
                     st.sampled_from([None, True, False])),
)
# Sends into a depth=None Input fill the mailbox too: found by this test.
@example(senders=[(0.001, 1, False), (0.001, 2, False), (0.002, 1, True)],
         reader=(0.004, 3, None, None, None))
def test_pruning_the_mailbox_changes_no_result_for_any_worker_count(senders, reader) -> None:
    from mujou_actors._runtime import mailbox

    slack = mailbox.SLACK
    try:
        mailbox.SLACK = 1 << 60  # no pruning: every message waits in the mailbox, as before
        unpruned = _qos_run(senders, reader, workers=1)
        mailbox.SLACK = 0  # pruned as often as can be
        pruned = [_qos_run(senders, reader, workers=w) for w in (1, 2, 4)]
    finally:
        mailbox.SLACK = slack

    # The reader sees the same messages at the same updates, and the drops
    # and pending messages do not depend on the number of workers.
    assert pruned[0] == pruned[1] == pruned[2]
    log, drops, pending = pruned[0]
    assert log == unpruned[0]
    # What pruning removed, the reader's next update would have pushed out
    # unseen: it is a drop now instead of a pending message.
    for name in ("a", "b"):
        path = f"rx.{name}"
        assert (drops[name] + pending.get(path, 0)
                == unpruned[1][name] + unpruned[2].get(path, 0))


@st.composite
def _cycles_of_deliveries(draw: st.DrawFn) -> tuple[tuple[int | None, ...], list[list[tuple]]]:
    """Depths of a node's Inputs, and per delta cycle the deliveries sent to it then."""
    from mujou_actors._runtime.keys import stamp
    depths = tuple(draw(st.lists(st.one_of(st.none(), st.integers(1, 3)), min_size=1,
                                 max_size=3)))
    if all(d is None for d in depths):
        depths = (1,) + depths[1:]
    cycles = []
    for c in range(draw(st.integers(1, 12))):
        t, delta = divmod(c, 3)  # three delta cycles per instant
        sends = draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, len(depths) - 1)),
                              max_size=14))
        cycles.append([(stamp((t, delta), sender), slot, (c, i))
                       for i, (sender, slot) in enumerate(sorted(sends))])
    return depths, cycles


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(case=_cycles_of_deliveries(), data=st.data())
def test_pruning_cycle_by_cycle_later_is_pruning_at_each_cycles_end(case, data) -> None:
    """A driven kernel gets several cycles' deliveries at once, in any order of arrival,
    and settles them at any points (`Mailbox.prune_cycles`): it holds, drops and bounds
    exactly what one process does that prunes at the end of every cycle (`Mailbox.prune`
    when over the bound)."""
    from mujou_actors._runtime.keys import ORDER_BITS, pack
    from mujou_actors._runtime.mailbox import Mailbox, prune_limit
    depths, cycles = case
    one, bound, dropped = Mailbox(), prune_limit(depths), [0] * len(depths)
    for sends in cycles:
        one.deliveries.extend(sends)
        if len(one.deliveries) > bound:
            dropped = [a + b for a, b in zip(dropped, one.prune(depths, True), strict=True)]
            bound = prune_limit(depths, len(one.deliveries))
    driven, dbound, ddropped = Mailbox(), prune_limit(depths), [0] * len(depths)
    settled = 0
    while settled < len(cycles):
        upto = data.draw(st.integers(settled + 1, len(cycles)))
        # Each sender's sends of a cycle come in send order, the senders' in any order.
        batches: dict[int, list[tuple]] = {}
        for sends in cycles[settled:upto]:
            for delivery in sends:
                batches.setdefault(delivery[0], []).append(delivery)
        for batch in data.draw(st.permutations(list(batches.values()))):
            driven.deliveries.extend(batch)
        t, delta = divmod(upto, 3)
        removed, dbound = driven.prune_cycles(depths, dbound, pack((t, delta)) << ORDER_BITS)
        ddropped = [a + b for a, b in zip(ddropped, removed, strict=True)]
        settled = upto
    removed, dbound = driven.prune_cycles(depths, dbound, None)
    ddropped = [a + b for a, b in zip(ddropped, removed, strict=True)]
    assert sorted(driven.deliveries) == sorted(one.deliveries)
    assert ddropped == dropped and dbound == bound
