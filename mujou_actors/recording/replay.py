"""Replaying a recording: which nodes it replaces, checked against the net, and their feeds.

``mujou.run(net, replay=Replay("run.mcap", replace=["sim"]))`` runs ``net`` with
the nodes named in ``replace`` (each with its subtree) *replaced*: their code does
not run, and each one's recorded Output messages are sent, by a stand-in with
the node's path, Outputs and order (`_runtime.replay.StandIn`), at the keys
``(t_ns, delta)`` they were recorded at. This module does everything before
the run is built: it checks ``replace`` against the net and the file (a path
that is no node; an Output that a node which runs reads and that the file did
not record), and makes each stand-in's `Feed` (`FileFeed`), which reads the
node's channels from the file (`mcapfile.Reader`) as the stand-in goes.

How the recorded keys become the replay's:

* the simulated timer: exactly the recorded keys, so every reader gets the
  same stamps ``(t, delta, sender order)`` in its mailbox as in the recorded
  run, and everything downstream is bit for bit the same (for any number of
  workers) when the rest of the net is;
* the real-time timer: ``t_ns / speed`` on the run's clock, delta 0 (real time
  has no delta cycles; the messages of one recorded instant go out together,
  in their recorded order);
* ``loop``: after the recording's end, again from its start, each pass
  ``length`` later than the one before (`ReplayPlan.length_ns`: the recorded
  run's end time, else its last message's); what ``on_start`` sent is sent once.

Users import `Replay` (``mujou.Replay``), the replay's settings; the rest is
for ``mujou.run`` and ``mujou_actors.testing``.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .._checks import is_number, settings_repr
from .._runtime.keys import CONTROL_KEY, Key
from .._runtime.replay import Feed, Group
from ..errors import RecordingError
from ..node import Node
from ..ports import Output, Port
from .mcapfile import Reader, RecordingInfo, info, is_param, parse_json, read_param, type_name

# What users import (mujou.Replay); the rest is the run's.
__all__ = ["Replay"]

log = logging.getLogger("mujou_actors")


@dataclass(frozen=True, init=False, repr=False)
class Replay:
    """What a run replays, and how (``mujou.run(replay=Replay(...))``).

    A path given as ``replay=`` is ``Replay(path)``: the whole net reruns,
    with the recorded run's seeds. A frozen value: two replays with the same
    settings are equal.

    Args:
        path (str | os.PathLike): the recording (``record=``, an MCAP file).
        replace (Iterable[str]): the paths of the nodes to replace, each with
            its subtree (``""``: the root, so every node). Their code does not
            run: a stand-in with the node's path, Outputs and order sends each
            recorded message at its recorded time and delta cycle. Kept as a
            tuple. Default: ``()`` (none: the net reruns with the recorded
            run's seeds).
        speed (float): with the real-time timer, how many times faster than
            recorded the messages come (``2``: twice as fast), a finite number
            > 0; the simulated timer replays the recorded times exactly (as
            fast as the net runs) and takes only 1. Default: 1.
        loop (bool): start the recording again at its end, each pass one
            recording's length later (what ``on_start`` sent comes once).
            Default: False.
        allow_damaged (bool): replay a damaged file (a checksum that does not
            match, a record that does not read) up to its first damaged
            record, as if a crash had cut it there, with a warning in the log;
            by default such a file is refused with `RecordingError`
            (docs/recording.md, "Untrusted files"). Default: False.

    Raises:
        TypeError: an argument of the wrong type (``replace="sim"`` for
            ``["sim"]``, ``speed="2"``, ``loop=1``), naming it.
        ValueError: an argument of the right type and a wrong value
            (``speed=0``, a NaN), naming it.
    """

    path: str
    replace: tuple[str, ...]
    speed: float
    loop: bool
    allow_damaged: bool

    def __init__(self, path: str | os.PathLike[str], *, replace: Iterable[str] = (),
                 speed: float = 1.0, loop: bool = False, allow_damaged: bool = False) -> None:
        if not isinstance(path, (str, os.PathLike)) or os.fspath(path) == "":
            raise TypeError(f"Replay: path must be a non-empty str or os.PathLike (the "
                            f"recording), got {path!r}")
        if not is_number(speed):
            raise TypeError(f"Replay: speed must be a number, got {speed!r}")
        if not math.isfinite(speed) or speed <= 0:
            raise ValueError(f"Replay: speed must be a finite number > 0 (1: real time, N: N "
                             f"times faster), got {speed!r}; as fast as possible is the "
                             "simulated timer (timer='simulated')")
        for name, flag in (("loop", loop), ("allow_damaged", allow_damaged)):
            if type(flag) is not bool:
                raise TypeError(f"Replay: {name} must be a bool, got {flag!r}")
        settings: dict[str, Any] = {
            "path": os.fspath(path), "replace": _node_paths(replace), "speed": float(speed),
            "loop": loop, "allow_damaged": allow_damaged}
        for name, setting in settings.items():  # frozen: set once, as a dataclass's __init__
            object.__setattr__(self, name, setting)

    def __repr__(self) -> str:
        return settings_repr(self)


def _node_paths(replace: Any) -> tuple[str, ...]:
    """``Replay(replace=)`` as a tuple of node paths.

    Raises:
        TypeError: not an iterable of str (a str alone: a list of paths is meant).
    """
    if isinstance(replace, str):
        raise TypeError(f"Replay: replace must be a list of node paths, not the string "
                        f"{replace!r} (write [{replace!r}])")
    if not isinstance(replace, Iterable):
        raise TypeError(f"Replay: replace must be a list of node paths, got {replace!r}")
    paths = tuple(replace)
    for path in paths:
        if not isinstance(path, str):
            raise TypeError(f"Replay: replace must hold node paths (str), got {path!r}")
    return paths


def as_replay(replay: Any) -> Replay | None:
    """The `Replay` for ``mujou.run(replay=...)``: None, a path, or a Replay.

    Raises:
        TypeError: another type. ValueError: an empty path.
    """
    if replay is None or isinstance(replay, Replay):
        return replay
    if not isinstance(replay, (str, os.PathLike)):
        raise TypeError("mujou.run: replay must be None, a path (str or os.PathLike) or a "
                        f"mujou.Replay, got {type(replay).__name__}")
    if os.fspath(replay) == "":
        raise ValueError("mujou.run: replay must not be an empty path")
    return Replay(replay)


def check_timer(replay: Replay, simulated: bool) -> None:
    """Refuse a ``speed`` other than 1 with the simulated timer.

    Raises:
        ValueError: ``speed`` is not 1 and the timer simulated (which replays
            at the recorded times exactly).
    """
    if simulated and replay.speed != 1:
        raise ValueError(f"mujou.run: Replay(speed={replay.speed:g}) applies to the real-time "
                         "timer; the simulated timer replays at the recorded times exactly, as "
                         "fast as the net runs")


@dataclass(frozen=True)
class ReplayPlan:
    """A checked replay: the stand-ins' feeds and what the file says of its run.

    Attributes:
        path (str): the recording.
        feeds (dict[str, FileFeed]): by path, every replaced node's feed.
        seeds (dict[str, int]): each node's seed in the recorded run.
        length_ns (int): the recording's length, ns (its run's end time, or its
            last message's time for a run that did not end cleanly).
        info (RecordingInfo): what the file holds.
        params (RecordedParams | None): the parameters' values as the
            recorded run started and the sets made on it (None: a file from
            before parameters were recorded).
    """

    path: str
    feeds: dict[str, FileFeed]
    seeds: dict[str, int]
    length_ns: int
    info: RecordingInfo
    params: RecordedParams | None = None


@dataclass(frozen=True)
class RecordedParams:
    """The parameters of a recorded run: their values at its start, and the sets made on it.

    Attributes:
        initial (dict[str, bool | int | float | str]): each parameter's value
            as the run started, by dotted path (the ``mujou.run`` metadata's
            ``params``).
        sets (list[tuple[int, int, str, str, Any]]): each set made on the
            running net, ``(t_ns, delta, node, name, value)``, in file order
            (the ``param-*.json`` attachments).
    """

    initial: dict[str, Any]
    sets: list[tuple[int, int, str, str, Any]]


def recorded_params(path: str, found: RecordingInfo,
                    allow_damaged: bool = False) -> RecordedParams | None:
    """The parameters a recording keeps, checked; None for a file from before they were kept.

    Args:
        path (str): the recording.
        found (RecordingInfo): its `mcapfile.info`.
        allow_damaged (bool): read a damaged file up to its first damage.

    Raises:
        RecordingError: the ``params`` metadata is not a JSON object of
            values, or a set's attachment is not one (`mcapfile.read_param`).
    """
    text = found.run.get("params")
    if text is None:
        return None
    try:
        initial = parse_json(text)
    except ValueError as exc:
        raise RecordingError(path, f"the mujou.run metadata's params is not JSON: {exc}") \
            from None
    if not isinstance(initial, dict) or not all(
            type(v) in (bool, int, float, str) for v in initial.values()):
        raise RecordingError(path, "the mujou.run metadata's params must map each "
                             "parameter's path to a bool, int, float or str")
    sets = []
    if any(is_param(a) for a in found.attachments):
        for attachment, data in Reader(path, allow_damaged=allow_damaged).attachments():
            if is_param(attachment):
                sets.append(read_param(path, attachment, data))
    return RecordedParams(initial, sets)


def recording_length(found: RecordingInfo) -> int:
    """The length of a recording, ns: its run's end time, else its last message's time.

    Args:
        found (RecordingInfo): the file's `mcapfile.info`.

    Returns:
        int: ``time_ns`` of its ``mujou.end`` metadata when that is later than
        every message, else the last message's time (0 for a file without one).
    """
    last = found.end_ns or 0
    end = (found.end or {}).get("time_ns")
    try:
        return max(last, int(end)) if end else last
    except ValueError:
        return last


def _subtree(path: str, roots: Iterable[str]) -> bool:
    """Whether the node at ``path`` is one of ``roots`` or lies in one's subtree."""
    return any(r == "" or path == r or path.startswith(r + ".") for r in roots)


def plan(replay: Replay, found: list[tuple[str, Node]], ports: Mapping[str, Port], *,
         simulated: bool) -> ReplayPlan:
    """Check a replay against the net and the file; make the stand-ins' feeds.

    Args:
        replay (Replay): the recording, the replaced nodes (each with its
            subtree; ``""``: the root, so every node), the speed (real time:
            how many times faster than recorded), whether to loop and to
            replay a damaged file up to its first damaged record (logged as a
            warning), as a cut one.
        found (list[tuple[str, Node]]): the net's nodes by path, in its order
            (`net.walk`), already named by their paths.
        ports (Mapping[str, Port]): the net's ports by path.
        simulated (bool): the run's timer is simulated (exact keys), else real time.

    Returns:
        ReplayPlan: the feeds and the file's seeds.

    Raises:
        ValueError: a path of ``replace`` names no node (the nodes are listed);
            an Output of a replaced node that a node which runs reads is not
            in the file (the missing channels are named), or is recorded with
            another type (or another declared tensor shape or dtype); ``loop``
            with a recording of length 0.
        FileNotFoundError: there is no such file.
        RecordingError: the file is not MCAP, not a mujou recording, or damaged
            (and not ``allow_damaged``).
    """
    file, replace = replay.path, replay.replace
    paths = [p for p, _ in found]
    for root in replace:
        if root not in paths:
            raise ValueError(f"mujou.run: Replay(replace=) names {root!r}, which is no node of "
                             f"the net (nodes: {', '.join(repr(p) for p in paths)})")
    found_info = info(file, allow_damaged=replay.allow_damaged)
    if found_info.damage is not None:
        log.warning("replay of %s: the file is damaged: %s; replaying what precedes the "
                    "damage (allow_damaged)", file, found_info.damage)
    channels = {c.topic: c for c in found_info.channels}
    replaced = [(p, n) for p, n in found if _subtree(p, replace)]
    names = {p for p, _ in replaced}
    missing: list[str] = []
    for _, node in replaced:
        for output in _outputs(node):
            readers = [r.path for r in output._readers if r.node._mujou_path not in names]
            channel = channels.get(output.path)
            if channel is None:
                if readers:
                    missing.append(f"{output.path} (read by {', '.join(readers)})")
                continue
            if channel.type != type_name(output.type):
                raise ValueError(f"mujou.run: {file} recorded {output.path!r} as "
                                 f"{channel.type}, but the net declares it "
                                 f"{type_name(output.type)}: is it the same net?")
            _check_spec(file, output, channel.shape, channel.dtype)
    if missing:
        listed = ", ".join(sorted(channels)) or "none"
        if found_info.damage is not None:
            why = (f"the file is damaged ({found_info.damage}): a channel whose messages "
                   "were all after the damage is not read")
        elif not found_info.complete:
            why = (f"the file was cut at byte {found_info.cut_at} (a crash left it short): a "
                   "channel whose messages were all after that point is not in it")
        else:
            why = "record them (Recording(ports=))"
        raise ValueError(f"mujou.run: replace={list(replace)!r} needs what {file} did not record: "
                         f"{'; '.join(missing)} (its channels: {listed}); {why}")
    length = recording_length(found_info)
    if replay.loop and length <= 0:
        raise ValueError(f"mujou.run: Replay(loop=True) needs a recording that lasts, but {file} "
                         "holds nothing after t = 0")
    timer = found_info.run.get("timer", "simulated")
    feeds = {}
    for node_path, node in replaced:
        outputs = {o.path: o for o in _outputs(node) if o.path in channels}
        feeds[node_path] = FileFeed(file, node_path, outputs,
                                    scale=None if simulated else replay.speed,
                                    loop_ns=length if replay.loop else None,
                                    exact=timer == "simulated",
                                    allow_damaged=replay.allow_damaged)
    _warn_other_net(file, found_info.run.get("net"), found, ports)
    params = recorded_params(file, found_info, replay.allow_damaged)
    return ReplayPlan(file, feeds, dict(found_info.seeds), length, found_info, params)


def _warn_other_net(file: str, recorded: Any, found: list[tuple[str, Node]],
                    ports: Mapping[str, Port]) -> None:
    """Log how the net differs from the one the recording was made with, if it does.

    The types of the replayed Outputs are checked (a mismatch is refused);
    this catches the rest: a recording replayed into another net whose types
    happen to match (other nodes, classes, ports or connections).
    """
    from .recorder import describe_net

    try:
        then: Any = json.loads(recorded) if isinstance(recorded, str) else {}
        before = {n["path"]: n for n in then["nodes"]}
        wired_before = {tuple(c) for c in then["connections"]}
    except (ValueError, TypeError, KeyError):
        return  # no description (an older file): nothing to compare
    now = describe_net(found, ports)
    after = {n["path"]: n for n in now["nodes"]}
    wired_after = {tuple(c) for c in now["connections"]}
    problems = []
    gone, new = sorted(set(before) - set(after)), sorted(set(after) - set(before))
    if gone:
        problems.append(f"nodes only in the recording: {', '.join(map(repr, gone))}")
    if new:
        problems.append(f"nodes only in this net: {', '.join(map(repr, new))}")
    for path in sorted(set(before) & set(after)):
        b, a = before[path], after[path]
        if b.get("class") != a["class"]:
            problems.append(f"{path or '<root>'!r} was a {b.get('class')}, is a {a['class']}")
        elif b.get("ports") != a["ports"]:
            problems.append(f"{path or '<root>'!r} ({a['class']}) has other ports")
    if wired_before != wired_after:
        problems.append(f"{len(wired_before ^ wired_after)} connection(s) differ")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more"
                                            if len(problems) > 5 else "")
        log.warning("replay of %s into another net than the one recorded: %s (the replayed "
                    "types match, so it runs; is it the net you meant?)", file, shown)


