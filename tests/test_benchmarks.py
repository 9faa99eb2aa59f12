"""Smoke run of the peer benchmark suite (benchmarks/run.py --quick)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


REAL_WORK = {"hopper": "plain", "hopper-trivial": "plain", "pendulum": "plain",
             "ticks10": "floor"}  # benchmarks/realwork.py's workloads -> the side compared


# The quick suite takes about 40 s on the 2-core reference machine, and up to
# three times that while other work loads it.
@pytest.mark.timeout(240)
def test_run_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=230,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    for name in ("ticks", "pingpong", "fanout", "timer", "scale", "snapshot", *REAL_WORK):
        mujou = doc["workloads"][name]["results"]["mujou"]
        assert mujou["median"] > 0, (name, mujou)
        assert mujou["min"] > 0, (name, mujou)
    for name, w in doc["workloads"].items():  # every peer has figures or a reason
        for side, r in w["results"].items():
            assert "median" in r or r["absent"], (name, side, r)
    _check_real_work(doc["workloads"], doc["repeat"])


def _check_real_work(workloads: dict[str, Any], repeat: int) -> None:
    """The real-work workloads ran both sides and, where they record, compared them."""
    for name, base in REAL_WORK.items():
        w = workloads[name]
        assert w["results"][base]["min"] > 0, (name, w["results"][base])
        mujou = w["results"]["mujou"]
        assert mujou["count"] == w["results"][base]["count"] > 0, name
        assert len(mujou["samples"]) == repeat, name
        if name == "ticks10":
            assert mujou["vs_floor"]["median"] > 0
        else:  # every repetition's recording was compared with the plain loop's, and equal
            assert w["identical"] == {"compared": repeat * (len(w["results"]) - 1),
                                      "passed": True}, name
            assert "bit-identical to the plain loop" in w["note"], name
        if name != "pendulum":  # the targets: said whether met, never a threshold here
            assert w["target"]["met"] in (True, False), name
    hopper = workloads["hopper"]["results"]
    for side in ("mujou", "mujou-2w", "plain"):  # the user's own calls, timed inside and out
        assert hopper[side]["env_us"]["median"] > 0 and hopper[side]["policy_us"]["median"] > 0
    assert workloads["hopper-trivial"]["results"]["mujou"]["framework_us"]["median"] != 0


@pytest.mark.timeout(120)
def test_realwork_runs_alone_and_refuses_unknown_workloads(tmp_path: Path) -> None:
    script = str(ROOT / "benchmarks" / "realwork.py")
    out = tmp_path / "realwork.json"
    proc = subprocess.run(
        [sys.executable, script, "--quick", "--repeat", "1", "--only", "ticks10,pendulum",
         "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=110)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "realwork" and list(doc["workloads"]) == ["pendulum", "ticks10"]
    assert doc["workloads"]["pendulum"]["identical"] == {"compared": 1, "passed": True}
    assert "vs floor" in proc.stdout and "bit-identical to the plain loop" in proc.stdout
    bad = subprocess.run([sys.executable, script, "--only", "hopper,nope"],
                         cwd=ROOT, capture_output=True, text=True, timeout=50)
    assert bad.returncode == 2
    assert "--only: no workload nope; choose from hopper, hopper-trivial" in bad.stderr


# Two repetitions of two fresh processes (about 25 s on the loaded 2-core machine).
@pytest.mark.timeout(180)
def test_targets_measures_the_rl_step_beside_its_plain_loop_in_fresh_processes(
        tmp_path: Path) -> None:
    script = str(ROOT / "benchmarks" / "targets.py")
    out = tmp_path / "targets.json"

    proc = subprocess.run([sys.executable, script, "--quick", "--only", "rl", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=170)
    bad = subprocess.run([sys.executable, script, "--only", "rl,nope"],
                         cwd=ROOT, capture_output=True, text=True, timeout=50)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "targets" and doc["quick"] is True and doc["repeat"] == 2
    assert isinstance(doc["build"], str) and doc["build"]  # "python", or the kernel's BUILD
    assert list(doc["targets"]) == ["rl"]
    rl = doc["targets"]["rl"]
    assert rl["against"] == "plain loop" and rl["builds"] == [doc["build"]]
    for side in ("mujou", "reference"):  # wall and CPU time of every repetition
        assert rl["sides"][side]["count"] == rl["size"]["steps"] > 0
        for clock in ("wall", "cpu"):
            figures = rl["sides"][side][clock]
            assert len(figures["samples"]) == 2 and 0 < figures["min"] <= figures["median"]
    assert rl["ratio"]["wall"]["median"] > 0 and rl["ratio"]["cpu"]["median"] > 0
    assert rl["target"]["bound"] == 4.0 and rl["target"]["met"] in (True, False)
    assert rl["target"]["value"] == rl["sides"]["mujou"]["wall"]["median"]
    assert "trivial RL step" in proc.stdout
    assert bad.returncode == 2 and "--only: no workload nope; choose from rl, ticks10" in bad.stderr


def _realwork(monkeypatch: pytest.MonkeyPatch) -> Any:
    """benchmarks/realwork.py as a module (it imports its neighbour ``common``)."""
    import importlib.util

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("realwork", ROOT / "benchmarks" / "realwork.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_realwork_identity_check_fails_on_any_bit_of_difference(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    realwork = _realwork(monkeypatch)
    plain = realwork.hopper_plain(5, trivial=True)["record"]
    net = realwork.hopper_mujou(5, trivial=True)["record"]
    nudged = {**net, "action": net["action"].clone()}
    nudged["action"][3, 1] = torch.nextafter(nudged["action"][3, 1], torch.tensor(9.0))
    zero = {"x": torch.tensor([0.0])}

    assert realwork.differences(net, plain) == []
    realwork.check_identical("hopper-trivial", "mujou", net, plain)  # does not raise
    with pytest.raises(AssertionError, match=r"mujou differs from the plain loop: action\[3\]"):
        realwork.check_identical("hopper-trivial", "mujou", nudged, plain)
    assert realwork.differences({"x": -zero["x"]}, zero) == ["x[0]: -0.0 against 0.0"]
    short = {**net, "obs": net["obs"][:-1]}
    assert realwork.differences(short, plain) == [
        "obs: (5, 11) torch.float32 against (6, 11) torch.float32"]
    assert realwork.differences({"obs": net["obs"]}, plain) == [
        "action: only in the reference", "reward: only in the reference"]
    nan = torch.tensor([float("nan")])
    assert realwork.differences({"x": nan}, {"x": nan.clone()}) == []  # the same bits


def test_realwork_measure_stops_at_a_side_that_differs_from_the_plain_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    realwork = _realwork(monkeypatch)
    calls = []

    def side(value: float) -> Any:
        def run() -> dict[str, Any]:
            calls.append(value)
            return {"count": 3, "us_per_step": 1.0 + value, "record": {"x": torch.tensor([value])}}
        return run

    same = realwork.measure("w", "µs/step", {}, {"mujou": side(0.0), "plain": side(0.0)}, 2,
                            base="plain")
    with pytest.raises(AssertionError, match=r"w: mujou differs from the plain loop: x\[0\]"):
        realwork.measure("w", "µs/step", {}, {"mujou": side(1.0), "plain": side(0.0)}, 2,
                         base="plain")

    assert same["identical"] == {"compared": 2, "passed": True}
    assert same["results"]["mujou"]["overhead_pct"]["median"] == 0.0
    assert calls[-2:] == [1.0, 0.0]  # it stopped after the first repetition


@pytest.mark.timeout(60)
def test_only_measures_the_named_workloads_and_refuses_unknown_ones(tmp_path: Path) -> None:
    script = str(ROOT / "benchmarks" / "run.py")
    out = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, script, "--quick", "--repeat", "1", "--only", "snapshot,ticks",
         "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(json.loads(out.read_text())["workloads"]) == ["ticks", "snapshot"]

    bad = subprocess.run([sys.executable, script, "--only", "ticks,nope"],
                         cwd=ROOT, capture_output=True, text=True, timeout=50)
    assert bad.returncode == 2
    assert "--only: no workload nope; choose from ticks, pingpong" in bad.stderr
    empty = subprocess.run([sys.executable, script, "--only", " ,"],
                           cwd=ROOT, capture_output=True, text=True, timeout=50)
    assert empty.returncode == 2
    assert "--only: name at least one workload" in empty.stderr


def _cachesim():  # the script's module, imported by path (benchmarks/ is no package)
    import importlib.util

    spec = importlib.util.spec_from_file_location("cachesim", ROOT / "benchmarks" / "cachesim.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_cachesim_reads_cachegrinds_totals_and_takes_the_margin() -> None:
    cachesim = _cachesim()
    stderr = ("==81== I   refs:      42,477,231,931\n"
              "==81== D1  misses:       470,251,640  (   426,843,795 rd   + 43,407,845 wr)\n"
              "==81== LLd misses:        14,645,407  (     6,624,761 rd   +  8,020,646 wr)\n")
    totals = cachesim.parse_totals(stderr)
    assert totals == {"ir": 42_477_231_931, "d1": 470_251_640, "ll": 14_645_407}

    short = {"ir": 1000, "d1": 100, "ll": 10, "updates": 50}
    long = {"ir": 3000, "d1": 300, "ll": 50, "updates": 150}
    assert cachesim.marginal(short, long) == {"updates": 100, "ir": 20.0, "d1": 2.0, "ll": 0.4}
    with pytest.raises(ValueError, match="'ll'"):
        cachesim.parse_totals("\n".join(stderr.splitlines()[:2]))
    with pytest.raises(ValueError, match="A < B"):
        cachesim.marginal(long, short)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("side", "updates"), [("mujou", 30 * 3), ("floor", 30 * 3)])
def test_cachesim_child_runs_the_net_it_measures(side: str, updates: int) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cachesim.py"), "--child", side, "30", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.split()[-1]) == updates


@pytest.mark.timeout(60)
def test_cachesim_without_valgrind_says_so(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cachesim.py"), "--json", str(tmp_path / "x")],
        cwd=ROOT, capture_output=True, text=True, timeout=50, env={"PATH": str(tmp_path)})
    assert proc.returncode == 2
    assert "valgrind is not on the PATH" in proc.stderr
    assert not (tmp_path / "x").exists()


GPU_CHECKS = {  # JSON key -> the table's row
    "pytest": "pytest -m cuda", "handoff": "cuda->cuda hand-off: copies",
    "alloc-device": "allocator reuse: device path", "alloc-write": "allocator reuse: run.write",
    "wait-cpu": "waits: CPU time, block vs spin", "sync-waits": "set_sync_mode: implicit waits",
    "sync-api": "set_sync_mode: read back, too late", "host-reads": "host reads never stale",
    "mixed": "mixed-device messages", "streams": "current stream in every hook",
    "sync-debug": "no hidden host sync", "state": "GPU state through save/restore",
    "many-nodes": "more than 32 CUDA nodes", "workers": "simulated: 1, 2, 4 workers",
    "example": "examples/gpu_pipeline.py CPU vs GPU", "two-gpus": "cuda:0 -> cuda:1",
    "cuda-ipc": "two groups, one machine: CUDA IPC",
}
SKIPPED_DRY = {"pytest", "cuda-ipc"}  # what the dry run cannot run at all


@pytest.mark.timeout(60)
def test_gpu_check_dry_run_runs_every_check_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run",
         "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=50)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["dry_run"] is True and doc["device"] == "CPU dry run"
    assert list(doc["checks"]) == list(GPU_CHECKS)
    statuses = {key: c["status"] for key, c in doc["checks"].items()}
    assert statuses == {key: "skipped" if key in SKIPPED_DRY else "dry-ok" for key in GPU_CHECKS}
    for key, row in GPU_CHECKS.items():
        check = doc["checks"][key]
        assert check["name"] == row
        assert set(check) >= {"name", "status", "detail", "control", "seconds"}, key
        assert row in proc.stdout, row  # one row of the table each
    assert "dry-ok" in proc.stdout
    assert "0 corrupted" in doc["checks"]["alloc-device"]["detail"]
    assert "Output 0, Input 0" in doc["checks"]["host-reads"]["detail"]
    # The mixed check's control (actor.receive patched) ran, and said what it could not see.
    assert doc["checks"]["mixed"]["control"].startswith(
        "receive without per-tensor routing: patched in, 0 calls")
    assert doc["checks"]["mixed"]["control_counts"]["count"] == [50, 50]
    assert doc["checks"]["streams"]["control"].startswith("Actor.on_stream on the default stream")


def _gpu_check(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """benchmarks/gpu_check.py as a module, its "CUDA" on the strict fake (tests/fake_cuda.py).

    Returns the module and the fake runtime.
    """
    import importlib.util

    import torch

    from tests import fake_cuda

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "gpu_check", module)  # its dataclasses look it up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    rt, _ = fake_cuda.install(monkeypatch)
    # Node(device="cuda:0") checks for a GPU; the fake runtime carries out the routing.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    return module, rt


@pytest.mark.timeout(30)
def test_gpu_check_mixed_control_breaks_the_routing_and_its_detector_sees_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    import torch

    gpu_check, _ = _gpu_check(monkeypatch)
    env = gpu_check.Env(False, torch.device("cuda", 0), None, argparse.Namespace())

    routed = gpu_check._mixed_run(env)
    calls = [0]
    with gpu_check._unrouted_receive(calls):
        unrouted = gpu_check._mixed_run(env)
    check = gpu_check.check_mixed(env)

    assert routed["ok"] and routed["count"] == (50, 50) and routed["tensors"] == 4
    assert routed["wrong"] == {"gpu": [], "cpu": []} and routed["bad_values"] == 0
    assert calls == [100]  # every message the CUDA reader took (the CPU reader's too)
    assert not unrouted["ok"] and unrouted["bad_values"] == 0
    assert unrouted["wrong"] == {"gpu": ["parts.1@cpu", "stamp@cpu"], "cpu": []}
    assert check["status"] == "ok"
    assert check["control"] == ("receive without per-tensor routing (100 calls): "
                                "the CUDA reader got misplaced ['parts.1@cpu', 'stamp@cpu']")


@pytest.mark.timeout(60)
def test_gpu_check_refuses_unknown_checks_and_says_when_there_is_no_gpu(tmp_path: Path) -> None:
    script = str(ROOT / "benchmarks" / "gpu_check.py")
    bad = subprocess.run([sys.executable, script, "--dry-run", "--only", "state,nope"],
                         cwd=ROOT, capture_output=True, text=True, timeout=50)
    assert bad.returncode == 2
    assert "--only: no check nope; choose from pytest, handoff" in bad.stderr

    one = subprocess.run([sys.executable, script, "--dry-run", "--only", "state,workers",
                          "--json", str(tmp_path / "g.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=50)
    assert one.returncode == 0, one.stdout + one.stderr
    assert list(json.loads((tmp_path / "g.json").read_text())["checks"]) == ["state", "workers"]

    import torch
    if not torch.cuda.is_available():
        none = subprocess.run([sys.executable, script, "--json", str(tmp_path / "n.json")],
                              cwd=ROOT, capture_output=True, text=True, timeout=50)
        assert none.returncode == 0
        assert none.stdout.startswith("no CUDA device: nothing to check")
        assert not (tmp_path / "n.json").exists()


@pytest.mark.timeout(30)
def test_gpu_check_streams_control_runs_hooks_on_the_default_stream_and_is_flagged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    import torch

    gpu_check, rt = _gpu_check(monkeypatch)

    def stream_id(device: torch.device) -> tuple[str, bool] | None:  # the fake's streams
        if device.type != "cuda":
            return None
        name = rt.current_stream(device).name
        return name, name.startswith("default@")

    monkeypatch.setattr(gpu_check, "_stream_id", stream_id)
    env = gpu_check.Env(False, torch.device("cuda", 0), None, argparse.Namespace())

    check = gpu_check.check_streams(env)

    assert check["status"] == "ok", check
    assert check["detail"].startswith(
        "streams per run [[('stream1@cuda:0', False)], [('stream2@cuda:0', False)]]")
    assert check["control"] == ("Actor.on_stream on the default stream: streams per run "
                                "[[('default@cuda:0', True)], [('default@cuda:0', True)]], "
                                "the detector says not own")


@pytest.mark.timeout(120)
def test_the_send_benchmark_measures_every_case(tmp_path: Path) -> None:
    out = tmp_path / "sends.json"
    script = str(ROOT / "benchmarks" / "sends.py")
    proc = subprocess.run([sys.executable, script, "--quick", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    samples = json.loads(out.read_text())["samples"]
    assert list(samples) == ["int", "held", "held-any", "temp", "tuple"]
    for case in samples.values():
        assert case[0]["ns"] > 0 and case[0]["ops"] > 0 and case[0]["calls"] >= 1, case


# Pure bytecodes of three builds (the base, the A/A, one copy replaced by its call) on two
# workloads: about 40 s on the loaded 2-core machine.
@pytest.mark.timeout(240)
def test_the_inlined_benchmark_counts_a_copy_against_a_call_to_its_rule(tmp_path: Path) -> None:
    out = tmp_path / "inlined.json"
    script = str(ROOT / "benchmarks" / "inlined.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, script, "--quick", "--only", "run_due",
                           "--workloads", "ticks10,pingpong", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=230)
    bad = subprocess.run([sys.executable, script, "--only", "run_due,nope"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=50)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "inlined" and doc["quick"] is True
    assert list(doc["workloads"]) == ["ticks10", "pingpong"]
    rows = {row["copy"]: row for row in doc["copies"]}
    assert list(rows) == ["A/A", "run_due"] and rows["A/A"]["verdict"] == "control"
    for name in ("ticks10", "pingpong"):  # the base built twice counts the same
        aa = rows["A/A"]["workloads"][name]
        assert set(aa) == {"ops"} and aa["ops"]["with"] > 0  # quick: pure Python only
        assert abs(aa["ops"]["pct"]) < 1, aa
    # The update of a simulated tick calls run_update without the copy: more bytecodes.
    ticks = rows["run_due"]["workloads"]["ticks10"]["ops"]
    assert ticks["delta"] > 10 and "actor.py:run_update" in ticks["functions"], ticks
    assert rows["run_due"]["verdict"] == "needed" and rows["run_due"]["reasons"]
    assert "| `run_due` |" in proc.stdout  # the Markdown table of docs/performance.md
    assert bad.returncode == 2 and "--only: no copy nope; choose from run_due" in bad.stderr


@pytest.mark.timeout(180)
def test_the_sync_benchmark_measures_each_case_beside_its_plain_twin(tmp_path: Path) -> None:
    out = tmp_path / "sync.json"
    script = str(ROOT / "benchmarks" / "sync.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, script, "--quick", "--baseline", str(ROOT),
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=170, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert list(doc["medians"]) == ["plain", "plain@baseline", "exact", "approximate",
                                    "plain-10:1", "approx-10:1"]
    # Each run took CPU time; their difference, the marginal cost, is a figure whatever
    # its sign (in a quick run of one repetition on a loaded machine it can be noise).
    assert all(isinstance(m, float) for m in doc["medians"].values())
    assert all(c > 0 for runs in doc["samples"].values() for c in runs[0]["cpu_runs"])
    sets = {name: runs[0]["sets"] for name, runs in doc["samples"].items()}
    assert sets == {"plain": 200, "plain@baseline": 200, "exact": 200, "approximate": 200,
                    "plain-10:1": 20, "approx-10:1": 20}
    assert "µs/set more" in proc.stdout



# Ten fresh processes, two of them placed runs: 40 s to 100 s on the 2-core machine, loaded.
@pytest.mark.timeout(240)
def test_the_params_benchmark_measures_the_guard_the_reads_and_the_host_calls(
        tmp_path: Path) -> None:
    out = tmp_path / "params.json"
    script = str(ROOT / "benchmarks" / "params.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, script, "--quick", "--baseline", str(ROOT),
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=230, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert list(doc["samples"]) == ["plain", "plain@baseline", "declared", "access", "write",
                                    "set_param", "set_param+record", "placed-write", "placed"]
    updates = {name: doc["samples"][name][0]["updates"]
               for name in ("plain", "plain@baseline", "declared")}
    assert updates == {"plain": 400, "plain@baseline": 400, "declared": 400}  # 4 nodes, 0.1 s
    # Differences of two timed loops: a loaded machine may make one negative, never absent.
    access = doc["medians"]["access"]
    assert sorted(access) == ["apply", "guard", "read_default", "read_plain", "read_set",
                              "write_param", "write_plain"]
    assert access["apply"] > 0 and access["write_param"] > 0
    for name in ("write", "set_param", "set_param+record", "placed-write", "placed"):
        figures = doc["medians"][name]
        assert 0 < figures["wall_us"] <= figures["p99_us"] and figures["cpu_us"] > 0, name
    assert doc["samples"]["placed"][0]["calls"] == 20
    assert "µs/update" in proc.stdout and "queue + apply one set" in proc.stdout

@pytest.mark.timeout(180)
def test_the_wire_benchmark_measures_the_codec_and_the_hop(tmp_path: Path) -> None:
    out = tmp_path / "wire.json"
    script = str(ROOT / "benchmarks" / "wire.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, script, "--quick", "--repeat", "1", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=170, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())["results"]
    assert list(results["codec"]) == ["float x1", "float x64", "tensor64 x1", "tensor64 x64",
                                      "tuple x1", "tuple x64", "1MiB-inline", "1MiB-shm",
                                      "1MiB-shm-view"]
    assert all(r["enc_us"] > 0 and r["dec_us"] > 0 for r in results["codec"].values())
    assert list(results["hop"]) == ["tensor64", "1MiB-inline", "1MiB-shm"]
    assert results["hop"]["tensor64"]["rate"] > 0


@pytest.mark.timeout(120)
def test_the_codec_benchmark_measures_both_formats_on_every_tree(tmp_path: Path) -> None:
    out = tmp_path / "codec.json"
    script = str(ROOT / "benchmarks" / "codec.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, script, "--quick", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=110, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())["results"]
    assert list(results) == ["state dict", "config", "batch x64", "deep", "ints+strs", "small"]
    for r in results.values():
        assert r["v1_us"] > 0 and r["v2_us"] > 0 and r["ratio"] == r["v1_us"] / r["v2_us"], r
        assert r["v1_bytes"] > 0 and r["v2_bytes"] >= r["v1_bytes"], r
    assert results["ints+strs"]["ratio"] > 2  # the C decoder's win shows even on a loaded machine


@pytest.mark.timeout(180)
def test_the_tcp_benchmark_measures_each_transport_and_checks_every_message(
        tmp_path: Path) -> None:
    out = tmp_path / "tcp.json"
    script = str(ROOT / "benchmarks" / "tcp.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, script, "--quick", "--repeat", "1", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=170, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())["results"]
    assert list(results) == ["ipc+shm", "tcp", "tcp+curve"]
    for figures in results.values():
        assert 0 < figures["int_hop_p50"] <= figures["int_hop_p99"]
        assert 0 < figures["1MiB_hop_p50"] <= figures["1MiB_hop_p99"] and figures["rate"] > 0


@pytest.mark.timeout(300)
def test_the_processes_benchmark_measures_placed_runs(tmp_path: Path) -> None:
    out = tmp_path / "processes.json"
    script = str(ROOT / "benchmarks" / "processes.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, script, "--quick", "--only", "steps,stream",
                           "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=280, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())["results"]
    assert list(results) == ["stream", "steps, host rounds", "steps", "steps in one process",
                             "steps, 4 groups, host rounds", "steps, 4 groups",
                             "steps, 4 groups in one process"]
    assert results["stream"]["rate"] > 0
    for groups in ("", ", 4 groups"):
        rounds, peers = results[f"steps{groups}, host rounds"], results[f"steps{groups}"]
        one = results[f"steps{groups} in one process"]
        assert rounds["rounds_s"] > 0 and one["steps_s"] > peers["steps_s"] > 0
        # On peer links the whole run is one segment (no snapshot, no host call).
        assert round(peers["rounds_s"] * peers["wall"]) == 1  # rounds/s times the wall: 1
    bad = subprocess.run([sys.executable, script, "--only", "nope"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "unknown workloads ['nope']" in bad.stderr


@pytest.mark.timeout(120)
def test_the_shared_memory_floor_echoes_between_two_processes() -> None:
    """benchmarks/shm_floor.py (the bench extra's iceoryx2): a hop of 8 bytes and of 1 MiB."""
    pytest.importorskip("iceoryx2")
    sys.path.insert(0, str(ROOT / "benchmarks"))  # also for the spawned child's import
    try:
        import shm_floor

        for size in (8, 1 << 20):
            r = shm_floor.hop(size, 20)
            assert 0 < r["rtt_p50"] <= r["rtt_p99"] < 1e6 and r["hop_p50"] == r["rtt_p50"] / 2
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


@pytest.mark.timeout(180)
def test_the_heartbeat_benchmark_measures_rtt_detection_and_cpu(tmp_path: Path) -> None:
    out = tmp_path / "heartbeat.json"
    script = str(ROOT / "benchmarks" / "heartbeat.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, script, "--quick", "--trials", "1", "--timeout", "0.3",
                           "--period", "0.05", "--members", "0,2", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=170, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())["results"]
    assert results["rtt"]["rtt_p50_us"] > 0 and results["rtt"]["within"] == 1.0
    assert 0 < results["detect"]["max_ms"] <= 350 and results["detect"]["trials"] == 1
    assert list(results["cpu"]) == ["0", "2"] and results["cpu"]["2"]["monitor_us"] != 0
    assert results["cpu"]["2"]["lost"] == 0


@pytest.mark.timeout(180)
def test_the_recording_benchmark_measures_the_hook_and_the_writer(tmp_path: Path) -> None:
    out = tmp_path / "recording.json"
    script = str(ROOT / "benchmarks" / "recording.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, script, "--quick", "--dir", str(tmp_path),
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=170, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert list(result["hook"]) == ["float", "tensor"]
    for case in result["hook"].values():
        assert case["send_ns"] > 0 and case["hook_calls"] == 2, case
    assert result["writer_small"]["rate"] > 0 and result["writer_tensors"]["gb_per_s"] > 0
    assert result["recorded_run"]["messages"] >= 20_000
    assert "msg/s" in proc.stdout and "GB/s" in proc.stdout


@pytest.mark.timeout(240)
def test_the_replay_benchmark_replays_the_pendulum_bit_for_bit(tmp_path: Path) -> None:
    out = tmp_path / "replay.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "replay.py"), "--quick",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=230, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["identical"] is True
    for kind in ("plain", "replay"):
        assert result["results"][kind]["x_real_time"]["median"] > 0, kind
    assert result["target"]["met"] in (True, False)
    assert result["realtime"]["physics_updates"] > 0
    assert "x real time" in proc.stdout


# About 100 s on the shared 2-core machine under other work (three workers, three placed
# runs and three of the steps, two restarts; each process imports torch), and up to twice
# that while more work loads it.
@pytest.mark.timeout(300)
def test_the_machines_benchmark_measures_hops_streams_steps_and_a_recovery(
        tmp_path: Path) -> None:
    out = tmp_path / "machines.json"
    script = str(ROOT / "benchmarks" / "machines.py")
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOU_SECRET", "MUJOU_SECRET_FILE")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, script, "--quick", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=290, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MUJOU_SECRET is the benchmark's fixed one" in proc.stdout  # none was set
    doc = json.loads(out.read_text())
    results = doc["results"]
    assert list(results) == ["machines", "one member", "one machine"]
    for where, r in results.items():
        assert 0 < r["int_hop_p50"] <= r["int_hop_p99"] < 1e6, (where, r)  # µs
        assert 0 < r["1MiB_hop_p50"] <= r["1MiB_hop_p99"] < 1e7, (where, r)
        assert r["int_rate"] > 100 and r["1MiB_MBs"] > 1 and r["lost"] == 0, (where, r)
        if where == "one member":  # its link only: no recovery measured
            assert "trials" not in r, r
            continue
        assert r["trials"] == 1
        for phase in ("detect", "restart", "spawn", "restore", "total"):  # ms
            assert 0 < r[f"{phase}_p50"] == r[f"{phase}_max"] < 120_000, (where, phase, r)
        assert 0 <= r["first_p50"] < 1000, (where, r)  # a beacon every 5 ms
        parts = r["detect_p50"] + r["restart_p50"] + r["first_p50"]
        assert abs(parts - r["total_p50"]) < 1e-6 * r["total_p50"], (where, r)
        assert r["spawn_p50"] + r["restore_p50"] <= r["restart_p50"] + 1e-6, (where, r)
    lost = results["machines"]
    # Only the heartbeat finds a machine gone: its timeout (1 s) less a period, at least.
    assert 800 < lost["detect_hb_p50"] <= lost["detect_p50"], lost
    assert 0 <= lost["choose_p50"] < lost["restart_p50"], lost
    assert results["one machine"]["detect_p50"] < 800  # the control plane tells of an exit
    assert "detect_hb_p50" not in results["one machine"]
    for where, runs in doc["samples"].items():  # every message of each stream arrived
        assert [r["stream_int"]["count"] for r in runs] == [doc["config"]["ints"]], where
        assert [r["stream_1MiB"]["count"] for r in runs] == [doc["config"]["tensors"]], where
        # Every node placed: the groups talk on peer links, across machines too (TCP with
        # CURVE), on one member by ipc://, and the host relays nothing between them.
        (run,) = runs
        assert run["peer_links"] and run["relayed"] == 0, (where, run)
        assert run["links"] == (1 if where == "machines" else 0), (where, run)
        assert run["local"] == (1 if where == "one member" else 0), (where, run)
        assert run["steps"]["segments"] > 0 and run["steps"]["relayed"] == 0, (where, run)
        assert run["steps"]["links"] == run["links"], (where, run)
    for where, r in results.items():
        assert 0 < r["steps_s"] < 1e6, (where, r)


@pytest.mark.timeout(240)
def test_the_view_benchmark_measures_the_sender_with_and_without_a_client(
        tmp_path: Path) -> None:
    pytest.importorskip("foxglove")
    pytest.importorskip("websockets")
    out = tmp_path / "view.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "view.py"), "--quick",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=230, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert list(result["sends"]) == ["float", "tensor"]
    for case in result["sends"].values():
        assert case["send_ns"] > 0 and set(case["samples"]) == {"none", "server", "client"}
        # every message reached the client, or the view (its watch, the client's queue)
        # counted what it dropped
        assert case["received"][0] + case["dropped"][0] >= 1
    assert result["projection_us"]["float"] > 0
    assert "+server ns" in proc.stdout and "projection" in proc.stdout


# The benchmarks' own Thespian peer rows (benchmarks/common.py's thespian_peer): stock
# Thespian, started by a process of its own here, which the test SIGKILLs.
THESPIAN_STARTER = '''
import json, socket, sys
sys.path.insert(0, sys.argv[1])
import common
from thespian.actors import Actor


class Echo(Actor):
    def receiveMessage(self, message, sender):  # noqa: N802 - Thespian's name
        self.send(sender, message)


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logs = {"version": 1, "root": {"level": "CRITICAL", "handlers": []}}
    with common.thespian_peer("multiprocTCPBase", {"Admin Port": port}, logDefs=logs,
                              transientUnique=True) as system:
        echo = system.createActor(Echo)
        assert system.ask(echo, "up", 60) == "up"
        print(json.dumps({"port": port, "pids": common.peer_pids()}), flush=True)
        sys.stdin.read()  # until it is killed
'''


def _listening(pids: set[int] | None = None) -> set[str]:
    """The local addresses (``/proc/net/tcp`` form: ``0100007F:1F90``) that ``pids`` listen
    on (IPv4 and IPv6); None: that any process of this network namespace listens on."""
    inodes = set()
    for pid in pids or ():
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and (pids is None or fields[9] in inodes):  # 0A: LISTEN
                found.add(fields[1])
    return found


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait (on pidfds: readable once a process has ended) until ``pids`` end; those left."""
    import select

    left = []
    deadline = time.monotonic() + timeout
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # gone (and reaped) already
        try:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                left.append(pid)
        finally:
            os.close(fd)
    return left


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and pidfds")
@pytest.mark.timeout(120)
def test_a_thespian_peer_listens_on_loopback_only_and_ends_with_the_process_that_started_it(
        tmp_path: Path) -> None:
    pytest.importorskip("thespian")
    script = tmp_path / "starter.py"
    script.write_text(THESPIAN_STARTER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    starter = subprocess.Popen([sys.executable, str(script), str(ROOT / "benchmarks")],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = starter.stdout.readline() if starter.stdout is not None else ""
        assert line, starter.stderr.read() if starter.stderr is not None else ""
        started = json.loads(line)
        peers = started["pids"]
        listening = _listening({starter.pid, *peers})
        admin = f"0100007F:{started['port']:04X}"

        os.kill(starter.pid, signal.SIGKILL)
        starter.wait(10)
        left = _wait_gone(peers, 30.0)  # a watchdog looks every 0.25 s, ends in 2 s

        assert len(peers) >= 3  # the admin, its logger, the actor (and no more is ours)
        assert admin in listening  # the admin's port, on 127.0.0.1
        assert {a.split(":")[0] for a in listening} == {"0100007F"}, listening
        assert left == [] and all(_state(p) in "ZX" for p in peers)  # ended (zombies at most)
        assert admin not in _listening()  # nothing listens on the admin's port any more
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait(10)


def _state(pid: int) -> str:
    """A process's state letter (``/proc/PID/stat``), "X" once gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "X"
    return raw[raw.rfind(")") + 2]


@pytest.mark.timeout(300)
def test_control_measures_a_placed_runs_start_and_the_control_plane(tmp_path: Path) -> None:
    out = tmp_path / "control.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "control.py"), "--quick", "--rtt", "20",
         "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=290)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"placed_start", "system_start", "group_start", "two_groups_start",
                            "ask_p50_us", "ask_p99_us", "notice_p50_ms", "notice_max_ms",
                            "stop_group", "shutdown"}
    # a whole placed run's start includes a control plane's and its groups'
    assert results["placed_start"] > results["system_start"] > 0
    assert 0 < results["ask_p50_us"] <= results["ask_p99_us"]
    assert "placed run start s" in proc.stdout


@pytest.mark.timeout(300)
def test_the_attach_benchmark_measures_the_main_job_unwatched_and_watched(
        tmp_path: Path) -> None:
    out = tmp_path / "attach.json"
    script = str(ROOT / "benchmarks" / "attach.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, script, "--quick", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=280, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "attach" and doc["quick"] is True and doc["repeat"] == 1
    modes = doc["modes"]
    assert list(modes) == ["none", "echo", "hz"]
    for mode, figures in modes.items():
        assert figures["sends"] > 100 and figures["send_ns"] > 0 and figures["cpu_pct"] > 0, mode
        assert 0 <= figures["serve_cpu_pct"] < 100, mode
    assert modes["echo"]["samples"][0]["received"] >= 1
    assert modes["hz"]["watcher_cpu_pct"] >= 0 and "send_extra_ns" in modes["hz"]


# Fifteen fresh processes on the smoke settings: 20 s to 40 s on the 2-core machine.
@pytest.mark.timeout(240)
def test_the_deadlines_benchmark_measures_the_guard_of_a_budget_and_a_deadline(
        tmp_path: Path) -> None:
    out = tmp_path / "deadlines.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "deadlines.py"), "--quick",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=230, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert list(doc["samples"]) == ["plain", "budget", "deadline", "rt-plain", "rt-deadline"]
    assert {n: doc["samples"][n][0]["updates"] for n in ("plain", "budget", "deadline")} == {
        "plain": 400, "budget": 400, "deadline": 400}  # 4 nodes at 1 kHz, 0.1 s
    # Differences of two timed runs: a loaded machine may make one negative, never absent.
    assert sorted(doc["medians"]) == sorted(doc["samples"])
    assert all(s[0]["updates"] > 0 for s in doc["samples"].values())
    assert "µs/update" in proc.stdout and "rt-deadline" in proc.stdout
