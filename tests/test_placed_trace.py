"""Traces of placed runs: one file, a process per group, arrows across processes.

The groups are served in this process (`InProcessSystem`, as in
tests/test_placed.py): the data plane still crosses ZeroMQ sockets and every
group records into its own buffer, which the host takes over the control
requests' pickling. `PidSystem` gives each group a pid of its own, as real
processes have; the last test runs real ones where the control plane exists.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import pathlib
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

import mujou_actors as mujou
from mujou_actors._runtime.build import Seams
from mujou_actors._runtime.kernel import Kernel
from mujou_actors.distributed import placed, tracing
from mujou_actors.run import _check_arguments
from mujou_actors.trace import IN, OUT, SLICE, unpack_records
from tests import placed_support
from tests.placed_support import InProcessSystem, make_net
from tests.test_trace import EPS, slices, timed

pytestmark = pytest.mark.timeout(60)


class PidSystem(InProcessSystem):
    """`InProcessSystem` that reports a pid of its own for each group (`PIDS`)."""

    PIDS = {"physics": 70001, "control": 70002, "a": 70003, "b": 70004}

    def start_group(self, group: str, target: str, kwargs: dict[str, Any],
                    timeout: float) -> int:
        super().start_group(group, target, kwargs, timeout)
        return self.PIDS[group]


class BadStart(mujou.Node):
    """Raises in ``on_start``."""

    def __init__(self) -> None:
        super().__init__(period=0.01)

    def on_start(self) -> None:
        raise RuntimeError("no start")


def make_bad_start() -> dict[str, mujou.Node]:
    """sim -> ctrl -> log, and a node whose on_start raises."""
    return {**make_net(), "bad": BadStart()}


def traced(placement: dict[str, str], path: pathlib.Path, *, duration: float | None = 0.1,
           timer: str = "simulated", workers: int = 1, factory: Any = make_net,
           trace: Any = None, supervisor: mujou.Supervisor | None = None,
           system: Any = PidSystem) -> placed.PlacedRun:
    """A traced placed run (groups served in this process), started."""
    args = _check_arguments(Seams(), workers=workers, timer=timer, duration=duration, seed=7,
                            state=None, supervisor=supervisor,
                            trace=path if trace is None else trace, cuda_sync="block",
                            stats=True, stop_timeout=10.0, start_timeout=60.0)
    return placed.start(factory, placement=mujou.Placement(placement), args=args, inputs=None,
                        state=None, make_system=system)


def load(path: pathlib.Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def processes(doc: dict[str, Any]) -> dict[str, int]:
    """Each process's name -> its pid in the file."""
    return {e["args"]["name"]: e["pid"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name"}


def threads(doc: dict[str, Any]) -> dict[tuple[int, int], str]:
    """(pid, tid) -> thread name."""
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def enclosing(doc: dict[str, Any], event: dict[str, Any]) -> list[dict[str, Any]]:
    """The slices on the event's track (its pid and tid) that contain its timestamp."""
    return [x for x in slices(doc) if (x["pid"], x["tid"]) == (event["pid"], event["tid"])
            and x["ts"] - EPS <= event["ts"] <= x["ts"] + x["dur"] + EPS]


def arrows(doc: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each flow's start and end (every start has one end, and the reverse)."""
    starts = [e for e in timed(doc) if e["ph"] == "s"]
    ends = {e["id"]: e for e in timed(doc) if e["ph"] == "f"}
    assert len(ends) == len([e for e in timed(doc) if e["ph"] == "f"])  # ids are unique
    assert len({s["id"] for s in starts}) == len(starts)
    assert {s["id"] for s in starts} == set(ends)
    return [(s, ends[s["id"]]) for s in starts]


# ---------------------------------------------------------------------------
# The file


def test_a_placed_run_writes_one_file_with_a_process_per_group_named_with_its_pid(
        tmp_path) -> None:
    path = tmp_path / "t.json"
    run = traced({"sim": "physics", "ctrl": "control"}, path)

    run.join(30)

    doc = load(path)
    assert set(doc) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert processes(doc) == {"host": os.getpid(), "group physics": 70001,
                              "group control": 70002}
    order = {e["pid"]: e["args"]["sort_index"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_sort_index"}
    assert order[os.getpid()] == 0 and {order[70001], order[70002]} == {1, 2}  # the host first
    other = doc["otherData"]
    assert other["groups"] == {"physics": {"pid": 70001, "nodes": ["sim"]},
                               "control": {"pid": 70002, "nodes": ["ctrl"]},
                               "host": {"pid": os.getpid(), "nodes": ["log"]}}
    assert other["events"] == len(timed(doc)) and other["missing"] == []
    assert other["share"] == 1_000_000 // 3 and other["oldest_dropped"] is False
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # no temporary file left


@pytest.mark.parametrize("workers", [1, 2])
def test_every_nodes_hooks_are_slices_on_its_groups_worker_tracks(tmp_path, workers) -> None:
    path = tmp_path / "t.json"
    traced({"sim": "physics", "ctrl": "control"}, path, workers=workers).join(30)

    doc = load(path)
    pids = processes(doc)
    names = threads(doc)
    counts = Counter((x["pid"], x["name"]) for x in slices(doc))

    # sim ticks 10 times; ctrl reads each tick; log each tick and each command.
    assert counts == {
        (pids["group physics"], "sim.on_start"): 1, (pids["group physics"], "sim.on_update"): 10,
        (pids["group physics"], "sim.on_stop"): 1,
        (pids["group control"], "ctrl.on_start"): 1,
        (pids["group control"], "ctrl.on_update"): 10,
        (pids["group control"], "ctrl.on_stop"): 1,
        (pids["host"], "log.on_start"): 1, (pids["host"], "log.on_update"): 20,
        (pids["host"], "log.on_stop"): 1}
    assert sorted(x["args"]["t_ns"] for x in slices(doc) if x["name"] == "sim.on_update") == [
        k * 10_000_000 for k in range(1, 11)]
    workers_of = {pid: {n for (p, _), n in names.items() if p == pid} for pid in pids.values()}
    for pid, named in workers_of.items():  # each process has its own workers' tracks
        assert {f"mujou-worker-{i}" for i in range(workers)} <= named, pid
    for x in slices(doc):
        if x["name"].endswith("on_update"):
            assert names[x["pid"], x["tid"]].startswith("mujou-worker-")
    counters = [e for e in timed(doc) if e["ph"] == "C"]
    assert Counter(c["pid"] for c in counters) == Counter(x["pid"] for x in slices(doc))


def test_messages_between_groups_have_arrows_that_bind_across_processes(tmp_path) -> None:
    path = tmp_path / "t.json"
    traced({"sim": "physics", "ctrl": "control"}, path).join(30)

    doc = load(path)
    pids = processes(doc)
    pairs = arrows(doc)

    route = Counter((s["pid"], f["pid"], s["name"], s["args"]["to"]) for s, f in pairs)
    assert route == {(pids["group physics"], pids["group control"], "sim.out", "ctrl.obs"): 10,
                     (pids["group physics"], pids["host"], "sim.out", "log.obs"): 10,
                     (pids["group control"], pids["host"], "ctrl.cmd", "log.cmd"): 10}
    for s, f in pairs:
        assert s["pid"] != f["pid"]
        assert (s["cat"], s["name"]) == (f["cat"], f["name"]) and s["cat"] == "message"
        assert f["bp"] == "e"
        sender = s["name"].split(".")[0]
        reader = s["args"]["to"].split(".")[0]
        assert [x["name"] for x in enclosing(doc, s)] == [f"{sender}.on_update"]
        readers = enclosing(doc, f)
        assert [x["name"] for x in readers] == [f"{reader}.on_update"]
        assert f["ts"] - readers[0]["ts"] <= 0.001 + EPS  # at the start of the reader's slice
        # the same instant at both ends (simulated time: a delta cycle later)
        assert readers[0]["args"]["t_ns"] == enclosing(doc, s)[0]["args"]["t_ns"]
        assert readers[0]["args"]["delta"] == enclosing(doc, s)[0]["args"]["delta"] + 1
        assert f["ts"] >= s["ts"]  # one clock for every process


def test_arrows_within_a_group_stay_in_its_process(tmp_path) -> None:
    path = tmp_path / "t.json"
    traced({"sim": "physics", "ctrl": "physics"}, path).join(30)

    doc = load(path)
    pids = processes(doc)
    route = Counter((s["pid"], f["pid"], s["name"]) for s, f in arrows(doc))

    assert route == {(pids["group physics"], pids["group physics"], "sim.out"): 10,
                     (pids["group physics"], pids["host"], "sim.out"): 10,
                     (pids["group physics"], pids["host"], "ctrl.cmd"): 10}


def test_groups_served_in_one_process_get_distinct_pids_in_the_file(tmp_path) -> None:
    path = tmp_path / "t.json"
    traced({"sim": "a", "ctrl": "b", "log": "c"}, path, system=InProcessSystem).join(30)

    doc = load(path)
    pids = processes(doc)

    assert set(pids) == {"group a", "group b", "group c"}  # no host: it runs no node
    assert pids["group a"] == os.getpid() and len(set(pids.values())) == 3
    labels = {e["pid"]: e["args"]["labels"] for e in doc["traceEvents"]
              if e["ph"] == "M" and e["name"] == "process_labels"}
    assert set(labels.values()) == {f"pid {os.getpid()}"}  # the real one, shown
    assert len(arrows(doc)) == 30


def test_a_real_time_placed_run_is_traced_with_arrows_across_processes(tmp_path) -> None:
    path = tmp_path / "t.json"
    traced({"sim": "physics", "ctrl": "control"}, path, timer="realtime", duration=0.1).join(30)

    doc = load(path)
    pids = processes(doc)
    pairs = arrows(doc)
    ticks = sum(x["name"] == "sim.on_update" for x in slices(doc))

    assert doc["otherData"]["timer"] == "realtime" and ticks >= 3
    assert {(s["pid"], f["pid"]) for s, f in pairs} == {
        (pids["group physics"], pids["group control"]), (pids["group physics"], pids["host"]),
        (pids["group control"], pids["host"])}
    for s, f in pairs:
        assert [x["name"] for x in enclosing(doc, f)] == [f"{s['args']['to'].split('.')[0]}"
                                                          ".on_update"]


# ---------------------------------------------------------------------------
# The buffers, failures, restarts


def test_the_capacity_is_split_between_the_processes_and_each_keeps_its_newest(
        tmp_path) -> None:
    path = tmp_path / "t.json"
    traced({"sim": "physics", "ctrl": "control"}, path,
           trace=mujou.Tracer(path, capacity=60)).join(30)

    doc = load(path)
    per_process = Counter(e["pid"] for e in timed(doc))

    assert doc["otherData"]["share"] == 20 and doc["otherData"]["oldest_dropped"] is True
    assert len(per_process) == 3 and all(n <= 20 for n in per_process.values())
    assert len(timed(doc)) <= 60
    assert not any(x["name"].endswith("on_start") for x in slices(doc))
    assert {x["name"] for x in slices(doc) if x["name"].endswith("on_stop")} == {
        "sim.on_stop", "ctrl.on_stop", "log.on_stop"}
    for s, f in arrows(doc):  # every arrow kept has both its ends and their slices
        assert len(enclosing(doc, s)) == len(enclosing(doc, f)) == 1


def test_a_failing_placed_run_still_writes_its_trace_with_a_marker_in_the_groups_process(
        tmp_path) -> None:
    placed_support.Flaky.failures = 0
    path = tmp_path / "t.json"
    run = traced({"flaky": "a"}, path, factory=placed_support.make_flaky, duration=1.0)

    with pytest.raises(mujou.NodeError, match="flaky at tick 5"):
        run.join(30)

    doc = load(path)
    marks = [e for e in timed(doc) if e["ph"] == "i"]
    assert [(m["pid"], m["name"]) for m in marks] == [
        (processes(doc)["group a"], "flaky.on_update raised RuntimeError")]
    assert marks[0]["args"] == {"error": "flaky at tick 5"}
    assert sum(x["name"] == "flaky.on_update" for x in slices(doc)) == 5


def test_a_restarted_group_keeps_what_its_first_kernel_recorded(tmp_path) -> None:
    placed_support.Flaky.failures = 0
    path = tmp_path / "t.json"
    supervisor = mujou.Supervisor("one_for_all", snapshot_every=0.03)
    traced({"flaky": "a"}, path, factory=placed_support.make_flaky,
           supervisor=supervisor).join(30)

    doc = load(path)
    pids = processes(doc)
    counts = Counter((x["pid"], x["name"]) for x in slices(doc))

    # on_start before and after the rewind; ticks 1-5 (5 raised), then 4-10 from t=0.03
    assert counts[pids["group a"], "flaky.on_start"] == 2
    assert counts[pids["host"], "count.on_start"] == 2
    assert counts[pids["group a"], "flaky.on_update"] == 5 + 7
    ticks = [x["args"]["t_ns"] // 10_000_000 for x in slices(doc)
             if x["name"] == "flaky.on_update"]
    assert sorted(ticks) == sorted([1, 2, 3, 4, 5] + list(range(4, 11)))
    # every tick of flaky that reached count has its arrow, before and after the rewind
    flaky = [(s, f) for s, f in arrows(doc) if s["name"] == "flaky.out"]
    assert len(flaky) == 4 + 7 and all(f["pid"] == pids["host"] for _, f in flaky)


def test_a_group_on_another_machine_is_shifted_onto_the_hosts_clock_by_its_offset(
        tmp_path) -> None:
    """The same records written twice: as on one machine, and with group control on a
    machine whose clock is 5 ms behind the host's (a fake offset, ± 0.25 ms): each of its
    events moves 5 ms later against the others', and its label and the file say so."""
    run = traced({"sim": "physics", "ctrl": "control"}, tmp_path / "t.json")
    run.join(30)
    servers = run._driver.system.servers
    parts = {name: servers[name]._traces.take() for name in ("physics", "control")}
    groups = [SimpleNamespace(name="physics", pid=70001, remote=True),
              SimpleNamespace(name="control", pid=70002, remote=True)]

    def write(name: str, clocks: dict[str, tracing.Clock]) -> dict[str, Any]:
        trace = tracing.PlacedTrace(mujou.Tracer(tmp_path / name), 2)
        other = {"groups": {g.name: {"pid": g.pid} for g in groups}}
        tracing.write_placed(trace, groups, lambda g: parts[g.name], other, clocks)
        return load(tmp_path / name)

    plain = write("plain.json", {})
    shifted = write("shifted.json", {"control": tracing.Clock("gpu-box", -5_000_000, 250_000)})
    unknown = write("unknown.json", {"control": tracing.Clock("gpu-box", None, None)})

    def moves(pid: int, doc: dict[str, Any]) -> set[float]:
        before = [e["ts"] for e in timed(plain) if e["pid"] == pid]
        after = [e["ts"] for e in timed(doc) if e["pid"] == pid]
        assert len(before) == len(after) > 10
        return {round(b - a, 3) for a, b in zip(before, after, strict=True)}

    physics, control = moves(70001, shifted), moves(70002, shifted)
    assert len(physics) == len(control) == 1  # each process moves as a whole
    assert control.pop() - physics.pop() == pytest.approx(5_000.0)  # µs
    assert moves(70001, unknown) == moves(70002, unknown) == {0.0}  # not known: as recorded
    labels = {e["pid"]: e["args"]["labels"] for e in shifted["traceEvents"]
              if e["ph"] == "M" and e["name"] == "process_labels"}
    assert labels == {70001: "pid 70001", 70002: "pid 70002, machine gpu-box, clock shifted "
                                                 "by +5000.0 \u00b1 250.0 us onto the host's"}
    assert shifted["otherData"]["groups"]["control"] == {
        "pid": 70002, "machine": "gpu-box", "clock_offset_ns": -5_000_000,
        "clock_uncertainty_ns": 250_000}
    assert shifted["otherData"]["groups"]["physics"] == {"pid": 70001}
    assert "offset unknown" in [e["args"]["labels"] for e in unknown["traceEvents"]
                                if e.get("name") == "process_labels" and e["pid"] == 70002][0]


def test_a_placed_run_whose_on_start_fails_still_writes_its_trace(tmp_path) -> None:
    path = tmp_path / "t.json"

    with pytest.raises(mujou.NodeError, match="no start"):
        traced({"bad": "b"}, path, factory=make_bad_start)

    doc = load(path)
    assert [(x["pid"], x["name"]) for x in slices(doc) if x["name"].startswith("bad.")] == [
        (processes(doc)["group b"], "bad.on_start")]


def test_a_placed_trace_that_cannot_be_written_at_the_end_makes_join_raise_the_os_error(
        tmp_path, caplog) -> None:
    taken = tmp_path / "taken"
    run = traced({"sim": "physics"}, taken, duration=None)  # fine as the run starts
    taken.mkdir()
    (taken / "x").write_text("")  # now a folder that os.replace cannot replace

    with caplog.at_level(logging.ERROR, logger="mujou_actors"):
        run.stop()
        with pytest.raises(OSError):
            run.join(30)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no .tmp left behind
    # Said once: raised, not logged as well (docs/cli.md).
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_placed_trace_that_cannot_be_written_after_a_failure_is_logged_once(
        tmp_path, caplog) -> None:
    placed_support.Flaky.failures = 0  # it fails once a session: this test's is its own
    taken = tmp_path / "taken"
    run = traced({"flaky": "a", "sim": "b"}, taken, duration=None,
                 factory=placed_support.make_flaky)
    taken.mkdir()
    (taken / "x").write_text("")

    with caplog.at_level(logging.ERROR, logger="mujou_actors"):
        with pytest.raises(mujou.NodeError, match="flaky"):
            run.join(30)

    logged = [r.getMessage() for r in caplog.records
              if r.levelno >= logging.ERROR and "trace file" in r.getMessage()]
    assert len(logged) == 1
    assert logged[0].startswith(f"could not write the trace file {taken}: ")


def test_a_placed_trace_path_that_cannot_be_written_is_refused_before_anything_starts(
        unwritable_folder) -> None:
    with pytest.raises(PermissionError, match="mujou.run: trace file"):
        mujou.run(placed_support.make_net, placement={"sim": "physics"}, timer="simulated",
                  duration=0.1, trace=unwritable_folder / "t.json")


# ---------------------------------------------------------------------------
# The kernel's recording


def test_an_untraced_kernel_records_nothing() -> None:
    with Kernel(make_net(), ["sim"]) as k:
        assert k.recorder is None and k.trace_part() is None
        assert all(a.trace is None for a in k.actors) and k.dispatcher.trace is None


def test_a_traced_kernel_records_its_hooks_and_both_ends_of_messages_across_kernels() -> None:
    net = make_net()
    with Kernel(net, ["sim"], trace=1000) as sim, Kernel(net, ["ctrl", "log"], trace=1000) as rest:
        sim.start()
        rest.start()
        for _ in range(3):
            sim.step(until=(sim.next_due()[0], 2**32 - 1))
            for s in sim.take_sends():
                for reader in ("ctrl.obs", "log.obs"):
                    rest.deliver(reader, s.message, s.t_ns, s.delta, s.sender)
            rest.step(until=(sim.time_ns, 2**32 - 1))
        sent, got = sim.trace_part(), rest.trace_part()

    assert sent is not None and got is not None
    out = [r for r in unpack_records(sent["records"]) if r[0] == OUT]
    arrived = [r for r in unpack_records(got["records"]) if r[0] == IN]
    updates = [r for r in unpack_records(sent["records"]) if r[0] == SLICE and r[4] == 1]
    assert len(updates) == 3
    # one flow start per outside reader and send; each names the send's (sender, t_ns, delta)
    assert sorted((sent["ports"][r[5]], r[3], r[7], r[8]) for r in out) == sorted(
        (reader, 0, t, 0) for reader in ("ctrl.obs", "log.obs")
        for t in (10_000_000, 20_000_000, 30_000_000))
    assert sorted((got["ports"][r[5]], r[6], r[7], r[8]) for r in arrived) == sorted(
        (sent["ports"][r[5]], r[3], r[7], r[8]) for r in out)
    assert sent["pid"] == os.getpid() and "mujou-worker-0" in sent["tracks"]


def test_a_kernel_checks_its_trace_capacity() -> None:
    with pytest.raises(ValueError, match="trace"):
        Kernel(make_net(), ["sim"], trace=0)
    with pytest.raises(TypeError, match="trace"):
        Kernel(make_net(), ["sim"], trace="big")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Real processes


@pytest.mark.timeout(180)
@pytest.mark.skipif(importlib.util.find_spec("mujou_actors.distributed.system") is None,
                    reason="the control plane lands separately")
def test_groups_in_real_processes_are_traced_on_one_clock(tmp_path) -> None:
    path = tmp_path / "t.json"
    run = mujou.run(placed_support.make_net, placement={"sim": "physics", "ctrl": "control"},
                    timer="simulated", duration=0.1, seed=7, trace=path)
    stats = run.stats()
    run.join(60)

    doc = load(path)
    pids = processes(doc)
    assert pids == {"host": os.getpid(), "group physics": stats.groups["physics"].pid,
                    "group control": stats.groups["control"].pid}
    assert len(set(pids.values())) == 3
    pairs = arrows(doc)
    assert len(pairs) == 30 and all(s["pid"] != f["pid"] for s, f in pairs)
    assert all(f["ts"] >= s["ts"] for s, f in pairs)  # CLOCK_MONOTONIC, shared
