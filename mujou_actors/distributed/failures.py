"""What can stop a placed run's rounds, as the driver's supervisor takes it.

A group's reply names a hook's failure (`Failed`); a group's process ends
unasked or its machine is lost (`GroupLost`, from a `system.GroupExit` or a
`Lost` of the heartbeat); the groups do not answer a grant within the end's
bound (`Stuck`). The rounds (`rounds.SimulatedRounds`, `realtime.RealTimeRelay`)
raise them, and the driver (`driver._Driver`) hands them to the supervisor.
`node_error` turns a group's report of a failure into the `NodeError` the host
raises, with the group's traceback as its cause (`RemoteTraceback`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from ..errors import AlgebraicLoopError, GroupDied, NodeError

__all__ = ["Failed", "GroupLost", "Lost", "RemoteTraceback", "Stuck", "args_of", "node_error",
           "failed_in", "reported_by"]


class Failed(Exception):
    """A group reported a hook's failure: the supervisor decides (`Recovery.recover`).

    Args:
        error (NodeError): the host's error for it (`node_error`).
        group (str): the group it failed in.
        node (str): the failed node's path.
        others (list[Failed] | None): the other hooks that failed in the same
            round (the same delta cycle, in any group), each the supervisor's
            to handle as one process handles each failure; None: none.
        restartable (bool): False for a failure no supervisor restarts the
            node for: a missed budget or deadline with ``on_miss="stop"``
            (the group's report says so: `group.failure_of`), as in one
            process (`Coordinator.hook_failed`). Default: True.
    """

    def __init__(self, error: NodeError, group: str, node: str,
                 others: list[Failed] | None = None, restartable: bool = True) -> None:
        super().__init__(str(error))
        self.error = error
        self.group = group
        self.node = node
        self.others = others or []
        self.restartable = restartable


def failed_in(reported: list[tuple[str, Mapping[str, Any]]]) -> Failed | None:
    """One `Failed` for every failure the groups reported in a round, oldest first, or
    None. ``reported``: ``(group, failure)`` pairs (`reported_by`)."""
    failed = []
    for group, failure in reported:
        err = node_error(group, failure)
        failed.append(Failed(err, group, err.path,
                             restartable=bool(failure.get("restartable", True))))
    if not failed:
        return None
    first = failed[0]
    first.others = failed[1:]
    return first


def reported_by(group: str, reply: Any) -> list[tuple[str, Mapping[str, Any]]]:
    """The failures a group's reply (`dataplane.Reply`) reports, as `failed_in` takes them."""
    if reply.failure is None:
        return []
    return [(group, f) for f in [reply.failure, *reply.more_failures]]


class Stuck(Exception):
    """Groups did not answer a grant within the stop's bound.

    Args:
        busy (dict[str, str]): the hooks in flight, ``{path: "hook (in group 'g')"}``.
    """

    def __init__(self, busy: dict[str, str]) -> None:
        super().__init__(f"groups still running a grant: {sorted(busy)}")
        self.busy = busy


class Lost(NamedTuple):
    """A group on another machine that the heartbeat lost (as `system.GroupExit` reads)."""

    group: str
    pid: int
    reason: str


class GroupLost(Exception):
    """A group process ended unasked, or its machine was lost.

    Args:
        exit_ (system.GroupExit | Lost): which group, its pid (0: never
            reported), and why.
    """

    def __init__(self, exit_: Any) -> None:
        pid = f" (pid {exit_.pid})" if exit_.pid else ""  # 0: it never reported one
        super().__init__(f"group {exit_.group!r}{pid} died: {exit_.reason}")
        self.exit = exit_


def args_of(err: BaseException, note: str) -> tuple[Any, ...]:
    """The constructor arguments of a copy of ``err`` with ``note`` added to its message."""
    if isinstance(err, NodeError):
        return (err.path, err.hook, f"{err} ({note})")
    if isinstance(err, GroupDied):
        return (err.group, err.pid, f"{err.reason} ({note})")
    return (f"{err} ({note})",)


def node_error(group_name: str, failure: Mapping[str, Any]) -> NodeError:
    """The host's NodeError for a group's failure, with the remote traceback as its cause.

    Args:
        group_name (str): the group that reported it.
        failure (Mapping): `group.failure_of`'s report: ``path``, ``hook``,
            ``message``, ``type``, ``traceback``, and ``loop`` for an
            `AlgebraicLoopError` (which the host raises as that type).
    """
    err = NodeError(failure["path"], failure["hook"],
                    f"{failure['message']} (in group {group_name!r})")
    if "loop" in failure:  # an AlgebraicLoopError: the same type on the host
        nodes, time_ns, delta, loop = failure["loop"]
        err = AlgebraicLoopError(list(nodes), time_ns, delta, loop, group=group_name)
    err.__cause__ = RemoteTraceback(failure["type"], failure["traceback"])
    return err


class RemoteTraceback(Exception):
    """An exception raised in another process: its type's name and its traceback as text."""

    def __init__(self, type_name: str, text: str) -> None:
        super().__init__(f"{type_name} in a group process:\n{text}")
        self.type_name = type_name
        self.traceback = text
