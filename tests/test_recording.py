"""Recording a run to MCAP: what the file holds is what the readers saw, bounded, crash-safe."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, NamedTuple

import pytest
import torch

import mujou_actors as mujou
from mujou_actors.recording import mcapfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


class Command(NamedTuple):
    force: float
    step: int


class Sim(mujou.Node):
    """A pendulum-ish plant: integrates the command, sends its state as a tensor."""

    command = mujou.Input(Command)
    state = mujou.Output(torch.Tensor, shape=(2,), dtype=torch.float64)
    energy = mujou.Output(float)

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.x = torch.tensor([0.3, 0.0], dtype=torch.float64)

    def on_start(self) -> None:
        self.state.send(self.x.clone())  # at the control key: before the timer starts

    def on_update(self, dt: float) -> None:
        cmd = self.command.read()
        force = 0.0 if cmd is None else cmd.force
        theta, omega = self.x.tolist()
        omega += dt * (-9.81 * torch.sin(torch.tensor(theta)).item() + force)
        theta += dt * omega
        self.x = torch.tensor([theta, omega], dtype=torch.float64)
        self.state.send(self.x)
        self.energy.send(0.5 * omega * omega)


class Ctrl(mujou.Node):
    state = mujou.Input(torch.Tensor, trigger=True)
    command = mujou.Output(Command)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.n = 0

    def on_update(self, dt: float) -> None:
        x = self.state.read()
        self.n += 1
        self.command.send(Command(float(-2.0 * x[0] - 0.5 * x[1]), self.n))


class Probe(mujou.Node):
    """Keeps every message its readers take, in order: what a reader saw."""

    state = mujou.Input(torch.Tensor, depth=None, trigger=True)
    energy = mujou.Input(float, depth=None, trigger=True)
    command = mujou.Input(Command, depth=None, trigger=True)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.seen: dict[str, list[Any]] = {"sim.state": [], "sim.energy": [],
                                           "ctrl.command": []}
        # Set: the first update waits for it (a simulated run cannot leave its first
        # instant meanwhile), so that the host can subscribe before the run is over.
        self.gate: threading.Event | None = None

    def on_update(self, dt: float) -> None:
        if self.gate is not None:
            assert self.gate.wait(60), "the test never opened the probe's gate"
            self.gate = None
        for name, port in (("sim.state", self.state), ("sim.energy", self.energy),
                           ("ctrl.command", self.command)):
            self.seen[name].extend(port.drain())


class Pendulum(mujou.Node):
    def __init__(self, probe: bool = False) -> None:
        super().__init__(period=None)
        self.sim = Sim()
        self.ctrl = Ctrl()
        mujou.connect(self.sim.state, self.ctrl.state)
        mujou.connect(self.ctrl.command, self.sim.command)
        if probe:
            self.probe = Probe()
            mujou.connect(self.sim.state, self.probe.state)
            mujou.connect(self.sim.energy, self.probe.energy)
            mujou.connect(self.ctrl.command, self.probe.command)


def _watch(run: mujou.Run, ports: list[str]) -> dict[str, list[Any]]:
    seen: dict[str, list[Any]] = {p: [] for p in ports}
    for p in ports:
        run.subscribe(p, seen[p].append, depth=100_000)
    return seen


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("workers", [1, 2])
def test_a_simulated_run_records_every_message_bit_for_bit(tmp_path: pathlib.Path,
                                                           workers: int) -> None:
    path = tmp_path / "run.mcap"
    net = Pendulum(probe=True)
    net.probe.gate = gate = threading.Event()

    with mujou.run(net, timer="simulated", duration=1.0, workers=workers, seed=7,
                   record=mujou.Recording(path, ports=["sim.*", "ctrl.*"])) as run:
        seen = _watch(run, ["sim.state", "sim.energy", "ctrl.command"])
        gate.set()
        run.join(timeout=60)
    stats = run.stats().recording

    types = {"ctrl.command": Command}
    records = list(mcapfile.read(path, types=types))
    by_topic: dict[str, list[mcapfile.Record]] = {}
    for r in records:
        by_topic.setdefault(r.topic, []).append(r)
    # The file starts with on_start's state, at the control key.
    first = by_topic["sim.state"][0]
    assert (first.t_ns, first.delta, first.sequence) == (-1, 0, 0)
    assert torch.equal(first.message, torch.tensor([0.3, 0.0], dtype=torch.float64))
    for topic, got in by_topic.items():
        messages = [r.message for r in got]
        # What a reader in the net took, every message, bit for bit.
        read = net.probe.seen[topic]
        assert len(read) == len(messages) > 90, topic
        assert all(_same(a, b) for a, b in zip(read, messages, strict=True)), topic
        # The subscriptions start once the run has started: they saw the file's last ones.
        watched = seen[topic]
        assert len(watched) >= len(messages) - 3 and all(_same(a, b) for a, b in zip(
            watched, messages[-len(watched):], strict=True)), topic
        assert [r.sequence for r in got] == list(range(len(got)))
    # Times: the states at every 10 ms tick, delta 0; the commands one delta cycle later.
    states = by_topic["sim.state"][1:]
    assert [r.t_ns for r in states] == [10_000_000 * (i + 1) for i in range(len(states))]
    assert len(states) == 100
    assert {r.delta for r in states} == {0}
    assert {r.delta for r in by_topic["ctrl.command"]} == {1}
    assert isinstance(by_topic["ctrl.command"][0].message, Command)
    assert stats is not None and stats.dropped == 0 and stats.queued == 0
    assert stats.recorded == len(records) and stats.file == str(path)
    assert {t: c.recorded for t, c in stats.channels.items()} == {
        t: len(rs) for t, rs in by_topic.items()}
    assert stats.when_full == "wait" and stats.error is None


def test_the_file_carries_the_runs_metadata_and_end(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "run.mcap"

    run = mujou.run(Pendulum(), timer="simulated", duration=0.2, workers=1, seed=11,
                    record=mujou.Recording(path, ports=["sim.*"]))
    run.join(timeout=60)

    info = mcapfile.info(path)
    assert info.complete
    assert [c.topic for c in info.channels] == ["sim.state", "sim.energy"]
    state = info.channels[0]
    assert (state.node, state.port, state.sender_order) == ("sim", "state", 1)
    assert (state.type, state.shape, state.dtype) == ("torch:Tensor", [2], "float64")
    meta = info.run
    assert meta["format"] == "2" and meta["timer"] == "simulated" and meta["seed"] == "11"
    assert meta["mujou_actors"] == mujou.__version__ and meta["torch"] == torch.__version__
    assert info.seeds == dict(run.seeds) and meta["workers"] == "1"
    assert meta["placement"] == "" and json.loads(meta["record_ports"]) == ["sim.*"]
    net = json.loads(meta["net"])
    assert [(n["path"], n["order"]) for n in net["nodes"]] == [("", 0), ("sim", 1), ("ctrl", 2)]
    sim_ports = {p["name"]: p for p in net["nodes"][1]["ports"]}
    assert sim_ports["state"] == {"name": "state", "kind": "output", "type": "torch:Tensor"}
    assert sorted(map(tuple, net["connections"])) == [("ctrl.command", "sim.command"),
                                                      ("sim.state", "ctrl.state")]
    assert "T" in meta["started_at"]
    assert info.end is not None and info.end["failure"] == ""
    assert int(info.end["time_ns"]) == 200_000_000
    assert json.loads(info.end["recorded"]) == {c.topic: c.count for c in info.channels}
    assert info.drops == {}


def test_a_pattern_that_matches_nothing_names_it_and_lists_the_outputs(
        tmp_path: pathlib.Path) -> None:
    net = Pendulum()

    with pytest.raises(ValueError, match=r"'cam\.\*' matches no Output.*sim\.state.*ctrl"):
        mujou.run(net, timer="simulated", duration=0.1,
                  record=mujou.Recording(tmp_path / "x.mcap", ports=["sim.*", "cam.*"]))

    run = mujou.run(net, timer="simulated", duration=0.01)  # the nodes were left free
    run.join(timeout=30)


def test_record_arguments_are_checked_before_anything_starts(tmp_path: pathlib.Path) -> None:
    with pytest.raises(TypeError, match=r"Recording: ports must be a list of glob patterns"):
        mujou.Recording(tmp_path / "x.mcap", ports="sim.*")
    with pytest.raises(ValueError, match="snapshot_every"):
        mujou.run(Pendulum(), timer="simulated",
                  record=mujou.Recording(tmp_path / "x.mcap", snapshots=True))
    with pytest.raises(IsADirectoryError):
        mujou.run(Pendulum(), timer="simulated", record=tmp_path)
    with pytest.raises(ValueError, match="max_messages"):
        mujou.Recording(tmp_path / "x.mcap", max_messages=0)


def test_a_recording_argument_of_the_wrong_type_is_a_type_error_as_for_a_capsule(tmp_path):
    for kwargs in ({"max_messages": 1.5}, {"max_bytes": "1"}, {"chunk_size": True},
                   {"when_full": 1}, {"compression": None}):
        name = next(iter(kwargs))

        with pytest.raises(TypeError, match=name):
            mujou.Recording(tmp_path / "x.mcap", **kwargs)
        if name.startswith("max_"):
            with pytest.raises(TypeError, match=name):
                mujou.Capsule(tmp_path / "x.mcap", **kwargs)

    with pytest.raises(ValueError, match="when_full"):
        mujou.Recording(tmp_path / "x.mcap", when_full="block")


class Burst(mujou.Node):
    """Sends many messages per update, as fast as the sender can."""

    out = mujou.Output(torch.Tensor)

    def __init__(self, n: int) -> None:
        super().__init__(period=0.001)
        self.n = n
        self.sends_s = 0.0
        self.sends = 0

    def on_update(self, dt: float) -> None:
        t = torch.zeros(256)
        t0 = time.perf_counter()
        for _ in range(self.n):
            self.out.send(t)
        self.sends_s += time.perf_counter() - t0
        self.sends += self.n


def test_a_full_queue_drops_the_newest_and_counts_it_never_blocking(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "drops.mcap"
    node = Burst(500)

    run = mujou.run(node, timer="simulated", duration=0.02, workers=1,
                    record=mujou.Recording(path, max_messages=8, when_full="drop"))
    run.join(timeout=60)
    stats = run.stats().recording

    assert stats is not None and stats.when_full == "drop"
    channel = stats.channels["out"]
    assert channel.sent == node.sends == 20 * 500
    assert channel.dropped > 0 and channel.recorded + channel.dropped == channel.sent
    assert stats.queued == 0
    # Never blocking: a send with a full queue costs what a send costs.
    assert node.sends_s / node.sends < 50e-6
    info = mcapfile.info(path)
    assert info.drops == {"out": channel.dropped}
    assert info.channels[0].count == channel.recorded
    seqs = [r.sequence for r in mcapfile.read(path)]
    assert seqs == sorted(seqs) and len(seqs) == channel.recorded  # gaps mark the drops


def test_a_byte_bound_drops_big_messages(tmp_path: pathlib.Path) -> None:
    node = Burst(50)

    run = mujou.run(node, timer="simulated", duration=0.005, workers=1,
                    record=mujou.Recording(tmp_path / "b.mcap", max_bytes=4096,
                                           when_full="drop"))
    run.join(timeout=60)
    stats = run.stats().recording

    assert stats is not None and stats.dropped > 0
    assert stats.recorded + stats.dropped == node.sends


@pytest.mark.slow
def test_when_full_wait_records_everything_in_simulated_time(tmp_path: pathlib.Path) -> None:
    node = Burst(200)

    run = mujou.run(node, timer="simulated", duration=0.02, workers=1,
                    record=mujou.Recording(tmp_path / "w.mcap", max_messages=4))
    run.join(timeout=60)
    stats = run.stats().recording

    assert stats is not None and stats.when_full == "wait"
    assert stats.dropped == 0 and stats.recorded == node.sends == 20 * 200


def test_real_time_drops_by_default(tmp_path: pathlib.Path) -> None:
    run = mujou.run(Pendulum(), duration=0.05, record=tmp_path / "rt.mcap")
    run.join(timeout=60)
    stats = run.stats().recording

    assert stats is not None and stats.when_full == "drop"
    assert mcapfile.info(tmp_path / "rt.mcap").run["timer"] == "realtime"
    assert stats.recorded > 0


class Anything(mujou.Node):
    out = mujou.Output(object)

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.out.send({1, 2} if self.n % 2 else 1.5)  # a set: no snapshot holds one


def test_a_message_the_file_cannot_hold_is_counted_not_fatal(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "obj.mcap"

    run = mujou.run(Anything(), timer="simulated", duration=0.05, record=path)
    run.join(timeout=60)
    stats = run.stats().recording

    assert stats is not None
    assert stats.unrecordable == 3 and stats.recorded == 2
    assert [r.message for r in mcapfile.read(path)] == [1.5, 1.5]
    assert json.loads(mcapfile.info(path).end["unrecordable"]) == {"out": 3}  # type: ignore


class Failing(mujou.Node):
    out = mujou.Output(int)

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == 5:
            raise RuntimeError("boom")
        self.out.send(self.n)


def test_a_failed_run_closes_its_recording_saying_why(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "fail.mcap"

    run = mujou.run(Failing(), timer="simulated", duration=1.0, record=path)
    with pytest.raises(mujou.NodeError):
        run.join(timeout=60)

    info = mcapfile.info(path)
    assert info.complete and info.end is not None
    assert "boom" in info.end["failure"]
    assert [r.message for r in mcapfile.read(path)] == [1, 2, 3, 4]


def test_supervisor_snapshots_are_attached(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "snap.mcap"

    run = mujou.run(Pendulum(), timer="simulated", duration=0.3,
                    record=mujou.Recording(path, snapshots=True),
                    supervisor=mujou.Supervisor(snapshot_every=0.1))
    run.join(timeout=60)

    got = [(a.name, a.t_ns) for a in mcapfile.info(path).attachments]
    assert got == [(f"snapshot-{t}.mujou", t) for t in (0, 100_000_000, 200_000_000,
                                                        300_000_000)]
    (_, data), *_ = mcapfile.Reader(path).attachments()
    tree = mujou.snapshot.loads(data)
    assert tree["time_ns"] == 0 and "sim" in tree["nodes"]


CRASH = textwrap.dedent('''
    import os, sys, threading, time
    sys.path.insert(0, {tests!r})
    import mujou_actors as mujou
    from test_recording import Burst

    node = Burst(20)
    run = mujou.run(node, duration=None, record=mujou.Recording({path!r}, chunk_size=4096))
    time.sleep(1.5)  # FLUSH_EVERY: the writer closes its chunk within a second
    os._exit(3)      # a crash: no stop, no summary, no footer
''')


@pytest.mark.slow
def test_a_crash_mid_run_leaves_a_readable_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "crash.mcap"
    script = CRASH.format(tests=str(ROOT / "tests"), path=str(path))

    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})

    assert done.returncode == 3
    info = mcapfile.info(path)
    assert not info.complete and info.end is None
    assert info.messages > 0
    seqs = [r.sequence for r in mcapfile.read(path)]
    assert seqs[:10] == list(range(10))


def test_a_run_that_records_nothing_has_no_recording_stats() -> None:
    run = mujou.run(Pendulum(), timer="simulated", duration=0.05)
    run.join(timeout=30)

    assert run.stats().recording is None
    assert not any(t.name == "mujou-recorder" for t in threading.enumerate())


@pytest.mark.slow
def test_mujou_run_records_with_record_and_record_port(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "cli.mcap"
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}

    done = subprocess.run([sys.executable, "-m", "mujou_actors", "run",
                           str(ROOT / "tests" / "nets" / "cli_nets.py"), "--timer", "simulated",
                           "--duration", "0.2", "--record", str(path), "--record-port",
                           "ticker.*"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    refused = subprocess.run([sys.executable, "-m", "mujou_actors", "run",
                              str(ROOT / "tests" / "nets" / "cli_nets.py"), "--record-port",
                              "x.*"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)

    assert done.returncode == 0, done.stderr
    assert f"recorded 20 messages to {path}" in done.stderr
    info = mcapfile.info(path)
    assert [(c.topic, c.count) for c in info.channels] == [("ticker.out", 20)]
    assert refused.returncode == 2 and "--record-port" in refused.stderr


def _inspect(*args: str) -> Any:
    from click.testing import CliRunner

    from mujou_actors.cli import main

    return CliRunner().invoke(main, ["inspect", *args])


def test_mujou_inspect_shows_channels_counts_rates_span_seeds_attachments(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "run.mcap"
    run = mujou.run(Pendulum(), timer="simulated", duration=1.0, seed=3,
                    record=mujou.Recording(path, snapshots=True),
                    supervisor=mujou.Supervisor(snapshot_every=0.5))
    run.join(timeout=60)

    text = _inspect(str(path))
    data = _inspect(str(path), "--json")

    assert text.exit_code == 0, text.output
    out = text.output
    assert "complete" in out and "timer simulated" in out and "seed 3" in out
    assert "0.000 .. 1.000 s" in out and "302 messages, 0 dropped" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.startswith(("sim.", "ctrl."))}
    assert rows["sim.energy"][1:5] == ["builtins:float", "100", "100.0", "4,800"]
    assert rows["sim.state"][1:3] == ["torch:Tensor", "float64[2]"]
    assert f"sim={run.seeds['sim']}" in out
    assert "attachments: 3" in out and "snapshot-500000000.mujou" in out
    assert data.exit_code == 0
    got = json.loads(data.output)
    assert got["kind"] == "recording" and got["complete"] and got["messages"] == 302
    energy = next(c for c in got["channels"] if c["topic"] == "sim.energy")
    assert (energy["count"], energy["rate"], energy["dropped"]) == (100, 100.0, 0)
    assert got["seeds"] == dict(run.seeds) and len(got["attachments"]) == 3
    assert got["span_s"] == 1.0


def test_mujou_inspect_of_a_cut_or_damaged_recording(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "run.mcap"
    run = mujou.run(Burst(20), timer="simulated", duration=0.2, record=mujou.Recording(
        path, chunk_size=4096))
    run.join(timeout=60)
    data = path.read_bytes()
    cut, bad = tmp_path / "cut.mcap", tmp_path / "bad.mcap"
    cut.write_bytes(data[: len(data) // 2])
    damaged = bytearray(data)
    damaged[len(data) // 3] ^= 0x01
    bad.write_bytes(bytes(damaged))

    cut_result = _inspect(str(cut))
    bad_result = _inspect(str(bad))

    assert cut_result.exit_code == 0 and "cut at byte" in cut_result.output
    assert bad_result.exit_code == 2
    assert str(bad) in bad_result.output and "damaged" in bad_result.output
    assert len(bad_result.output.strip().splitlines()) == 1


def _records(path: pathlib.Path) -> list[tuple[str, int, int, int, Any]]:
    return [(r.topic, r.sequence, r.t_ns, r.delta, r.message) for r in mcapfile.read(path)]


def _same_records(a: list[tuple[str, int, int, int, Any]],
                  b: list[tuple[str, int, int, int, Any]]) -> bool:
    return len(a) == len(b) and all(
        x[:4] == y[:4] and _same(x[4], y[4]) for x, y in zip(a, b, strict=True))


def test_a_placed_run_records_on_the_host_what_one_process_records(
        tmp_path: pathlib.Path) -> None:
    from mujou_actors._runtime.build import Seams
    from mujou_actors.distributed import placed
    from mujou_actors.run import _check_arguments
    from tests.placed_support import InProcessSystem, make_net

    one, many = tmp_path / "one.mcap", tmp_path / "placed.mcap"
    with mujou.run(make_net(), timer="simulated", duration=0.3, seed=7, workers=1,
                   record=one) as run:
        run.join(timeout=60)
    args = _check_arguments(Seams(), workers=1, timer="simulated", duration=0.3, seed=7,
                            state=None, supervisor=None, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=10.0, start_timeout=60.0, record=many)

    prun = placed.start(make_net, placement=mujou.Placement({"sim": "a", "ctrl": "b"}),
                        args=args, inputs=None, state=None, make_system=InProcessSystem)
    prun.join(timeout=60)
    stats = prun.stats().recording

    expected = _records(one)
    got = _records(many)
    assert len(expected) > 50
    assert _same_records(got, expected)
    assert stats is not None and stats.recorded == len(got) and stats.dropped == 0
    info = mcapfile.info(many)
    assert info.complete and json.loads(info.run["placement"]) == {"sim": "a", "ctrl": "b"}
    assert [c.topic for c in info.channels] == [c.topic for c in mcapfile.info(one).channels]
    assert info.end is not None and info.end["failure"] == ""


@pytest.mark.slow
def test_a_placed_run_in_processes_records_with_mujou_run(tmp_path: pathlib.Path) -> None:
    from tests.placed_support import make_net

    path = tmp_path / "procs.mcap"
    one = tmp_path / "one.mcap"
    with mujou.run(make_net(), timer="simulated", duration=0.2, seed=3, record=one) as run:
        run.join(timeout=60)

    run = mujou.run("tests.placed_support:make_net", placement={"ctrl": "c"},
                    timer="simulated", duration=0.2, seed=3,
                    record=mujou.Recording(path, ports=["ctrl.*", "sim.*"]))
    run.join(timeout=120)

    assert _same_records(_records(path), _records(one))
    assert run.stats().recording.recorded == len(_records(one))  # type: ignore[union-attr]


def test_a_placed_run_refuses_a_pattern_that_matches_nothing(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="'cam.*' matches no Output"):
        mujou.run("tests.placed_support:make_net", placement={"ctrl": "c"},
                  timer="simulated", duration=0.2,
                  record=mujou.Recording(tmp_path / "x.mcap", ports=["cam.*"]))


def test_a_placed_run_attaches_the_supervisors_snapshots(tmp_path: pathlib.Path) -> None:
    from mujou_actors._runtime.build import Seams
    from mujou_actors.distributed import placed
    from mujou_actors.run import _check_arguments
    from tests.placed_support import InProcessSystem, make_net

    path = tmp_path / "snap.mcap"
    args = _check_arguments(Seams(), workers=1, timer="simulated", duration=0.2, seed=7,
                            state=None, supervisor=mujou.Supervisor(snapshot_every=0.1),
                            trace=None, cuda_sync="block", stats=True, stop_timeout=10.0,
                            start_timeout=60.0, record=mujou.Recording(path, snapshots=True))

    prun = placed.start(make_net, placement=mujou.Placement({"sim": "a"}), args=args,
                        inputs=None, state=None, make_system=InProcessSystem)
    prun.join(timeout=60)

    got = [a.t_ns for a in mcapfile.info(path).attachments]
    assert got == [0, 100_000_000, 200_000_000]
    trees = [mujou.snapshot.loads(data) for _, data in mcapfile.Reader(path).attachments()]
    assert [sorted(t["nodes"]) for t in trees] == [["ctrl", "log", "sim"]] * 3


def test_a_writer_that_fails_stops_recording_and_join_raises_it(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mcapfile.Writer, "write_message", full)
    node = Burst(10)

    run = mujou.run(node, timer="simulated", duration=0.05, record=tmp_path / "full.mcap")
    with pytest.raises(OSError, match="No space left"):
        run.join(timeout=60)
    stats = run.stats().recording

    assert stats is not None and "No space left" in (stats.error or "")
    assert stats.recorded == 0 and stats.dropped + stats.queued > 0
    assert node.sends == 500  # the run went on to its end


def test_written_messages_are_freed_by_the_senders_within_a_bound(
        tmp_path: pathlib.Path) -> None:
    import types
    import weakref

    from mujou_actors.recording import recorder as recording

    spec = mcapfile.ChannelSpec("src.out", "src", "out", 0, object)
    recorder = recording.Recorder(mujou.Recording(tmp_path / "r.mcap"), [spec], {},
                                  simulated=True, host_copy=None)
    hook = recorder.hook(0, types.SimpleNamespace(flight=[None, (0, 0)]))  # type: ignore[arg-type]
    small = [torch.full((256,), float(i)) for i in range(300)]  # 1 KiB each
    big = torch.zeros(8192)  # 32 KiB: over _RETURN_MAX
    alive = [weakref.ref(t) for t in small]
    big_alive = weakref.ref(big)
    for t in small:
        hook(t)
    hook(big)
    hook(2.5)  # a float is never kept
    del small, big, t

    # The writer's turn, on this thread: every message written, 256 kept for the senders.
    assert recorder._write_batch() is True
    kept = [i for i, ref in enumerate(alive) if ref() is not None]
    assert kept == list(range(recording._RETURNED)) and big_alive() is None
    assert len(recorder._dead) == recording._RETURNED

    hook(torch.ones(3))  # a sender frees the two oldest as it sends
    assert [ref() is None for ref in alive[:3]] == [True, True, False]

    assert recorder.close(10, "", timeout=5) is None
    assert not recorder._dead and all(ref() is None for ref in alive)
    assert [r.message for r in mcapfile.read(tmp_path / "r.mcap")][301] == 2.5


def test_a_disk_that_fills_mid_run_names_the_file_and_counts_what_it_lost(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The file system is full once the file holds 40 KB: the chunk in progress is lost.
    real_write = mcapfile._Stream.write

    def write(self: Any, data: Any) -> int:
        if self.tell() + len(data) > 40_000:
            try:
                raise OSError(28, "No space left on device")
            except OSError as e:
                if self.error is None:
                    self.error = OSError(e.errno, e.strerror, self.path)
                raise self.error from e
        return real_write(self, data)

    monkeypatch.setattr(mcapfile._Stream, "write", write)
    path = tmp_path / "full.mcap"
    node = Burst(10)

    run = mujou.run(node, timer="simulated", duration=0.05,
                    record=mujou.Recording(path, chunk_size=4096))
    with pytest.raises(OSError, match="No space left") as info:
        run.join(timeout=60)
    stats = run.stats().recording

    assert info.value.filename == str(path)  # the error names the file
    assert stats is not None and stats.error is not None and str(path) in stats.error
    found = mcapfile.info(path)
    assert not found.complete and 0 < found.messages < node.sends
    # What the counts say is what the file holds; the rest is dropped, nothing unaccounted.
    assert stats.recorded == found.messages
    assert stats.recorded + stats.dropped + stats.unrecordable + stats.queued == node.sends
    assert [r.sequence for r in mcapfile.read(path)] == list(range(found.messages))
