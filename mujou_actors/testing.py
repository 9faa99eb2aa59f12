"""Helpers for a net's tests: regression tests against recordings, reproduced crashes, restores.

`assert_replay_matches` and `reproduce_failure` compare a rerun of a net with
a recording or a crash capsule (their code is in `mujou_actors.recording.checks`,
beside the files they read; see docs/recording.md); `check_restore` checks that
a net's state, cut and restored, goes on as if never cut (docs/state.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ._checks import is_number
from .node import Node
from .recording.checks import (
    Reproduction,
    Sent,
    assert_replay_matches,
    capturing,
    diff_values,
    plain_attributes,
    reproduce_failure,
    unsaved_attributes,
    when,
)

__all__ = ["assert_replay_matches", "reproduce_failure", "Reproduction", "check_restore",
           "RestoreCheck"]

# --------------------------------------------------------------------- restore checks

@dataclass(frozen=True)
class RestoreCheck:
    """What `check_restore` found: whether a restored run goes on as the uninterrupted one.

    Attributes:
        ok (bool): every message sent after the cut, and the final state, are
            equal (bit for bit) in the restored run and the uninterrupted one.
        at (float): the cut's time, seconds of the run's timer.
        node (str | None): the first node whose messages or final state differ
            (``""`` for the root); ``None`` when ``ok``.
        difference (str | None): the first difference in words (the port or
            state key, the time, a diff); ``None`` when ``ok``.
        unsaved (dict[str, tuple[str, ...]]): per node path, its attributes
            that changed during the run but are not in its ``state_dict()``: a
            restore (or a restart, or a capsule) cannot carry them. Listed
            whether or not they made a difference.
        compared (int): the messages compared.
        report (str): all of it in words.
    """

    ok: bool
    at: float
    node: str | None
    difference: str | None
    unsaved: dict[str, tuple[str, ...]]
    compared: int
    report: str

    def __str__(self) -> str:
        """The report."""
        return self.report


def check_restore(make_net: Callable[[], Node | list[Node] | dict[str, Node]], *,
                  at: float, duration: float, seed: int = 0, workers: int | None = 1,
                  timeout: float = 300.0, **run_kwargs: Any) -> RestoreCheck:
    """Check that the net's state, cut at ``at`` and restored, goes on as if never cut.

    Runs the net three times in simulated time, each on a fresh net from
    ``make_net``: once uninterrupted for ``duration`` seconds; once for
    ``at`` seconds, whose final state tree is the cut; and once restored from
    that tree (``mujou.run(state=...)``) for the rest. Every message the
    restored run sends (key and value) and its final state must equal the
    uninterrupted run's, bit for bit. State that a node keeps in a plain
    attribute (``self.k += 1``) is not in its default ``state_dict()`` and
    is lost on a restore, a restart or a capsule's reproduction: the check
    names such attributes (`RestoreCheck.unsaved`) and the first node whose
    messages or state then differ.

    Use it in a test::

        def test_the_rig_restores():
            found = mujou.testing.check_restore(make_rig, at=0.5, duration=1.0)
            assert found.ok, found

    Args:
        make_net (Callable[[], Node | list[Node] | dict[str, Node]]): makes a
            fresh net each time it is called, the same each time.
        at (float): the cut's time, seconds of the run's timer, > 0 and < ``duration``.
        duration (float): seconds of the uninterrupted run.
        seed (int): the run's seed (every run of the check uses it). Default: 0.
        workers (int, optional): worker threads. Default: 1.
        timeout (float): wall seconds for each run. Default: 300.
        **run_kwargs: other arguments of `mujou.run`, its deprecated keywords
            too (``record_view=``...): each warns once, with the
            `DeprecationWarning` `mujou.run` gives, and sets its field of
            ``record=``, ``replay=`` or ``placement=`` for every run of the check.

    Returns:
        RestoreCheck: what was found.

    Raises:
        ValueError: ``at`` not within (0, ``duration``); ``timer``, ``state``,
            ``duration`` or ``seed`` among ``run_kwargs``.
        TypeError / ValueError: a deprecated keyword that `mujou.run` refuses.
        NodeError: a run failed (its node's error, as `mujou.run` raises it).
        TimeoutError: a run did not end within ``timeout``.
    """
    from .run import _fold_run_kwargs

    for name in ("timer", "state", "duration", "seed"):
        if name in run_kwargs:
            raise ValueError(f"check_restore: it sets {name}= itself; leave it out")
    # Folded once, as mujou.run would: one warning, at the caller's line, for the three runs.
    run_kwargs = _fold_run_kwargs("check_restore", run_kwargs)
    if not (is_number(at) and is_number(duration) and 0 < at < duration):
        raise ValueError(f"check_restore: at must be a time within (0, duration); got "
                         f"at={at!r}, duration={duration!r}")
    settings: dict[str, Any] = dict(seed=seed, workers=workers, timeout=timeout,
                                    run_kwargs=run_kwargs)
    initial = plain_attributes(make_net())
    whole, whole_end, whole_nodes = _capture(make_net(), duration=duration, **settings)
    _, cut, _ = _capture(make_net(), duration=at, **settings)
    again, again_end, _ = _capture(make_net(), duration=duration - at, state=cut, **settings)
    cut_ns = int(cut["time_ns"])
    first: tuple[tuple[int, int], str, str] | None = None  # (key, node, text)
    compared = 0
    for topic, sent in whole.items():
        old = [s for s in sent if s.t_ns > cut_ns]
        new = [s for s in again.get(topic, []) if s.t_ns > cut_ns]
        for i in range(max(len(old), len(new))):
            a = old[i] if i < len(old) else None
            b = new[i] if i < len(new) else None
            compared += 1
            if a is not None and b is not None and (a.t_ns, a.delta) == (b.t_ns, b.delta):
                diff = diff_values(a.message, b.message)
                if diff is None:
                    continue
                diff = diff.replace(" in the recording", " uninterrupted").replace(
                    " in the rerun", " restored")
                text = f"{topic}, message {i} after the cut {when(a.t_ns, a.delta)}: {diff}"
            elif b is None:
                assert a is not None
                text = f"{topic}: the restored run did not send message {i} after the cut " \
                       f"{when(a.t_ns, a.delta)}"
            elif a is None:
                text = f"{topic}: the restored run sent an extra message {when(b.t_ns, b.delta)}"
            else:
                text = (f"{topic}, message {i} after the cut: sent {when(a.t_ns, a.delta)} "
                        f"uninterrupted, {when(b.t_ns, b.delta)} restored")
            key = min((s.t_ns, s.delta) for s in (a, b) if s is not None)
            if first is None or key < first[0]:
                first = (key, topic.rpartition(".")[0], text)
            break
    if first is None:
        for path in sorted(whole_end["nodes"]):
            diff = diff_values(whole_end["nodes"][path], again_end["nodes"].get(path),
                                f"{path or '<root>'}: state ")
            if diff is not None:
                first = ((0, 0), path, f"the final state differs: {diff}")
                break
    unsaved = unsaved_attributes(initial, whole_nodes, whole_end)
    return _restore_report(at, first, unsaved, compared)


def _capture(net: Node | list[Node] | dict[str, Node], *, duration: float, seed: int,
             workers: int | None, timeout: float, run_kwargs: Mapping[str, Any],
             state: Mapping[str, Any] | None = None,
             ) -> tuple[dict[str, list[Sent]], dict[str, Any], dict[str, Node]]:
    """Run once in simulated time: every Output's messages, the final tree, the nodes by path."""
    from ._runtime.build import Seams
    from .net import walk
    from .run import _start

    sent: dict[str, list[Sent]] = {}
    nodes = dict(walk(net))
    capture = capturing(sent, lambda topic: True, {})
    run = _start(net, seams=Seams(wire=capture), timer="simulated", duration=duration,
                 seed=None if state is not None else seed, workers=workers, state=state,
                 **run_kwargs)
    run.join(timeout)
    return sent, run.state_dict(), nodes



def _restore_report(at: float, first: tuple[tuple[int, int], str, str] | None,
                    unsaved: dict[str, tuple[str, ...]], compared: int) -> RestoreCheck:
    """The `RestoreCheck` of what `check_restore` found, with its report in words."""
    lost = "; ".join(f"{path or '<root>'}: {', '.join(names)}"
                     for path, names in unsaved.items())
    hint = (f" Attributes that changed during the run but are not in the node's "
            f"state_dict() (a restore loses them): {lost}. Keep them in tensors, or "
            f"extend state_dict()/load_state_dict() (docs/state.md).") if unsaved else ""
    if first is None:
        report = f"restored at t = {at:g} s, the run goes on as the uninterrupted one " \
                 f"({compared} messages compared)." + (hint and " But:" + hint)
        return RestoreCheck(True, at, None, None, unsaved, compared, report)
    node = first[1]
    mine = unsaved.get(node)
    blame = (f" Node {node or '<root>'!r} keeps {', '.join(mine)} outside its state_dict()."
             if mine else "")
    report = (f"restored at t = {at:g} s, the run differs from the uninterrupted one; the "
              f"first difference is in node {node or '<root>'!r}: {first[2]}.{blame}{hint}")
    return RestoreCheck(False, at, node, first[2], unsaved, compared, report)
