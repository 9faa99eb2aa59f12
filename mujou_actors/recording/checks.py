"""Regression tests against a recording or a crash capsule: rerun a net, compare its messages.

`assert_replay_matches` reruns a net in simulated time, with the seeds of a
recorded run (a *golden* file, ``mujou.run(record=...)``) and, if asked, some
of its nodes replaced by their recorded messages (``replace=``, see
docs/recording.md, "Replay"). It compares every channel of the file with what
the rerun sends on that Output, message by message: the key ``(t_ns, delta)``
of the hook that sent it and the message, bit for bit. On a difference it
raises `AssertionError` with the first divergence (the port, the time, the
message's index, a readable diff) and the count of differences per channel::

    from mujou_actors.testing import assert_replay_matches

    def test_the_pendulum_still_balances_as_recorded():
        assert_replay_matches("tests/golden/pendulum.mcap", make_net())

The rerun's messages are taken as they are sent (lossless, held by reference:
messages are read-only once sent), not through a recorder's bounded queue.
"""

from __future__ import annotations

import dataclasses
import math
import os
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .._checks import is_number
from ..errors import NodeError
from ..node import Node
from ..ports import Output

if TYPE_CHECKING:
    from .._runtime.actor import Actor
    from .._runtime.build import Wiring
    from ..devices import CudaRuntime
    from ..ports import Port
    from .mcapfile import Record, RecordingInfo



# How many differing channels the report lists, at most.
_LISTED = 10


@dataclass(frozen=True)
class Sent:
    """One message of a channel: its key, its message."""

    t_ns: int
    delta: int
    message: Any


def assert_replay_matches(golden: str | os.PathLike[str],
                          net: Node | list[Node] | dict[str, Node], *,
                          replace: Iterable[str] = (), seed: int | None = None,
                          workers: int | None = None, duration: float | None = None,
                          channels: Iterable[str] | None = None, timeout: float = 300.0,
                          **run_kwargs: Any) -> int:
    """Rerun ``net`` in simulated time and check that it sends what ``golden`` recorded.

    Every channel of the file (an Output of the recorded run) is compared with
    the same Output of the rerun: the same number of messages, each sent at
    the same ``(t_ns, delta)``, each bit-identical (tensors: dtype, shape and
    every byte; floats: every bit, so ``-0.0`` is not ``0.0`` and a NaN
    matches only the same NaN).

    Args:
        golden (str | os.PathLike): a recording of the net (``record=``), made
            with the simulated timer.
        net (Node | list[Node] | dict[str, Node]): a fresh net to rerun, as
            `mujou.run` takes it.
        replace (Iterable[str]): paths of nodes replaced by their recorded
            messages (a sensor, a simulator), as ``mujou.Replay(replace=)``.
            Default: none (the whole net runs).
        seed (int, optional): the run's seed; default None: the recorded run's
            seeds (each node's, from the file).
        workers (int, optional): worker threads (the result does not depend on
            them). Default: mujou's choice.
        duration (float, optional): seconds to rerun; default: the recording's
            length (its run's end time).
        channels (Iterable[str], optional): the Output paths to compare; default:
            every channel of the file.
        timeout (float): wall seconds the rerun may take; past them it is
            stopped and the assertion fails. Default: 300.
        **run_kwargs: more arguments of `mujou.run` (``inputs=``,
            ``supervisor=``, ``state=``...); not ``timer`` (always simulated)
            nor ``replay`` (the rerun replays ``golden``). `mujou.run`'s
            deprecated keywords warn as it does, and do what it does with them;
            those that set a field of ``replay=`` (``replay_speed=``...) are
            refused as ``replay=`` is.

    Returns:
        int: the number of messages compared.

    Raises:
        AssertionError: the rerun differs: its message names the first
            divergence (port, time in s and ns, delta cycle, index, a diff of
            the two messages) and counts the differences of every channel
            (messages that differ, are missing or extra). A rerun that fails
            (a node raises) or does not end within ``timeout`` is reported so
            too, with its error as the cause.
        ValueError: ``golden`` is not a usable golden file: recorded in real
            time, cut short, with messages dropped, or empty; a channel of
            ``channels`` is not in it; ``timer`` or ``replay`` among
            ``run_kwargs``, or a deprecated keyword that sets a field of ``replay``.
        TypeError / ValueError: another deprecated keyword that `mujou.run` refuses.
        RecordingError: ``golden`` is not a mujou recording, or is damaged.
        FileNotFoundError: there is no such file.
    """
    from ..run import _fold_run_kwargs
    from .mcapfile import info as read_info

    if "timer" in run_kwargs:
        raise ValueError("assert_replay_matches: the rerun is always in simulated time; "
                         "leave out timer=")
    if "replay" in run_kwargs:
        raise ValueError("assert_replay_matches: the rerun replays golden itself; leave out "
                         "replay= (replace= names the nodes it replaces)")
    run_kwargs = _fold_run_kwargs("assert_replay_matches", run_kwargs, owned=("replay",))
    path = os.fspath(golden)
    found = read_info(path)
    _check_golden(path, found)
    topics = [c.topic for c in found.channels]
    if channels is not None:
        wanted = list(channels)
        unknown = [c for c in wanted if c not in topics]
        if unknown:
            raise ValueError(f"assert_replay_matches: {path} has no channel "
                             f"{', '.join(map(repr, unknown))} (its channels: "
                             f"{', '.join(topics)})")
        topics = wanted
    if duration is None:
        from .replay import recording_length

        duration = recording_length(found) / 1e9
    sent, ports, failure = _rerun(path, net, list(replace), topics, seed=seed,
                                  workers=workers, duration=duration, timeout=timeout,
                                  run_kwargs=run_kwargs)
    golden_failure = (found.end or {}).get("failure", "")
    types = {t: p.type for t, p in ports.items() if isinstance(p, Output)}
    report = _compare(path, topics, sent, types, ports)
    if failure is not None and not (golden_failure and golden_failure == str(failure)):
        lines = [f"the rerun of {path} failed: {failure}"]
        if report.problem:
            lines.append("before that it differed: " + report.problem)
        raise AssertionError("\n".join(lines)) from failure
    if report.problem:
        raise AssertionError(report.problem + _numerics_hint(found))
    return report.compared


