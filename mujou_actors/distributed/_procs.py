"""The processes of a run as the operating system sees them: listed, waited for, killed, reaped.

A run's processes (Thespian's admin and logger, the coordinator, the groups)
share the process group of the short-lived child that started the admin (a
*starter*: it calls ``setsid`` and forks the admin, then exits). The host
finds them through that group (`group_members`), ends them by pid or by group
(`kill`, `kill_groups`), waits for them within a bound (`wait_gone`,
`end_process`) and reaps the starters, which nobody else waits for
(`reap_starters`).

Listing goes through psutil (children, every pid); a process's group comes
from ``os.getpgid``, since psutil has none. Whether a pid still runs is
`_loopback.alive` (a zombie whose other threads are still ending still runs;
a start time tells a reused pid apart), which every process of a run uses
too. A process that ends while it is read (psutil's ``NoSuchProcess``,
``ZombieProcess``, ``AccessDenied``; ``getpgid``'s ``OSError``) is left out,
never an error.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import psutil

from ._loopback import alive

__all__ = ["KILL_WAIT_S", "children", "end_all", "end_process", "group_members", "kill",
           "kill_groups", "pgid_of", "reap_starters", "starters", "wait_gone"]

KILL_WAIT_S = 1.0  # how long a killed process may take to be gone
_POLL_S = 0.01  # how often a wait looks again


def children() -> set[int]:
    """The pids of this process's children, zombies included.

    Returns:
        set[int]: the pids; empty if none can be listed.
    """
    try:
        return {child.pid for child in psutil.Process().children()}
    except psutil.Error:
        return set()


def pgid_of(pid: int) -> int | None:
    """A process's process-group id.

    Args:
        pid (int): the process.

    Returns:
        int | None: its process group; ``None`` once it is gone (or may not be asked).
    """
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def group_members(pgids: set[int]) -> set[int]:
    """The processes whose process group is one of ``pgids``, zombies included.

    psutil has no process-group id, so each pid's is asked of the kernel
    (``getpgid``); a process that ends meanwhile, or whose group the system
    will not tell (macOS does not, for another session), is left out.

    Args:
        pgids (set[int]): process-group ids.

    Returns:
        set[int]: their members' pids (this process's too, if it is one).
    """
    if not pgids:
        return set()
    return {pid for pid in psutil.pids() if pgid_of(pid) in pgids}


def starters(before: set[int]) -> set[int]:
    """The children that started a Thespian admin: new since ``before``, group leaders.

    Thespian starts its admin from a short-lived child that calls ``setsid``
    and forks the admin, so that child's pid is the process group of every
    process of the run.

    Args:
        before (set[int]): this process's children before the start (`children`).

    Returns:
        set[int]: their pids.
    """
    return {pid for pid in children() - before if pgid_of(pid) == pid}


def reap_starters(pids: set[int]) -> set[int]:
    """Reap the processes that started an admin (our children; they exit at once).

    Nobody else waits for them (Thespian forgets them), so they would stay
    zombies. Waits up to `KILL_WAIT_S` in all, polling every 10 ms.

    Args:
        pids (set[int]): their pids (`starters`); not changed.

    Returns:
        set[int]: those reaped now, or not (any more) children of this process;
        the others still run after the wait.
    """
    reaped = set()
    deadline = time.monotonic() + KILL_WAIT_S
    for pid in sorted(pids):
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid  # not our child, or reaped already
            if done or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)
        if done:
            reaped.add(pid)
    return reaped


def wait_gone(pids: list[int] | Callable[[], list[int]], timeout: float) -> bool:
    """Wait for processes to be gone, polling every 10 ms.

    Args:
        pids (list[int] | Callable[[], list[int]]): the pids, or a function
            listing those still running (looked at anew each time).
        timeout (float): seconds at most.

    Returns:
        bool: whether they are gone.
    """
    deadline = time.monotonic() + timeout
    while True:
        left = pids() if callable(pids) else [p for p in pids if alive(p)]
        if not left:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def kill(pids: list[int]) -> None:
    """SIGKILL the processes still there; wait up to `KILL_WAIT_S` for them to go.

    Args:
        pids (list[int]): the processes.
    """
    for pid in pids:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    wait_gone(pids, KILL_WAIT_S)


def kill_groups(pids: list[int], pgids: set[int] | None = None) -> None:
    """SIGKILL the process group of each of ``pids`` (those of ``pgids``, if given).

    A process group's id is not reused while a member of it lives, so the
    group of a process that still runs is still the one it was.

    Args:
        pids (list[int]): running members of the groups.
        pgids (set[int] | None): the groups that may be killed; ``None``: any.
    """
    for pid in pids:
        pgid = pgid_of(pid)
        if pgid is not None and (pgids is None or pgid in pgids):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def end_process(pid: int, timeout: float, started: int | None = None) -> None:
    """Wait for a process asked to end; kill it if it is still there after ``timeout``.

    Args:
        pid (int): the process.
        timeout (float): seconds to wait before the kill.
        started (int | None): its start time (`_loopback.start_time`), so that
            a reused pid is not waited for; ``None`` not to check.
    """
    if not wait_gone([pid] if alive(pid, started) else [], timeout):
        kill([pid])


def end_all(pids: Callable[[], list[int]], pgids: set[int] | None, timeout: float) -> None:
    """Wait for processes to go; past ``timeout``, kill their process groups, then them.

    Args:
        pids (Callable[[], list[int]]): lists the processes still running.
        pgids (set[int] | None): the process groups that may be killed
            (`kill_groups`); ``None``: any of theirs.
        timeout (float): seconds before the kill (then up to `KILL_WAIT_S` more).
    """
    if not wait_gone(pids, timeout):
        kill_groups(pids(), pgids)
        kill(pids())
        wait_gone(pids, KILL_WAIT_S)
