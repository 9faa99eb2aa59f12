"""Recordings and capsules are untrusted files: mutated and crafted ones read as records or
as a `RecordingError`, never as another exception, a hang, a blown memory, or changed data.

Real files (a recording of a small net in each compression, a crash capsule of a failing
net, a recording cut by a crash) are mutated with a seeded `random` (bit flips, byte
overwrites, truncations, inserted and deleted bytes, record lengths set to huge values);
crafted files (deep JSON, zstd and lz4 bombs, times past 2**63, bad CRCs, bad capsule facts)
are built record by record. Every read is timed; the bombs are read under `tracemalloc`.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import time
import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

import lz4.frame  # type: ignore[import-untyped]
import pytest
import zstandard
from click.testing import CliRunner

import mujou_actors as mujou
from mujou_actors.cli import main
from mujou_actors.recording import mcapfile
from mujou_actors.recording.capsule import capsule_facts
from mujou_actors.snapshot import dumps
from mujou_actors.testing import reproduce_failure
from tests.nets.capsule_nets import make_net
from tests.nets.replay_nets import loop_net

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READ_LIMIT_S = 3.0  # one file read every way (info, messages, views, attachments), at most
MUTATIONS = 100  # per real file and kind of mutation
MAGIC = b"\x89MCAP0\r\n"


# -- real files ----------------------------------------------------------------------------


def _record(path: str, compression: str) -> None:
    """A small net recorded for 0.3 s: several chunks, view channels, snapshot attachments."""
    run = mujou.run(loop_net(), timer="simulated", duration=0.3, seed=1, workers=1,
                    record=mujou.Recording(path, compression=compression, chunk_size=300,
                                           view=True, snapshots=True),
                    supervisor=mujou.Supervisor(snapshot_every=0.1))
    run.join(60)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """By name, the bytes of each real file: closed recordings, a capsule, a cut file."""
    folder = tmp_path_factory.mktemp("real")
    out = {}
    for compression in ("none", "zstd", "lz4"):
        path = str(folder / f"{compression}.mcap")
        _record(path, compression)
        out[compression] = open(path, "rb").read()
    capsule = str(folder / "capsule.mcap")
    run = mujou.run(make_net(), timer="simulated", duration=10.0, workers=1,
                    record_on_failure=mujou.Capsule(capsule, seconds=0.5))
    with pytest.raises(mujou.NodeError, match="integrator wound up"):
        run.join(60)
    out["capsule"] = open(capsule, "rb").read()
    cut = str(folder / "cut.mcap")
    writer = mcapfile.Writer(cut, chunk_size=200)
    writer.write_run({"format": mcapfile.FORMAT})
    channel = writer.add_channel(mcapfile.ChannelSpec("n.x", "n", "x", 0, float))
    for i in range(100):
        writer.write_message(channel, i, 1000 * i, 0, float(i))
    writer.abandon()  # a crash: no summary, no footer
    out["cut"] = open(cut, "rb").read()
    return out


def _read_everything(path: str, allow_damaged: bool = False) -> tuple[Any, ...]:
    """What every reader makes of the file (compared whole: tensors as their snapshot bytes).

    The last item is what `RecordingInfo.damage` says (``allow_damaged``).
    """
    found = mcapfile.info(path, allow_damaged=allow_damaged)
    reader = mcapfile.Reader(path, allow_damaged=allow_damaged)
    messages = [(r.topic, r.sequence, r.t_ns, r.delta, dumps(r.message))
                for r in reader.messages()]
    views = list(reader.views())
    attachments = list(reader.attachments())
    facts = capsule_facts(found.end, path)
    channels = [(c.topic, c.type, c.shape, c.dtype, c.count) for c in found.channels]
    return (channels, found.run, found.end, messages, views, attachments, facts, found.damage)


def _attempt(path: str, what: str,
             allow_damaged: bool = False) -> tuple[Any, ...] | mujou.RecordingError:
    """The file read every way, or its RecordingError; anything else fails, naming ``what``."""
    started = time.monotonic()
    try:
        outcome: tuple[Any, ...] | mujou.RecordingError = _read_everything(path, allow_damaged)
    except mujou.RecordingError as e:
        assert e.path == path and str(e).startswith(path), what
        outcome = e
    except Exception as e:  # noqa: BLE001 - the failure names the mutation
        raise AssertionError(f"{what}: {type(e).__name__}: {e}") from e
    took = time.monotonic() - started
    assert took < READ_LIMIT_S, f"{what}: read in {took:.2f} s"
    return outcome


def _records(data: bytes) -> list[int]:
    """The offsets of the top-level records of an MCAP file (up to where they stop reading)."""
    out, pos = [], 8
    while pos + 9 <= len(data):
        out.append(pos)
        pos += 9 + struct.unpack_from("<Q", data, pos + 1)[0]
    return out


def _mutate(data: bytes, rng: random.Random, kind: str) -> tuple[bytes, str]:
    """One mutation of ``kind``, and its description."""
    out = bytearray(data)
    pos = rng.randrange(len(data))
    if kind == "flip":
        bit = rng.randrange(8)
        out[pos] ^= 1 << bit
        return bytes(out), f"bit {bit} of byte {pos} flipped"
    if kind == "byte":
        value = (data[pos] + rng.randrange(1, 256)) % 256
        out[pos] = value
        return bytes(out), f"byte {pos} set to {value}"
    if kind == "truncate":
        return data[:pos], f"cut at byte {pos}"
    if kind == "insert":
        extra = rng.randbytes(rng.randint(1, 16))
        return data[:pos] + extra + data[pos:], f"{len(extra)} bytes inserted at {pos}"
    if kind == "delete":
        n = rng.randint(1, 16)
        return data[:pos] + data[pos + n:], f"{n} bytes deleted at {pos}"
    at = rng.choice(_records(data))
    length = struct.unpack_from("<Q", data, at + 1)[0]
    value = rng.choice([2**64 - 1, 2**63, 2**32 + length, len(data), length + 1,
                        max(length - 1, 0), 0])
    struct.pack_into("<Q", out, at + 1, value)
    return bytes(out), f"the length of the record at {at} set to {value}"


KINDS = ("flip", "byte", "truncate", "insert", "delete", "length")


def _per_topic(read: tuple[Any, ...]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for message in read[3]:
        out.setdefault(message[0], []).append(message)
    return out


# -- mutated real files --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["none", "zstd", "lz4", "capsule"])
def test_every_change_to_a_closed_file_is_a_recording_error_and_a_cut_reads_a_prefix(
        files: dict[str, bytes], name: str, tmp_path: Any) -> None:
    original = files[name]
    path = str(tmp_path / "mutated.mcap")
    with open(path, "wb") as f:
        f.write(original)
    whole = _attempt(path, f"{name} as written")
    assert isinstance(whole, tuple) and whole[3]
    rng = random.Random(f"closed-{name}")
    errors = changes = cuts = 0

    for i in range(MUTATIONS * len(KINDS)):
        kind = KINDS[i % len(KINDS)]
        data, what = _mutate(original, rng, kind)
        with open(path, "wb") as f:
            f.write(data)

        got = _attempt(path, f"{name}: {what}")
        allowed = _attempt(path, f"{name}: {what} (allow_damaged)", allow_damaged=True)

        # A file that is a prefix of the original was cut, whatever did it (a deletion
        # that reaches the end cuts too): it may read as a cut file does.
        if data != original[:len(data)]:
            changes += 1
            # Every byte of a closed file is under a CRC (data section, summary, footer)
            # or is its framing: a change never reads as other data. Allowed, the damage
            # is read up to (the parser meets what the CRC caught), and said.
            assert isinstance(got, mujou.RecordingError), f"{name}: {what} read without error"
            assert isinstance(allowed, mujou.RecordingError) or allowed[-1], f"{name}: {what}"
            errors += 1
        elif isinstance(got, tuple):  # a cut: each channel's first messages, unchanged
            cuts += 1
            mine, theirs = _per_topic(got), _per_topic(whole)
            assert all(theirs[t][:len(m)] == m for t, m in mine.items()), f"{name}: {what}"
            assert not mcapfile.info(path).complete
    assert errors == changes >= MUTATIONS * (len(KINDS) - 2) and cuts > 0


def test_a_file_cut_by_a_crash_mutated_reads_or_is_a_recording_error(
        files: dict[str, bytes], tmp_path: Any) -> None:
    original = files["cut"]
    path = str(tmp_path / "mutated.mcap")
    rng = random.Random("cut")
    outcomes = {"read": 0, "error": 0}

    for i in range(MUTATIONS * len(KINDS)):
        data, what = _mutate(original, rng, KINDS[i % len(KINDS)])
        with open(path, "wb") as f:
            f.write(data)

        got = _attempt(path, f"cut: {what}")

        outcomes["read" if isinstance(got, tuple) else "error"] += 1
    assert outcomes["read"] > 0 and outcomes["error"] > 0


def test_a_flipped_byte_in_a_chunk_of_a_cut_file_is_caught_by_the_chunks_crc(
        files: dict[str, bytes], tmp_path: Any) -> None:
    original = files["cut"]
    chunks = [at for at in _records(original) if original[at] == 6
              and at + 9 + struct.unpack_from("<Q", original, at + 1)[0] <= len(original)]
    path = str(tmp_path / "flipped.mcap")
    rng = random.Random("chunk")

    for _ in range(MUTATIONS):
        at = rng.choice(chunks)
        length = struct.unpack_from("<Q", original, at + 1)[0]
        pos = rng.randrange(at + 9 + 40, at + 9 + length)  # in its records
        data = bytearray(original)
        data[pos] ^= 1 << rng.randrange(8)
        with open(path, "wb") as f:
            f.write(data)

        with pytest.raises(mujou.RecordingError, match="checksum|damaged"):
            list(mcapfile.read(path))


def test_mutated_files_given_to_the_command_line_are_one_error_line_naming_the_file(
        files: dict[str, bytes], tmp_path: Any) -> None:
    rng = random.Random("cli")
    runner = CliRunner()
    codes = set()

    for i in range(24):
        name = ("none", "zstd", "lz4", "capsule", "cut")[i % 5]
        data, what = _mutate(files[name], rng, KINDS[i % len(KINDS)])
        path = str(tmp_path / f"m{i}.mcap")
        with open(path, "wb") as f:
            f.write(data)

        result = runner.invoke(main, ["inspect", path])

        assert result.exception is None or isinstance(result.exception, SystemExit), what
        assert result.exit_code in (0, 2), f"{name}: {what}: {result.output}"
        if result.exit_code == 2:
            assert result.output.startswith(f"error: RecordingError: {path}: "), f"{name}: {what}"
        codes.add(result.exit_code)
    assert codes == {0, 2}


# -- cut or damaged, and the opt-in --------------------------------------------------------


def _second_chunk(data: bytes) -> int:
    return [at for at in _records(data) if data[at] == 6][1]


def test_a_bad_length_in_the_middle_of_a_closed_file_is_damage_not_a_cut(
        files: dict[str, bytes], tmp_path: Any) -> None:
    data = bytearray(files["none"])
    at = _second_chunk(data)
    struct.pack_into("<Q", data, at + 1, 2**62)
    path = str(tmp_path / "damaged.mcap")
    with open(path, "wb") as f:
        f.write(data)
    whole = list(mcapfile.read(_write(tmp_path / "whole.mcap", files["none"])))

    with pytest.raises(mujou.RecordingError, match="checksum") as refused:
        list(mcapfile.read(path))
    read = list(mcapfile.read(path, allow_damaged=True))
    found = mcapfile.info(path, allow_damaged=True)

    assert refused.value.offset is not None
    assert 0 < len(read) < len(whole) and read == whole[:len(read)]
    assert not found.complete and found.cut_at == at and found.damage is not None
    assert f"byte {at}" in found.damage


def test_a_lying_length_where_a_cut_file_ends_is_damage_when_its_fields_say_so(
        files: dict[str, bytes], tmp_path: Any) -> None:
    data = bytearray(files["cut"])
    at = _second_chunk(data)
    struct.pack_into("<Q", data, at + 1, len(data))  # past the end, as a cut's would be
    path = _write(tmp_path / "lying.mcap", bytes(data))

    with pytest.raises(mujou.RecordingError, match="length field says"):
        mcapfile.info(path)

    cut = _write(tmp_path / "cut.mcap", files["cut"][:at + 100])
    assert mcapfile.info(cut).cut_at == at  # a real cut there reads up to it


def test_replay_refuses_a_damaged_file_unless_asked(tmp_path: Any) -> None:
    path = str(tmp_path / "loop.mcap")
    run = mujou.run(loop_net(), timer="simulated", duration=0.05, seed=1, workers=1,
                    record=mujou.Recording(path, chunk_size=100))
    run.join(60)
    data = bytearray(open(path, "rb").read())
    struct.pack_into("<Q", data, _second_chunk(data) + 1, 2**40)
    _write(path, bytes(data))

    with pytest.raises(mujou.RecordingError, match="checksum"):
        mujou.run(loop_net(), timer="simulated", duration=0.05, workers=1,
                  replay=mujou.Replay(path, replace=["source"]))
    net = loop_net()
    replayed = mujou.run(net, timer="simulated", duration=0.05, workers=1,
                         replay=mujou.Replay(path, replace=["source"], allow_damaged=True))
    replayed.join(60)

    assert 0 < len(net["echo"].got) < 5 and net["echo"].got == list(
        range(1, len(net["echo"].got) + 1))
    refused = _mujou("replay", path, "tests/nets/replay_nets.py:loop_net", "--replace",
                     "source", "--speed", "0", "--quiet")
    allowed = _mujou("replay", path, "tests/nets/replay_nets.py:loop_net", "--replace",
                     "source", "--speed", "0", "--quiet", "--allow-damaged")
    assert refused.returncode == 2 and refused.stderr.startswith(f"error: RecordingError: {path}: ")
    assert allowed.returncode == 0, allowed.stderr


def _mujou(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mujou_actors", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


# -- crafted files -------------------------------------------------------------------------


def _write(path: Any, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def _rec(opcode: int, content: bytes) -> bytes:
    return struct.pack("<BQ", opcode, len(content)) + content


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<I", len(raw)) + raw


def _map(values: dict[str, str]) -> bytes:
    body = b"".join(_s(k) + _s(v) for k, v in values.items())
    return struct.pack("<I", len(body)) + body


def _metadata(name: str, values: dict[str, str]) -> bytes:
    return _rec(12, _s(name) + _map(values))


def _message(channel: int, sequence: int, t_ns: int, data: bytes) -> bytes:
    return _rec(5, struct.pack("<HIQQ", channel, sequence, t_ns, t_ns) + data)


def _chunk(records: bytes, compression: str = "", payload: bytes | None = None,
           size: int | None = None, crc: int | None = None) -> bytes:
    payload = records if payload is None else payload
    size = len(records) if size is None else size
    crc = zlib.crc32(records) if crc is None else crc
    return _rec(6, struct.pack("<QQQI", 0, 0, size, crc) + _s(compression)
                + struct.pack("<Q", len(payload)) + payload)


def _attachment(name: str, data: bytes, t_ns: int = 0, crc: int | None = None) -> bytes:
    body = (struct.pack("<QQ", t_ns, t_ns) + _s(name) + _s(mcapfile.SNAPSHOT_MEDIA_TYPE)
            + struct.pack("<Q", len(data)) + data)
    return _rec(9, body + struct.pack("<I", zlib.crc32(body) if crc is None else crc))


def _channel(topic: str = "n.x", *, schema: str | None = None,
             meta: dict[str, str] | None = None) -> tuple[bytes, bytes]:
    """A float channel's ``mujou.channel`` record, and its schema and channel records (id 1)."""
    spec = mcapfile.ChannelSpec(topic, "n", "x", 0, float)
    text = json.dumps(spec.schema()) if schema is None else schema
    metadata = {**spec.metadata(), **(meta or {})}
    declared = _metadata(mcapfile.CHANNEL_METADATA, {
        **metadata, "mujou.topic": topic, "mujou.message_encoding": mcapfile.MESSAGE_ENCODING,
        "mujou.schema_name": "builtins:float", "mujou.schema_encoding": "mujou.port",
        "mujou.schema": text})
    records = (_rec(3, struct.pack("<H", 1) + _s("builtins:float") + _s("mujou.port")
                    + struct.pack("<I", len(text.encode())) + text.encode())
               + _rec(4, struct.pack("<HH", 1, 1) + _s(topic) + _s(mcapfile.MESSAGE_ENCODING)
                      + _map(metadata)))
    return declared, records


