"""The `mujou` command, run as a user would: a subprocess, no terminal."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

import mujou_actors as mujou

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETS = os.path.join(ROOT, "tests", "nets", "cli_nets.py")


def mujou_cmd(*args: str, env: dict[str, str] | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mujou_actors", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_run_prints_plain_lines_and_a_final_table_without_a_terminal(tmp_path) -> None:
    stats = tmp_path / "stats.json"

    result = mujou_cmd("run", NETS, "--timer", "simulated", "--duration", "1",
                       "--stats-json", str(stats))

    assert result.returncode == 0, result.stderr
    assert "\x1b[" not in result.stdout + result.stderr          # no escape codes
    lines = result.stdout.splitlines()
    assert lines[-3].split("\t")[:3] == ["node", "updates/s", "target/s"]
    assert lines[-2].startswith("ticker\t") and lines[-1].startswith("sink\t")
    data = json.loads(stats.read_text())
    assert data["nodes"]["ticker"]["updates"] == 100 and data["time"] == 1.0


@pytest.mark.slow
def test_quiet_prints_nothing_and_name_picks_the_net(tmp_path) -> None:
    result = mujou_cmd("run", f"{NETS}:net", "--timer", "simulated", "--duration", "0.5",
                       "--quiet")

    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


@pytest.mark.slow
@pytest.mark.parametrize(
    "target, text",
    [
        ("no/such/file.py", "no/such/file.py: no such file"),
        (f"{NETS}:missing", "has no 'missing'"),
        (f"{NETS}:not_a_net", "is a int, not a net"),
    ],
)
def test_bad_targets_are_one_line_and_exit_2(target: str, text: str) -> None:
    result = mujou_cmd("run", target, "--timer", "simulated", "--duration", "0.1")

    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and text in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_bad_option_exits_2() -> None:
    result = mujou_cmd("run", NETS, "--timer", "wallclock")

    assert result.returncode == 2 and "wallclock" in result.stderr


@pytest.mark.slow
def test_a_node_failure_is_one_line_and_exit_1_with_the_traceback_under_verbose() -> None:
    plain = mujou_cmd("run", f"{NETS}:make_broken", "--timer", "simulated", "--duration", "1",
                      "--quiet")
    verbose = mujou_cmd("run", f"{NETS}:make_broken", "--timer", "simulated", "--duration",
                        "1", "--quiet", "--verbose")

    assert plain.returncode == verbose.returncode == 1
    assert "error: NodeError: node '<root>' raised in on_update: ZeroDivisionError" in plain.stderr
    assert plain.stderr.count("raised in on_update") == 1     # reported once, not logged too
    assert "Traceback" not in plain.stderr
    assert "Traceback" in verbose.stderr and "the sensor divided by zero" in verbose.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_stops_cleanly_writes_the_final_state_and_exits_130(tmp_path, sig, code) -> None:
    marker = tmp_path / "stopped"
    snaps = tmp_path / "snaps"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mujou_actors", "run", NETS, "--snapshot-dir", str(snaps)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "MUJOU_TEST_STOP_MARKER": str(marker)})
    status = proc.stdout.readline()                 # the first status line: t > 0

    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)

    assert status.startswith("t=") and proc.returncode == code, err
    assert int(marker.read_text()) > 0                        # on_stop ran
    final = mujou.load(mujou.latest_snapshot(snaps))
    assert int(final["nodes"]["ticker"]["count"]) == int(marker.read_text())
    assert "final state written to" in err


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line)
    into.put(None)


def _wait_for(lines: queue.Queue, text: str, seen: list[str], timeout: float) -> bool:
    """Collect lines into ``seen`` until one holds ``text`` (True) or EOF/timeout (False)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            return False
        if line is None:
            return False
        seen.append(line)
        if text in line:
            return True
    return False


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_second_signal_while_stopping_keeps_the_clean_stop_and_its_files(
        tmp_path, sig, code) -> None:
    snaps, stats, marker = tmp_path / "snaps", tmp_path / "stats.json", tmp_path / "stopped"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mujou_actors", "run", f"{NETS}:make_slow_stop",
         "--snapshot-dir", str(snaps), "--stats-json", str(stats)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "MUJOU_TEST_STOP_MARKER": str(marker)})
    out: queue.Queue = queue.Queue()
    err: queue.Queue = queue.Queue()
    for stream, lines in ((proc.stdout, out), (proc.stderr, err)):
        threading.Thread(target=_lines, args=(stream, lines), daemon=True).start()
    stdout: list[str] = []
    stderr: list[str] = []
    try:
        ready = _wait_for(out, "ready", stdout, 60)
        proc.send_signal(sig)                    # the first: the run stops
        stopping = _wait_for(out, "stopping", stdout, 60)    # on_stop waits for stdin
        proc.send_signal(sig)                    # the second, while it stops
        noted = _wait_for(err, "interrupted again", stderr, 20)
        proc.stdin.write("go\n")                 # on_stop may return now
        proc.stdin.flush()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    _wait_for(err, "\0", stderr, 5)              # the rest, up to EOF

    assert (ready, stopping, noted, proc.returncode) == (True, True, True, code), stderr
    count = int(marker.read_text())
    assert count > 0                                                  # on_stop ran
    final = mujou.load(mujou.latest_snapshot(snaps))
    assert int(final["nodes"][""]["count"]) == count                  # the root node
    assert json.loads(stats.read_text())["nodes"][""]["updates"] == count
    assert any("final state written to" in line for line in stderr)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_signal_while_the_net_starts_stops_it_cleanly_once_started(tmp_path) -> None:
    snaps, stats, marker = tmp_path / "snaps", tmp_path / "stats.json", tmp_path / "stopped"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mujou_actors", "run", f"{NETS}:make_slow_start",
         "--snapshot-dir", str(snaps), "--stats-json", str(stats)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "MUJOU_TEST_STOP_MARKER": str(marker)})
    out: queue.Queue = queue.Queue()
    err: queue.Queue = queue.Queue()
    for stream, lines in ((proc.stdout, out), (proc.stderr, err)):
        threading.Thread(target=_lines, args=(stream, lines), daemon=True).start()
    stdout: list[str] = []
    stderr: list[str] = []
    try:
        starting = _wait_for(out, "starting", stdout, 60)   # on_start waits for stdin
        proc.send_signal(signal.SIGTERM)
        noted = _wait_for(err, "stops as soon as the net has started", stderr, 20)
        proc.stdin.write("go\n")                            # on_start may return now
        proc.stdin.flush()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    _wait_for(err, "\0", stderr, 5)

    assert (starting, noted, proc.returncode) == (True, True, 143), stderr
    count = int(marker.read_text())                                   # on_stop ran
    assert int(mujou.load(mujou.latest_snapshot(snaps))["nodes"][""]["count"]) == count
    assert json.loads(stats.read_text())["nodes"][""]["updates"] == count