def _numerics_hint(found: RecordingInfo) -> str:
    """Why a golden file may differ here in the last bits: other kernels than recorded ('')."""
    from .. import devices
    from .mcapfile import parse_json

    try:
        recorded = parse_json(found.run.get("numerics", ""))
    except ValueError:  # a file of an older version (or a bad one): nothing to compare
        return ""
    here = devices.numerics()
    keys = ("cpu", "cpu_capability", "mkl_cbwr", "aten_cpu_capability")
    if not isinstance(recorded, dict) or all(recorded.get(k, "") == here[k] for k in keys):
        return ""

    def said(facts: Mapping[str, Any]) -> str:
        return (f"{facts.get('cpu') or 'an unnamed processor'} (torch's kernels "
                f"{facts.get('cpu_capability', '?')}, MKL_CBWR={facts.get('mkl_cbwr') or 'unset'}"
                f", ATEN_CPU_CAPABILITY={facts.get('aten_cpu_capability') or 'unset'})")

    return (f"\nnote: {found.path} was recorded on {said(recorded)} and rerun on {said(here)}. "
            "torch and MKL choose their CPU kernels by the processor, and kernels of another "
            "width round in the last bit: to compare across machines, record and rerun with "
            "MKL_CBWR=COMPATIBLE (and ATEN_CPU_CAPABILITY=default) set before the first "
            "tensor operation, or record the golden file on this machine "
            "(docs/recording.md, 'Golden files across machines').")


def _check_golden(path: str, found: RecordingInfo) -> None:
    """Refuse a file that cannot serve as a golden file (see `assert_replay_matches`)."""
    from .capsule import capsule_facts

    if capsule_facts(found.end, path) is not None:
        raise ValueError(f"assert_replay_matches: {path} is a crash capsule (a window of a "
                         "run that failed, from a snapshot), not a golden file: check it "
                         "with mujou.testing.reproduce_failure")
    timer = found.run.get("timer", "simulated")
    if timer != "simulated":
        raise ValueError(f"assert_replay_matches: {path} was recorded with the {timer} timer; "
                         "a golden file is recorded in simulated time (timer='simulated'), "
                         "whose runs repeat bit for bit")
    if not found.complete:
        raise ValueError(f"assert_replay_matches: {path} was cut short (it ends at byte "
                         f"{found.cut_at}): a golden file is a recording that was closed")
    dropped = {c: n for c, n in found.drops.items() if n}
    if dropped:
        listed = ", ".join(f"{c} {n}" for c, n in sorted(dropped.items()))
        raise ValueError(f"assert_replay_matches: {path} dropped messages while it was "
                         f"recorded ({listed}): record it again with a larger queue")
    if not found.messages:
        raise ValueError(f"assert_replay_matches: {path} holds no message: nothing to compare")


