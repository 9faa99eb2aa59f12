"""Messages: the one container walker, its nesting limit, and the copies made with it."""

from __future__ import annotations

import collections
import copy
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mujou_actors as mujou
from mujou_actors import devices
from mujou_actors.messages import (
    MAX_NESTING,
    SCALARS,
    copy_message,
    describe_value,
    map_tensors,
    tensors_in,
)
from mujou_actors.state import copy_state
from tests.conftest import Collector


def nested(depth: int, wrap: Callable[[Any], Any] = lambda x: [x]) -> Any:
    """``depth`` containers, one inside the other, around the int 1."""
    value: Any = 1
    for _ in range(depth):
        value = wrap(value)
    return value


def depth_of(value: Any) -> tuple[int, Any]:
    """How many containers ``nested`` put around its innermost value, and that value."""
    n = 0
    while isinstance(value, (list, tuple, dict)):
        value = value["k"] if isinstance(value, dict) else value[0]
        n += 1
    return n, value


# -- the nesting limit ------------------------------------------------------------------------


def test_a_message_10000_levels_deep_is_refused_naming_the_port_and_the_limit() -> None:
    message = nested(10_000)

    with pytest.raises(ValueError) as info:
        copy_message(message, where="port 'src.out'")

    assert str(info.value).startswith("port 'src.out'[0][0][0][0]...[0][0][0][0]: ")
    assert "containers nested deeper than 1000 levels" in str(info.value)
    assert "MAX_NESTING" in str(info.value)


@pytest.mark.parametrize("wrap", [lambda x: [x], lambda x: (x,), lambda x: {"k": x}],
                         ids=["list", "tuple", "dict"])
def test_a_message_of_max_nesting_levels_copies_and_one_more_is_refused(wrap: Any) -> None:
    assert MAX_NESTING == 1000

    assert depth_of(copy_message(nested(MAX_NESTING, wrap))) == (MAX_NESTING, 1)
    assert depth_of(map_tensors(nested(MAX_NESTING, wrap), lambda t: t)) == (MAX_NESTING, 1)
    with pytest.raises(ValueError, match="nested deeper than 1000 levels"):
        copy_message(nested(MAX_NESTING + 1, wrap))
    with pytest.raises(ValueError, match="nested deeper than 1000 levels"):
        map_tensors(nested(MAX_NESTING + 1, wrap), lambda t: t)


def test_an_empty_or_flat_container_past_the_limit_is_refused_too() -> None:
    for innermost in ([], [1.0, torch.ones(1)], {"a": 1}, ()):
        message: Any = innermost  # at level 1001
        for _ in range(MAX_NESTING):
            message = [message]

        with pytest.raises(ValueError, match="nested deeper than 1000 levels"):
            copy_message(message)
        with pytest.raises(ValueError, match="nested deeper than 1000 levels"):
            copy_state(message, "state")


def test_the_device_routing_walk_refuses_a_deep_message_without_recursion() -> None:
    with pytest.raises(ValueError, match=r"^message\[0\].*nested deeper than 1000 levels"):
        devices.map_tensors(nested(10_000), lambda t: t)
    with pytest.raises(ValueError, match="nested deeper than 1000 levels"):
        devices.tensors_in(nested(10_000))


def test_a_deep_message_sent_fails_its_node_with_the_limit_not_a_recursion_error() -> None:
    class Deep(mujou.Node):
        out = mujou.Output()

        def __init__(self) -> None:
            super().__init__(period=0.01)

        def on_update(self, dt: float) -> None:
            self.out.send(nested(10_000))

    class Net(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=None)
            self.src = Deep()
            self.sink = Collector()
            mujou.connect(self.src.out, self.sink.inp)

    run = mujou.run(Net(), timer="simulated", duration=0.02)

    with pytest.raises(mujou.NodeError, match="'src' raised in on_update: ValueError: output "
                       "'src.out' sent a value that cannot be copied: .*"
                       "nested deeper than 1000 levels") as info:
        run.join(timeout=30)
    assert type(info.value.__cause__) is ValueError


