"""The ``mujou`` commands that watch a running net from another process.

``mujou ls`` lists the running nets of this user; ``nodes``, ``ports``,
``echo``, ``hz``, ``top``, ``stats`` and ``param list/get/set`` talk to one of
them, named by RUN (a pid, a run's id, or the start of its file's name),
through its local endpoint (`mujou_actors.attach`). Their names and shapes
follow ``ros2 node list``, ``ros2 topic list/echo/hz``, ``ros2 param
list/get/set`` and ``dora list/top``; docs/cli.md describes each.
`cli.py` registers them (`register`), handing over the live view's table so
that ``top`` shows what ``mujou run`` shows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import click

from .attach import Connection, Refused, RunEntry, find_run, list_runs
from .errors import AttachError
from .stats import (
    CapsuleStats,
    GroupStats,
    MachineStats,
    NodeStats,
    RecordingChannelStats,
    RecordingStats,
    RunStats,
    SnapshotStats,
    SubscriptionStats,
    WorkerStats,
)

__all__: list[str] = []  # the commands are the interface (cli.py's `main` registers them)

#: What ``top`` and ``stats`` show: the live view's renderables for stats, the stats
#: before (None: since the start) and each shown node's period (cli.py's table).
Table = Callable[[RunStats, RunStats | None, dict[str, float | None]], list[Any]]

EXIT_FAILURE = 1  # the run went away, or ended before what was asked came
EXIT_USAGE = 2    # no such run, port or parameter, several runs match, a value refused
REFRESH_S = 0.25  # top's refresh (wall seconds), as `mujou run`'s live view
PLAIN_EVERY_S = 2.0  # top's table when standard output is no terminal
RUN_HELP = "RUN is a pid, a run's id or the start of its file's name (see mujou ls)."


class _Usage(click.ClickException):
    """No such run or port: one line, exit code 2."""

    exit_code = EXIT_USAGE


class _Failed(click.ClickException):
    """The run went away or ended early: one line, exit code 1."""

    exit_code = EXIT_FAILURE


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """One line on stderr (``error: ...``) and an exit code for what goes wrong."""
    try:
        yield
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except AttachError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILURE)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # `mujou echo ... | head`: stop quietly, as a shell's SIGPIPE
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)


def _connect(spec: str) -> Connection:
    """The connection to the run RUN names.

    Raises:
        _Usage: no run, or several, match; the runtime folder is unsafe.
        AttachError: the run has ended meanwhile.
    """
    try:
        entry = find_run(spec, list_runs())
    except AttachError as exc:
        raise _Usage(str(exc)) from None
    return Connection(entry)


def _name(entry: RunEntry) -> str:
    return f"{entry.pid} ({os.path.basename(entry.file)})"


# ---------------------------------------------------------------------------
# Stats back as records


def _record(cls: Any, data: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def stats_from(data: dict[str, Any]) -> RunStats:
    """A `RunStats` from the plain data a run's ``stats`` answer holds (`attach.plain`)."""
    recording = data.get("recording")
    if recording is not None:
        channels = {p: _record(RecordingChannelStats, c)
                    for p, c in recording.get("channels", {}).items()}
        recording = _record(RecordingStats, {**recording, "channels": channels})
    capsule = data.get("capsule")
    return RunStats(
        time=data["time"], wall=data["wall"],
        nodes={p: _record(NodeStats, n) for p, n in data["nodes"].items()},
        workers={p: _record(WorkerStats, w) for p, w in data.get("workers", {}).items()},
        snapshots=_record(SnapshotStats, data.get("snapshots", {})),
        subscriptions={p: _record(SubscriptionStats, s)
                       for p, s in data.get("subscriptions", {}).items()},
        groups={g: _record(GroupStats, {**s, "nodes": tuple(s["nodes"])})
                for g, s in data.get("groups", {}).items()},
        machines={m: _record(MachineStats, {**s, "groups": tuple(s["groups"]),
                                            "pids": tuple(s["pids"])})
                  for m, s in data.get("machines", {}).items()},
        recording=recording,
        capsule=None if capsule is None else _record(CapsuleStats, capsule))


def _periods(nodes: list[dict[str, Any]]) -> dict[str, float | None]:
    """The nodes the live table shows (periodic, or with Inputs: not containers)."""
    return {n["path"]: n["period"] for n in nodes if n["period"] is not None or n["inputs"]}


# ---------------------------------------------------------------------------
# Showing messages


def _number(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.6g}"
    return "null" if x is None else str(x)


