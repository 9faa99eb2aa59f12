"""The ``mujou`` command: run a net from a file and watch it, inspect a snapshot.

``mujou run FILE[:NAME]`` loads a net (a node, a list or dict of nodes, or a
function returning one; NAME defaults to ``net`` then ``make_net``), runs it and,
on a terminal, shows a live table of every node (rates, lateness, drops,
restarts) and, for a simulated run with a duration, a progress bar in simulated
seconds. Not on a terminal (CI, pipes) it prints plain status lines instead.
Ctrl-C (or SIGTERM) stops the run cleanly (every ``on_stop`` runs; with
``--snapshot-dir`` the final state is written there too) and exits with 130
(143 for SIGTERM); signals that follow while it stops are only noted. The
paths of ``--trace``, ``--stats-json``, ``--record`` and ``--snapshot-dir``
are checked before anything runs. ``--record FILE [--record-port PATTERN ...]``
records the Outputs' messages to an MCAP file (``mujou.run(record=...)``).

``mujou inspect FILE`` checks a snapshot file whole (as ``mujou.load``
does), then prints its summary; the tensor data is checksummed, not kept.
Given a recording (an MCAP file, told by its magic), it prints its channels
(message counts, rates, bytes, time span, drops), the run's metadata (timer,
seeds, versions) and its attachments; ``--json`` prints either as JSON.

``mujou cat RECORDING [PORT...]`` prints a recording's messages as the
Foxglove view shows them (`mujou_actors.recording.recview`), ``mujou export-view
RECORDING OUT`` writes its view channels, and ``mujou view RECORDING`` serves
it to Foxglove with playback controls (`mujou_actors.recording.playback`); none runs a
node.

``mujou worker --join LEADER_HOST:PORT --name NAME`` starts a member actor
system of a leader's convention on this machine (`mujou_actors.distributed.
convention.Member`), prints one line saying where it listens, and serves until
Ctrl-C or SIGTERM, which end it cleanly (exit code 0). ``mujou workers
--leader HOST:PORT`` lists the members that leader knows (``--json`` for
programs).

Errors (a bad file, a missing NAME, a node failure) are one line on stderr and
a non-zero exit code; ``--verbose`` adds the traceback. Built on click, with
rich for the terminal.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import click

import mujou_actors as mujou

from . import _runtime  # _runtime.BUILD: which build of the kernel runs (--version)
from .cli_attach import register as register_attach
from .errors import MujouError, RecordingError, SnapshotError, describe
from .stats import RunStats
from .trace import check_writable

# Imported where they are used, not here: rich (`import mujou_actors` stays light), and
# whatever imports torch (node, the kernel, the recording family): the commands that watch a
# running net (`mujou ls`, `echo`...) start in a fraction of a second without it.
if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderableType
    from rich.table import Table

    from .node import Node

    #: What FILE[:NAME] names: what ``mujou.run`` takes.
    Net = Node | list[Node] | tuple[Node, ...] | dict[str, Node]

# Nothing here is for users to import: the program is `mujou` (setup.cfg's entry point names
# main, which needs no __all__).
__all__: list[str] = []

EXIT_FAILURE = 1      # the run failed (a node raised, a stop timed out)
EXIT_USAGE = 2        # bad file, name or option
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT
EXIT_TERMINATED = 143   # SIGTERM, likewise
REFRESH_S = 0.25        # the live view's refresh period (wall seconds)
STATUS_EVERY_S = 2.0    # plain status lines when not on a terminal


class _Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM: the run stops cleanly; ``code`` is the exit code it ends with."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _Signals:
    """How ``mujou run`` answers SIGINT and SIGTERM: one clean stop, whatever follows.

    The first signal decides the exit code (130 for SIGINT, 143 for SIGTERM).
    What it does depends on ``mode``, which the command sets as it goes:

    * ``"raise"`` (loading the net, watching the run): raise `_Interrupted`
      in the main thread, which stops the run;
    * ``"defer"`` (``mujou.run`` starting the net): only note it; the command
      stops the run as soon as it has started. A second SIGINT there gives up
      on the start (a way out of an ``on_start`` that never returns);
    * ``"finish"`` (stopping, writing the final snapshot and ``--stats-json``):
      only note it.

    Once the first signal has been raised every later one is only noted, so a
    second Ctrl-C, or GNU ``timeout`` signalling the process and then its
    group, cannot break the stop or lose the files written after it. The stop
    itself is bounded by ``stop_timeout``; SIGKILL remains the way to force.
    """

    def __init__(self) -> None:
        self.code = 0
        self.mode = "raise"
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        import threading

        if threading.current_thread() is threading.main_thread():  # else signal() refuses
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        first = not self.code
        if first:
            self.code = EXIT_TERMINATED if signum == signal.SIGTERM else EXIT_INTERRUPTED
        if (self.mode == "raise" and first) or (
                self.mode == "defer" and not first and signum == signal.SIGINT):
            self.mode = "finish"  # raised once: from now on signals are only noted
            raise _Interrupted(self.code)
        # os.write, not click.echo: the main thread may be inside a write to stderr.
        if self.mode == "defer" and first:
            note = ("interrupted: the run stops as soon as the net has started "
                    "(Ctrl-C again to give up on the start)\n")
        elif first:
            note = "interrupted: writing the final files first\n"
        else:
            note = "interrupted again: still stopping cleanly (SIGKILL forces)\n"
        os.write(2, note.encode())


class _RunFailed(Exception):
    """What made a started run fail (``run.failure``): exit code 1 whatever its class.

    A snapshot refused or a write failing during the run raises a TypeError or
    an OSError, which would otherwise read as a mistake in the command (2).
    """

    def __init__(self, cause: BaseException) -> None:
        super().__init__(cause)
        self.cause = cause


class UsageError(click.ClickException):
    """A mistake in what was asked for: one line, exit code 2."""

    exit_code = EXIT_USAGE


# ---------------------------------------------------------------------------
# Loading FILE[:NAME]


def load_net(target: str, kwargs: dict[str, Any] | None = None,
             say: Callable[[str], None] | None = None) -> Net:
    """Import ``FILE[:NAME]`` and return the net it names.

    Args:
        target: a Python file, optionally followed by ``:NAME``. NAME is a net
            (a Node, or a list or dict of Nodes), a function that returns one
            when called without arguments, or a Node class (made without
            arguments). Default: ``net``, then ``make_net``.
        kwargs: ``--net-kwargs``: NAME must then be a function (or a Node
            class), called with them; without NAME, the first of ``net`` and
            ``make_net`` that is one. Default: None (called without arguments).
        say: where the progress lines go (`_progress`). Default: nowhere.

    Raises:
        UsageError: no such file, the file fails to import, no such NAME, or
            NAME is not a net (or, with ``kwargs``, not a function).
    """
    path, _, name = target.partition(":") if not os.path.exists(target) else (target, "", "")
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    if say is not None:
        say(f"importing {path} ...")
    module = _import_file(path)
    names = [name] if name else ["net", "make_net"]
    if kwargs is not None and not name:  # a net made already cannot take the arguments
        names = [n for n in names if callable(getattr(module, n, None))
                 and not _is_net(getattr(module, n))] or names
    for candidate in names:
        if hasattr(module, candidate):
            if say is not None and not _is_net(getattr(module, candidate)):
                say(f"building the net: {path}:{candidate}() ...")
            return _as_net(getattr(module, candidate), f"{path}:{candidate}", kwargs)
    raise UsageError(f"{path} has no {' or '.join(repr(n) for n in names)}; "
                     "name the net with FILE:NAME")


def factory_ref(target: str) -> str:
    """``FILE[:NAME]`` as the net function of a placed run: ``"/abs/FILE:NAME"``.

    NAME defaults to ``make_net``: every group process imports FILE and calls it.

    Raises:
        UsageError: no such file, or NAME is not an identifier.
    """
    path, _, name = target.partition(":") if not os.path.exists(target) else (target, "", "")
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    name = name or "make_net"
    if not name.isidentifier():
        raise UsageError(f"{target}: NAME must be the name of a function, got {name!r}")
    return f"{os.path.abspath(path)}:{name}"


def parse_places(places: tuple[str, ...]) -> dict[str, str]:
    """``--place PATH=GROUP`` options as a placement.

    Raises:
        UsageError: an option without ``=``, or a path placed twice.
    """
    placement: dict[str, str] = {}
    for item in places:
        path, eq, group = item.partition("=")
        if not eq:
            raise UsageError(f"--place {item!r}: expected PATH=GROUP (for example sim=physics, "
                             f"or sim=robot:physics for a group on machine robot)")
        if not path.strip() or not group.strip():
            raise UsageError(f"--place {item!r}: {'PATH' if not path.strip() else 'GROUP'} is "
                             f"empty (expected PATH=GROUP or PATH=MACHINE:GROUP, for example "
                             f"sim=physics)")
        if path in placement:
            raise UsageError(f"--place: {path!r} is placed twice")
        placement[path] = group
    return placement


def parse_placement(places: tuple[str, ...], net_kwargs: str | None, *, listen: str | None,
                    join_timeout: float, allow_remote: bool,
                    heartbeat_timeout: float) -> mujou.Placement:
    """``--place`` and the options that go with it as the run's `mujou.Placement`.

    ``--listen`` brings the convention's settings (``--join-timeout``,
    ``--allow-remote``, ``--heartbeat-timeout``); without it they keep their
    defaults (``--allow-remote`` may be there for ``--foxglove``).

    Raises:
        UsageError: a bad ``--place`` or ``--net-kwargs``; ``--listen`` with
            no ``--place`` that names a machine.
        TypeError / ValueError: what `mujou.Placement` refuses (exit 2 too).
    """
    groups = parse_places(places)
    if listen is None:
        return mujou.Placement(groups, net_kwargs=parse_net_kwargs(net_kwargs))
    if not any(":" in group for group in groups.values()):
        raise UsageError("--listen is where other machines join: it goes with a --place that "
                         "names one (PATH=MACHINE:GROUP); every --place here keeps its group "
                         "on this machine")
    return mujou.Placement(groups, net_kwargs=parse_net_kwargs(net_kwargs), listen=listen,
                           join_timeout=join_timeout, allow_remote=allow_remote,
                           heartbeat_timeout=heartbeat_timeout)


def parse_net_kwargs(text: str | None) -> dict[str, Any] | None:
    """``--net-kwargs JSON`` as a dict (None without it).

    Raises:
        UsageError: not JSON, or not an object.
    """
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--net-kwargs: not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"--net-kwargs: expected a JSON object, got {text!r}")
    return value


def parse_params(items: tuple[str, ...], net: Any) -> dict[str, Any]:
    """``--param PATH=VALUE`` options (repeatable) as ``mujou.run(params=)``'s values.

    Each VALUE is read by the type of the parameter PATH names in ``net``
    (`Param.parse`: ``true``/``false``/``1``/``0`` for a bool, ``int()``,
    ``float()``, a str as it is) and checked by its rules; read-only
    parameters too (the run has not started).

    Args:
        items (tuple[str, ...]): the options' texts, ``"sensor.noise=0.02"``.
        net (Node | list | dict): the net, built.

    Returns:
        dict[str, bool | int | float | str]: the values by parameter path, in
        the order given.

    Raises:
        UsageError: an item that is not ``PATH=VALUE``, a PATH given twice, a
            PATH that names no parameter, or a VALUE that is not of its
            parameter's type or breaks its rules (the `ParamError`'s words).
    """
    from .errors import ParamError
    from .net import walk
    from .params import RunParams

    table = RunParams(walk(net))
    values: dict[str, Any] = {}
    for item in items:
        path, equals, text = item.partition("=")
        path = path.strip()
        if not equals or not path:
            raise UsageError(f"--param {item!r}: write PATH=VALUE (as sensor.noise=0.02)")
        if path in values:
            raise UsageError(f"--param {path}: given twice")
        try:
            _, _, param = table.resolve(path)
            values[path] = param.parse(text, f"parameter {path!r}")
        except ParamError as exc:
            raise UsageError(f"--param {item}: {exc}") from None
    return values


def _import_file(path: str) -> Any:
    # As a placed run's groups load it: named as `import <stem>` names it (see load_file).
    from .distributed.placement import load_file

    try:
        return load_file(path, fresh=True)
    except ImportError as exc:
        if str(exc).endswith("is not a Python file"):
            raise UsageError(f"{path}: not a Python file") from None
        raise UsageError(f"{path}: importing it raised {describe(exc)}") from exc
    except Exception as exc:
        raise UsageError(f"{path}: importing it raised {describe(exc)}") from exc


def _is_net(value: Any) -> bool:
    from .node import Node

    if isinstance(value, Node):
        return True
    items = value.values() if isinstance(value, dict) else value
    return isinstance(value, (list, tuple, dict)) and all(isinstance(v, Node) for v in items)


def _as_net(value: Any, where: str, kwargs: dict[str, Any] | None = None) -> Net:
    from .node import Node

    if _is_net(value):
        if kwargs is not None:
            raise UsageError(f"{where} is a net already made, which --net-kwargs cannot "
                             "reach: name the function that builds it (FILE:NAME)")
        return value
    if callable(value) and (not isinstance(value, type) or issubclass(value, Node)):
        try:
            made = value(**(kwargs or {}))
        except Exception as exc:
            raise UsageError(f"{where}() raised {describe(exc)}") from exc
        if _is_net(made):
            return made
        raise UsageError(f"{where}() returned a {type(made).__name__}, not a net of nodes")
    raise UsageError(f"{where} is a {type(value).__name__}, not a net or a function "
                     "returning one")


# ---------------------------------------------------------------------------
# Watching a run


def _rates(prev: RunStats | None, now: RunStats) -> dict[str, tuple[float, float]]:
    """Per node: updates per wall second and hook time share since ``prev``."""
    wall = now.wall - (prev.wall if prev else 0.0)
    out = {}
    for path, node in now.nodes.items():
        before = prev.nodes.get(path) if prev else None
        updates = node.updates - (before.updates if before else 0)
        hook = node.hook_time - (before.hook_time if before else 0.0)
        out[path] = (updates / wall if wall > 0 else 0.0, hook / wall if wall > 0 else 0.0)
    return out


def _has_inputs(node: Node) -> bool:
    from .ports import Input

    return any(isinstance(p, Input) for p in node._mujou_ports().values())


def _node_rows(stats: RunStats, rates: dict[str, tuple[float, float]],
               periods: dict[str, float | None]) -> Iterator[list[str]]:
    for path, node in stats.nodes.items():
        if path not in periods:
            continue
        rate, share = rates.get(path, (0.0, 0.0))
        period = periods.get(path)
        yield [
            path or "<root>",
            f"{rate:,.1f}",
            "-" if period is None else f"{1 / period:,.1f}",
            f"{node.dt_mean * 1e3:.3f}",
            f"{node.dt_max * 1e3:.3f}",
            f"{node.lateness_p99 * 1e3:.3f}",
            f"{share:.1%}",
            str(sum(node.drops.values())),
            str(node.restarts),
        ]


NODE_COLUMNS = ["node", "updates/s", "target/s", "dt mean ms", "dt max ms", "late p99 ms",
                "hook share", "drops", "restarts"]
DROPS, RESTARTS = 7, 8  # their index in NODE_COLUMNS
# The heading cannot say it: the lateness is that of a window, not of the whole run.
def lateness_note() -> str:
    """What the tables' late p99 covers (the kernel's sample count: imported when shown)."""
    from ._runtime.actor import LATENESS_SAMPLES

    return f"late p99: of each node's newest {LATENESS_SAMPLES} updates"


MACHINE_COLUMNS = ["machine", "host", "groups", "pids", "cpu s", "net in", "net out",
                   "offset ms", "uncert ms", "rtt ms", "age p50 ms", "age p99 ms"]
NET_IN, NET_OUT = 5, 6  # their index in MACHINE_COLUMNS
# The live view's columns of them (80 terminal columns: no host name, rtt or median age),
# each heading over two lines.
LIVE_MACHINES = {0: "machine", 2: "groups", 3: "pids", 4: "cpu\ns", 5: "net in\nbytes",
                 6: "net out\nbytes", 7: "offset\nms", 8: "\u00b1\nms", 11: "age p99\nms"}


def _has_members(stats: RunStats) -> bool:
    """Whether the run has groups on other machines (its machines are then shown)."""
    return any(name for name in stats.machines)


def _ms(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.3f}"


def _machine_rows(stats: RunStats) -> Iterator[list[str]]:
    """One row per machine of a run across machines (exact figures: the plain output's)."""
    for m in stats.machines.values():
        yield [
            m.name or "<host>",
            m.hostname or "-",
            ",".join(m.groups) or "-",
            ",".join(map(str, m.pids)) or "-",
            f"{m.cpu_time:.1f}",
            str(m.bytes_in),
            str(m.bytes_out),
            "-" if m.clock_offset_ns is None else f"{m.clock_offset_ns / 1e6:+.3f}",
            _ms(m.clock_uncertainty_ns),
            _ms(m.rtt_ns),
            "-" if m.message_age_p50 is None else f"{m.message_age_p50 * 1e3:.3f}",
            "-" if m.message_age_p99 is None else f"{m.message_age_p99 * 1e3:.3f}",
        ]


def _machines_table(stats: RunStats) -> Table:
    """The live view's table of the machines (below the nodes'), bytes abbreviated.

    The groups and pids wrap onto further lines (between two of them) when
    the width is short; the figures are never cut (``no_wrap``), as in the
    nodes' table.
    """
    from rich import box
    from rich.table import Table

    table = Table(expand=False, box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0))
    for i, heading in LIVE_MACHINES.items():
        table.add_column(heading, justify="left" if i < 4 else "right", no_wrap=i >= 4,
                         overflow="fold")
    for row in _machine_rows(stats):
        row[NET_IN] = _count(int(row[NET_IN]))
        row[NET_OUT] = _count(int(row[NET_OUT]))
        row[2], row[3] = row[2].replace(",", ", "), row[3].replace(",", ", ")
        table.add_row(*(row[i] for i in LIVE_MACHINES))
    table.caption = ("offset \u00b1: clock minus the host's; age p99: its groups' messages "
                     "on reaching the host")
    return table


