"""What a start of groups that failed raises: one error per group, then one for the start.

`ProcessSystem.start_groups` is all or nothing: each group whose start failed
gets its error here (`start_failure`), from the coordinator's answer or its
absence, and the start raises the first of them (`start_error`), the others
named in a note (unless a group's process refused to start, which the start
raises instead: `admin.read_refusal`).
"""

from __future__ import annotations

import pickle

from ..errors import GroupDied, RemoteError, describe
from . import actors

__all__ = ["remote_error", "start_error", "start_failure"]


def remote_error(group: str, what: str, failure: actors.Failure) -> RemoteError:
    """The host's error for a failure in a group process.

    Args:
        group (str): the group's name.
        what (str): what failed, in words (``"close() raised"``).
        failure (actors.Failure): the failure as the group reported it.

    Returns:
        RemoteError: with the remote traceback, and the exception itself when it
        unpickles here.
    """
    exception = None
    if failure.pickled is not None:
        try:
            exception = pickle.loads(failure.pickled)
        except Exception:  # noqa: BLE001 - its class may not exist here; the text stays
            exception = None
    if not isinstance(exception, BaseException):
        exception = None
    return RemoteError(f"group {group!r}: {what}: {failure.message}", group=group,
                       type_name=failure.type_name, remote_traceback=failure.traceback,
                       exception=exception)


def start_failure(name: str, target: str, reply: actors.GroupStartFailed | None,
                  pid: int | None, machine: str | None, gone: list[str],
                  timeout: float) -> BaseException:
    """The error of one group whose start failed.

    Args:
        name (str): the group's name.
        target (str): its target (``"package.module:function"``).
        reply (actors.GroupStartFailed | None): the coordinator's answer;
            ``None`` when none came (the start was given up).
        pid (int | None): its process, if it told it (`actors.Booting`).
        machine (str | None): the convention member it started on; ``None``: here.
        gone (list[str]): the machines found not answering during the start.
        timeout (float): the start's timeout, seconds.

    Returns:
        BaseException: `GroupDied` (its process ended, or its machine stopped
        answering), `RemoteError` (its target raised) or ``TimeoutError``.
    """
    what = f"the start of group {name!r} ({target})"
    if reply is None:
        if machine is not None and machine in gone:
            return GroupDied(name, pid, f"machine {machine!r} stopped answering "
                                        f"while the group started")
        if gone:
            return TimeoutError(f"{what}: given up when machine {gone[0]!r} stopped "
                                f"answering; its process was ended")
        return TimeoutError(f"{what}: not done within {timeout} s; its process was ended")
    if reply.failure is None:
        return GroupDied(name, pid, f"its process ended while building its server "
                                    f"({target}): {reply.reason}")
    return remote_error(name, f"could not start {target!r}", reply.failure)


def start_error(failures: list[tuple[str, BaseException]]) -> BaseException:
    """What a failed start raises: the first failure, the others named in a note.

    Args:
        failures (list[tuple[str, BaseException]]): (group, error), at least one,
            the most telling first.

    Returns:
        BaseException: the first error, with the note added.
    """
    error = failures[0][1]
    if len(failures) > 1:
        error.add_note("Other groups failed too: " + ", ".join(
            f"{n!r} ({describe(e)})" for n, e in failures[1:]))
    return error
