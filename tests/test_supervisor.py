"""The supervisor: snapshot schedule and files, restart strategies, crashes."""

from __future__ import annotations

import dataclasses
import errno
import gc
import importlib
import itertools
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import typing
import weakref

import pytest
import torch

import mujou_actors as mujou
from mujou_actors import snapshot
from mujou_actors._runtime.build import Seams
from mujou_actors.supervisor import SnapshotWriter
from tests.conftest import Counter
from tests.crashnet import Net as CrashNet
from tests.test_state import _equal

run_module = importlib.import_module("mujou_actors.run")  # mujou_actors.run is the function

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Flaky(mujou.Node):
    """Counts ticks in its state; raises at tick ``fail_at`` (once, or always)."""

    out = mujou.Output(int)

    def __init__(self, fail_at: int = -1, always: bool = False) -> None:
        super().__init__(period=0.01)
        self.count = torch.zeros((), dtype=torch.int64)
        self.fail_at, self.always, self.failed = fail_at, always, False
        self.starts = self.stops = 0

    def on_start(self) -> None:
        self.starts += 1

    def on_stop(self) -> None:
        self.stops += 1

    def on_update(self, dt: float) -> None:
        self.count += 1
        if int(self.count) == self.fail_at and (self.always or not self.failed):
            self.failed = True  # a Python attribute: not state, survives the restart
            raise RuntimeError("sensor glitch")
        self.out.send(int(self.count))


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        ({"restart": "rest_for_one"}, ValueError, "one_for_one"),
        ({"max_restarts": -1}, ValueError, "max_restarts"),
        ({"max_restarts": 1.5}, TypeError, "max_restarts"),
        ({"within": 0}, ValueError, "within"),
        ({"snapshot_every": float("inf")}, ValueError, "snapshot_every"),
        ({"snapshot_every": "1s"}, TypeError, "snapshot_every"),
        ({"keep": 0}, ValueError, "keep"),
        ({"keep": 2.5}, TypeError, "keep"),
        ({"restart": None}, TypeError, "restart"),
        ({"snapshot_every": 1e-12}, ValueError, "at least 1 ns"),
        ({"snapshot_dir": 5}, TypeError, "snapshot_dir"),
        ({"snapshot_dir": __file__}, ValueError, "is a file, not a folder"),
    ],
)
def test_bad_supervisor_settings_are_named(kwargs, error, text) -> None:
    with pytest.raises(error, match=text):
        mujou.Supervisor(**kwargs)


def test_one_for_one_restarts_only_the_failed_node_from_the_latest_snapshot(workers) -> None:
    flaky, steady = Flaky(fail_at=25), Flaky()
    sup = mujou.Supervisor("one_for_one", snapshot_every=0.1)

    run = mujou.run({"flaky": flaky, "steady": steady}, workers=workers, timer="simulated",
                    duration=0.5, supervisor=sup)
    run.join()
    stats = run.stats()

    # Failed at tick 25 (t = 0.25), restored to the snapshot of t = 0.2 (count 20),
    # then the ticks 0.26 ... 0.5 on the regular grid: 20 + 25.
    assert int(flaky.count) == 45
    assert (flaky.starts, flaky.stops) == (2, 2)
    assert stats.nodes["flaky"].restarts == 1 and stats.nodes["flaky"].updates == 50
    assert int(steady.count) == 50 and (steady.starts, steady.stops) == (1, 1)
    assert stats.nodes["steady"].restarts == 0


class Greeter(mujou.Node):
    """Sends a greeting from on_start and its update count; raises in its third update."""

    out = mujou.Output(str)

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.n = 0

    def on_start(self) -> None:
        self.out.send("hello")

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == 3:
            raise RuntimeError("third update")
        self.out.send(f"update {self.n}")


