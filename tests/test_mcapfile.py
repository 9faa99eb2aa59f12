"""The mujou profile of MCAP: every message type round-trips; cut and damaged files."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, NamedTuple

import pytest
import torch

import mujou_actors as mujou
from mujou_actors.codec import DTYPES
from mujou_actors.recording import mcapfile

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")


class Pose(NamedTuple):
    x: float
    y: float


@dataclasses.dataclass
class Command:
    force: float
    name: str


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: int


def _tensors() -> list[torch.Tensor]:
    out = []
    for name, dtype in sorted(DTYPES.items()):
        if name == "complex32":
            t = torch.arange(12, dtype=torch.int16).view(torch.float16).view(dtype)
        elif name.startswith(("float8", "float4")):
            # No arithmetic on these: made as raw bytes.
            t = torch.arange(12, dtype=torch.uint8).view(dtype)
        elif name == "bool":
            t = torch.tensor([True, False, True])
        elif dtype.is_complex:
            t = torch.randn(3, 2, dtype=dtype)
        elif dtype.is_floating_point:
            t = torch.randn(2, 3).to(dtype)
        else:
            t = torch.arange(6).to(dtype).reshape(2, 3)
        out.append(t)
    return out


MESSAGES: list[tuple[str, type, Any]] = [
    ("none", object, None),
    ("bool", bool, True),
    ("int", int, -(2**63)),
    ("uint", int, 2**64 - 1),
    ("float", float, -0.0),
    ("nan", float, float("nan")),
    ("str", str, "héllo \u2603"),
    ("bytes", bytes, b"\x00\xff"),
    ("list", list, [1, 2.5, "x", None]),
    ("tuple", tuple, (1, (2, 3), []),),
    ("dict", dict, {"a": 1, 2: [3.0], "t": torch.ones(2)}),
    ("pose", Pose, Pose(1.5, -2.0)),
    ("command", Command, Command(3.0, "push")),
    ("frozen", Frozen, Frozen(7)),
    ("empty", torch.Tensor, torch.empty(0, 3)),
    ("scalar", torch.Tensor, torch.tensor(3.25, dtype=torch.float64)),
    ("strided", torch.Tensor, torch.arange(12.0).reshape(3, 4).t()),
] + [(f"tensor_{t.dtype}".replace("torch.", ""), torch.Tensor, t) for t in _tensors()]


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (type(b) is torch.Tensor and a.dtype == b.dtype and a.shape == b.shape
                and _raw(a) == _raw(b))
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if dataclasses.is_dataclass(a):
        return all(_same(getattr(a, f.name), getattr(b, f.name))
                   for f in dataclasses.fields(a))
    if isinstance(a, float):
        return a.hex() == b.hex()  # -0.0 too
    return bool(a == b)


def _spec(name: str, type_: type, order: int = 0, **kw: Any) -> mcapfile.ChannelSpec:
    return mcapfile.ChannelSpec(f"node{order}.{name}", f"node{order}", name, order, type_, **kw)


def _write(path: pathlib.Path, messages: list[tuple[str, type, Any]], **kw: Any) -> None:
    w = mcapfile.Writer(path, **kw)
    w.write_run({"format": mcapfile.FORMAT, "seeds": json.dumps({"node0": 5})})
    ids = {name: w.add_channel(_spec(name, t)) for name, t, _ in messages}
    for i, (name, _, message) in enumerate(messages):
        w.write_message(ids[name], 7 * i, 1000 * i, i % 3, message)
    w.close({"time_ns": "99", "recorded": "{}", "drops": json.dumps({"node0.int": 2}),
             "failure": ""})


def test_every_message_type_round_trips_bit_identical(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "all.mcap"
    _write(path, MESSAGES)
    types = {f"node0.{name}": t for name, t, _ in MESSAGES}

    records = list(mcapfile.read(path, types=types))

    assert [r.topic for r in records] == [f"node0.{name}" for name, _, _ in MESSAGES]
    for (name, _, sent), record in zip(MESSAGES, records, strict=True):
        assert _same(sent, record.message), name
    assert [(r.t_ns, r.delta, r.sequence) for r in records] == [
        (1000 * i, i % 3, 7 * i) for i in range(len(MESSAGES))]  # the sender's sequence


def test_without_types_named_tuples_and_dataclasses_come_back_plain(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "plain.mcap"
    _write(path, [("pose", Pose, Pose(1.0, 2.0)), ("command", Command, Command(1.0, "a"))])

    records = list(mcapfile.read(path))

    assert [type(r.message) for r in records] == [tuple, dict]
    assert records[1].message == {"force": 1.0, "name": "a"}


def test_a_send_at_the_control_key_reads_back_at_the_control_key(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "control.mcap"
    w = mcapfile.Writer(path)
    channel = w.add_channel(_spec("x", float))
    w.write_message(channel, 0, -1, 0, 1.0)
    w.write_message(channel, 1, 0, 0, 2.0)
    w.close({})

    records = list(mcapfile.read(path))

    assert [(r.t_ns, r.delta, r.message) for r in records] == [(-1, 0, 1.0), (0, 0, 2.0)]


def test_one_instants_messages_come_in_sender_order(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "order.mcap"
    w = mcapfile.Writer(path)
    late = w.add_channel(_spec("a", int, order=2))
    early = w.add_channel(_spec("b", int, order=1))
    w.write_message(late, 0, 5, 0, 1)
    w.write_message(early, 0, 5, 0, 2)
    w.write_message(late, 1, 5, 0, 3)
    w.write_message(late, 2, 5, 1, 4)  # the next delta cycle: after
    w.write_message(early, 1, 5, 1, 5)
    w.close({})

    records = list(mcapfile.read(path))

    assert [r.message for r in records] == [2, 1, 3, 5, 4]


def test_info_gives_channels_counts_span_metadata_and_attachments(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "info.mcap"
    w = mcapfile.Writer(path)
    w.write_run({"format": mcapfile.FORMAT, "seeds": json.dumps({"sim": 3, "ctrl": 4})})
    state = w.add_channel(mcapfile.ChannelSpec("sim.state", "sim", "state", 1, torch.Tensor,
                                               shape=(None, 4), dtype="float64"))
    cmd = w.add_channel(mcapfile.ChannelSpec("ctrl.command", "ctrl", "command", 2, Command))
    for i in range(10):
        w.write_message(state, i, 10 * i, 0, torch.zeros(1, 4, dtype=torch.float64))
    w.write_message(cmd, 0, 50, 1, Command(1.0, "x"))
    w.attach_snapshot(40, {"nodes": {"sim": {"x": torch.ones(3)}}})
    w.close({"time_ns": "90", "recorded": "{}", "drops": json.dumps({"sim.state": 3}),
             "failure": ""})

    got = mcapfile.info(path)

    assert got.complete and got.cut_at is None
    assert got.library.startswith("foxglove-sdk-python/")
    assert [(c.topic, c.count, c.first_ns, c.last_ns) for c in got.channels] == [
        ("sim.state", 10, 0, 90), ("ctrl.command", 1, 50, 50)]
    state_info = got.channels[0]
    assert (state_info.node, state_info.port, state_info.sender_order) == ("sim", "state", 1)
    assert state_info.type == "torch:Tensor"
    assert state_info.shape == [None, 4] and state_info.dtype == "float64"
    assert state_info.schema == {"type": "torch:Tensor", "shape": [None, 4],
                                 "dtype": "float64", "fields": None}
    assert got.channels[1].schema["fields"] == [["force", "builtins:float"],
                                                ["name", "builtins:str"]]
    assert (got.messages, got.start_ns, got.end_ns) == (11, 0, 90)
    assert got.seeds == {"sim": 3, "ctrl": 4} and got.drops == {"sim.state": 3}
    assert got.end is not None and got.end["time_ns"] == "90"
    assert [(a.name, a.media_type, a.t_ns) for a in got.attachments] == [
        ("snapshot-40.mujou", mcapfile.SNAPSHOT_MEDIA_TYPE, 40)]
    (_, data), = mcapfile.Reader(path).attachments()
    assert torch.equal(mujou.snapshot.loads(data)["nodes"]["sim"]["x"], torch.ones(3))


def test_compressed_files_read_the_same(tmp_path: pathlib.Path) -> None:
    for compression in ("lz4", "zstd"):
        path = tmp_path / f"{compression}.mcap"
        _write(path, MESSAGES[:12], compression=compression)

        records = list(mcapfile.read(path))

        assert len(records) == 12


def _many(path: pathlib.Path, n: int = 400, close: bool = True) -> list[bytes]:
    """A file of n float messages in chunks of about 2 KiB; returns the sizes after chunks."""
    w = mcapfile.Writer(path, chunk_size=2048)
    w.write_run({"format": mcapfile.FORMAT})
    channel = w.add_channel(_spec("x", float))
    for i in range(n):
        w.write_message(channel, i, i, 0, float(i))
    if close:
        w.close({"time_ns": str(n), "recorded": "{}", "drops": "{}", "failure": ""})
    else:
        w.abandon()
    return []


@pytest.mark.slow
def test_a_file_cut_anywhere_reads_up_to_its_last_complete_chunk(
        tmp_path: pathlib.Path) -> None:
    full = tmp_path / "full.mcap"
    _many(full, close=False)  # a crash: no summary, no footer
    data = full.read_bytes()
    complete = list(mcapfile.read(full))
    assert [r.message for r in complete] == [float(i) for i in range(len(complete))]
    assert 300 < len(complete) < 400  # the chunk being filled is lost

    counts = []
    for cut in range(8, len(data), 97):
        path = tmp_path / "cut.mcap"
        path.write_bytes(data[:cut])

        records = list(mcapfile.read(path))
        got = mcapfile.info(path)

        assert [r.message for r in records] == [float(i) for i in range(len(records))]
        assert not got.complete and got.cut_at is not None and got.cut_at <= cut
        assert got.messages == len(records)
        counts.append(len(records))
    assert counts == sorted(counts) and counts[-1] == len(complete)


def test_a_closed_file_reads_whole(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "closed.mcap"
    _many(path)

    got = mcapfile.info(path)

    assert got.complete and got.messages == 400
    assert [r.message for r in mcapfile.read(path)] == [float(i) for i in range(400)]


@pytest.mark.parametrize("content", [b"", b"hello world, not mcap at all",
                                     b"MUJOUSNP" + bytes(40)])
def test_a_file_that_is_not_mcap_is_a_recording_error_naming_it(
        tmp_path: pathlib.Path, content: bytes) -> None:
    path = tmp_path / "foreign.mcap"
    path.write_bytes(content)

    with pytest.raises(mujou.RecordingError, match="not an MCAP file") as info:
        mcapfile.info(path)

    assert str(path) in str(info.value) and info.value.path == str(path)
    with pytest.raises(mujou.RecordingError, match=str(path)):
        list(mcapfile.read(path))


def test_a_damaged_chunk_is_a_recording_error_naming_the_file_and_offset(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "damaged.mcap"
    _many(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x40
    path.write_bytes(bytes(data))

    with pytest.raises(mujou.RecordingError, match="damaged") as info:
        list(mcapfile.read(path))

    assert str(path) in str(info.value) and info.value.offset is not None
    assert f"byte {info.value.offset}" in str(info.value)


def test_another_profile_is_not_a_mujou_recording(tmp_path: pathlib.Path) -> None:
    from mcap.writer import Writer

    path = tmp_path / "ros.mcap"
    with open(path, "wb") as f:
        w = Writer(f)
        w.start("ros2", "test")
        w.finish()

    with pytest.raises(mujou.RecordingError, match="profile 'ros2'"):
        mcapfile.info(path)


def test_a_missing_file_is_file_not_found(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError):
        mcapfile.info(tmp_path / "nope.mcap")


def test_a_message_a_file_cannot_hold_is_refused_before_anything_is_written(
        tmp_path: pathlib.Path) -> None:
    w = mcapfile.Writer(tmp_path / "x.mcap")
    channel = w.add_channel(_spec("x", object))

    with pytest.raises(TypeError, match="unsupported type"):
        w.write_message(channel, 0, 0, 0, object())
    w.close({})

    assert list(mcapfile.read(tmp_path / "x.mcap")) == []


def test_recording_error_pickles_with_its_fields() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(mujou.RecordingError("f.mcap", "damaged", 12)))

    assert (err.path, err.reason, err.offset) == ("f.mcap", "damaged", 12)
    assert str(err) == "f.mcap: damaged (the record at byte 12)"


def test_encode_message_makes_the_bytes_of_snapshot_dumps() -> None:
    extra = [torch.ones(3, 4).t(), torch.tensor(2.5), torch.ones(5, dtype=torch.bfloat16),
             torch.randn(2, 3, dtype=torch.complex64).conj(), torch.ones(2, requires_grad=True),
             torch.randn(3, dtype=torch.complex64).conj().imag,  # a lazy negation: neg bit
             torch.zeros(0), torch.arange(10)[::3], 2**64 - 1, -(2**63), "",
             [torch.ones(2), (1, torch.zeros(3))], {"t": torch.ones(1), "n": None}]
    for message in [m for _, _, m in MESSAGES] + extra:
        for delta in (0, 3, mcapfile.CONTROL_DELTA):

            got = mcapfile.encode_message(delta, 2**40 + delta, message)

            assert got == mujou.snapshot.dumps([delta, 2**40 + delta, message]), message


@pytest.mark.parametrize("bad", [2**64, "\ud800", {1, 2}, torch.ones(2).to_sparse()])
def test_encode_message_refuses_what_a_snapshot_refuses(bad: Any) -> None:
    with pytest.raises((TypeError, ValueError)) as expected:
        mujou.snapshot.dumps([0, bad])

    with pytest.raises(type(expected.value)):
        mcapfile.encode_message(0, 0, bad)


@pytest.mark.timeout(60)
def test_a_file_cut_in_its_last_chunk_does_not_read_as_a_clean_end(tmp_path) -> None:
    import mujou_actors as mujou

    class Beat(mujou.Node):
        out = mujou.Output(float)

        def __init__(self) -> None:
            super().__init__(period=0.01)

        def on_update(self, dt: float) -> None:
            self.out.send(dt)

    path = tmp_path / "run.mcap"
    mujou.run(Beat(), timer="simulated", duration=1.0, record=str(path)).join(30)
    data = path.read_bytes()
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(data[: len(data) // 2])  # inside its one chunk: 100 messages lost

    whole, short = mcapfile.info(str(path)), mcapfile.info(str(cut))

    assert whole.complete and whole.end is not None and whole.messages == 100
    assert not short.complete and short.end is None  # the end record follows the last chunk


def test_a_channel_without_messages_is_declared_in_the_nets_order(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "empty.mcap"
    w = mcapfile.Writer(path)
    quiet = w.add_channel(_spec("quiet", float, order=0))
    loud = w.add_channel(_spec("loud", int, order=1))
    view = w.add_view_channel("node1.loud", "mujou.view.int", {"type": "object"})
    w.write_message(loud, 0, 5, 0, 3)
    w.write(view, 5, b'{"value": 3}')
    del quiet
    w.close({})

    got = mcapfile.info(path)

    # The SDK writes a channel record with its first message only: node0.quiet has none,
    # and is known by its mujou.channel record.
    assert [(c.topic, c.count, c.type, c.sender_order) for c in got.channels] == [
        ("node0.quiet", 0, "builtins:float", 0), ("node1.loud", 1, "builtins:int", 1)]
    assert got.channels[0].id == -1 and got.channels[1].id >= 0
    assert got.channels[0].schema == {"type": "builtins:float", "shape": None, "dtype": None,
                                      "fields": None}
    assert [(v.topic, v.view_of, v.count) for v in got.views] == [
        ("/view/node1.loud", "node1.loud", 1)]
    assert list(mcapfile.Reader(path).views()) == [("node1.loud", 0, 5, {"value": 3})]


def _write_format_1(path: pathlib.Path) -> None:
    """A recording as format 1 wrote it: the mcap package's writer, the sequence in the record."""
    from mcap.writer import Writer

    with open(path, "wb") as f:
        w = Writer(f, chunk_size=1024)
        w.start(mcapfile.PROFILE, "mujou_actors 0.1.0")
        w.add_metadata(mcapfile.RUN_METADATA, {"format": "1", "seeds": '{"node0": 2}'})
        ids = []
        for spec in (_spec("a", float, order=0), _spec("b", int, order=1)):
            schema = w.register_schema(mcapfile.type_name(spec.type), mcapfile.SCHEMA_ENCODING,
                                       json.dumps(spec.schema()).encode())
            ids.append(w.register_channel(spec.topic, mcapfile.MESSAGE_ENCODING, schema,
                                          spec.metadata()))
        for i in range(50):
            data = mujou.snapshot.dumps([0, float(i)])
            w.add_message(ids[0], 10 * i, data, 10 * i, (2**32 + i) & (2**32 - 1))
        w.add_metadata(mcapfile.END_METADATA, {"drops": "{}"})
        w.finish()