def _file(*records: bytes, run: dict[str, str] | None = None, closed: bool = True) -> bytes:
    """A mujou recording of ``records`` (after its header and ``mujou.run``), CRCs right."""
    data = (MAGIC + _rec(1, _s(mcapfile.PROFILE) + _s("crafted"))
            + _metadata(mcapfile.RUN_METADATA, {"format": "2", **(run or {})})
            + b"".join(records))
    if not closed:
        return data
    data += _rec(15, struct.pack("<I", zlib.crc32(data)))
    footer = struct.pack("<BQQQ", 2, 20, 0, 0)
    return data + footer + struct.pack("<I", zlib.crc32(footer)) + MAGIC


def _floats(n: int, delta: int = 0) -> bytes:
    return b"".join(_message(1, i + 1, 1000 * i, mcapfile.encode_message(delta, i, float(i)))
                    for i in range(n))


def test_the_crafted_files_read_when_nothing_is_wrong(tmp_path: Any) -> None:
    declared, records = _channel()
    path = _write(tmp_path / "good.mcap", _file(
        declared, _chunk(records + _floats(5)), _chunk(_floats(2), crc=0),
        _attachment("snapshot-0.mujou", b"data")))

    got = [(r.topic, r.t_ns, r.message) for r in mcapfile.read(path)]

    assert got[:5] == [("n.x", 1000 * i, float(i)) for i in range(5)] and len(got) == 7
    assert mcapfile.info(path).complete and mcapfile.info(path).attachments[0].size == 4