def _count(n: int) -> str:
    """A count in at most 5 characters for the live view: ``14999``, ``150k``, ``2.9M``."""
    if n < 100_000:
        return str(n)
    value, unit = n / 1000, 0
    while value >= 999.5 and unit < 5:  # would round up to 1000: the next unit
        value, unit = value / 1000, unit + 1
    suffix = "kMGTPE"[unit]  # an int64 ends below 10 E
    return f"{value:.1f}{suffix}" if value < 9.95 else f"{value:.0f}{suffix}"


def _live_table(stats: RunStats, rates: dict[str, tuple[float, float]],
                periods: dict[str, float | None]) -> _LiveTable:
    """The live view's table: a rich renderable laid out for the width it gets.

    At 80 columns every figure must stay whole, so the table spends little on
    borders (one space between columns, a rule under the header), puts each
    unit on a second header line and abbreviates counts to five characters
    (``2.9M``). When the width is still short, the ``restarts`` heading is cut
    first (``rest…``, down to the width of its counts), then the node column
    folds long paths onto further lines, whole; no figure is ever cut. (Left
    to rich, a column that no longer fits vanishes, values and all: drops and
    restarts would not show.) The plain output keeps exact counts. The
    caption says what the lateness covers, which its heading cannot.
    """
    rows = []
    for row in _node_rows(stats, rates, periods):
        row[DROPS] = _count(int(row[DROPS]))
        row[RESTARTS] = _count(int(row[RESTARTS]))
        rows.append(row)
    return _LiveTable(stats, rows)


