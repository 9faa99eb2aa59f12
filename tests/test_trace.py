"""Trace files: Chrome trace events of every hook, flows from sends to reads, the ring buffer."""

from __future__ import annotations

import json
import logging
import pathlib
import re
from collections import defaultdict
from typing import Any

import pytest

import mujou_actors as mujou
from tests.conftest import Collector, Source

EPS = 1e-6  # µs: timestamps are written with ns precision, read back as floats


class Net(mujou.Node):
    """A source on the pool and one on a dedicated thread, both read by a triggered collector."""

    def __init__(self) -> None:
        super().__init__(period=None)
        self.src = Source(period=0.01)
        self.cam = Source(period=0.02, dedicated_thread=True)
        self.col = Collector()
        mujou.connect(self.src.out, self.col.inp)
        mujou.connect(self.cam.out, self.col.inp)


class Failing(mujou.Node):
    """Raises in its third update."""

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == 3:
            raise ValueError("third update")


def traced_run(tmp_path: pathlib.Path, workers: int = 1, duration: float = 0.1,
               trace: Any = None, net: mujou.Node | None = None, **kw: Any) -> dict[str, Any]:
    """Run ``net`` (default `Net`) traced under the simulated timer; the parsed file."""
    trace = tmp_path / "trace.json" if trace is None else trace
    mujou.run(net or Net(), workers=workers, timer="simulated", duration=duration,
              trace=trace, **kw).join()
    return json.loads(pathlib.Path(getattr(trace, "path", trace)).read_text())


def timed(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every event but the metadata."""
    return [e for e in doc["traceEvents"] if e["ph"] != "M"]


def slices(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def thread_names(doc: dict[str, Any]) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def enclosing(doc: dict[str, Any], event: dict[str, Any]) -> list[dict[str, Any]]:
    """The slices on the event's track that contain its timestamp."""
    return [x for x in slices(doc) if x["tid"] == event["tid"]
            and x["ts"] - EPS <= event["ts"] <= x["ts"] + x["dur"] + EPS]


# ---------------------------------------------------------------------------
# The file


def test_a_traced_run_writes_a_json_object_with_the_trace_event_keys(tmp_path) -> None:
    doc = traced_run(tmp_path)

    assert set(doc) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert doc["displayTimeUnit"] == "ms"
    assert doc["otherData"]["timer"] == "simulated"
    assert doc["otherData"]["capacity"] == mujou.Tracer("x").capacity == 1_000_000
    assert doc["otherData"]["events"] == len(timed(doc))
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]  # no temporary file left


def test_every_event_has_ph_pid_tid_and_ts_and_every_slice_a_duration(tmp_path) -> None:
    doc = traced_run(tmp_path)

    events = doc["traceEvents"]

    assert events
    for e in events:
        assert {"ph", "pid", "tid", "ts"} <= set(e), e
        assert e["pid"] == 1
        assert isinstance(e["tid"], int)
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
    for x in slices(doc):
        assert x["dur"] >= 0 and x["cat"] == "hook"
    assert {e["ph"] for e in events} == {"M", "X", "C", "s", "f"}


def test_slices_are_named_by_node_path_and_hook(tmp_path) -> None:
    doc = traced_run(tmp_path)

    names = {x["name"] for x in slices(doc)}

    assert names == {f"{node}.{hook}" for node in ("<root>", "src", "cam", "col")
                     for hook in ("on_start", "on_update", "on_stop")} - {"<root>.on_update"}


def test_update_slices_carry_the_run_time_the_delta_cycle_and_dt(tmp_path) -> None:
    doc = traced_run(tmp_path)

    src = [x["args"] for x in slices(doc) if x["name"] == "src.on_update"]
    col = [x["args"] for x in slices(doc) if x["name"] == "col.on_update"]
    start = [x["args"] for x in slices(doc) if x["name"] == "src.on_start"]

    assert sorted(a["t_ns"] for a in src) == [k * 10_000_000 for k in range(1, 11)]
    assert all(a["delta"] == 0 and a["dt"] == pytest.approx(0.01) for a in src)
    assert all(a["delta"] == 1 for a in col)
    assert start == [{}]