@pytest.mark.slow
@pytest.mark.parametrize("option, name, message", [
    ("--stats-json", "missing/stats.json",
     "error: FileNotFoundError: --stats-json {path!r} cannot be written: its folder "
     "{folder!r} does not exist"),
    ("--trace", "READ_ONLY/t.json",
     "error: PermissionError: --trace {path!r} cannot be written: the folder {folder!r} "
     "does not take a new file"),
    ("--snapshot-dir", "file/snaps",
     "error: NotADirectoryError: --snapshot-dir {path!r} cannot be written: {folder!r} is a "
     "file, not a folder"),
])
def test_output_paths_that_cannot_be_written_are_refused_before_anything_runs(
        tmp_path, unwritable_folder, option, name, message) -> None:
    (tmp_path / "file").write_text("")
    path = str(tmp_path / name).replace(str(tmp_path / "READ_ONLY"), str(unwritable_folder))
    marker = tmp_path / "stopped"

    result = mujou_cmd("run", NETS, "--timer", "simulated", "--duration", "0.1", option, path,
                       env={"MUJOU_TEST_STOP_MARKER": str(marker)})

    folder = os.path.dirname(path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(message.format(path=path, folder=folder)), result.stderr
    assert result.stderr.count("\n") == 1 and not marker.exists()      # nothing ran


@pytest.mark.slow
def test_inspect_summarizes_a_snapshot(tmp_path) -> None:
    from tests.nets.cli_nets import Pair

    run = mujou.run(Pair(), timer="simulated", duration=0.05, seed=7)
    run.join()
    path = tmp_path / "pair.mujou"
    mujou.save(run.state_dict(), path)

    result = mujou_cmd("inspect", str(path))

    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("mujou snapshot, file format 2")
    assert "time 0.050000000 s" in out
    assert f"  ticker: {run.seeds['ticker']}" in out
    assert "    count: tensor int64 [] (8 bytes)" in out
    # The ticker's generator was never drawn from: its state is its seed.
    assert f"    generator: seed {run.seeds['ticker']} (not drawn from yet)" in out
    assert "kept messages: 0" in out


@pytest.mark.slow
def test_inspect_of_a_damaged_file_is_one_line(tmp_path) -> None:
    bad = tmp_path / "bad.mujou"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)

    result = mujou_cmd("inspect", str(bad))

    assert result.returncode == 2
    assert "not a mujou snapshot" in result.stderr and "Traceback" not in result.stderr


