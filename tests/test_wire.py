"""The data plane's encoding (distributed/wire.py): round trips, shared memory, damage, types."""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import enum
import gc
import multiprocessing as mp
import os
import struct
import tempfile
import threading
import tracemalloc
import typing
from typing import Any

import msgpack
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mujou_actors import codec
from mujou_actors.distributed import wire
from mujou_actors.distributed.wire import Decoder, Encoder, crossing_problem, remove_blocks
from mujou_actors.errors import WireError
from tests.test_snapshot import assert_same, tensors, trees

pytestmark = pytest.mark.timeout(120)

ANY = [object]
INT64 = st.integers(-(2**63), 2**63 - 1)


class Pose(typing.NamedTuple):
    x: float
    q: torch.Tensor


@dataclasses.dataclass(frozen=True)
class Reading:
    value: float
    tags: list[str]
    raw: torch.Tensor


def prefix() -> str:
    """A prefix of this test's own, so that parallel runs never touch each other's pools."""
    return f"mujou-test-{os.getpid()}-{os.urandom(3).hex()}-"


def pools(start: str) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(start))


def round_trip(items: list[Any], declared: list[type], encoder: Encoder | None = None,
               decoder: Decoder | None = None) -> list[Any]:
    encoder = encoder or Encoder()
    frames = encoder.encode(items, declared)
    return (decoder or Decoder()).decode([bytes(f) for f in frames], declared)


def assert_items(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert type(g) is tuple and g[:4] == tuple(w[:4])
        assert_same(g[4], w[4])


# ---------------------------------------------------------------------------
# Round trips


@pytest.mark.slow
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(INT64, INT64, INT64, trees), max_size=6))
def test_any_batch_of_messages_comes_back_bit_for_bit(batch: list[Any]) -> None:
    items = [(t, d, s, 0, m) for t, d, s, m in batch]

    assert_items(round_trip(items, ANY), items)


@pytest.mark.parametrize("zero_copy", [False, True])
@settings(max_examples=60, deadline=None)
@given(st.lists(tensors(), min_size=1, max_size=5), st.integers(1, 3 << 10))
def test_tensors_of_every_dtype_and_layout_come_back_through_shared_memory_too(
        zero_copy: bool, ts: list[torch.Tensor], threshold: int) -> None:
    name = prefix()
    encoder, decoder = Encoder(name, shm_threshold=threshold), Decoder(name, zero_copy=zero_copy)
    try:
        items = [(i, 0, 0, 0, t) for i, t in enumerate(ts)]
        assert_items(round_trip(items, [torch.Tensor], encoder, decoder), items)
        freed = decoder.take_freed()
        assert len(freed) == encoder.shm_blocks
        encoder.release(freed)
        assert encoder.shm_blocks == 0 and encoder.shm_in_use == 0
    finally:
        encoder.close()
        decoder.close()
    assert pools(name) == []


def test_the_message_types_of_the_docs_come_back_as_their_declared_types() -> None:
    declared = [torch.Tensor, float, int, bool, str, bytes, list, tuple, dict, Pose, Reading,
                type(None), object]
    t = torch.arange(12.0).reshape(3, 4)
    messages = [t.t(), float("nan"), -(2**63), True, "ünï", b"\x00\xff", [1, [2.5, None]],
                (t[0], (1,)), {"a": {1: "b"}}, Pose(1.5, torch.ones(4, dtype=torch.bfloat16)),
                Reading(2.0, ["x"], torch.zeros(0, 3)), None,
                {"nested": [(torch.tensor(1 + 2j), torch.tensor(True))]}]
    items = [(10, 2, 3, port, m) for port, m in enumerate(messages)]

    out = round_trip(items, declared)

    assert [type(m) for *_, m in out] == [torch.Tensor, float, int, bool, str, bytes, list,
                                         tuple, dict, Pose, Reading, type(None), dict]
    assert_same(out[9][4].q, messages[9].q)
    assert out[9][4].x == 1.5
    assert out[10][4].tags == ["x"] and out[10][4].raw.shape == (0, 3)
    for got, want in zip(out, items, strict=True):
        if not isinstance(want[4], (Pose, Reading)):
            assert_same(got[4], want[4])


