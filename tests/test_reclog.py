"""A run's log records in its recording (``Recording(log=True)``, the channel ``/mujou/log``).

Each record is named after the node whose hook logged it and stamped with the
hook's key; the queue's bounds apply but a record never waits; every reader
keeps the channel apart from the ports' (info, read, views, replay, the
checks), reads it within bounds, and the commands show it (inspect, cat,
export-view, view).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest

import mujou_actors as mujou
from mujou_actors.errors import RecordingError
from mujou_actors.recording import mcapfile
from mujou_actors.recording.foxlog import MAX_ENTRY_BYTES, LogEntry, parse_entry

ROOT = pathlib.Path(__file__).resolve().parent.parent
MS = 1_000_000


@pytest.fixture
def info_level() -> Iterator[None]:
    """The root logger lets ``info`` through (Python's default lets warnings alone)."""
    root = logging.getLogger()
    before = root.level
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.setLevel(before)


class Talker(mujou.Node):
    """Logs at on_start and at each update (info, warning; a debug line too); sends a count."""

    out = mujou.Output(float)

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.k = 0

    def on_start(self) -> None:
        logging.getLogger("talker.code").warning("starting")

    def on_update(self, dt: float) -> None:
        self.k += 1
        code = logging.getLogger("talker.code")
        code.debug("detail %d", self.k)
        code.info("tick %d", self.k)
        if self.k == 2:
            code.error("two")
        self.out.send(float(self.k))


class Listener(mujou.Node):
    """Triggered by each count; logs it under a logger of another name."""

    count = mujou.Input(float, trigger=True, depth=None)

    def on_update(self, dt: float) -> None:
        for value in self.count.drain():
            logging.getLogger("elsewhere").info("heard %s", value)


def make_talking() -> dict[str, mujou.Node]:
    """talk -> hear (module-level: a placed run builds it by name)."""
    talk, hear = Talker(), Listener()
    mujou.connect(talk.out, hear.count)
    return {"talk": talk, "hear": hear}


def _entries(path: pathlib.Path, of: tuple[str, ...] = ("talk", "hear")) -> list[tuple]:
    return [(e.t_ns, e.level_name, e.name, e.message) for e in mcapfile.Reader(path).logs()
            if e.name in of]


EXPECTED = [  # 30 ms: on_start's warning at 0, then each update's lines at its key
    (0, "WARNING", "talk", "starting"),
    (10 * MS, "INFO", "talk", "tick 1"), (10 * MS, "INFO", "hear", "heard 1.0"),
    (20 * MS, "INFO", "talk", "tick 2"), (20 * MS, "ERROR", "talk", "two"),
    (20 * MS, "INFO", "hear", "heard 2.0"),
    (30 * MS, "INFO", "talk", "tick 3"), (30 * MS, "INFO", "hear", "heard 3.0"),
]


@pytest.mark.parametrize("workers", [1, 2])
def test_the_records_are_named_after_the_node_and_stamped_with_the_hooks_key(
        tmp_path: pathlib.Path, info_level: None, workers: int) -> None:
    path = tmp_path / "run.mcap"
    run = mujou.run(make_talking(), timer="simulated", duration=0.03, workers=workers,
                    record=mujou.Recording(path, log=True))
    run.join(timeout=60)
    stats = run.stats().recording
    info = mcapfile.info(path)

    # the same key's records of two nodes may come in either order with 2 workers
    assert sorted(_entries(path)) == sorted(EXPECTED)
    assert _entries(path, ("talk",)) == [e for e in EXPECTED if e[2] == "talk"]
    entry = next(e for e in mcapfile.Reader(path).logs() if e.message == "two")
    assert entry.file.endswith("test_reclog.py") and entry.line > 0 and entry.level == 4
    assert [(c.topic, c.type, c.log) for c in info.logs] == [("/mujou/log", "foxglove.Log",
                                                              True)]
    assert info.logs[0].schema["title"] == "foxglove.Log"
    assert info.logs[0].count == stats.log.recorded >= len(EXPECTED)  # type: ignore[union-attr]
    # the ports' channels and counts are what a recording without the log holds
    assert [c.topic for c in info.channels] == ["talk.out"] and info.messages == 3
    assert [r.message for r in mcapfile.read(path)] == [1.0, 2.0, 3.0]
    assert (info.start_ns, info.end_ns) == (10 * MS, 30 * MS)
    assert stats is not None and (stats.recorded, stats.dropped) == (3, 0)
    assert stats.log is not None and stats.log.port == "/mujou/log"
    assert stats.log.sent == stats.log.recorded and stats.log.dropped == 0
    assert info.run["record_log"] == "20" and info.log_dropped == 0
    assert json.loads(info.end["log"]) == {  # type: ignore[index]
        "recorded": stats.log.recorded, "dropped": 0}


def test_a_record_outside_any_hook_is_named_after_its_logger_at_the_runs_time(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "run.mcap"
    run = mujou.run(make_talking(), timer="simulated", duration=0.05,
                    record=mujou.Recording(path, log=logging.WARNING))
    logging.getLogger("outside").warning("from the test")
    run.join(timeout=60)

    outside = [e for e in mcapfile.Reader(path).logs() if e.name == "outside"]
    assert [(e.level_name, e.message) for e in outside] == [("WARNING", "from the test")]
    assert 0 <= outside[0].t_ns <= 50 * MS
    # the level: warnings and above only, whatever the loggers let through
    assert {e.level_name for e in mcapfile.Reader(path).logs()} == {"WARNING", "ERROR"}


def test_the_level_takes_debug_records_when_the_loggers_let_them_through(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "run.mcap"
    code = logging.getLogger("talker.code")
    code.setLevel(logging.DEBUG)
    try:
        mujou.run(make_talking(), timer="simulated", duration=0.02,
                  record=mujou.Recording(path, log=logging.DEBUG)).join(timeout=60)
    finally:
        code.setLevel(logging.NOTSET)

    assert [m for _, level, _, m in _entries(path, ("talk",)) if level == "DEBUG"] == [
        "detail 1", "detail 2"]


def test_log_is_checked_when_the_recording_is_made_and_kept_as_the_level() -> None:
    assert mujou.Recording("r.mcap").log is False
    assert mujou.Recording("r.mcap", log=True).log == logging.INFO
    assert mujou.Recording("r.mcap", log=logging.DEBUG).log == logging.DEBUG
    assert repr(mujou.Recording("r.mcap", log=True)) == "Recording('r.mcap', log=20)"
    assert repr(mujou.Recording("r.mcap")) == "Recording('r.mcap')"
    with pytest.raises(TypeError, match="log must be a bool or a logging level"):
        mujou.Recording("r.mcap", log="INFO")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="log must be a bool or a logging level"):
        mujou.Recording("r.mcap", log=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="logging.DEBUG records every level"):
        mujou.Recording("r.mcap", log=0)


def test_a_full_queue_drops_records_and_never_waits_even_when_messages_wait(
        tmp_path: pathlib.Path) -> None:
    from mujou_actors.recording.recorder import Recorder

    path = tmp_path / "run.mcap"
    settings = mujou.Recording(path, log=True, max_messages=3, when_full="wait")
    recorder = Recorder(settings, [], {"format": mcapfile.FORMAT}, simulated=True,
                        host_copy=None, now_ns=lambda: 5 * MS)
    tap = recorder._tap
    assert tap is not None
    tap.attach()  # the writer is not started: nothing leaves the queue
    try:
        started = time.monotonic()
        for i in range(5):
            logging.getLogger("burst").warning("record %d", i)
        took = time.monotonic() - started
        full = recorder.stats().log
    finally:
        tap.cancel()
    recorder.start()
    error = recorder.close(None, "", 10.0)
    done = recorder.stats().log

    assert took < 1.0  # a record never waited for room (when_full="wait" is the messages')
    assert full is not None and (full.sent, full.recorded, full.dropped) == (5, 0, 2)
    assert error is None and done is not None and (done.recorded, done.dropped) == (3, 2)
    got = [(e.t_ns, e.name, e.message) for e in mcapfile.Reader(path).logs()]
    assert got == [(5 * MS, "burst", f"record {i}") for i in range(3)]
    assert mcapfile.info(path).log_dropped == 2


def test_replay_and_the_golden_file_check_take_a_recording_with_its_log(
        tmp_path: pathlib.Path, info_level: None) -> None:
    from mujou_actors.testing import assert_replay_matches

    path = tmp_path / "golden.mcap"
    mujou.run(make_talking(), timer="simulated", duration=0.05, seed=1,
              record=mujou.Recording(path, log=True)).join(timeout=60)
    replayed = tmp_path / "replayed.mcap"
    run = mujou.run(make_talking(), timer="simulated", duration=0.05,
                    replay=mujou.Replay(path, replace=["talk"]), record=replayed)
    run.join(timeout=60)

    assert assert_replay_matches(path, make_talking()) == 5
    assert [r.message for r in mcapfile.read(replayed)] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert mcapfile.info(replayed).logs == []  # recorded without log=


def test_a_log_message_that_is_no_foxglove_log_is_a_recording_error(
        tmp_path: pathlib.Path) -> None:
    good = json.dumps({"timestamp": {"sec": 1, "nsec": 5}, "level": 3, "message": "m",
                       "name": "n", "file": "f.py", "line": 7}).encode()
    cases = {
        "not_json": b'{"level": ',
        "missing": json.dumps({"level": 3}).encode(),
        "level": good.replace(b'"level": 3', b'"level": 9'),
        "time": good.replace(b'"nsec": 5', b'"nsec": 1000000000'),
        "deep": b"[" * 200 + b"]" * 200,
        "long": json.dumps({**json.loads(good), "message": "x" * MAX_ENTRY_BYTES}).encode(),
    }
    reasons = {}
    for name, data in cases.items():
        path = tmp_path / f"{name}.mcap"
        writer = mcapfile.Writer(path)
        writer.write_run({"format": mcapfile.FORMAT})
        log = writer.add_log_channel()
        writer.write(log, 1_000_000_005, good)
        writer.write(log, 2_000_000_000, data)
        writer.close({"log": json.dumps({"recorded": 2, "dropped": 0})})
        assert mcapfile.info(path).logs[0].count == 2  # info does not parse them
        reader = mcapfile.Reader(path).logs()
        assert next(reader) == LogEntry(1_000_000_005, 3, "m", "n", "f.py", 7)
        with pytest.raises(RecordingError, match="log message 1 of '/mujou/log'") as caught:
            next(reader)
        reasons[name] = str(caught.value)

    assert "not JSON" in reasons["not_json"] or "Expecting" in reasons["not_json"]
    assert "without timestamp, message, name, file, line" in reasons["missing"]
    assert "level is not an int 0 to 5" in reasons["level"]
    assert "timestamp" in reasons["time"]
    assert "nested" in reasons["deep"]
    assert f"more than the {MAX_ENTRY_BYTES}" in reasons["long"]


def test_a_bad_log_count_in_the_end_record_is_a_recording_error(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "run.mcap"
    writer = mcapfile.Writer(path)
    writer.write_run({"format": mcapfile.FORMAT})
    writer.close({"log": json.dumps({"recorded": -1})})

    with pytest.raises(RecordingError, match="bad 'log' in its metadata"):
        mcapfile.info(path)


def test_parse_entry_ignores_other_keys_and_gives_back_the_object() -> None:
    value = {"timestamp": {"sec": 2, "nsec": 3}, "level": 2, "message": "hi", "name": "a.b",
             "file": "", "line": 0, "extra": [1]}

    entry = parse_entry(value)

    assert entry == LogEntry(2_000_000_003, 2, "hi", "a.b", "", 0)
    assert entry.to_json() == {k: v for k, v in value.items() if k != "extra"}
    assert entry.level_name == "INFO"


def test_a_placed_run_records_the_records_of_the_groups_in_the_hosts_process(
        tmp_path: pathlib.Path, info_level: None) -> None:
    from mujou_actors._runtime.build import Seams
    from mujou_actors.distributed import placed
    from mujou_actors.run import _check_arguments
    from tests.placed_support import InProcessSystem

    path = tmp_path / "placed.mcap"
    args = _check_arguments(Seams(), workers=1, timer="simulated", duration=0.03, seed=7,
                            state=None, supervisor=None, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=10.0, start_timeout=60.0,
                            record=mujou.Recording(path, log=True))
    run = placed.start(make_talking, placement=mujou.Placement({"talk": "a", "hear": "b"}),
                       args=args, inputs=None, state=None, make_system=InProcessSystem)
    run.join(timeout=60)

    # every group's server runs in this process here: each record names its node and key
    assert sorted(_entries(path)) == sorted(EXPECTED)
    assert run.stats().recording.log.dropped == 0  # type: ignore[union-attr]


@pytest.mark.slow
def test_a_placed_run_in_processes_records_the_records_of_every_group(
        tmp_path: pathlib.Path, info_level: None) -> None:
    path = tmp_path / "procs.mcap"
    run = mujou.run("tests.test_reclog:make_talking", placement={"hear": "h"},
                    timer="simulated", duration=0.03, record=mujou.Recording(path, log=True))
    run.join(timeout=120)

    # talk runs in the host's group; hear's process forwards its records to the host
    # (distributed/grouplog.py), its info lines too: it lets through what the host's
    # root logger does while it forwards
    assert _entries(path, ("talk",)) == [e for e in EXPECTED if e[2] == "talk"]
    assert _entries(path, ("hear",)) == [e for e in EXPECTED if e[2] == "hear"]
    assert run.stats().recording.log.dropped == 0  # type: ignore[union-attr]


class _Plain(str):
    """A str of user code's: its entry's message crosses as a plain str."""


def test_a_groups_handler_keeps_plain_entries_within_its_bound_and_only_while_on() -> None:
    from mujou_actors.distributed.grouplog import MAX_PENDING, GroupLog

    root, ours = logging.getLogger(), logging.getLogger("mujou_actors")
    levels = root.level, ours.level
    handler = GroupLog(lambda: 7 * MS)
    code = logging.getLogger("group.code")
    code.warning("while off")
    assert handler not in root.handlers and handler.take() == ([], 0)

    handler.configure(logging.INFO, {"": logging.INFO, "mujou_actors": logging.ERROR,
                                     "group.code": logging.CRITICAL})
    try:
        mirrored = (root.level, ours.level, code.level)
        assert handler in root.handlers
        code.info(_Plain("one %d"), 1)
        code.debug("below the root's level")
        logging.getLogger("Thespian.ActorManager").warning("the transport's own")
        for i in range(MAX_PENDING + 5):
            code.warning("n %d", i)
        entries, dropped = handler.take()
        again = handler.take()
    finally:
        handler.configure(None, {})

    # the root's and mujou_actors' levels mirrored while on (no other logger's), then back
    assert mirrored == (logging.INFO, logging.ERROR, logging.NOTSET)
    assert handler not in root.handlers and (root.level, ours.level) == levels
    # the oldest MAX_PENDING kept (the info line first), the rest counted; then none
    assert len(entries) == MAX_PENDING and dropped == 6 and again == ([], 0)
    level, first = entries[0]
    assert level == logging.INFO and type(first["message"]) is str
    assert {k: v for k, v in first.items() if k not in ("file", "line")} == {
        "timestamp": {"sec": 0, "nsec": 7 * MS}, "level": 2, "message": "one 1",
        "name": "group.code"}
    assert first["file"].endswith("test_reclog.py") and first["line"] > 0
    assert [e["message"] for _, e in entries[1:3]] == ["n 0", "n 1"]
    # a group server in the host's own process never forwards (the taps see it already)
    here = GroupLog(lambda: 0, here=True)
    here.configure(logging.INFO, {})
    assert here not in root.handlers and here.min_level is None


class _Control:
    """A group's control, answering `logs` with what it is given (or raising it)."""

    def __init__(self) -> None:
        self.asked: list[int | None] = []
        self.replies: list[Any] = []

    def logs(self, level: int | None, loggers: dict[str, int], timeout: float) -> Any:
        self.asked.append(level)
        reply = self.replies.pop(0) if self.replies else ([], 0)
        if isinstance(reply, Exception):
            raise reply
        return reply


def _group(name: str, remote: bool = True) -> Any:
    return types.SimpleNamespace(name=name, remote=remote, control=_Control())


def test_the_host_forwards_the_groups_entries_to_its_taps_only_while_it_has_one(
        caplog: pytest.LogCaptureFixture) -> None:
    from mujou_actors.distributed.grouplog import POLL_S, Forwarding
    from mujou_actors.recording.logview import LogTap

    a, b, host = _group("a"), _group("b"), _group("host", remote=False)
    driver = types.SimpleNamespace(groups={"a": a, "b": b, "host": host}, dead=set(),
                                   time_ns=5 * MS)
    forwarding = Forwarding(driver)
    forwarding.start()
    forwarding.poll()
    forwarding.finish()
    assert a.control.asked == b.control.asked == []  # no tap: no group is asked anything

    got: list[dict[str, Any]] = []
    lost: list[int] = []
    tap = LogTap(got.append, lambda: 0, logging.WARNING, lost.append)
    info = {"timestamp": {"sec": 0, "nsec": 1}, "level": 2, "message": "i", "name": "x",
            "file": "", "line": 0}
    warn = {**info, "timestamp": {"sec": 0, "nsec": 2 * MS}, "level": 3, "message": "w"}
    a.control.replies = [([(logging.INFO, info), (logging.WARNING, warn)], 2)]
    b.control.replies = [RuntimeError("no answer")]
    tap.attach()
    try:
        with caplog.at_level(logging.WARNING, logger="mujou_actors"):
            forwarding.poll()  # a tap came: every group told at once
            forwarding.poll()  # not due yet: nobody asked
            time.sleep(POLL_S * 1.5)
            forwarding.poll()  # due: a asked again; b, which did not answer, no more
    finally:
        tap.cancel()
    forwarding.poll()  # the tap went: a told to stop, once
    time.sleep(POLL_S * 1.5)
    forwarding.poll()
    forwarding.finish()

    assert a.control.asked == [logging.WARNING, logging.WARNING, None]
    assert b.control.asked == [logging.WARNING] and host.control.asked == []
    forwarded = [e for e in got if e["name"] in ("x", "mujou_actors") and e["file"] == ""]
    assert forwarded == [warn, {
        "timestamp": {"sec": 0, "nsec": 2 * MS}, "level": 3, "name": "mujou_actors",
        "file": "", "line": 0,
        "message": "group 'a': 2 log record(s) lost (more than 1024 waited for the host)"}]
    assert lost == [2] and forwarding.lost == 2
    said = [r.getMessage() for r in caplog.records]
    assert any("group 'b' gave no log records (RuntimeError: no answer)" in m for m in said)
    assert sum("group 'a' lost 2 log record(s)" in m for m in said) == 1


# -- the commands -----------------------------------------------------------------------

NET = '''
import logging
import mujou_actors as mujou


class Talk(mujou.Node):
    out = mujou.Output(float)

    def __init__(self):
        super().__init__(period=0.01)

    def on_update(self, dt):
        logging.getLogger("talk.code").info("tick\\x1b[31m")
        logging.getLogger("talk.code").warning("tock")
        self.out.send(1.0)


def make_net():
    return {"a": Talk()}
'''


def _mujou(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mujou_actors", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MUJOU_ATTACH": "0"})


@pytest.mark.slow
def test_mujou_run_record_log_then_inspect_cat_and_export_view(tmp_path: pathlib.Path) -> None:
    net = tmp_path / "net.py"
    net.write_text(NET)
    path, out = tmp_path / "run.mcap", tmp_path / "view.mcap"

    ran = _mujou("run", f"{net}:make_net", "--timer", "simulated", "--duration", "0.02",
                 "--record", str(path), "--record-log")
    refused = _mujou("run", f"{net}:make_net", "--timer", "simulated", "--record-log")
    inspected = _mujou("inspect", str(path))
    as_json = json.loads(_mujou("inspect", str(path), "--json").stdout)
    cat = _mujou("cat", str(path))
    cat_log = _mujou("cat", str(path), "/mujou/log", "--json")
    exported = _mujou("export-view", str(path), str(out))

    assert ran.returncode == 0, ran.stderr
    # the CLI lets info through to the recording; the terminal still shows the warnings
    # alone (Python's last resort, which the recording's handler stands in for)
    assert ran.stderr.count("tock") == 2 and "tick" not in ran.stderr
    assert "recorded 2 messages and 4 log records to" in ran.stderr
    assert refused.returncode == 2 and "--record-log go with --record FILE" in refused.stderr
    assert "log: /mujou/log  foxglove.Log  4 records from INFO" in inspected.stdout
    assert "0 dropped" in inspected.stdout
    assert [(c["topic"], c["count"]) for c in as_json["logs"]] == [("/mujou/log", 4)]
    assert as_json["messages"] == 2 and as_json["log_dropped"] == 0
    lines = cat.stdout.splitlines()
    assert lines[0].split() == ["0.010000000", "a.out", "1.0"]
    assert lines[1].split() == ["0.010000000", "/mujou/log", "INFO", "a:", "tick\\x1b[31m",
                                "(net.py:13)"]
    assert lines[2].split()[2:5] == ["WARNING", "a:", "tock"] and len(lines) == 6
    assert "\x1b" not in cat.stdout  # a file's control characters never reach the terminal
    first = json.loads(cat_log.stdout.splitlines()[0])
    assert first["t_ns"] == 10 * MS and first["topic"] == "/mujou/log" and first["sequence"] == 0
    assert first["log"]["name"] == "a" and first["log"]["message"] == "tick\x1b[31m"
    assert first["log"]["timestamp"] == {"sec": 0, "nsec": 10 * MS}
    assert len(cat_log.stdout.splitlines()) == 4
    assert exported.returncode == 0, exported.stderr
    assert "2 messages and 4 log records" in exported.stderr
    copied = [e.message for e in mcapfile.Reader(out).logs()]
    assert copied == ["tick\x1b[31m", "tock"] * 2
    viewed = _mujou("inspect", str(out))
    assert viewed.returncode == 0, viewed.stderr
    assert "no lossless channels: a file of views only" in viewed.stdout
    assert "/view/a.out" in viewed.stdout and "4 records" in viewed.stdout
    assert [c.topic for c in mcapfile.info(out).views] == ["/view/a.out"]


def test_the_view_of_a_recording_serves_its_log_as_foxglove_log(
        tmp_path: pathlib.Path, info_level: None) -> None:
    pytest.importorskip("websockets.sync.client")
    from mujou_actors.recording.playback import serve_recording
    from tests.nets.view_nets import make_net
    from tests.test_playback import _client

    path = tmp_path / "run.mcap"
    mujou.run(make_net(), timer="simulated", duration=0.03,
              record=mujou.Recording(path, log=True)).join(timeout=60)
    plain = tmp_path / "plain.mcap"
    mujou.run(make_net(), timer="simulated", duration=0.03, record=plain).join(timeout=60)

    with serve_recording(plain, 0, paused=True) as server:
        without = _client(server.port)
        without.ws.close()
    with serve_recording(path, 0, paused=True) as server:
        client = _client(server.port)
        channel = client.channels["/mujou/log"]
        client.subscribe("/mujou/log", 1)
        client.request(True, 4.0, None, "go")
        client.recv_until(lambda: len([e for e in client.of(1) if e["name"] == "sink"]) == 4,
                          "the sink's records")
        client.ws.close()

    assert "/mujou/log" not in without.channels
    assert (channel["schemaName"], channel["encoding"]) == ("foxglove.Log", "json")
    assert json.loads(channel["schema"])["title"] == "foxglove.Log"
    sink = [(e["timestamp"], e["level"], e["message"]) for e in client.of(1)
            if e["name"] == "sink"]
    assert sink == [({"sec": 0, "nsec": 10 * MS}, 2, "got 0.0"),
                    ({"sec": 0, "nsec": 20 * MS}, 2, "got 1.0"),
                    ({"sec": 0, "nsec": 30 * MS}, 2, "got 2.0"),
                    ({"sec": 0, "nsec": 30 * MS}, 3, "two reached")]
    stamps = [t for s, t, _ in client.data if s == 1]
    assert stamps == sorted(stamps) and stamps[-1] == 30 * MS


def test_mujou_cat_picks_the_log_by_its_topic_and_other_ports_without_it(
        tmp_path: pathlib.Path, info_level: None) -> None:
    from click.testing import CliRunner

    from mujou_actors.cli import main

    path = tmp_path / "run.mcap"
    mujou.run(make_talking(), timer="simulated", duration=0.02,
              record=mujou.Recording(path, log=True)).join(timeout=60)

    ports = CliRunner().invoke(main, ["cat", str(path), "talk.*"])
    log = CliRunner().invoke(main, ["cat", str(path), "/mujou/*"])
    wrong = CliRunner().invoke(main, ["cat", str(path), "/nope"])

    assert ports.exit_code == 0 and [line.split()[1] for line in ports.output.splitlines()] == [
        "talk.out", "talk.out"]
    names = [line.split()[3] for line in log.output.splitlines()]
    assert names[0] == "talk:" and set(names) <= {"talk:", "hear:"} and len(names) >= 5
    assert wrong.exit_code == 2 and "/mujou/log" in wrong.output