def capturing(sent: dict[str, list[Sent]], wanted: Callable[[str], bool],
               seen_ports: dict[str, Port]) -> Callable[..., Wiring]:
    """A ``wire`` seam that keeps every message of the wanted Outputs in ``sent``, by path.

    Also puts the net's ports in ``seen_ports``.
    """
    from .._runtime.build import wire

    def capture(actors: list[Actor], ports: dict[str, Port], dispatcher: Any,
                rt: CudaRuntime | None) -> Wiring:
        wiring = wire(actors, ports, dispatcher, rt)
        seen_ports.update(ports)
        for topic, port in ports.items():
            if wanted(topic) and isinstance(port, Output):
                actor = wiring.actor_of[id(port.node)]
                out = sent.setdefault(topic, [])

                # On the sending thread, inside the hook: its key is the sender's stamp.
                # The message is kept as sent (read-only once sent).
                def listener(message: Any, actor: Actor = actor, out: list[Sent] = out) -> None:
                    t_ns, delta = actor.stamp
                    out.append(Sent(t_ns, delta, message))

                wiring.listen(port, listener)
        return wiring

    return capture


def _rerun(path: str, net: Node | list[Node] | dict[str, Node], replace: list[str],
           topics: list[str], *, seed: int | None, workers: int | None, duration: float,
           timeout: float, run_kwargs: Mapping[str, Any],
           ) -> tuple[dict[str, list[Sent]], dict[str, Port], BaseException | None]:
    """Run the net once in simulated time; every message of ``topics`` with its key.

    Returns:
        The messages by Output path, the net's ports by path, and the run's
        failure (None if it did not fail).
    """
    from .._runtime.build import Seams
    from ..run import _start  # run.py imports nothing of this module (it is above it)
    from .replay import Replay
    sent: dict[str, list[Sent]] = {t: [] for t in topics}
    seen_ports: dict[str, Port] = {}
    capture = capturing(sent, set(topics).__contains__, seen_ports)
    run = _start(net, seams=Seams(wire=capture), timer="simulated", duration=duration,
                 seed=seed, workers=workers, replay=Replay(path, replace=replace), **run_kwargs)
    failure: BaseException | None = None
    try:
        run.join(timeout)
    except NodeError as exc:
        failure = exc
    except TimeoutError as exc:
        run.stop()
        failure = exc
    return sent, seen_ports, failure


@dataclass
class _Report:
    """What `_compare` found: the message to raise (None: no difference), the count compared."""

    problem: str | None
    compared: int