def test_inspect_refuses_every_damaged_file_and_prints_nothing_from_it(tmp_path) -> None:
    from click.testing import CliRunner

    from mujou_actors.cli import main
    from tests.nets.cli_nets import Pair

    run = mujou.run(Pair(), timer="simulated", duration=0.05, seed=7)
    run.join()
    good = tmp_path / "pair.mujou"
    mujou.save(run.state_dict(), good)
    data = good.read_bytes()
    bad = tmp_path / "bad.mujou"
    outcomes = []

    for i in range(len(data)):                  # one bit flipped in every byte in turn
        flipped = bytearray(data)
        flipped[i] ^= 1 << (i % 8)
        bad.write_bytes(flipped)
        result = CliRunner().invoke(main, ["inspect", str(bad)])
        outcomes.append((result.exit_code, result.stdout,
                         result.stderr.startswith(f"error: SnapshotError: {bad}: ")))

    assert outcomes == [(2, "", True)] * len(data)
    assert CliRunner().invoke(main, ["inspect", str(good)]).exit_code == 0


@pytest.mark.slow
def test_the_console_script_is_installed() -> None:
    import shutil

    exe = shutil.which("mujou") or os.path.join(os.path.dirname(sys.executable), "mujou")

    result = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)

    assert result.returncode == 0 and "inspect" in result.stdout and "run" in result.stdout


@pytest.mark.slow
def test_a_node_class_can_be_named_and_the_final_state_is_saved_at_the_end(tmp_path) -> None:
    snaps = tmp_path / "snaps"

    result = mujou_cmd("run", f"{NETS}:Pair", "--timer", "simulated", "--duration", "0.3",
                       "--snapshot-dir", str(snaps), "--quiet")

    assert result.returncode == 0, result.stderr
    final = mujou.load(mujou.latest_snapshot(snaps))
    assert final["time_ns"] == 300_000_000 and int(final["nodes"]["ticker"]["count"]) == 30


@pytest.mark.slow
def test_a_failed_run_does_not_overwrite_the_latest_snapshot(tmp_path) -> None:
    snaps = tmp_path / "snaps"

    result = mujou_cmd("run", f"{NETS}:make_broken", "--timer", "simulated", "--duration", "1",
                       "--snapshot-dir", str(snaps), "--quiet")

    assert result.returncode == 1
    assert mujou.load(mujou.latest_snapshot(snaps))["time_ns"] == 0   # the start, not the failure


