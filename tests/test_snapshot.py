"""Snapshot files: exact round trips, atomic writes, clear errors, no code execution."""

from __future__ import annotations

import dataclasses
import enum
import errno
import gc
import io
import math
import pathlib
import pickle
import re
import struct
import subprocess
import sys
import threading
import tracemalloc
import weakref
import zlib
from collections import OrderedDict
from typing import Any

import msgpack
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mujou_actors import SnapshotError, codec, errors, snapshot
from mujou_actors.snapshot import dumps, inspect_file, load, loads, save

# torch warns once that complex32 is experimental; it round-trips all the same.
pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")

# -- helpers ------------------------------------------------------------------------------


def assert_same(got: Any, want: Any, path: str = "") -> None:
    """Exact equality: types (tuple vs list), dict key order and types, tensor bits."""
    if isinstance(want, torch.Tensor):
        assert type(got) is torch.Tensor, path
        assert (got.dtype, got.shape, got.device.type) == (want.dtype, want.shape, "cpu"), path
        assert bits(got) == bits(want), path
    elif isinstance(want, dict):
        assert type(got) is dict and list(got) == list(want), path
        for key in want:
            assert type(key) is type(next(k for k in got if k == key)), path
            assert_same(got[key], want[key], f"{path}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        assert type(got) is float and struct.pack("<d", got) == struct.pack("<d", want), path
    else:
        assert type(got) is type(want) and got == want, path


def bits(t: torch.Tensor) -> bytes:
    fresh = torch.empty(t.shape, dtype=t.dtype).copy_(t.detach())  # canonical strides
    return fresh.reshape(-1).view(torch.uint8).numpy().tobytes()


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Random bits of the dtype (valid 0/1 for bool), so NaN patterns are covered too."""
    n = math.prod(shape) * dtype.itemsize
    generator = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=generator)
    if dtype == torch.bool:
        raw &= 1
    return raw.view(dtype).reshape(shape)


def forge(structure: bytes, data: bytes = b"", version: int = 1) -> bytes:
    """A file built by hand from the layout the module docstring documents, valid CRCs included."""
    head = b"MUJOUSNP" + struct.pack("<IQQ", version, len(structure), len(data))
    head += struct.pack("<I", zlib.crc32(head))
    body = head + structure + data
    return body + struct.pack("<I", zlib.crc32(body))


def example_tree() -> dict:
    return {
        "format": 1,
        "time_ns": 123,
        "seeds": {"": 5, "ctrl": 7},
        "nodes": {"ctrl": {"generator": torch.Generator().manual_seed(3).get_state(),
                           "w": torch.randn(3, 4)}},
        "inputs": {"ctrl.obs": [torch.arange(5.0), 1.5]},
    }


@pytest.fixture
def saved(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "state.snap"
    save({"a": torch.arange(100, dtype=torch.float32), "b": [1, (2, "x")]}, path)
    return path


@pytest.fixture(params=["inline", "threaded"])
def streaming(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test as is, then with 64-byte chunks: every test tree then streams its tensor
    bytes through the helper thread, as big snapshots do."""
    if request.param == "threaded":
        monkeypatch.setattr(snapshot, "_CHUNK", 64)
    return request.param


def error_of(path: pathlib.Path) -> str:
    with pytest.raises(SnapshotError) as info:
        load(path)
    assert str(path) in str(info.value)
    return str(info.value)


# -- round trips --------------------------------------------------------------------------


def test_the_example_state_tree_round_trips_exactly(tmp_path: pathlib.Path, streaming: str) -> None:
    tree = example_tree()

    save(tree, tmp_path / "s.snap")

    assert_same(load(tmp_path / "s.snap"), tree)


def test_plain_values_round_trip_exactly_with_tuples_int_keys_and_bytes() -> None:
    tree = {
        "none": None, "bools": [True, False], "ints": [0, -1, 2**63 - 1, -(2**63), 2**64 - 1],
        "floats": [0.0, -0.0, 1e-310, math.inf, -math.inf, math.nan, 1 / 3],
        "str": "héllo\x00✓", "bytes": b"\x00\xff", "empty": [[], (), {}, "", b""],
        "tuple": (1, (2, [3, (4,)]), {"k": (None,)}),
        "int_keys": {0: "a", -5: "b", 2**64 - 1: "c", "mixed": {1: {2: ()}}},
        "deep": [[[[{"x": [(torch.ones(2),)]}]]]],
    }

    assert_same(loads(dumps(tree)), tree)


def test_subclasses_load_as_their_base_type() -> None:
    class Mode(enum.IntEnum):
        FAST = 2

    tree = OrderedDict(b=bytearray(b"xy"), t=torch.nn.Parameter(torch.ones(2)),
                       e={Mode.FAST: Mode.FAST})

    out = loads(dumps(tree))

    assert type(out) is dict and list(out) == ["b", "t", "e"]
    assert out["b"] == b"xy"
    assert out["e"] == {2: 2} and type(next(iter(out["e"]))) is int
    assert type(out["t"]) is torch.Tensor and not out["t"].requires_grad


def test_save_and_dumps_write_the_same_bytes(tmp_path: pathlib.Path, streaming: str) -> None:
    tree = example_tree()

    save(tree, str(tmp_path / "s.snap"))  # a str path works as well as a Path

    assert (tmp_path / "s.snap").read_bytes() == dumps(tree)


def test_streaming_through_the_helper_thread_gives_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tree = example_tree()
    inline = dumps(tree)
    monkeypatch.setattr(snapshot, "_CHUNK", 64)
    threads: set[str] = set()
    real_stream = snapshot._stream

    def spy(io: Any, chunks: Any, crc: int, total: int) -> int:
        def recording_io(chunk: memoryview) -> Any:
            threads.add(threading.current_thread().name)
            return io(chunk)
        return real_stream(recording_io, chunks, crc, total)

    monkeypatch.setattr(snapshot, "_stream", spy)
    threaded = dumps(tree)

    assert threaded == inline
    assert_same(loads(threaded), tree)
    assert {name.split("_")[0] for name in threads} == {"mujou-snapshot-io"}


def test_the_bytes_follow_the_documented_layout() -> None:
    tree = {"t": torch.tensor([1, 2], dtype=torch.int16), "u": (1,)}
    structure = msgpack.packb({  # int16 is code 3: dtype, ndim, shape, offset, nbytes
        "t": msgpack.ExtType(1, struct.pack("<BBqQQ", 3, 1, 2, 0, 4)),
        "u": [msgpack.ExtType(2, b""), 1],
    })

    assert dumps(tree) == forge(structure, b"\x01\x00\x02\x00", version=2)


def test_a_version_1_file_still_loads_as_its_own_layout_says() -> None:
    structure = msgpack.packb({
        "t": msgpack.ExtType(1, msgpack.packb(["int16", [2], 0, 4])),
        "u": msgpack.ExtType(2, msgpack.packb([1, ()])),
    })
    data = forge(structure, b"\x01\x00\x02\x00", version=1)

    tree = loads(data)

    assert_same(tree, {"t": torch.tensor([1, 2], dtype=torch.int16), "u": (1, [])})
    assert_same(loads(dumps(tree)), tree)  # written back as version 2


def test_the_dtypes_the_brief_lists_are_all_supported() -> None:
    names = ["float16", "float32", "float64", "bfloat16", "complex64", "complex128", "bool",
             "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
             "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"]

    missing = [n for n in names if hasattr(torch, n) and n not in codec.DTYPES]

    assert missing == []


@pytest.mark.parametrize("name", sorted(codec.DTYPES))
def test_every_dtype_round_trips_bit_for_bit(name: str) -> None:
    dtype = codec.DTYPES[name]
    tree = {"t": random_tensor(dtype, (3, 5)), "s": random_tensor(dtype, ()),
            "e": random_tensor(dtype, (0, 4))}

    assert_same(loads(dumps(tree)), tree)


@pytest.mark.parametrize("view", ["every_other", "transposed", "offset", "expanded", "conj",
                                  "zero_dim", "empty", "empty_strided", "requires_grad"])
def test_unusual_tensors_round_trip_as_their_values(view: str) -> None:
    base = torch.randn(4, 6, dtype=torch.complex64)
    tensor = {
        "every_other": base[:, ::2], "transposed": base.T, "offset": base[1:, 2:],
        "expanded": torch.randn(3, 1).expand(3, 5), "conj": base.conj(),
        "zero_dim": torch.tensor(2.5), "empty": torch.empty(0),
        "empty_strided": base[:, 3:3], "requires_grad": torch.randn(3, requires_grad=True),
    }[view]

    out = loads(dumps([tensor]))[0]

    assert out.is_contiguous()
    assert out.shape == tensor.shape and out.dtype == tensor.dtype
    assert torch.equal(out, tensor.detach())


def test_loaded_tensors_are_contiguous_writable_and_share_no_memory(tmp_path: pathlib.Path) -> None:
    a = torch.arange(6.0)
    save({"x": a, "y": a, "v": a[1:3]}, tmp_path / "s.snap")  # aliasing is not kept

    out = load(tmp_path / "s.snap")
    out["x"] += 100

    ptrs = {t.untyped_storage().data_ptr() for t in out.values()}
    assert len(ptrs) == 3 and a.untyped_storage().data_ptr() not in ptrs
    assert all(t.is_contiguous() and t.untyped_storage().nbytes() == t.nbytes
               for t in out.values())
    assert torch.equal(out["y"], torch.arange(6.0)) and torch.equal(a, torch.arange(6.0))


def test_tensors_from_loads_do_not_view_the_input_bytes() -> None:
    data = bytearray(dumps({"t": torch.zeros(4)}))

    out = loads(data)
    data[:] = bytes(len(data))

    assert torch.equal(out["t"], torch.zeros(4))


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = codec.DTYPES[draw(st.sampled_from(sorted(codec.DTYPES)))]
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    layout = draw(st.sampled_from(["contiguous", "every_other", "transposed"]))
    seed = draw(st.integers(0, 2**31))
    if layout == "every_other":  # strided, with a storage offset
        return random_tensor(dtype, (*shape, 2), seed)[..., 1]
    if layout == "transposed":
        return random_tensor(dtype, shape[::-1], seed).permute(tuple(reversed(range(len(shape)))))
    return random_tensor(dtype, shape, seed)


int64_or_uint64 = st.integers(-(2**63), 2**64 - 1)
leaves = (st.none() | st.booleans() | int64_or_uint64 | st.floats() | st.text(max_size=8)
          | st.binary(max_size=8) | tensors())
trees = st.recursive(
    leaves,
    lambda kids: (st.lists(kids, max_size=4) | st.lists(kids, max_size=4).map(tuple)
                  | st.dictionaries(st.text(max_size=4) | int64_or_uint64, kids, max_size=4)),
    max_leaves=16,
)


@settings(max_examples=150, deadline=None)
@given(trees)
def test_any_tree_round_trips_exactly(tree: Any) -> None:
    out = loads(dumps(tree))

    assert_same(out, tree)


@pytest.mark.parametrize("how", ["save", "dumps", "refused"])
def test_saving_keeps_no_reference_to_the_tree_s_tensors_once_it_returns(
        tmp_path: pathlib.Path, how: str) -> None:
    # A supervisor saves a fresh copy of the state at every snapshot: were the
    # tensors kept until the cyclic garbage collector happens to run (the
    # encoder's recursive closure was a reference cycle holding them), 16 MiB
    # of state snapshotted every 10 ms would take GBs.
    tensor = torch.zeros(8)
    alive = weakref.ref(tensor)
    tree = {"t": tensor, "bad": object()} if how == "refused" else {"t": tensor, "n": (1, [2])}
    gc.disable()
    try:
        if how == "save":
            save(tree, tmp_path / "s.snap")
        elif how == "dumps":
            dumps(tree)
        else:
            with pytest.raises(TypeError, match="bad"):
                dumps(tree)
        del tree, tensor
        assert alive() is None
    finally:
        gc.enable()


# -- atomic writes ------------------------------------------------------------------------


@pytest.mark.parametrize("failure", [OSError("disk full"), KeyboardInterrupt()])
def test_a_save_that_fails_midway_leaves_the_previous_file_and_no_temp_file(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException,
    streaming: str,
) -> None:
    path = tmp_path / "state.snap"
    save({"old": torch.ones(3)}, path)
    before = path.read_bytes()
    real = snapshot.raw_bytes
    temps: list[tuple[str, int]] = []  # (name, size) of the temp files when the failure hits

    def fail_on_second_tensor(t: torch.Tensor) -> memoryview:
        if t.numel() == 3:
            temps.extend((p.name, p.stat().st_size) for p in tmp_path.iterdir() if p != path)
            raise failure
        return real(t)

    monkeypatch.setattr(snapshot, "raw_bytes", fail_on_second_tensor)
    with pytest.raises(type(failure)):
        save({"big": torch.ones(1 << 18), "next": torch.ones(3)}, path)

    [(name, size)] = temps
    assert name.startswith(".state.snap.") and name.endswith(".tmp")
    assert size > 1 << 19  # the first tensor (1 MiB) was mostly written already
    assert list(tmp_path.iterdir()) == [path]
    assert path.read_bytes() == before
    assert_same(load(path), {"old": torch.ones(3)})


def test_save_replaces_an_existing_file(saved: pathlib.Path) -> None:
    save({"new": (1, 2)}, saved)

    assert load(saved) == {"new": (1, 2)}
    assert list(saved.parent.iterdir()) == [saved]


class Foo:
    pass


@pytest.mark.parametrize("tree, message", [
    ({"nodes": {"ctrl": {"model": Foo()}}}, "nodes['ctrl']['model']: unsupported type Foo"),
    (Foo(), "<root>: unsupported type Foo"),
    ({"w": torch.ones(9), "a": [1, (2, {"s": {1, 2}})]}, "a[1][1]['s']: unsupported type set"),
    ({"a": {1.5: 1}}, "a[1.5]: unsupported key type float"),
    ({3: {(1,): 1}}, "[3][(1,)]: unsupported key type tuple"),
    ({"big": 2**64}, "big: int 18446744073709551616 is outside the int64/uint64 range"),
    ({"small": [-(2**63) - 1]}, "small[0]: int -9223372036854775809 is outside"),
    ({"keys": {2**64: 1}}, "keys[18446744073709551616]: int 18446744073709551616 is outside"),
    ({"t": torch.ones(2).to_sparse()}, "t: unsupported torch.sparse_coo tensor"),
    ({"t": torch.empty(2, device="meta")}, "t: unsupported torch.strided tensor on meta"),
])
def test_an_unsupported_value_is_a_type_error_naming_its_path_and_writes_nothing(
    tmp_path: pathlib.Path, tree: Any, message: str
) -> None:
    path = tmp_path / "s.snap"

    with pytest.raises(TypeError) as info:
        save(tree, path)

    assert str(info.value).startswith(message)
    assert list(tmp_path.iterdir()) == []


def test_an_unsupported_value_leaves_an_existing_file_as_it_was(saved: pathlib.Path) -> None:
    before = saved.read_bytes()

    with pytest.raises(TypeError, match=r"^nodes\['ctrl'\]\['model'\]: unsupported type Foo$"):
        save({"w": torch.ones(3), "nodes": {"ctrl": {"model": Foo()}}}, saved)

    assert saved.read_bytes() == before
    assert list(saved.parent.iterdir()) == [saved]


# -- damaged and foreign files ------------------------------------------------------------


def test_a_missing_file_is_file_not_found(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "nope.snap")


def test_a_file_cut_anywhere_is_truncated(saved: pathlib.Path, streaming: str) -> None:
    data = saved.read_bytes()
    structure_len = struct.unpack_from("<Q", data, 12)[0]
    ends = [0, 4, 8, 11, 12, 20, 31, 32, 33, 32 + structure_len - 1, 32 + structure_len,
            32 + structure_len + 200, len(data) - 4, len(data) - 1]

    for end in ends:
        saved.write_bytes(data[:end])
        message = error_of(saved)
        assert "truncated" in message, (end, message)
        if end >= 32:
            assert f"expected {len(data)} bytes, got {end}" in message


@pytest.mark.parametrize("where", ["header", "structure", "tensor data", "trailer"])
def test_a_flipped_byte_is_corrupted(saved: pathlib.Path, where: str, streaming: str) -> None:
    data = bytearray(saved.read_bytes())
    structure_len = struct.unpack_from("<Q", data, 12)[0]
    offset = {"header": 21, "structure": 32 + structure_len // 2,
              "tensor data": 32 + structure_len + 150, "trailer": len(data) - 2}[where]
    data[offset] ^= 0x10
    saved.write_bytes(data)

    assert "corrupted" in error_of(saved)


def test_a_flipped_bit_in_a_float_of_the_structure_fails_the_checksum() -> None:
    data = bytearray(dumps({"x": 1.5}))
    data[-6] ^= 1  # the low byte of the float64, still perfectly decodable

    with pytest.raises(SnapshotError, match=r"<bytes>: corrupted \(checksum mismatch\)"):
        loads(bytes(data))


def test_a_file_that_shrinks_while_it_is_read_is_truncated(streaming: str) -> None:
    class Shrunk(io.BytesIO):
        """Claims the size the header promises but holds 100 bytes less."""

        def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
            return super().seek(pos, whence) + (100 if whence == io.SEEK_END else 0)

    data = dumps(example_tree())

    with pytest.raises(SnapshotError, match=r"^x: truncated \(the file shrank"):
        snapshot._read(Shrunk(data[:-100]), "x")


def test_trailing_bytes_are_corrupted(saved: pathlib.Path) -> None:
    saved.write_bytes(saved.read_bytes() + b"\0")

    assert "corrupted" in error_of(saved)


@pytest.mark.parametrize("content", [
    b"\x89PNG\r\n\x1a\n" + bytes(100),
    pickle.dumps({"a": 1}),
    b"hello world, this is text and long enough to be a header",
    b"MUJOX",  # short, and not the start of the magic
], ids=["png", "pickle", "text", "short"])
def test_a_foreign_file_is_not_a_mujou_snapshot(tmp_path: pathlib.Path, content: bytes) -> None:
    path = tmp_path / "x.snap"
    path.write_bytes(content)

    assert "not a mujou snapshot" in error_of(path)


def test_a_snapshot_folders_latest_pointer_is_told_as_such(tmp_path: pathlib.Path) -> None:
    from mujou_actors import latest_snapshot

    snapshot.save({"w": torch.ones(2)}, tmp_path / "snapshot-00000000002000000000.mujou")
    (tmp_path / "latest").write_text("snapshot-00000000002000000000.mujou")

    assert error_of(tmp_path / "latest") == (
        f"{tmp_path / 'latest'}: not a mujou snapshot but a snapshot folder's pointer to its "
        "newest snapshot, snapshot-00000000002000000000.mujou: load that file of the folder "
        "(its path is mujou.latest_snapshot(folder))")
    assert torch.equal(load(latest_snapshot(tmp_path))["w"], torch.ones(2))


def test_a_torch_save_file_is_not_a_mujou_snapshot(tmp_path: pathlib.Path) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "x.pt")

    assert "not a mujou snapshot" in error_of(tmp_path / "x.pt")


