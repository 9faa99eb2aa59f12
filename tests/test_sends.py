"""The send path: a temporary handed over uncopied, everything else copied.

A send hands a value over without its copy only when nothing but the send
holds it (see `Output.send`). The tests tell the two apart by the message's
data pointer: a handed-over tensor is the sent one (``Sender.noted`` records
the pointer of the value it passes through, and leaves no reference behind),
a copy is not. Either way the readers get the same values.
"""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch.autograd import forward_ad

import mujou_actors as mujou
from mujou_actors import messages
from mujou_actors._runtime import sends
from tests import fake_cuda
from tests.conftest import Collector

X = torch.tensor([0.5, -1.0, 2.0])


class Sender(mujou.Node):
    """Sends what its ``make`` returns, made inside the hook, every period (three updates)."""

    out = mujou.Output(object)

    def __init__(self, make: Callable[[Sender], None]) -> None:
        super().__init__(period=0.01)
        self.make = make
        self.x = X.clone()
        self.ptrs: list[int] = []
        self.kept: list[Any] = []

    def noted(self, t: torch.Tensor) -> torch.Tensor:
        """``t``, its data pointer noted (the tensor itself is not kept)."""
        self.ptrs.append(t.data_ptr())
        return t

    def on_update(self, dt: float) -> None:
        self.make(self)


def _run(make: Callable[[Sender], None], readers: int = 1, trace: Any = None,
         start: Callable[..., mujou.Run] = mujou.run) -> tuple[Sender, list[Collector], Any]:
    sender = Sender(make)
    rx = [Collector() for _ in range(readers)]
    for r in rx:
        mujou.connect(sender.out, r.inp)
    with start([sender, *rx], timer="simulated", duration=0.03, trace=trace) as run:
        run.join()
        last = run.read(sender.out)
    return sender, rx, last


def _ptrs(messages_: list[Any]) -> list[int]:
    return [m.data_ptr() for m in messages_]


# -- temporaries are handed over -----------------------------------------------------


HANDED_OVER: dict[str, Callable[[Sender], None]] = {
    "tanh": lambda s: s.out.send(s.noted(torch.tanh(s.x))),
    "x + 1": lambda s: s.out.send(s.noted(s.x + 1)),
    "zeros": lambda s: s.out.send(s.noted(torch.zeros(3))),
    "no_grad": lambda s: _in(torch.no_grad(), lambda: s.out.send(s.noted(torch.tanh(s.x)))),
}


def _in(context: Any, fn: Callable[[], None]) -> None:
    with context:
        fn()


@pytest.mark.parametrize("make", list(HANDED_OVER.values()), ids=list(HANDED_OVER))
@pytest.mark.parametrize("readers, traced", [(1, False), (2, False), (2, True)],
                         ids=["one reader", "two readers", "traced"])
def test_a_temporary_is_handed_over_to_every_reader_uncopied(make, readers, traced,
                                                             tmp_path) -> None:
    sender, rx, last = _run(make, readers, tmp_path / "t.json" if traced else None)

    assert len(sender.ptrs) == 3
    for r in rx:
        assert _ptrs(r.received) == sender.ptrs  # the very tensors sent
        assert all(not m.requires_grad for m in r.received)
    assert [m is n for m, n in zip(rx[0].received, rx[-1].received, strict=True)] == [True] * 3
    assert last.data_ptr() != sender.ptrs[-1]  # the host still gets its own copy


def test_a_temporary_made_in_inference_mode_is_handed_over_as_the_clone_would_be() -> None:
    def make(s: Sender) -> None:
        with torch.inference_mode():
            s.out.send(s.noted(torch.tanh(s.x)))

    sender, (rx,), _ = _run(make)

    assert _ptrs(rx.received) == sender.ptrs
    assert all(m.is_inference() for m in rx.received)