@pytest.mark.slow
def test_a_snapshot_refused_during_the_run_is_a_failed_run_exit_1(tmp_path) -> None:
    # The net's first snapshot (t = 0) is fine; the one at 0.2 s holds a set, which a
    # file cannot bring back: the run fails there. That is a failed run (1), not a
    # mistake in the command line (2).
    snaps = tmp_path / "snaps"

    result = mujou_cmd("run", f"{NETS}:make_unsaveable", "--timer", "simulated",
                       "--duration", "1", "--snapshot-every", "0.1", "--snapshot-dir",
                       str(snaps), "--quiet")

    errors = [line for line in result.stderr.splitlines() if "cannot go into" in line]
    assert result.returncode == 1
    assert len(errors) == 1 and errors[0].startswith("error: TypeError: cannot write the "
                                                     "snapshot file ")
    assert "Input 'reader.inp'" in errors[0] and "Traceback" not in result.stderr
    assert mujou.load(mujou.latest_snapshot(snaps))["time_ns"] == 100_000_000


def test_the_live_view_at_80_columns_keeps_node_names_and_rates_whole() -> None:
    import io

    from rich.console import Console

    from mujou_actors import cli
    from mujou_actors.stats import NodeStats, RunStats, WorkerStats

    names = ["physics", "sensor", "controller", "recorder", "rig.camera_left",
             "rig.arm.joint_ctl"]
    nodes = {path: NodeStats(path, 150_000, 0, 0.010, 0.0123, 0.0011, 0.0011, 1.1,
                             {"command": 3 * 10**i}, i) for i, path in enumerate(names)}
    stats = RunStats(30.0, 1.6, nodes, {"mujou-worker-0": WorkerStats("mujou-worker-0", 0.7)})
    rates = {path: (123_542.2 if i == 0 else 99.9, 0.393) for i, path in enumerate(names)}
    periods: dict[str, float | None] = {path: 0.001 for path in names}
    periods["recorder"] = None
    console = Console(width=80, record=True, file=io.StringIO())

    console.print(cli._live_table(stats, rates, periods))

    lines = console.export_text().splitlines()
    rows = {line.split()[0]: line.split() for line in lines if line.split()[:1] in
            ([n] for n in names)}
    assert list(rows) == names and max(len(line) for line in lines) <= 80
    assert rows["physics"][1:3] == ["123,542.2", "1,000.0"]      # updates/s, target/s
    assert rows["recorder"][1:3] == ["99.9", "-"]
    assert rows["rig.arm.joint_ctl"][3:8] == ["10.000", "12.300", "1.100", "39.3%", "300k"]
    assert [row[-2:] for row in rows.values()] == [
        ["3", "0"], ["30", "1"], ["300", "2"], ["3000", "3"], ["30000", "4"], ["300k", "5"]]


def _live_view_text(names: list[str], width: int = 80) -> list[str]:
    """The live view's table for nodes at ``names``, as ``width`` columns of text."""
    import io

    from rich.console import Console

    from mujou_actors import cli
    from mujou_actors.stats import NodeStats, RunStats, WorkerStats

    nodes = {path: NodeStats(path, 600_000, 0, 0.002, 0.0031, 0.0001, 0.0005, 1.0,
                             {"state": 15_000 * (i + 1)}, i + 1) for i, path in enumerate(names)}
    stats = RunStats(30.0, 2.5, nodes, {"mujou-worker-0": WorkerStats("mujou-worker-0", 0.7)})
    rates = {path: (12_145.1, 0.49) for path in names}
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(cli._live_table(stats, rates, {path: 0.002 for path in names}))
    return [line.rstrip() for line in console.export_text().splitlines()]


def test_the_live_view_at_80_columns_shows_every_count_of_nodes_with_long_paths() -> None:
    # A 29- and a 45-character path leave too little room for the node column:
    # it folds the paths onto further lines, and no figure is cut or left out
    # (rich used to drop the drops and restarts columns, values and all).
    names = ["arm.left.wrist.camera.decoder", "arm.right.gripper", "b" * 45]

    lines = _live_view_text(names)

    assert max(len(line) for line in lines) <= 80
    rows = [line.split() for line in lines if "12,145.1" in line]
    assert [row[1:] for row in rows] == [
        ["12,145.1", "500.0", "2.000", "3.100", "0.500", "49.0%", str(drops), str(restarts)]
        for drops, restarts in ((15000, 1), (30000, 2), (45000, 3))]
    body = lines[lines.index("─" * 80) + 1:lines.index(lines[-2])]  # rule to caption
    assert "".join(line.split()[0] for line in body) == "".join(names)  # whole, in order
    assert lines[2].split()[-2:] == ["drops", "res…"]  # the heading gave way, not a count