class _LiveTable:
    """The table of `_live_table`; rich calls ``__rich_console__`` with the width to fill."""

    def __init__(self, stats: RunStats, rows: list[list[str]]) -> None:
        self.stats = stats
        self.rows = rows

    def __rich_console__(self, console: Console,
                         options: ConsoleOptions) -> Iterator[Table]:
        yield self.table(options.max_width)

    def table(self, width: int) -> Table:
        """The rich Table for ``width`` terminal columns."""
        from rich import box
        from rich.table import Table

        headings = []
        for column in NODE_COLUMNS:
            # "dt mean ms" -> "dt mean" over "ms": narrower than the heading on one line.
            head, _, unit = column.rpartition(" ") if column.endswith(" ms") else (column, "", "")
            if column == "hook share":
                head, unit = "hook", "share"
            headings.append(f"{head}\n{unit}" if unit else column)
        natural = [max(len(text) for text in [*heading.split("\n"), *(r[i] for r in self.rows)])
                   for i, heading in enumerate(headings)]
        fixed: dict[int, int] = {}
        excess = sum(natural) + len(natural) - 1 - width  # one space between columns
        if excess > 0:  # the restarts heading gives way first, then the node paths fold
            counts = max([len(r[RESTARTS]) for r in self.rows] + [4])  # "r…" says little
            fixed[RESTARTS] = max(counts, natural[RESTARTS] - excess)
            excess -= natural[RESTARTS] - fixed[RESTARTS]
        if excess > 0:
            fixed[0] = max(8, natural[0] - excess)  # below that rich cuts the figures too
        table = Table(title=f"t = {self.stats.time:.3f} s   wall {self.stats.wall:.1f} s",
                      expand=False, box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0))
        for i, heading in enumerate(headings):
            table.add_column(heading, justify="left" if i == 0 else "right",
                             width=fixed.get(i), no_wrap=i != 0,
                             overflow="fold" if i == 0 else "ellipsis")
        for row in self.rows:
            table.add_row(*row)
        workers = "  ".join(f"{name} {w.busy:.0%}" for name, w in self.stats.workers.items())
        missed = _misses(self.stats)
        table.caption = (lateness_note() + (f"\nbusy: {workers}" if workers else "")
                         + (f"\nmissed: {missed}" if missed else ""))
        return table


def _misses(stats: RunStats) -> str:
    """The nodes that missed a budget or deadline, with their counts ("" when none did).

    A line under the live table and at the end of a status line rather than two
    more columns: the table fits 80 columns as it is, and most nets declare none.
    """
    return "  ".join(f"{path or '<root>'} budget {n.budget_misses} deadline {n.deadline_misses}"
                     for path, n in stats.nodes.items()
                     if n.budget_misses or n.deadline_misses)


def _status_line(stats: RunStats, rates: dict[str, tuple[float, float]]) -> str:
    nodes = ", ".join(f"{path or '<root>'} {rate:.0f}/s" for path, (rate, _) in rates.items()
                      if stats.nodes[path].updates)
    drops = sum(sum(n.drops.values()) for n in stats.nodes.values())
    restarts = sum(n.restarts for n in stats.nodes.values())
    missed = _misses(stats)
    return (f"t={stats.time:.3f}s wall={stats.wall:.1f}s {nodes} "
            f"drops={drops} restarts={restarts}" + (f" missed: {missed}" if missed else ""))


def watch(run: mujou.Run, *, duration: float | None, simulated: bool, live: bool,
          quiet: bool) -> None:
    """Follow ``run`` until it ends: a live view on a terminal, status lines otherwise."""
    periods = {path: node.period for path, node in run.nodes.items()
               if node.period is not None or _has_inputs(node)}  # containers are left out
    if quiet:
        run.wait()
        return
    if not live:
        _watch_plain(run, periods)
        return
    from rich.console import Group
    from rich.live import Live
    from rich.progress import BarColumn, Progress, TextColumn

    progress = None
    task = None
    if simulated and duration:
        progress = Progress(TextColumn("simulated"), BarColumn(),
                            TextColumn("{task.completed:.2f} / {task.total:.2f} s"),
                            TextColumn("{task.fields[speed]}"))
        task = progress.add_task("run", total=duration, speed="")
    prev = None
    with Live(refresh_per_second=1 / REFRESH_S, transient=False) as view:
        while run.running:
            stats = run.stats()
            rates = _rates(prev, stats)
            prev = stats
            parts: list[RenderableType] = [_live_table(stats, rates, periods)]
            if _has_members(stats):
                parts.append(_machines_table(stats))
            if progress is not None and task is not None:
                simulated_s = stats.time - run.start_time
                speed = simulated_s / stats.wall if stats.wall > 0 else 0.0
                progress.update(task, completed=min(stats.time - run.start_time, duration or 0),
                                speed=f"{speed:,.1f}x real time")
                parts.append(progress)
            view.update(Group(*parts))
            run.wait(REFRESH_S)
        stats = run.stats()
        parts = [_live_table(stats, _rates(None, stats), periods)]
        if _has_members(stats):
            parts.append(_machines_table(stats))
        if progress is not None and task is not None:
            simulated_s = stats.time - run.start_time
            progress.update(task, completed=duration,
                            speed=f"{simulated_s / max(stats.wall, 1e-9):,.1f}x real time")
            parts.append(progress)
        view.update(Group(*parts))


def _watch_plain(run: mujou.Run, periods: dict[str, float | None]) -> None:
    prev = None
    while not run.wait(STATUS_EVERY_S):
        stats = run.stats()
        click.echo(_status_line(stats, _rates(prev, stats)))
        prev = stats
    stats = run.stats()
    click.echo("\t".join(NODE_COLUMNS))
    for row in _node_rows(stats, _rates(None, stats), periods):
        click.echo("\t".join(row))
    missed = _misses(stats)
    if missed:  # as under the live table: the nodes that missed, their counts of the run
        click.echo(f"missed: {missed}")
    if _has_members(stats):
        click.echo("\t".join(MACHINE_COLUMNS))
        for row in _machine_rows(stats):
            click.echo("\t".join(row))


class _NotReported(logging.Filter):
    """Leaves out the library's line for a failure the command reports itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "mujou_failure", False)


def _setup_logging(live: bool, verbose: bool) -> logging.Handler:
    """Library warnings (restarts, drops) on stderr; through rich under the live view."""
    handler: logging.Handler
    if live:
        from rich.logging import RichHandler

        handler = RichHandler(show_path=verbose, rich_tracebacks=verbose)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("mujou %(levelname)s: %(message)s"))
    handler.addFilter(_NotReported())
    logger = logging.getLogger("mujou_actors")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else logging.WARNING)
    return handler


def _let_through(name: str) -> int:
    """``--record-log LEVEL``'s level, which the root logger is made to let through.

    The command puts no handler on the root logger, so lowering its level
    prints nothing more: Python's last resort prints warnings alone (the
    recording's tap stands in for it, recording/logview.py).
    """
    level = int(getattr(logging, name.upper()))
    root = logging.getLogger()
    if root.getEffectiveLevel() > level:
        root.setLevel(level)
    return level


def _stats_json(stats: RunStats) -> dict[str, Any]:
    out = {
        "time": stats.time,
        "wall": stats.wall,
        "nodes": {p: dataclasses.asdict(n) for p, n in stats.nodes.items()},
        "workers": {p: dataclasses.asdict(w) for p, w in stats.workers.items()},
        "snapshots": dataclasses.asdict(stats.snapshots),
    }
    if stats.groups:  # a placed run (--place): its processes, and its machines
        out["groups"] = {name: dataclasses.asdict(g) for name, g in stats.groups.items()}
        out["machines"] = {name: dataclasses.asdict(m) for name, m in stats.machines.items()}
    if stats.recording is not None:  # --record
        rec = stats.recording
        out["recording"] = {**{f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)
                               if f.name not in ("channels", "log")},
                            "channels": {p: dataclasses.asdict(c)
                                         for p, c in rec.channels.items()},
                            "log": None if rec.log is None else dataclasses.asdict(rec.log)}
    if stats.capsule is not None:  # --capsule
        out["capsule"] = dataclasses.asdict(stats.capsule)
    if stats.syncs:  # a net with synchronizers
        out["syncs"] = {p: dataclasses.asdict(s) for p, s in stats.syncs.items()}
    return out


def _final_snapshot(run: mujou.Run, folder: str) -> str:
    """Write the run's final state into the snapshot folder; the path written."""
    from .supervisor import snapshot_name, write_pointer

    tree = run.state_dict()
    name = snapshot_name(tree["time_ns"])
    mujou.save(tree, os.path.join(folder, name))
    write_pointer(folder, name)
    return os.path.join(folder, name)


DEFAULT_FOXGLOVE_PORT = 8765  # liveview.DEFAULT_PORT, without importing it here


def _shows_progress(quiet: bool) -> bool:
    """Whether the command says what it does before the run shows anything (a terminal)."""
    return not quiet and sys.stderr.isatty()


def _progress(quiet: bool) -> Callable[[str], None]:
    """Where the lines go that say what the command does while nothing else shows.

    Importing FILE and the ``on_start`` hooks can take many seconds (torch,
    MuJoCo, a model's weights) before the live view's first table: on a
    terminal a line on stderr says what is going on; elsewhere (pipes, CI,
    ``--quiet``) nothing is said, and the output stays as it was.
    """
    if not _shows_progress(quiet):
        return lambda text: None
    return lambda text: click.echo(text, err=True)


def _count_nodes(net: Any) -> int | None:
    """How many nodes the net has (None if it is no net: `mujou.run` says why)."""
    from .net import walk

    try:
        return len(walk(net))
    except Exception:
        return None


