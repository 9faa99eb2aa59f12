"""Deadlines and budgets across runs: placement, snapshots, restarts, recordings, traces, views.

tests/test_deadlines.py tests a miss where it happens; here the runs around
it. A hook's CPU time comes from a scripted clock put where the actor reads
it (`actor._cpu_clock`): one of its own per thread, as the thread's CPU clock
is, that only the hook's ``spend`` moves, so every miss is certain and the
same in a run of one process and in a placed run whose groups are served in
this process (`InProcessSystem`). The run in processes of their own reads the
real CPU clock against budgets and deadlines of 1 ns, which every update
misses. In simulated time a miss is counted, traced and logged, and no policy
applies (docs/nodes-and-ports.md, "Deadlines and budgets"): what the net
computes is the same with the declarations as without them.
"""

from __future__ import annotations

import json
import pathlib
import threading
from typing import Any

import pytest
import torch

import mujou_actors as mujou
from mujou_actors import DeadlineMiss
from mujou_actors._runtime import actor as actor_module
from mujou_actors._runtime.build import Seams
from mujou_actors.distributed import placed
from mujou_actors.run import _check_arguments
from tests.placed_support import InProcessSystem

pytestmark = pytest.mark.timeout(60)

MS = 1_000_000  # ns


class ThreadClock:
    """A CPU clock per thread, as ``time.thread_time_ns``: it moves only by `spend`."""

    def __init__(self) -> None:
        self.local = threading.local()

    def __call__(self) -> int:
        return int(getattr(self.local, "ns", 0))

    def spend(self, ns: int) -> None:
        self.local.ns = self() + ns


CPU = ThreadClock()  # the nodes spend on it; the fixture `cpu` makes the actors read it


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch) -> ThreadClock:
    monkeypatch.setattr(actor_module, "_cpu_clock", CPU)
    return CPU


def cost_ns(n: int) -> int:
    """What update ``n`` of a `Ctl` spends: 7 ms every 5th, 3 ms every 3rd (else), else 1 ms."""
    return 7 * MS if n % 5 == 0 else 3 * MS if n % 3 == 0 else 1 * MS


class Ctl(mujou.Node):
    """A controller: a noisy command every 10 ms, update n spending `cost_ns` of CPU."""

    out = mujou.Output(torch.Tensor)

    def __init__(self, **limits: Any) -> None:
        super().__init__(period=0.01, **limits)
        self.n = 0
        self.x = torch.zeros(2)
        self.safe = False

    def on_update(self, dt: float) -> None:
        self.n += 1
        CPU.spend(cost_ns(self.n))
        self.x = self.x + torch.randn(2, generator=self.generator) * dt
        self.out.send(self.x * (0.0 if self.safe else 1.0))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "n": self.n, "safe": self.safe}  # generator, x

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.n, self.safe = state.pop("n"), state.pop("safe")
        super().load_state_dict(state)


class SafeCtl(Ctl):
    """`Ctl` whose ``on_deadline_miss`` (``on_miss="safe"``, a policy of real time only)
    would zero its commands from then on: in simulated time it is never called."""

    def on_deadline_miss(self, miss: DeadlineMiss) -> None:
        self.safe = True


