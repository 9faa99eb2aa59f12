"""The kernel driven without `Run`: a subset of a net, deliveries in, sends out, stepped.

A driver below steps several kernels, each running some of a net's nodes,
through one global sequence of delta cycles and carries the messages between
them, as the multi-process backend will: the messages and states must be
bit-identical to the whole net's single `mujou.run`.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest
import torch

import mujou_actors as mujou
from mujou_actors._runtime.build import Seams
from mujou_actors._runtime.kernel import LAST_DELTA, Kernel, OutsideSend
from mujou_actors.errors import NodeError
from tests import placed_support
from tests.conftest import Tick

pytestmark = pytest.mark.timeout(60)

MS = 1_000_000


# The net of these tests (sim -> ctrl -> log, sim -> log) is the placed runs' too.
Sim, Ctrl, Log, make_net = placed_support.Sim, placed_support.Ctrl, placed_support.Log, \
    placed_support.make_net


def _readers(net: dict[str, mujou.Node]) -> dict[str, list[str]]:
    """Output path -> the paths of the Inputs it feeds."""
    out = {}
    for path, node in net.items():
        for name, port in node._mujou_ports().items():
            if isinstance(port, mujou.Output):
                out[f"{path}.{name}"] = [r.path for r in port.readers]
    return out


def drive(kernels: list[Kernel], readers: dict[str, list[str]], end_ns: int,
          log: list[OutsideSend] | None = None) -> int:
    """Step the kernels through the global delta cycles up to ``end_ns``; return the steps.

    The conservative rule: every kernel runs the same delta cycle, the least
    due one of all; the messages it sent go to their readers' kernels before
    the next, which they may trigger. What ``on_start`` sent is carried first,
    before any timer starts (the first `Kernel.next_due`).
    """
    owner = {path: k for k in kernels for path in k.ports}
    steps = 0
    while True:
        for kernel in kernels:
            for sent in kernel.take_sends():
                if log is not None:
                    log.append(sent)
                for reader in readers[sent.output]:
                    if reader in owner and owner[reader] is not kernel:
                        owner[reader].deliver(reader, sent.message, sent.t_ns, sent.delta,
                                              sent.sender)
        dues = [d for d in (k.next_due() for k in kernels) if d is not None]
        if not dues or min(dues)[0] > end_ns:
            return steps
        key = min(dues)
        for kernel in kernels:
            kernel.settle(key)  # the cycles before it are over everywhere
        for kernel in kernels:
            kernel.step(until=key)
        steps += 1


def _single(workers: int, duration: float) -> dict:
    net = make_net()
    with mujou.run(net, timer="simulated", duration=duration, seed=7, workers=workers) as run:
        run.join()
    return run.state_dict()["nodes"]


@pytest.mark.parametrize("groups", [
    [["sim"], ["ctrl", "log"]],
    [["sim", "log"], ["ctrl"]],
    [["sim"], ["ctrl"], ["log"]],
], ids=["sim|ctrl+log", "sim+log|ctrl", "three"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_net_split_over_driven_kernels_matches_the_single_run_bit_for_bit(
        groups: list[list[str]], workers: int) -> None:
    expected = _single(1, 0.1)
    net = make_net()
    kernels = [Kernel(net, g, workers=workers, seed=7) for g in groups]
    try:
        for k in kernels:
            k.start()
        drive(kernels, _readers(net), 100 * MS)
        states = {}
        for k in kernels:
            states.update(k.state_dict()["nodes"])
    finally:
        for k in kernels:
            k.stop()
    assert set(states) == set(expected)
    assert torch.equal(states["sim"]["x"], expected["sim"]["x"])
    assert states["ctrl"] == expected["ctrl"] and states["ctrl"]["n"] == 10
    assert states["log"]["seen"] == expected["log"]["seen"]
    assert len(states["log"]["seen"]) == 20  # every obs and every cmd, in the same order


def _updates(kernel: Kernel) -> dict[str, int]:
    return {a.path: a.updates for a in kernel.actors}


def test_stepping_runs_one_delta_cycle_at_a_time_and_says_what_is_due_next() -> None:
    net = make_net()
    with Kernel(net, seed=1) as k:
        k.start()
        assert k.next_due() == (10 * MS, 0)  # sim's first tick
        assert k.step() == (10 * MS, 1)  # sim sent: ctrl and log are triggered next
        assert k.dispatcher.frontier == (10 * MS, 0)
        assert _updates(k) == {"sim": 1, "ctrl": 0, "log": 0}
        assert k.step() == (10 * MS, 2)  # ctrl sent its command to log
        assert _updates(k) == {"sim": 1, "ctrl": 1, "log": 1}
        assert k.step() == (20 * MS, 0)
        assert _updates(k) == {"sim": 1, "ctrl": 1, "log": 2}
        assert k.step(until=(30 * MS, LAST_DELTA)) == (40 * MS, 0)  # two whole instants
        assert _updates(k) == {"sim": 3, "ctrl": 3, "log": 6}
        assert k.time_ns == 30 * MS


def test_sends_to_inputs_outside_the_kernel_are_collected_in_stamp_order() -> None:
    net = make_net()
    with Kernel(net, ["sim", "ctrl"], seed=3) as k:
        k.start()
        k.step(until=(20 * MS, LAST_DELTA))
        sent = k.take_sends()
        assert k.take_sends() == []  # taken once
    # sim.out reaches log (outside) at each tick, ctrl.cmd one delta cycle later.
    assert [(s.t_ns, s.delta, s.output) for s in sent] == [
        (10 * MS, 0, "sim.out"), (10 * MS, 1, "ctrl.cmd"),
        (20 * MS, 0, "sim.out"), (20 * MS, 1, "ctrl.cmd")]
    assert [s.sender for s in sent] == [0, 1, 0, 1]  # the nodes' order in the net
    assert torch.equal(sent[1].message, torch.tanh(sent[0].message) * 1)


def test_sent_is_called_on_the_sending_thread_with_one_stamp_per_hook() -> None:
    """``Kernel(sent=)`` (a real-time group's direct hop): called after each send outside,
    the send already taken-able, with its hook's stamp: the same for the sends of one
    hook, another for the next hook; ``notify`` is then left to failures."""
    net = {"burst": placed_support.Counter(0, period=0.01), "count": placed_support.Count()}
    mujou.connect(net["burst"].out, net["count"].inp)
    calls: list[tuple[int, list[int]]] = []
    notified: list[int] = []
    k = Kernel(net, ["burst"], seed=0, sent=lambda stamped: calls.append(
        (stamped, [s.message for s in k.take_sends()])), notify=lambda: notified.append(1))
    with k:
        k.start()
        k.step(until=(20 * MS, LAST_DELTA))
    assert [taken for _, taken in calls] == [[0], [1], [2], [3], [4], [5]]  # 3 a tick
    stamps = [stamped for stamped, _ in calls]
    assert stamps[0] == stamps[1] == stamps[2] != stamps[3] == stamps[4] == stamps[5]
    assert notified == []


def test_deliveries_from_outside_are_applied_in_stamp_order_whatever_their_arrival() -> None:
    net = make_net()
    with Kernel(net, ["log"]) as k:
        k.start()
        assert k.next_due() is None  # nothing of its own: triggered only
        # Arrival order is not send order: sorted by (t, delta, sender) when applied.
        k.deliver("log.cmd", torch.tensor([2.0]), 10 * MS, 1, 1)
        k.deliver("log.obs", torch.tensor([1.0]), 10 * MS, 0, 0)
        assert k.next_due() == (10 * MS, 1)  # the earliest trigger: obs at (10 ms, 0) + 1
        k.step(until=(10 * MS, LAST_DELTA))
        seen = k.state_dict()["nodes"]["log"]["seen"]
    assert seen == [["obs", [1.0]], ["cmd", [2.0]]]


def test_a_delivery_after_its_delta_cycle_ran_is_refused_naming_the_input() -> None:
    net = make_net()
    with Kernel(net, ["log"]) as k:
        k.start()
        k.deliver("log.obs", torch.tensor([1.0]), 10 * MS, 0, 0)
        k.step()  # runs (10 ms, 1)
        with pytest.raises(ValueError, match=r"'log.obs' sent at \(10000000, 0\) comes too late"):
            k.deliver("log.obs", torch.tensor([2.0]), 10 * MS, 0, 0)
        with pytest.raises(ValueError, match="no input 'sim.out' in this kernel"):
            k.deliver("sim.out", torch.tensor([2.0]), 20 * MS, 0, 0)
        with pytest.raises(mujou.PortTypeError):
            k.deliver("log.obs", "not a tensor", 20 * MS, 0, 0)
        assert len(k.state_dict()["nodes"]["log"]["seen"]) == 1  # the refused ones left no trace


def test_a_kernel_state_taken_at_a_cut_restores_into_a_fresh_kernel_and_goes_on_identically(
        ) -> None:
    straight = make_net()
    with Kernel(straight, seed=5) as k:
        k.start()
        k.step(until=(100 * MS, LAST_DELTA))
        expected = k.state_dict()["nodes"]

    first = make_net()
    with Kernel(first, seed=5) as k:
        k.start()
        k.step(until=(50 * MS, LAST_DELTA))
        tree = k.state_dict()
    assert tree["time_ns"] == 50 * MS and tree["nodes"]["ctrl"]["n"] == 5

    second = make_net()
    with Kernel(second, seed=5) as k:
        k.start()
        k.load_state_dict(tree)
        assert k.next_due() == (60 * MS, 0)  # the schedule goes on where it was
        k.step(until=(100 * MS, LAST_DELTA))
        got = k.state_dict()["nodes"]
    assert torch.equal(got["sim"]["x"], expected["sim"]["x"])
    assert got["ctrl"] == expected["ctrl"] and got["log"] == expected["log"]


class Boom(mujou.Node):
    def __init__(self) -> None:
        super().__init__(period=0.01)

    def on_update(self, dt: float) -> None:
        raise RuntimeError("boom")


def test_a_hook_that_raises_fails_the_step_with_a_node_error_and_runs_no_more() -> None:
    with Kernel({"b": Boom()}) as k:
        k.start()
        with pytest.raises(NodeError, match="node 'b' raised in on_update") as info:
            k.step()
        assert info.value.path == "b" and info.value.hook == "on_update"
        assert k.next_due() is None  # a failed node is not scheduled again


def test_a_kernel_claims_only_its_own_nodes_and_releases_them_at_stop() -> None:
    net = make_net()
    k = Kernel(net, ["ctrl"])
    assert net["ctrl"]._mujou_run is not None and net["sim"]._mujou_run is None
    with pytest.raises(mujou.NetError, match="already part of a running net"):
        Kernel(net, ["ctrl"])
    with pytest.raises(ValueError, match="no node 'nope' in the net"):
        Kernel(net, ["nope"])
    k.start()
    k.stop()
    assert net["ctrl"]._mujou_run is None
    with pytest.raises(RuntimeError, match="not running"):
        k.step()


# -- a made-up net: fan-in, a depth-1 Input with drops, a dedicated thread, sends in on_start,
# -- a message that crosses kernels twice in one instant, a kernel for a subtree ------------


class Src(mujou.Node):
    """A periodic source that also sends once in on_start."""

    out = mujou.Output(torch.Tensor)

    def __init__(self, period: float, tag: float, dedicated: bool = False) -> None:
        super().__init__(period=period, dedicated_thread=dedicated)
        self.tag = tag
        self.k = 0

    def on_start(self) -> None:
        self.out.send(torch.tensor([self.tag, -1.0]))

    def on_update(self, dt: float) -> None:
        self.k += 1
        self.out.send(torch.tensor([self.tag, float(self.k)])
                      + torch.randn(2, generator=self.generator))

    def state_dict(self) -> dict:
        return {"k": self.k, "g": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.k = state["k"]
        self.generator.set_state(state["g"])


class Merge(mujou.Node):
    """Fed by two sources through one depth-1 Input, and by the echo's answers."""

    x = mujou.Input(torch.Tensor, depth=1)
    y = mujou.Input(torch.Tensor, depth=None)
    fwd = mujou.Output(torch.Tensor)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.seen: list = []
        self.n = 0

    def on_update(self, dt: float) -> None:
        xs, ys = self.x.drain(), self.y.drain()
        self.seen.append([[v.tolist() for v in xs], [v.tolist() for v in ys], dt])
        for v in xs:
            self.n += 1
            self.fwd.send(v * 2 + self.n)

    def state_dict(self) -> dict:
        return {"seen": list(self.seen), "n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.seen, self.n = list(state["seen"]), state["n"]


class Group(mujou.Node):
    def __init__(self) -> None:
        super().__init__(period=None)
        self.merge = Merge()


class Echo(mujou.Node):
    """Sends back what it gets: the message crosses kernels twice in one instant."""

    inp = mujou.Input(torch.Tensor, depth=2)
    back = mujou.Output(torch.Tensor)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.seen: list = []

    def on_update(self, dt: float) -> None:
        for v in self.inp.drain():
            self.seen.append(v.tolist())
            if v[1] > 0:
                self.back.send(-v)

    def state_dict(self) -> dict:
        return {"seen": list(self.seen)}

    def load_state_dict(self, state: dict) -> None:
        self.seen = list(state["seen"])


def make_fan_in() -> dict[str, mujou.Node]:
    net = {"a": Src(0.01, 1.0), "b": Src(0.015, 2.0, dedicated=True), "grp": Group(),
           "echo": Echo()}
    merge = net["grp"].merge
    mujou.connect(net["a"].out, merge.x)
    mujou.connect(net["b"].out, merge.x)
    mujou.connect(merge.fwd, net["echo"].inp)
    mujou.connect(net["echo"].back, merge.y)
    return net


def _all_readers(net: dict[str, mujou.Node]) -> dict[str, list[str]]:
    out = _readers(net)
    merge = net["grp"].merge
    out[merge.fwd.path] = [r.path for r in merge.fwd.readers]
    return out


def _drive_states(kernels: list[Kernel], net: dict[str, mujou.Node]) -> dict[str, Any]:
    """Drive ``kernels`` over ``net`` to 200 ms; the nodes' states of all of them, merged."""
    drive(kernels, _all_readers(net), 200 * MS)
    states: dict[str, Any] = {}
    for k in kernels:
        states.update(k.state_dict()["nodes"])
    return states


FAN_IN_GROUPS = [["a"], ["b"], ["grp.merge"], ["echo"]]


@pytest.mark.parametrize("workers", [1, 4])
def test_fan_in_drops_on_start_sends_and_echoes_across_kernels_match_the_single_run(
        workers: int) -> None:
    net = make_fan_in()
    with mujou.run(net, timer="simulated", duration=0.2, seed=7, workers=1) as run:
        run.join()
    expected = run.state_dict()["nodes"]
    assert net["grp"].merge.x.drops > 0  # the depth-1 Input did drop messages
    net = make_fan_in()
    kernels = [Kernel(net, g, workers=workers, seed=7) for g in FAN_IN_GROUPS]
    try:
        for k in kernels:
            k.start()
        states = _drive_states(kernels, net)  # on_start's sends carried first
    finally:
        for k in kernels:
            k.stop()
    assert states["grp.merge"] == expected["grp.merge"]
    assert states["echo"] == expected["echo"] and len(states["echo"]["seen"]) > 20
    for src in ("a", "b"):
        assert states[src]["k"] == expected[src]["k"]
        assert torch.equal(states[src]["g"], expected[src]["g"])


class _Hop(mujou.Node):
    """Triggered: logs ``(dt, messages)`` and passes each message one hop on."""

    inp = mujou.Input(tuple, depth=None)
    out = mujou.Output(tuple)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.seen: list[tuple[float, list[tuple]]] = []

    def on_update(self, dt: float) -> None:
        got = self.inp.drain()
        self.seen.append((dt, got))
        for i, n in got:
            self.out.send((i + 1, n))


def _crowded() -> dict[str, mujou.Node]:
    """1030 ticks due together (over one worker's batch), a fan-in of all, a 4-hop chain.

    The fan-in feeds the second hop too, so that a kernel holding the first
    two hops but not the fan-in must wait at each delta cycle for it.
    """
    net: dict[str, mujou.Node] = {f"t{i}": Tick(i) for i in range(1030)}
    hops = [_Hop() for _ in range(4)]
    net.update({f"h{j}": hop for j, hop in enumerate(hops)})
    net["fan"] = fan = _Hop()
    mujou.connect(net["t0"].out, hops[0].inp)
    for a, b in itertools.pairwise(hops):
        mujou.connect(a.out, b.inp)
    for i in range(1030):
        mujou.connect(net[f"t{i}"].out, fan.inp)
    mujou.connect(fan.out, hops[1].inp)
    return net


@pytest.mark.parametrize("workers", [1, 3])
def test_a_crowded_net_split_over_kernels_matches_the_single_run_for_any_workers(
        workers: int) -> None:
    # The lean simulated paths (a bucket over the batch, the lone worker's loop
    # entering the next delta cycle itself) under a driver's bounds: the
    # kernel of the ticks and the first two hops must not run the second hop
    # before the fan-in's messages, sent in the other kernel, are carried.
    single = _crowded()
    mujou.run(single, timer="simulated", duration=0.003, workers=workers).join(timeout=30)
    net = _crowded()
    groups = [[f"t{i}" for i in range(1030)] + ["h0", "h1"], ["h2", "h3", "fan"]]
    kernels = [Kernel(net, g, workers=workers) for g in groups]
    try:
        for k in kernels:
            k.start()
        drive(kernels, _readers(net), 3 * MS)
    finally:
        for k in kernels:
            k.stop()
    for path in ("h0", "h1", "h2", "h3", "fan"):
        assert net[path].seen == single[path].seen, path  # type: ignore[attr-defined]
    instants = (1, 2, 3)
    assert single["fan"].seen == [  # type: ignore[attr-defined]
        (0.001, [(i, k) for i in range(1030)]) for k in instants]
    # At (t, 2): the first hop's message, then the fan-in's (net order).
    assert single["h1"].seen == [  # type: ignore[attr-defined]
        (0.001, [(1, k)] + [(i + 1, k) for i in range(1030)]) for k in instants]
    assert [len(got) for _, got in single["h3"].seen] == [1031] * 3  # type: ignore[attr-defined]


def test_trees_taken_at_an_instant_boundary_restore_a_split_net_and_drop_on_start_sends(
        ) -> None:
    net = make_fan_in()
    with mujou.run(net, timer="simulated", duration=0.2, seed=7, workers=1) as run:
        run.join()
    expected = run.state_dict()["nodes"]
    net = make_fan_in()
    kernels = [Kernel(net, g, seed=7) for g in FAN_IN_GROUPS]
    try:
        for k in kernels:
            k.start()
        drive(kernels, _all_readers(net), 90 * MS)  # every instant up to 90 ms, with all its deltas
        trees = [k.state_dict() for k in kernels]
    finally:
        for k in kernels:
            k.stop()
    net = make_fan_in()
    kernels = [Kernel(net, g, seed=7) for g in FAN_IN_GROUPS]
    try:
        for k, tree in zip(kernels, trees, strict=True):
            k.start()
            k.load_state_dict(tree)
            # What on_start sent to other kernels goes with the rest: the trees hold the cut.
            assert k.take_sends() == []
        states = _drive_states(kernels, net)
    finally:
        for k in kernels:
            k.stop()
    assert states["grp.merge"] == expected["grp.merge"]
    assert states["echo"] == expected["echo"]


def test_a_state_between_two_delta_cycles_is_refused() -> None:
    with Kernel(make_net(), ["log"]) as k:
        k.start()
        k.deliver("log.obs", torch.tensor([1.0]), 10 * MS, 0, 0)
        assert k.next_due() == (10 * MS, 1)
        # A tree would hold the message unstamped: loaded, it would trigger log at (0, 1).
        with pytest.raises(RuntimeError, match=r"due at \(10000000, 1\), within an instant"):
            k.state_dict()
        k.step(until=(10 * MS, LAST_DELTA))
        assert k.state_dict()["nodes"]["log"]["seen"] == [["obs", [1.0]]]
    with Kernel(make_net(), seed=1) as k:
        k.start()
        k.step()  # (10 ms, 0): sim sent; ctrl and log, due at (10 ms, 1), are what a
        k.state_dict()  # loaded tree triggers first: this state goes on identically
        k.step()  # (10 ms, 1): ctrl sent its command, log is due at (10 ms, 2)
        with pytest.raises(RuntimeError, match="take the state at an instant's boundary"):
            k.state_dict()
        k.step(until=(10 * MS, LAST_DELTA))
        assert k.state_dict()["nodes"]["ctrl"]["n"] == 1


def test_deliver_checks_the_stamp_it_is_given_and_refuses_after_stop() -> None:
    k = Kernel(make_net(), ["log"])
    k.start()
    obs = torch.tensor([1.0])
    for args, error, match in [
            ((1e7, 0, 0), TypeError, "t_ns must be an int, got 10000000.0"),
            ((True, 0, 0), TypeError, "t_ns must be an int, got True"),
            ((10 * MS, 0.0, 0), TypeError, "delta must be an int"),
            ((10 * MS, 0, None), TypeError, "sender must be an int"),
            ((-2, 0, 0), ValueError, "t_ns must be >= -1"),
            ((10 * MS, -1, 0), ValueError, r"delta must be in \[0, 4294967295\)"),
            ((10 * MS, LAST_DELTA, 0), ValueError, "delta must be in"),
            ((10 * MS, 0, 3), ValueError, r"sender must be in \[-1, 3\)"),
            ((10 * MS, 0, -2), ValueError, "sender must be in")]:
        with pytest.raises(error, match=match):
            k.deliver("log.obs", obs, *args)
    k.deliver("log.obs", obs, -1, 0, 0)  # as on_start's sends: before the timer started
    assert k.next_due() == (0, 1)  # that one only: the refused ones left no trace
    k.step()
    assert k.state_dict()["nodes"]["log"]["seen"] == [["obs", [1.0]]]
    with pytest.raises(TypeError, match=r"Kernel.settle: until must be a key"):
        k.settle([10 * MS, 0])  # type: ignore[arg-type]
    k.stop()
    with pytest.raises(RuntimeError, match="the kernel is stopped"):
        k.deliver("log.obs", obs, 10 * MS, 0, 0)
    with pytest.raises(RuntimeError, match="Kernel.settle: the kernel is stopped"):
        k.settle(None)


def test_a_step_bound_that_is_not_a_key_is_refused_and_the_kernel_goes_on() -> None:
    with Kernel(make_net(), seed=1) as k:
        k.start()
        for bad in (5, (1, 2, 3), (1.0, 0), [10 * MS, 0], (True, 0)):
            with pytest.raises(TypeError, match="until must be a key"):
                k.step(until=bad, timeout=2)  # type: ignore[arg-type]
        assert k.step(timeout=2) == (10 * MS, 1)  # no worker died of it


def test_nodes_given_as_one_string_is_refused() -> None:
    with pytest.raises(TypeError, match=r"not the string 'sim' \(write \['sim'\]\)"):
        Kernel(make_net(), "sim")


def test_a_refused_kernel_leaves_the_nodes_as_they_were() -> None:
    net = make_net()
    # Arguments come first: nothing of the net is touched.
    with pytest.raises(TypeError, match="Kernel: seed must be an int"):
        Kernel(net, ["sim"], seed="7")  # type: ignore[arg-type]
    # A refused net: paths were given, then collect_ports found sim.out's readers
    # outside it; they are taken back.
    with pytest.raises(mujou.NetError, match="not part of the net"):
        Kernel({"only": net["sim"]})
    assert [n._mujou_path for n in net.values()] == [None, None, None]
    # A build that fails once the nodes are claimed (here: the CUDA runtime) releases them.
    net["sim"]._mujou_device = torch.device("cuda", 0)  # a "CUDA" node (see fake_cuda.py)

    def no_cuda() -> Any:
        raise RuntimeError("no CUDA here")

    with pytest.raises(RuntimeError, match="no CUDA here"):
        Kernel(net, ["sim", "ctrl"], seams=Seams(cuda_runtime=no_cuda))
    assert [n._mujou_run for n in net.values()] == [None, None, None]
    assert [n._mujou_path for n in net.values()] == [None, None, None]
    assert "send" not in vars(net["ctrl"].cmd)  # unwired


class Lone(mujou.Node):
    def __init__(self) -> None:
        super().__init__(period=0.01)


def test_a_kernel_never_renames_a_node_of_another_running_net() -> None:
    lone = Lone()
    with mujou.run({"x": lone}, timer="simulated") as run:
        with pytest.raises(ValueError, match="part of another running net, as 'x'"):
            Kernel({"elsewhere": lone}, [])
        assert lone.path == "x"
        run.stop()


class _Keep(mujou.Node):
    """Keeps every message it reads, the objects themselves."""

    inp = mujou.Input(object, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.got: list[Any] = []

    def on_update(self, dt: float) -> None:
        self.got.extend(self.inp.drain())


def test_an_owned_message_is_delivered_as_it_is_and_another_is_copied() -> None:
    """``Kernel.write/deliver(owned=True)``: a message decoded from another process is the
    kernel's alone, so a net without CUDA nodes keeps it uncopied; a host's write is
    copied (the host may change its object afterwards)."""
    node = _Keep()
    owned, written, delivered = torch.ones(4), torch.ones(4), torch.zeros(2)
    with Kernel({"keep": node}, ["keep"], seed=0) as k:
        k.start()
        k.write("keep.inp", owned, owned=True)
        k.write("keep.inp", written)
        k.deliver("keep.inp", delivered, 5 * MS, 0, 0, owned=True)
        k.step(until=(10 * MS, LAST_DELTA))
    assert len(node.got) == 3
    assert node.got[0] is owned and node.got[1] is not written
    assert torch.equal(node.got[1], written) and node.got[2] is delivered


class _Counted(mujou.Node):
    """Ticks every millisecond; ``ticked`` is set at each update."""

    def __init__(self) -> None:
        super().__init__(period=0.001)
        self.n = 0
        self.ticked = threading.Event()

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.ticked.set()


@pytest.mark.timeout(30)
def test_a_real_time_kernel_is_at_a_cut_before_its_timer_starts_and_its_release_starts_nothing(
        ) -> None:
    """A run's end after a failed start holds kernels whose timers never started: held at
    once (they were waited for a whole stop_timeout), and the release leaves them unstarted."""
    net = {"c": _Counted()}
    k = Kernel(net, ["c"], workers=2, seed=0, timer="realtime")
    k.start()
    try:
        assert k.hold(0.0) is True  # at once: nothing timed runs, no hook in flight
        k.release()
        assert k.hold(0.0) is True
        k.release()
        assert not k.timing and not net["c"].ticked.wait(0.05) and net["c"].n == 0

        assert k.hold(0.0) is True  # held before the timer started ...
        k.run_free()  # ... which the timer's start ends
        assert net["c"].ticked.wait(10)
        assert k.hold(10.0) is True  # a real cut now, and its release lets the work go on
        n = net["c"].n
        net["c"].ticked.clear()
        assert not net["c"].ticked.wait(0.05) and net["c"].n == n  # held: no tick
        k.release()
        assert net["c"].ticked.wait(10) and net["c"].n > n
    finally:
        k.stop(5)