def test_the_live_view_says_that_its_lateness_is_of_the_newest_256_updates() -> None:
    lines = _live_view_text(["physics", "sensor"])

    notes = [line.strip() for line in lines if "late p99:" in line]
    assert notes == ["late p99: of each node's newest 256 updates"]
    assert max(len(line) for line in lines) <= 80
    assert lines[-1].strip() == "busy: mujou-worker-0 70%"


def _machines_stats():
    """A run across two machines' stats: the host's, and members robot and gpu-box."""
    from mujou_actors.stats import MachineStats, RunStats

    machines = {
        "": MachineStats("", "workstation", ("host",), (4101,), 12.25, 2_500_000, 40_000,
                         1_472, 608),
        "robot": MachineStats("robot", "robot-pc", ("physics", "sensors"), (5210, 5211), 3.5,
                              21_000, 1_250_000, 608, 1_472, 15_000, 187_000, 271_000,
                              0.0012, 0.0087),
        "gpu-box": MachineStats("gpu-box", "gpu-box", ("vision",), (900,), 40.0, 19_000,
                                1_250_000, 304, 736),  # no answer yet
    }
    return RunStats(30.0, 2.5, {}, {}, machines=machines)


def test_the_machines_of_a_run_across_machines_are_rows_of_exact_figures() -> None:
    from mujou_actors import cli

    rows = list(cli._machine_rows(_machines_stats()))

    assert [dict(zip(cli.MACHINE_COLUMNS, row, strict=True)) for row in rows] == [
        {"machine": "<host>", "host": "workstation", "groups": "host", "pids": "4101",
         "cpu s": "12.2", "net in": "2500000", "net out": "40000", "offset ms": "-",
         "uncert ms": "-", "rtt ms": "-", "age p50 ms": "-", "age p99 ms": "-"},
        {"machine": "robot", "host": "robot-pc", "groups": "physics,sensors",
         "pids": "5210,5211", "cpu s": "3.5", "net in": "21000", "net out": "1250000",
         "offset ms": "+0.015", "uncert ms": "0.187", "rtt ms": "0.271", "age p50 ms": "1.200",
         "age p99 ms": "8.700"},
        {"machine": "gpu-box", "host": "gpu-box", "groups": "vision", "pids": "900",
         "cpu s": "40.0", "net in": "19000", "net out": "1250000", "offset ms": "-",
         "uncert ms": "-", "rtt ms": "-", "age p50 ms": "-", "age p99 ms": "-"}]
    assert cli._has_members(_machines_stats())
    assert not cli._has_members(mujou.RunStats(1.0, 1.0, {}, {}))


def test_the_live_views_machines_table_fits_80_columns_with_every_figure() -> None:
    import io

    from rich.console import Console

    from mujou_actors import cli

    console = Console(width=80, record=True, file=io.StringIO())
    console.print(cli._machines_table(_machines_stats()))

    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert max(len(line) for line in lines) <= 80
    rows = {line.split()[0]: line.split() for line in lines
            if line.split()[:1] in (["<host>"], ["robot"], ["gpu-box"])}
    assert rows["robot"][-6:] == ["3.5", "21000", "1.2M", "+0.015", "0.187", "8.700"]
    assert rows["<host>"][3:] == ["12.2", "2.5M", "40000", "-", "-", "-"]
    robot = lines.index(next(line for line in lines if line.startswith("robot")))
    words = " ".join(lines[robot:robot + 2]).split()  # its groups and pids may wrap
    assert {"physics,", "sensors", "5210,", "5211"} <= set(words)