def test_the_hooks_own_call_hands_a_temporary_over_without_a_clone(monkeypatch) -> None:
    clones: list[torch.Tensor] = []

    def counted(t: torch.Tensor) -> torch.Tensor:
        clones.append(t)
        return t.detach().clone()

    monkeypatch.setattr(sends, "clone_tensor", counted)
    monkeypatch.setattr(messages, "clone_tensor", counted)

    def make(s: Sender) -> None:
        s.out.send(torch.tanh(s.x))  # the plain call, nothing around it
        s.out.send(s.x * 2)
        kept = torch.tanh(s.x)
        s.out.send(kept)  # a local the hook keeps: copied

    _, (rx,), _ = _run(make)

    assert len(rx.received) == 9 and len(clones) == 3
    assert all(torch.equal(m, torch.tanh(X)) for m in rx.received[::3])


def test_a_temporary_container_hands_over_the_tensors_only_it_holds() -> None:
    def make(s: Sender) -> None:
        s.kept.append(torch.ones(2))
        s.out.send((s.noted(torch.tanh(s.x)), s.kept[-1], 1.5))
        s.out.send([s.noted(s.x + 1)])
        s.out.send({"obs": s.noted(s.x * 2), "held": s.kept[-1], "r": 0.0})

    sender, (rx,), _ = _run(make)
    got = rx.received

    assert [type(m) for m in got[:3]] == [tuple, list, dict]
    ptrs = iter(sender.ptrs)
    for tup, lst, dct in zip(got[::3], got[1::3], got[2::3], strict=True):
        assert tup[0].data_ptr() == next(ptrs) and tup[2] == 1.5
        assert lst[0].data_ptr() == next(ptrs)
        assert dct["obs"].data_ptr() == next(ptrs) and dct["r"] == 0.0
        for held in (tup[1], dct["held"]):  # the sender keeps it: a copy
            assert all(held.data_ptr() != k.data_ptr() for k in sender.kept)
            assert torch.equal(held, torch.ones(2))


# -- whatever the sender could still reach is copied ------------------------------------


def _keep(s: Sender, t: torch.Tensor) -> torch.Tensor:
    s.kept.append(t)
    return t


def _weakly(s: Sender, t: torch.Tensor) -> torch.Tensor:
    s.kept.append(weakref.ref(t))
    return t


def _storage(s: Sender, t: torch.Tensor) -> torch.Tensor:
    s.kept.append(t.untyped_storage())
    return t


def _view_of(s: Sender, t: torch.Tensor) -> torch.Tensor:
    s.kept.append(t[1:])
    return t


def _dlpack(s: Sender, t: torch.Tensor) -> torch.Tensor:
    s.kept.append(torch.utils.dlpack.to_dlpack(t))
    return t


def _dual(s: Sender) -> None:
    with forward_ad.dual_level():
        s.out.send(s.noted(forward_ad.make_dual(s.x, torch.ones(3)) * 1))


