"""A placed run's log records made in its group processes reach the host's taps.

The groups forward their records (`distributed/grouplog.py`) while the host
has a log tap: a recording's (``Recording(log=True)``) or a live view's
``/mujou/log``. Each entry is made in the group, named after its node and
stamped with its hook's key, as one process makes it; the recording is the
one-process run's, node by node. Without a tap, no group is asked anything.
"""

from __future__ import annotations

import logging
import pathlib
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import mujou_actors as mujou
from mujou_actors.distributed import control, grouplog
from mujou_actors.recording import mcapfile

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

MS = 1_000_000


class Ticker(mujou.Node):
    """Logs at on_start, at even ticks (a warning), at tick 3 (an error), at each tick (an
    info and a debug line: below the default root level), and at on_stop; sends the tick."""

    out = mujou.Output(float)

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.k = 0

    def on_start(self) -> None:
        logging.getLogger("ticker.code").warning("start")

    def on_update(self, dt: float) -> None:
        self.k += 1
        code = logging.getLogger("ticker.code")
        code.debug("debug %d", self.k)
        code.info("info %d", self.k)
        if self.k % 2 == 0:
            code.warning("tick %d", self.k)
        if self.k == 3:
            code.error("three")
        self.out.send(float(self.k))

    def on_stop(self) -> None:
        logging.getLogger("ticker.code").warning("stop after %d", self.k)


class Hearer(mujou.Node):
    """Triggered by each tick; warns about the odd ones, under a logger of its own."""

    count = mujou.Input(float, trigger=True, depth=None)

    def on_update(self, dt: float) -> None:
        for value in self.count.drain():
            if int(value) % 2:
                logging.getLogger("hearer").warning("heard %s", value)


def make_net() -> dict[str, mujou.Node]:
    """tick -> hear, tick -> host (module-level: the groups build it by name)."""
    tick, hear, host = Ticker(), Hearer(), Hearer()
    mujou.connect(tick.out, hear.count)
    mujou.connect(tick.out, host.count)
    return {"tick": tick, "hear": hear, "host": host}


def _by_node(path: pathlib.Path) -> dict[str, list[tuple[int, str, str, str, int]]]:
    nodes: dict[str, list[tuple[int, str, str, str, int]]] = {}
    for e in mcapfile.Reader(path).logs():
        nodes.setdefault(e.name, []).append((e.t_ns, e.level_name, e.message, e.file, e.line))
    return nodes


def test_a_placed_runs_recording_holds_every_groups_records_as_one_process(
        tmp_path: pathlib.Path) -> None:
    one, placed = tmp_path / "one.mcap", tmp_path / "placed.mcap"
    mujou.run(make_net(), timer="simulated", duration=0.05,
              record=mujou.Recording(one, log=True)).join(timeout=60)
    run = mujou.run("tests.test_placed_log:make_net", placement={"tick": "a", "hear": "b"},
                    timer="simulated", duration=0.05, record=mujou.Recording(placed, log=True))
    run.join(timeout=120)

    assert run.groups == {"a": ["tick"], "b": ["hear"], "host": ["host"]}
    got, expected = _by_node(placed), _by_node(one)
    # group a's node, each record at its hook's key, in its order; its on_stop's last
    assert [(t, level, message) for t, level, message, _, _ in got["tick"]][:-1] == [
        (0, "WARNING", "start"), (20 * MS, "WARNING", "tick 2"), (30 * MS, "ERROR", "three"),
        (40 * MS, "WARNING", "tick 4")]
    assert got["tick"][-1][1:3] == ("WARNING", "stop after 5")
    # group b's node (triggered across groups) and the host's own group's
    assert [(t, m) for t, _, m, _, _ in got["hear"]] == [
        (10 * MS, "heard 1.0"), (30 * MS, "heard 3.0"), (50 * MS, "heard 5.0")]
    assert [(t, m) for t, _, m, _, _ in got["host"]] == [
        (10 * MS, "heard 1.0"), (30 * MS, "heard 3.0"), (50 * MS, "heard 5.0")]
    # node by node, what one process records: times, levels, messages, files and lines
    for node in ("tick", "hear", "host"):
        assert got[node] == expected[node], node
    assert got["tick"][0][3].endswith("test_placed_log.py") and got["tick"][0][4] > 0
    # the host's root logger lets warnings through (Python's default): the groups' too
    assert all(level != "INFO" and level != "DEBUG" for node in ("tick", "hear")
               for _, level, _, _, _ in got[node])
    stats = run.stats().recording
    assert stats is not None and stats.log is not None
    assert stats.log.sent == stats.log.recorded and stats.log.dropped == 0
    assert mcapfile.info(placed).logs[0].count == stats.log.recorded


class Spammer(mujou.Node):
    """Logs 3000 info lines in its first update (its logger lets them through; the group's
    handler of Thespian's logger, from warnings up, prints none of them)."""

    def __init__(self) -> None:
        super().__init__(period=0.01)

    def on_update(self, dt: float) -> None:
        if not hasattr(self, "done"):
            self.done = True
            spam = logging.getLogger("spam")
            spam.setLevel(logging.INFO)
            for i in range(3000):
                spam.info("n %d", i)