def test_stats_json_of_a_placed_run_has_its_groups_and_machines() -> None:
    from mujou_actors import cli

    stats = _machines_stats()
    group = mujou.GroupStats("physics", 5210, 1.0, ("sim",), 1, 2, 3, 4, 0, "robot")
    stats = mujou.RunStats(1.0, 1.0, {}, {}, groups={"physics": group},
                           machines=stats.machines)

    data = json.loads(json.dumps(cli._stats_json(stats)))

    assert data["groups"]["physics"]["machine"] == "robot"
    assert list(data["machines"]) == ["", "robot", "gpu-box"]
    assert data["machines"]["robot"]["pids"] == [5210, 5211]
    assert data["machines"]["robot"]["clock_uncertainty_ns"] == 187_000
    assert data["machines"]["gpu-box"]["message_age_p99"] is None


def test_counts_in_the_live_view_take_at_most_five_characters() -> None:
    from mujou_actors.cli import _count

    counts = [0, 99_999, 100_000, 149_999, 999_499, 999_500, 2_949_999, 9_950_000,
              99_950_000, 10**12, 2**63 - 1]

    assert [_count(n) for n in counts] == ["0", "99999", "100k", "150k", "999k", "1.0M",
                                           "2.9M", "10M", "100M", "1.0T", "9.2E"]


@pytest.mark.slow
def test_record_view_writes_view_channels_that_inspect_lists(tmp_path) -> None:
    path = tmp_path / "run.mcap"

    result = mujou_cmd("run", NETS, "--timer", "simulated", "--duration", "0.5", "--quiet",
                       "--record", str(path), "--record-view")
    shown = mujou_cmd("inspect", str(path))

    assert result.returncode == 0, result.stderr
    from mujou_actors.recording import mcapfile

    info = mcapfile.info(path)
    assert [v.view_of for v in info.views] == [c.topic for c in info.channels]
    assert shown.returncode == 0 and "view channels:" in shown.stdout


@pytest.mark.slow
def test_foxglove_serves_the_run_and_says_where(tmp_path) -> None:
    pytest.importorskip("websockets")

    result = mujou_cmd("run", NETS, "--timer", "simulated", "--duration", "0.5",
                       "--foxglove=:0")

    assert result.returncode == 0, result.stderr
    assert "foxglove: live view at ws://127.0.0.1:" in result.stderr
    assert "publishing to Inputs off (--foxglove-publish)" in result.stderr


@pytest.mark.slow
def test_foxglove_publish_and_origins_reach_the_server() -> None:
    pytest.importorskip("websockets")

    result = mujou_cmd("run", NETS, "--timer", "simulated", "--duration", "0.5",
                       "--foxglove=:0", "--foxglove-publish", "--foxglove-origin",
                       "http://localhost:8080", "--foxglove-origin", "null")

    assert result.returncode == 0, result.stderr
    assert "publishing to Inputs on)" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("args", "text"), [
    (["--foxglove=0.0.0.0:8765"], "allow_remote"),
    (["--foxglove=:http"], "no port"),
    (["--foxglove-publish"], "go with --foxglove"),
    (["--foxglove-origin", "https://app.example"], "go with --foxglove"),
    (["--foxglove=:0", "--foxglove-origin", "app.example"], "is no origin"),
    (["--record-view"], "go with --record FILE"),
])
def test_bad_view_options_are_one_line_and_exit_2(args: list[str], text: str) -> None:
    result = mujou_cmd("run", NETS, "--timer", "simulated", "--duration", "0.1", *args)

    assert result.returncode == 2 and text in result.stderr, result.stderr


@pytest.mark.timeout(60)
def test_inspect_of_a_mcap_named_file_that_is_none_says_so(tmp_path) -> None:
    from click.testing import CliRunner

    from mujou_actors.cli import main

    bad = tmp_path / "bad.mcap"
    bad.write_text("hello\n")

    result = CliRunner().invoke(main, ["inspect", str(bad)])

    assert result.exit_code == 2
    assert f"{bad}: not an MCAP file" in result.output and "snapshot" not in result.output


# -- issue 28: the help, a stop timeout reported once, --net-kwargs, progress, --place ---------


@pytest.fixture
def cli_logging():
    """The command adds a handler to the library's logger: in-process, take it away again."""
    import logging

    logger = logging.getLogger("mujou_actors")
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