def _compare(path: str, topics: list[str], sent: Mapping[str, list[Sent]],
             types: Mapping[str, type], ports: Mapping[str, Port]) -> _Report:
    """Compare the golden file's channels with the rerun's messages."""
    from .mcapfile import Reader

    recorded: dict[str, list[Record]] = {t: [] for t in topics}
    for record in Reader(path, types).messages(topics=recorded.__contains__):
        recorded[record.topic].append(record)
    first: tuple[tuple[int, int], str] | None = None  # ((t, delta), the divergence's text)
    counts: dict[str, str] = {}
    compared = 0
    for topic in topics:
        old, new = recorded[topic], sent.get(topic, [])
        if topic not in ports or not isinstance(ports[topic], Output):
            counts[topic] = f"the net has no Output {topic!r} ({len(old)} message(s) missing)"
            key = (old[0].t_ns, old[0].delta) if old else (0, 0)
            text = f"{topic}: the net has no such Output; {path} recorded {len(old)} message(s)"
            first = min(first, (key, text)) if first is not None else (key, text)
            continue
        differ = 0
        mine: tuple[tuple[int, int], str] | None = None
        for i, (a, b) in enumerate(zip(old, new, strict=False)):
            compared += 1
            diff = _diff_sent(a, b)
            if diff is None:
                continue
            differ += 1
            if mine is None:
                key = min((a.t_ns, a.delta), (b.t_ns, b.delta))
                mine = (key, f"{topic}, message {i} {when(a.t_ns, a.delta)}:\n  {diff}")
        extra = len(new) - len(old)
        if extra and mine is None:
            i = min(len(old), len(new))
            if extra > 0:
                b = new[i]
                mine = ((b.t_ns, b.delta), f"{topic}, message {i} {when(b.t_ns, b.delta)}: "
                        f"the rerun sent it, {path} has no such message (it recorded {len(old)})")
            else:
                a = old[i]
                mine = ((a.t_ns, a.delta), f"{topic}, message {i} {when(a.t_ns, a.delta)}: "
                        f"{path} recorded it, the rerun did not send it (it sent {len(new)})")
        if differ or extra:
            parts = [f"{differ} message(s) differ"] if differ else []
            if extra > 0:
                parts.append(f"{extra} extra (the rerun sent {len(new)}, {len(old)} recorded)")
            elif extra < 0:
                parts.append(f"{-extra} missing (the rerun sent {len(new)}, "
                             f"{len(old)} recorded)")
            counts[topic] = ", ".join(parts)
        if mine is not None and (first is None or mine[0] < first[0]):
            first = mine
    if first is None:
        return _Report(None, compared)
    listed = [f"  {topic}: {text}" for topic, text in list(counts.items())[:_LISTED]]
    if len(counts) > _LISTED:
        listed.append(f"  ... and {len(counts) - _LISTED} more channel(s)")
    return _Report(f"the rerun differs from {path}; the first divergence is at "
                   f"{first[1]}\ndifferences by channel:\n" + "\n".join(listed), compared)


def when(t_ns: int, delta: int) -> str:
    """A send's key in words: ``(t = 0.012000000 s = 12000000 ns, delta 0)``."""
    if t_ns < 0:
        return "(on_start, before the timer started)"
    return f"(t = {t_ns / 1e9:.9f} s = {t_ns} ns, delta {delta})"


def _diff_sent(a: Record, b: Sent) -> str | None:
    """How the recorded send ``a`` and the rerun's ``b`` differ, in words; None if they do not."""
    problems = []
    if (a.t_ns, a.delta) != (b.t_ns, b.delta):
        problems.append(f"sent {when(a.t_ns, a.delta)} in the recording, "
                        f"{when(b.t_ns, b.delta)} in the rerun")
    diff = diff_values(a.message, b.message)
    if diff is not None:
        problems.append(diff)
    return "; ".join(problems) if problems else None


def diff_values(recorded: Any, rerun: Any, where: str = "") -> str | None:
    """How two messages differ, bit for bit, in words; None when they are identical.

    Tensors: dtype, shape, then the bytes; a difference says the largest
    absolute difference and the first differing element, with its index.
    Containers are walked (the first differing item is named by its path,
    ``[1]['v']``); other values compare by type and value (floats by their
    bits), and a difference shows the repr of both.

    Args:
        recorded (Any): the golden file's message.
        rerun (Any): the rerun's.
        where (str): the path of these values inside the message.

    Returns:
        str | None: the first difference, or None.
    """
    at = f" at {where}" if where else ""
    if isinstance(recorded, torch.Tensor) or isinstance(rerun, torch.Tensor):
        if not (isinstance(recorded, torch.Tensor) and isinstance(rerun, torch.Tensor)):
            return (f"a {type(recorded).__name__} in the recording, a "
                    f"{type(rerun).__name__} in the rerun{at}: {_short(recorded)} vs "
                    f"{_short(rerun)}")
        return _diff_tensors(recorded, rerun, at)
    if type(recorded) is not type(rerun):
        return (f"a {type(recorded).__name__} in the recording, a {type(rerun).__name__} "
                f"in the rerun{at}: {_short(recorded)} vs {_short(rerun)}")
    if isinstance(recorded, (list, tuple)):
        if len(recorded) != len(rerun):
            return (f"{len(recorded)} items in the recording, {len(rerun)} in the rerun{at}: "
                    f"{_short(recorded)} vs {_short(rerun)}")
        for i, (x, y) in enumerate(zip(recorded, rerun, strict=True)):
            diff = diff_values(x, y, f"{where}[{i}]")
            if diff is not None:
                return diff
        return None
    if isinstance(recorded, dict):
        if list(recorded) != list(rerun):
            return (f"keys {list(recorded)!r} in the recording, {list(rerun)!r} in the "
                    f"rerun{at}")
        for k in recorded:
            diff = diff_values(recorded[k], rerun[k], f"{where}[{k!r}]")
            if diff is not None:
                return diff
        return None
    if isinstance(recorded, float):
        same = struct.pack("<d", recorded) == struct.pack("<d", rerun)
    else:
        try:
            same = bool(recorded == rerun)
        except Exception:  # noqa: BLE001 - a value that cannot say: compare its repr
            same = repr(recorded) == repr(rerun)
    if same:
        return None
    extra = ""
    if is_number(recorded) and math.isfinite(recorded) and math.isfinite(rerun):
        extra = f" (difference {rerun - recorded!r})"
    return f"{recorded!r} in the recording, {rerun!r} in the rerun{at}{extra}"