def _is_tensor(view: Any) -> bool:
    return isinstance(view, dict) and "shape" in view and "dtype" in view and (
        "data" in view or "numel" in view)


def _flat(data: Any) -> str:
    if isinstance(data, list):
        return "[" + ", ".join(_flat(v) for v in data) + "]"
    return _number(data)


def render(view: Any, indent: int = 0) -> Iterator[str]:
    """A message's view (``view.project``) as lines for a person, YAML-like.

    A tensor is one line: ``tensor float32 [2]: [0.661352, 0.266924]``, or its
    statistics when the view holds them; a dict a ``key: value`` line per key.
    """
    pad = "  " * indent
    if _is_tensor(view):
        head = f"tensor {view['dtype']} {view['shape']}"
        if "data" in view:
            yield f"{pad}{head}: {_flat(view['data'])}"
        else:
            stats = "  ".join(f"{k} {_number(view.get(k))}" for k in ("min", "max", "mean")
                              if k in view)
            yield f"{pad}{head} ({view['numel']} elements): {stats}".rstrip(": ")
    elif isinstance(view, dict):
        if not view:
            yield f"{pad}{{}}"
        for key, value in view.items():
            if isinstance(value, dict) and not _is_tensor(value) and value:
                yield f"{pad}{key}:"
                yield from render(value, indent + 1)
            else:
                first, *rest = list(render(value, 0)) or [""]
                yield f"{pad}{key}: {first}"
                yield from (f"{pad}  {line}" for line in rest)
    elif isinstance(view, list) and any(isinstance(v, (dict, list)) for v in view):
        for value in view:
            first, *rest = list(render(value, 0)) or [""]
            yield f"{pad}- {first}"
            yield from (f"{pad}  {line}" for line in rest)
    elif isinstance(view, list):
        yield f"{pad}{_flat(view)}"
    else:
        yield f"{pad}{_number(view) if not isinstance(view, str) else view}"


def _note_lost(lost: int, seen: list[int], port: str) -> None:
    """Say on stderr, as it grows, how many messages this watcher lost (on the run's side)."""
    if lost > seen[0]:
        click.echo(f"({lost - seen[0]} message(s) of {port} lost, {lost} in all: this watcher "
                   f"fell behind; dropped on the run's side, the net did not wait)", err=True)
        seen[0] = lost


# ---------------------------------------------------------------------------
# hz


class Rate:
    """The rate of a port from its messages' send times, over a window (``ros2 topic hz``).

    Args:
        window (int): the newest gaps kept, >= 1.
    """

    def __init__(self, window: int) -> None:
        self.gaps: deque[int] = deque(maxlen=window)
        self.last: int | None = None
        self.count = 0

    def add(self, t_ns: int) -> None:
        """One message sent at ``t_ns``, ns of the run's timer (``on_start``'s, < 0: left out)."""
        if t_ns < 0:
            return
        self.count += 1
        if self.last is not None and t_ns >= self.last:
            self.gaps.append(t_ns - self.last)
        self.last = t_ns

    def report(self) -> dict[str, Any]:
        """``{"rate" (Hz), "min", "max", "std" (seconds between two messages), "window",
        "messages"}``; the figures None before two messages."""
        gaps = self.gaps
        n = len(gaps)
        if not n or not sum(gaps):
            return {"rate": None, "min": None, "max": None, "std": None, "window": n,
                    "messages": self.count}
        mean = sum(gaps) / n / 1e9
        var = sum((g / 1e9 - mean) ** 2 for g in gaps) / n
        return {"rate": 1 / mean, "min": min(gaps) / 1e9, "max": max(gaps) / 1e9,
                "std": math.sqrt(var), "window": n, "messages": self.count}


def _hz_lines(report: dict[str, Any], lost: int) -> str:
    if report["rate"] is None:
        return f"no rate yet: {report['messages']} message(s)"
    text = (f"average rate: {report['rate']:.3f}\n"
            f"\tmin: {report['min']:.6f}s max: {report['max']:.6f}s "
            f"std dev: {report['std']:.5f}s window: {report['window'] + 1}")
    return text + (f" lost: {lost}" if lost else "")


# ---------------------------------------------------------------------------
# The commands