SLOW_NET = """
import time
import mujou_actors as mujou

class Slow(mujou.Node):
    def __init__(self, period=0.01):
        super().__init__(period=period)
        self.updates = 0

    def on_update(self, dt):
        self.updates += 1

    def on_stop(self):
        time.sleep(0.6)

class Counted(mujou.Node):
    def __init__(self, period=0.01):
        super().__init__(period=period)

    def on_update(self, dt):
        pass

def make_net(period=0.01):
    return Counted(period=period)

net = Slow()
"""


def test_mujou_help_says_what_every_command_does() -> None:
    from click.testing import CliRunner

    from mujou_actors.cli import main

    result = CliRunner().invoke(main, ["--help"])

    assert result.exit_code == 0
    assert "Run, record and replay mujou_actors nets; inspect snapshots and recordings." \
        in result.output
    assert "replay: a recording into a net" in result.output


def test_a_stop_that_times_out_is_reported_once_and_not_also_logged(
        tmp_path, monkeypatch, cli_logging) -> None:
    import functools

    from click.testing import CliRunner

    from mujou_actors.cli import main

    (tmp_path / "slow.py").write_text(SLOW_NET)
    monkeypatch.setattr(mujou, "run", functools.partial(mujou.run, stop_timeout=0.1))

    result = CliRunner().invoke(main, ["run", str(tmp_path / "slow.py"), "--timer",
                                       "simulated", "--duration", "0.05", "--quiet"])

    assert result.exit_code == 1
    assert result.stderr.count("StopTimeoutError") == 1, result.stderr
    assert result.stderr.startswith("error: StopTimeoutError")


@pytest.mark.slow
def test_net_kwargs_reach_the_net_function_without_place(tmp_path, cli_logging) -> None:
    (tmp_path / "nets.py").write_text(SLOW_NET)
    stats = tmp_path / "stats.json"

    result = mujou_cmd("run", str(tmp_path / "nets.py"), "--timer", "simulated",
                       "--duration", "1", "--quiet", "--net-kwargs", '{"period": 0.5}',
                       "--stats-json", str(stats))
    made = mujou_cmd("run", f"{tmp_path / 'nets.py'}:net", "--timer", "simulated",
                     "--duration", "1", "--quiet", "--net-kwargs", '{"period": 0.5}')

    assert result.returncode == 0, result.stderr
    assert json.loads(stats.read_text())["nodes"][""]["updates"] == 2  # period 0.5 s, not 0.01 s
    assert made.returncode == 2 and "--net-kwargs cannot reach" in made.stderr