def warn_no_duration(replay: ReplayPlan, loop: bool, end_s: float | None) -> None:
    """Warn of a replay without ``duration`` (the CLI passes the recording's length).

    Once the recording ends the replaced nodes send nothing more, and the run
    goes on: on the simulated timer, with no periodic node left to run, time
    stands still there and `Run.join` never returns.

    Args:
        replay (ReplayPlan): the planned replay.
        loop (bool): ``Replay.loop`` (a loop has no end: no warning).
        end_s (float | None): the run's ``duration``.
    """
    if end_s is None and not loop:
        seconds = replay.length_ns / 1e9
        log.warning("replay of %s without duration: the recording ends at t = %g s, and the "
                    "run goes on after it (the replaced nodes send nothing more; on the "
                    "simulated timer with no periodic node left, time stands still and join() "
                    "never returns): pass duration=%g to end with the recording",
                    replay.path, seconds, seconds)


def _check_spec(file: str, output: Output, shape: list[int | None] | None,
                dtype: str | None) -> None:
    """Refuse a tensor Output whose declared shape or dtype is not the recorded one.

    Only where both the file and the net declare it: a recorded message of
    another shape or dtype would fail the stand-in's send.
    """
    mine = None if output.shape is None else list(output.shape)
    my_dtype = None if output.dtype is None else str(output.dtype).removeprefix("torch.")
    for what, recorded, declared in (("shape", shape, mine), ("dtype", dtype, my_dtype)):
        if recorded is not None and declared is not None and recorded != declared:
            raise ValueError(f"mujou.run: {file} recorded {output.path!r} with {what} "
                             f"{recorded}, but the net declares {declared}: is it the same "
                             "net?")


