"""`mujou cat` and `mujou export-view`: a recording's messages as the view shows them.

The recording is the net of tests/nets/view_nets.py, 30 ms of simulated time,
recorded with ``Recording(view=True)``: ``src.count`` sends 0.0, 1.0, 2.0 at 10, 20
and 30 ms, ``src.wide`` 40 values (summarised by ``cat`` unless ``--full``).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest
from mcap.reader import make_reader

import mujou_actors as mujou
from mujou_actors.recording import mcapfile
from mujou_actors.recording.recview import export_view
from tests.nets.view_nets import make_net

pytestmark = pytest.mark.timeout(120)

MS = 1_000_000


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("recview") / "run.mcap")
    mujou.run(make_net(), timer="simulated", duration=0.03,
              record=mujou.Recording(path, view=True)).join()
    return path


def _mujou(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mujou_actors", *args], capture_output=True,
                          text=True, timeout=90)


def _views(path: str) -> list[tuple[str, int, bytes, str, bytes]]:
    """Every /view/ message of a file, read with the mcap package's reader."""
    with open(path, "rb") as f:
        return [(c.topic, m.log_time, m.data, s.name, s.data)
                for s, c, m in make_reader(f).iter_messages() if c.topic.startswith("/view/")]


def test_cat_prints_each_message_with_its_time_and_port_tensors_summarised(
        recording: str) -> None:
    result = _mujou("cat", recording)

    lines = result.stdout.splitlines()
    assert result.returncode == 0
    assert len(lines) == 15  # 5 ports, 3 messages each, in the order sent
    assert lines[0].split() == ["0.010000000", "src.count", "0.0"]
    assert lines[5].split(None, 2)[:2] == ["0.020000000", "src.count"]
    wide = json.loads(lines[2].split(None, 2)[2])
    assert wide == {"shape": [40], "dtype": "float64", "numel": 40, "min": 0.0, "max": 0.39,
                    "mean": pytest.approx(0.195)}
    assert json.loads(lines[13].split(None, 2)[2]) == {"force": 1.0, "step": 2}


@pytest.mark.slow
def test_cat_filters_by_port_and_globs_and_full_shows_every_value(recording: str) -> None:
    some = _mujou("cat", recording, "src.count", "src.p*")
    full = _mujou("cat", recording, "src.wide", "--full")

    assert [line.split()[1] for line in some.stdout.splitlines()] == \
        ["src.count", "src.pair"] * 3
    last = json.loads(full.stdout.splitlines()[-1].split(None, 2)[2])
    assert last["data"] == [2 + i / 100 for i in range(40)]


@pytest.mark.slow
def test_cat_json_is_one_object_a_line(recording: str) -> None:
    result = _mujou("cat", recording, "src.pair", "--json")

    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["t_ns"] for r in rows] == [10 * MS, 20 * MS, 30 * MS]
    assert [r["sequence"] for r in rows] == [0, 1, 2]
    assert rows[1] == {"t_ns": 20 * MS, "delta": 0, "topic": "src.pair", "sequence": 1,
                       "message": {"shape": [2], "dtype": "float64", "data": [1.0, 2.0]}}


@pytest.mark.parametrize(("make", "expected"), [
    (lambda tmp: str(tmp / "missing.mcap"), "missing.mcap: no such file (expected a recording"),
    (lambda tmp: _write(tmp / "a.txt", b"hello world"),
     "RecordingError: {path}: not an MCAP file"),
    (lambda tmp: _other_profile(tmp / "ros.mcap"),
     "RecordingError: {path}: an MCAP file of profile 'ros2', not a mujou recording"),
])
@pytest.mark.slow
def test_cat_of_what_is_no_recording_is_one_line_naming_it_and_exit_2(
        tmp_path: pathlib.Path, make: Any, expected: str) -> None:
    path = make(tmp_path)

    result = _mujou("cat", path)

    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error: ")
    assert expected.format(path=path) in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.slow
def test_cat_of_an_unknown_port_names_it_and_lists_the_channels(recording: str) -> None:
    result = _mujou("cat", recording, "src.count", "sim.*")

    assert result.returncode == 2
    assert result.stderr == (f"error: {recording} has no channel 'sim.*'; its channels: "
                             "src.count, src.pair, src.wide, src.command, src.image\n")


def _write(path: pathlib.Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _other_profile(path: pathlib.Path) -> str:
    from mcap.writer import Writer

    with open(path, "wb") as f:
        writer = Writer(f)
        writer.start(profile="ros2", library="test")
        schema = writer.register_schema("s", "jsonschema", b"{}")
        channel = writer.register_channel("t", "json", schema)
        writer.add_message(channel, 1, b"{}", 1)
        writer.finish()
    return str(path)


@pytest.mark.slow
def test_export_view_writes_what_record_view_wrote_byte_for_byte(
        recording: str, tmp_path: pathlib.Path) -> None:
    out = str(tmp_path / "view.mcap")

    result = _mujou("export-view", recording, out)

    recorded, exported = _views(recording), _views(out)
    assert result.returncode == 0
    assert result.stderr == f"wrote 5 view channel(s), 15 messages to {out}\n"
    assert len(exported) == 15 == mcapfile.info(recording).messages
    assert sorted(exported) == sorted(recorded)  # topics, times, data and schemas
    topics = {t for t, *_ in exported}
    assert topics == {"/view/src.count", "/view/src.pair", "/view/src.wide",
                      "/view/src.command", "/view/src.image"}
    commands = [json.loads(d) for t, _, d, _, _ in exported if t == "/view/src.command"]
    assert commands[1] == {"force": 0.5, "step": 1}
    assert {s for t, _, _, s, _ in exported if t == "/view/src.image"} == {"foxglove.RawImage"}


def test_export_view_of_a_recording_without_views_counts_each_channels_messages(
        tmp_path: pathlib.Path) -> None:
    source = str(tmp_path / "plain.mcap")
    mujou.run(make_net(), timer="simulated", duration=0.05, record=source).join()

    done = export_view(source, tmp_path / "view.mcap")

    found = mcapfile.info(done.path)
    assert done.messages == {c.topic: c.count for c in mcapfile.info(source).channels}
    assert done.messages["src.count"] == 5
    assert [(v.view_of, v.count) for v in found.views] == list(done.messages.items())
    assert found.channels == []
    values = [v["value"] for of, _, _, v in mcapfile.Reader(done.path).views()
              if of == "src.count"]
    assert values == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.slow
def test_export_view_refuses_to_overwrite_its_source_and_a_bad_source(
        recording: str, tmp_path: pathlib.Path) -> None:
    same = _mujou("export-view", recording, recording)
    bad = _mujou("export-view", _write(tmp_path / "x.mcap", b"nope"), str(tmp_path / "o.mcap"))

    assert same.returncode == 2 and "is the recording itself" in same.stderr
    assert bad.returncode == 2 and "not an MCAP file" in bad.stderr
    assert not (tmp_path / "o.mcap").exists()