class Log(mujou.Node):
    """Triggered: records each batch of messages it drains."""

    inp = mujou.Input(str, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.seen: list[list[str]] = []

    def on_update(self, dt: float) -> None:
        self.seen.append(self.inp.drain())


@pytest.mark.parametrize("timer", ["simulated", "realtime"])
def test_messages_sent_by_a_restarted_nodes_on_start_reach_their_reader(timer, workers) -> None:
    # They used to carry the control key: the reader's trigger then sorted
    # before the run's time (simulated: never ran) or was taken for a control
    # envelope (real time: the worker thread died).
    src, log = Greeter(), Log()
    mujou.connect(src.out, log.inp)

    # In real time the run goes on until an update after the restart was sent, not for a
    # duration: a loaded machine skips ticks as overruns, maybe the failing third.
    with mujou.run([src, log], timer=timer, duration=0.06 if timer == "simulated" else None,
                   workers=workers, supervisor=mujou.Supervisor("one_for_one")) as run:
        if timer == "realtime":
            run.wait_for("0.out", lambda m: m.startswith("update ") and int(m[7:]) >= 4,
                         timeout=30)
        else:
            run.join()
    run.join()
    received = [m for batch in log.seen for m in batch]

    assert run.stats().nodes["0"].restarts == 1
    assert received[:5] == ["hello", "update 1", "update 2", "hello", "update 4"]
    assert received[5:] == [f"update {n}" for n in range(5, len(received))]
    if timer == "simulated":  # each message triggers its own update, right after its send
        assert log.seen == [["hello"], ["update 1"], ["update 2"], ["hello"], ["update 4"],
                            ["update 5"], ["update 6"]]


def test_one_for_all_restores_the_net_and_rewinds_simulated_time() -> None:
    flaky, steady = Flaky(fail_at=25), Flaky()
    sup = mujou.Supervisor("one_for_all", snapshot_every=0.1)

    run = mujou.run({"flaky": flaky, "steady": steady}, timer="simulated", duration=0.5,
                    supervisor=sup)
    run.join()
    stats = run.stats()

    # Both rewound to t = 0.2 and ran to 0.5 again: the state is as if never failed.
    assert int(flaky.count) == 50 and int(steady.count) == 50
    assert (steady.starts, steady.stops) == (2, 2)
    assert stats.nodes["steady"].updates == 25 + 30
    assert stats.nodes["flaky"].restarts == stats.nodes["steady"].restarts == 1
    assert run.time == 0.5


def test_a_node_that_always_fails_escalates_after_max_restarts(caplog) -> None:
    node = Flaky(fail_at=5, always=True)
    sup = mujou.Supervisor("one_for_one", max_restarts=2, within=10.0, snapshot_every=0.1)

    run = mujou.run({"n": node}, timer="simulated", duration=1.0, supervisor=sup)

    with pytest.raises(mujou.NodeError, match="'n' raised in on_update.*sensor glitch.*"
                                              "gave up: more than 2 restarts within 10.0 s"):
        run.join(timeout=10)
    assert run.stats().nodes["n"].restarts == 2
    assert node.starts == 3
    assert "more than 2 restarts within 10.0 s" in caplog.text
    assert caplog.text.count("restarting it (one_for_one)") == 2


def test_restarts_outside_the_window_do_not_escalate() -> None:
    class Periodic(Flaky):
        ticks = 0  # a plain attribute: not state, not rewound by a restart

        def on_update(self, dt: float) -> None:
            self.ticks += 1
            if self.ticks % 30 == 0:
                raise RuntimeError("every 0.3 s")

    node = Periodic()
    sup = mujou.Supervisor("one_for_one", max_restarts=1, within=0.2, snapshot_every=0.05)

    run = mujou.run({"n": node}, timer="simulated", duration=1.0, supervisor=sup)
    run.join()

    assert run.stats().nodes["n"].restarts == 3


def test_snapshot_files_keep_the_newest_and_are_complete_when_join_returns(tmp_path) -> None:
    sup = mujou.Supervisor(snapshot_every=0.1, snapshot_dir=tmp_path, keep=3)

    run = mujou.run({"n": Flaky()}, timer="simulated", duration=1.0, supervisor=sup)
    run.join()
    names = sorted(os.listdir(tmp_path))

    assert names == ["latest", "snapshot-00000000000800000000.mujou",
                     "snapshot-00000000000900000000.mujou", "snapshot-00000000001000000000.mujou"]
    assert mujou.latest_snapshot(tmp_path) == str(tmp_path / names[-1])
    trees = [mujou.load(tmp_path / n) for n in names[1:]]
    assert [int(t["nodes"]["n"]["count"]) for t in trees] == [80, 90, 100]
    snaps = run.stats().snapshots
    assert snaps.count == 11 and snaps.files == 11   # t = 0 (the start), 0.1, ..., 1.0
    assert 0 < snaps.pause_max and 0 < snaps.write_mean


def test_realtime_snapshots_follow_the_run_timer(tmp_path) -> None:
    sup = mujou.Supervisor(snapshot_every=0.05, snapshot_dir=tmp_path, keep=100)

    run = mujou.run({"n": Flaky()}, duration=0.22, supervisor=sup)
    run.join()
    times = [mujou.load(tmp_path / n)["time_ns"] for n in sorted(os.listdir(tmp_path))
             if n.endswith(".mujou")]
    multiples = [t // 50_000_000 for t in times]  # of snapshot_every, reached when taken

    # 0, then on the grid of snapshot_every (0.05, 0.1, 0.15, 0.2 on an idle machine): each
    # taken at a multiple or later, one per multiple at most. How many depends on the
    # machine's load (a late one stands for the latest multiple, a file may be skipped).
    assert times[0] == 0 and len(times) >= 2 and len(times) == run.stats().snapshots.files
    assert all(b > a for a, b in itertools.pairwise(multiples))


def test_a_corrupted_snapshot_file_is_a_clear_error_at_restore(tmp_path) -> None:
    sup = mujou.Supervisor(snapshot_dir=tmp_path)
    mujou.run({"n": Flaky()}, timer="simulated", duration=0.1, supervisor=sup).join()
    path = mujou.latest_snapshot(tmp_path)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))

    with pytest.raises(mujou.SnapshotError, match="corrupt|checksum"):
        mujou.run({"n": Flaky()}, timer="simulated", state=path)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_crashed_process_resumes_from_the_latest_file_and_loses_nothing(tmp_path) -> None:
    crashed = subprocess.run([sys.executable, "-m", "tests.crashnet", str(tmp_path), "0.55"],
                             cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert crashed.returncode == 137, crashed.stderr
    latest = mujou.load(mujou.latest_snapshot(tmp_path))
    t0 = latest["time_ns"]
    assert t0 == 500_000_000   # the last snapshot before the crash at 0.57

    resumed = CrashNet()
    run = mujou.run(resumed, timer="simulated", state=mujou.latest_snapshot(tmp_path),
                    duration=1.0 - t0 / 1e9)
    run.join()
    reference = CrashNet()
    ref = mujou.run(reference, timer="simulated", duration=1.0, seed=4)
    ref.join()

    assert run.time_ns == ref.time_ns == 1_000_000_000
    assert _equal(run.state_dict()["nodes"], ref.state_dict()["nodes"])
    assert int(resumed.tracker.count) == int(reference.tracker.count)


CHILD_WRITER = r"""
import sys, torch, mujou_actors as mujou
path = sys.argv[1]
mujou.save({"generation": 1, "w": torch.arange(4)}, path)
print("first", flush=True)
sys.stdin.readline()
mujou.save({"generation": 2, "w": torch.ones(64 * 2**20)}, path)   # 256 MiB
print("second", flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_crash_while_a_snapshot_is_written_leaves_the_previous_file(tmp_path) -> None:
    path = tmp_path / "state.mujou"
    child = subprocess.Popen([sys.executable, "-c", CHILD_WRITER, str(path)], cwd=ROOT,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "first"

    child.stdin.write("go\n")
    child.stdin.flush()
    deadline = time.monotonic() + 60
    while not any(n.endswith(".tmp") and os.path.getsize(tmp_path / n) > 0
                  for n in os.listdir(tmp_path)):
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.001)
    child.send_signal(signal.SIGKILL)
    child.wait(30)

    tree = mujou.load(path)
    assert tree["generation"] == 1 and torch.equal(tree["w"], torch.arange(4))


def test_latest_snapshot_checks_what_the_pointer_names(tmp_path) -> None:
    (tmp_path / "latest").write_text("../../etc/passwd\n")
    with pytest.raises(FileNotFoundError, match="not a snapshot of this folder"):
        mujou.latest_snapshot(tmp_path)
    (tmp_path / "latest").write_text("snapshot-00000000000000000001.mujou\n")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        mujou.latest_snapshot(tmp_path)


def test_a_stale_temporary_file_is_removed_when_a_writer_starts(tmp_path) -> None:
    (tmp_path / ".snapshot-1.mujou.abc.tmp").write_bytes(b"half written")

    mujou.run({"n": Flaky()}, timer="simulated", duration=0.0,
              supervisor=mujou.Supervisor(snapshot_dir=tmp_path)).join()

    assert not any(n.endswith(".tmp") for n in os.listdir(tmp_path))


def test_a_snapshot_dir_that_takes_no_file_is_refused_before_any_on_start(
        unwritable_folder) -> None:
    class Started(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.01)
            self.starts = 0

        def on_start(self) -> None:
            self.starts += 1

    node = Started()
    folder = unwritable_folder / "snaps"

    with pytest.raises(PermissionError, match=re.escape(
            f"mujou.run: snapshot_dir {str(folder)!r} cannot be written: the folder "
            f"{str(unwritable_folder)!r} does not take a new file")):
        mujou.run(node, timer="simulated", duration=0.02,
                  supervisor=mujou.Supervisor(snapshot_dir=folder))

    assert node.starts == 0 and not folder.exists()
    mujou.run(node, timer="simulated", duration=0.02).join()      # the node was not claimed
    assert node.starts == 1


# -- snapshot files in a used folder, the writer's bound, message types -----------------------


def _files(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith(".mujou"))


def test_a_fresh_run_in_a_used_folder_keeps_its_own_new_files(tmp_path) -> None:
    sup = mujou.Supervisor(snapshot_every=0.1, snapshot_dir=tmp_path, keep=3)
    mujou.run({"n": Flaky()}, timer="simulated", duration=1.0, supervisor=sup).join()
    assert _files(tmp_path)[-1] == "snapshot-00000000001000000000.mujou"

    # A new run starts at t = 0: its files have smaller times than the old run's.
    run = mujou.run({"n": Flaky()}, timer="simulated", duration=0.1, supervisor=sup)
    run.join()

    # Kept: the files written last. The old run's newest survives next to the two new ones.
    assert _files(tmp_path) == ["snapshot-00000000000000000000.mujou",
                                "snapshot-00000000000100000000.mujou",
                                "snapshot-00000000001000000000.mujou"]
    latest = mujou.latest_snapshot(tmp_path)
    assert latest == str(tmp_path / "snapshot-00000000000100000000.mujou")
    assert int(mujou.load(latest)["nodes"]["n"]["count"]) == 10   # the new run's state

    mujou.run({"n": Flaky()}, timer="simulated", duration=0.3, supervisor=sup).join()
    assert _files(tmp_path) == ["snapshot-00000000000100000000.mujou",
                                "snapshot-00000000000200000000.mujou",
                                "snapshot-00000000000300000000.mujou"]


def _tree(i: int) -> dict:
    return {"time_ns": i, "x": torch.zeros(1)}


class GatedSave:
    """A save that waits for ``go`` before writing each tree; records the times it wrote."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.started = threading.Semaphore(0)
        self.times: list[int] = []

    def __call__(self, tree: dict, path: str) -> None:
        self.started.release()
        assert self.go.wait(30)
        mujou.save(tree, path)
        self.times.append(tree["time_ns"])


@pytest.mark.timeout(30)
def test_the_realtime_writer_holds_two_trees_at_most_and_counts_the_skipped(
        tmp_path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="mujou_actors")
    save = GatedSave()
    errors: list[BaseException] = []
    writer = SnapshotWriter(str(tmp_path), 10, save, errors.append)
    trees = [_tree(i) for i in range(6)]
    alive = [weakref.ref(t["x"]) for t in trees]
    writer.submit(trees[0])
    assert save.started.acquire(timeout=10)  # tree 0 is being written
    for tree in trees[1:]:
        writer.submit(tree)  # never waits
    del trees, tree
    gc.collect()

    assert writer.skipped == 4  # 1..4 were each replaced by the next one
    # Logged at the 1st, 2nd and 4th skip only: a slow disk does not flood the log.
    assert [r.getMessage() for r in caplog.records] == [
        f"snapshot at t=0.000000 s skipped: the writer is still busy with earlier ones "
        f"({n} skipped so far)" for n in (1, 2, 4)]
    assert [i for i, ref in enumerate(alive) if ref() is not None] == [0, 5]
    save.go.set()
    writer.close(10)
    assert save.times == [0, 5] and errors == []
    assert mujou.latest_snapshot(tmp_path).endswith("snapshot-00000000000000000005.mujou")


@pytest.mark.timeout(30)
def test_the_simulated_writer_waits_for_the_previous_file_until_the_run_ends(tmp_path) -> None:
    save = GatedSave()
    ending = threading.Event()
    writer = SnapshotWriter(str(tmp_path), 10, save, lambda e: None, block=True,
                            cancelled=ending.is_set)
    writer.submit(_tree(0))
    assert save.started.acquire(timeout=10)
    second = threading.Thread(target=writer.submit, args=(_tree(1),))
    second.start()

    second.join(0.2)
    assert second.is_alive()  # back-pressure: it waits for file 0
    save.go.set()
    second.join(10)
    assert not second.is_alive()
    assert save.started.acquire(timeout=10)  # file 1 is being written
    save.go.clear()
    third = threading.Thread(target=writer.submit, args=(_tree(2),))
    third.start()
    ending.set()  # the run ends: the wait ends too
    third.join(10)
    assert not third.is_alive()
    save.go.set()
    writer.close(10)
    assert save.times == [0, 1, 2] and writer.skipped == 0


@pytest.mark.timeout(30)
def test_closing_a_writer_stuck_on_its_disk_is_bounded_and_names_the_file(tmp_path) -> None:
    save = GatedSave()
    errors: list[BaseException] = []
    writer = SnapshotWriter(str(tmp_path), 10, save, errors.append)
    writer.submit(_tree(7))
    assert save.started.acquire(timeout=10)
    writer.submit(_tree(8))

    t0 = time.monotonic()
    writer.close(0.2)

    assert time.monotonic() - t0 < 5
    assert len(errors) == 1 and isinstance(errors[0], TimeoutError)
    assert str(tmp_path / "snapshot-00000000000000000007.mujou") in str(errors[0])
    save.go.set()


def test_a_realtime_run_with_a_slow_disk_skips_snapshots_and_counts_them(tmp_path) -> None:
    def slow(tree: dict, path: str) -> None:
        time.sleep(0.05)
        snapshot.save(tree, path)

    sup = mujou.Supervisor(snapshot_every=0.005, snapshot_dir=tmp_path, keep=100)
    run = run_module._start({"n": Flaky()}, seams=Seams(save_snapshot=slow), duration=0.3,
                            supervisor=sup)
    run.join()
    snaps = run.stats().snapshots

    assert snaps.skipped > 0 and snaps.files + snaps.skipped == snaps.count
    assert len(_files(tmp_path)) == snaps.files


def test_a_simulated_run_with_a_slow_disk_writes_every_snapshot(tmp_path) -> None:
    def slow(tree: dict, path: str) -> None:
        time.sleep(0.01)
        snapshot.save(tree, path)

    sup = mujou.Supervisor(snapshot_every=0.1, snapshot_dir=tmp_path, keep=100)
    run = run_module._start({"n": Flaky()}, seams=Seams(save_snapshot=slow), timer="simulated",
                            duration=1.0, supervisor=sup)
    run.join()
    snaps = run.stats().snapshots

    assert (snaps.count, snaps.files, snaps.skipped) == (11, 11, 0)
    assert len(_files(tmp_path)) == 11


class Step(typing.NamedTuple):
    x: float
    tag: str


@dataclasses.dataclass
class Goal:
    x: torch.Tensor
    steps: list


@dataclasses.dataclass(frozen=True)
class Wrapped:
    step: Step


def _pair(type_: type, make, declared: type | None = None):
    class Src(mujou.Node):
        out = mujou.Output(type_)

        def __init__(self) -> None:
            super().__init__(period=0.1)
            self.k = 0

        def on_update(self, dt: float) -> None:
            self.k += 1
            self.out.send(make(self.k))

    class Sink(mujou.Node):
        goal = mujou.Input(declared or type_, depth=2)

        def __init__(self) -> None:
            super().__init__(period=0.3)

        def on_update(self, dt: float) -> None:
            pass

    src, sink = Src(), Sink()
    mujou.connect(src.out, sink.goal)
    return {"s": src, "l": sink}


@pytest.mark.parametrize("type_, make", [
    (Step, lambda k: Step(k / 2, f"s{k}")),
    (Goal, lambda k: Goal(torch.full((2,), float(k)), [k, (k, "x")])),
])
def test_named_tuple_and_dataclass_messages_round_trip_through_supervisor_files(
        tmp_path, type_, make) -> None:
    sup = mujou.Supervisor(snapshot_every=0.1, snapshot_dir=tmp_path)
    run = mujou.run(_pair(type_, make), timer="simulated", duration=0.5, supervisor=sup)
    run.join()
    want = run.state_dict()

    again = mujou.run(_pair(type_, make), timer="simulated", duration=0.0,
                      state=mujou.latest_snapshot(tmp_path))
    again.join()
    got = again.state_dict()

    assert want["inputs"]["l.goal"] and want["pending"]["l.goal"]
    for section in ("inputs", "pending"):
        assert [type(m) for m in got[section]["l.goal"]] == [type_] * len(want[section]["l.goal"])
        assert _equal([vars(m) if dataclasses.is_dataclass(m) else m
                       for m in got[section]["l.goal"]],
                      [vars(m) if dataclasses.is_dataclass(m) else m
                       for m in want[section]["l.goal"]])


@pytest.mark.parametrize("type_, make, declared, problem", [
    (Goal, lambda k: Goal(torch.zeros(1), []), object,
     "a Goal message on its way to Input 'l.goal' (declared object) cannot go into a snapshot "
     "file: it is a Goal (a dataclass), which a file brings back as a dict"),
    (Step, lambda k: Step(1.0, "a"), tuple,
     "it is a Step (a NamedTuple), which a file brings back as a tuple"),
    (Wrapped, lambda k: Wrapped(Step(1.0, "a")), None,
     "its field 'step' is a Step (a NamedTuple), which a file brings back as a tuple"),
    (object, lambda k: {"big": 2**70}, None,
     "it['big'] is the int 1180591620717411303424, outside the int64/uint64 range"),
])
def test_a_message_a_file_would_not_restore_stops_the_run_at_that_snapshot_naming_the_port(
        tmp_path, caplog, type_, make, declared, problem) -> None:
    caplog.set_level(logging.INFO, logger="mujou_actors")
    sup = mujou.Supervisor(snapshot_every=0.1, snapshot_dir=tmp_path)
    run = mujou.run(_pair(type_, make, declared), timer="simulated", duration=1.0,
                    supervisor=sup)

    with pytest.raises(TypeError) as info:
        run.join()

    # The first snapshot (t = 0) has no message yet; the one at 0.1 s has: the run ends there.
    name = tmp_path / "snapshot-00000000000100000000.mujou"
    assert str(info.value).startswith(f"cannot write the snapshot file {name}: ")
    assert problem in str(info.value) and "inputs[" not in str(info.value)
    assert run.time_ns == 100_000_000
    assert _files(tmp_path) == ["snapshot-00000000000000000000.mujou"]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None


def test_a_first_snapshot_whose_message_a_file_cannot_hold_fails_mujou_run(tmp_path) -> None:
    net = _pair(Goal, lambda k: Goal(torch.zeros(1), []), object)
    sup = mujou.Supervisor(snapshot_dir=tmp_path)

    with pytest.raises(TypeError, match=r"snapshot-00000000000000000000\.mujou: a Goal message "
                                        r"on its way to Input 'l.goal'"):
        mujou.run(net, timer="simulated", inputs={"l.goal": Goal(torch.zeros(1), [])},
                  supervisor=sup)
    assert net["l"]._mujou_run is None


def test_a_failed_write_stops_a_simulated_run_before_its_next_snapshot_logged_once(
        tmp_path, caplog) -> None:
    def full_after_first(tree: dict, path: str) -> None:
        if tree["time_ns"] > 0:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        snapshot.save(tree, path)

    caplog.set_level(logging.INFO, logger="mujou_actors")
    sup = mujou.Supervisor(snapshot_every=0.1, snapshot_dir=tmp_path)
    run = run_module._start({"n": Flaky()}, seams=Seams(save_snapshot=full_after_first),
                            timer="simulated", duration=1.0, supervisor=sup)

    with pytest.raises(OSError, match="No space left on device") as info:
        run.join()

    assert info.value.filename == str(tmp_path / "snapshot-00000000000100000000.mujou")
    assert run.time_ns <= 200_000_000   # not the 1 s a run that ignored it would reach
    assert run.stats().snapshots.files == 1 and _files(tmp_path) == [
        "snapshot-00000000000000000000.mujou"]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "snapshot-00000000000100000000.mujou" in errors[0].getMessage()


class _StuckRestart(mujou.Node):
    """Fails in its 3rd update; blocks in ``hook`` during the restart that follows."""

    def __init__(self, hook: str, release: threading.Event) -> None:
        super().__init__(period=0.01)
        self.hook, self.release, self.n = hook, release, 0
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.hook and self.calls.count("on_start") == (1 if name == "on_stop" else 2):
            self.release.wait(30)

    def on_start(self) -> None:
        self._call("on_start")

    def on_stop(self) -> None:
        self._call("on_stop")

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == 3:
            raise RuntimeError("fails once")

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("hook, error", [("on_stop", mujou.StopTimeoutError),
                                         ("on_start", mujou.StartTimeoutError)])
def test_a_one_for_all_restart_stuck_in_a_hook_ends_the_run_naming_it(hook, error) -> None:
    release = threading.Event()
    node = _StuckRestart(hook, release)
    run = mujou.run({"x": node, "y": mujou.Node(period=0.01)}, workers=1, timer="simulated",
                    supervisor=mujou.Supervisor(restart="one_for_all"),
                    start_timeout=0.3, stop_timeout=0.2)
    try:
        with pytest.raises(error) as info:
            run.join(timeout=10)
    finally:
        release.set()

    assert info.value.stuck == {"x": hook}
    assert node.calls[-1] == hook
    assert node.calls.count("on_start") == (1 if hook == "on_stop" else 2)


class _FailsOften(mujou.Node):
    """Raises in every 3rd update since its last (re)start."""

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.n = 0

    def on_start(self) -> None:
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == 3:
            raise RuntimeError("again")

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def test_many_one_for_all_restarts_keep_only_the_helper_threads_still_alive() -> None:
    # Every restart rewinds to the snapshot at t = 0 and fails again: the
    # supervisor gives up after 30 restarts.
    sup = mujou.Supervisor(restart="one_for_all", max_restarts=30, within=1.0)
    nodes = {"f": _FailsOften(), "g": mujou.Node(period=0.01)}
    run = mujou.run(nodes, workers=1, timer="simulated", duration=0.6, supervisor=sup)
    with pytest.raises(mujou.NodeError, match="gave up"):
        run.join(timeout=20)

    assert run.stats().nodes["f"].restarts == 30
    # Each restart's phases started helpers; those that exited are not kept.
    assert len(run._dispatcher._helpers) <= 2
    assert not any(t.is_alive() for t in run._dispatcher._helpers)


# -- cuts that cannot be reached -------------------------------------------------------


class _StuckAt(mujou.Node):
    """Ticks at 100 Hz; its ``at``-th update blocks until ``release`` is set."""

    def __init__(self, at: int, entered: threading.Event, release: threading.Event) -> None:
        super().__init__(period=0.01)
        self.at, self.entered, self.release = at, entered, release
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == self.at:
            self.entered.set()
            self.release.wait(30)


def _until(condition: object, timeout: float) -> bool:
    """Poll ``condition()`` every 10 ms for at most ``timeout`` wall seconds."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.timeout(30)
def test_a_stuck_hook_makes_periodic_snapshots_missed_not_the_net_frozen(caplog) -> None:
    caplog.set_level(logging.INFO, logger="mujou_actors")
    entered, release = threading.Event(), threading.Event()
    healthy = Counter(period=0.01)
    run = mujou.run({"stuck": _StuckAt(3, entered, release), "ok": healthy}, workers=2,
                    supervisor=mujou.Supervisor(snapshot_every=0.05))
    try:
        assert entered.wait(5)
        taken = run.stats().snapshots.count
        n0 = len(healthy.dts)
        # At 100 Hz that takes 0.3 s (and one pause of 0.05 s for the first
        # snapshot missed); a net frozen by the cut made 4-5 updates a second.
        assert _until(lambda: len(healthy.dts) >= n0 + 30, 2.5), (
            f"the healthy node made {len(healthy.dts) - n0} updates")
        assert _until(lambda: run.stats().snapshots.missed >= 1, 5), "no snapshot was missed"
        assert run.stats().snapshots.count == taken  # none taken while the hook is stuck
        missed = run.stats().snapshots.missed
    finally:
        release.set()
    assert _until(lambda: run.stats().snapshots.count > taken, 5), "snapshots did not resume"
    run.stop()
    run.join(timeout=10)

    assert missed >= 1 and run.stats().snapshots.missed >= missed
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "snapshot missed" in r.getMessage()]
    assert len(warnings) == 1  # once per stuck hook, not at every multiple
    assert "within 0.05 s" in warnings[0] and "'stuck' in on_update" in warnings[0]
    # Once the hook has returned and a snapshot was taken, that is logged too.
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    first_miss = next(i for i, m in enumerate(messages) if "snapshot missed" in m)
    assert any("snapshots resume at t=" in m for m in messages[first_miss:])


@pytest.mark.timeout(30)
def test_with_the_simulated_timer_a_stuck_hook_delays_the_snapshot_and_none_is_missed() -> None:
    entered, release = threading.Event(), threading.Event()
    sup = mujou.Supervisor(snapshot_every=0.02)
    run = mujou.run({"stuck": _StuckAt(3, entered, release), "ok": Counter()}, workers=2,
                    timer="simulated", duration=0.1, supervisor=sup)
    assert entered.wait(5)

    with pytest.raises(TimeoutError, match=r"within 0\.1 s.*'stuck' in on_update"):
        run.state_dict(timeout=0.1)  # simulated time waits for the hook: so does the cut
    assert run.time_ns == 30_000_000
    release.set()
    run.join(timeout=10)

    snaps = run.stats().snapshots
    assert snaps.count == 6 and snaps.missed == 0  # t = 0, 0.02, ..., 0.1, each taken


@pytest.mark.timeout(30)
def test_a_one_for_all_restart_behind_a_stuck_hook_fails_the_run_within_stop_timeout() -> None:
    entered, release = threading.Event(), threading.Event()
    sup = mujou.Supervisor("one_for_all")
    run = mujou.run({"stuck": _StuckAt(1, entered, release), "bad": Flaky(fail_at=3)},
                    workers=2, supervisor=sup, stop_timeout=0.3)
    try:
        assert entered.wait(5)
        with pytest.raises(mujou.NodeError, match=r"could not restart the net: no consistent "
                           r"cut within 0\.3 s; still running: 'stuck' in on_update") as info:
            run.join(timeout=10)
    finally:
        release.set()
    assert info.value.path == "bad" and isinstance(info.value.__cause__, RuntimeError)


# -- the verdicts (supervisor.failure_verdict): no threads ----------------------------


def _verdict(restart: str, *, restartable: bool = True, intensity=None, now_ns: int = 0):
    from mujou_actors.supervisor import RestartIntensity, failure_verdict

    sup = mujou.Supervisor(restart=restart, max_restarts=2, within=1.0)
    intensity = intensity or RestartIntensity(sup.max_restarts, round(sup.within * 1e9))
    return failure_verdict(sup, intensity, now_ns, restartable=restartable)


@pytest.mark.parametrize("restart, action", [("none", "stop"), ("one_for_one", "restart_one"),
                                             ("one_for_all", "restart_all")])
def test_a_failure_gets_the_strategys_verdict(restart: str, action: str) -> None:
    verdict = _verdict(restart)

    assert (verdict.action.value, verdict.note) == (action, "")


@pytest.mark.parametrize("restart", ["one_for_one", "one_for_all"])
def test_a_failure_while_the_run_ends_or_before_it_started_stops_it(restart: str) -> None:
    from mujou_actors.supervisor import RestartIntensity

    intensity = RestartIntensity(2, 1_000_000_000)

    verdict = _verdict(restart, restartable=False, intensity=intensity)

    assert (verdict.action.value, verdict.note) == ("stop", "")
    assert intensity.allow(0) and intensity.allow(0)  # no restart was counted


def test_the_supervisor_gives_up_past_max_restarts_within_the_window() -> None:
    from mujou_actors.supervisor import RestartIntensity

    intensity = RestartIntensity(2, 1_000_000_000)

    verdicts = [_verdict("one_for_one", intensity=intensity, now_ns=t)
                for t in (0, 400_000_000, 900_000_000, 1_000_000_000)]

    assert [v.action.value for v in verdicts] == ["restart_one", "restart_one", "stop",
                                                  "restart_one"]  # t=0 has left the window
    assert verdicts[2].note == ("the supervisor gave up: more than 2 restarts within 1.0 s")