def test_a_state_10000_levels_deep_is_refused_naming_the_node_and_the_key_path() -> None:
    class Deep(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01)

        def state_dict(self) -> dict:
            state = super().state_dict()
            state["tree"] = {"branch": nested(10_000)}
            return state

    run = mujou.run({"deep": Deep()}, timer="simulated", duration=0.02)
    run.join(timeout=30)

    with pytest.raises(ValueError, match=r"^node 'deep' state\['tree'\]\['branch'\]\[0\]\[0\]"
                       r"\.\.\.\[0\]\[0\]\[0\]\[0\]: containers nested deeper than 1000 levels"):
        run.state_dict()


def test_a_state_of_max_nesting_levels_copies_and_one_more_is_refused() -> None:
    deep = nested(MAX_NESTING, lambda x: {"k": x})

    assert depth_of(copy_state(deep, "node 'n' state")) == (MAX_NESTING, 1)
    with pytest.raises(ValueError, match=r"^node 'n' state\['k'\].*deeper than 1000 levels"):
        copy_state({"k": deep}, "node 'n' state")


def test_state_keys_are_checked_in_order_with_the_values_as_before() -> None:
    with pytest.raises(TypeError, match=r"^node 'n' state\['a'\]: key 0.5 is a float; state "
                       "keys must be str or int$"):
        copy_state({"a": {"b": [1], 0.5: [2]}}, "node 'n' state")
    with pytest.raises(TypeError, match=r"^node 'n' state\['a'\]\['b'\]\[0\]: a object "):
        copy_state({"a": {"b": [object()], 0.5: [2]}}, "node 'n' state")  # met first
    with pytest.raises(TypeError, match=r"^node 'n' state: key \(1,\) is a tuple"):
        copy_state({"a": 1, (1,): 2}, "node 'n' state")  # a flat dict


def test_a_short_key_path_is_named_in_full() -> None:
    with pytest.raises(TypeError, match=r"^node 'n' state\['a'\]\[1\]\['b'\]\[0\]: a set "):
        copy_state({"a": [1, {"b": [set()]}]}, "node 'n' state")


# -- value semantics --------------------------------------------------------------------------


class Pose(NamedTuple):
    xyz: torch.Tensor
    frame: str


class Pair(tuple):  # noqa: SLOT001 - a plain tuple subclass, rebuilt as vt(items)
    pass


class Bag(list):  # a list subclass: deep-copied by copy_message, kept by map_tensors
    pass


@dataclasses.dataclass
class Sample:
    value: Any
    label: str = "x"
    stamp: Any = dataclasses.field(init=False, default=None)


@dataclasses.dataclass(frozen=True)
class Frozen:
    value: Any


def test_copies_are_independent_and_immutables_are_shared() -> None:
    label = "a label long enough not to be interned by accident"
    t = torch.arange(3.0, requires_grad=True) * 2
    msg = {"t": t, "list": [t, label], "pose": Pose(torch.zeros(3), label),
           "sample": Sample([torch.ones(2)], label), "frozen": Frozen(torch.ones(1)),
           "od": collections.OrderedDict(b=torch.ones(1)), "other": {frozenset({1})}}

    out = copy_message(msg)
    with torch.no_grad():
        t.add_(10)
    msg["sample"].value[0].add_(10)
    msg["list"].append("later")

    assert out["t"] is not t and torch.equal(out["t"], torch.arange(3.0) * 2)
    assert out["t"].requires_grad is False and out["list"][0] is not out["t"]
    assert out["list"] == [out["list"][0], label] and out["list"][1] is label
    assert type(out["pose"]) is Pose and out["pose"].frame is label
    assert type(out["sample"]) is Sample and torch.equal(out["sample"].value[0], torch.ones(2))
    assert out["frozen"] == Frozen(out["frozen"].value) and out["frozen"] is not msg["frozen"]
    assert type(out["od"]) is collections.OrderedDict and out["od"]["b"] is not msg["od"]["b"]
    assert out["other"] == {frozenset({1})} and out["other"] is not msg["other"]