def _diff_tensors(a: torch.Tensor, b: torch.Tensor, at: str) -> str | None:
    """`diff_values` for two tensors: dtype, shape, then the bits of every element."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return (f"a tensor of shape {tuple(a.shape)} {_dtype(a)} in the recording, "
                f"{tuple(b.shape)} {_dtype(b)} in the rerun{at}")
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.numel() == 0:
        return None
    if a.dtype.is_floating_point or a.dtype.is_complex:
        # Bit for bit: the same bytes (NaNs and signed zeros included).
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64,
                16: torch.int64}[a.element_size()]
        va, vb = a.contiguous().view(bits), b.contiguous().view(bits)
        if a.element_size() == 16:  # complex128: two int64 per element
            va, vb = va.reshape(*a.shape, 2), vb.reshape(*b.shape, 2)
            differs = (va != vb).any(-1)
        else:
            differs = va != vb
    else:
        differs = a != b
    if not bool(differs.any()):
        return None
    flat = int(differs.reshape(-1).nonzero()[0])
    index = tuple(int(i) for i in _unravel(flat, tuple(a.shape)))
    n = int(differs.sum())
    x, y = a.reshape(-1)[flat].item(), b.reshape(-1)[flat].item()
    text = (f"a tensor of shape {tuple(a.shape)} {_dtype(a)}{at}: {n} of {a.numel()} "
            f"element(s) differ")
    if a.dtype != torch.bool and not a.dtype.is_complex:
        delta = (b.double() - a.double()).abs()
        delta = delta[differs]
        text += f", max abs difference {float(delta.max())!r}"
    return text + f"; the first at index {list(index)}: {x!r} in the recording, {y!r} in the rerun"


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    """The index of element ``flat`` of a C-ordered tensor of ``shape``."""
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return list(reversed(index))


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _short(value: Any, limit: int = 80) -> str:
    """A repr of at most ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# -- crash capsules ----------------------------------------------------------------------

_MARGIN_NS = 1_000_000  # the rerun goes 1 ms past the failure's time: room to see it or not


@dataclass(frozen=True)
class Reproduction:
    """What a rerun of a crash capsule did (`reproduce_failure`).

    Attributes:
        capsule (str): the capsule's path.
        reproduced (bool): the rerun failed as the capsule says: the same
            node, hook, time and delta cycle, exception class and message.
        recorded (dict[str, Any]): the capsule's failure: ``node``, ``hook``,
            ``t_ns``, ``delta``, ``exception`` (module and qualified name),
            ``message``, ``snapshot_ns`` (the time the rerun starts from; -1:
            the run's start).
        rerun (dict[str, Any] | None): the rerun's first failure, with the
            same keys; None if it ran past the failure's time without one.
        error (BaseException | None): what the rerun raised (a `NodeError`,
            or another error of the run), None if it did not fail.
        diverged (str | None): the first message of the capsule that the
            rerun sent otherwise (or not at all) before the failure, in words;
            None when every one compared is the same. Messages are compared
            for a capsule of a simulated run, on its channels that lost none.
        summary (str): one line: ``reproduced: ...`` or ``not reproduced: ...``.
    """

    capsule: str
    reproduced: bool
    recorded: dict[str, Any]
    rerun: dict[str, Any] | None
    error: BaseException | None
    diverged: str | None
    summary: str