def _table(rows: list[list[str]], headings: list[str]) -> None:
    """Rows as a plain table on stdout, columns aligned (tab-free, like ros2's lists)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headings)]
    for row in [headings, *rows]:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _ago(started: float) -> str:
    seconds = max(0.0, time.time() - started)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def ls_command(as_json: bool) -> None:
    """List the running nets of this user (stale entries removed)."""
    with _errors():
        try:
            runs = list_runs()
        except AttachError as exc:
            raise _Usage(str(exc)) from None
        rows = []
        for entry in runs:
            try:
                with Connection(entry, timeout=5.0) as conn:
                    hello = conn.hello
            except (AttachError, OSError):
                continue  # ended meanwhile
            rows.append((entry, hello))
        if as_json:
            click.echo(json.dumps([{**dataclasses.asdict(e), "time": h.get("time"),
                                    "cwd": h.get("cwd")} for e, h in rows], indent=2))
            return
        if not rows:
            click.echo("no running nets", err=True)
            return
        _table([[str(e.pid), e.id, e.file, time.strftime("%H:%M:%S", time.localtime(e.started))
                 + f" ({_ago(e.started)})", f"{h.get('time', 0.0):.3f}", e.timer,
                 str(e.nodes), str(e.groups)] for e, h in rows],
               ["pid", "id", "file", "started", "t s", "timer", "nodes", "groups"])


def nodes_command(run: str, as_json: bool) -> None:
    """List the nodes of a running net: path, class, period, group, ports."""
    with _errors(), _connect(run) as conn:
        nodes = conn.request("nodes")["nodes"]
        if as_json:
            click.echo(json.dumps(nodes, indent=2))
            return
        _table([[n["path"] or "<root>", n["class"],
                 "-" if n["period"] is None else f"{n['period']:g}",
                 "-" if n["period"] is None else f"{1 / n['period']:g}", n["group"],
                 ",".join(n["inputs"]) or "-", ",".join(n["outputs"]) or "-"] for n in nodes],
               ["node", "class", "period s", "rate Hz", "group", "inputs", "outputs"])


def _port_type(p: dict[str, Any]) -> str:
    text = p["type"].removeprefix("torch.")
    if p["dtype"] is not None:
        text += f" {p['dtype']}"
    if p["shape"] is not None:
        text += " [" + ", ".join("*" if dim is None else str(dim) for dim in p["shape"]) + "]"
    return text


def ports_command(run: str, as_json: bool) -> None:
    """List the ports of a running net: path, direction, type, connections, depth."""
    with _errors(), _connect(run) as conn:
        ports = conn.request("ports")["ports"]
        if as_json:
            click.echo(json.dumps(ports, indent=2))
            return
        _table([[p["path"], p["direction"], _port_type(p), ",".join(p["connections"]) or "-",
                 "-" if p["direction"] == "out" else
                 ("all" if p["depth"] is None else str(p["depth"]))] for p in ports],
               ["port", "dir", "type", "connections", "depth"])


def echo_command(run: str, port: str, once: bool, as_json: bool, full: bool) -> None:
    """Print the messages of a port of a running net as they are sent."""
    with _errors(), _connect(run) as conn:
        seen = [0]
        got = 0
        try:
            batches = conn.watch(port, mode="full" if full else "view")
            first = next(batches)
        except AttachError as exc:
            raise _Usage(str(exc)) from None
        for batch in _chain(first, batches):
            for t_ns, view in batch.get("items", ()):
                got += 1
                if as_json:
                    click.echo(json.dumps({"port": port, "t": t_ns / 1e9, "t_ns": t_ns,
                                           "value": view}))
                else:
                    click.echo(f"t: {t_ns / 1e9:.6f}")
                    for line in render(view):
                        click.echo(line)
                    click.echo("---")
                if once:
                    return
            _note_lost(batch.get("lost", 0), seen, port)
            if batch.get("end"):
                failure = batch.get("failure")
                click.echo(f"the run ended{f' (it failed: {failure})' if failure else ''}",
                           err=True)
                break
        if once and not got:
            raise _Failed(f"run {_name(conn.entry)} ended before a message on {port}")


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def hz_command(run: str, port: str, window: int, duration: float | None, as_json: bool) -> None:
    """Print the rate of a port of a running net, every second."""
    with _errors(), _connect(run) as conn:
        rate = Rate(window)
        lost = 0
        try:
            batches = conn.watch(port, mode="stamps")
            first = next(batches)
        except AttachError as exc:
            raise _Usage(str(exc)) from None
        if conn.hello.get("timer") == "simulated" and not as_json:
            click.echo("(simulated timer: the rate is per second of the run's time)", err=True)
        start = next_report = time.monotonic()
        next_report += 1.0
        ended = False
        for batch in _chain(first, batches):
            for t_ns in batch.get("stamps", ()):
                rate.add(t_ns)
            lost = batch.get("lost", lost)
            ended = bool(batch.get("end"))
            now = time.monotonic()
            last = ended or (duration is not None and now - start >= duration)
            if now >= next_report or last:
                next_report = now + 1.0
                report = {**rate.report(), "lost": lost, "port": port}
                click.echo(json.dumps(report) if as_json else _hz_lines(report, lost))
            if last:
                break
        if ended:
            click.echo("the run ended", err=True)


def _live_loop(conn: Connection, table: Table, periods: dict[str, float | None]) -> None:
    """``top`` on a terminal: the live view's table, redrawn every `REFRESH_S`."""
    from rich.console import Group
    from rich.live import Live

    prev = None
    with Live(refresh_per_second=1 / REFRESH_S, transient=False) as view:
        while True:
            stats = stats_from(conn.request("stats")["stats"])
            view.update(Group(*table(stats, prev, periods)))
            prev = stats
            time.sleep(REFRESH_S)


