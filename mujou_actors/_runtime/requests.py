"""The host's state requests: `Run.state_dict` calls waiting for the coordinator's cut.

A host thread makes a `StateRequest`, posts it (`StateRequests.post`) and
waits on its ``done``; the coordinator's thread collects it, answers it at the
next cut (`StateRequests.serve`), gives it up once its deadline passes
(`StateRequests.time_out`), or, when the run ends first, answers it with
nothing (`StateRequests.close`: the caller then takes the final state). Every
method but `post` and `cancel` is the coordinator thread's alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from .cuts import NoCut, why_no_cut

__all__ = ["StateRequest", "StateRequests"]


class StateRequest:
    """A host's `Run.state_dict` call, waiting for the coordinator's cut.

    The coordinator sets ``tree`` or ``error`` and then ``done``; ``done``
    alone means the run ended first (the caller then takes the final state).
    ``cancelled`` (set by a caller that gave up, `StateRequests.cancel`) makes
    the coordinator skip the request. Both sides change it under the lock of
    the `StateRequests` it was posted to.

    Args:
        timeout (float, optional): wall seconds the caller waits; None: no bound.
    """

    __slots__ = ("deadline", "timeout", "done", "tree", "error", "cancelled")

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.done = threading.Event()
        self.tree: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.cancelled = False


class StateRequests:
    """The state requests of one run that wait for a cut (the coordinator's side).

    Args:
        send (Callable[[StateRequest], None]): puts a posted request on the
            coordinator's event queue (called with this object's lock held:
            it must not block).
    """

    def __init__(self, send: Callable[[StateRequest], None]) -> None:
        self._send = send
        self._lock = threading.Lock()  # closed, and a request's answer against its cancel
        self._closed = False  # set once the coordinator takes no more requests
        self._waiting: list[StateRequest] = []  # collected by the coordinator, not answered

    # -- the host's side ------------------------------------------------------------------
    def post(self, req: StateRequest) -> bool:
        """Queue a host's request for the coordinator; False once closed (the run ends)."""
        with self._lock:  # against close: a request is posted only while served
            if self._closed:
                return False
            self._send(req)
            return True

    def cancel(self, req: StateRequest) -> bool:
        """The caller gives up ``req``: True unless it was answered meanwhile."""
        with self._lock:
            req.cancelled = not req.done.is_set()
        return req.cancelled

    # -- the coordinator's side -----------------------------------------------------------
    def add(self, req: StateRequest) -> None:
        """Take a request from the coordinator's queue: it waits for the next cut."""
        self._waiting.append(req)

    def __bool__(self) -> bool:
        """True while a request waits for a cut."""
        return bool(self._waiting)

    def drop_cancelled(self) -> None:
        """Forget the requests whose callers gave up."""
        self._waiting = [r for r in self._waiting if not r.cancelled]

    def late(self, now: float) -> list[StateRequest]:
        """The waiting requests whose deadline (``time.monotonic()``) has passed at ``now``."""
        return [r for r in self._waiting if r.deadline is not None and now >= r.deadline]

    def deadlines(self) -> Iterator[float]:
        """The deadlines (``time.monotonic()``) of the waiting requests that have one."""
        return (r.deadline for r in self._waiting if r.deadline is not None)

    def time_out(self, late: Iterable[StateRequest], busy: Mapping[str, str]) -> None:
        """Answer ``late`` requests with a `TimeoutError` naming the hooks in the way."""
        for req in late:
            self._waiting.remove(req)
            self._answer(req, error=_no_cut(req, busy))

    def serve(self, take: Callable[[float], dict[str, Any]], bound: float,
              ending: Callable[[], bool]) -> None:
        """At a cut (the net held): answer every waiting request with a state tree.

        Never an unbounded wait here: the coordinator must get back to its
        queue (the end, the hard end). A request without a timeout tries again
        at the next cut, and so does any once the run is ending (it then gets
        the final state).

        Args:
            take: takes the state tree, waiting at most the given wall seconds
                for actors busy with a restart's hook (raises `NoCut` then).
            bound: wall seconds a request without a deadline waits in ``take``.
            ending: whether the end of the run is decided.
        """
        requests, self._waiting = self._waiting, []
        for req in requests:
            if req.cancelled:
                continue
            left = bound if req.deadline is None else max(0.0, req.deadline - time.monotonic())
            try:
                tree = take(left)
            except NoCut as exc:
                if req.deadline is None or ending():
                    self._waiting.append(req)
                else:
                    self._answer(req, error=_no_cut(req, exc.busy))
            except BaseException as exc:  # noqa: BLE001 - the caller raises it
                self._answer(req, error=exc)
            else:
                self._answer(req, tree=tree)

    def close(self, queued: Callable[[], Iterable[StateRequest]]) -> None:
        """Take no more requests; let those waiting fall back to the final state.

        Args:
            queued: the requests still on the coordinator's queue (called once
                no more can be posted).
        """
        with self._lock:
            self._closed = True
        self._waiting.extend(queued())
        requests, self._waiting = self._waiting, []
        for req in requests:
            self._answer(req)

    def _answer(self, req: StateRequest, tree: dict[str, Any] | None = None,
                error: BaseException | None = None) -> None:
        """Answer a request (unless its caller gave up) and wake the caller."""
        with self._lock:
            if not req.cancelled:
                req.tree, req.error = tree, error
            req.done.set()


def _no_cut(req: StateRequest, busy: Mapping[str, str]) -> TimeoutError:
    """The error of a request that found no consistent cut within its timeout."""
    return TimeoutError(f"state_dict(): no consistent cut within {req.timeout:g} s; "
                        + why_no_cut(busy))
