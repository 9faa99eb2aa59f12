"""What a run writes besides its state, filed and closed by one rule for every run.

A run in one process (`coordinator.Coordinator`) and a placed run
(`distributed.driver._Driver`) write the same outputs: the supervisor's
snapshot files, the recording (with the snapshots in it), the crash capsule,
the trace file, and the host's callbacks. Both file a snapshot with
`file_snapshot` and end with `close_outputs`, so the order the outputs close
in, and what a failure to write one does to the run, are decided here once:

1. the trace file (its records are complete once no hook runs);
2. the recording and the capsule, told the run's first failure;
3. the snapshot files (each complete or absent);
4. the host's queued callbacks (at most ``stop_timeout`` more; waiters woken).

An output that cannot be written is a failure of the run
(`errors.keep_end_failure`: ``join()`` raises it when it is the first, else
it is logged), never swallowed, and never keeps the outputs after it from
closing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import describe, keep_end_failure
from .protocols import CapsuleSide, HostSide, RecorderSide
from .snapshots import Snapshots

__all__ = ["close_outputs", "file_snapshot"]


def file_snapshot(snapshots: Snapshots, tree: dict[str, Any], took_s: float,
                  recorder: RecorderSide | None, capsule: CapsuleSide | None) -> None:
    """Keep a supervisor's snapshot, and put it into the run's recording and capsule.

    Args:
        snapshots (Snapshots): the run's snapshots (the file writer, the latest kept).
        tree (dict): the state tree taken at the cut.
        took_s (float): wall seconds the cut took (the snapshots' pause figures).
        recorder (RecorderSide | None): the run's recording, if it records.
        capsule (CapsuleSide | None): the run's crash capsule, if it keeps one.
    """
    snapshots.keep(tree, took_s)
    if recorder is not None:
        recorder.snapshot(tree)
    if capsule is not None:
        capsule.snapshot(tree)


def close_outputs(failures: list[BaseException], *, time_ns: int | None, stop_timeout: float,
                  trace: tuple[str, Callable[[], None]] | None = None,
                  recorder: RecorderSide | None = None, capsule: CapsuleSide | None = None,
                  snapshots: Snapshots | None = None, host: HostSide | None = None,
                  otherwise: BaseException | None = None, lock: Any = None) -> None:
    """Close a run's outputs in the order the module's docstring gives; no hook runs any more.

    Args:
        failures (list[BaseException]): the run's failures; an output that
            cannot be written is added (`errors.keep_end_failure`).
        time_ns (int | None): the run's time at its end (ns of its timer), for the
            recording; None when the end stopped short before it was read.
        stop_timeout (float): seconds each output may take to close.
        trace (tuple[str, Callable] | None): a traced run's file path and the
            function that writes it (raises an ``Exception`` when it cannot).
        recorder (RecorderSide | None): the run's recording.
        capsule (CapsuleSide | None): the run's crash capsule.
        snapshots (Snapshots | None): the supervisor's snapshots.
        host (HostSide | None): the host's side of the run's subscriptions.
        otherwise (BaseException | None): what the recording is told the run
            ended with when ``failures`` is empty (the trace written): a
            stop's stuck hooks, say. The first of ``failures`` otherwise.
        lock (optional): the lock that guards ``failures``.
    """
    if trace is not None:
        path, write = trace
        try:
            write()
        except Exception as exc:  # noqa: BLE001 - join() raises it, or it is logged
            keep_end_failure(failures, exc, f"could not write the trace file {path}", lock)
    failure = failures[0] if failures else otherwise
    reason = "" if failure is None else describe(failure)
    errors = []
    if recorder is not None:
        errors.append(recorder.close(time_ns, reason, stop_timeout))
    if capsule is not None:
        errors.append(capsule.close(stop_timeout))
    for error in errors:
        if error is not None:  # join() raises it, or it is logged (keep_end_failure)
            keep_end_failure(failures, error, "could not write the recording", lock)
    if snapshots is not None:
        snapshots.close(stop_timeout)  # each file is complete or absent
    if host is not None:
        host.close(stop_timeout)