def make_spam() -> dict[str, mujou.Node]:
    return {"spam": Spammer()}


def test_a_group_keeps_a_bounded_number_of_records_and_the_host_says_how_many_it_lost(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "spam.mcap"
    # The host's rounds, not segments on peer links (which the driver polls as they run):
    # the hook is one round, and no take comes between its records.
    monkeypatch.setenv("MUJOU_PEER_LINKS", "0")
    with caplog.at_level(logging.WARNING, logger="mujou_actors"):
        run = mujou.run("tests.test_placed_log:make_spam", placement={"spam": "g"},
                        timer="simulated", duration=0.015, record=mujou.Recording(path, log=True))
        run.join(timeout=120)

    entries = list(mcapfile.Reader(path).logs())
    spam = [e.message for e in entries if e.name == "spam"]
    lost = 3000 - grouplog.MAX_PENDING
    # one hook, one round: the oldest MAX_PENDING are kept, the rest dropped and said so
    assert spam == [f"n {i}" for i in range(grouplog.MAX_PENDING)]
    said = [e for e in entries if e.name == "mujou_actors" and "lost" in e.message]
    assert [(e.level_name, e.t_ns) for e in said][:1] == [("WARNING", 10 * MS)]
    assert said[0].message == (f"group 'g': {lost} log record(s) lost (more than "
                               f"{grouplog.MAX_PENDING} waited for the host)")
    warnings = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
    assert len(warnings) == 1 and f"group 'g' lost {lost} log record(s)" in warnings[0]
    stats = run.stats().recording
    assert stats is not None and stats.log is not None and stats.log.dropped == lost
    assert stats.log.sent == stats.log.recorded + stats.log.dropped


class Talker(mujou.Node):
    """Warns about each command it is given, from inside its hook."""

    cmd = mujou.Input(float, trigger=True, depth=None)

    def on_update(self, dt: float) -> None:
        for value in self.cmd.drain():
            logging.getLogger("talker.code").warning("got %s", value)


def make_talker() -> dict[str, mujou.Node]:
    return {"talk": Talker()}


def _until(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("timer", ["simulated", "realtime"])
def test_the_live_views_log_serves_a_groups_records_only_while_watched(
        monkeypatch: pytest.MonkeyPatch, timer: str) -> None:
    pytest.importorskip("websockets.sync.client")
    from tests.test_foxglove import Client

    asked: list[int | None] = []  # the level of each Logs request the driver made
    lock = threading.Lock()
    logs = control.RemoteControl.logs

    def counted(self: Any, level: int | None, loggers: dict[str, int],
                timeout: float) -> Any:
        with lock:
            asked.append(level)
        return logs(self, level, loggers, timeout)

    monkeypatch.setattr(control.RemoteControl, "logs", counted)
    run = mujou.run("tests.test_placed_log:make_talker", placement={"talk": "g"}, timer=timer)
    server = None
    try:
        # nobody watches the log: the group is asked nothing (it has no handler at all)
        run.write("talk.cmd", 1.0)
        _until(lambda: run.stats().nodes["talk"].updates >= 1, "the first command's update")
        time.sleep(5 * grouplog.POLL_S)
        assert asked == []

        server = mujou.serve_foxglove(run, 0)
        client = Client(server.port)
        client.recv_until(lambda: "/mujou/log" in client.channels, "the log's channel")
        client.send({"op": "subscribe", "subscriptions": [
            {"id": 5, "channelId": client.channels["/mujou/log"]["id"]}]})
        _until(lambda: asked, "the group told to forward")
        run.write("talk.cmd", 2.0)
        client.recv_until(lambda: any(e["name"] == "talk" for e in client.of(5)),
                          "the group's record")
        talk = [e for e in client.of(5) if e["name"] == "talk"]
        assert [(e["level"], e["message"]) for e in talk] == [(3, "got 2.0")]
        assert talk[0]["file"].endswith("test_placed_log.py") and talk[0]["line"] > 0
        # stamped on the group's timer, at the hook's key: never past the run's time
        t_ns = talk[0]["timestamp"]["sec"] * 1_000_000_000 + talk[0]["timestamp"]["nsec"]
        assert 0 <= t_ns <= run.time_ns
        assert asked[0] == logging.NOTSET  # the live view's tap takes every level

        client.unsubscribe_and_close(5)
        _until(lambda: asked[-1] is None, "the group told to stop")
        time.sleep(2 * grouplog.POLL_S)
        with lock:
            after = len(asked)
        run.write("talk.cmd", 3.0)
        _until(lambda: run.stats().nodes["talk"].updates >= 3, "the third command's update")
        time.sleep(5 * grouplog.POLL_S)
        assert len(asked) == after and asked.count(None) == 1  # once off, asked no more
    finally:
        if server is not None:
            server.close()
        run.stop()
        run.join(timeout=60)
