"""Watching a running net from another process: the run's endpoint and the `mujou` clients.

Each run here is watched from a second process, the `mujou` command in a
subprocess, as a user watches one from a second terminal. The runs use a
runtime folder of the test's own (``MUJOU_RUNTIME_DIR``), so that what other
runs on the machine leave there does not matter.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import mujou_actors as mujou
from mujou_actors import attach
from mujou_actors.cli_attach import Rate, render
from mujou_actors.errors import AttachError

from . import placed_support

ROOT = Path(__file__).resolve().parent.parent


class Beacon(mujou.Node):
    """Sends its update count and a constant tensor every period."""

    count = mujou.Output(int)
    pose = mujou.Output(torch.Tensor, shape=(2,))

    def __init__(self, period: float = 0.01) -> None:
        super().__init__(period=period)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.count.send(self.n)
        self.pose.send(torch.tensor([1.5, -2.0]))


class Listener(mujou.Node):
    """Takes the counts (bounded Input of depth 3), sends nothing."""

    count = mujou.Input(int, depth=3)

    def __init__(self) -> None:
        super().__init__(period=None)


def _net(period: float = 0.01) -> dict[str, mujou.Node]:
    beacon, listener = Beacon(period), Listener()
    mujou.connect(beacon.count, listener.count)
    return {"beacon": beacon, "listener": listener}


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A runtime folder of the test's own (short: a socket's path has at most 107 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="mj", dir="/tmp")) / "rt"
    monkeypatch.setenv("MUJOU_RUNTIME_DIR", str(folder))
    monkeypatch.delenv("MUJOU_ATTACH", raising=False)
    yield folder
    for path in sorted(folder.parent.rglob("*"), reverse=True):
        path.unlink() if not path.is_dir() else path.rmdir()
    folder.parent.rmdir()


def _mujou(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The `mujou` command in a second process (the test's environment: its runtime folder)."""
    return subprocess.run([sys.executable, "-m", "mujou_actors", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def _json(*args: str) -> Any:
    proc = _mujou(*args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _endpoint_threads_end() -> None:
    for thread in threading.enumerate():
        if thread.name == "mujou-attach":
            thread.join(10)
    assert not any(t.name == "mujou-attach" for t in threading.enumerate())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_in_one_process_is_listed_described_and_echoed_from_another_process(
        runtime: Path) -> None:
    run = mujou.run(_net(), timer="realtime")
    try:
        listed = _json("ls", "--json")
        me = str(os.getpid())
        nodes = _json("nodes", me, "--json")
        ports = {p["path"]: p for p in _json("ports", me, "--json")}
        echo = _mujou("echo", me, "beacon.pose", "--once", "--json")
        count = _mujou("echo", me, "listener.count", "--once", "--json")
        stats = _json("stats", me, "--json")
    finally:
        run.stop()

    assert [(r["pid"], r["nodes"], r["groups"], r["timer"]) for r in listed] == \
        [(os.getpid(), 2, 1, "realtime")]
    assert [(n["path"], n["class"].rpartition(".")[2], n["period"], n["group"], n["inputs"],
             n["outputs"]) for n in nodes] == [
        ("beacon", "Beacon", 0.01, "host", [], ["count", "pose"]),
        ("listener", "Listener", None, "host", ["count"], [])]
    assert ports["beacon.count"]["direction"] == "out"
    assert ports["beacon.count"]["connections"] == ["listener.count"]
    assert ports["listener.count"] == {**ports["listener.count"], "direction": "in",
                                       "type": "int", "depth": 3,
                                       "connections": ["beacon.count"]}
    assert ports["beacon.pose"]["shape"] == [2] and ports["beacon.pose"]["connections"] == []
    assert echo.returncode == 0, echo.stderr
    line = json.loads(echo.stdout)
    assert line["port"] == "beacon.pose" and line["t_ns"] > 0
    assert line["value"] == {"shape": [2], "dtype": "float32", "data": [1.5, -2.0]}
    assert count.returncode == 0, count.stderr
    assert isinstance(json.loads(count.stdout)["value"], int)
    assert json.loads(count.stdout)["value"] >= 1
    assert stats["nodes"]["beacon"]["updates"] >= 1
    assert set(stats["nodes"]) >= {"beacon", "listener"}


@pytest.mark.timeout(300)
def test_hz_reports_about_the_rate_of_a_real_time_node(runtime: Path) -> None:
    run = mujou.run(_net(period=0.01), timer="realtime")
    try:
        proc = _mujou("hz", str(os.getpid()), "beacon.count", "--duration", "2", "--json")
    finally:
        run.stop()

    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    # 100 Hz by its period; a loaded machine makes ticks late (overruns): loose bounds.
    assert 40 < report["rate"] < 110
    assert report["min"] > 0 and report["max"] >= report["min"] and report["std"] >= 0
    assert report["messages"] >= 20 and report["window"] == report["messages"] - 1


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_placed_run_is_watched_across_its_group_processes(runtime: Path) -> None:
    run = mujou.run(placed_support.make_net, placement={"sim": "physics"}, timer="realtime")
    try:
        me = str(os.getpid())
        listed = _json("ls", "--json")
        nodes = {n["path"]: n for n in _json("nodes", me, "--json")}
        echo = _mujou("echo", me, "sim.out", "--once", "--json")
        stats = _json("stats", me, "--json")
        hz = _mujou("hz", me, "sim.out", "--duration", "2", "--json")
    finally:
        run.stop()

    assert [(r["pid"], r["nodes"], r["groups"]) for r in listed] == [(os.getpid(), 3, 2)]
    assert nodes["sim"]["group"] == "physics" and nodes["ctrl"]["group"] == "host"
    assert nodes["sim"]["class"].endswith("Sim") and nodes["sim"]["period"] == 0.01
    assert echo.returncode == 0, echo.stderr
    value = json.loads(echo.stdout)["value"]
    assert value["shape"] == [3] and value["dtype"] == "float32" and len(value["data"]) == 3
    assert stats["groups"]["physics"]["pid"] not in (os.getpid(), 0)
    assert stats["groups"]["physics"]["nodes"] == ["sim"]
    assert stats["nodes"]["sim"]["updates"] >= 1
    assert hz.returncode == 0, hz.stderr
    assert 40 < json.loads(hz.stdout.splitlines()[-1])["rate"] < 110


@pytest.mark.timeout(120)
def test_the_folder_is_0700_the_socket_and_facts_0600_and_both_go_with_the_run(
        runtime: Path) -> None:
    run = mujou.run(_net(), timer="simulated")
    folder = runtime.stat().st_mode
    sockets = {p.stem: p.stat().st_mode for p in runtime.glob("*.sock")}
    facts = {p.stem: p.stat().st_mode for p in runtime.glob("*.json")}
    run.stop()
    _endpoint_threads_end()

    assert stat.S_IMODE(folder) == 0o700
    assert [stat.S_IMODE(m) for m in sockets.values()] == [0o600]
    assert all(stat.S_ISSOCK(m) for m in sockets.values())
    assert [stat.S_IMODE(m) for m in facts.values()] == [0o600]
    assert list(facts) == list(sockets) and next(iter(facts)).startswith(f"{os.getpid()}-")
    assert list(runtime.iterdir()) == []


@pytest.mark.timeout(120)
def test_an_entry_of_a_dead_process_is_dropped_and_its_files_removed(runtime: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=60)
    pid = int(gone.stdout)
    runtime.mkdir(mode=0o700)
    (runtime / f"{pid}-abcdef.json").write_text(json.dumps(
        {"id": f"{pid}-abcdef", "pid": pid, "file": "old.py", "started": 1.0, "nodes": 2}))
    (runtime / f"{pid}-abcdef.sock").write_text("")
    run = mujou.run(_net(), timer="realtime")
    try:
        found = attach.list_runs()
        cli = _json("ls", "--json")
    finally:
        run.stop()

    assert [r.pid for r in found] == [os.getpid()]
    assert [r["pid"] for r in cli] == [os.getpid()]
    assert not (runtime / f"{pid}-abcdef.json").exists()
    assert not (runtime / f"{pid}-abcdef.sock").exists()


@pytest.mark.timeout(120)
def test_an_entry_whose_socket_nobody_listens_on_is_dropped(runtime: Path) -> None:
    runtime.mkdir(mode=0o700)
    (runtime / "1-abcdef.json").write_text(json.dumps(  # pid 1 lives; its socket does not
        {"id": "1-abcdef", "pid": 1, "file": "old.py", "started": 1.0, "nodes": 2}))

    assert attach.list_runs() == []
    assert list(runtime.iterdir()) == []


@pytest.mark.timeout(300)
def test_bad_run_and_bad_port_are_clear_errors_with_exit_code_2(runtime: Path) -> None:
    none_yet = _mujou("nodes", "pendulum")
    run = mujou.run(_net(), timer="realtime")
    try:
        no_run = _mujou("nodes", "no_such_file")
        no_port = _mujou("echo", str(os.getpid()), "beacon.coutn", "--once")
    finally:
        run.stop()
    _endpoint_threads_end()
    gone = _mujou("stats", str(os.getpid()))

    assert none_yet.returncode == 2 and "no running net to watch" in none_yet.stderr
    assert no_run.returncode == 2
    assert "no running net matches 'no_such_file'" in no_run.stderr
    assert f"{os.getpid()}" in no_run.stderr  # the running ones are listed
    assert no_port.returncode == 2
    assert "no port 'beacon.coutn'" in no_port.stderr
    assert "did you mean beacon.count" in no_port.stderr
    assert gone.returncode == 2 and "no running net" in gone.stderr


@pytest.mark.timeout(120)
def test_two_runs_of_one_process_are_named_by_their_ids(runtime: Path) -> None:
    first = mujou.run(_net(), timer="realtime")
    second = mujou.run(_net(), timer="realtime")
    try:
        runs = attach.list_runs()
        with pytest.raises(AttachError, match="matches 2 running nets"):
            attach.find_run(str(os.getpid()), runs)
        by_id = attach.find_run(runs[1].id, runs)
    finally:
        first.stop()
        second.stop()

    assert len(runs) == 2 and by_id is runs[1]


@pytest.mark.timeout(120)
def test_a_watcher_that_reads_slowly_loses_messages_on_the_runs_side_counted(
        runtime: Path) -> None:
    run = mujou.run(_net(period=0.001), timer="simulated", duration=20.0)
    entry = attach.list_runs()[0]
    with attach.Connection(entry) as conn:
        watch = conn.watch("beacon.count", depth=1)
        batches = [next(watch)]
        run.join()  # the rest is read only once the run has ended
        batches += list(watch)

    end = batches[-1]
    received = [v for b in batches for _, v in b.get("items", ())]
    assert end["end"] is True and end["failure"] is None
    assert end["lost"] > 0  # the run did not wait for the watcher: it finished all its ticks
    assert run.stats().nodes["beacon"].updates == 20_000
    assert received == sorted(received) and len(received) < 20_000
    # The endpoint's Run.watch: what the watcher was told it lost is the watch's count, and
    # what it received is what the endpoint took.
    watched = run.stats().subscriptions["beacon.count"]
    assert (watched.watches, watched.subscriptions) == (1, 0)
    assert watched.watch_dropped == end["lost"]
    assert watched.watch_taken == len(received) == len(set(received))
    # Nothing woke a host thread for it: the run has no subscription, so no mujou-host.
    assert run._host.thread is None  # type: ignore[attr-defined]


@pytest.mark.timeout(120)
def test_an_unsafe_folder_is_refused_and_the_run_goes_on_without_an_endpoint(
        runtime: Path, caplog: pytest.LogCaptureFixture) -> None:
    runtime.mkdir(mode=0o700)
    runtime.chmod(0o755)

    with pytest.raises(AttachError, match="mode 0755"):
        attach.runtime_dir()
    with mujou.run(_net(), timer="simulated", duration=0.05) as run:
        run.join()
    listed = _mujou("ls")

    assert "cannot be watched from another process" in caplog.text
    assert list(runtime.iterdir()) == []
    assert listed.returncode == 2 and "chmod 700" in listed.stderr
    runtime.chmod(0o700)


@pytest.mark.timeout(60)
def test_mujou_attach_0_opens_no_endpoint(runtime: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUJOU_ATTACH", "0")

    with mujou.run(_net(), timer="simulated", duration=0.05) as run:
        run.join()

    assert not runtime.exists() or list(runtime.iterdir()) == []


@pytest.mark.timeout(60)
def test_a_frame_too_long_or_not_msgpack_closes_or_answers_an_error(runtime: Path) -> None:
    import socket
    import struct

    run = mujou.run(_net(), timer="realtime")
    try:
        entry = attach.list_runs()[0]
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(entry.socket)
            s.sendall(struct.pack(">I", attach.MAX_REQUEST + 1))
            closed = s.recv(10)
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(entry.socket)
            s.sendall(struct.pack(">I", 3) + b"\xc1\xc1\xc1")  # 0xc1: never used by msgpack
            (n,) = struct.unpack(">I", s.recv(4))
            answer = attach.unpack(s.recv(n), n)
    finally:
        run.stop()

    assert closed == b""
    assert answer["ok"] is False and "does not decode" in answer["error"]


def test_rate_takes_the_gaps_of_the_newest_window_and_leaves_out_on_start() -> None:
    rate = Rate(window=3)

    for t in (-1, 0, 10_000_000, 20_000_000, 40_000_000, 60_000_000):
        rate.add(t)
    report = rate.report()

    assert report["window"] == 3 and report["messages"] == 5
    assert report["min"] == 0.01 and report["max"] == 0.02
    assert report["rate"] == pytest.approx(1 / (0.05 / 3))


def test_a_view_is_rendered_one_tensor_a_line_and_a_dict_a_key_a_line() -> None:
    view = {"pos": {"shape": [2], "dtype": "float32", "data": [1.5, -2.0]},
            "big": {"shape": [100, 100], "dtype": "float32", "numel": 10000, "min": 0.0,
                    "max": 1.0, "mean": 0.5}, "n": 3, "name": "a"}

    lines = list(render(view))

    assert lines == ["pos: tensor float32 [2]: [1.5, -2]",
                     "big: tensor float32 [100, 100] (10000 elements): min 0  max 1  mean 0.5",
                     "n: 3", "name: a"]
