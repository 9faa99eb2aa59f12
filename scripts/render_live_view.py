"""Render the live view of ``mujou run`` to the pictures used in docs/cli.md.

A dev tool, not run in CI. It runs the net of ``examples/inverted_pendulum.py``
for 20 s of simulated time, the way ``mujou run FILE --timer simulated
--duration 20`` does, takes ``run.stats()`` once in the middle of the run and
once at the end, builds the table and progress bar with the CLI's own helpers
(as ``mujou_actors.cli.watch`` does) and records them in a 110-column rich
console. It writes, for each of the two moments, an SVG and a PNG:

    docs/img/live-view.svg, docs/img/live-view.png          (mid-run)
    docs/img/live-view-end.svg, docs/img/live-view-end.png  (the run has ended)

The SVG goes to PNG with the first converter found: the ``cairosvg`` package,
``rsvg-convert`` (Debian: librsvg2-bin), or headless Chromium. Rerun it from the
repository root, with the examples' extras installed::

    pip install -e '.[examples]' cairosvg
    python scripts/render_live_view.py

The numbers (rates per wall second, busy shares) depend on the machine.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console, Group
from rich.progress import BarColumn, Progress, TextColumn

import mujou_actors as mujou
from mujou_actors import cli

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "inverted_pendulum.py"
OUT = ROOT / "docs" / "img"
DURATION = 20.0  # simulated seconds
MIDDLE = 8.0     # simulated seconds at which the mid-run view is taken
WIDTH = 110      # console columns


def _progress(duration: float) -> tuple[Progress, int]:
    """The progress bar of cli.watch for a simulated run with a duration."""
    progress = Progress(TextColumn("simulated"), BarColumn(),
                        TextColumn("{task.completed:.2f} / {task.total:.2f} s"),
                        TextColumn("{task.fields[speed]}"))
    return progress, progress.add_task("run", total=duration, speed="")


def record(view: Group) -> Console:
    """A console that recorded ``view`` (printed now: the bar changes later)."""
    console = Console(record=True, width=WIDTH, file=io.StringIO(),
                      force_terminal=True, color_system="truecolor")
    console.print(view)
    return console


def capture() -> tuple[Console, Console]:
    """Run the pendulum; the view mid-run and the view once it ended."""
    net = cli.load_net(str(EXAMPLE))  # make_net(), as `mujou run FILE` calls it
    run = mujou.run(net, timer="simulated", duration=DURATION, seed=0)
    periods = {path: node.period for path, node in run.nodes.items()
               if node.period is not None or cli._has_inputs(node)}
    progress, task = _progress(DURATION)

    while run.running and run.stats().time < MIDDLE:
        time.sleep(0.01)
    prev = run.stats()  # one refresh of the live loop: rates over REFRESH_S
    run.wait(cli.REFRESH_S)
    stats = run.stats()
    speed = stats.time / stats.wall if stats.wall > 0 else 0.0
    progress.update(task, completed=min(stats.time - run.start_time, DURATION),
                    speed=f"{speed:,.1f}x real time")
    middle = record(Group(cli._live_table(stats, cli._rates(prev, stats), periods), progress))

    run.join()
    stats = run.stats()  # the final frame: rates over the whole run
    progress.update(task, completed=DURATION,
                    speed=f"{stats.time / max(stats.wall, 1e-9):,.1f}x real time")
    end = record(Group(cli._live_table(stats, cli._rates(None, stats), periods), progress))
    return middle, end


# rich's SVG asks for Fira Code (a web font), then "monospace". Offline, name a
# common monospaced font as well. cairosvg takes only the first name of the list
# and ignores textLength, so the copy it converts names DejaVu Sans Mono first, at
# the size where its advance (0.602 em) is rich's cell width (0.61 x 20 px), and
# at a scale that makes a cell a whole number of pixels (cairo rounds advances):
# long runs of box-drawing characters then line up with the cells.
FIRA = "font-family: Fira Code, monospace;"
SVG_FONTS = "font-family: Fira Code, DejaVu Sans Mono, Menlo, Consolas, monospace;"
PNG_FONTS = "font-family: DejaVu Sans Mono, monospace;\n        font-size: 20.27px;"
SCALE = 20 / 12.2  # 20 pixels per cell


def _swap(text: str, old: str, new: str) -> str:
    if old not in text:  # another rich version writes other CSS: adapt FIRA and co.
        raise SystemExit(f"render_live_view: {old!r} not in the SVG")
    return text.replace(old, new)


def to_png(svg: str, png: Path) -> str:
    """Convert the SVG text to ``png`` with the first converter available; its name."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "view.svg"
        source.write_text(_swap(svg, SVG_FONTS + "\n        font-size: 20px;", PNG_FONTS),
                          encoding="utf-8")
        try:
            import cairosvg

            cairosvg.svg2png(url=str(source), write_to=str(png), scale=SCALE)
            return "cairosvg"
        except (ImportError, OSError):  # no package, or no system cairo library
            pass
        if shutil.which("rsvg-convert"):
            subprocess.run(["rsvg-convert", f"--zoom={SCALE}", "-o", str(png), str(source)],
                           check=True)
            return "rsvg-convert"
        for browser in ("chromium", "chromium-browser", "google-chrome"):
            if shutil.which(browser):
                subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                                f"--user-data-dir={tmp}/profile", f"--screenshot={png}",
                                "--window-size=1360,320", source.as_uri()], check=True)
                return browser
    raise SystemExit("no SVG converter: pip install cairosvg, or install librsvg2-bin")


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    middle, end = capture()
    for name, console in (("live-view", middle), ("live-view-end", end)):
        svg = OUT / f"{name}.svg"
        text = console.export_svg(title="mujou run examples/inverted_pendulum.py "
                                        f"--timer simulated --duration {DURATION:g}")
        text = _swap(text, FIRA, SVG_FONTS)
        svg.write_text(text, encoding="utf-8")
        how = to_png(text, svg.with_suffix(".png"))
        print(f"{svg} and {svg.with_suffix('.png')} ({how})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