def test_tensors_come_back_contiguous_writable_and_their_own() -> None:
    small, big = torch.arange(8.0)[::2], torch.zeros(1 << 16)  # strided; own frame
    frames = Encoder().encode([(0, 0, 0, 0, small), (0, 0, 0, 0, big)], [torch.Tensor])

    assert len(frames) == 3 and isinstance(frames[2], memoryview)  # big: a view, not a copy
    out = Decoder().decode(frames, [torch.Tensor])
    for (*_, got), want in zip(out, (small, big), strict=True):
        assert got.is_contiguous() and torch.equal(got, want)
        assert got.untyped_storage().data_ptr() != want.untyped_storage().data_ptr()
        assert got.untyped_storage().resizable()
        got.add_(1)
    assert torch.equal(small, torch.arange(8.0)[::2])


@pytest.mark.cuda
def test_cuda_tensors_are_encoded_from_cpu_copies_and_come_back_on_the_cpu() -> None:
    name = prefix()
    encoder = Encoder(name, shm_threshold=1024)
    try:
        ts = [torch.arange(10, device="cuda"), torch.rand(64, 64, device="cuda").t(),
              torch.rand(1 << 16, device="cuda")]
        out = round_trip([(0, 0, 0, 0, t) for t in ts], [torch.Tensor], encoder)
    finally:
        encoder.close()
    for (*_, got), want in zip(out, ts, strict=True):
        assert got.device.type == "cpu" and torch.equal(got, want.cpu())


def test_an_empty_batch_is_one_frame() -> None:
    frames = Encoder().encode([], ANY)

    assert len(frames) == 1 and Decoder().decode(frames, ANY) == []


def test_the_batch_is_the_codec_s_format_2_the_same_bytes_as_encode() -> None:
    # What encode writes, encode_batch writes (leaves, flat containers and the slow path).
    messages = [1, -6, 300, 2**64 - 1, 1.5, "", "ab", "ünï", b"", b"xy", None, True,
                torch.zeros(()), (), [], {}, (1, "a"), [torch.ones(2)], {"k": 1, 7: b"v"},
                {"deep": [[1], (2,)]}, Pose(1.0, torch.ones(1))]
    declared = [object] * 20 + [Pose]
    tensors_: list[Any] = []

    body = codec.encode_batch(messages, list(range(21)), declared, tensors_)

    assert wire.MAGIC == b"MJW2"
    assert body == codec.encode([*messages[:20], (1.0, torch.ones(1))])[0]
    back, made = codec.decode_batch(body, 0, 21, sum(n for _, n in tensors_))
    assert back[16] == (1, "a") and back[19] == {"deep": [[1], (2,)]} and len(made) == 3


# ---------------------------------------------------------------------------
# What cannot cross


class Opaque:
    pass


class Color(enum.IntEnum):
    RED = 1


class Param(torch.Tensor):
    pass


@pytest.mark.parametrize("declared, reason", [
    (complex, "does not encode a complex"),
    (Opaque, "does not encode an Opaque"),
    (collections.OrderedDict, "an OrderedDict (a subclass of dict) would come back as a dict"),
    (Color, "a Color (a subclass of int) would come back as an int"),
    (Param, "would come back as a Tensor"),
    (bytearray, "does not encode a bytearray"),
])
def test_a_type_that_cannot_cross_is_named_with_its_port(declared: type, reason: str) -> None:
    problem = crossing_problem(declared, "ctrl.gain")

    assert problem is not None
    assert problem.startswith(f"port 'ctrl.gain' (declared {declared.__qualname__}): ")
    assert reason in problem


@pytest.mark.parametrize("declared", [object, type(None), bool, int, float, str, bytes, list,
                                      tuple, dict, torch.Tensor, Pose, Reading])
def test_the_types_the_docs_list_cross(declared: type) -> None:
    assert crossing_problem(declared, "a.b") is None


