"""Numbered requests from the host to a run's actors, over Thespian, each wait bounded.

Thespian's ``ActorSystem`` is not thread-safe, so `Requests` makes every call
on it under one lock, held for that one call (at most `POLL_S`) and never
across another wait: a request's wait is made of such calls, with the
caller's checks between them. Every request carries a number (`Requests.next`)
that its answer repeats, so that a late answer to an earlier request, given
up, is told apart and dropped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from thespian.actors import ActorSystemFailure, PoisonMessage

__all__ = ["MEMBER_CHECK_S", "MEMBER_MISSES", "POLL_S", "Requests", "members_gone"]

POLL_S = 0.05  # the longest one Thespian call waits; a request's wait is made of these
MEMBER_CHECK_S = 1.0  # how often a start on another machine asks whether that machine answers
MEMBER_MISSES = 2  # unanswered asks in a row before a start gives that machine up


class Requests:
    """A run's Thespian ``ActorSystem``, called under one lock, and its numbered requests.

    Made without a system (`open` hands it one); once `close` has run, every
    call raises ``RuntimeError`` ("the process system is shut down").
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asys: Any = None
        self._seq = 0

    def open(self, asys: Any) -> None:
        """Use ``asys`` (the run's ``ActorSystem``, `admin.start_admin`'s) from now on.

        Args:
            asys (Any): the Thespian ``ActorSystem``.
        """
        with self._lock:
            self._asys = asys

    @property
    def is_open(self) -> bool:
        """bool: whether a system is held (between `open` and `close`)."""
        return self._asys is not None

    def close(self, shutdown: bool = True) -> None:
        """Let the system go, after Thespian's shutdown of it (its admin and logger); idempotent.

        Args:
            shutdown (bool): whether to call Thespian's shutdown (``False``: the
                caller ends the processes itself). The system is let go even
                when the shutdown raises.
        """
        with self._lock:
            asys, self._asys = self._asys, None
            if asys is not None and shutdown:
                asys.shutdown()

    def create(self, actor_class: type) -> Any:
        """Create an actor of the system's admin (``createActor``).

        Args:
            actor_class (type): the actor's class.

        Returns:
            Any: its Thespian address.

        Raises:
            RuntimeError: the system is shut down.
        """
        with self._lock:
            return self._open().createActor(actor_class)

    def tell(self, to: Any, msg: Any) -> None:
        """Send ``msg`` with no answer awaited (a short ``ask`` sends it); nothing once closed.

        Args:
            to (Any): the actor's address.
            msg (Any): the message.
        """
        with self._lock:
            if self._asys is not None:
                self._asys.ask(to, msg, 0.01)

    def next(self) -> int:
        """A new request number (answers carry it; stale answers are dropped).

        Returns:
            int: the number.
        """
        self._seq += 1
        return self._seq

    def request(self, to: Any, msg: Any, seq: int, timeout: float, what: str,
                check: Callable[[], None] | None = None) -> Any:
        """Send ``msg`` to an actor and wait for the answer numbered ``seq``.

        Args:
            to (Any): the actor's address.
            msg (Any): the request.
            seq (int): its number (`next`).
            timeout (float): seconds to wait.
            what (str): the request, in words, for the timeout's error.
            check (Callable[[], None] | None): see `request_many`.

        Returns:
            Any: the answer.

        Raises:
            TimeoutError: none within ``timeout``, naming ``what``.
            RuntimeError: see `request_many`.
        """
        replies = self.request_many([(to, msg)], {seq}, timeout, check)
        if seq not in replies:
            raise TimeoutError(f"{what}: no answer within {timeout} s")
        return replies[seq]

    def request_many(self, sends: list[tuple[Any, Any]], seqs: set[int], timeout: float,
                     check: Callable[[], None] | None = None,
                     interim: Callable[[Any], bool] | None = None,
                     give_up: Callable[[], bool] | None = None) -> dict[int, Any]:
        """Send messages to actors and wait for the answers numbered ``seqs``.

        The wait is made of Thespian calls of at most `POLL_S` each, under the
        lock; between them ``check`` may raise (a dead process), ``give_up()``
        returning ``True`` ends the wait with the answers so far, and answers
        of other numbers (late ones) are dropped. ``interim(answer)`` returning
        ``True`` marks an answer as progress, not the end.

        Args:
            sends (list[tuple[Any, Any]]): (actor address, message) to send, in order.
            seqs (set[int]): the numbers of the answers awaited.
            timeout (float): seconds for all of them.
            check (Callable[[], None] | None): called between waits; raises to give up.
            interim (Callable[[Any], bool] | None): see above.
            give_up (Callable[[], bool] | None): called between waits (see above).

        Returns:
            dict[int, Any]: number -> answer; those missing at the deadline are absent.

        Raises:
            RuntimeError: the system is shut down, or an actor failed on a message
                (Thespian's ``PoisonMessage``).
        """
        deadline = time.monotonic() + timeout
        replies: dict[int, Any] = {}
        pending = list(sends)
        while len(replies) < len(seqs):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with self._lock:
                asys = self._open()
                if pending:  # the others' sends go on in the next calls' transport runs
                    to, msg = pending.pop(0)
                    try:
                        reply = asys.ask(to, msg, min(left, 0.005 if pending else POLL_S))
                    except ActorSystemFailure:
                        # The transmit itself failed (seen under load: BadPacketError
                        # while the peer's socket was not accepting yet): nothing was
                        # delivered, so it is sent again, within the same deadline.
                        pending.insert(0, (to, msg))
                        reply = None
                else:
                    reply = asys.listen(min(left, POLL_S))
            seq = getattr(reply, "seq", None)
            if isinstance(reply, PoisonMessage):
                failed = getattr(reply.poisonMessage, "seq", None)
                if failed in seqs:
                    raise RuntimeError(f"an actor failed on {type(reply.poisonMessage).__name__}"
                                       f":\n{reply.details}")
            elif seq in seqs and seq not in replies and not (interim and interim(reply)):
                replies[seq] = reply
            if check is not None:
                check()
            if give_up is not None and len(replies) < len(seqs) and give_up():
                break
        return replies

    def _open(self) -> Any:
        """The system, under the lock; ``RuntimeError`` once it is shut down."""
        if self._asys is None:
            raise RuntimeError("the process system is shut down")
        return self._asys


