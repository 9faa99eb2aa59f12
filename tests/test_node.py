"""Node settings, validation, generator, composition and paths."""

from __future__ import annotations

import math

import pytest
import torch

import mujou_actors as mujou
from tests.conftest import Counter


class Plain(mujou.Node):
    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]


def test_defaults_match_the_reference_page() -> None:
    node = Plain()

    assert node.period == 0.01
    assert node.device == torch.device("cpu")
    assert node.dedicated_thread is False
    assert isinstance(node.generator, torch.Generator)
    assert node.generator.device == torch.device("cpu")
    assert node.path is None


@pytest.mark.parametrize("period", [0, -0.1, math.inf, -math.inf, math.nan, 1e-12])
def test_a_bad_period_is_a_value_error(period: float) -> None:
    with pytest.raises(ValueError, match="period"):
        Plain(period=period)


@pytest.mark.parametrize("period", ["0.1", True, [0.1]])
def test_a_non_number_period_is_a_type_error(period: object) -> None:
    with pytest.raises(TypeError, match="period"):
        Plain(period=period)


def test_period_none_means_no_timer() -> None:
    assert Plain(period=None).period is None


@pytest.mark.parametrize("device", ["mps", "meta", "xla", "not-a-device"])
def test_devices_other_than_cpu_and_cuda_are_refused(device: str) -> None:
    with pytest.raises(ValueError, match=device.split(":")[0]):
        Plain(device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 1)])
def test_cuda_without_cuda_is_a_value_error(device: object) -> None:
    with pytest.raises(ValueError, match="CUDA is not available"):
        Plain(device=device)


def test_a_non_device_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="device"):
        Plain(device=0)


@pytest.mark.cuda
def test_cuda_without_index_is_fixed_at_construction() -> None:
    node = Plain(device="cuda")

    assert node.device == torch.device("cuda", torch.cuda.current_device())
    assert node.generator.device == node.device


def test_settings_are_read_only() -> None:
    node = Plain()

    for name in ("period", "seed", "generator", "device", "dedicated_thread", "path"):
        with pytest.raises(AttributeError):
            setattr(node, name, None)


def test_generator_is_seeded_and_usable_in_init() -> None:
    class Weights(mujou.Node):
        def __init__(self) -> None:
            super().__init__(seed=42)
            self.w = torch.randn(3, generator=self.generator)

    expected = torch.randn(3, generator=torch.Generator().manual_seed(42))

    assert torch.equal(Weights().w, expected)


def test_without_seed_generators_differ() -> None:
    a, b = Plain(), Plain()

    assert not torch.equal(torch.rand(4, generator=a.generator),
                           torch.rand(4, generator=b.generator))


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, "1", True])
def test_a_bad_seed_is_refused(seed: object) -> None:
    with pytest.raises((TypeError, ValueError), match="seed"):
        Plain(seed=seed)