@pytest.mark.parametrize("message, declared, reason", [
    (collections.OrderedDict(a=1), object, "OrderedDict (a subclass of dict)"),
    (Pose(1.0, torch.ones(1)), object, "Pose (a NamedTuple), which a file brings back as a tuple"),
    ([Pose(1.0, torch.ones(1))], list, "it[0] is a Pose"),
    ({"a": Opaque()}, dict, "message['a']: unsupported type Opaque"),
    (2**64, int, "message: int 18446744073709551616 is outside"),
    ((1, 2**70), tuple, "message[1]: int 1180591620717411303424 is outside"),
    ({(1, 2): 3}, dict, "message[(1, 2)]: unsupported key type tuple"),
    (1 + 2j, object, "unsupported type complex"),
    ("\ud800", str, "not valid Unicode"),
    (torch.ones(2).to_sparse(), torch.Tensor, "unsupported torch.sparse_coo tensor"),
])
def test_a_message_that_would_not_come_back_as_itself_is_refused_naming_item_and_port(
        message: Any, declared: type, reason: str) -> None:
    items = [(0, 0, 0, 0, 1.0), (0, 0, 0, 1, message)]

    with pytest.raises(TypeError) as info:
        Encoder().encode(items, [float, declared])

    assert str(info.value).startswith("item 1 (port 1): ") and reason in str(info.value)


def test_a_message_nested_deeper_than_a_snapshot_holds_is_refused() -> None:
    deep: Any = 1
    for _ in range(codec.MAX_DEPTH + 1):
        deep = [deep]

    with pytest.raises(ValueError, match=r"item 0 \(port 0\): .*deeper than 100"):
        Encoder().encode([(0, 0, 0, 0, deep)], ANY)


@pytest.mark.parametrize("items, error, match", [
    ([(0, 0, 0, 0)], TypeError, "item 0 of the batch is not"),
    ([(0, 0, 0, 0, 1), (0, 0, 0, 0, 1, 2)], TypeError, "item 1 of the batch is not"),
    ([(0.5, 0, 0, 0, 1)], TypeError, "must be ints within int64"),
    ([(2**63, 0, 0, 0, 1)], TypeError, "must be ints within int64"),
    ([(0, 0, 0, 0, 1), (0, 0, 0, 1, 1)], ValueError, "item 1: port 1 is not an index"),
    ([(0, 0, 0, -1, 1)], ValueError, "port -1 is not an index"),
])
def test_items_that_are_not_items_are_refused(items: list[Any], error: type,
                                              match: str) -> None:
    with pytest.raises(error, match=match):
        Encoder().encode(items, ANY)


# ---------------------------------------------------------------------------
# Shared memory


def test_large_tensors_go_through_shared_memory_and_their_blocks_come_back() -> None:
    name = prefix()
    encoder, decoder = Encoder(name, pool_bytes=1 << 20), Decoder(name)
    try:
        big = torch.rand(1 << 15)  # 128 KiB
        frames = encoder.encode([(1, 0, 0, 0, big), (2, 0, 0, 0, 3)], [object])

        assert len(frames) == 1 and encoder.shm_blocks == 1  # only the descriptor is sent
        assert encoder.pool_name is not None and pools(name) == [encoder.pool_name]
        out = decoder.decode(frames, [object])
        assert torch.equal(out[0][4], big) and out[1][4] == 3
        freed = decoder.take_freed()
        assert len(freed) == 1 and decoder.take_freed() == []
        encoder.release(freed)
        encoder.release(freed + [12345, -1])  # late, repeated or unknown ids: ignored
        assert encoder.shm_blocks == 0
    finally:
        encoder.close()
        decoder.close()
    assert pools(name) == []


