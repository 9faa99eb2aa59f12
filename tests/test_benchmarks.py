"""Smoke run of the peer benchmark suite (benchmarks/run.py --quick)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
def test_run_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=110,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    for name in ("ticks", "pingpong", "fanout", "timer", "scale", "snapshot"):
        mujou = doc["workloads"][name]["results"]["mujou"]
        assert mujou["median"] > 0, (name, mujou)
        assert mujou["min"] > 0, (name, mujou)
    for name, w in doc["workloads"].items():  # every peer has figures or a reason
        for side, r in w["results"].items():
            assert "median" in r or r["absent"], (name, side, r)


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