def reproduce_failure(capsule: str | os.PathLike[str],
                      net: Node | list[Node] | dict[str, Node], *,
                      replace: Iterable[str] = (), workers: int | None = None,
                      timeout: float = 300.0, **run_kwargs: Any) -> Reproduction:
    """Rerun ``net`` from a crash capsule's snapshot and check that the same failure happens.

    The capsule (``mujou.run(record_on_failure=...)``) holds the state of the
    net at a snapshot, every message sent since, and the run's first failure.
    The rerun restores that state (``state=``, the recorded seeds in it) and
    runs in simulated time to 1 ms past the failure's time. In simulated time
    a deterministic net fails again at the same node, hook, time and delta
    cycle, with the same exception, whatever ``workers``. Nodes named in
    ``replace`` do not run: their messages come from the capsule, as a replay
    (docs/recording.md, "Replay"), for nodes that cannot run here (a camera,
    a robot).

    A capsule of a real-time run is rerun in simulated time too: it then
    starts from the same state, but the timing of the real run is not
    repeated, and the failure may not come back.

    Args:
        capsule (str | os.PathLike): the capsule file.
        net (Node | list[Node] | dict[str, Node]): a fresh net, built as the
            failing run's was.
        replace (Iterable[str]): paths of nodes whose messages come from the
            capsule. Default: none.
        workers (int, optional): the rerun's worker threads. Default: mujou's choice.
        timeout (float): wall seconds for the rerun. Default: 300.
        **run_kwargs: other arguments of `mujou.run` (``supervisor=``, ...).
            Its deprecated keywords warn as it does, and do what it does with
            them; those that set a field of ``record=`` or ``replay=``
            (``record_ports=``, ``replay_loop=``...) are refused as those are.

    Returns:
        Reproduction: whether the failure came back, with both failures.

    Raises:
        ValueError: the file is a recording but no crash capsule; ``timer``,
            ``state``, ``duration``, ``record_on_failure``, ``record`` or
            ``replay`` among ``run_kwargs``, or a deprecated keyword that sets a
            field of ``record`` or ``replay``.
        TypeError / ValueError: another deprecated keyword that `mujou.run` refuses.
        RecordingError: the file is not a mujou recording, or is damaged (a
            capsule cut short, its failure's facts or its snapshot bad).
        FileNotFoundError: there is no such file.
        TimeoutError: the rerun did not end within ``timeout``.
    """
    import tempfile

    from ..errors import RecordingError
    from ..run import _fold_run_kwargs, run
    from .capsule import Capsule, capsule_facts
    from .mcapfile import Reader
    from .mcapfile import info as read_info
    from .replay import Replay

    for name in ("timer", "state", "duration", "record_on_failure", "record", "replay"):
        if name in run_kwargs:
            raise ValueError(f"reproduce_failure: the capsule sets {name}=; leave it out")
    # Folded here, not by run(): its warnings would name this file's line, and an old
    # keyword of record= or replay= would change the rerun's own recording or replay.
    run_kwargs = _fold_run_kwargs("reproduce_failure", run_kwargs, owned=("record", "replay"))
    path = os.fspath(capsule)
    found = read_info(path)
    recorded = capsule_facts(found.end, path)
    if recorded is None and found.run.get("capsule") == "1":
        raise RecordingError(path, "a crash capsule without its failure (its mujou.end "
                             f"record): cut short at byte {found.cut_at}")
    if recorded is None:
        raise ValueError(f"reproduce_failure: {path} is a recording, not a crash capsule "
                         "(mujou.run(record_on_failure=...) writes those)")
    start_ns = int(recorded["snapshot_ns"])
    tree = None
    if start_ns >= 0:
        name = f"snapshot-{start_ns}.mujou"
        for attachment, data in Reader(path).attachments():
            if attachment.name == name:
                tree = _capsule_tree(path, name, data, start_ns)
        if tree is None:
            raise ValueError(f"reproduce_failure: {path} lacks its snapshot "
                             f"{name} (a damaged capsule)")
    t_fail = int(recorded["t_ns"])
    duration = 0.0 if t_fail < 0 else (t_fail - max(start_ns, 0) + _MARGIN_NS) / 1e9
    replaced = list(replace)
    seed_arg = found.run.get("seed", "")
    from ..net import walk

    initial = plain_attributes(net)  # to name what changed outside the state, if it differs
    with tempfile.TemporaryDirectory(prefix="mujou-reproduce-") as folder:
        again = os.path.join(folder, "rerun.mcap")
        sent = os.path.join(folder, "sent.mcap")  # every message of the rerun, to compare
        error: BaseException | None = None
        try:
            live = run(net, timer="simulated", duration=duration, workers=workers, state=tree,
                       seed=int(seed_arg) if tree is None and seed_arg else None,
                       record_on_failure=Capsule(again), record=sent,
                       # (also without replaced nodes: its parameter sets are queued)
                       replay=Replay(path, replace=replaced),
                       **run_kwargs)
        except Exception as exc:  # noqa: BLE001 - an on_start failing: the answer
            error = exc
        else:
            try:
                live.join(timeout)
            except TimeoutError as exc:
                if live.running:  # not ended: stopped, and said so
                    live.stop()
                    raise
                error = exc  # a StopTimeoutError: the run ended with a stuck hook
            except Exception as exc:  # noqa: BLE001 - the rerun's failure is the answer
                error = exc
        rerun = capsule_facts(read_info(again).end, again) if os.path.exists(again) else None
        timer = found.run.get("timer", "")
        diverged = None
        if timer == "simulated" and os.path.exists(sent):
            until = t_fail if rerun is None else min(t_fail, int(rerun["t_ns"]))
            diverged = _first_divergence(path, sent, set(found.drops), until)
    found_repro = _reproduction(path, timer, recorded, rerun, error, diverged)
    unsaved = unsaved_attributes(initial, dict(walk(net)), tree)
    if found_repro.reproduced or not unsaved:
        return found_repro
    lost = "; ".join(f"{p or '<root>'}: {', '.join(names)}" for p, names in unsaved.items())
    return dataclasses.replace(found_repro, summary=(
        f"{found_repro.summary}; attributes that changed during the rerun but are not in "
        f"their node's state_dict() (the capsule's snapshot cannot hold them): {lost}"))