def _check_foxglove(foxglove: str | None, publish: bool, origins: tuple[str, ...],
                    allow_remote: bool, params: bool = False) -> None:
    """``--foxglove`` and the options that go with it, checked before anything runs."""
    if foxglove is None:
        if publish or origins or params:
            raise UsageError("--foxglove-publish, --foxglove-params and --foxglove-origin go "
                             "with --foxglove")
        return
    from .recording.liveview import parse_listen, parse_origins

    try:
        parse_listen(foxglove, allow_remote)
    except ValueError as exc:
        raise UsageError(f"--foxglove: {exc}") from exc
    try:
        parse_origins(origins)
    except ValueError as exc:
        raise UsageError(f"--foxglove-origin: {exc}") from exc


# ---------------------------------------------------------------------------
# Commands


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(mujou.__version__, prog_name="mujou",
                      message=f"%(prog)s, version %(version)s, kernel build: {_runtime.BUILD}")
def main() -> None:
    """Run, record and replay mujou_actors nets; inspect snapshots and recordings.

    run: a net from a Python file (a live view, Foxglove, recording, crash
    capsules, processes and machines); replay: a recording into a net;
    inspect: a snapshot or a recording; cat, export-view, view: a recording's
    messages, its Foxglove view channels, the recording served to Foxglove;
    worker, workers: the machines of a run across machines.
    """


F = TypeVar("F", bound=Callable[..., Any])


def _foxglove_options(what: str) -> Callable[[F], F]:
    """The live view's options of `mujou run` and `mujou replay`: --foxglove, its
    --foxglove-publish and --foxglove-origin (``what``: "run" or "replay", for the help)."""
    def apply(command: F) -> F:
        for option in reversed((
            click.option("--foxglove", "foxglove", is_flag=False,
                         flag_value=f":{DEFAULT_FOXGLOVE_PORT}", default=None,
                         metavar="[HOST]:PORT",
                         help=f"Serve a live Foxglove WebSocket view of the {what} (every "
                              "port a channel, the graph, the time); default port 8765 on "
                              "127.0.0.1. Write it after FILE, or as --foxglove=:PORT."),
            click.option("--foxglove-publish", is_flag=True,
                         help="With --foxglove: let clients publish to the Inputs (each "
                              "message a run.write). Off by default."),
            click.option("--foxglove-params", is_flag=True,
                         help="With --foxglove: let clients set the nodes' parameters "
                              "(Foxglove's Parameters panel; each a run.set_param). Off by "
                              "default: they are shown, a set is refused."),
            click.option("--foxglove-origin", "foxglove_origins", multiple=True,
                         metavar="ORIGIN",
                         help="With --foxglove: also accept connections from web pages of "
                              "this origin (SCHEME://HOST[:PORT], or null); repeat it for "
                              "more. Without it: native clients, https://app.foxglove.dev "
                              "and file:// only.")),
        ):
            command = option(command)
        return command

    return apply


@main.command("run")
@click.argument("target", metavar="FILE[:NAME]")
@click.option("--duration", type=float, default=None,
              help="Seconds of the run's timer; default: until Ctrl-C.")
@click.option("--timer", type=click.Choice(["realtime", "simulated"]), default="realtime",
              show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker threads; default: mujou's choice.")
@click.option("--seed", type=int, default=None, help="Seed of the run.")
@click.option("--snapshot-every", type=float, default=None,
              help="Seconds of the run's timer between snapshots.")
@click.option("--restart", type=click.Choice(["none", "one_for_one", "one_for_all"]),
              default="none", show_default=True,
              help="What a node that raises does (mujou.Supervisor(restart=...)): none ends "
                   "the run; one_for_one restarts the node, one_for_all the net, from the "
                   "latest snapshot (with --place, a lost machine's groups restart too, on "
                   "a fallback machine if it is gone).")
@click.option("--max-restarts", type=click.IntRange(min=0), default=3, show_default=True,
              help="With --restart: restarts allowed within 60 s of the run's timer.")
@click.option("--snapshot-dir", type=click.Path(file_okay=False), default=None,
              help="Folder for snapshot files (the final state is written there too).")
@click.option("--restore", type=click.Path(dir_okay=False), default=None,
              help="Snapshot file to start from.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Write a Chrome/Perfetto trace of every hook to this file.")
@click.option("--stats-json", type=click.Path(dir_okay=False), default=None,
              help="Write the final run.stats() as JSON to this file.")
@click.option("--record", "record_path", type=click.Path(dir_okay=False), default=None,
              help="Record the Outputs' messages to this MCAP file (docs/recording.md).")
@click.option("--record-port", "record_ports", multiple=True, metavar="PATTERN",
              help="With --record: record the Outputs whose path matches this glob "
                   "(\"sim.*\"); repeat it for more. Default: every Output.")
@click.option("--record-snapshots", is_flag=True,
              help="With --record and --snapshot-every: attach the snapshots to the file.")
@click.option("--record-view", is_flag=True,
              help="With --record: also write each Output's JSON view (/view/<path>) for "
                   "Foxglove beside its lossless channel.")
@_foxglove_options("run")
@click.option("--record-log", "record_log", is_flag=False, flag_value="INFO", default=None,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                                case_sensitive=False), metavar="[LEVEL]",
              help="With --record: also record the run's log records from LEVEL up (INFO if "
                   "not given; write it as --record-log=LEVEL) to the channel /mujou/log, as "
                   "Foxglove's foxglove.Log (docs/recording.md).")
@click.option("--capsule", "capsule_path", type=click.Path(dir_okay=False), default=None,
              help="Keep a crash capsule: when a node fails, write the last seconds of every "
                   "Output and a snapshot to this MCAP file (docs/recording.md).")
@click.option("--capsule-seconds", type=click.FloatRange(min=0, min_open=True), default=None,
              help="With --capsule: seconds of the run's timer between its snapshots "
                   "(default: --snapshot-every, else 5).")
@click.option("--check-read-only", is_flag=True,
              help="Fail a node that changes a message it received in place (a tensor, a "
                   "list, a dict, a numpy array...), naming it and its Input "
                   "(mujou.run(check_read_only=True)): a debugging aid.")
@click.option("--place", "places", multiple=True, metavar="PATH=[MACHINE:]GROUP",
              help="Run the node PATH (and its subtree) in the process of GROUP; repeat it "
                   "for more. MACHINE[,FALLBACK...]: GROUP runs on that member (see "
                   "--listen). NAME must then be the function that builds the net.")
@click.option("--net-kwargs", default=None, metavar="JSON",
              help="The keyword arguments of the function NAME that builds the net, a JSON "
                   "object (with --place: of its call in every process).")
@click.option("--param", "param_items", multiple=True, metavar="PATH=VALUE",
              help="Set a node's parameter before the run starts (mujou.run(params=...)): "
                   "VALUE read as its type (true/false, a number, a text), read-only ones "
                   "too; repeat it for more (sensor.noise=0.02).")
@click.option("--listen", default=None, metavar="HOST:PORT",
              help="With --place PATH=MACHINE:GROUP: lead the machines' convention here "
                   "(what `mujou worker --join` names).")
@click.option("--join-timeout", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True, help="Seconds to wait for the machines named to join.")
@click.option("--allow-remote", is_flag=True,
              help="Let --listen or --foxglove be an address other machines reach (a "
                   "trusted network only: the control plane unpickles what reaches it; the "
                   "view shows every port, and with --foxglove-publish writes to every "
                   "Input).")