def test_a_zero_copy_tensor_views_its_block_until_it_and_its_views_are_gone() -> None:
    name = prefix()
    encoder, decoder = Encoder(name, pool_bytes=1 << 20), Decoder(name, zero_copy=True)
    try:
        big = torch.rand(64, 1024)  # 256 KiB
        frames = encoder.encode([(1, 0, 0, 0, big), (2, 0, 0, 0, {"b": big * 2})], [object])
        assert len(frames) == 1 and encoder.shm_blocks == 2
        out = decoder.decode(frames, [object])
        got, other = out[0][4], out[1][4]["b"]
        assert torch.equal(got, big) and torch.equal(other, big * 2)
        assert got.is_contiguous() and not got.untyped_storage().resizable()
        pool = decoder._pool
        assert pool is not None
        base = ctypes.addressof(ctypes.c_char.from_buffer(pool.map))
        assert base <= got.data_ptr() < base + len(pool.map)  # in the sender's pool: no copy
        got.add_(1.0)  # writable, as a copy is: the block is the reader's alone
        assert torch.equal(got, big + 1.0)

        assert decoder.take_freed() == []  # both still held
        row = got[3]  # a view of the view keeps the block too
        del out, got
        assert decoder.take_freed() == []  # other holds its block, row the first one
        del other
        assert decoder.take_freed() == [2]
        assert torch.equal(row, big[3] + 1.0)
        del row
        assert decoder.take_freed() == [1]
        encoder.release([1, 2])
        assert encoder.shm_blocks == 0
    finally:
        encoder.close()
        decoder.close()
    assert pools(name) == []


def test_a_zero_copy_batch_that_fails_to_decode_frees_its_blocks_all_the_same() -> None:
    name = prefix()
    encoder, decoder = Encoder(name, shm_threshold=1), Decoder(name, zero_copy=True)
    try:
        frames = encoder.encode([(0, 0, 0, 0, torch.ones(2048))], [object])
        with pytest.raises(WireError, match="declares int"):  # after its tensors were viewed
            decoder.decode(frames, [int])
        gc.collect()  # the traceback's frames held the batch
        assert decoder.take_freed() == [1]

        frames = encoder.encode([(0, 0, 0, 0, torch.ones(2048))], [object])
        head = bytearray(frames[0])
        head[-6:] = b"\xc1" * 6  # msgpack's never-used byte: the messages do not decode
        with pytest.raises(WireError, match="do not decode"):  # before any view was made
            decoder.decode([bytes(head)], [object])
        assert decoder.take_freed() == [2]
    finally:
        encoder.close()
        decoder.close()


def test_a_restarted_senders_new_pool_leaves_the_old_mapped_while_its_views_live() -> None:
    name = prefix()
    old, new = Encoder(name, shm_threshold=1), Encoder(name, shm_threshold=1)
    decoder = Decoder(name, zero_copy=True)
    try:
        kept = decoder.decode(old.encode([(0, 0, 0, 0, torch.full((1024,), 7.0))], ANY),
                              ANY)[0][4]
        first = decoder._pool
        assert first is not None
        old.close()  # the sender is gone (its file unlinked); the mapping stays valid
        got = decoder.decode(new.encode([(0, 0, 0, 0, torch.full((1024,), 8.0))], ANY), ANY)
        assert decoder._pool is not first and not first.map.closed  # kept by the view
        assert torch.equal(kept, torch.full((1024,), 7.0))
        del kept  # a block of the old pool: its id means nothing to the new one
        assert first.map.closed and decoder.take_freed() == []
        del got
        assert decoder.take_freed() == [1]
    finally:
        new.close()
        decoder.close()
    assert pools(name) == []


def test_freed_blocks_are_told_once_they_reach_an_eighth_of_the_pool_from_any_thread() -> None:
    name = prefix()
    encoder = Encoder(name, shm_threshold=1, pool_bytes=32 * 4096)  # told at 4 pages freed
    decoder = Decoder(name, zero_copy=True)
    told: list[str] = []
    decoder.on_freed = lambda: told.append(threading.current_thread().name)
    try:
        batches = [decoder.decode(encoder.encode([(0, 0, 0, 0, torch.ones(1024))], ANY), ANY)
                   for _ in range(6)]  # one page each
        assert told == [] and not decoder.freed_due
        dropper = threading.Thread(target=lambda: [batches.pop() for _ in range(5)],
                                   name="dropper")
        dropper.start()
        dropper.join(10)
        assert told == ["dropper"] and decoder.freed_due  # once, at the 4th; not at the 5th
        assert sorted(decoder.take_freed()) == [2, 3, 4, 5, 6]
        assert not decoder.freed_due
        batches.clear()
        assert decoder.take_freed() == [1] and told == ["dropper"]
    finally:
        encoder.close()
        decoder.close()