def _capsule_tree(path: str, name: str, data: bytes, start_ns: int) -> dict[str, Any]:
    """The state tree of a capsule's snapshot attachment; RecordingError if it is none."""
    from .. import snapshot
    from ..errors import RecordingError, SnapshotError
    from ..state import check_tree

    try:
        tree = check_tree(snapshot.loads(data), name)
    except SnapshotError as e:
        raise RecordingError(path, f"its snapshot does not read: {e}") from e
    if tree["time_ns"] != start_ns:
        raise RecordingError(path, f"its snapshot {name} is of t = {tree['time_ns']} ns")
    return tree


def _first_divergence(capsule: str, sent: str, lossy: set[str], until: int) -> str | None:
    """The capsule's first message (by key) that the rerun sent otherwise, up to ``until``."""
    from .mcapfile import read

    def by_topic(file: str) -> dict[str, list[Record]]:
        out: dict[str, list[Record]] = {}
        for r in read(file):
            if r.topic not in lossy and r.t_ns <= until:
                out.setdefault(r.topic, []).append(r)
        return out

    kept, again = by_topic(capsule), by_topic(sent)
    first: tuple[tuple[int, int], str] | None = None
    for topic, records in kept.items():
        theirs = again.get(topic, [])
        for i, r in enumerate(records):
            if i >= len(theirs):
                why = f"{topic}, message {i} of the capsule: the rerun did not send it"
            elif (theirs[i].t_ns, theirs[i].delta) != (r.t_ns, r.delta):
                why = (f"{topic}, message {i} of the capsule: sent {when(r.t_ns, r.delta)} "
                       f"in the run, {when(theirs[i].t_ns, theirs[i].delta)} in the rerun")
            else:
                diff = diff_values(r.message, theirs[i].message)
                if diff is None:
                    continue
                why = f"{topic}, message {i} of the capsule {when(r.t_ns, r.delta)}: {diff}"
            if first is None or (r.t_ns, r.delta) < first[0]:
                first = ((r.t_ns, r.delta), why)
            break
    return None if first is None else first[1]