DEEP = "[" * 100_000 + "]" * 100_000


def _deep_view() -> bytes:
    schema = b"{}"
    view = (_rec(3, struct.pack("<H", 2) + _s("v") + _s("jsonschema")
                 + struct.pack("<I", len(schema)) + schema)
            + _rec(4, struct.pack("<HH", 2, 2) + _s("/view/n.x") + _s("json")
                   + _map({mcapfile.VIEW_OF: "n.x"})))
    return _chunk(view + _message(2, 1, 0, DEEP.encode()))


CRAFTED: dict[str, tuple[Callable[[], bytes], str]] = {
    "deep JSON in the run's seeds": (lambda: _file(run={"seeds": DEEP}), "nested"),
    "deep JSON in a schema": (lambda: _file(_channel(schema=DEEP)[0]), "nested"),
    "deep JSON in a shape": (lambda: _file(_channel(meta={"shape": DEEP})[0]), "nested"),
    "deep JSON in a view": (lambda: _file(_deep_view()), "nested"),
    "deep JSON in capsule facts": (
        lambda: _file(_metadata(mcapfile.END_METADATA, {"capsule": DEEP})), "nested"),
    "a log time of 2**63": (lambda: _file(_chunk(_channel()[1] + _message(
        1, 1, 2**63, mcapfile.encode_message(0, 0, 1.0))), _channel()[0]), "2\\*\\*63"),
    "a delta of 2**63": (lambda: _file(_channel()[0], _chunk(_channel()[1] + _message(
        1, 1, 0, dumps([2**63, 0, 1.0])))), "delta"),
    "a delta of -2": (lambda: _file(_channel()[0], _chunk(_channel()[1] + _message(
        1, 1, 0, dumps([-2, 0, 1.0])))), "delta"),
    "an end time past 2**63": (lambda: _file(_metadata(mcapfile.END_METADATA, {
        "time_ns": "9" * 4000})), "time_ns"),
    "a seed past 2**64": (lambda: _file(run={"seeds": json.dumps({"n": 2**64})}), "seeds"),
    "a chunk with a bad CRC": (lambda: _file(_chunk(_floats(3), crc=12345)), "checksum"),
    "an attachment with a bad CRC": (lambda: _file(_attachment("a", b"x", crc=7)),
                                     "checksum"),
    "an attachment at 2**63": (lambda: _file(_attachment("a", b"x", t_ns=2**63)), "2\\*\\*63"),
    "a chunk of unknown compression": (lambda: _file(_chunk(b"", "brotli")), "compression"),
    "a chunk's records past its end": (lambda: _file(_chunk(
        struct.pack("<BQ", 5, 2**63))), "past the end"),
    "a schema past its record": (lambda: _file(_rec(3, struct.pack("<HI", 1, 2**31))),
                                 "runs past"),
    "a string that is no UTF-8": (lambda: _file(_rec(12, _s("x")[:4] + b"\xff" + _map({}))),
                                  "UTF-8"),
    "a second header": (lambda: _file(_rec(1, _s("mujou") + _s("x"))), "header"),
    "an unknown opcode": (lambda: _file(_rec(0x42, b"")), "0x42"),
    "a schema list for a channel": (lambda: _file(_channel(schema="[1]")[0]), "schema"),
    "fields that are no pairs": (lambda: _file(_channel(
        schema='{"fields": [[1, 2, 3]]}')[0]), "fields"),
    "no sender order": (lambda: _file(_metadata(mcapfile.CHANNEL_METADATA, {
        "mujou.topic": "t", "mujou.message_encoding": mcapfile.MESSAGE_ENCODING,
        "mujou.schema_name": "f", "mujou.schema_encoding": "mujou.port",
        "mujou.schema": "{}"})), "sender_order"),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_crafted_file_is_a_recording_error_naming_what_is_wrong(case: str,
                                                                  tmp_path: Any) -> None:
    make, reason = CRAFTED[case]
    path = _write(tmp_path / "crafted.mcap", make())

    with pytest.raises(mujou.RecordingError, match=reason) as raised:
        _read_everything(path)
    _attempt(path, case, allow_damaged=True)  # no crash either way

    assert raised.value.path == path
    result = CliRunner().invoke(main, ["inspect", path])
    assert result.exit_code in (0, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    if case not in ("deep JSON in a view", "a delta of 2**63", "a delta of -2"):  # not decoded
        assert result.exit_code == 2
        assert result.output.startswith(f"error: RecordingError: {path}: ")


def _peak(read: Callable[[], Any]) -> tuple[float, int]:
    """Seconds and peak bytes (tracemalloc) of ``read()``, which must raise RecordingError."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(mujou.RecordingError):
            read()
        return time.monotonic() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


MIB = 1 << 20


@pytest.fixture(scope="module")
def zeros() -> bytes:
    return bytes(200 * MIB)


def test_a_chunk_that_claims_gigabytes_is_refused_before_it_is_decompressed(
        tmp_path: Any) -> None:
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 1000)
    path = _write(tmp_path / "claims.mcap", _file(_chunk(b"", "zstd", frame, size=2**40)))

    took, peak = _peak(lambda: mcapfile.info(path))

    assert took < 1 and peak < 4 * MIB


@pytest.mark.parametrize("compression", ["zstd", "zstd-sized", "lz4"])
def test_a_frame_that_expands_past_its_chunks_size_is_stopped_there(
        compression: str, zeros: bytes, tmp_path: Any) -> None:
    if compression == "lz4":
        frame = lz4.frame.compress(zeros[:64 * MIB])  # 255:1 at most
    else:
        frame = zstandard.ZstdCompressor(write_content_size=compression == "zstd-sized"
                                         ).compress(zeros)
    records = _floats(3)
    path = _write(tmp_path / "bomb.mcap", _file(_chunk(
        records, compression.removesuffix("-sized"), frame)))

    took, peak = _peak(lambda: mcapfile.info(path))

    assert took < 2 and peak < 8 * MIB + 2 * len(frame)


def test_the_chunks_of_a_pass_decompress_to_at_most_the_files_budget(
        zeros: bytes, tmp_path: Any) -> None:
    records = _message(1, 1, 0, zeros[:16 * MIB])
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(records)
    declared, channel = _channel()
    data = _file(declared, _chunk(channel), *[_chunk(records, "zstd", frame)] * 20)
    path = _write(tmp_path / "many.mcap", data)
    budget = mcapfile.MAX_EXPANSION * len(data) + mcapfile.EXPANSION_SLACK

    took, peak = _peak(lambda: mcapfile.info(path))

    assert budget < 20 * 16 * MIB
    assert took < READ_LIMIT_S and peak < 4 * 16 * MIB + MIB
    with pytest.raises(mujou.RecordingError, match="decompresses to") as raised:
        mcapfile.info(path)
    assert raised.value.offset is not None


# -- capsules ------------------------------------------------------------------------------


FACTS = {"node": "integ", "hook": "on_update", "t_ns": 10, "delta": 0,
         "exception": "builtins.ValueError", "message": "m", "snapshot_ns": 5}


def _capsule(path: str, facts: Any, snapshot: bytes | None = None) -> str:
    writer = mcapfile.Writer(path)
    writer.write_run({"format": mcapfile.FORMAT, "capsule": "1", "timer": "simulated"})
    writer.add_channel(mcapfile.ChannelSpec("n.x", "n", "x", 0, float))
    if snapshot is not None:
        writer.attach("snapshot-5.mujou", 5, snapshot)
    writer.close({"time_ns": "10", "capsule": facts if isinstance(facts, str)
                  else json.dumps(facts), "failure": "", "drops": "{}", "recorded": "{}"})
    return path


@pytest.mark.parametrize("facts, key", [
    ({k: v for k, v in FACTS.items() if k != "snapshot_ns"}, "snapshot_ns"),
    ({**FACTS, "t_ns": "10"}, "t_ns"),
    ({**FACTS, "node": None}, "node"),
    ({**FACTS, "delta": True}, "delta"),
    ({**FACTS, "t_ns": 2**63}, "t_ns"),
    ({**FACTS, "snapshot_ns": 11}, "after its failure"),
    ([1, 2], "not an object"),
    ("{not json", "capsule"),
])
def test_bad_capsule_facts_are_a_recording_error_naming_the_key(
        facts: Any, key: str, tmp_path: Any) -> None:
    path = _capsule(str(tmp_path / "capsule.mcap"), facts)

    with pytest.raises(mujou.RecordingError, match=key):
        capsule_facts(mcapfile.info(path).end, path)
    with pytest.raises(mujou.RecordingError, match=key):
        reproduce_failure(path, make_net())
    result = CliRunner().invoke(main, ["inspect", path])
    assert result.exit_code == 2 and result.output.startswith(f"error: RecordingError: {path}: ")


def test_a_capsule_whose_snapshot_does_not_read_is_a_recording_error(tmp_path: Any) -> None:
    path = _capsule(str(tmp_path / "capsule.mcap"), FACTS, b"not a snapshot at all")

    with pytest.raises(mujou.RecordingError, match="its snapshot does not read"):
        reproduce_failure(path, make_net())


def test_a_capsule_cut_before_its_failure_is_a_recording_error(
        files: dict[str, bytes], tmp_path: Any) -> None:
    data = files["capsule"]
    path = _write(tmp_path / "cut.mcap", data[:len(data) // 2])

    with pytest.raises(mujou.RecordingError, match="without its failure"):
        reproduce_failure(path, make_net())


def test_an_assert_replay_matches_of_a_damaged_golden_file_is_a_recording_error(
        files: dict[str, bytes], tmp_path: Any) -> None:
    data = bytearray(files["none"])
    data[len(data) // 2] ^= 1
    path = _write(tmp_path / "golden.mcap", bytes(data))

    with pytest.raises(mujou.RecordingError, match=os.path.basename(path)):
        mujou.testing.assert_replay_matches(path, loop_net())
