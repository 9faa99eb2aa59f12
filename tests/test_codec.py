"""The tree codec (codec.py): its interface to snapshot files, recordings and the data plane."""

from __future__ import annotations

import dataclasses
import gc
import struct
import time
import tracemalloc
import typing
from collections import OrderedDict
from typing import Any

import msgpack
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mujou_actors import codec
from tests.test_snapshot import assert_same, random_tensor, trees

# torch warns once that complex32 is experimental; it round-trips all the same.
pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")


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
    return filled(*codec.decode(structure, len(data)), data)


def filled(back: Any, made: list[torch.Tensor], data: bytes) -> Any:
    at = 0
    for t in made:
        codec.tensor_memory(t)[:] = data[at : at + t.nbytes]
        at += t.nbytes
    return back


def encode_v1(tree: Any) -> tuple[bytes, bytes]:
    """A tree in format 1, written here from its documentation (the codec writes only 2).

    A tuple is extension 2 holding the packed array of its items, a tensor extension 1
    holding the packed ``[dtype name, shape, offset, nbytes]``. Returns the structure and
    the tensor data.
    """
    data = bytearray()

    def packable(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {key: packable(value) for key, value in obj.items()}
        if isinstance(obj, list):
            return [packable(item) for item in obj]
        if isinstance(obj, tuple):
            return msgpack.ExtType(2, msgpack.packb([packable(item) for item in obj]))
        if isinstance(obj, torch.Tensor):
            raw = bytes(codec.raw_bytes(obj))
            meta = [str(obj.dtype).removeprefix("torch."), list(obj.shape), len(data), len(raw)]
            data.extend(raw)
            return msgpack.ExtType(1, msgpack.packb(meta))
        return obj

    return msgpack.packb(packable(tree)), bytes(data)


def v2_tensor(code: int, shape: tuple[int, ...], offset: int, nbytes: int,
              ndim: int | None = None) -> bytes:
    """A format-2 tensor entry made by hand from the documented layout."""
    ndim = len(shape) if ndim is None else ndim
    payload = struct.pack(f"<BB{len(shape)}qQQ", code, ndim, *shape, offset, nbytes)
    return msgpack.packb(msgpack.ExtType(1, payload))


MARK = b"\xc7\x00\x02"  # the tuple marker: extension 2, empty


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
    # A tuple is an array led by the marker (extension 2), a tensor extension 1.
    assert msgpack.unpackb(structure, ext_hook=lambda code, _: code) == {"a": 1, "b": [2, 1]}


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
    # The payload, little-endian: dtype code, ndim, the shape as int64s, offset, nbytes.
    assert ext.code == 1 and ext.data == struct.pack("<BBqqQQ", 10, 2, 2, 3, 0, 12)
    assert codec.DTYPE_CODES[10] == "bfloat16" and codec.DTYPE_CODES[11] == "float32"


def test_a_tree_nested_too_deep_is_refused_by_both_sides_naming_the_limit() -> None:
    assert codec.MAX_DEPTH == 100
    codec.encode(nested(codec.MAX_DEPTH))

    with pytest.raises(ValueError, match=r"nested deeper than 100 levels"):
        codec.encode(nested(codec.MAX_DEPTH + 1))
    structure = b"\x91" * (codec.MAX_DEPTH + 1) + b"\x01"
    with pytest.raises(ValueError, match=r"^containers nested deeper than 100 levels"):
        codec.decode(structure, 0)
    with pytest.raises(ValueError, match=r"nested deeper than 100 levels \(at offset 100\)"):
        codec.decode(structure, 0, version=1)
    assert codec.decode(structure[1:], 0)[0] == nested(codec.MAX_DEPTH)


def test_a_format_1_structure_over_its_memory_budget_is_refused_naming_the_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "MEMORY_SLACK", 0)
    structure = b"\xdd" + struct.pack(">I", 100) + b"\x80" * 100  # 100 empty dicts
    budget = codec.memory_budget(len(structure))

    assert budget == 32 * 105
    with pytest.raises(ValueError, match=rf"would take more than {budget} bytes of memory"):
        codec.decode(structure, 0, version=1)
    # Format 2 counts nothing: its bound holds by construction, so nothing is refused.
    assert codec.decode(structure, 0) == ([{}] * 100, [])
    assert codec.decode(codec.encode([{}] * 100)[0], 0)[0] == [{}] * 100


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