def test_one_track_per_worker_and_per_dedicated_thread_with_their_names(tmp_path,
                                                                          workers) -> None:
    doc = traced_run(tmp_path, workers=workers)

    names = thread_names(doc)
    used = {e["tid"] for e in timed(doc)}

    expected = {f"mujou-worker-{i}" for i in range(workers)} | {"mujou-node-cam"}
    # on_stop may also run on a helper of the stop phase (see docs/threads.md)
    helpers = {n for n in names.values() if n.startswith("mujou-helper-")}
    assert expected <= set(names.values()) <= expected | helpers
    assert len(names) == len(set(names.values()))  # one tid per thread
    assert used <= set(names)
    assert all(names[x["tid"]] == "mujou-node-cam" for x in slices(doc)
               if x["name"] == "cam.on_update")
    assert any(e["name"] == "process_name" for e in doc["traceEvents"] if e["ph"] == "M")


def test_on_each_track_slices_do_not_overlap_and_time_only_moves_on(tmp_path,
                                                                     workers) -> None:
    doc = traced_run(tmp_path, workers=workers)

    by_tid: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in timed(doc):
        by_tid[e["tid"]].append(e)

    for events in by_tid.values():
        stamps = [e["ts"] for e in events]
        assert stamps == sorted(stamps)
        xs = [e for e in events if e["ph"] == "X"]
        for a, b in zip(xs, xs[1:], strict=False):
            assert a["ts"] + a["dur"] <= b["ts"] + EPS, (a, b)


def test_each_send_has_an_arrow_that_ends_in_the_slice_of_the_update_that_read_it(
        tmp_path, workers) -> None:
    doc = traced_run(tmp_path, workers=workers, inputs={"col.inp": -1})  # a host write: no arrow

    starts = {e["id"]: e for e in timed(doc) if e["ph"] == "s"}
    ends = {e["id"]: e for e in timed(doc) if e["ph"] == "f"}

    # src sends 10 times, cam 5 times; the collector reads every message by the end.
    assert len(starts) == 15
    assert set(starts) == set(ends)
    for fid, s in starts.items():
        f = ends[fid]
        assert (s["cat"], s["name"]) == (f["cat"], f["name"]) == ("message", s["name"])
        assert s["name"] in ("src.out", "cam.out")
        assert s["args"] == {"to": "col.inp"}
        assert [x["name"] for x in enclosing(doc, s)] == [s["name"].replace("out", "on_update")]
        assert f["bp"] == "e"
        readers = enclosing(doc, f)
        assert [x["name"] for x in readers] == ["col.on_update"]
        assert f["ts"] - readers[0]["ts"] <= 0.001 + EPS  # at the start of the reader's slice
        assert f["ts"] >= s["ts"]


def test_counters_sample_the_dispatcher_queues_as_each_hook_starts(tmp_path) -> None:
    doc = traced_run(tmp_path)

    counters = [e for e in timed(doc) if e["ph"] == "C"]

    assert len(counters) == len(slices(doc))
    assert {c["name"] for c in counters} == {"dispatcher"}
    assert all(set(c["args"]) == {"ready", "in_flight"} for c in counters)
    assert all(c["args"]["in_flight"] >= 1 and c["args"]["ready"] >= 0 for c in counters)
    assert sorted(c["ts"] for c in counters) == sorted(x["ts"] for x in slices(doc))


# ---------------------------------------------------------------------------
# The ring buffer


def test_the_ring_buffer_keeps_only_the_newest_events(tmp_path) -> None:
    full = traced_run(tmp_path)
    tiny = traced_run(tmp_path, trace=mujou.Tracer(tmp_path / "tiny.json", capacity=40))

    def updates(doc: dict[str, Any]) -> list[tuple[str, int]]:
        return [(x["name"], x["args"]["t_ns"]) for x in slices(doc) if "t_ns" in x["args"]]

    kept = updates(tiny)

    assert len(timed(tiny)) <= 40
    assert tiny["otherData"]["oldest_dropped"] is True
    assert not any(x["name"].endswith("on_start") for x in slices(tiny))
    assert {x["name"] for x in slices(tiny) if x["name"].endswith("on_stop")} == {
        "<root>.on_stop", "src.on_stop", "cam.on_stop", "col.on_stop"}
    dropped = set(updates(full)) - set(kept)
    assert kept and dropped and set(kept) <= set(updates(full))
    # The newest: no dropped update is later than a kept one (those of one instant
    # may run in either order on the worker and the dedicated thread).
    assert max(t for _, t in dropped) <= min(t for _, t in kept)


