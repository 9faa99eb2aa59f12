"""README.md tells a newcomer the truth: two commands that enter the venv first, the test
command CI runs, its cost."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
SECTION = README[README.index("## Two commands"):README.index("## Learn more")]


def _blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_exactly_two_commands_each_entering_the_virtual_environment_before_it_installs(
        ) -> None:
    blocks = _blocks(SECTION)

    assert len(blocks) == 2
    for block in blocks:
        steps = block.split(" && ")
        assert steps[:2] == ["python3 -m venv .venv", ". .venv/bin/activate"]
        assert steps[2].startswith("pip install torch==2.13.0 -e ")


def test_ci_runs_the_exact_test_command_of_the_readme() -> None:
    test_command = _blocks(SECTION)[1]

    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith("#")]

    assert test_command == ("python3 -m venv .venv && . .venv/bin/activate && "
                            "pip install torch==2.13.0 -e '.[test,examples]' && python -m pytest")
    # The README's command (the compiled build it installs), then the pure-Python fallback.
    assert ci[-2:] == [test_command, ". .venv/bin/activate && MUJOU_PURE=1 python -m pytest"]


def test_the_readme_says_what_the_tests_cost_and_offers_a_quick_subset_by_marker() -> None:
    development = README[README.index("## Development"):]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    markers = pyproject["tool"]["pytest"]["ini_options"]["markers"]

    quick = [c for c in re.findall(r"`(python -m pytest[^`]*)`", SECTION + development)
             if "not slow" in c]

    assert "about 10 minutes on a 2-core machine" in SECTION
    assert set(quick) == {'python -m pytest -m "not slow"'}
    assert any(m.startswith("slow:") for m in markers)
    # the quick subset's measured time and size, written next to the full command
    assert re.search(r"\| `python -m pytest -m \"not slow\"` \| .*[\d,]+ of the [\d,]+ tests.*"
                     r"\d+ s", development)


def test_the_quick_subset_leaves_the_slow_modules_out_and_ci_runs_everything() -> None:
    from tests.conftest import SLOW_MODULES

    ci = (ROOT / ".ci" / "run").read_text()

    assert all((ROOT / "tests" / f"{name}.py").is_file() for name in SLOW_MODULES)
    assert not re.search(r"pytest\b[^\n]*\s-m\s", ci) and "not slow" not in ci


def test_no_version_pin_is_said_to_select_the_cpu_build() -> None:
    ci = (ROOT / ".ci" / "run").read_text()

    assert "pins the CPU build" not in README
    assert "is the CPU build" not in ci
    assert "--index-url https://download.pytorch.org/whl/cpu" in SECTION
