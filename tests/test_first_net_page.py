"""docs/first-net.md, followed as a reader would: every snippet runs, in order, in an empty
folder, and prints what the page shows.

A ```python block runs in one namespace shared with the blocks before it, except a block
with a ``title="FILE"``, which the page asks the reader to save: it is written to FILE. A
```text block right after a python or bash block is what that block prints; ``...`` stands
for anything (doctest's ELLIPSIS), for figures that differ from run to run. A ```bash block's
``mujou ...`` lines run as ``python -m mujou_actors ...`` in the same folder.
"""

from __future__ import annotations

import doctest
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "first-net.md").read_text()

pytestmark = pytest.mark.timeout(300)

# Runs the page's python blocks in order in one namespace, each block's stdout captured.
DRIVER = """\
import contextlib, io, json, sys
blocks = json.loads(open(sys.argv[1]).read())
namespace = {"__name__": "__main__"}
printed = []
for code in blocks:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/first-net.md", "exec"), namespace)
    printed.append(out.getvalue())
print(json.dumps(printed))
"""


@dataclass(frozen=True)
class Block:
    lang: str
    title: str | None
    code: str
    output: str | None  # the ```text block that follows it, if any


def _blocks(text: str) -> list[Block]:
    fences = list(re.finditer(r'^```(\w+)(?: title="([^"]+)")?\n(.*?)^```\n', text,
                              flags=re.S | re.M))
    blocks = []
    for i, fence in enumerate(fences):
        lang, title, code = fence.groups()
        if lang == "text":
            continue
        following = fences[i + 1] if i + 1 < len(fences) else None
        output = None
        if (following is not None and following.group(1) == "text"
                and text[fence.end():following.start()].strip() == ""):
            output = following.group(3)
        blocks.append(Block(lang, title, code, output))
    return blocks


BLOCKS = _blocks(PAGE)


def _matches(expected: str, got: str) -> bool:
    return doctest.OutputChecker().check_output(expected, got, doctest.ELLIPSIS)


@pytest.fixture(scope="module")
def followed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The page's python blocks, run in order in an empty folder: (the folder, each
    executed block's stdout)."""
    folder = tmp_path_factory.mktemp("first-net")
    for block in BLOCKS:
        if block.lang == "python" and block.title is not None:
            (folder / block.title).write_text(block.code)
    code = [b.code for b in BLOCKS if b.lang == "python" and b.title is None]
    (folder / "blocks.json").write_text(json.dumps(code))
    (folder / "driver.py").write_text(DRIVER)

    result = subprocess.run([sys.executable, "driver.py", "blocks.json"], cwd=folder,
                            capture_output=True, text=True, timeout=240)

    assert result.returncode == 0, result.stderr
    return folder, json.loads(result.stdout.splitlines()[-1])


def test_the_page_walks_through_the_ten_things_a_first_net_needs_in_order() -> None:
    headings = re.findall(r"^## (.+)$", PAGE, flags=re.M)

    assert headings == ["1. Install", "2. One node", "3. Two nodes and a port",
                        "4. Simulated and real time", "5. Seeds", "6. A snapshot",
                        "7. The command line's live view", "8. Where to go next"]


def test_the_install_command_is_the_readmes_with_the_same_pin() -> None:
    install = next(b.code.strip() for b in BLOCKS if b.lang == "bash")
    readme = (ROOT / "README.md").read_text()

    steps = install.split(" && ")

    assert steps == ["python3 -m venv .venv", ". .venv/bin/activate",
                     "pip install torch==2.13.0 -e ."]
    assert "pip install torch==2.13.0 -e '.[test,examples]'" in readme


def test_every_python_snippet_runs_in_order_and_prints_what_the_page_shows(
        followed: tuple[Path, list[str]]) -> None:
    _, printed = followed
    executed = [b for b in BLOCKS if b.lang == "python" and b.title is None]

    checked = [(b.output, out) for b, out in zip(executed, printed, strict=True)
               if b.output is not None]

    assert len(executed) == len(checked) == 5  # every snippet shows what it prints
    for expected, got in checked:
        assert _matches(expected, got), f"expected:\n{expected}\ngot:\n{got}"


def test_the_snippets_leave_the_file_and_the_snapshot_the_page_names(
        followed: tuple[Path, list[str]]) -> None:
    import mujou_actors as mujou

    folder, _ = followed

    tree = mujou.load(folder / "rig.mujou")

    assert (folder / "first_net.py").is_file()
    assert tree["time_ns"] == 1_000_000_000
    assert sorted(tree["nodes"]) == ["", "filter", "sensor"]


COMMANDS = {line: b.output for b in BLOCKS if b.lang == "bash"
            for line in b.code.splitlines() if line.startswith("mujou ")}


def test_the_page_shows_these_commands() -> None:
    assert list(COMMANDS) == [
        "mujou --version",
        "mujou run first_net.py --duration 5",
        "mujou run first_net.py --timer simulated --duration 60 --seed 0",
        "mujou inspect rig.mujou"]


# A process each, seconds of wall time: all but one are left to the full suite; the quick
# subset keeps `mujou inspect`, which runs the command (and `python -m mujou_actors`) at all.
@pytest.mark.parametrize("line", [
    line if line.startswith("mujou inspect ") else pytest.param(line, marks=pytest.mark.slow)
    for line in COMMANDS])
def test_a_mujou_command_of_the_page_runs_in_the_folder_and_prints_what_it_shows(
        followed: tuple[Path, list[str]], line: str) -> None:
    folder, _ = followed

    result = subprocess.run([sys.executable, "-m", "mujou_actors", *shlex.split(line)[1:]],
                            cwd=folder, capture_output=True, text=True, timeout=120)

    shown = COMMANDS[line]
    assert result.returncode == 0, result.stderr
    if shown is not None:
        assert _matches(shown, result.stdout), result.stdout
    if line == "mujou --version":
        assert result.stdout.startswith("mujou, version ")
    if line.startswith("mujou run "):
        table = result.stdout.splitlines()[-3:]  # without a terminal: a table at the end
        assert [row.split("\t")[0] for row in table] == ["node", "sensor", "filter"]
        assert [row.split("\t")[2] for row in table[1:]] == ["100.0", "20.0"]