def test_with_a_capacity_of_one_the_file_holds_at_most_one_event(tmp_path) -> None:
    path = tmp_path / "t.json"

    mujou.run(Net(), timer="simulated", duration=0.05, trace=mujou.Tracer(path, 1)).join()

    assert len(timed(json.loads(path.read_text()))) <= 1


def test_flows_that_lost_an_end_to_the_ring_buffer_are_left_out(tmp_path) -> None:
    path = tmp_path / "t.json"

    for capacity in (5, 17, 33, 61):
        mujou.run(Net(), timer="simulated", duration=0.1,
                  trace=mujou.Tracer(path, capacity)).join()
        doc = json.loads(path.read_text())

        starts = {e["id"] for e in timed(doc) if e["ph"] == "s"}
        ends = [e for e in timed(doc) if e["ph"] == "f"]
        assert starts == {e["id"] for e in ends}
        assert all(len(enclosing(doc, f)) == 1 for f in ends)


# ---------------------------------------------------------------------------
# Arguments, failures, no trace


def test_a_run_without_trace_writes_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)

    run = mujou.run(Net(), timer="simulated", duration=0.05)
    run.join()

    assert list(tmp_path.iterdir()) == []
    assert run._coordinator._trace is None
    assert all(a.trace is None for a in run._actors)


def test_trace_of_a_bad_type_raises_type_error_naming_the_argument() -> None:
    with pytest.raises(TypeError, match="trace"):
        mujou.run(Net(), timer="simulated", duration=0.01, trace=42)
    with pytest.raises(ValueError, match="trace"):
        mujou.run(Net(), timer="simulated", duration=0.01, trace="")


def test_the_tracer_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="path"):
        mujou.Tracer(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="capacity"):
        mujou.Tracer("t.json", capacity=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="capacity"):
        mujou.Tracer("t.json", capacity=0)

    tracer = mujou.Tracer(pathlib.Path("out") / "t.json", capacity=10)

    assert (tracer.path, tracer.capacity) == (pathlib.Path("out/t.json"), 10)
    assert repr(tracer) == "Tracer('out/t.json', capacity=10)"


def test_a_path_like_trace_creates_missing_folders(tmp_path) -> None:
    path = tmp_path / "a" / "b" / "t.json"

    mujou.run(Net(), timer="simulated", duration=0.02, trace=path).join()

    assert json.loads(path.read_text())["traceEvents"]


def test_a_failing_run_still_writes_its_trace_with_a_marker_where_the_hook_raised(
        tmp_path) -> None:
    path = tmp_path / "t.json"
    run = mujou.run(Failing(), timer="simulated", duration=1.0, trace=str(path))

    with pytest.raises(mujou.NodeError):
        run.join()

    doc = json.loads(path.read_text())
    marks = [e for e in timed(doc) if e["ph"] == "i"]
    assert [m["name"] for m in marks] == ["<root>.on_update raised ValueError"]
    assert marks[0]["args"] == {"error": "third update"}
    assert len(enclosing(doc, marks[0])) == 0  # right after the slice that raised
    assert [x["args"]["t_ns"] for x in slices(doc) if x["name"] == "<root>.on_update"] == [
        10_000_000, 20_000_000, 30_000_000]


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_trace_that_cannot_be_written_at_the_end_makes_join_raise_the_os_error(
        tmp_path, caplog) -> None:
    taken = tmp_path / "taken"
    run = mujou.run(Net(), timer="simulated", trace=taken)  # fine as the run starts
    taken.mkdir()
    (taken / "x").write_text("")  # now a folder that os.replace cannot replace

    with caplog.at_level(logging.ERROR, logger="mujou_actors"):
        run.stop()
        with pytest.raises(OSError):
            run.join()

    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no .tmp left behind
    assert _errors(caplog) == []  # said once: raised, not logged as well (docs/cli.md)


