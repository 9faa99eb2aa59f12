"""The host's handle on a run's coordinator: its actor, its process, the requests it serves.

The coordinator (`actors.Coordinator`) creates, stops and forgets the groups'
actors, its children; the host reaches it through `CoordinatorHandle`, which
sends each request (`_requests.Requests`, numbered, bounded), knows its
process (pid and start time, so that a reused pid does not pass for it) and
ends it, by force past a bound. Its death ends every group of the run: `check`
raises `GroupDied` then, for whichever group a request was about.
"""

from __future__ import annotations

import os
import time
from typing import Any

from thespian.actors import ActorExitRequest

from ..errors import GroupDied
from . import actors
from ._loopback import alive, start_time
from ._procs import kill, wait_gone
from ._requests import POLL_S, Requests

__all__ = ["CoordinatorHandle"]


class CoordinatorHandle:
    """The host's side of a run's coordinator; made before it, started by `start`.

    Args:
        requests (Requests): the run's actor system and its requests.

    Attributes:
        address (Any): the coordinator's Thespian address (``None`` before `start`).
        pid (int | None): its process (``None`` before `start` has its answer).
        started (int | None): its process's start time (`_loopback.start_time`).
        gone (bool): whether a notice said that its process died.
    """

    def __init__(self, requests: Requests) -> None:
        self._requests = requests
        self.address: Any = None
        self.pid: int | None = None
        self.started: int | None = None
        self.gone = False

    def start(self, notices: str, folder: str, preload: tuple[str, ...],
              timeout: float) -> actors.Configured:
        """Create the coordinator and configure it (`actors.Configure`).

        Args:
            notices (str): the host's notices socket (`_notices.Notices.address`).
            folder (str): the run's private folder.
            preload (tuple[str, ...]): the modules of the coordinator's fork server.
            timeout (float): seconds for its answer (at least 1 s is given).

        Returns:
            actors.Configured: its answer: its pid, the admin's, the run's process group.

        Raises:
            TimeoutError: it did not answer in time.
            RuntimeError: the system is shut down.
        """
        deadline = time.monotonic() + timeout
        self.address = self._requests.create(actors.Coordinator)
        seq = self._requests.next()
        configure = actors.Configure(seq, notices, (os.getpid(), start_time(os.getpid())),
                                     folder, preload)
        reply: actors.Configured = self._requests.request(
            self.address, configure, seq, max(deadline - time.monotonic(), 1.0),
            "the coordinator's start")
        self.pid, self.started = reply.pid, start_time(reply.pid)
        return reply

    def check(self) -> None:
        """Raise `GroupDied` (for every group) if the coordinator is gone.

        Raises:
            GroupDied: its process died (a notice said so, or it is not there).
        """
        if self.gone or (self.pid is not None and not alive(self.pid, self.started)):
            raise GroupDied("<coordinator>", self.pid, "the run's coordinator process is "
                            "gone; every group went with it")

    def stop(self, group: str, timeout: float) -> actors.GroupStopped:
        """Stop a group through the coordinator (`actors.StopGroup`): its ``close()``, its end.

        Args:
            group (str): the group's name.
            timeout (float): seconds for the answer.

        Returns:
            actors.GroupStopped: its answer (``failure``: what ``close()`` raised).

        Raises:
            TimeoutError: no answer in time.
            GroupDied: the coordinator is gone.
        """
        seq = self._requests.next()
        reply: actors.GroupStopped = self._requests.request(
            self.address, actors.StopGroup(seq, group), seq, timeout,
            f"the stop of group {group!r}", check=self.check)
        return reply

    def forget(self, group: str, timeout: float) -> None:
        """Have the coordinator forget a group on a member (`actors.Forget`), lost.

        Args:
            group (str): the group's name.
            timeout (float): seconds for the answer.

        Raises:
            TimeoutError: no answer in time.
            GroupDied: the coordinator is gone.
            RuntimeError: the system is shut down.
        """
        seq = self._requests.next()
        self._requests.request(self.address, actors.Forget(seq, group), seq, timeout,
                               f"forgetting group {group!r}", check=self.check)

    def abandon(self, group: str, on_member: bool) -> None:
        """After a start was given up: have the coordinator drop the group; never raises.

        A group on another machine is forgotten (`actors.Forget`): its end may
        never be told (its machine may be gone), and a stop would wait for it,
        so the group could not be started again; one on this machine is stopped
        (`actors.StopGroup`). Its process, if known, is killed by the caller, or
        by the shutdown's sweep of the run's process group.

        Args:
            group (str): the group's name.
            on_member (bool): whether the group is on another machine.
        """
        seq = self._requests.next()
        msg = actors.Forget(seq, group) if on_member else actors.StopGroup(seq, group)
        try:
            self._requests.request(self.address, msg, seq, POLL_S * 4,
                                   f"the abandon of group {group!r}")
        except (TimeoutError, RuntimeError):
            pass

    def stop_all(self, timeout: float) -> dict[str, actors.Failure]:
        """Stop every group through the coordinator (`actors.StopAll`), within ``timeout``.

        Args:
            timeout (float): seconds for the answer (at least `POLL_S`).

        Returns:
            dict[str, actors.Failure]: what the groups' ``close()`` raised; empty
            also when the coordinator did not answer, is gone or was never
            started (the caller kills the groups left).
        """
        if self.address is None:
            return {}
        seq = self._requests.next()
        try:
            reply = self._requests.request(self.address, actors.StopAll(seq), seq,
                                           max(timeout, POLL_S), "the stop of every group",
                                           check=self.check)
        except (TimeoutError, GroupDied, RuntimeError):
            return {}
        return dict(reply.failures)

    def end(self, until: float) -> None:
        """Ask the coordinator to end, wait for its process until ``until``, then kill it.

        Done before Thespian's own shutdown, so that the admin has no child
        left to wait for (Thespian waits up to 10 s for one that does not answer).

        Args:
            until (float): ``time.monotonic()`` by which it is killed if still there.
        """
        if self.pid is None or not alive(self.pid, self.started):
            return
        self._requests.tell(self.address, ActorExitRequest())
        if not wait_gone([self.pid], max(until - time.monotonic(), 0.0)):
            kill([self.pid])