# -- format 2: round trips -------------------------------------------------------------------


def test_every_kind_of_value_round_trips_in_format_2() -> None:
    tree = {"none": None, "bools": [True, False], "ints": [0, -1, -32, -33, 255, 2**63 - 1,
            -(2**63), 2**64 - 1], "floats": [0.0, -0.0, 1e300, float("inf")], "str": "ünï",
            "empty": ["", b"", [], {}, ()], "bytes": b"\x00\xff", 7: {-3: "int keys"},
            "tuples": ((), (1,), ((2, (3,)), [4, ()]), {"in": (5, "x")}),
            "tensors": (torch.tensor(2.5), torch.empty(0, 3), torch.arange(4).reshape(2, 2))}

    back = round_trip(tree)

    assert_same(back, tree)
    assert back["tuples"][2][0][1] == (3,) and type(back["tuples"][2][1][1]) is tuple


@pytest.mark.parametrize("name", sorted(codec.DTYPES))
def test_every_dtype_round_trips_in_format_2_with_its_code(name: str) -> None:
    dtype = codec.DTYPES[name]
    tree = [random_tensor(dtype, (3, 5)), random_tensor(dtype, ()), random_tensor(dtype, (0, 4))]

    structure, _ = codec.encode(tree[1])

    assert_same(round_trip(tree), tree)
    assert structure[3] == codec.DTYPE_CODES.index(name)  # c7 12 01, then the code


def test_a_tensor_of_255_dimensions_round_trips_and_one_of_256_is_refused() -> None:
    t = torch.arange(2.0).reshape(*([1] * 254), 2)

    assert_same(round_trip([t]), [t])
    with pytest.raises(TypeError, match=r"^x: a tensor of 256 dimensions .* \(at most 255\)"):
        codec.encode({"x": torch.zeros(*([1] * 256))})


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(trees)
def test_any_tree_round_trips_in_format_2_and_in_format_1(tree: Any) -> None:
    assert_same(round_trip(tree), tree)
    structure, data = encode_v1(tree)

    assert_same(filled(*codec.decode(structure, len(data), version=1), data), tree)


def test_a_batch_packs_to_the_bytes_encode_makes() -> None:
    messages = [1, "a", torch.ones(2), (1, torch.zeros(1)), [2.5], {"k": (), 3: b"x"},
                {"deep": [(1,)]}, Pose(1.0, torch.ones(3)), Reading(2.0, b"r")]
    tensors: list[tuple[torch.Tensor, int]] = []

    body = codec.encode_batch(messages, list(range(9)), [object] * 7 + [Pose, Reading], tensors)

    assert body == codec.encode(messages)[0]
    back, made = codec.decode_batch(body, 0, 9, sum(n for _, n in tensors))
    assert back[3] == (1, made[1]) and back[5] == {"k": (), 3: b"x"} and back[6] == {"deep": [(1,)]}


def test_a_format_1_structure_decodes_as_before() -> None:
    tree = {"w": torch.arange(6, dtype=torch.int16).reshape(2, 3), "t": (1, ("a", ()), [()])}
    structure, data = encode_v1(tree)

    assert_same(filled(*codec.decode(structure, len(data), version=1), data), tree)
    with pytest.raises(ValueError, match=r"^no codec format 3 \(formats 1 to 2\)$"):
        codec.decode(structure, len(data), version=3)
    # Format 2 reads the same bytes as something else (a tuple is no extension there).
    with pytest.raises(ValueError, match="a tensor's payload of 12 bytes is not dtype code"):
        codec.decode(structure, len(data))


# -- format 2: what it refuses -----------------------------------------------------------------


def depth_of(tree: Any) -> int:
    """How many containers nest in ``tree`` (each level holds one: the first that does)."""
    depth = 0
    while isinstance(tree, (list, tuple, dict)):
        depth += 1
        items = list(tree.values()) if isinstance(tree, dict) else list(tree)
        tree = items[0] if items else None
    return depth


def deep_v2(levels: int, head: bytes) -> bytes:
    return head * levels + b"\x01"