def _inference_tensor(x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return torch.tanh(x)


COPIED: dict[str, Callable[[Sender], None]] = {
    "a local": lambda s: (lambda y: s.out.send(s.noted(y)))(torch.tanh(s.x)),
    "kept in self": lambda s: s.out.send(s.noted(_keep(s, torch.tanh(s.x)))),
    "in a list": lambda s: s.out.send(s.noted(_keep(s, [torch.tanh(s.x)])[0])),
    "a weak reference": lambda s: s.out.send(s.noted(_weakly(s, torch.tanh(s.x)))),
    "its storage kept": lambda s: s.out.send(s.noted(_storage(s, torch.tanh(s.x)))),
    "a view of it kept": lambda s: s.out.send(s.noted(_view_of(s, torch.tanh(s.x)))),
    "a DLPack capsule": lambda s: s.out.send(s.noted(_dlpack(s, torch.tanh(s.x)))),
    "a view": lambda s: s.out.send(s.noted(s.x[1:])),
    "detach()": lambda s: s.out.send(s.noted(s.x.detach())),
    ".data": lambda s: s.out.send(s.noted(s.x.data)),
    "expand": lambda s: s.out.send(s.noted(s.x[:1].expand(3))),
    "from_numpy": lambda s: s.out.send(s.noted(torch.from_numpy(np.ones(3, np.float32)))),
    "frombuffer": lambda s: s.out.send(
        s.noted(torch.frombuffer(bytearray(12), dtype=torch.float32))),
    "shared memory": lambda s: s.out.send(s.noted(torch.zeros(3).share_memory_())),
    "requires_grad": lambda s: s.out.send(s.noted(torch.ones(3, requires_grad=True) * 2)),
    "a leaf that requires grad": lambda s: s.out.send(s.noted(torch.ones(3, requires_grad=True))),
    "a dual tensor": _dual,
    "an inference tensor outside inference mode":
        lambda s: s.out.send(s.noted(_inference_tensor(s.x))),
    "a subclass": lambda s: s.out.send(s.noted(torch.nn.Parameter(torch.ones(3), False))),
    "a Python attribute on it": lambda s: s.out.send(s.noted(_tagged(s, torch.tanh(s.x)))),
}


def _tagged(s: Sender, t: torch.Tensor) -> torch.Tensor:
    t.meta = s.kept  # type: ignore[attr-defined]  # one of the sender's mutable objects
    return t


@pytest.mark.slow
@pytest.mark.parametrize("make", list(COPIED.values()), ids=list(COPIED))
@pytest.mark.parametrize("readers", [1, 2])
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")  # make_dual's first call
def test_a_value_the_sender_can_still_reach_is_copied(make, readers) -> None:
    sender, rx, _ = _run(make, readers)

    assert len(sender.ptrs) == 3
    for r in rx:
        assert len(r.received) == 3
        assert all(type(m) is torch.Tensor for m in r.received)
        assert not set(_ptrs(r.received)) & set(sender.ptrs)
        assert all(not m.requires_grad and not m.is_inference() for m in r.received)
        assert all(forward_ad.unpack_dual(m).tangent is None for m in r.received)


def test_the_copy_keeps_the_sender_free_to_change_what_it_keeps() -> None:
    def make(s: Sender) -> None:
        s.out.send(_keep(s, torch.tanh(s.x)))
        s.kept[-1].add_(10)
        a = np.arange(3, dtype=np.float32)
        s.out.send(torch.from_numpy(a))
        a += 10
        s.out.send(s.x[1:])
        s.x.add_(1)

    sender, (rx,), _ = _run(make)

    x = X.clone()
    for tanh, arange, view in zip(*[iter(rx.received)] * 3, strict=True):
        assert torch.equal(tanh, torch.tanh(x))
        assert torch.equal(arange, torch.arange(3.0))
        assert torch.equal(view, x[1:])
        x += 1


def test_a_container_the_sender_keeps_or_a_nested_one_is_copied_whole() -> None:
    def make(s: Sender) -> None:
        s.kept.append((s.noted(torch.tanh(s.x)),))
        s.out.send(s.kept[-1])
        s.out.send({"a": [s.noted(torch.tanh(s.x))]})

    sender, (rx,), _ = _run(make)

    got = [rx.received[0][0], rx.received[1]["a"][0]]
    assert not set(_ptrs(got)) & set(sender.ptrs)


def test_a_net_with_cuda_nodes_keeps_the_copy_of_its_cpu_senders() -> None:
    _, _, start = fake_cuda.fakes()
    gpu = Collector()
    gpu._mujou_device = torch.device("cuda", 0)

    def make(s: Sender) -> None:
        s.out.send(s.noted(torch.tanh(s.x)))

    sender = Sender(make)
    cpu = Collector()
    mujou.connect(sender.out, cpu.inp)
    with start([sender, cpu, gpu], timer="simulated", duration=0.03) as run:
        run.join()

    assert len(cpu.received) == 3
    assert not set(_ptrs(cpu.received)) & set(sender.ptrs)


def test_handed_over_and_copied_messages_carry_the_same_values(tmp_path) -> None:
    def temporaries(s: Sender) -> None:
        s.out.send(torch.tanh(s.x) * 3)

    def kept(s: Sender) -> None:
        y = torch.tanh(s.x) * 3
        s.out.send(y)

    got = [_run(make)[1][0].received for make in (temporaries, kept)]

    assert [m.tolist() for m in got[0]] == [m.tolist() for m in got[1]]
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(*got, strict=True))