def _outputs(node: Node) -> list[Output]:
    """The node's own Outputs (not its children's), in the order it declares them."""
    return [p for p in node._mujou_ports().values() if isinstance(p, Output)]


class FileFeed(Feed):
    """The recorded messages of one replaced node, read from the file as they are sent.

    Each `open` makes a new pass over the file (`mcapfile.Reader.messages`,
    decoding only this node's channels), grouping the messages by their
    replay key; nothing but the group being read is held.

    Args:
        path (str): the recording.
        node (str): the replaced node's path (for the log).
        outputs (dict[str, Output]): its recorded Outputs, by path (topic).
        scale (float | None): None: the recorded keys as they are (the
            simulated timer); a speed: real time, ``(round(t_ns / speed), 0)``.
        loop_ns (int | None): start again after this many ns of recording
            (``loop``); None: once.
        exact (bool): the recording's timer was simulated: its keys only grow,
            unless a restart took its net back in time, and such groups are
            left out (logged once). A real-time recording's keys may step back
            where its threads interleaved; those groups go out at once.
        allow_damaged (bool): read a damaged file up to its damage. Default: False.
    """

    def __init__(self, path: str, node: str, outputs: dict[str, Output], *,
                 scale: float | None, loop_ns: int | None, exact: bool,
                 allow_damaged: bool = False) -> None:
        self.path = path
        self.node = node
        self.outputs = outputs
        self.scale = scale
        self.loop_ns = loop_ns
        self.exact = exact
        self.types = {topic: output.type for topic, output in outputs.items()}
        self.allow_damaged = allow_damaged

    def open(self, after: Key | None) -> Iterator[Group]:
        """The groups in key order (see `Feed.open`); reading starts at the first ``next``."""
        return self._groups(after)

    def _groups(self, after: Key | None) -> Iterator[Group]:
        if not self.outputs:
            return
        loop = self.loop_ns
        n = 0
        if loop is not None and after is not None and after[0] > 0:
            n = max(0, after[0] // loop - 1)  # the passes wholly before ``after`` are skipped
        last: Key | None = None
        warned = False
        while True:
            timed = False
            for group in self._pass(n):
                key = group[0]
                timed = timed or key != CONTROL_KEY
                if after is not None and (key <= after or key == CONTROL_KEY):
                    continue
                if last is not None and key <= last and self.exact:
                    if not warned:
                        warned = True
                        log.warning("replay of %r from %s: the recording goes back in time "
                                    "at t = %d ns (a restart of its run); what follows up to "
                                    "t = %d ns is not replayed", self.node, self.path, key[0],
                                    last[0])
                    continue
                last = key if last is None or key > last else last
                yield group
            n += 1
            if loop is None or not timed:  # once; or nothing to loop over
                return

    def _pass(self, n: int) -> Iterator[Group]:
        """One pass over the file, the ``n``-th: its times ``n * loop_ns`` later.

        What ``on_start`` sent (the control key) comes in the first pass only.
        """
        offset = 0 if self.loop_ns is None else n * self.loop_ns
        scale = self.scale
        outputs = self.outputs
        key: Key | None = None
        outs: list[Output] = []
        messages: list[Any] = []
        reader = Reader(self.path, self.types, allow_damaged=self.allow_damaged)
        for record in reader.messages(topics=outputs.__contains__):
            if record.t_ns < 0:
                if n:
                    continue
                here: Key = CONTROL_KEY
            else:
                t = record.t_ns + offset
                here = (t, record.delta) if scale is None else (round(t / scale), 0)
            if here != key:
                if key is not None:
                    yield key, outs, messages
                key, outs, messages = here, [], []
            outs.append(outputs[record.topic])
            messages.append(record.message)
        if key is not None:
            yield key, outs, messages
