"""Plot the channels of a recording (an MCAP file written by ``mujou.run(record=...)``).

Reads the file with :mod:`mujou_actors.recording.mcapfile` (no node runs, nothing in the
file is imported or executed) and draws one panel per channel against the
run's timer: a number is one line, a tensor one line per element (at most
``--max-lines``; a larger tensor is drawn by its mean, min and max). Other
messages (text, containers) are skipped with a note.

Run it from the repository root::

    python examples/replay_pendulum.py --duration 10 --keep run.mcap
    python examples/plot_recording.py run.mcap -o run.png
    python examples/plot_recording.py run.mcap --channel physics.state --from 2 --to 4

The picture in ``docs/recording.md`` is this script's output for the pendulum.
"""

from __future__ import annotations

import argparse
import math
import numbers
import sys
from collections import defaultdict

import torch

from mujou_actors.recording import mcapfile


def _series(records: list[mcapfile.Record], max_lines: int) -> tuple[list[float], list[list[float]],
                                                                        list[str]] | None:
    """Times in seconds, the lines to draw (one per element) and their labels; None: not numeric."""
    first = records[0].message
    times = [r.t_ns / 1e9 for r in records]
    if isinstance(first, numbers.Real) and not isinstance(first, bool):
        return times, [[float(r.message) for r in records]], ["value"]
    if not isinstance(first, torch.Tensor) or first.is_complex() or first.dtype == torch.bool:
        return None
    flat = [r.message.detach().reshape(-1).double() for r in records]
    n = flat[0].numel()
    if any(f.numel() != n for f in flat):
        return None
    if n <= max_lines:
        return times, [[float(f[i]) for f in flat] for i in range(n)], [f"[{i}]" for i in range(n)]
    stats = [[float(f.mean()) for f in flat], [float(f.min()) for f in flat],
             [float(f.max()) for f in flat]]
    return times, stats, ["mean", "min", "max"]


def main(argv: list[str] | None = None) -> int:
    """Write a PNG with one panel per channel; 0 on success, 2 when nothing can be plotted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recording", help="an MCAP file of mujou's profile")
    parser.add_argument("-o", "--output", default="recording.png", help="the PNG to write")
    parser.add_argument("--channel", action="append", default=None, metavar="PORT",
                        help="an Output's path to plot (repeat it; default: every channel)")
    parser.add_argument("--from", dest="start", type=float, default=-math.inf,
                        help="first time to plot, seconds of the run's timer")
    parser.add_argument("--to", dest="end", type=float, default=math.inf,
                        help="last time to plot, seconds of the run's timer")
    parser.add_argument("--max-lines", type=int, default=8,
                        help="a tensor with more elements is drawn by its mean, min and max")
    args = parser.parse_args(argv)

    info = mcapfile.info(args.recording)
    known = [c.topic for c in info.channels]
    wanted = args.channel or known
    unknown = [c for c in wanted if c not in known]
    if unknown:
        parser.error(f"{args.recording} has no channel {', '.join(unknown)}; "
                     f"its channels: {', '.join(known)}")

    by_topic: dict[str, list[mcapfile.Record]] = defaultdict(list)
    for record in mcapfile.read(args.recording):
        if record.topic in wanted and args.start <= record.t_ns / 1e9 <= args.end \
                and record.t_ns >= 0:       # t_ns = -1: sent by on_start, before the timer
            by_topic[record.topic].append(record)

    panels = []
    for topic in wanted:
        series = _series(by_topic[topic], args.max_lines) if by_topic[topic] else None
        if series is None:
            print(f"skipped {topic}: no numeric messages in the range", file=sys.stderr)
        else:
            panels.append((topic, series))
    if not panels:
        print(f"{args.recording}: nothing to plot", file=sys.stderr)
        return 2

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.2 * len(panels)), sharex=True,
                             squeeze=False)
    for ax, (topic, (times, lines, labels)) in zip(axes[:, 0], panels, strict=True):
        for line, label in zip(lines, labels, strict=True):
            ax.plot(times, line, lw=0.9, label=label, drawstyle="steps-post")
        ax.set_title(f"{topic}  ({len(times)} messages)", fontsize=9, loc="left")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right", ncol=min(len(labels), 4))
    axes[-1, 0].set_xlabel("time [s] (the run's timer, as recorded)")
    fig.suptitle(f"{args.recording}: {info.run.get('timer', '?')} timer, "
                 f"seed {info.run.get('seed', '?')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}: {len(panels)} channel(s) of {args.recording}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