def test_on_a_terminal_the_command_says_what_it_does_before_the_run_shows(
        tmp_path, monkeypatch, cli_logging) -> None:
    from click.testing import CliRunner

    from mujou_actors import cli

    (tmp_path / "nets.py").write_text(SLOW_NET)
    monkeypatch.setattr(cli, "_shows_progress", lambda quiet: not quiet)
    args = ["run", f"{tmp_path / 'nets.py'}:make_net", "--timer", "simulated", "--duration",
            "0.05"]

    shown = CliRunner().invoke(cli.main, args)
    quiet = CliRunner().invoke(cli.main, [*args, "--quiet"])

    assert shown.exit_code == 0, shown.output
    lines = shown.stderr.splitlines()
    assert lines[:4] == [f"importing {tmp_path / 'nets.py'} ...",
                         f"building the net: {tmp_path / 'nets.py'}:make_net() ...",
                         "starting 1 node (on_start) ...", "started"]
    assert quiet.exit_code == 0 and quiet.stderr == ""


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_foxglove_with_place_serves_every_groups_ports_and_publishes_to_another_group(
        tmp_path) -> None:
    """`mujou run --place ... --foxglove`: a client of the host's view reads a port of the
    group process "a" and of the host's group, and its publish reaches echo, in "a".

    make_echo idles on the simulated timer until the host writes, so every message
    waited for is caused by the client; the server handles a client's requests in
    order (a subscription is made before the next request is read), so nothing
    published after the subscribe can be missed."""
    pytest.importorskip("websockets")
    from tests.test_foxglove import Client

    stats = tmp_path / "stats.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mujou_actors", "run", "tests/placed_support.py:make_echo",
         "--place", "echo=a", "--timer", "simulated", "--foxglove=:0", "--foxglove-publish",
         "--stats-json", str(stats)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: queue.Queue = queue.Queue()
    err: queue.Queue = queue.Queue()
    for stream, lines in ((proc.stdout, out), (proc.stderr, err)):
        threading.Thread(target=_lines, args=(stream, lines), daemon=True).start()
    stderr: list[str] = []
    try:
        served = _wait_for(err, "foxglove: live view at ws://127.0.0.1:", stderr, 90)
        assert served, "".join(stderr)
        port = int(stderr[-1].split("ws://127.0.0.1:")[1].split()[0])
        client = Client(port)
        client.recv_until(lambda: {"echo.inp", "echo.out", "count.inp"} <= set(client.channels),
                          "every group's ports advertised")
        client.send({"op": "subscribe", "subscriptions": [
            {"id": 1, "channelId": client.channels["echo.out"]["id"]},
            {"id": 2, "channelId": client.channels["count.inp"]["id"]}]})
        client.send({"op": "advertise", "channels": [
            {"id": 3, "topic": "echo.inp", "encoding": "json", "schemaName": "inp"}]})
        for value in (5, {"value": 6}, -7):
            client.publish(3, value)
        client.recv_until(lambda: len(client.of(1)) == 3 and len(client.of(2)) == 3,
                          "three doubled values on each channel")
        client.ws.close()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    _wait_for(err, "\0", stderr, 5)  # the rest, up to EOF

    doubled = [{"value": 10}, {"value": 12}, {"value": -14}]
    assert client.of(1) == doubled and client.of(2) == doubled
    assert proc.returncode == 130, "".join(stderr)
    assert any("publishing to Inputs on)" in line for line in stderr)
    data = json.loads(stats.read_text())
    assert set(data["groups"]) == {"a", "host"}
    assert data["groups"]["a"]["nodes"] == ["echo"]


MUTATING_NET = """
import torch
import mujou_actors as mujou

class Source(mujou.Node):
    out = mujou.Output(torch.Tensor, shape=(2,))

    def __init__(self):
        super().__init__(period=0.01)

    def on_update(self, dt):
        self.out.send(torch.zeros(2))

class Adder(mujou.Node):
    inp = mujou.Input(torch.Tensor, shape=(2,))

    def __init__(self):
        super().__init__(period=None)

    def on_update(self, dt):
        self.inp.read().add_(1)

def make_net():
    src, adder = Source(), Adder()
    mujou.connect(src.out, adder.inp)
    return {"src": src, "adder": adder}
"""


@pytest.mark.slow
def test_check_read_only_fails_the_node_that_changes_a_received_tensor(tmp_path) -> None:
    (tmp_path / "mutating.py").write_text(MUTATING_NET)
    args = ("run", str(tmp_path / "mutating.py"), "--timer", "simulated", "--duration", "0.1",
            "--quiet")

    checked = mujou_cmd(*args, "--check-read-only")
    unchecked = mujou_cmd(*args)

    assert checked.returncode == 1
    assert checked.stderr.startswith("error: NodeError: node 'adder' raised in on_update: "
                                     "MessageChangedError: node 'adder' changed a tensor "
                                     "received on 'adder.inp' in place")
    assert unchecked.returncode == 0, unchecked.stderr


def test_the_commands_that_watch_a_run_start_without_importing_torch(tmp_path) -> None:
    code = ("import sys\n"
            "from mujou_actors.cli import main\n"
            "try:\n    main(['ls'])\nexcept SystemExit as e:\n    print('exit', e.code)\n"
            "print('torch' in sys.modules, 'mujou_actors.node' in sys.modules)\n")
    env = dict(os.environ, MUJOU_RUNTIME_DIR=str(tmp_path / "runs"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env, check=True).stdout.splitlines()

    assert out[-2:] == ["exit 0", "False False"]