def top_command(run: str, once: bool, table: Table) -> None:
    """Show the live table of a running net (as `mujou run` does) until Ctrl-C or its end."""
    from rich.console import Console, Group

    with _errors(), _connect(run) as conn:
        periods = _periods(conn.request("nodes")["nodes"])
        click.echo(f"run {_name(conn.entry)}, {conn.hello.get('timer')} timer", err=True)
        try:
            if sys.stdout.isatty() and not once:
                _live_loop(conn, table, periods)
            prev = None
            console = Console(width=None if sys.stdout.isatty() else 120)
            while True:
                stats = stats_from(conn.request("stats")["stats"])
                console.print(Group(*table(stats, prev, periods)))
                if once:
                    return
                prev = stats
                time.sleep(PLAIN_EVERY_S)
        except (AttachError, ConnectionError):
            click.echo(f"the run {_name(conn.entry)} ended", err=True)


def stats_command(run: str, as_json: bool, table: Table) -> None:
    """Print the statistics of a running net (``Run.stats()``) once."""
    from rich.console import Console, Group

    with _errors(), _connect(run) as conn:
        data = conn.request("stats")["stats"]
        if as_json:
            click.echo(json.dumps(data, indent=2))
            return
        periods = _periods(conn.request("nodes")["nodes"])
        Console(width=None if sys.stdout.isatty() else 120).print(
            Group(*table(stats_from(data), None, periods)))


# ---------------------------------------------------------------------------
# param list / get / set


def param_text(value: Any) -> str:
    """A parameter's value as ``mujou param set`` and ``mujou run --param`` take it back.

    ``true``/``false`` for a bool, Python's ``repr`` for a float (``0.01``,
    ``1.0``), a str as it is.
    """
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) is float:
        return repr(value)
    return str(value)


def _shown(value: Any) -> str:
    """A value in the table: a str in quotes, so that an empty one or a space shows."""
    return json.dumps(value) if isinstance(value, str) else param_text(value)


def _rule(described: dict[str, Any]) -> str:
    """A parameter's range or choices in words: ``[0.0, 1.0]``, ``>= 0``, ``"a" | "b"``."""
    if described["choices"] is not None:
        return " | ".join(_shown(c) for c in described["choices"])
    if described["range"] is None:
        return "-"
    low, high = described["range"]
    if low is None:
        return f"<= {_shown(high)}"
    if high is None:
        return f">= {_shown(low)}"
    return f"[{_shown(low)}, {_shown(high)}]"