def test_the_flat_fast_paths_give_what_the_walker_gives() -> None:
    a, b = torch.ones(2), torch.zeros(3)
    for msg in (a, (a, b), [a, 1, "s", None], {"a": a, "b": 2.5}, (), [], {}):
        seen: list[torch.Tensor] = []

        def record(t: torch.Tensor, seen: list[torch.Tensor] = seen) -> torch.Tensor:
            seen.append(t)
            return t.clone()

        out = copy_message(msg, record)

        assert same(out, old_copy_message(msg))
        assert [id(t) for t in seen] == [id(t) for t in tensors_in(msg)]


def test_a_dataclass_field_left_unset_is_left_unset_in_the_copy() -> None:
    @dataclasses.dataclass
    class Late:
        value: Any
        later: Any = dataclasses.field(init=False)

    out = copy_message(Late(torch.ones(1)))

    assert torch.equal(out.value, torch.ones(1)) and not hasattr(out, "later")


def test_a_defaultdict_keeps_its_default_and_a_list_subclass_is_deep_copied() -> None:
    dd: collections.defaultdict[str, list[int]] = collections.defaultdict(list, a=[1])
    bag = Bag([torch.ones(1)])

    out = copy_message({"dd": dd, "bag": bag})

    assert out["dd"].default_factory is list and out["dd"] == {"a": [1]}
    assert out["dd"]["a"] is not dd["a"]
    assert type(out["bag"]) is Bag and out["bag"][0] is not bag[0]
    assert map_tensors(bag, lambda t: t + 1) is bag  # an unknown object: as it is


def test_devices_uses_the_one_walker() -> None:
    assert devices.map_tensors is map_tensors and devices.tensors_in is tensors_in


# -- the walker keeps the semantics of the recursive copies it replaced ------------------------
#
# The recursive functions as they were before `messages.walk` (copy_message and
# map_tensors from ports.py and devices.py, copy_state from state.py), for comparison.


def old_copy_message(value: Any, tensor_copy: Callable[[torch.Tensor], torch.Tensor] = (
        lambda t: t.detach().clone())) -> Any:
    vt = type(value)
    if vt in SCALARS:
        return value
    if isinstance(value, torch.Tensor):
        return tensor_copy(value)
    if vt is list:
        return [old_copy_message(v, tensor_copy) for v in value]
    if vt is dict:
        return {k: old_copy_message(v, tensor_copy) for k, v in value.items()}
    if isinstance(value, tuple):
        items = [old_copy_message(v, tensor_copy) for v in value]
        return vt(*items) if hasattr(vt, "_fields") else vt(items)
    if dataclasses.is_dataclass(value):
        clone = copy.copy(value)
        for f in dataclasses.fields(value):
            object.__setattr__(clone, f.name, old_copy_message(getattr(value, f.name),
                                                               tensor_copy))
        return clone
    if isinstance(value, dict):
        clone = copy.copy(value)
        for k, v in value.items():
            clone[k] = old_copy_message(v, tensor_copy)
        return clone
    return copy.deepcopy(value)


def old_map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    vt = type(value)
    if vt is list:
        return [old_map_tensors(v, fn) for v in value]
    if vt is dict:
        return {k: old_map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, tuple):
        items = [old_map_tensors(v, fn) for v in value]
        return vt(*items) if hasattr(vt, "_fields") else vt(items)
    if isinstance(value, dict):
        clone = copy.copy(value)
        for k, v in value.items():
            clone[k] = old_map_tensors(v, fn)
        return clone
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        clone = copy.copy(value)
        for f in dataclasses.fields(value):
            object.__setattr__(clone, f.name, old_map_tensors(getattr(value, f.name), fn))
        return clone
    return value