@pytest.mark.timeout(20)
def test_a_view_freed_while_the_freed_blocks_are_taken_is_taken_too_and_waits_for_nothing(
        ) -> None:
    """A garbage collection run by an allocation inside `take_freed` (or inside a free)
    may free another view right there, on the same thread: it must not wait for the
    lock that thread holds, and its block is taken with the others."""
    name = prefix()
    encoder, decoder = Encoder(name, shm_threshold=1), Decoder(name, zero_copy=True)
    try:
        held = [decoder.decode(encoder.encode([(0, 0, 0, 0, torch.ones(1024))], ANY), ANY)
                for _ in range(2)]
        pool = decoder._pool
        assert pool is not None

        class Collecting(collections.deque):  # type: ignore[type-arg]
            def popleft(self) -> Any:
                if held:
                    held.pop()  # the last view of block 2 goes, inside the take
                return super().popleft()

        pool.freed = Collecting()
        held.pop(0)  # block 1 freed: one entry to take
        assert decoder.take_freed() == [1, 2]
        assert decoder.take_freed() == [] and not held
    finally:
        encoder.close()
        decoder.close()


def test_a_full_pool_sends_tensors_inline_and_takes_them_again_once_released() -> None:
    name = prefix()
    encoder, decoder = Encoder(name, shm_threshold=1024, pool_bytes=3 * 4096), Decoder(name)
    try:
        ts = [torch.full((1500,), float(i)) for i in range(4)]  # 6000 bytes: two pages each
        frames = encoder.encode([(0, 0, 0, 0, t) for t in ts], [torch.Tensor])

        assert encoder.shm_blocks == 1 and encoder.shm_in_use == 2 * 4096
        assert len(frames) == 2  # the three inline ones share one frame
        out = decoder.decode(frames, [torch.Tensor])
        assert all(torch.equal(g[4], t) for g, t in zip(out, ts, strict=True))
        # Nothing released yet: the pool is still full, the next tensor goes inline.
        frames = encoder.encode([(0, 0, 0, 0, ts[0])], [torch.Tensor])
        assert len(frames) == 2 and encoder.shm_blocks == 1
        decoder.decode(frames, [torch.Tensor])
        encoder.release(decoder.take_freed())
        frames = encoder.encode([(0, 0, 0, 0, ts[1])], [torch.Tensor])
        assert len(frames) == 1 and encoder.shm_blocks == 1
        assert torch.equal(decoder.decode(frames, [torch.Tensor])[0][4], ts[1])
    finally:
        encoder.close()
        decoder.close()


def test_released_blocks_merge_so_a_larger_tensor_fits_again() -> None:
    name = prefix()
    encoder, decoder = Encoder(name, shm_threshold=1, pool_bytes=4 * 4096), Decoder(name)
    try:
        quarter = [torch.full((1024,), float(i)) for i in range(4)]  # one page each
        decoder.decode(encoder.encode([(0, 0, 0, 0, t) for t in quarter], [torch.Tensor]),
                       [torch.Tensor])
        assert encoder.shm_blocks == 4
        freed = decoder.take_freed()
        encoder.release([freed[1], freed[3], freed[0], freed[2]])  # out of order
        whole = torch.rand(4096)  # four pages
        frames = encoder.encode([(0, 0, 0, 0, whole)], [torch.Tensor])
        assert len(frames) == 1 and encoder.shm_in_use == 4 * 4096
        assert torch.equal(decoder.decode(frames, [torch.Tensor])[0][4], whole)
    finally:
        encoder.close()
        decoder.close()