def members_gone(check: Callable[[str], bool] | None, machines: set[str],
                 gone: list[str]) -> Callable[[], bool] | None:
    """A ``give_up`` for a start on ``machines`` (`Requests.request_many`).

    Every `MEMBER_CHECK_S`, it asks ``check`` whether each machine answers; a
    machine that did not, `MEMBER_MISSES` times in a row (one slow answer of a
    loaded machine is not its end), goes in ``gone``, and the wait ends.
    Without it, a start on a machine that died after it was chosen (its admin
    took the creation, then went) would wait for its whole timeout.

    Args:
        check (Callable[[str], bool] | None): whether a machine answers now
            (`ProcessSystem.member_check`).
        machines (set[str]): the machines the start uses.
        gone (list[str]): gets the machines found gone.

    Returns:
        Callable[[], bool] | None: the ``give_up``; ``None`` without ``check``
        or machines.
    """
    if check is None or not machines:
        return None
    next_at = time.monotonic() + MEMBER_CHECK_S
    misses = dict.fromkeys(machines, 0)

    def give_up() -> bool:
        nonlocal next_at
        if time.monotonic() < next_at:
            return False
        for m in sorted(machines):
            misses[m] = 0 if check(m) else misses[m] + 1
        gone.extend(m for m in sorted(machines) if misses[m] >= MEMBER_MISSES)
        next_at = time.monotonic() + MEMBER_CHECK_S
        return bool(gone)
    return give_up