def old_copy_state(value: Any, where: str, keys: tuple[Any, ...] = ()) -> Any:
    def at() -> str:
        return where + "".join(f"[{k!r}]" for k in keys)

    vt = type(value)
    if vt in (type(None), bool, int, float, str, bytes):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if vt is list or vt is tuple:
        items = [old_copy_state(v, where, (*keys, i)) for i, v in enumerate(value)]
        return items if vt is list else tuple(items)
    if vt is dict:
        out = {}
        for k, v in value.items():
            if type(k) not in (str, int):
                raise TypeError(f"{at()}: key {k!r} is a {type(k).__name__}; "
                                "state keys must be str or int")
            out[k] = old_copy_state(v, where, (*keys, k))
        return out
    if isinstance(value, (list, tuple, dict)):
        return old_copy_state(vt.__base__(value) if vt.__base__ in (list, tuple, dict)
                              else dict(value), where, keys)
    raise TypeError(f"{at()}: a {vt.__name__} cannot be part of the state; use "
                    "tensors, numbers, str, bytes, None, and lists / tuples / dicts of these")


def same(a: Any, b: Any) -> bool:
    """Equal structure, types, values; shared scalars identical; tensors equal but own."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if type(a) in SCALARS:
        return a is b or a == b  # equal: each side may have made its own copy (deepcopy)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a) and (
            getattr(a, "default_factory", None) is getattr(b, "default_factory", None))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same, a, b))
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return a == b


def tensors() -> st.SearchStrategy[torch.Tensor]:
    return st.lists(st.floats(-1e3, 1e3), max_size=3).map(torch.tensor)


def keys() -> st.SearchStrategy[Any]:
    return st.one_of(st.text(max_size=3), st.integers(-3, 3))


def message_values() -> st.SearchStrategy[Any]:
    leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                       st.text(max_size=4), st.binary(max_size=4), st.complex_numbers(
                           allow_nan=False), tensors(), st.frozensets(st.integers(), max_size=2))

    def containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.one_of(
            st.lists(children, max_size=4),
            st.lists(children, max_size=4).map(tuple),
            st.lists(children, max_size=3).map(Pair),
            st.lists(children, max_size=3).map(Bag),
            st.dictionaries(keys(), children, max_size=4),
            st.dictionaries(keys(), children, max_size=3).map(collections.OrderedDict),
            st.builds(Pose, children, st.text(max_size=3)),
            st.builds(Sample, children, st.text(max_size=3)),
            st.builds(Frozen, children),
        )

    return st.recursive(leaves, containers, max_leaves=20)


def state_values() -> st.SearchStrategy[Any]:
    leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                       st.text(max_size=4), st.binary(max_size=4), tensors())
    wrong = st.one_of(st.complex_numbers(allow_nan=False), st.frozensets(st.integers(),
                                                                         max_size=1))

    def containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.one_of(
            st.lists(children, max_size=4),
            st.lists(children, max_size=4).map(tuple),
            st.lists(children, max_size=3).map(Bag),
            st.dictionaries(keys(), children, max_size=4),
            st.dictionaries(st.one_of(keys(), st.floats(0, 1)), children, max_size=2),
            st.dictionaries(keys(), children, max_size=3).map(collections.OrderedDict),
            st.builds(Pose, children, st.text(max_size=3)),
        )

    return st.recursive(st.one_of(leaves, leaves, leaves, wrong), containers, max_leaves=20)


def recorder() -> tuple[list[int], Callable[[torch.Tensor], torch.Tensor]]:
    seen: list[int] = []

    def fn(t: torch.Tensor) -> torch.Tensor:
        seen.append(id(t))
        return t.detach().clone() + 1

    return seen, fn


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(message_values())
def test_copy_message_and_map_tensors_give_what_the_recursive_versions_gave(msg: Any) -> None:
    seen, fn = recorder()
    old_seen, old_fn = recorder()

    assert same(copy_message(msg, fn), old_copy_message(msg, old_fn))
    assert seen == old_seen

    seen.clear()
    old_seen.clear()
    assert same(map_tensors(msg, fn), old_map_tensors(msg, old_fn))
    assert seen == old_seen == [id(t) for t in tensors_in(msg)]


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(state_values())
def test_copy_state_gives_or_refuses_what_the_recursive_version_did(state: Any) -> None:
    try:
        expected: Any = old_copy_state(state, "node 'n' state")
    except TypeError as exc:
        expected = exc

    if isinstance(expected, TypeError):
        with pytest.raises(TypeError) as info:
            copy_state(state, "node 'n' state")
        assert str(info.value) == str(expected)
    else:
        assert same(copy_state(state, "node 'n' state"), expected)


# -- the checks of tensor ports ---------------------------------------------------------------


@pytest.mark.parametrize("shape, dtype, good, bad", [
    ((3,), torch.float32, torch.zeros(3), [torch.zeros(4), torch.zeros(3, dtype=torch.float64),
                                          torch.zeros(3, 1), [0.0] * 3]),
    ((3,), None, torch.zeros(3, dtype=torch.int64), [torch.zeros(2), torch.zeros(1, 3)]),
    ((None, 4), torch.float32, torch.zeros(7, 4), [torch.zeros(7, 3), torch.zeros(4),
                                                  torch.zeros(7, 4, dtype=torch.float16)]),
    ((None, 4, None, 2), None, torch.zeros(1, 4, 5, 2), [torch.zeros(1, 4, 5, 3),
                                                         torch.zeros(1, 3, 5, 2)]),
    ((None,), None, torch.zeros(5), [torch.zeros(5, 1), torch.tensor(1.0)]),
    ((), torch.int64, torch.tensor(3), [torch.tensor([3]), torch.tensor(3.0)]),
    (None, torch.float64, torch.zeros(2, 2, dtype=torch.float64), [torch.zeros(2)]),
])
def test_a_tensor_port_checks_what_its_spec_constrains_with_the_same_errors(
        shape, dtype, good, bad) -> None:
    port = mujou.Output(torch.Tensor, shape=shape, dtype=dtype)
    port._bind(object(), "out")

    assert port.check(good) is good
    for value in bad:
        with pytest.raises(mujou.PortTypeError) as err:
            port.check(value)
        assert str(err.value) == (f"port 'object.out': expected {port._spec.describe()}, "
                                  f"got {describe_value(value)}")


def test_a_tensor_subclass_passes_a_tensor_port_through_the_full_check() -> None:
    class Mine(torch.Tensor):
        pass

    port = mujou.Output(torch.Tensor, shape=(None, 2), dtype=torch.float32)
    port._bind(object(), "out")
    good = torch.zeros(3, 2).as_subclass(Mine)

    assert port.check(good) is good
    with pytest.raises(mujou.PortTypeError, match="expected Tensor"):
        port.check(torch.zeros(3, 3).as_subclass(Mine))


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")  # make_dual's first call
def test_clone_tensor_gives_what_detach_then_clone_gave() -> None:
    # clone_tensor skips the detach of a tensor outside autograd: the same clone.
    from torch.autograd import forward_ad

    from mujou_actors.messages import clone_tensor

    with torch.inference_mode():
        inference = torch.arange(3.0)
    base = torch.arange(6.0)
    cases = [base, base[1:], base[:1].expand(4), base.reshape(2, 3).t(),
             torch.ones(2, dtype=torch.complex64).conj(), inference,
             torch.ones(2, requires_grad=True) * 2, torch.nn.Parameter(torch.ones(2), False)]
    for t in cases:
        for mode in (torch.no_grad(), torch.enable_grad(), torch.inference_mode()):
            with mode:
                got, old = clone_tensor(t), t.detach().clone()
            assert type(got) is type(old) and torch.equal(got.resolve_conj(), old.resolve_conj())
            assert (got.dtype, got.shape, got.stride()) == (old.dtype, old.shape, old.stride())
            assert (got.requires_grad, got.grad_fn, got.is_inference(), got.is_conj()) == (
                old.requires_grad, old.grad_fn, old.is_inference(), old.is_conj())
            assert got.data_ptr() != t.data_ptr()
    with forward_ad.dual_level():  # a tangent is dropped, as detach dropped it
        dual = forward_ad.make_dual(torch.ones(2), torch.ones(2))
        assert forward_ad.unpack_dual(clone_tensor(dual)).tangent is None