def test_the_blocks_of_a_batch_not_sent_come_back(monkeypatch: pytest.MonkeyPatch) -> None:
    name = prefix()
    encoder = Encoder(name, shm_threshold=1 << 12)
    try:
        big = [(0, 0, 0, 0, torch.rand(1 << 12)), (0, 0, 0, 0, torch.rand(1 << 12))]
        frames = encoder.encode(big, ANY)
        assert encoder.shm_blocks == 2

        encoder.discard(frames)

        assert encoder.shm_blocks == 0
        # A batch that fails half-way (here its third tensor) gives its blocks back itself.
        real = wire._small_bytes
        monkeypatch.setattr(wire, "_small_bytes", lambda t, n: 1 / 0 if n == 12 else real(t, n))
        with pytest.raises(ZeroDivisionError):
            encoder.encode([*big, (0, 0, 0, 0, torch.ones(3))], ANY)
        assert encoder.shm_blocks == 0
    finally:
        encoder.close()


def test_close_is_idempotent_and_ends_the_encoder() -> None:
    name = prefix()
    encoder, decoder = Encoder(name, shm_threshold=1), Decoder(name)
    decoder.decode(encoder.encode([(0, 0, 0, 0, torch.ones(4))], ANY), ANY)

    encoder.close()
    encoder.close()
    decoder.close()
    decoder.close()

    assert pools(name) == []
    with pytest.raises(RuntimeError, match="closed"):
        encoder.encode([], ANY)


def test_remove_blocks_removes_the_pools_a_killed_sender_left_behind() -> None:
    name = prefix()
    left = [Encoder(name + "a-", shm_threshold=1), Encoder(name + "b-", shm_threshold=1)]
    for encoder in left:
        encoder.encode([(0, 0, 0, 0, torch.ones(4))], ANY)
    other = Encoder(prefix(), shm_threshold=1)
    other.encode([(0, 0, 0, 0, torch.ones(4))], ANY)
    try:
        assert len(pools(name)) == 2

        assert remove_blocks(name) == 2
        assert pools(name) == [] and other.pool_name in os.listdir("/dev/shm")
        assert remove_blocks(name) == 0
    finally:
        for encoder in [*left, other]:
            encoder.close()  # its file is gone already: fine


@pytest.mark.parametrize("bad", ["", "mujou", "mujou-", "other-", "mujou-a/b", "mujou-..\x00", 7])
def test_prefixes_that_could_name_other_files_are_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="prefix"):
        Encoder(bad)
    with pytest.raises(ValueError, match="prefix"):
        remove_blocks(bad)


def _receiver(address: str) -> None:
    """The other process: decodes each batch, answers with its sums and the freed ids."""
    import zmq

    context = zmq.Context()
    sock = context.socket(zmq.PAIR)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 20_000)
    sock.connect(address)
    decoder = Decoder("mujou-test-")
    try:
        while True:
            frames = sock.recv_multipart(copy=False)
            if frames[0].bytes == b"end":
                break
            items = decoder.decode(frames, [torch.Tensor])
            sums = [float(m.double().sum()) for *_, m in items]
            sock.send_multipart([msgpack.packb([sums, decoder.take_freed()])])
    finally:
        decoder.close()
        sock.close()
        context.term()


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_shared_memory_crosses_to_a_real_process_and_its_blocks_come_back() -> None:
    import zmq

    name = prefix()
    context = zmq.Context()
    sock = context.socket(zmq.PAIR)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 60_000)  # the child's first reply waits for its imports
    encoder = Encoder(name, shm_threshold=1 << 12, pool_bytes=4 * (1 << 16))
    with tempfile.TemporaryDirectory(prefix="mujou-wire-") as folder:
        address = f"ipc://{folder}/wire"
        sock.bind(address)
        child = mp.get_context("spawn").Process(target=_receiver, args=(address,), daemon=True)
        child.start()
        try:
            inline = most = 0
            held: list[int] = []
            for step in range(8):  # 3 blocks of 64 KiB a batch, 4 in the pool
                batch = [torch.full((1 << 14,), float(step * 3 + k)) for k in range(3)]
                frames = encoder.encode([(step, 0, 0, 0, t) for t in batch], [torch.Tensor])
                inline += len(frames) - 1
                most = max(most, encoder.shm_blocks)
                sock.send_multipart(frames, copy=False)
                sums, freed = msgpack.unpackb(sock.recv())
                assert sums == [float((step * 3 + k) * (1 << 14)) for k in range(3)]
                encoder.release(held)  # the blocks come back one reply late: the pool fills
                held = freed
            encoder.release(held)
            assert most == 4 and inline > 0 and encoder.shm_blocks == 0
            sock.send(b"end")
            child.join(30)
            assert child.exitcode == 0
        finally:
            if child.is_alive():
                child.kill()
                child.join(10)
            encoder.close()
            sock.close()
            context.term()
    assert pools(name) == []