def test_a_newer_format_version_names_both_versions(saved: pathlib.Path) -> None:
    saved.write_bytes(forge(b"\xc0", version=3))

    message = error_of(saved)

    assert "newer format version 3" in message and "up to version 2" in message


@pytest.mark.parametrize("bit", range(32))
@pytest.mark.parametrize("version", [1, 2])
def test_a_flipped_bit_in_the_version_field_is_corrupted_not_newer(
        saved: pathlib.Path, bit: int, version: int) -> None:
    # The header's checksum still fits the header once the version reads what it was: the
    # file is a damaged file, not one from a newer mujou_actors.
    if version == 1:
        saved.write_bytes(forge(b"\xc0", version=1))
    data = bytearray(saved.read_bytes())
    data[8 + bit // 8] ^= 1 << (bit % 8)
    saved.write_bytes(bytes(data))

    message = error_of(saved)

    assert "corrupted (header checksum mismatch" in message and "newer" not in message


@pytest.mark.parametrize("structure, data, reason", [
    (msgpack.packb(msgpack.ExtType(7, b"")), b"", "unknown extension type 7"),
    (msgpack.packb(msgpack.ExtType(1, msgpack.packb(["float9", [1], 0, 1]))), b"\0",
     "unknown tensor dtype 'float9'"),
    (msgpack.packb(msgpack.ExtType(1, msgpack.packb(["float32", [-1], 0, 4]))), bytes(4),
     "bad tensor shape"),
    # A shape asking for 4 GB from a 4-byte file is refused before anything is allocated.
    (msgpack.packb(msgpack.ExtType(1, msgpack.packb(["float32", [10**9], 0, 4 * 10**9]))),
     bytes(4), "out of place"),
    (msgpack.packb([1]), bytes(4), "tensors of 0 bytes, not 4"),
    (b"\xc1", b"", "cannot decode"),
    (msgpack.packb(1) + msgpack.packb(2), b"", "cannot decode"),
])
def test_a_structure_that_does_not_decode_is_corrupted_with_the_reason(
    structure: bytes, data: bytes, reason: str
) -> None:
    with pytest.raises(SnapshotError) as info:
        loads(forge(structure, data))

    assert "corrupted" in str(info.value) and reason in str(info.value)


def test_loading_never_unpickles(saved: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("snapshot loading must not unpickle")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, forbidden)
    monkeypatch.setattr(torch, "load", forbidden)

    assert load(saved)["b"] == [1, (2, "x")]


# -- inspect_file -------------------------------------------------------------------------


def test_inspect_file_reports_the_header_without_reading_tensor_data(
    saved: pathlib.Path,
) -> None:
    info = inspect_file(saved)

    assert info["version"] == 2 and info["size"] == saved.stat().st_size
    assert (info["tensors"], info["tensor_bytes"]) == (1, 400)
    meta = info["tree"]["a"]
    assert meta.is_meta and meta.shape == (100,) and meta.dtype == torch.float32
    assert info["tree"]["b"] == [1, (2, "x")]


@pytest.mark.slow
def test_inspect_file_refuses_a_file_with_any_one_bit_flipped(saved: pathlib.Path,
                                                               tmp_path: pathlib.Path) -> None:
    data = saved.read_bytes()
    damaged = tmp_path / "damaged.snap"
    refused = 0

    for bit in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        damaged.write_bytes(flipped)
        with pytest.raises(SnapshotError, match=f"^{re.escape(str(damaged))}: "):
            inspect_file(damaged)
        refused += 1

    assert refused == len(data) * 8 and inspect_file(saved)["tensors"] == 1


def test_inspect_file_refuses_damaged_tensor_data_it_does_not_keep(
    saved: pathlib.Path, streaming: str,
) -> None:
    data = bytearray(saved.read_bytes())
    data[-5] ^= 0x80  # the last byte of the tensor data, just before the checksum
    saved.write_bytes(data)

    with pytest.raises(SnapshotError, match="corrupted \\(checksum mismatch\\)"):
        inspect_file(saved)


def test_inspect_file_reports_a_foreign_file(tmp_path: pathlib.Path) -> None:
    (tmp_path / "x").write_bytes(b"GIF89a" + bytes(40))

    with pytest.raises(SnapshotError, match="not a mujou snapshot"):
        inspect_file(tmp_path / "x")


# -- CUDA ---------------------------------------------------------------------------------


@pytest.mark.cuda
def test_a_cuda_tensor_is_saved_from_a_cpu_copy_and_loads_on_the_cpu() -> None:
    t = torch.arange(10, device="cuda").reshape(2, 5).T

    out = loads(dumps({"t": t}))["t"]

    assert out.device.type == "cpu" and torch.equal(out, t.cpu())


# -- limits: nesting, memory, what the structure may hold ------------------------------------


def nested_tuples(depth: int) -> bytes:
    """The structure of a tuple holding a tuple ... ``depth`` levels down, as save encodes it."""
    structure = msgpack.packb(None)
    for _ in range(depth):
        structure = msgpack.packb(msgpack.ExtType(2, b"\x91" + structure))
    return structure


_CHILD = """
import sys
from mujou_actors import SnapshotError, load
from mujou_actors.snapshot import inspect_file
for read in (load, inspect_file):
    try:
        read(sys.argv[1])
    except SnapshotError as e:
        print(type(e).__name__, e)
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("depth", [193, 5000])
def test_a_deeply_nested_file_is_refused_not_a_crash(tmp_path: pathlib.Path, depth: int,
                                                     version: int) -> None:
    # A crash is a segfault: run the reader in a child, so that it fails this test only.
    path = tmp_path / "deep.mujou"
    structure = nested_tuples(depth) if version == 1 else b"\x92\xc7\x00\x02" * depth + b"\xc0"
    path.write_bytes(forge(structure, version=version))

    child = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True,
                           text=True, timeout=50)

    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    lines = child.stdout.splitlines()
    assert len(lines) == 2 and all(
        line.startswith(f"SnapshotError {path}: corrupted: cannot decode the structure: "
                        "containers nested deeper than 100 levels") for line in lines), lines


def test_nesting_is_bounded_at_max_depth_for_tuples_lists_and_dicts() -> None:
    assert snapshot.MAX_DEPTH == 100
    for wrap in (lambda x: (x,), lambda x: [x], lambda x: {"k": x}):
        tree: Any = 1
        for _ in range(snapshot.MAX_DEPTH):
            tree = wrap(tree)
        assert_same(loads(dumps(tree)), tree)  # 100 levels: fine both ways

        with pytest.raises(ValueError, match=r"nested deeper than 100 levels"):
            dumps(wrap(tree))  # save refuses what load would refuse


def test_a_deep_list_written_by_another_tool_is_refused_too() -> None:
    structure = b"\x91" * 101 + b"\xc0"

    with pytest.raises(SnapshotError, match=r"nested deeper than 100 levels \(at offset 100\)"):
        loads(forge(structure))


def empty_dicts(count: int) -> bytes:
    return b"\xdd" + struct.pack(">I", count) + b"\x80" * count


def test_a_file_of_empty_dicts_is_refused_for_the_memory_it_would_take() -> None:
    # 72 bytes of Python objects per byte of file; the bound is 32 per byte plus 16 MiB.
    with pytest.raises(SnapshotError, match=r"would take more than \d+ bytes of memory \(at "
                       r"offset \d+\); a snapshot's structure may take 32 bytes per byte plus "
                       r"16 MiB"):
        loads(forge(empty_dicts(1 << 20)))


@pytest.mark.slow
def test_loading_stays_within_its_memory_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "MEMORY_SLACK", 1 << 20)  # a smaller file shows the same
    structure = empty_dicts(200_000)
    budget = codec.MEMORY_PER_BYTE * len(structure) + codec.MEMORY_SLACK
    tracemalloc.start()
    try:
        with pytest.raises(SnapshotError, match="memory"):
            loads(forge(structure))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    # The model's charges are close to CPython's sizes: the peak is the budget, give or take,
    # plus the file's bytes (read whole here), not the 73 bytes per byte of before.
    assert peak < 1.3 * budget + 3 * len(structure), (peak, budget)


@pytest.mark.slow
def test_a_version_2_file_of_empty_dicts_loads_within_its_bound_and_save_writes_it() -> None:
    # Version 2 counts nothing: a million empty dicts (72 bytes each per byte) are within
    # V2_MEMORY_PER_BYTE, so save writes them and load reads them, where version 1 refused.
    many = [{} for _ in range(1 << 20)]
    data = dumps(many)
    tracemalloc.start()
    try:
        back = loads(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert back == many
    assert peak <= snapshot.V2_MEMORY_PER_BYTE * len(data), peak / len(data)


def test_lists_of_numbers_and_short_strings_stay_well_within_the_bound() -> None:
    tree = {"ints": list(range(-1000, 300_000)), "floats": [0.5] * 300_000,
            "words": [f"w{i % 100}" for i in range(300_000)]}

    assert loads(dumps(tree)) == tree


@pytest.mark.parametrize("structure, reason", [
    (b"", "the structure ends inside a value, at offset 0"),
    (b"\x92\x01", "a list at offset 0 claims 2 items in 1 bytes"),
    (b"\x91\xcb\x00", "the structure ends inside a number, at offset 1"),
    (b"\xd6\xff" + b"\0" * 4, "unknown extension type -1"),  # a msgpack timestamp
    (msgpack.packb(msgpack.ExtType(3, b"")), "unknown extension type 3"),
    (b"\x81\xc0\x01", "the dict key at offset 1 is a NoneType; keys must be str or int"),
    (b"\x81\xc3\x01", "is a bool; keys must be str or int"),
    (b"\x81\xcb" + struct.pack(">d", 1.0) + b"\x01", "is a float; keys must be str or int"),
    (b"\x81\xc4\x01a\x01", "is a bytes; keys must be str or int"),
    (b"\x81\x91\x01\x01", "is a list; keys must be str or int"),
    (b"\x81\x80\x01", "is a dict; keys must be str or int"),
    (b"\x81" + msgpack.packb(msgpack.ExtType(2, b"\x90")) + b"\x01", "keys must be str or int"),
    (b"\x82\xa1a\x01\xa1a\x02", "the dict at offset 0 holds the key 'a' twice"),
    (b"\x82\x01\x01\x01\x02", "the dict at offset 0 holds the key 1 twice"),
    (msgpack.packb(msgpack.ExtType(2, msgpack.packb(1))), "its payload is not an array"),
    (msgpack.packb(msgpack.ExtType(2, msgpack.packb({"a": 1}))), "its payload is not an array"),
    (msgpack.packb(msgpack.ExtType(2, b"")), "its payload is not an array"),
    (msgpack.packb(msgpack.ExtType(2, msgpack.packb([1]) + b"\x01")),
     "holds more than its array"),
    (b"\xa2\xff\xfe", "is not valid UTF-8"),
    (b"\xdd\xff\xff\xff\xff", "claims 4294967295 items in 0 bytes"),
    (msgpack.packb(msgpack.ExtType(1, msgpack.packb(["float32", [1], 0, 4, 5]))),
     "not [dtype, shape, offset, nbytes]"),
    (msgpack.packb(msgpack.ExtType(1, msgpack.packb(
        ["float32", [1], 0, msgpack.ExtType(1, b"")]))), "inside a tensor's description"),
])
def test_a_structure_beyond_the_format_is_refused_with_a_reason(
    structure: bytes, reason: str
) -> None:
    with pytest.raises(SnapshotError) as info:
        loads(forge(structure))

    message = str(info.value)
    assert message.startswith("<bytes>: corrupted: cannot decode the structure: ")
    assert reason in message and "()" not in message


@pytest.mark.parametrize("structure, reason", [
    (b"\x82\xa1a\x01\xa1a\x02", "a dict holds the key 'a' twice"),
    (b"\x81\xc0\x01", "a dict key is a NoneType; keys must be str or int"),
    (b"\xd6\xff" + b"\0" * 4, "unknown extension type -1"),
    (msgpack.packb(msgpack.ExtType(3, b"")), "unknown extension type 3"),
    (b"\x92\x01\xc7\x00\x02", "tuple marker (extension type 2) that does not lead an array"),
    (b"\x91" * 101 + b"\xc0", "containers nested deeper than 100 levels"),
    (b"\xdd\xff\xff\xff\xff" * 20, "the structure ends inside a value (it is 100 bytes)"),
    (b"\xa2\xff\xfe", "a str is not valid UTF-8"),
    (msgpack.packb(msgpack.ExtType(1, struct.pack("<BBqQQ", 200, 1, 1, 0, 1))),
     "unknown tensor dtype code 200"),
])
def test_a_version_2_structure_beyond_the_format_is_refused_with_a_reason(
    structure: bytes, reason: str
) -> None:
    with pytest.raises(SnapshotError) as info:
        loads(forge(structure, version=2))

    message = str(info.value)
    assert message.startswith("<bytes>: corrupted: cannot decode the structure: ")
    assert reason in message


def test_a_damaged_structure_is_reported_as_a_checksum_mismatch_not_as_its_symptom() -> None:
    data = bytearray(dumps({"a": [1, 2, 3]}))
    data[32] = 0xC1  # the structure's first byte: now undecodable, and the CRC no longer fits

    with pytest.raises(SnapshotError, match=r"^<bytes>: corrupted \(checksum mismatch\)$"):
        loads(bytes(data))


def test_an_undecodable_error_message_is_never_empty() -> None:
    class Mute(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no words")

    assert errors.reason(ValueError()) == "ValueError"
    assert errors.reason(Mute()) == "Mute"


def test_save_refuses_a_str_with_a_lone_surrogate_naming_its_path() -> None:
    with pytest.raises(TypeError, match=r"^nodes\['a'\]\[0\]: a str that is not valid Unicode"):
        dumps({"nodes": {"a": ["\ud800"]}})


def test_a_full_disk_names_the_file(tmp_path: pathlib.Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(snapshot, "_write", full)
    path = tmp_path / "state.mujou"

    with pytest.raises(OSError) as info:
        save({"a": 1}, path)

    assert info.value.errno == errno.ENOSPC and info.value.filename == str(path)
    assert str(path) in str(info.value) and "No space left on device" in str(info.value)
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind


def test_a_dataclass_is_stored_as_a_dict_of_its_fields() -> None:
    @dataclasses.dataclass(frozen=True)
    class Goal:
        x: torch.Tensor
        name: str

    got = loads(dumps({"m": [Goal(torch.arange(3.0), "g")]}))

    assert_same(got, {"m": [{"x": torch.arange(3.0), "name": "g"}]})
    back = snapshot.from_file(got["m"][0], Goal)
    assert type(back) is Goal and back.name == "g" and torch.equal(back.x, torch.arange(3.0))
    assert snapshot.from_file({"x": 1}, Goal) == {"x": 1}  # not its fields: left to the port


@pytest.mark.parametrize("message, problem", [
    ([1, {"k": (2.0, b"x")}], None),
    (torch.zeros(2).to_sparse(), "it is a torch.sparse_coo torch.float32 tensor"),
    ({"s": "\ud800"}, "it['s'] is a str that is not valid Unicode"),
    ({2**64: 1}, "it has a key that is the int 18446744073709551616, outside"),
    ({True: 1}, "it has a key of type bool"),
    ([OrderedDict()], "it[0] is an OrderedDict (a subclass of dict), which a file brings back "
                      "as a dict"),
    ([object()], "it[0] is an object, which a file cannot hold"),
])
def test_file_problem_names_what_a_file_would_not_bring_back(message: Any,
                                                             problem: str | None) -> None:
    got = snapshot.file_problem(message, object)

    assert got == problem if problem is None else (got or "").startswith(problem), got