def test_a_trace_that_cannot_be_written_after_a_failure_is_logged_once(
        tmp_path, caplog) -> None:
    taken = tmp_path / "taken"
    run = mujou.run({"bad": Failing()}, timer="simulated", trace=taken)
    taken.mkdir()
    (taken / "x").write_text("")

    with caplog.at_level(logging.ERROR, logger="mujou_actors"):
        with pytest.raises(mujou.NodeError, match="third update"):
            run.join()

    # join() raises the node's failure: the file's is said by the log, once.
    logged = [m for m in _errors(caplog) if "trace file" in m]
    assert len(logged) == 1
    assert logged[0].startswith(f"could not write the trace file {taken}: ")
    assert logged[0].endswith("(join() raises the run's first failure, not this one)")


class Started(mujou.Node):
    """Counts its on_start calls."""

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.starts = 0

    def on_start(self) -> None:
        self.starts += 1


@pytest.mark.parametrize("make", [str, pathlib.Path, mujou.Tracer])
def test_a_trace_path_that_cannot_be_written_is_refused_before_anything_starts(
        unwritable_folder, make) -> None:
    path = unwritable_folder / "t.json"
    node = Started()

    with pytest.raises(PermissionError) as info:
        mujou.run(node, timer="simulated", duration=0.02, trace=make(path))

    assert str(info.value).startswith(f"mujou.run: trace file {str(path)!r} cannot be "
                                      f"written: the folder {str(unwritable_folder)!r}")
    assert node.starts == 0
    mujou.run(node, timer="simulated", duration=0.02).join()     # the node was not claimed
    assert node.starts == 1


def test_a_trace_path_that_is_a_folder_or_under_a_file_is_refused_naming_it(tmp_path) -> None:
    (tmp_path / "file").write_text("")

    with pytest.raises(IsADirectoryError,
                       match=re.escape(f"trace file {str(tmp_path)!r} is a folder")):
        mujou.run(Started(), timer="simulated", duration=0.02, trace=tmp_path)
    with pytest.raises(NotADirectoryError,
                       match=re.escape(f"{str(tmp_path / 'file')!r} is a file, not a folder")):
        mujou.run(Started(), timer="simulated", duration=0.02,
                  trace=tmp_path / "file" / "sub" / "t.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]   # no probe left behind


def test_checking_a_trace_path_leaves_missing_folders_to_the_end(tmp_path) -> None:
    path = tmp_path / "a" / "b" / "t.json"
    run = mujou.run(Net(), timer="simulated", trace=path)

    assert sorted(p.name for p in tmp_path.iterdir()) == []          # checked, not made
    run.stop()
    run.join()
    assert json.loads(path.read_text())["traceEvents"]


def test_a_run_whose_on_start_fails_still_writes_its_trace(tmp_path) -> None:
    class BadStart(mujou.Node):
        def on_start(self) -> None:
            raise RuntimeError("no start")

    path = tmp_path / "t.json"

    with pytest.raises(mujou.NodeError):
        mujou.run(BadStart(), timer="simulated", duration=1.0, trace=path)

    names = [x["name"] for x in slices(json.loads(path.read_text()))]
    assert names == ["<root>.on_start"]


def test_one_tracer_serves_runs_one_after_the_other(tmp_path) -> None:
    tracer = mujou.Tracer(tmp_path / "t.json")

    first = traced_run(tmp_path, trace=tracer, duration=0.05)
    second = traced_run(tmp_path, trace=tracer, duration=0.02)

    def count(doc: dict[str, Any]) -> int:
        return sum(x["name"] == "src.on_update" for x in slices(doc))

    assert (count(first), count(second)) == (5, 2)


def test_a_realtime_run_is_traced_too(tmp_path) -> None:
    path = tmp_path / "t.json"

    mujou.run(Net(), workers=2, duration=0.05, trace=path).join()

    doc = json.loads(path.read_text())
    assert doc["otherData"]["timer"] == "realtime"
    assert any(x["name"] == "src.on_update" for x in slices(doc))
    starts = {e["id"] for e in timed(doc) if e["ph"] == "s"}
    assert starts == {e["id"] for e in timed(doc) if e["ph"] == "f"}