# ---------------------------------------------------------------------------
# Damaged frames


def sample_frames(shm: Encoder | None = None) -> list[bytes]:
    t = torch.arange(6.0)
    items = [(5, 1, 2, 0, t), (6, 0, 1, 0, {"a": (t[:2], "x")}), (7, 0, 0, 0, torch.zeros(1 << 13))]
    return [bytes(f) for f in (shm or Encoder()).encode(items, ANY)]


def decode_error(frames: list[Any], declared: list[type] = ANY,
                 decoder: Decoder | None = None) -> str:
    with pytest.raises(WireError) as info:
        (decoder or Decoder()).decode(frames, declared)
    return str(info.value)


def test_every_truncation_of_frame_0_is_refused() -> None:
    frames = sample_frames()
    for cut in range(len(frames[0])):
        decode_error([frames[0][:cut], *frames[1:]])


@pytest.mark.parametrize("change, reason", [
    (lambda f: [], "no frames"),
    (lambda f: [b"MUJOUSNP" + f[0][4:], *f[1:]], "frame 0 is not a batch"),
    (lambda f: [f[0][:20], *f[1:]], "frame 0 is truncated"),
    (lambda f: f[:1], "the messages do not decode: tensor bytes out of place"),
    (lambda f: [f[0], f[1][:-1], *f[2:]], "do not decode"),
    (lambda f: [*f, b"x"], "tensors of 32800 bytes, where the frames hold 32801"),
    (lambda f: [f[0], f[2], f[1]], "tensor 2 (32768 bytes) runs past the end of frame 1"),
    (lambda f: [f[0], f[1][:4], f[1][4:], f[2]], "runs past the end of frame 1"),
    (lambda f: [f[0] + b"\xc0", *f[1:]], "bytes after the tree"),
    (lambda f: [f[0][:4] + struct.pack("<I", 4) + f[0][8:], *f[1:]], "do not decode"),
    (lambda f: [f[0][:4] + struct.pack("<I", 10**6) + f[0][8:], *f[1:]], "truncated"),
])
def test_damaged_frames_are_refused_saying_what_is_wrong(change: Any, reason: str) -> None:
    assert reason in decode_error(change(sample_frames()))


def test_a_port_outside_the_declared_types_or_a_message_of_another_type_is_refused() -> None:
    frames = Encoder().encode([(0, 0, 0, 1, 1.5)], [int, float])

    assert "port 1 is not an index of the 1 declared" in decode_error(frames, [int])
    assert "a float for port 1, which declares int" in decode_error(frames, [int, int])


def test_a_tensor_description_asking_for_more_than_the_frames_hold_allocates_nothing() -> None:
    meta = msgpack.ExtType(1, struct.pack("<BB2qQQ", 11, 2, 10**6, 10**6, 0, 4 * 10**12))
    head = wire._HEAD.pack(wire.MAGIC, 1, 0, 0) + struct.pack("<4q", 0, 0, 0, 0)

    assert "out of place" in decode_error([head + msgpack.packb([meta])])


def test_a_batch_of_the_previous_wire_format_is_not_a_batch() -> None:
    frames = Encoder().encode([(0, 0, 0, 0, (1, 2))], ANY)
    old = [b"MJW1" + bytes(frames[0][4:]), *frames[1:]]

    assert "a batch starts with b'MJW2'" in decode_error(old)