def test_msgpack_s_own_stack_checks_the_depth_here() -> None:
    # The C decoder's stack of 1024 open containers, probed at import: what makes the
    # completeness pass check the depth too (another msgpack falls back to a walk).
    assert codec._stack_limit_is(1024) and not codec._stack_limit_is(1000)
    assert codec._DEPTH_PREFIX == b"\x91" * 924


@pytest.mark.parametrize("depth_by", ["stack", "walk"])
@pytest.mark.parametrize("head", [b"\x91", b"\x81\x00", b"\x92" + MARK], ids=["list", "dict",
                                                                              "tuple"])
def test_format_2_refuses_nesting_past_max_depth_for_each_container(
        head: bytes, depth_by: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if depth_by == "walk":
        monkeypatch.setattr(codec, "_DEPTH_PREFIX", None)
    for empty in (b"\x90", b"\x80", b"\x91" + MARK):  # an empty container at level 101 too
        assert depth_of(codec.decode(head * 99 + empty, 0)[0]) == 100
        with pytest.raises(ValueError, match=r"^containers nested deeper than 100 levels"):
            codec.decode(head * 100 + empty, 0)
    assert depth_of(codec.decode(deep_v2(100, head), 0)[0]) == 100

    with pytest.raises(ValueError, match=r"^containers nested deeper than 100 levels"):
        codec.decode(deep_v2(101, head), 0)
    with pytest.raises(ValueError, match=r"^containers nested deeper than 100 levels, the most"):
        codec.decode(deep_v2(5000, head), 0)  # past msgpack's own stack too


def test_format_2_refuses_depth_even_with_few_bytes_per_level_behind_wide_containers() -> None:
    # Many containers (the walk runs) but the deep one is the last of a wide list.
    wide = b"\xdc" + struct.pack(">H", 200) + b"\x90" * 199 + deep_v2(100, b"\x91")

    with pytest.raises(ValueError, match="nested deeper than 100 levels"):
        codec.decode(wide, 0)


@pytest.mark.parametrize("structure, reason", [
    (b"\x82\xa1a\x01\xa1a\x02", "a dict holds the key 'a' twice"),
    (b"\x82\x01\x01\x01\x02", "a dict holds the key 1 twice"),
    (b"\x81\xc0\x01", "a dict key is a NoneType; keys must be str or int"),
    (b"\x81\xc3\x01", "a dict key is a bool; keys must be str or int"),
    (b"\x82\x01\x01\xc3\x02", "a dict key is a bool"),  # True == 1: still its type
    (b"\x81\xcb" + struct.pack(">d", 1.0) + b"\x01", "a dict key is a float"),
    (b"\x81\xc4\x01a\x01", "a dict key is a bytes"),
    (b"\x81\x91\x01\x01", "a dict key is a list"),
    (b"\x81\x80\x01", "a dict key is a dict"),
    (b"\x81\x91" + MARK + b"\x01", "a dict key is a tuple"),
    (b"\x81" + MARK + b"\x01", "a dict key is a tuple marker"),
    (b"\x81\xd6\xff\0\0\0\0\x01", "a dict key is a msgpack timestamp"),
    (msgpack.packb(msgpack.ExtType(7, b"")), "unknown extension type 7"),
    (b"\x91\xd4\xfex", "unknown extension type -2"),
    (b"\xd6\xff\0\0\0\0", "a msgpack timestamp (unknown extension type -1)"),
    (b"\x92\x01\xd7\xff" + bytes(8), "a msgpack timestamp"),
    (b"\x91\xc7\x0c\xff" + bytes(12), "a msgpack timestamp"),
    (b"\x81\xa1a\xd6\xff" + bytes(4), "a msgpack timestamp"),
    (b"\x92" + MARK + b"\xd6\xff" + bytes(4), "a msgpack timestamp"),
    (b"\x92\x91\x91\xc8\x00\x04\xff" + bytes(4) + b"\x01", "a msgpack timestamp"),
    (b"\xc7\x01\x02\x00", "a tuple marker (extension type 2) with a payload of 1 bytes"),
    (MARK, "tuple marker (extension type 2) that does not lead an array"),
    (b"\x92\x01" + MARK, "does not lead an array"),
    (b"\x93" + MARK + b"\x01" + MARK, "does not lead an array"),
    (b"\x81\xa1a" + MARK, "does not lead an array"),
    (b"\xa2\xff\xfe", "a str is not valid UTF-8"),
    (b"", "the structure does not decode (0 bytes)"),
    (b"\x92\x01", "the structure does not decode (2 bytes)"),
    (b"\x01\x02", "1 bytes after the tree, from offset 1"),
    (b"\xc1", "the structure does not decode"),
    (msgpack.packb(list(range(100))) + b"\xc0", "1 bytes after the tree, from offset 103"),
    (msgpack.packb(list(range(100)))[:-1], "the structure ends inside a value (it is 102 bytes)"),
    (b"\xdc\x00\x64" + b"\xc1" * 100, "a byte that starts no msgpack value"),
    (msgpack.packb([b"x" * 70, "\ud7ff"])[:-3] + b"\xa2\xed\xa0", "not valid UTF-8"),
])
@pytest.mark.parametrize("depth_by", ["stack", "walk"])
def test_format_2_refuses_what_the_format_does_not_hold_with_a_reason(
        structure: bytes, reason: str, depth_by: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if depth_by == "walk":  # as with a msgpack whose stack is not 1024 deep
        monkeypatch.setattr(codec, "_DEPTH_PREFIX", None)

    with pytest.raises(ValueError) as info:
        codec.decode(structure, 0)

    assert reason in str(info.value)


@pytest.mark.parametrize("entry, data_len, reason", [
    (v2_tensor(99, (1,), 0, 1), 1, "unknown tensor dtype code 99"),
    (v2_tensor(255, (), 0, 1), 1, "unknown tensor dtype code 255"),
    (v2_tensor(11, (-1,), 0, 4), 4, "bad tensor shape [-1]"),
    (v2_tensor(11, (2,), 4, 8), 12, "out of place (offset=4, nbytes=8)"),
    (v2_tensor(11, (2,), 0, 9), 9, "out of place"),
    (v2_tensor(11, (10**9,), 0, 4 * 10**9), 4, "out of place"),  # refused before allocating
    (v2_tensor(11, (0, 2**62, 2**62), 0, 0), 0, "bad tensor shape [0, 4611686018427387904"),
    (v2_tensor(11, (2,), 0, 8, ndim=3), 8, "payload of 26 bytes is not dtype code"),
    (msgpack.packb(msgpack.ExtType(1, b"\x0b")), 0, "payload of 1 bytes"),
    (v2_tensor(11, (2,), 0, 8), 12, "tensors of 8 bytes, not 12"),
    (v2_tensor(11, (2,), 0, 8) + v2_tensor(11, (1,), 0, 4), 12, "bytes after the tree"),
    (b"\x92" + v2_tensor(11, (2,), 0, 8) + v2_tensor(11, (1,), 0, 4), 12, "out of place "
     "(offset=0, nbytes=4)"),
])
def test_format_2_refuses_a_tensor_out_of_the_format_or_out_of_place(
        entry: bytes, data_len: int, reason: str) -> None:
    with pytest.raises(ValueError) as info:
        codec.decode(entry, data_len)

    assert reason in str(info.value)


def test_tensors_back_to_back_decode_in_data_order_on_the_meta_device() -> None:
    structure = b"\x93" + v2_tensor(11, (2,), 0, 8) + v2_tensor(1, (), 8, 1) + \
        v2_tensor(5, (0, 3), 9, 0)

    tree, made = codec.decode(structure, 9, device="meta")

    assert [(t.dtype, tuple(t.shape), t.device.type) for t in made] == \
        [(torch.float32, (2,), "meta"), (torch.uint8, (), "meta"), (torch.int64, (0, 3), "meta")]
    assert all(a is b for a, b in zip(tree, made, strict=True))


# -- format 2: memory --------------------------------------------------------------------------


def peak_of(run: Any) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        try:
            run()
        except ValueError:
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("header", [b"\xdd", b"\xdf"], ids=["arrays", "maps"])
def test_truncated_headers_claiming_huge_sizes_are_refused_quickly_allocating_nothing(
        header: bytes) -> None:
    # 100 nested headers each claiming 2**20 items, then the end: without the pass that
    # proves the structure complete, msgpack would make a list of 2**20 slots (8 MiB) at
    # each header before finding nothing there (800 MiB; 8 GiB for 1000 headers).
    for levels, reason in ((100, r"^the structure ends inside a value \(it is 500 bytes\)$"),
                           (1000, r"^containers nested deeper than 100 levels")):
        structure = (header + struct.pack(">I", 1 << 20)) * levels

        start = time.perf_counter()
        peak = peak_of(lambda: codec.decode(structure, 0))  # noqa: B023 - called at once

        assert time.perf_counter() - start < 2
        assert peak < 4 * len(structure) + (64 << 10), peak
        with pytest.raises(ValueError, match=reason):
            codec.decode(structure, 0)


def test_a_small_truncated_structure_allocates_little_without_the_pass() -> None:
    worst = b"\xdc\x00\x3f" * 21  # 63 bytes: under the pass's threshold, 21 claims of 63

    peak = peak_of(lambda: codec.decode(worst, 0))

    assert peak < 16 << 10, peak


def array_of(items: bytes, count: int) -> bytes:
    return b"\xdd" + struct.pack(">I", count) + items * count


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("shape, count", [
    (b"\x90", 100_000), (b"\x80", 100_000), (b"\x91\xc0", 100_000), (b"\xe0", 100_000),
    (b"\xa2ab", 100_000), (b"\x92" + MARK + b"\xc0", 100_000), (b"\x81\x00\xc0", 100_000),
    (b"\x81\x00\x90", 100_000), (b"\x81\x00" * 99 + b"\xc0", 2_000),
    (b"\x81\xa0" * 99 + b"\xc0", 2_000), (b"\x91" * 98 + b"\x90", 2_000),
    (b"\x81\x00" * 99 + b"\xff", 2_000), (v2_tensor(1, (0,), 0, 0), 20_000),
], ids=["empty lists", "empty dicts", "[nil]", "-32", "2-byte strs", "(nil,)", "{0: nil}",
        "{0: []}", "{0: {0: ...}}", "{'': {'': ...}}", "[[...]]", "{0: {0: ...}} screened",
        "empty tensors"])
def test_a_bomb_within_the_format_stays_within_v2_memory_per_byte(shape: bytes,
                                                                  count: int) -> None:
    structure = array_of(shape, count)
    kept: list[Any] = []

    peak = peak_of(lambda: kept.append(codec.decode(structure, 0)))

    assert kept and len(kept[0][0]) == count  # decoded, not refused
    assert peak <= codec.V2_MEMORY_PER_BYTE * len(structure), peak / len(structure)


@pytest.mark.slow
def test_v2_memory_per_byte_is_what_the_worst_shape_takes_with_room_to_spare() -> None:
    # A chain of one-entry dicts with 1-byte int keys: 224 bytes (dict and keys table)
    # per 2 bytes of structure, the worst the format allows; 128 is the bound.
    assert codec.V2_MEMORY_PER_BYTE == 128
    structure = array_of(b"\x81\x00" * 99 + b"\xc0", 2_000)
    kept: list[Any] = []

    peak = peak_of(lambda: kept.append(codec.decode(structure, 0)))

    assert 100 < peak / len(structure) < codec.V2_MEMORY_PER_BYTE


_FUZZ_BASES = [codec.encode(tree)[0] for tree in (
    {"a": (1, [torch.ones(2, 3)], {"k": b"x", 3: 2.5}), "b": "ü" * 3, "c": [(), {}, -1, 2**40]},
    [torch.zeros(4, dtype=torch.int64), (1, (2, (3,)))] * 5,
)]


@settings(max_examples=300, deadline=None)
@given(base=st.sampled_from(_FUZZ_BASES),
       edits=st.lists(st.tuples(st.sampled_from(["set", "delete", "insert"]),
                                st.integers(0, 10_000), st.integers(0, 255)), min_size=1,
                      max_size=4),
       data_len=st.sampled_from([0, 24, 56, 320]))
def test_damaged_format_2_structures_decode_or_raise_value_error_only(
        base: bytes, edits: list[tuple[str, int, int]], data_len: int) -> None:
    structure = bytearray(base)
    for op, at, byte in edits:
        at %= len(structure) + 1
        if op == "insert":
            structure.insert(at, byte)
        elif at < len(structure):
            if op == "set":
                structure[at] = byte
            else:
                del structure[at]

    try:
        tree, made = codec.decode(bytes(structure), data_len)
    except ValueError:
        return
    assert sum(t.nbytes for t in made) == data_len  # what decodes is whole
    assert codec.file_problem(tree, object) is None  # and holds only what a file holds