def _refused(request: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A request's answer; what the run refused is the user's to fix: exit code 2."""
    try:
        return request()
    except Refused as exc:
        raise _Usage(str(exc)) from None


def param_list_command(run: str, as_json: bool) -> None:
    """List the parameters of a running net: path, type, value, default, rule, description."""
    with _errors(), _connect(run) as conn:
        params = conn.request("params")["params"]
        if as_json:
            click.echo(json.dumps(params, indent=2))
            return
        if not params:
            click.echo(f"run {_name(conn.entry)} has no parameters", err=True)
            return
        _table([[path, p["type"] + (" (read-only)" if p["read_only"] else ""),
                 _shown(p["value"]), _shown(p["default"]), _rule(p), p["description"] or "-"]
                for path, p in params.items()],
               ["parameter", "type", "value", "default", "range/choices", "description"])


def param_get_command(run: str, path: str, as_json: bool) -> None:
    """Print the value of a parameter of a running net."""
    with _errors(), _connect(run) as conn:
        answer = _refused(lambda: conn.request("params", path=path))
        if as_json:
            answer.pop("ok", None)
            click.echo(json.dumps(answer))
            return
        click.echo(param_text(answer["value"]))


def param_set_command(run: str, path: str, value: str, as_json: bool) -> None:
    """Set a parameter of a running net: VALUE parsed by its type on the run's side."""
    with _errors(), _connect(run) as conn:
        answer = _refused(lambda: conn.request("set_param", path=path, value=value))
        if as_json:
            answer.pop("ok", None)
            click.echo(json.dumps(answer))
            return
        click.echo(f"{path}: {param_text(answer['old'])} -> {param_text(answer['value'])} "
                   f"(set; the node applies it at its next update)")


def _register_param(main: click.Group, json_option: Any, run_argument: Any) -> None:
    """Add ``param`` and its ``list``, ``get`` and ``set`` to ``main``."""
    path_argument = click.argument("path", metavar="PATH")
    group = click.Group("param", help=f"List, read and set the parameters (mujou.Param) of "
                                      f"a running net. {RUN_HELP}")
    main.add_command(group)
    group.command("list", help=f"List the parameters of a running net: path, type, value, "
                               f"default, range or choices, description. {RUN_HELP}")(
        run_argument(json_option(param_list_command)))
    group.command("get", help=f"Print the value of the parameter PATH (sensor.noise). "
                              f"{RUN_HELP}")(
        run_argument(path_argument(json_option(param_get_command))))
    # A negative number is a VALUE, not an option: `mujou param set RUN ctrl.bias -0.5`.
    group.command("set", context_settings={"ignore_unknown_options": True},
                  help=f"Set the parameter PATH to VALUE, read as its type (true/false, a "
                       f"number, a text); the node applies it at its next update. "
                       f"{RUN_HELP}")(
        run_argument(path_argument(click.argument("value", metavar="VALUE")(
            json_option(param_set_command)))))


# ---------------------------------------------------------------------------
# Registering them


def register(main: click.Group, table: Table) -> None:
    """Add ``ls``, ``nodes``, ``ports``, ``echo``, ``hz``, ``top``, ``stats`` and ``param``
    to ``main``.

    Args:
        main (click.Group): the ``mujou`` command.
        table (Table): the live view's renderables (cli.py's), for ``top`` and ``stats``.
    """
    json_option = click.option("--json", "as_json", is_flag=True,
                               help="JSON on stdout, for programs.")
    run_argument = click.argument("run", metavar="RUN")

    main.command("ls", help="List the running nets of this user: pid, id, file, start, "
                            "time, nodes.")(json_option(ls_command))
    main.command("nodes", help=f"List the nodes of a running net. {RUN_HELP}")(
        run_argument(json_option(nodes_command)))
    main.command("ports", help=f"List the ports of a running net. {RUN_HELP}")(
        run_argument(json_option(ports_command)))
    echo = click.option("--once", is_flag=True, help="Print one message, then exit.")(
        click.option("--full", is_flag=True, help="Every value of each tensor (by default a "
                     "tensor of more than 1024 elements shows its statistics).")(
            json_option(echo_command)))
    main.command("echo", help=f"Print the messages of PORT as they are sent (their view: "
                              f"tensors summarised). {RUN_HELP}")(
        run_argument(click.argument("port", metavar="PORT")(echo)))
    hz = click.option("--window", type=click.IntRange(min=1), default=10000, show_default=True,
                      help="The newest gaps the figures cover.")(
        click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="Wall seconds to measure, then exit (default: until Ctrl-C).")(
            json_option(hz_command)))
    main.command("hz", help=f"Print the rate of PORT every second: messages per second of "
                            f"the run's timer, min/max/std of the gap. {RUN_HELP}")(
        run_argument(click.argument("port", metavar="PORT")(hz)))

    def top(run: str, once: bool) -> None:
        top_command(run, once, table)

    def stats(run: str, as_json: bool) -> None:
        stats_command(run, as_json, table)

    main.command("top", help=f"Show the live table of a running net, as `mujou run` does. "
                             f"{RUN_HELP}")(
        run_argument(click.option("--once", is_flag=True,
                                  help="Print the table once, then exit.")(top)))
    main.command("stats", help=f"Print the statistics of a running net (Run.stats()). "
                               f"{RUN_HELP}")(run_argument(json_option(stats)))
    _register_param(main, json_option, run_argument)