@click.option("--heartbeat-timeout", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, help="Seconds without a heartbeat before a machine is lost.")
@click.option("--quiet", is_flag=True, help="No live view and no status lines.")
@click.option("--verbose", is_flag=True, help="Tracebacks with errors.")
def run_command(target: str, duration: float | None, timer: str, workers: int | None,
                seed: int | None, snapshot_every: float | None, restart: str,
                max_restarts: int, snapshot_dir: str | None,
                restore: str | None, trace_path: str | None, stats_json: str | None,
                record_path: str | None, record_ports: tuple[str, ...],
                record_snapshots: bool, record_view: bool, record_log: str | None,
                foxglove: str | None, foxglove_publish: bool, foxglove_params: bool,
                foxglove_origins: tuple[str, ...], capsule_path: str | None,
                capsule_seconds: float | None, check_read_only: bool,
                places: tuple[str, ...], net_kwargs: str | None, param_items: tuple[str, ...],
                listen: str | None, join_timeout: float, allow_remote: bool,
                heartbeat_timeout: float, quiet: bool, verbose: bool) -> None:
    """Run the net in FILE (NAME: a net, or a function returning one)."""
    live = sys.stdout.isatty() and not quiet
    _setup_logging(live, verbose)
    say = _progress(quiet)
    with _errors(verbose), _Signals() as signals:
        # Before anything runs (the net's file included): files written only at
        # the end must not be found unwritable after a long run.
        if trace_path is not None:
            check_writable(trace_path, "--trace", make_folders=True)
        if stats_json is not None:
            check_writable(stats_json, "--stats-json", make_folders=False)
        if snapshot_dir is not None:
            check_writable(snapshot_dir, "--snapshot-dir", make_folders=True, folder=True)
        if record_path is not None:
            check_writable(record_path, "--record", make_folders=True)
        elif record_ports or record_snapshots or record_view or record_log is not None:
            raise UsageError("--record-port, --record-snapshots, --record-view and --record-log "
                             "go with --record FILE")
        _check_foxglove(foxglove, foxglove_publish, foxglove_origins, allow_remote,
                        foxglove_params)
        if capsule_path is not None:
            check_writable(capsule_path, "--capsule", make_folders=True)
            if places:
                raise UsageError("--capsule keeps a crash capsule in one process; it does not "
                                 "go with --place")
        elif capsule_seconds is not None:
            raise UsageError("--capsule-seconds goes with --capsule FILE")
        kwargs: dict[str, Any] = {"timer": timer, "duration": duration, "workers": workers,
                                  "seed": seed, "state": restore}
        if capsule_path is not None:
            kwargs["record_on_failure"] = mujou.Capsule(
                capsule_path, seconds=capsule_seconds or snapshot_every or 5.0)
        if places:
            net: Any = factory_ref(target)
            kwargs["placement"] = parse_placement(
                places, net_kwargs, listen=listen, join_timeout=join_timeout,
                allow_remote=allow_remote, heartbeat_timeout=heartbeat_timeout)
            if param_items:
                # Each process builds its own net in mujou.run; this copy only gives the
                # parameters' types, so that a bad --param stops before any process starts.
                built = load_net(target, parse_net_kwargs(net_kwargs), say)
                kwargs["params"] = parse_params(param_items, built)
        elif listen is not None:
            raise UsageError("--listen goes with --place PATH=MACHINE:GROUP")
        else:
            net = load_net(target, parse_net_kwargs(net_kwargs), say)
            if param_items:
                kwargs["params"] = parse_params(param_items, net)
        if snapshot_every is not None or snapshot_dir is not None or restart != "none":
            kwargs["supervisor"] = mujou.Supervisor(restart, max_restarts=max_restarts,
                                                    snapshot_every=snapshot_every,
                                                    snapshot_dir=snapshot_dir)
        if trace_path is not None:
            kwargs["trace"] = trace_path
        if check_read_only:  # with --place, each group's kernel checks its readers
            kwargs["check_read_only"] = True
        if record_path is not None:
            level = False if record_log is None else _let_through(record_log)
            kwargs["record"] = mujou.Recording(record_path, ports=record_ports or None,
                                               snapshots=record_snapshots, view=record_view,
                                               log=level)
        signals.mode = "defer"
        if places:
            groups = set(kwargs["placement"].groups.values())
            say(f"starting {len(groups)} group process(es) and the host (each imports the file "
                "and builds the net), then on_start ...")
        else:
            _say_starting(say, net)
        # issue 14: mujou.run takes a tuple of nodes too; its annotation says so after the split.
        run = mujou.run(net, **kwargs)
        say("started")
        stopped = False  # by a signal
        server = None
        try:
            signals.mode = "raise"
            if signals.code:
                raise _Interrupted(signals.code)  # it came while the net was starting
            if foxglove is not None:
                try:
                    server = _serve(run, foxglove, allow_remote, quiet,
                                    publish=foxglove_publish, params=foxglove_params,
                                    origins=foxglove_origins)
                except BaseException:
                    run.stop()  # the server could not start (a taken port): nor does the run
                    raise
            watch(run, duration=duration, simulated=timer == "simulated", live=live, quiet=quiet)
            signals.mode = "finish"
        except KeyboardInterrupt:
            signals.mode = "finish"
            stopped = True
            click.echo("interrupted: stopping the run", err=True)
            run.stop()
        finally:
            if server is not None:
                server.close()
        # From here on a signal is only noted (signals.code): the final state and
        # the stats are written whatever arrives.
        if snapshot_dir is not None and (stopped or run.failure is None):
            # The final state, unless the run failed: a later --restore of the
            # latest file must not start from a failed state.
            click.echo(f"final state written to {_final_snapshot(run, snapshot_dir)}", err=True)
        if stats_json is not None:
            _write_json(stats_json, _stats_json(run.stats()))
        try:
            run.join()
        except Exception as exc:
            if exc is run.failure:  # the run failed, whatever the exception's class
                raise _RunFailed(exc) from exc
            raise
        finally:
            final = run.stats()
            if not quiet and not run.running:
                _say_recorded(final)
            if final.capsule is not None and final.capsule.written and not run.running:
                click.echo(f"crash capsule written to {final.capsule.file}: reproduce the "
                           f"failure with `mujou replay {final.capsule.file} {target}`",
                           err=True)
        if signals.code:
            sys.exit(signals.code)


def _say_starting(say: Callable[[str], None], net: Any) -> None:
    n = _count_nodes(net)
    say(f"starting {'the' if n is None else n} node{'' if n == 1 else 's'} (on_start) ...")


def _serve(run: Any, listen: str, allow_remote: bool, quiet: bool, *, publish: bool,
           params: bool, origins: tuple[str, ...]) -> Any:
    """``--foxglove``: the live view's server (`mujou.serve_foxglove`); says where it listens."""
    try:
        server = mujou.serve_foxglove(run, listen, allow_remote=allow_remote,
                                      allow_publish=publish, allow_params=params,
                                      origins=origins)
    except RuntimeError as exc:  # the port is taken
        raise UsageError(f"--foxglove {listen}: the server cannot listen ({exc})") from exc
    if not quiet:
        host = listen.rpartition(":")[0].strip("[]") or "127.0.0.1"
        publishing = "on" if publish else "off (--foxglove-publish)"
        setting = "on" if params else "off (--foxglove-params)"
        click.echo(f"foxglove: live view at ws://{host}:{server.port} (open it in Foxglove: "
                   f"Open connection, Foxglove WebSocket; setting parameters {setting}; "
                   f"publishing to Inputs {publishing})", err=True)
    return server


def parse_replace(items: tuple[str, ...]) -> list[str]:
    """``--replace PATH[,PATH...]`` options (repeatable) as a list of node paths.

    Raises:
        UsageError: none given, or an empty path.
    """
    paths = [p.strip() for item in items for p in item.split(",")]
    if not items:
        raise UsageError("replay: name the nodes the recording stands in for with "
                         "--replace PATH[,PATH...] (for example --replace sim)")
    if any(not p for p in paths):
        raise UsageError(f"--replace {','.join(items)!r}: an empty node path")
    return paths


@main.command("replay")
@click.argument("recording", metavar="RECORDING.mcap", type=click.Path(dir_okay=False))
@click.argument("target", metavar="FILE[:NAME]")
@click.option("--replace", "replace", multiple=True, metavar="PATH[,PATH...]",
              help="The nodes (each with its subtree) that the recording stands in for: "
                   "their code does not run, their recorded messages are sent instead. "
                   "Required (but for a crash capsule); repeat it or separate paths by commas.")
@click.option("--speed", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="0: as fast as possible, on the simulated timer (every message at its "
                   "recorded time and delta cycle, exactly); 1: real time; N: N times "
                   "faster than recorded.")
@click.option("--loop", is_flag=True,
              help="Start the recording again at its end (until Ctrl-C or --duration).")
@click.option("--duration", type=float, default=None,
              help="Seconds of the run's timer; default: the recording's length (at "
                   "--speed N, divided by N), or until Ctrl-C with --loop.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker threads; default: mujou's choice.")
@click.option("--seed", type=int, default=None,
              help="Seed of the run; default: the recorded run's seeds.")
@click.option("--stats-json", type=click.Path(dir_okay=False), default=None,
              help="Write the final run.stats() as JSON to this file.")
@click.option("--record", "record_path", type=click.Path(dir_okay=False), default=None,
              help="Record the replay's Outputs to this MCAP file (the replayed ones too).")
@click.option("--record-port", "record_ports", multiple=True, metavar="PATTERN",
              help="With --record: record the Outputs whose path matches this glob; "
                   "repeat it for more. Default: every Output.")
@click.option("--record-view", is_flag=True,
              help="With --record: also write each Output's JSON view (/view/<path>) for "
                   "Foxglove beside its lossless channel.")
@_foxglove_options("replay")
@click.option("--allow-remote", is_flag=True,
              help="Let --foxglove be an address other machines reach (a trusted network "
                   "only: the view shows every port).")
@click.option("--allow-damaged", is_flag=True,
              help="Replay a damaged recording up to its first damaged record (as if a crash "
                   "had cut it there); without it such a file is refused.")