def test_children_get_dotted_paths_in_attribute_order() -> None:
    class Arm(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.controller = Counter()
            self.joints = [Counter(), Counter()]

    class Robot(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.arm = Arm()
            self.sensors = {"imu": Counter()}

    robot = Robot()

    run = mujou.run(robot, timer="simulated", duration=0.0)
    run.join()

    assert [a.path for a in run._actors] == [
        "", "arm", "arm.controller", "arm.joints.0", "arm.joints.1", "sensors.imu"]
    assert robot.arm.joints[1].path == "arm.joints.1"
    assert robot.path == ""


def test_list_and_dict_nets_use_indices_and_keys_as_paths() -> None:
    nodes = {"a": Counter(), "b": Counter()}

    mujou.run(nodes, timer="simulated", duration=0.0).join()
    mujou.run([Counter(), Counter()], timer="simulated", duration=0.0).join()

    assert nodes["b"].path == "b"


def test_a_node_reachable_twice_is_refused() -> None:
    class Twice(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.a = Counter()
            self.b = self.a

    with pytest.raises(mujou.NetError, match="reachable twice.*'a'.*'b'"):
        mujou.run(Twice(), timer="simulated", duration=0.0)


def test_a_missing_super_init_is_named() -> None:
    class Forgot(mujou.Node):
        def __init__(self) -> None:
            self.x = 1

    with pytest.raises(mujou.NetError, match=r"Forgot.*super\(\).__init__"):
        mujou.run(Forgot(), timer="simulated", duration=0.0)


def test_a_node_runs_in_one_net_at_a_time() -> None:
    node = Counter()
    first = mujou.run(node, timer="simulated")

    with pytest.raises(mujou.NetError, match="already part of a running net"):
        mujou.run(node, timer="simulated")
    first.stop()
    first.join()
    node.dts.clear()
    mujou.run(node, timer="simulated", duration=0.01).join()

    assert len(node.dts) == 1


def test_default_state_dict_holds_generator_and_tensor_attributes() -> None:
    class Model(mujou.Node):
        def __init__(self) -> None:
            super().__init__(seed=3)
            self.bias = torch.ones(2)
            self.net = torch.nn.Linear(2, 1)
            self.label = "not state"

    node = Model()

    before = node.state_dict()  # the generator not drawn from yet: its seed says it all
    torch.rand(1, generator=node.generator)
    after = node.state_dict()

    assert set(before) == set(after) == {"generator", "bias", "net"}
    assert before["generator"] == 3
    assert torch.equal(after["generator"], node.generator.get_state())
    assert set(after["net"]) == {"weight", "bias"}


def test_a_generator_is_made_only_when_first_used() -> None:
    node = mujou.Node(seed=5)

    assert node._mujou_generator is None
    first = torch.rand(2, generator=node.generator)

    assert torch.equal(first, torch.rand(2, generator=torch.Generator().manual_seed(5)))
    assert node._mujou_generator is node.generator


def test_a_seed_state_loads_into_a_used_or_unused_generator() -> None:
    fresh, used = mujou.Node(seed=1), mujou.Node(seed=2)
    torch.rand(5, generator=used.generator)

    fresh.load_state_dict({"generator": 9})
    used.load_state_dict({"generator": 9})

    reference = torch.rand(3, generator=torch.Generator().manual_seed(9))
    assert torch.equal(torch.rand(3, generator=fresh.generator), reference)
    assert torch.equal(torch.rand(3, generator=used.generator), reference)


@pytest.mark.parametrize("bad, said", [
    (-1, "is -1"), (2**64, "is 18446744073709551616"), (True, "is True"), (1.5, "is 1.5"),
    ("9", "is '9'"), (None, "is None"), ([1, 2], "is list"),
    (torch.zeros(5056), "is a torch.float32 tensor of 5056 elements"),
    (torch.zeros(16, dtype=torch.uint8), "is a torch.uint8 tensor of 16 elements"),
])
def test_a_generator_entry_that_is_neither_state_nor_seed_is_refused(bad, said: str) -> None:
    node = mujou.Node(seed=1)

    with pytest.raises(ValueError) as info:
        node.load_state_dict({"generator": bad})

    message = str(info.value)
    assert message.startswith("Node (not in a run yet): cannot load this state: ")
    assert f"state['generator'] {said}" in message
    assert "seed (an int in [0, 2**64))" in message or "generator's state is" in message
    assert node._mujou_generator is None  # checking made no generator
    assert node.state_dict()["generator"] == 1  # unchanged


def test_load_state_dict_restores_values_and_generator() -> None:
    class Model(mujou.Node):
        def __init__(self) -> None:
            super().__init__(seed=3)
            self.bias = torch.zeros(2)

    a, b = Model(), Model()
    a.bias += 5
    torch.rand(3, generator=a.generator)

    b.load_state_dict(a.state_dict())

    assert torch.equal(b.bias, torch.full((2,), 5.0))
    assert torch.equal(torch.rand(3, generator=a.generator),
                       torch.rand(3, generator=b.generator))


def test_ports_assigned_in_init_are_bound_when_init_returns_and_writes_are_plain() -> None:
    class Fan(mujou.Node):
        def __init__(self, n: int) -> None:
            super().__init__(period=None)
            for i in range(n):
                setattr(self, f"out{i}", mujou.Output(int))
            self.inp = mujou.Input(int)

    fan = Fan(3)
    assert [(fan.out2.node, fan.out2.name), (fan.inp.node, fan.inp.name)] == [
        (fan, "out2"), (fan, "inp")]
    assert fan.out0.path == "Fan.out0"  # outside a run: named by its class
    # No Node.__setattr__: an attribute write in a hook is a plain object write.
    assert "__setattr__" not in vars(mujou.Node) and type(fan).__setattr__ is object.__setattr__


def test_a_port_assigned_after_init_is_bound_when_the_run_collects_it() -> None:
    class Late(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)

    class Net(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.a, self.b = Late(), Late()

    net = Net()
    net.a.out = mujou.Output(int)  # after Late.__init__ returned
    net.b.inp = mujou.Input(int)
    mujou.connect(net.a.out, net.b.inp)
    with mujou.run(net, timer="simulated", duration=0.0) as run:
        assert run.read("a.out") is None  # found by its path: bound to a as "out"
    assert net.a.out.node is net.a and net.b.inp.path == "b.inp"


def test_one_port_object_given_to_two_nodes_is_refused_naming_it() -> None:
    shared = mujou.Output(int)

    class Holder(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.out = shared

    Holder()
    with pytest.raises(ValueError, match="already belongs to another node"):
        Holder()