def _reproduction(path: str, timer: str, recorded: dict[str, Any],
                  rerun: dict[str, Any] | None, error: BaseException | None,
                  diverged: str | None) -> Reproduction:
    """Compare the recorded failure (and the messages before it) with the rerun's; the summary."""
    keys = ("node", "hook", "t_ns", "delta", "exception", "message")

    def said(f: Mapping[str, Any]) -> str:
        t = int(f["t_ns"])
        when = "before the timer started" if t < 0 else \
            f"at t = {t / 1e9:.9f} s ({t} ns), delta {f['delta']}"
        return (f"{f['exception'].rpartition('.')[2]}({f['message']!r}) in "
                f"{f['node'] or '<root>'}.{f['hook']} {when}")

    hint = "" if diverged is None else (
        f"; before it, the rerun first differs from the capsule at {diverged} (if the net "
        "is the one that failed: does every node's state_dict hold all of its state, its "
        "generator included? call super().state_dict())")
    if rerun is not None and all(rerun.get(k) == recorded.get(k) for k in keys) \
            and diverged is None:
        return Reproduction(path, True, recorded, rerun, error, None,
                            f"reproduced: {said(rerun)}")
    if rerun is not None and all(rerun.get(k) == recorded.get(k) for k in keys):
        why = "the same failure, but the messages before it differ"
    elif rerun is None:
        why = ("the rerun ran past the failure's time without a failure" if error is None
               else f"the rerun failed otherwise: {error}")
    else:
        differ = ", ".join(k for k in keys if rerun.get(k) != recorded.get(k))
        why = f"the rerun failed with {said(rerun)} ({differ} differ)"
    if timer == "realtime":
        why += " (the capsule is of a real-time run: its timing is not repeated)"
    return Reproduction(path, False, recorded, rerun, error, diverged,
                        f"not reproduced: {said(recorded)} in the capsule; {why}{hint}")


# ------------------------------------------------ state kept outside state_dict()

# What a node keeps by default in its state_dict (Node.state_dict), not a plain attribute.
_DEFAULT_STATE = (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)


def _plain(node: Node) -> dict[str, Any]:
    """A node's plain attributes: not the framework's, ports, children, default state or
    synchronizers (a tree's ``sync`` section holds them)."""
    from ..ports import Port
    from ..sync import Synchronizer

    return {name: value for name, value in vars(node).items()
            if not name.startswith("_mujou_")
            and not isinstance(value, (Node, Port, Synchronizer, *_DEFAULT_STATE))}


def plain_attributes(net: Node | list[Node] | dict[str, Node]) -> dict[str, dict[str, Any]]:
    """Each node's plain attributes (`_plain`), copied, by path."""
    from ..net import walk

    return {path: {name: _frozen(value) for name, value in _plain(node).items()}
            for path, node in walk(net)}


def _frozen(value: Any) -> Any:
    """A copy of ``value`` that later changes to it do not reach (or the value itself)."""
    import copy

    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - not copyable: compared as it is
        return value


def _same(a: Any, b: Any) -> bool:
    """Whether two attribute values are equal; a comparison that fails counts as different."""
    try:
        return diff_values(a, b) is None
    except Exception:  # noqa: BLE001 - any object: no answer is no proof of equality
        try:
            return bool(a == b)
        except Exception:  # noqa: BLE001
            return False


def unsaved_attributes(initial: Mapping[str, Mapping[str, Any]], nodes: Mapping[str, Node],
             tree: Mapping[str, Any] | None) -> dict[str, tuple[str, ...]]:
    """Per node: plain attributes that changed during the run and are not keys of its state.

    The keys are those of the node's entry in ``tree`` (a state tree the run
    took: its ``state_dict()`` as the node wrote it); none without a tree.
    """
    found: dict[str, tuple[str, ...]] = {}
    entries = tree["nodes"] if tree is not None else {}
    for path, node in nodes.items():
        saved = set(entries.get(path) or ())
        before = initial.get(path, {})
        changed = tuple(sorted(
            name for name, value in _plain(node).items()
            if name not in saved and not (name in before and _same(before[name], value))))
        if changed:
            found[path] = changed
    return found