@click.option("--quiet", is_flag=True, help="No live view and no status lines.")
@click.option("--verbose", is_flag=True, help="Tracebacks with errors.")
def replay_command(recording: str, target: str, replace: tuple[str, ...], speed: float,
                   loop: bool, duration: float | None, workers: int | None, seed: int | None,
                   stats_json: str | None, record_path: str | None,
                   record_ports: tuple[str, ...], record_view: bool, foxglove: str | None,
                   foxglove_publish: bool, foxglove_params: bool,
                   foxglove_origins: tuple[str, ...],
                   allow_remote: bool, allow_damaged: bool, quiet: bool,
                   verbose: bool) -> None:
    """Run the net in FILE with the nodes of --replace replayed from RECORDING.mcap."""
    live = sys.stdout.isatty() and not quiet
    _setup_logging(live, verbose)
    say = _progress(quiet)
    with _errors(verbose), _Signals() as signals:
        if stats_json is not None:
            check_writable(stats_json, "--stats-json", make_folders=False)
        if record_path is not None:
            check_writable(record_path, "--record", make_folders=True)
        elif record_ports or record_view:
            raise UsageError("--record-port and --record-view go with --record FILE")
        _check_foxglove(foxglove, foxglove_publish, foxglove_origins, allow_remote,
                        foxglove_params)
        if not os.path.isfile(recording):
            raise UsageError(f"{recording}: no such file")
        from .recording.capsule import capsule_facts
        from .recording.mcapfile import info as read_info

        found = read_info(recording, allow_damaged=allow_damaged)
        if capsule_facts(found.end, recording) is not None:
            explicit_speed = click.get_current_context().get_parameter_source("speed") \
                is not click.core.ParameterSource.DEFAULT
            if loop or duration is not None or seed is not None or record_path is not None \
                    or explicit_speed or foxglove is not None:
                raise UsageError("a crash capsule is replayed from its snapshot to its failure "
                                 "on the simulated timer: --speed, --loop, --duration, --seed "
                                 "and --record do not go with it, nor --foxglove")
            if allow_damaged:
                raise UsageError("a crash capsule is reproduced from a whole file: "
                                 "--allow-damaged does not go with it")
            paths = [p.strip() for item in replace for p in item.split(",")]
            _reproduce(recording, target, paths, workers, quiet)
            return
        paths = parse_replace(replace)
        simulated = speed == 0
        if duration is None and not loop:
            from .recording.replay import recording_length

            duration = recording_length(found) / 1e9 / (1.0 if simulated else speed)
        net: Any = load_net(target, say=say)  # a tuple of nodes too (see run_command)
        signals.mode = "defer"
        _say_starting(say, net)
        replay = mujou.Replay(recording, replace=paths, speed=1.0 if simulated else speed,
                              loop=loop, allow_damaged=allow_damaged)
        record = None if record_path is None else mujou.Recording(
            record_path, ports=record_ports or None, view=record_view)
        run = mujou.run(net, timer="simulated" if simulated else "realtime",
                        duration=duration, workers=workers, seed=seed, replay=replay,
                        record=record)
        say("started")
        server = None
        try:
            signals.mode = "raise"
            if signals.code:
                raise _Interrupted(signals.code)  # it came while the net was starting
            if foxglove is not None:
                try:
                    server = _serve(run, foxglove, allow_remote, quiet,
                                    publish=foxglove_publish, params=foxglove_params,
                                    origins=foxglove_origins)
                except BaseException:
                    run.stop()  # the server could not start (a taken port): nor does the run
                    raise
            watch(run, duration=duration, simulated=simulated, live=live, quiet=quiet)
            signals.mode = "finish"
        except KeyboardInterrupt:
            signals.mode = "finish"
            click.echo("interrupted: stopping the run", err=True)
            run.stop()
        finally:
            if server is not None:
                server.close()
        stats = run.stats()
        if stats_json is not None:
            _write_json(stats_json, _stats_json(stats))
        if not quiet:
            rate = f", {stats.time / stats.wall:,.1f}x real time" if stats.wall > 0 else ""
            click.echo(f"replayed {recording} for {', '.join(paths)}: {stats.time:.3f} s of "
                       f"the run's timer in {stats.wall:.2f} s wall{rate}", err=True)
        try:
            run.join()
        except Exception as exc:
            if exc is run.failure:
                raise _RunFailed(exc) from exc
            raise
        finally:
            if not quiet and not run.running:
                _say_recorded(run.stats())
        if signals.code:
            sys.exit(signals.code)


def _say_recorded(stats: RunStats) -> None:
    """The line on stderr after a run that recorded (``--record``): how many messages, where."""
    recording = stats.recording
    if recording is not None:
        logs = recording.log
        click.echo(f"recorded {recording.recorded:,} messages"
                   + ("" if logs is None else f" and {logs.recorded:,} log records")
                   + f" to {recording.file}"
                   + (f" ({recording.dropped:,} dropped)" if recording.dropped else "")
                   + (f" ({logs.dropped:,} log records dropped)" if logs and logs.dropped
                      else ""),
                   err=True)


def _reproduce(capsule: str, target: str, replace: list[str], workers: int | None,
               quiet: bool) -> None:
    """``mujou replay CAPSULE``: rerun the net from its snapshot; fail as it did, or say why not.

    Raises:
        _RunFailed: the rerun failed (the capsule's failure reproduced, or another).
    """
    from .testing import reproduce_failure

    net: Any = load_net(target)
    result = reproduce_failure(capsule, net, replace=replace, workers=workers)
    if not quiet or result.error is None:
        click.echo(result.summary)
    if result.error is not None:
        raise _RunFailed(result.error) from result.error


class _Address(click.ParamType):
    """A ``HOST:PORT`` option (``HOST`` alone too, with ``free``): ``(host, port)``.

    Args:
        free (bool): the port may be left out or 0 (a free one is taken).
    """

    name = "HOST:PORT"

    def __init__(self, free: bool = False) -> None:
        self.free = free

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[str, int]:
        """The address as ``(host, port)``; a click error naming the option if malformed."""
        from .distributed.convention import parse_address

        if isinstance(value, tuple):
            return value
        try:
            return parse_address(value, default_port=0 if self.free else None, free=self.free)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@main.command("worker")
@click.option("--join", "leader", required=True, type=_Address(), metavar="LEADER_HOST:PORT",
              help="The address of the convention's leader (the host that runs the net).")
@click.option("--name", required=True,
              help="This member's name (the machine's), as placements name it.")
@click.option("--listen", type=_Address(free=True), default="127.0.0.1", show_default=True,
              metavar="ADDR[:PORT]",
              help="Where this member listens; a free port unless one is given. Beyond the "
                   "loopback only with --allow-remote.")
@click.option("--allow-remote", is_flag=True,
              help="Allow a --listen address that is not a loopback one (control frames are "
                   "authenticated with MUJOU_SECRET, not encrypted).")
@click.option("--verbose", is_flag=True, help="Tracebacks with errors.")
def worker_command(leader: tuple[str, int], name: str, listen: tuple[str, int],
                   allow_remote: bool, verbose: bool) -> None:
    """Serve as a member of a leader's convention until Ctrl-C or SIGTERM."""
    import threading

    from .distributed.convention import REGISTER_PERIOD, Member, check_listen, check_name

    with _errors(verbose):
        try:
            check_name(name)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--name'") from None
        try:
            check_listen(listen[0], allow_remote, f"worker {name!r}")
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--listen'") from None
        from .distributed.secret import SecretError, load_secret

        try:  # its groups' links need it: a missing or weak one is found now, not at a run
            load_secret()
        except SecretError as exc:
            raise UsageError(f"worker {name!r}: {exc}") from None
        _spawn_skips_main()
        stop = threading.Event()
        previous = {signum: signal.signal(signum, lambda *_: stop.set())
                    for signum in (signal.SIGINT, signal.SIGTERM)}
        joining = f"{leader[0]}:{leader[1]}"
        try:
            with Member(name, leader, listen=f"{listen[0]}:{listen[1]}",
                                   allow_remote=allow_remote) as member:
                host, port = member.address
                click.echo(f"worker {name} listening on {host}:{port} (leader {joining})")

                def changed(joined: bool) -> None:
                    # A leader lives as long as its run: its end is no error here.
                    click.echo(f"worker {name}: joined the leader at {joining}" if joined else
                               f"worker {name}: the leader at {joining} is gone (its run "
                               f"ended, or it is unreachable); waiting for the next one "
                               f"(asking every {REGISTER_PERIOD:g} s)", err=True)

                def refused() -> None:
                    click.echo(f"worker {name}: the leader at {joining} refuses this machine's "
                               f"frames: its MUJOU_SECRET is not this machine's (every machine "
                               f"of a convention needs the same secret)", err=True)

                member.serve(stop, on_change=changed, on_refused=refused)
            click.echo(f"worker {name}: stopped", err=True)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _spawn_skips_main() -> None:
    """Processes spawned from here on do not import this process's main script.

    ``spawn`` runs the parent's main module again in each new process (as
    ``__mp_main__``) unless it is a package's ``__main__``: for the ``mujou``
    console script that imports the package, torch included, in the member's
    admin and logger (about 2 s and 200 MB each), which need none of it. A
    spec naming ``mujou_actors.__main__`` makes ``spawn`` skip it, as for
    ``python -m mujou_actors``.
    """
    import importlib.machinery

    main_module = sys.modules.get("__main__")
    if main_module is not None and getattr(main_module, "__spec__", None) is None:
        main_module.__spec__ = importlib.machinery.ModuleSpec("mujou_actors.__main__", None)


@main.command("workers")
@click.option("--leader", required=True, type=_Address(), metavar="HOST:PORT",
              help="The address of the convention's leader.")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout, for programs.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=2.0,
              show_default=True, help="Seconds for the leader and its members to answer.")
@click.option("--verbose", is_flag=True, help="Tracebacks with errors.")
def workers_command(leader: tuple[str, int], as_json: bool, timeout: float,
                    verbose: bool) -> None:
    """List the members the leader knows, with their capabilities."""
    from .distributed.convention import known_members

    with _errors(verbose):
        try:
            found = known_members(leader, timeout)
        except ConnectionError as exc:
            raise click.ClickException(
                f"{exc}. A run's leader listens only while that run goes (`mujou run ... "
                f"--listen {leader[0]}:{leader[1]}`, or `mujou.Placement(..., listen=...)`)"
            ) from None
        if as_json:
            click.echo(json.dumps([{"name": m.name, "address": m.address,
                                    "capabilities": m.capabilities} for m in found],
                                  indent=2, sort_keys=True, default=str))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"members of the convention at {leader[0]}:{leader[1]}")
        for column in ("name", "address", "host", "pid", "capabilities"):
            table.add_column(column)
        for m in found:
            rest = {k: v for k, v in m.capabilities.items() if k not in _THESPIAN_CAPABILITIES}
            table.add_row(m.name, m.address, str(rest.pop("mujou.host", "")),
                          str(rest.pop("mujou.pid", "")),
                          ", ".join(f"{k}={v!r}" for k, v in sorted(rest.items())))
        Console().print(table)
        if not found:
            click.echo("no members", err=True)


# The capabilities `mujou workers` leaves out of its table: Thespian's own, and the name.
_THESPIAN_CAPABILITIES = frozenset({
    "Admin Port", "Convention Address.IPv4", "Process Startup Method", "Python Version",
    "Thespian ActorSystem Name", "Thespian ActorSystem Version", "Thespian Generation",
    "Thespian Version", "Thespian Watch Supported", "mujou.member"})