def test_a_truncated_batch_with_huge_array_headers_is_refused_allocating_little() -> None:
    body = (b"\xdd" + struct.pack(">I", 1 << 20)) * 90  # 720 MiB of slots, were they made
    head = wire._HEAD.pack(wire.MAGIC, 1, 0, 0) + struct.pack("<4q", 0, 0, 0, 0)
    tracemalloc.start()
    try:
        error = decode_error([head + body])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert "the structure ends inside a value" in error and peak < 1 << 20, peak


def test_shared_memory_rows_out_of_place_or_a_pool_that_is_gone_are_refused() -> None:
    name = prefix()
    encoder = Encoder(name, shm_threshold=1 << 12)
    try:
        frames = sample_frames(encoder)
        head = frames[0]
        a = struct.unpack_from("<H", head, 12)[0]
        rows = 14 + a + 32 * 3
        index, block, offset, nbytes = struct.unpack_from("<4q", head, rows)

        def with_row(*row: int) -> list[bytes]:
            return [head[:rows] + struct.pack("<4q", *row) + head[rows + 32:], *frames[1:]]

        too_far = wire.POOL_BYTES - 8
        assert "out of place" in decode_error(with_row(index, block, too_far, nbytes))
        assert "out of place" in decode_error(with_row(index, block, -1, nbytes))
        assert "do not decode: tensor bytes out of place" in decode_error(
            with_row(index, block, offset, 8))
        assert "names tensor 9 of 3" in decode_error(with_row(9, block, offset, nbytes))
        other = head[:14] + b"x" * a + head[14 + a:]
        assert "not one of 'mujou-'" in decode_error([other, *frames[1:]])
        assert "not one of 'mujou-elsewhere-'" in decode_error(frames, ANY,
                                                              Decoder("mujou-elsewhere-"))
        encoder.close()
        assert "cannot be opened" in decode_error(frames)
    finally:
        encoder.close()


@pytest.mark.parametrize("zero_copy", [False, True])
def test_two_tensors_in_one_block_or_in_overlapping_blocks_are_refused(zero_copy: bool) -> None:
    """A view of one would write the other: a damaged table is refused, never aliased."""
    name = prefix()
    encoder, decoder = Encoder(name, shm_threshold=1), Decoder(name, zero_copy=zero_copy)
    try:
        frames = encoder.encode([(0, 0, 0, 0, torch.ones(1024)), (0, 0, 0, 0, torch.ones(1024))],
                                ANY)
        head = frames[0]
        a = struct.unpack_from("<H", head, 12)[0]
        first, second = 14 + a + 32 * 2, 14 + a + 32 * 3
        row1 = struct.unpack_from("<4q", head, first)
        row2 = struct.unpack_from("<4q", head, second)
        assert row2[2] >= row1[2] + row1[3]  # as encoded: apart

        def with_second(block: int, offset: int) -> list[bytes]:
            return [head[:second] + struct.pack("<4q", row2[0], block, offset, row2[3])
                    + head[second + 32:]]

        for damaged in (with_second(row1[1], row2[2]), with_second(row2[1], row1[2] + 8)):
            with pytest.raises(WireError, match="share a block or overlap"):
                decoder.decode(damaged, ANY)
        assert decoder.take_freed() == []  # refused before any block was read
        got = decoder.decode(frames, ANY)
        assert [torch.equal(m, torch.ones(1024)) for *_, m in got] == [True, True]
    finally:
        encoder.close()
        decoder.close()


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_damage_to_frame_0_decodes_or_raises_wire_error(data: st.DataObject) -> None:
    frames = sample_frames()
    head = bytearray(frames[0])
    for _ in range(data.draw(st.integers(1, 4))):
        head[data.draw(st.integers(0, len(head) - 1))] = data.draw(st.integers(0, 255))
    try:
        Decoder().decode([bytes(head), *frames[1:]], ANY)
    except WireError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.lists(st.binary(max_size=40), max_size=3))
def test_any_bytes_decode_or_raise_wire_error(head: bytes, rest: list[bytes]) -> None:
    try:
        Decoder().decode([wire.MAGIC + head, *rest], [object, int, torch.Tensor])
    except WireError:
        pass