# -- the calibration ------------------------------------------------------------------


def test_the_calibrated_counts_tell_a_temporary_from_a_kept_value() -> None:
    if sys.implementation.name == "cpython":
        assert sends.TEMPORARY >= 1
    assert messages._STORAGE_REFS > 0 and messages._STORAGE_USES > 0
    assert messages._ONCE_IN_LIST > 0 and messages._ONCE_IN_DICT > 0

    class Port:
        pass

    seen: list[int] = []
    port = Port()
    port.send = lambda value: seen.append(sys.getrefcount(value))  # type: ignore[attr-defined]
    kept = torch.zeros(1)
    port.send(torch.zeros(1))  # type: ignore[attr-defined]
    port.send(kept)  # type: ignore[attr-defined]
    assert seen[0] < seen[1]


def test_sole_tensor_refuses_what_others_hold() -> None:
    def fresh() -> torch.Tensor:
        return torch.tanh(X)

    assert messages.sole_tensor(fresh())
    t = fresh()
    view = t[1:]
    assert not messages.sole_tensor(t) and not messages.sole_tensor(view)
    del view
    gc.collect()
    assert messages.sole_tensor(t)
    w = weakref.ref(t)
    assert not messages.sole_tensor(t)
    del w
    storage = t.untyped_storage()
    assert not messages.sole_tensor(t)
    del storage
    assert messages.sole_tensor(t)
    assert not messages.sole_tensor(X.to_sparse())  # no storage of its own


def test_take_message_rebuilds_flat_containers_and_copies_the_rest() -> None:
    t = torch.ones(2)
    out = messages.take_message([t, torch.zeros(2)])
    assert type(out) is list and out[0].data_ptr() != t.data_ptr()
    assert messages.take_message((1, "a")) == (1, "a")
    nested = {"a": [torch.ones(1)]}
    assert messages.take_message(nested)["a"][0] is not nested["a"][0]


def test_an_attribute_set_on_a_temporary_never_reaches_the_reader() -> None:
    # The copy has no attributes, so the message is the same whether or not the
    # sender kept a name for the tensor, and the sender's object is not shared.
    sender, rx, _ = _run(lambda s: s.out.send(_tagged(s, torch.tanh(s.x))))

    assert [hasattr(m, "meta") for m in rx[0].received] == [False] * 3
    assert all(torch.equal(m, torch.tanh(X)) for m in rx[0].received)


@pytest.mark.parametrize("make", [
    lambda s: s.out.send({s.x: 1.0}),  # a flat dict
    lambda s: s.out.send({"a": {s.x: 1.0}}),  # nested
    lambda s: s.out.send({torch.tanh(s.x): torch.zeros(1)}),  # a temporary, handed over else
], ids=["flat", "nested", "temporary"])
def test_a_tensor_as_a_dict_key_is_refused_naming_the_output(make) -> None:
    sender = Sender(make)
    reader = Collector()
    mujou.connect(sender.out, reader.inp)
    run = mujou.run([sender, reader], timer="simulated", duration=0.03)
    with pytest.raises(mujou.NodeError) as info:
        run.join(timeout=10)
    cause = info.value.__cause__
    assert isinstance(cause, TypeError)
    assert "output '0.out' sent a value that cannot be copied" in str(cause)
    assert "a message's dict keys cannot be tensors" in str(cause)
    assert reader.received == []  # nothing was delivered


def test_copy_message_refuses_a_tensor_key_with_its_path() -> None:
    from mujou_actors.messages import copy_message, take_message

    with pytest.raises(TypeError, match=r"port 'p'\['a'\]: key is a Tensor"):
        copy_message({"a": {torch.zeros(1): 1}}, where="port 'p'")
    with pytest.raises(TypeError, match="dict keys cannot be tensors"):
        copy_message({torch.zeros(1): 1})
    with pytest.raises(TypeError, match="dict keys cannot be tensors"):
        take_message({torch.zeros(1): torch.zeros(1)})
    assert copy_message({(1, 2): torch.ones(1)})[(1, 2)].item() == 1.0  # other keys stay