def _write_json(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically: a file there is always complete."""
    import secrets

    folder, name = os.path.split(os.path.abspath(path))
    # open(..., "x") rather than mkstemp: the file gets the umask's mode, not 0600.
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "x") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@main.command("inspect")
@click.argument("file", metavar="FILE", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout, for programs.")
@click.option("--allow-damaged", is_flag=True,
              help="A recording: show what a damaged one holds up to its first damaged "
                   "record, and what the damage is (without it, the damage is the error).")
@click.option("--verbose", is_flag=True, help="Tracebacks with errors.")
def inspect_command(file: str, as_json: bool, allow_damaged: bool, verbose: bool) -> None:
    """Summarize a snapshot file (checked whole) or a recording (an MCAP file)."""
    with _errors(verbose):
        if not os.path.isfile(file):
            raise UsageError(f"{file}: no such file")
        with open(file, "rb") as f:
            head = f.read(8)
        # MCAP's magic, or a name that says MCAP: a recording (docs/recording.md), whose
        # reader names what is wrong with a file that is none.
        if head == b"\x89MCAP0\r\n" or file.lower().endswith(".mcap"):
            from .recording.capsule import capsule_facts
            from .recording.mcapfile import info as recording_info

            found = recording_info(file, allow_damaged=allow_damaged)
            capsule_facts(found.end, file)  # a capsule's facts checked before a line is out
            if as_json:
                click.echo(json.dumps(recording_json(found), indent=2))
            else:
                _print_recording(found)
            return
        from .snapshot import inspect_file

        info = inspect_file(file)
        if as_json:
            tree = info["tree"]
            click.echo(json.dumps({
                "kind": "snapshot", "path": file, "version": info["version"],
                "size": info["size"], "tensors": info["tensors"],
                "tensor_bytes": info["tensor_bytes"],
                "time_ns": tree.get("time_ns") if isinstance(tree, dict) else None,
                "seeds": tree.get("seeds") if isinstance(tree, dict) else None}, indent=2))
            return
        for line in summarize(info):
            click.echo(line)


CAT_ELEMENTS = 16
"""The most elements of a tensor that ``mujou cat`` shows by value without ``--full``."""


def _open_recording(file: str, allow_damaged: bool) -> Any:
    """``mcapfile.info`` of a recording named on the command line (its errors, one line)."""
    from .recording.mcapfile import info as recording_info

    if not os.path.isfile(file):
        raise UsageError(f"{file}: no such file (expected a recording, an MCAP file that "
                         "`mujou run --record` wrote)")
    return recording_info(file, allow_damaged=allow_damaged)


def _cat_time(t_ns: int) -> str:
    return "on_start" if t_ns < 0 else f"{t_ns / 1e9:.9f}"


def _printable(text: str) -> str:
    """A file's text for a terminal: its control characters escaped (a file is untrusted)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _log_line(entry: Any) -> str:
    """A log record as ``mujou cat`` prints it: level, name, message and where it was logged."""
    where = f" ({_printable(os.path.basename(entry.file))}:{entry.line})" if entry.file else ""
    return (f"{entry.level_name} {_printable(entry.name)}: {_printable(entry.message)}"
            f"{where}")


@main.command("cat")
@click.argument("file", metavar="RECORDING.mcap", type=click.Path(dir_okay=False))
@click.argument("ports", nargs=-1, metavar="[PORT...]")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object a line: t_ns, delta, topic, sequence, message (a log "
                   "record: t_ns, topic, sequence, log).")
@click.option("--full", is_flag=True,
              help=f"Every value of every tensor (without it, a tensor of more than "
                   f"{CAT_ELEMENTS} elements shows its shape, dtype, min, max and mean).")
@click.option("--allow-damaged", is_flag=True,
              help="Print a damaged recording up to its first damaged record.")
@click.option("--verbose", is_flag=True, help="Tracebacks with errors.")
def cat_command(file: str, ports: tuple[str, ...], as_json: bool, full: bool,
                allow_damaged: bool, verbose: bool) -> None:
    """Print a recording's messages: time (s), port, message (as the Foxglove view shows it).

    PORT: Output paths or globs ('sim.*'), or /mujou/log (the run's log records,
    recorded with --record-log); default: every recorded Output, and the log.
    """
    from .recording.foxlog import LOG_TOPIC
    from .recording.mcapfile import LogEntry, Reader
    from .recording.recview import channel_views, merged, select_topics

    with _errors(verbose):
        found = _open_recording(file, allow_damaged)
        try:
            topics = select_topics(found, ports)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        views = channel_views(found)
        limit = None if full else CAT_ELEMENTS
        keep = frozenset(topics)
        width = max((len(t) for t in topics), default=0)
        logs = -1  # the count of the log's records so far
        for record in merged(file, Reader(file, allow_damaged=allow_damaged).messages(
                keep.__contains__), allow_damaged, with_logs=LOG_TOPIC in keep):
            if isinstance(record, LogEntry):
                logs += 1
                if as_json:
                    click.echo(json.dumps({"t_ns": record.t_ns, "topic": LOG_TOPIC,
                                           "sequence": logs, "log": record.to_json()}))
                else:
                    click.echo(f"{_cat_time(record.t_ns):>12}  {LOG_TOPIC:<{width}}  "
                               f"{_log_line(record)}")
                continue
            value = views[record.topic].summary(record.message, limit)
            if as_json:
                click.echo(json.dumps({"t_ns": record.t_ns, "delta": record.delta,
                                       "topic": record.topic, "sequence": record.sequence,
                                       "message": value}, allow_nan=False))
            else:
                click.echo(f"{_cat_time(record.t_ns):>12}  {record.topic:<{width}}  "
                           f"{json.dumps(value, allow_nan=False, separators=(', ', ': '))}")


@main.command("export-view")
@click.argument("file", metavar="RECORDING.mcap", type=click.Path(dir_okay=False))
@click.argument("out", metavar="OUT.mcap", type=click.Path(dir_okay=False))
@click.option("--allow-damaged", is_flag=True,
              help="Export a damaged recording up to its first damaged record.")
@click.option("--quiet", is_flag=True, help="No line saying what was written.")
@click.option("--verbose", is_flag=True, help="Tracebacks with errors.")
def export_view_command(file: str, out: str, allow_damaged: bool, quiet: bool,
                        verbose: bool) -> None:
    """Write the Foxglove view channels (/view/<path>) of a recording to OUT.mcap.

    The views are made from the recording's lossless channels, as `--record-view`
    makes them while a run records: no node runs.
    """
    from .recording.recview import export_view

    with _errors(verbose):
        _open_recording(file, allow_damaged)
        check_writable(out, "OUT.mcap", make_folders=False)
        try:
            done = export_view(file, out, allow_damaged=allow_damaged)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if not quiet:
            failed = sum(done.failed.values())
            click.echo(f"wrote {done.channels} view channel(s), "
                       f"{sum(done.messages.values()):,} messages"
                       + (f" and {done.logs:,} log records" if done.logs else "")
                       + f" to {done.path}"
                       + (f" ({failed:,} messages had no view)" if failed else ""), err=True)


@main.command("view")
@click.argument("file", metavar="RECORDING.mcap", type=click.Path(dir_okay=False))
@click.option("--foxglove", "foxglove", is_flag=False, flag_value=f":{DEFAULT_FOXGLOVE_PORT}",
              default=f":{DEFAULT_FOXGLOVE_PORT}", show_default="127.0.0.1:8765",
              metavar="[HOST]:PORT",
              help="Where the Foxglove WebSocket server listens (loopback unless a host is "
                   "given with --allow-remote). Write it as --foxglove=:PORT, or after FILE.")
@click.option("--foxglove-origin", "foxglove_origins", multiple=True, metavar="ORIGIN",
              help="Also accept connections from web pages of this origin "
                   "(SCHEME://HOST[:PORT], or null); repeat it for more.")
@click.option("--allow-remote", is_flag=True,
              help="Let --foxglove be an address other machines reach (they read the "
                   "recording).")
@click.option("--speed", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, help="Playback speed, a factor of the recorded rate "
                                      "(Foxglove's speed control changes it).")
@click.option("--loop", is_flag=True, help="Start again at the end.")
@click.option("--paused", is_flag=True, help="Start paused (Foxglove's play button starts).")
@click.option("--allow-damaged", is_flag=True,
              help="Serve a damaged recording up to its first damaged record.")
@click.option("--quiet", is_flag=True, help="No line saying where it listens.")
@click.option("--verbose", is_flag=True, help="Tracebacks with errors.")
def view_command(file: str, foxglove: str, foxglove_origins: tuple[str, ...],
                 allow_remote: bool, speed: float, loop: bool, paused: bool,
                 allow_damaged: bool, quiet: bool, verbose: bool) -> None:
    """Serve a recording to Foxglove (its ports projected as the live view projects
    them), with Foxglove's play, pause, speed and seek controls, until Ctrl-C."""
    import threading

    from .recording.playback import serve_recording

    _setup_logging(False, verbose)
    with _errors(verbose):
        _check_foxglove(foxglove, False, foxglove_origins, allow_remote)
        _open_recording(file, allow_damaged)
        try:
            server = serve_recording(file, foxglove, allow_remote=allow_remote,
                                     origins=foxglove_origins, speed=speed, loop=loop,
                                     paused=paused, allow_damaged=allow_damaged)
        except RuntimeError as exc:  # the port is taken
            raise UsageError(f"--foxglove {foxglove}: the server cannot listen ({exc})") from exc
        stop = threading.Event()
        previous = {signum: signal.signal(signum, lambda *_: stop.set())
                    for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            with server:
                if not quiet:
                    host = server.address[0]
                    click.echo(f"foxglove: recording view of {file} at ws://{host}:"
                               f"{server.port} ({(server.end_ns - server.start_ns) / 1e9:.3f} s; "
                               f"open it in Foxglove: Open connection, Foxglove WebSocket; "
                               f"Ctrl-C ends it)", err=True)
                while not stop.wait(0.5) and not server.closed:
                    pass
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _rate(count: int, first_ns: int | None, last_ns: int | None) -> float | None:
    """Messages per second of the run's timer between a channel's first and last; None if one."""
    if first_ns is None or last_ns is None or last_ns <= first_ns or count < 2:
        return None
    return (count - 1) / ((last_ns - first_ns) / 1e9)


def recording_json(info: Any) -> dict[str, Any]:
    """A recording's summary for ``mujou inspect --json`` (``mcapfile.info`` and rates)."""
    out: dict[str, Any] = {"kind": "recording", **dataclasses.asdict(info)}
    for channel in out["channels"]:
        channel["rate"] = _rate(channel["count"], channel["first_ns"], channel["last_ns"])
        channel["dropped"] = info.drops.get(channel["topic"], 0)
    span = (None if info.start_ns is None or info.end_ns is None
            else (info.end_ns - info.start_ns) / 1e9)
    out["span_s"] = span
    return out


def _seconds(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e9:.3f}"


def _print_recording(info: Any) -> None:
    from .recording.capsule import capsule_facts

    """``mujou inspect FILE.mcap``: the header lines, the channels' table, seeds, attachments."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    # Not on a terminal (a pipe, a file): wide enough that no row wraps.
    console = Console(highlight=False, soft_wrap=True,
                      width=None if sys.stdout.isatty() else 200)
    run, end = info.run, info.end
    if info.damage is not None:  # --allow-damaged
        state = f"DAMAGED: {info.damage}" + (
            "" if info.cut_at is None else f"; read up to byte {info.cut_at:,}")
    else:
        state = "complete" if info.complete else (f"cut at byte {info.cut_at:,} (no summary: "
                                                  "the run did not close it; read up to there)")
    console.print(f"mujou recording {info.path}: {info.size:,} bytes, format "
                  f"{run.get('format', '?')}, {info.library or 'unknown library'}, {state}")
    if run:
        console.print(f"timer {run.get('timer', '?')}, workers {run.get('workers', '?')}, "
                      f"seed {run.get('seed') or '-'}, started {run.get('started_at', '?')}, "
                      f"torch {run.get('torch', '?')}, python {run.get('python', '?')}")
    dropped = sum(info.drops.values())
    span = ("-" if info.start_ns is None or info.end_ns is None
            else f"{info.start_ns / 1e9:.3f} .. {info.end_ns / 1e9:.3f} s "
                 f"({(info.end_ns - info.start_ns) / 1e9:.3f} s)")
    ended = "" if end is None else f", run ended at {_seconds(_int(end.get('time_ns')))} s"
    console.print(f"time {span}, {info.messages:,} messages, {dropped:,} dropped{ended}")
    if not info.channels and info.views:
        console.print("no lossless channels: a file of views only (mujou export-view writes "
                      "one); its views are listed below")
    if end is not None and end.get("failure"):
        console.print(f"failure: {end['failure']}")
    facts = capsule_facts(end, info.path)
    if facts is not None:
        start = int(facts["snapshot_ns"])
        since = "the start" if start < 0 else f"the snapshot at {start / 1e9:.3f} s"
        failed_at = max(int(facts["t_ns"]), 0) / 1e9
        console.print(f"crash capsule: from {since} to the failure at {failed_at:.9f} s, delta "
                      f"{facts['delta']} (reproduce it: mujou replay {info.path} FILE[:NAME])")
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    for name in ("channel", "type", "messages", "rate/s", "bytes", "first s", "last s",
                 "dropped"):
        table.add_column(name, justify="left" if name in ("channel", "type") else "right",
                         no_wrap=True)
    for c in info.channels:
        kind = c.type
        if c.dtype is not None or c.shape is not None:
            kind += f" {c.dtype or ''}{'' if c.shape is None else list(c.shape)}"
        rate = _rate(c.count, c.first_ns, c.last_ns)
        table.add_row(c.topic, kind, f"{c.count:,}", "-" if rate is None else f"{rate:,.1f}",
                      f"{c.bytes:,}", _seconds(c.first_ns), _seconds(c.last_ns),
                      f"{info.drops.get(c.topic, 0):,}")
    console.print(table)
    if info.views:  # Recording(view=True): JSON channels for Foxglove, beside the lossless ones
        console.print(f"view channels: {len(info.views)} (JSON, for Foxglove; not replayed)")
        for c in info.views:
            console.print(f"  {c.topic}  {c.type}  {c.count:,} messages  {c.bytes:,} bytes")
    for c in info.logs:  # Recording(log=True): the run's log records, not replayed
        level = _int(run.get("record_log"))
        since = "" if level is None else f" from {logging.getLevelName(level)}"
        console.print(f"log: {c.topic}  {c.type}  {c.count:,} records{since}  {c.bytes:,} bytes"
                      f"  {_seconds(c.first_ns)} .. {_seconds(c.last_ns)} s  "
                      f"{info.log_dropped:,} dropped  (mujou cat {info.path} {c.topic})")
    if info.seeds:
        console.print("seeds: " + ", ".join(f"{p or '<root>'}={s}" for p, s in info.seeds.items()))
    console.print(f"attachments: {len(info.attachments)}")
    for a in info.attachments:
        console.print(f"  {a.name}  {a.media_type}  t={a.t_ns / 1e9:.3f} s  {a.size:,} bytes")


def _int(text: str | None) -> int | None:
    try:
        return None if text is None or text == "" else int(text)
    except ValueError:
        return None


def summarize(info: dict[str, Any]) -> Iterator[str]:
    """Lines describing a snapshot (``snapshot.inspect_file``'s result)."""
    tree = info["tree"]
    yield (f"mujou snapshot, file format {info['version']}, {info['size']:,} bytes, "
           f"{info['tensors']} tensors ({info['tensor_bytes']:,} bytes)")
    if isinstance(tree, dict) and "time_ns" in tree:
        yield f"state tree format {tree.get('format')}, time {tree['time_ns'] / 1e9:.9f} s"
        yield "seeds:"
        for path, seed in tree.get("seeds", {}).items():
            yield f"  {path or '<root>'}: {seed}"
        yield "nodes:"
        for path, state in tree.get("nodes", {}).items():
            yield f"  {path or '<root>'}:"
            for key, line in _describe(state):
                if key == "generator" and line.isdigit():  # see Node.state_dict
                    line = f"seed {line} (not drawn from yet)"
                yield f"    {key}: {line}"
        for section, title in (("inputs", "kept messages"), ("pending", "undelivered messages")):
            entries = {p: m for p, m in tree.get(section, {}).items() if m}
            yield f"{title}: {sum(len(m) for m in entries.values())}"
            for path, messages in entries.items():
                yield f"  {path}: {len(messages)}"
        yield from _summarize_extras(tree)
    else:
        for key, line in _describe(tree):
            yield f"{key}: {line}"


def _summarize_extras(tree: dict[str, Any]) -> Iterator[str]:
    """The optional sections of a tree: synchronizers, parameter sets not yet applied."""
    syncs = tree.get("sync", {})
    if isinstance(syncs, dict) and syncs:
        yield f"synchronizers: {len(syncs)}"
        for path, entry in syncs.items():
            if not isinstance(entry, dict):
                continue
            held = len(entry.get("queued", [])) + len(entry.get("arrived", []))
            yield (f"  {path} ({entry.get('policy')}): {held} messages waiting, "
                   f"{len(entry.get('sets', []))} sets kept")
    params = tree.get("params", {})
    if isinstance(params, dict) and params:
        yield f"parameter sets not yet applied: {sum(len(v) for v in params.values())}"
        for path, entries in params.items():
            for entry in entries:
                if isinstance(entry, (list, tuple)) and len(entry) == 4:
                    t_ns, delta, name, value = entry
                    yield f"  {path}.{name} = {value!r} from t={t_ns / 1e9:.9f} s, delta {delta}"


def _describe(value: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    import torch

    if isinstance(value, dict):
        if not value:
            yield prefix or "(state)", "{}"
        for key, item in value.items():
            yield from _describe(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, torch.Tensor):
        nbytes = value.numel() * value.element_size()
        yield prefix, f"tensor {str(value.dtype).removeprefix('torch.')} {list(value.shape)} " \
                      f"({nbytes:,} bytes)"
    elif isinstance(value, (list, tuple)):
        yield prefix, f"{type(value).__name__} of {len(value)}"
    else:
        text = repr(value)
        yield prefix, text if len(text) <= 60 else text[:57] + "..."


class _errors:
    """Turn errors into one line on stderr and an exit code (tracebacks with --verbose)."""

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if exc is None or isinstance(exc, (SystemExit, click.exceptions.Exit)):
            return False
        if isinstance(exc, KeyboardInterrupt):
            sys.exit(exc.code if isinstance(exc, _Interrupted) else EXIT_INTERRUPTED)
        if isinstance(exc, BrokenPipeError):
            # The reader went away (``mujou inspect ... | head``): stop quietly,
            # with the exit status a shell gives for SIGPIPE.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)
        if isinstance(exc, _RunFailed):
            if self.verbose:
                traceback.print_exception(exc.cause)
            click.echo(f"error: {describe(exc.cause)}", err=True)
            sys.exit(EXIT_FAILURE)
        if self.verbose:
            traceback.print_exception(exc)
        if isinstance(exc, click.ClickException):
            click.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        code = EXIT_FAILURE if isinstance(exc, MujouError) else EXIT_USAGE
        if isinstance(exc, (SnapshotError, RecordingError)):
            code = EXIT_USAGE  # a file given on the command line that is not a fit one
        if isinstance(exc, (TimeoutError, RuntimeError)) and not isinstance(exc, MujouError):
            code = EXIT_FAILURE
        click.echo(f"error: {describe(exc)}", err=True)  # a user's exception, maybe
        sys.exit(code)


# mujou ls, nodes, ports, echo, hz, top, stats: watching a running net from another process.
register_attach(main, lambda stats, prev, periods: [
    _live_table(stats, _rates(prev, stats), periods),
    *([_machines_table(stats)] if _has_members(stats) else [])])

if __name__ == "__main__":  # pragma: no cover
    main()