class Filter(mujou.Node):
    """Triggered by each command: its running sum, each update spending 1 µs of CPU."""

    inp = mujou.Input(torch.Tensor, depth=None)
    out = mujou.Output(torch.Tensor)

    def __init__(self, **limits: Any) -> None:
        super().__init__(period=None, **limits)
        self.total = torch.zeros(2)

    def on_update(self, dt: float) -> None:
        CPU.spend(1_000)
        for x in self.inp.drain():
            self.total = self.total + x
            self.out.send(self.total.clone())

    def state_dict(self) -> dict[str, Any]:
        return {"total": self.total.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.total = state["total"].clone()


class Keep(mujou.Node):
    """Keeps every command and sum it is sent, in the order it takes them (its state)."""

    cmd = mujou.Input(torch.Tensor, depth=None)
    sums = mujou.Input(torch.Tensor, depth=None)

    def __init__(self) -> None:
        super().__init__(period=None)
        self.seen: list[list[Any]] = []

    def on_update(self, dt: float) -> None:
        self.seen += [["cmd", x.tolist()] for x in self.cmd.drain()]
        self.seen += [["sum", x.tolist()] for x in self.sums.drain()]

    def state_dict(self) -> dict[str, Any]:
        return {"seen": [list(s) for s in self.seen]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = [list(s) for s in state["seen"]]


# The declarations: each policy once, budgets and deadlines; "none": the same net without.
LIMITS: dict[str, dict[str, dict[str, Any]]] = {
    "declared": {
        "warn": {"budget": 0.002, "deadline": 0.005},
        "skip": {"budget": 0.002, "deadline": 0.005, "on_miss": "skip"},
        "safe": {"budget": 0.002, "deadline": 0.005, "on_miss": "safe"},
        "filter": {"budget": 1e-9, "on_miss": "stop"},
    },
    "tiny": {  # 1 ns: every update misses, on any clock
        "warn": {"budget": 1e-9, "deadline": 1e-9},
        "skip": {"budget": 1e-9, "deadline": 1e-9, "on_miss": "skip"},
        "safe": {"budget": 1e-9, "deadline": 1e-9, "on_miss": "safe"},
        "filter": {"budget": 1e-9, "deadline": None, "on_miss": "warn"},
    },
    "none": {"warn": {}, "skip": {}, "safe": {}, "filter": {}},
}
CTLS = ("warn", "skip", "safe")


def make_net(limits: str = "declared") -> dict[str, mujou.Node]:
    """Three controllers (one per policy) -> a filter each -> one keeper (module-level: a
    placed run builds it by name)."""
    declared = LIMITS[limits]
    net: dict[str, mujou.Node] = {"keep": Keep()}
    for name in CTLS:
        kind = SafeCtl if declared[name].get("on_miss") == "safe" else Ctl
        ctl, flt = kind(**declared[name]), Filter(**declared["filter"])
        net[name], net[f"{name}_f"] = ctl, flt
        mujou.connect(ctl.out, flt.inp)
        mujou.connect(ctl.out, net["keep"].cmd)
        mujou.connect(flt.out, net["keep"].sums)
    return net


PLACEMENT = {"warn": "a", "warn_f": "b", "skip": "a", "skip_f": "c", "safe": "b",
             "safe_f": "c"}  # keep: the host's group


def expected_misses(updates: int) -> tuple[int, int]:
    """(budget, deadline) misses of a `Ctl` with budget 2 ms, deadline 5 ms over ``updates``."""
    costs = [cost_ns(n) for n in range(1, updates + 1)]
    return sum(c > 2 * MS for c in costs), sum(c > 5 * MS for c in costs)


def misses(run: mujou.Run) -> dict[str, tuple[int, int, int]]:
    """(updates, budget misses, deadline misses) by node."""
    return {path: (s.updates, s.budget_misses, s.deadline_misses)
            for path, s in run.stats().nodes.items()}


def one_process(duration: float, *, limits: str = "declared", workers: int = 1,
                **kwargs: Any) -> mujou.Run:
    run = mujou.run(make_net(limits), timer="simulated", duration=duration, seed=3,
                    workers=workers, **kwargs)
    run.join(30)
    return run


def in_groups(duration: float, *, limits: str = "declared", workers: int = 1,
              trace: Any = None, system: Any = InProcessSystem) -> placed.PlacedRun:
    """The net placed over three groups, served in this process."""
    args = _check_arguments(Seams(), workers=workers, timer="simulated", duration=duration,
                            seed=3, state=None, supervisor=None, trace=trace,
                            cuda_sync="block", stats=True, stop_timeout=10.0,
                            start_timeout=60.0)
    return placed.start(make_net, placement=mujou.Placement(PLACEMENT, net_kwargs={
        "limits": limits}), args=args, inputs=None, state=None, make_system=system)


def kept(run: mujou.Run) -> list[list[Any]]:
    """What the keeper took, in order: every command and sum, as floats (bit for bit)."""
    seen: list[list[Any]] = run.state_dict()["nodes"]["keep"]["seen"]
    return seen


def assert_same_tree(a: Any, b: Any, where: str = "tree") -> None:
    """Two state trees hold the same keys and values, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), (where, list(a), list(b))
        for key in a:
            assert_same_tree(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_tree(x, y, f"{where}[{i}]")
    else:
        assert a == b and type(a) is type(b), (where, a, b)


def keys_of(tree: Any) -> set[str]:
    """Every key of every mapping in ``tree``."""
    if isinstance(tree, dict):
        return {str(k) for k in tree} | {k for v in tree.values() for k in keys_of(v)}
    if isinstance(tree, (list, tuple)):
        return {k for v in tree for k in keys_of(v)}
    return set()


# 20 ticks of 10 ms: each controller misses its budget 9 times (6 updates of 3 ms, 3 of
# 7 ms... see cost_ns) and its deadline 4 times; each filter its 1 ns budget at every update.
WHOLE = {**{name: (20, 9, 4) for name in CTLS}, **{f"{name}_f": (20, 20, 0) for name in CTLS},
         "keep": (40, 0, 0)}


# -- placement ------------------------------------------------------------------------------

def test_a_placed_run_computes_what_one_process_computes_and_counts_the_same_misses(
        cpu: ThreadClock, workers: int) -> None:
    one = one_process(0.2, workers=workers)
    plain = one_process(0.2, limits="none")
    run = in_groups(0.2, workers=workers)
    run.join(60)

    assert expected_misses(20) == (9, 4)
    assert misses(one) == misses(run) == WHOLE
    assert kept(run) == kept(one) == kept(plain)  # the declarations change nothing computed
    assert len(kept(one)) == 120 and all(v != [0.0, 0.0] for k, v in kept(one) if k == "cmd")
    tree = run.state_dict()
    assert [tree["nodes"][name]["safe"] for name in CTLS] == [False] * 3  # no policy applied
    assert [tree["nodes"][name]["n"] for name in CTLS] == [20] * 3  # no tick skipped


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_in_processes_of_their_own_every_update_misses_a_budget_of_1_ns_as_in_one_process(
        ) -> None:
    # The real CPU clock: no update runs in 1 ns, so every update misses, in any process.
    one = one_process(0.1, limits="tiny")
    plain = one_process(0.1, limits="none")
    run = mujou.run("tests.test_deadlines_state:make_net", timer="simulated", duration=0.1,
                    seed=3, placement=mujou.Placement(PLACEMENT, net_kwargs={"limits": "tiny"}))
    run.join(240)

    assert run.groups == {"a": ["warn", "skip"], "b": ["warn_f", "safe"],
                          "c": ["skip_f", "safe_f"], "host": ["keep"]}
    expected = {**{name: (10, 10, 10) for name in CTLS},
                **{f"{name}_f": (10, 10, 0) for name in CTLS}, "keep": (20, 0, 0)}
    assert misses(run) == misses(one) == expected
    assert kept(run) == kept(one) == kept(plain)
    assert len(kept(run)) == 60


# -- snapshots and restarts ----------------------------------------------------------------

def test_a_run_restored_from_a_file_mid_way_goes_on_as_the_whole_run_and_counts_its_own(
        cpu: ThreadClock, tmp_path: pathlib.Path) -> None:
    whole = one_process(0.2)
    first = one_process(0.1)
    tree = first.state_dict()
    mujou.save(tree, tmp_path / "half.mujou")
    second = mujou.run(make_net(), timer="simulated", duration=0.1,
                       state=tmp_path / "half.mujou")
    second.join(30)

    assert kept(second) == kept(whole)
    assert_same_tree(second.state_dict(), whole.state_dict())
    # The counts are statistics, not state: the restored run counts its own updates'
    # misses, from none (the first half's are in no tree), and the two add up.
    assert misses(whole) == WHOLE
    assert misses(first) == {**{n: (10, 5, 2) for n in CTLS},
                             **{f"{n}_f": (10, 10, 0) for n in CTLS}, "keep": (20, 0, 0)}
    assert misses(second) == {**{n: (10, 4, 2) for n in CTLS},
                              **{f"{n}_f": (10, 10, 0) for n in CTLS}, "keep": (20, 0, 0)}
    # The tree holds no miss count: it is the tree of the same net without declarations.
    plain = one_process(0.1, limits="none").state_dict()
    assert_same_tree(tree, plain)
    assert_same_tree(mujou.load(tmp_path / "half.mujou"), plain)
    assert not any("miss" in key for key in keys_of(tree))


class FailsOnce(mujou.Node):
    """Raises in its 7th update, once per test (the test resets `failed`)."""

    failed = False

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == 7 and not FailsOnce.failed:
            FailsOnce.failed = True
            raise RuntimeError("once")

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n = state["n"]


def test_a_supervisor_s_restore_rewinds_the_state_but_not_the_miss_counts(
        cpu: ThreadClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FailsOnce, "failed", False)
    whole = one_process(0.2, limits="tiny")
    net = {**make_net("tiny"), "boom": FailsOnce()}
    run = mujou.run(net, timer="simulated", duration=0.2, seed=3, workers=1,
                    supervisor=mujou.Supervisor("one_for_all", snapshot_every=0.05))
    run.join(30)

    stats = run.stats().nodes
    assert stats["boom"].restarts == 1
    assert kept(run) == kept(whole)  # rewound and run again: the same results
    for name in CTLS:
        # The updates rewound ran twice and missed twice: counted, as every update is, and
        # the restore kept the misses counted before it.
        s = stats[name]
        assert s.updates > 20 and (s.budget_misses, s.deadline_misses) == (s.updates,) * 2, (
            name, s)
        assert stats[f"{name}_f"].budget_misses == stats[f"{name}_f"].updates > 20


# -- recordings ----------------------------------------------------------------------------

def test_a_recorded_run_with_deadlines_replays_bit_for_bit_whole_and_with_nodes_replaced(
        cpu: ThreadClock, tmp_path: pathlib.Path) -> None:
    from mujou_actors.testing import assert_replay_matches

    path = tmp_path / "run.mcap"
    recorded = one_process(0.2, record=path)
    assert misses(recorded) == WHOLE

    # The whole net again, each node measured again: the same messages, bit for bit.
    assert assert_replay_matches(path, make_net(), workers=2) == 3 * 20 + 3 * 20
    # The controllers replaced by what they sent: the rest reruns on their messages.
    assert assert_replay_matches(path, make_net(), replace=CTLS) == 3 * 20 + 3 * 20
    replayed = mujou.run(make_net(), timer="simulated", duration=0.2,
                         replay=mujou.Replay(path, replace=list(CTLS)))
    replayed.join(30)
    assert kept(replayed) == kept(recorded)
    # A replaced node runs no hook and is not measured (its stand-in's 20 updates send what
    # it recorded); the others count as recorded.
    assert misses(replayed) == {**WHOLE, **{name: (20, 0, 0) for name in CTLS}}


def test_a_placed_run_s_recording_with_deadlines_replays_in_one_process_bit_for_bit(
        cpu: ThreadClock, tmp_path: pathlib.Path) -> None:
    from mujou_actors.testing import assert_replay_matches

    path = tmp_path / "placed.mcap"
    args = _check_arguments(Seams(), workers=1, timer="simulated", duration=0.2, seed=3,
                            state=None, supervisor=None, trace=None, cuda_sync="block",
                            stats=True, stop_timeout=10.0, start_timeout=60.0, record=path)
    run = placed.start(make_net, placement=mujou.Placement(PLACEMENT), args=args, inputs=None,
                       state=None, make_system=InProcessSystem)
    run.join(60)

    assert misses(run) == WHOLE
    assert assert_replay_matches(path, make_net()) == 3 * 20 + 3 * 20
    one = tmp_path / "one.mcap"
    one_process(0.2, record=one)
    assert assert_replay_matches(one, make_net()) == 3 * 20 + 3 * 20


# -- the trace -----------------------------------------------------------------------------

class PidSystem(InProcessSystem):
    """`InProcessSystem` giving each group a pid of its own, as real processes have."""

    PIDS = {"a": 71001, "b": 71002, "c": 71003}

    def start_group(self, group: str, target: str, kwargs: dict[str, Any],
                    timeout: float) -> int:
        super().start_group(group, target, kwargs, timeout)
        return self.PIDS[group]


def miss_events(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "deadline"]


def test_a_placed_run_s_trace_holds_each_miss_in_its_group_s_process_inside_its_hook(
        cpu: ThreadClock, tmp_path: pathlib.Path) -> None:
    from collections import Counter

    from tests.test_trace import EPS, slices

    one_path, placed_path = tmp_path / "one.json", tmp_path / "placed.json"
    one_process(0.2, trace=one_path)
    run = in_groups(0.2, trace=placed_path, system=PidSystem)
    run.join(60)

    doc = json.loads(placed_path.read_text())
    events = miss_events(doc)
    pid_of = {e["args"]["name"]: e["pid"] for e in doc["traceEvents"]
              if e["ph"] == "M" and e["name"] == "process_name"}
    group_of = {path: f"group {group}" for path, group in PLACEMENT.items()}
    # Every miss of stats() is an instant event: an update that missed both is one event.
    both, budget = "missed its budget and deadline", "missed its budget"
    assert Counter((e["ph"], e["name"]) for e in events) == {
        **{("i", f"{name}.on_update {budget}"): 5 for name in CTLS},
        **{("i", f"{name}.on_update {both}"): 4 for name in CTLS},
        **{("i", f"{name}_f.on_update {budget}"): 20 for name in CTLS}}
    for e in events:
        path = e["name"].partition(".")[0]
        assert e["pid"] == pid_of[group_of[path]] == PidSystem.PIDS[PLACEMENT[path]], e
        hook = [x for x in slices(doc) if (x["pid"], x["tid"]) == (e["pid"], e["tid"])
                and x["ts"] - EPS <= e["ts"] <= x["ts"] + x["dur"] + EPS]
        assert [x["name"] for x in hook] == [f"{path}.on_update"], e
        assert round(hook[0]["args"]["t_ns"] / 1e9, 9) == e["args"]["due"]
    # The figures are those of one process, miss for miss.
    one = miss_events(json.loads(one_path.read_text()))

    def figures(found: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted((e["name"], *e["args"].values()) for e in found)

    assert figures(events) == figures(one)
    fifth = {"due": 0.05, "run_time": 0.007, "finished": 0.007, "budget": 0.002,
             "deadline": 0.005}  # update 5 of a controller: 7 ms
    assert fifth in [e["args"] for e in events if e["name"] == f"warn.on_update {both}"]


# -- the command line ----------------------------------------------------------------------

@pytest.fixture
def cli_logging() -> Any:
    """The command adds a handler to the library's logger: in-process, take it away again."""
    import logging

    logger = logging.getLogger("mujou_actors")
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


MISSED = ("missed: warn budget 9 deadline 4  warn_f budget 20 deadline 0  "
          "skip budget 9 deadline 4  skip_f budget 20 deadline 0  "
          "safe budget 9 deadline 4  safe_f budget 20 deadline 0")


@pytest.mark.parametrize("limits", ["declared", "none"])
def test_mujou_run_s_plain_output_names_under_its_final_table_the_nodes_that_missed(
        cpu: ThreadClock, tmp_path: pathlib.Path, cli_logging: None, limits: str) -> None:
    from click.testing import CliRunner

    from mujou_actors import cli

    (tmp_path / "nets.py").write_text("from tests.test_deadlines_state import make_net\n")

    result = CliRunner().invoke(cli.main, [
        "run", f"{tmp_path / 'nets.py'}:make_net", "--timer", "simulated", "--duration", "0.2",
        "--seed", "3", "--net-kwargs", json.dumps({"limits": limits})])

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    table = lines.index("\t".join(cli.NODE_COLUMNS))
    rows = [line.split("\t")[0] for line in lines[table + 1:table + 8]]
    assert rows == ["keep", "warn", "warn_f", "skip", "skip_f", "safe", "safe_f"]
    # A run this short prints no status line: the final table, then what was missed.
    assert lines[table + 8:] == ([MISSED] if limits == "declared" else [])


class Gate(mujou.Node):
    """Holds the run in its 10th update (t = 0.101 s, between two ticks of the controllers)
    until the test sets `open`, with one worker: every other node waits too."""

    def __init__(self) -> None:
        super().__init__(period=0.0101)
        self.n = 0
        self.reached = threading.Event()
        self.open = threading.Event()

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == 10:
            self.reached.set()
            assert self.open.wait(60), "the test never opened the gate"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_mujou_top_once_from_another_process_shows_the_misses_under_its_table(
        cpu: ThreadClock, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import subprocess
    import sys
    import tempfile

    folder = pathlib.Path(tempfile.mkdtemp(prefix="mj", dir="/tmp")) / "rt"  # a short path
    monkeypatch.setenv("MUJOU_RUNTIME_DIR", str(folder))
    monkeypatch.delenv("MUJOU_ATTACH", raising=False)
    gate = Gate()
    run = mujou.run({**make_net(), "gate": gate}, timer="simulated", seed=3, workers=1)
    try:
        assert gate.reached.wait(60)
        top = subprocess.run([sys.executable, "-m", "mujou_actors", "top", str(os.getpid()),
                              "--once"], capture_output=True, text=True, timeout=120,
                             cwd=pathlib.Path(__file__).resolve().parent.parent)
        held = misses(run)
    finally:
        gate.open.set()
        run.stop()
        for path in sorted(folder.parent.rglob("*"), reverse=True):
            path.unlink() if not path.is_dir() else path.rmdir()
        folder.parent.rmdir()

    assert top.returncode == 0, top.stderr
    # Ten ticks of each controller: the first half of the whole run's misses.
    assert held == {**{n: (10, 5, 2) for n in CTLS}, **{f"{n}_f": (10, 10, 0) for n in CTLS},
                    "keep": (20, 0, 0), "gate": (10, 0, 0)}  # its 10th: begun
    words = " ".join(top.stdout.split())  # the caption may wrap at 120 columns
    assert ("missed: warn budget 5 deadline 2 warn_f budget 10 deadline 0 skip budget 5 "
            "deadline 2 skip_f budget 10 deadline 0 safe budget 5 deadline 2 safe_f budget 10 "
            "deadline 0") in words
    assert words.index("missed:") > words.index("safe_f")  # under the table's rows
