"""The idle worker of a real-time group reads the group's peer links itself.

A message from another group of the machine used to reach its hook through
two threads: the group's data-plane thread woke for the socket, wrote the
message into the kernel and woke a worker, which ran the hook. On the 2-core
reference machine a thread's wake-up costs about 30 µs (a condition's notify
and a pipe both: docs/performance.md, "The reading side"), so the second was
a fifth of the hop.

Here an idle worker waits on the peer links' descriptors itself (the
Leader/Followers pattern: `Dispatcher.set_reader`). When a frame comes it
reads it, writes its messages into the kernel and, back in the dispatcher,
finds their work and runs it: one wake-up between the socket and the hook.
The data-plane thread still polls the same descriptors, so a message is read
at once while every worker is busy (a reader's QoS depth then drops the
oldest, as before: it is never left in the socket to push back on its
sender); whichever thread comes first reads, under the group's read lock,
so each link's frames reach the kernel in their order, once.

The wait is ``ppoll(2)`` (through ctypes, which lets the GIL go for the
call): its timeout is in nanoseconds, so a worker waiting for the next tick
on the links wakes for it as precisely as on the dispatcher's condition
(``select.poll`` would round it to milliseconds). Where the C library has no
``ppoll``, `available` is False and workers wait on the condition, as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
from collections.abc import Callable, Sequence
from typing import Any

from ._loopback import Wake

__all__ = ["IdleReader", "available", "wait"]


class _PollFd(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


class _TimeSpec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load_ppoll() -> Any:
    """The C library's ``ppoll``, or None where there is none (not Linux or a BSD)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        ppoll = libc.ppoll
    except (OSError, AttributeError):
        return None
    ppoll.argtypes = [ctypes.POINTER(_PollFd), ctypes.c_ulong, ctypes.POINTER(_TimeSpec),
                      ctypes.c_void_p]
    ppoll.restype = ctypes.c_int
    return ppoll


_PPOLL = _load_ppoll()
available = _PPOLL is not None
_READABLE = select.POLLIN | select.POLLHUP | select.POLLERR | select.POLLNVAL


class _Fds:
    """A ``struct pollfd`` array for `wait`, made once for a set of descriptors."""

    def __init__(self, fds: Sequence[int]) -> None:
        self.fds = list(fds)
        self.array = (_PollFd * len(self.fds))()
        for entry, fd in zip(self.array, self.fds, strict=True):
            entry.fd = fd
            entry.events = select.POLLIN


def wait(fds: _Fds, timeout: float | None) -> list[int]:
    """Wait until one of ``fds`` is readable or ``timeout`` passed (``ppoll(2)``).

    Args:
        fds (_Fds): the descriptors (`_Fds`).
        timeout (float | None): seconds, on the monotonic clock (ppoll's),
            to nanoseconds; None: no bound; 0 or less: just look.

    Returns:
        list[int]: the positions in ``fds`` of the readable descriptors (or
        hung up, in error, or closed: a read finds out which); empty when the
        time passed or a signal interrupted the wait.

    Raises:
        OSError: ``ppoll`` failed otherwise (errno and its message).
    """
    array = fds.array
    for entry in array:
        entry.revents = 0
    if timeout is None:
        n = _PPOLL(array, len(array), None, None)
    else:
        ns = max(0, int(timeout * 1e9))
        n = _PPOLL(array, len(array), ctypes.byref(_TimeSpec(ns // 1_000_000_000,
                                                             ns % 1_000_000_000)), None)
    if n < 0:
        err = ctypes.get_errno()
        if err == errno.EINTR:
            return []
        raise OSError(err, os.strerror(err))
    if n == 0:
        return []
    return [i for i, entry in enumerate(array) if entry.revents & _READABLE]


class IdleReader:
    """The reader of a real-time group's kernel (`Kernel.set_reader`): an idle worker
    waits on the group's peer links and delivers what comes.

    Args:
        links (Callable[[], tuple[Any, list[int]] | None]): the current
            links, asked at every wait: a token that names them (the group's
            `peers.RealTimePeers`) and the descriptors to wait on; None while
            there are none this worker may read (none open, or one is a
            ZeroMQ socket, which is for one thread only): the worker then
            waits for ``wake`` alone.
        deliver (Callable[[Any], bool]): reads every link of the token that
            `links` gave and writes what came into the kernel (under the
            group's read lock, the token checked to be current); whether
            anything came.
        failed (Callable[[BaseException], None]): takes what ``deliver`` or
            the wait raised, for the group to report (`read` never raises).

    Attributes:
        wake (Wake): set by the dispatcher (any notify) and by the group (new
            links): the waiting worker returns and looks again.
        reads (int): the waits that delivered something (the group's stats).
        waiting (bool): a worker waits in `read` now (the links are watched).
    """

    def __init__(self, links: Callable[[], tuple[Any, list[int]] | None],
                 deliver: Callable[[Any], bool],
                 failed: Callable[[BaseException], None]) -> None:
        self.wake = Wake()
        self._links = links
        self._deliver = deliver
        self._failed = failed
        self._token: Any = None
        self._fds = _Fds([self.wake.fileno()])
        self.reads = 0
        self.waiting = False

    def read(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` seconds (None: until woken) on the links and the wake;
        deliver what came. For one worker at a time (the dispatcher's leader)."""
        try:
            got = self._links()
            token = None if got is None else got[0]
            if token is not self._token:  # links opened, given up or replaced
                fds = [self.wake.fileno()] + ([] if got is None else got[1])
                self._token, self._fds = token, _Fds(fds)
            self.waiting = True
            try:
                ready = wait(self._fds, timeout)
            finally:
                self.waiting = False
            if not ready:
                return
            if ready[0] == 0:
                self.wake.clear()  # the dispatcher looks at everything as it takes its lock
                if len(ready) == 1:
                    return
            if token is not None and self._deliver(token):
                self.reads += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the group, never swallowed
            self._failed(exc)

    def close(self) -> None:
        """Close the wake (once no worker can wait on it: the kernel is stopped)."""
        self.wake.close()
