"""The tree codec (codec.py): its interface to snapshot files, recordings and the data plane."""

from __future__ import annotations

import dataclasses
import struct
import typing
from collections import OrderedDict
from typing import Any

import msgpack
import pytest
import torch

from mujou_actors import codec
from tests.test_snapshot import assert_same


class Pose(typing.NamedTuple):
    x: float
    q: torch.Tensor


@dataclasses.dataclass
class Reading:
    value: float
    raw: bytes


def round_trip(tree: Any) -> Any:
    """encode, then decode with each tensor filled from its bytes, as a reader does."""
    structure, tensors = codec.encode(tree)
    data = b"".join(bytes(codec.raw_bytes(t)) for t, _ in tensors)
    back, made = codec.decode(structure, len(data))
    at = 0
    for t in made:
        codec.tensor_memory(t)[:] = data[at : at + t.nbytes]
        at += t.nbytes
    return back


def nested(levels: int) -> Any:
    tree: Any = 1
    for _ in range(levels):
        tree = [tree]
    return tree


def test_a_tree_with_tensors_and_tuples_comes_back_through_encode_and_decode() -> None:
    tree = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), 7: (1, "a", b"b"),
            "pair": (torch.tensor([True, False]), None), "x": [1.5, -2**63, 2**64 - 1]}

    back = round_trip(tree)

    assert_same(back, tree)
    assert type(back["pair"]) is tuple


def test_encode_lists_each_tensor_with_its_size_in_data_order() -> None:
    a, b = torch.ones(3, dtype=torch.int16), torch.zeros(2, 2, dtype=torch.float64)

    structure, tensors = codec.encode({"a": a, "b": (b,)})

    assert [(t is x, n) for (t, n), x in zip(tensors, (a, b), strict=True)] == \
        [(True, 6), (True, 32)]
    assert msgpack.unpackb(structure, ext_hook=lambda code, _: code) == {"a": 1, "b": 2}


def test_decode_makes_the_tensors_empty_on_the_device_asked_for() -> None:
    structure, tensors = codec.encode([torch.ones(4), torch.ones(2, dtype=torch.uint8)])

    tree, made = codec.decode(structure, 18, device="meta")

    assert [(t.device.type, t.shape, t.dtype) for t in made] == \
        [("meta", (4,), torch.float32), ("meta", (2,), torch.uint8)]
    assert tree[0] is made[0] and tree[1] is made[1]


def test_tensor_ext_is_the_entry_encode_writes() -> None:
    t = torch.ones(2, 3, dtype=torch.bfloat16)

    ext, nbytes = codec.tensor_ext(t, "x", 0)

    assert nbytes == 12
    assert codec.encode(t)[0] == msgpack.packb(ext)
    assert codec.DTYPES["bfloat16"] is torch.bfloat16


def test_a_tree_nested_too_deep_is_refused_by_both_sides_naming_the_limit() -> None:
    assert codec.MAX_DEPTH == 100
    codec.encode(nested(codec.MAX_DEPTH))

    with pytest.raises(ValueError, match=r"nested deeper than 100 levels"):
        codec.encode(nested(codec.MAX_DEPTH + 1))
    structure = b"\x91" * (codec.MAX_DEPTH + 1) + b"\x01"
    with pytest.raises(ValueError, match=r"nested deeper than 100 levels \(at offset 100\)"):
        codec.decode(structure, 0)


def test_a_structure_over_its_memory_budget_is_refused_naming_the_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "MEMORY_SLACK", 0)
    structure = b"\xdd" + struct.pack(">I", 100) + b"\x80" * 100  # 100 empty dicts
    budget = codec.memory_budget(len(structure))

    assert budget == 32 * 105
    with pytest.raises(ValueError, match=rf"would take more than {budget} bytes of memory"):
        codec.decode(structure, 0)
    packed = len(msgpack.packb([{}] * 100))  # a shorter array header: 103 bytes
    with pytest.raises(ValueError, match=rf"more than {codec.memory_budget(packed)} bytes of "
                       "memory to load"):
        codec.encode([{}] * 100)


def test_decode_refuses_tensor_data_of_another_length() -> None:
    structure, _ = codec.encode(torch.ones(2))

    with pytest.raises(ValueError, match=r"^tensors of 8 bytes, not 9$"):
        codec.decode(structure, 9)


def test_a_batch_comes_back_with_its_tensors_in_data_order() -> None:
    messages = [1.5, torch.ones(2), Pose(2.0, torch.zeros(3)), {"k": (1, b"x")},
                Reading(1.0, b"r")]
    ports = [0, 0, 1, 0, 2]
    declared = [object, Pose, Reading]
    tensors: list[tuple[torch.Tensor, int]] = []

    body = codec.encode_batch(messages, ports, declared, tensors)
    back, made = codec.decode_batch(b"head" + body, 4, len(messages), 20)

    assert [n for _, n in tensors] == [8, 12] and [t.nbytes for t in made] == [8, 12]
    assert back[2] == (2.0, made[1]) and back[4] == {"value": 1.0, "raw": b"r"}
    assert codec.from_file(back[2], Pose) == Pose(2.0, made[1])
    assert codec.from_file(back[4], Reading) == Reading(1.0, b"r")


def test_a_batch_refuses_a_message_that_would_not_come_back_naming_item_and_port() -> None:
    with pytest.raises(TypeError, match=r"^item 1 \(port 3\): message: it is an OrderedDict"):
        codec.encode_batch([1, OrderedDict(a=1)], [0, 3], [object] * 4, [])
    with pytest.raises(ValueError, match=r"^item 0 \(port 0\): message\[0\].*deeper than 100"):
        codec.encode_batch([nested(codec.MAX_DEPTH + 1)], [0], [object], [])


def test_a_batch_of_another_count_does_not_decode() -> None:
    body = codec.encode_batch([1, 2], [0, 0], [object], [])

    with pytest.raises(ValueError, match=r"^the messages are not an array of 3 values$"):
        codec.decode_batch(body, 0, 3, 0)


def test_which_declared_types_come_back_as_themselves() -> None:
    assert [codec.type_problem(t) for t in (object, int, torch.Tensor, Pose, Reading)] == \
        [None] * 5
    assert codec.type_problem(OrderedDict) == ("an OrderedDict (a subclass of dict) would come "
                                               "back as a dict; declare dict")
    assert "does not encode a complex" in (codec.type_problem(complex) or "")
    assert [codec.is_record_type(t) for t in (Pose, Reading, tuple, dict)] == \
        [True, True, False, False]