def test_a_format_1_recording_still_reads(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "v1.mcap"
    _write_format_1(path)

    got = mcapfile.info(path)
    records = list(mcapfile.read(path))

    assert got.library == "mujou_actors 0.1.0" and got.run["format"] == "1"
    assert [(c.topic, c.count) for c in got.channels] == [("node0.a", 50), ("node1.b", 0)]
    assert [(r.sequence, r.t_ns, r.message) for r in records] == [
        (i, 10 * i, float(i)) for i in range(50)]


def test_a_write_that_fails_is_raised_as_its_os_error(tmp_path: pathlib.Path) -> None:
    import os

    path = tmp_path / "full.mcap"
    w = mcapfile.Writer(path, chunk_size=512)
    channel = w.add_channel(_spec("x", float))
    full = os.open("/dev/full", os.O_WRONLY)  # every write: ENOSPC
    try:
        os.dup2(full, w._stream._fd)
    finally:
        os.close(full)

    with pytest.raises(OSError, match="No space left") as info:
        for i in range(1000):  # a closed chunk's write fails
            w.write_message(channel, i, i, 0, float(i))
    with pytest.raises(OSError, match="No space left"):
        w.flush()
    w.abandon()

    assert info.value.errno == 28 and i < 100


def test_types_that_do_not_fit_the_file_are_refused_naming_them(tmp_path: pathlib.Path) -> None:
    @dataclasses.dataclass
    class Other:
        speed: float
        name: str

    path = tmp_path / "types.mcap"
    _write(path, [("pose", Pose, Pose(1.0, 2.0)), ("x", float, 1.5)])

    with pytest.raises(ValueError, match=r"has the fields \['speed', 'name'\], but "
                                         r"'node0.pose' recorded .*Pose with \['x', 'y'\]"):
        list(mcapfile.read(path, types={"node0.pose": Other}))
    with pytest.raises(ValueError, match="'node0.x' holds builtins:float messages"):
        list(mcapfile.read(path, types={"node0.x": Pose}))
    with pytest.raises(ValueError, match=r"names 'node0.nope', which the file has no channel "
                                         r"of \(it has: node0.pose, node0.x\)"):
        list(mcapfile.read(path, types={"node0.nope": Pose}))
    assert [r.message for r in mcapfile.read(path, types={"node0.pose": Pose})] == [
        Pose(1.0, 2.0), 1.5]


def test_lazy_tensors_are_told_with_or_without_torchs_dispatch_keys(
        monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(3, dtype=torch.complex64)
    cases = [(x.conj(), True), (x.conj().imag, True), (x, False), (torch.ones(2), False)]
    fast = mcapfile._lazy_checks()
    monkeypatch.delattr(torch._C, "_dispatch_keys")  # a torch without that private API
    slow = mcapfile._lazy_checks()

    assert [fast(t) for t, _ in cases] == [slow(t) for t, _ in cases] == [w for _, w in cases]


def test_a_writers_bad_chunk_size_is_a_type_or_value_error_naming_it(tmp_path: Any) -> None:
    for wrong, error in ((1.5, TypeError), ("1024", TypeError), (True, TypeError),
                         (0, ValueError), (-1, ValueError)):
        with pytest.raises(error, match="chunk_size must be an int >= 1"):
            mcapfile.Writer(str(tmp_path / "x.mcap"), chunk_size=wrong)  # type: ignore[arg-type]
