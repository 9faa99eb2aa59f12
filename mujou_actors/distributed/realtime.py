"""A placed run in real time: each group on its own clock, messages relayed as they come.

In real time no group waits for another: every group process runs its
kernel freely on its own monotonic clock (`Kernel.run_free`) and ships what
its nodes send to other groups as soon as it is sent (a worker's send wakes
the group's data-plane thread). The host's driver relays each message to the
groups that read it, which deliver it as the host's writes are delivered in
one process: it triggers its reader at once. Lateness is measured per node,
on the node's own clock, as in one process.

A consistent cut (``state_dict``, the supervisor's snapshots, the end) holds
every group (`Kernel.hold`: no hook in flight), then *flushes* the data
plane twice: each group answers a flush with a marker after everything it
sent before, so once every marker is in, every message sent before the hold
has reached the host; the host hands those to their readers and flushes
again, so every one of them sits in its reader's mailbox. The groups' trees,
taken then, hold every message exactly once, kept or pending.

Message ages across machines: each group on another machine runs its timer
on that machine's monotonic clock, whose offset from the host's the
heartbeat measures. `start` keeps each such group's timer origin (the answer
to `group.RunFree`), and `relay` notes, for every message it takes from
one, the host's clock at its arrival minus the send's stamp on the
member's clock (`MessageAges`): the message's age less the clock offset,
which `Run.stats` adds back with the estimate of the moment
(`MachineStats.message_age_p50`).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Sequence
from typing import Any

import zmq

from . import dataplane, group

# The placed run's driver and its groups (driver._Driver, driver._Group): driver.py
# imports this module, so they are named here, not imported.
_Driver = Any
_Group = Any

__all__ = ["run_rounds", "cut", "flush", "start", "now_ns", "hold_all", "release", "relay",
           "push", "MessageAges", "AGE_SAMPLES"]

POLL_S = 0.05
AGE_SAMPLES = 256  # the newest messages of a group whose ages `MessageAges` keeps (a power of 2)


class MessageAges:
    """The raw ages of the newest messages from one group on another machine (real time).

    A raw age is the host's ``time.monotonic_ns()`` when the message reached
    the driver minus the send's stamp on the member's monotonic clock: the
    true age less the member's clock offset (its clock minus the host's).
    Adding the offset's estimate gives the age (`ages`); the offset is
    applied when the figures are asked for, not per message.

    Args:
        origin_ns (int): the group's timer origin on its machine's monotonic
            clock (`group.RunFree`'s answer): a send stamped ``t_ns`` was
            made at the member's monotonic ``t_ns + origin_ns``.
    """

    __slots__ = ("origin_ns", "_ring", "_count")

    def __init__(self, origin_ns: int) -> None:
        self.origin_ns = origin_ns
        self._ring = array("q", bytes(8 * AGE_SAMPLES))
        self._count = 0

    def add(self, now_ns: int, sends: Sequence[tuple[Any, ...]]) -> None:
        """Note the messages of one reply (items, stamped ``t_ns`` first) that came at
        ``now_ns`` (the host's monotonic clock)."""
        base = now_ns - self.origin_ns
        ring, n = self._ring, self._count
        for item in sends:
            ring[n & (AGE_SAMPLES - 1)] = base - item[0]
            n += 1
        self._count = n

    def raw(self) -> list[int]:
        """The raw ages kept (ns, the offset not added), oldest first: the newest
        `AGE_SAMPLES` at most."""
        n = self._count
        if n <= AGE_SAMPLES:
            return list(self._ring[:n])
        start = n & (AGE_SAMPLES - 1)
        return list(self._ring[start:]) + list(self._ring[:start])


def now_ns(driver: _Driver) -> int:
    """The run's time in real time: the host's monotonic clock since the start, ns."""
    return driver.start_ns + time.monotonic_ns() - driver.start_mono_ns


def run_rounds(driver: _Driver) -> None:
    """Relay messages until the end (``duration`` on the host's clock), a stop or a failure."""
    end = None if driver.end_ns is None else driver.end_ns
    while not driver.stop_asked.is_set():
        driver._serve_requests()
        t = now_ns(driver)
        driver.time_ns = t
        if end is not None and t >= end:
            return
        if driver.next_cut is not None and t >= driver.next_cut:
            driver._snapshot(t)
            continue
        wait = POLL_S
        if end is not None:
            wait = min(wait, (end - t) / 1e9)
        if driver.next_cut is not None:
            wait = min(wait, (driver.next_cut - t) / 1e9)
        relay(driver, max(0.0, wait))


def _poller(driver: _Driver) -> zmq.Poller:
    poller = zmq.Poller()
    for g in driver.groups.values():
        if g.remote:
            poller.register(g.link.sock, zmq.POLLIN)
    poller.register(driver.wake.fileno(), zmq.POLLIN)
    notices = getattr(driver.system, "notices", None)
    if notices is not None:
        poller.register(notices, zmq.POLLIN)
    return poller


def relay(driver: _Driver, wait: float, markers: set[str] | None = None) -> None:
    """Take in what the groups sent within ``wait`` seconds; pass it on to the readers.

    With ``markers``, the names of groups whose flush marker came are added to it.
    """
    ready = dict(_poller(driver).poll(int(wait * 1000)))
    if driver.wake.fileno() in ready:
        driver.wake.clear()
    for g in driver.groups.values():
        if g.remote and g.link.sock not in ready:
            continue
        while (reply := g.link.receive(0)) is not None:
            if reply.marker and markers is not None:
                markers.add(g.name)
            ages = g.ages  # a group on another machine's (None: this machine's)
            if ages is not None and reply.sends:
                ages.add(time.monotonic_ns(), reply.sends)
            driver._route(g, reply)
    push(driver)
    driver._check_exits()


def push(driver: _Driver) -> None:
    """Send every group the messages waiting for it (no answer is expected)."""
    for g in driver.groups.values():
        if g.queued:
            messages, g.queued = g.queued, []
            g.link.send(dataplane.Grant(None, False, messages))


def flush(driver: _Driver, groups: list[_Group] | None = None, timeout: float = 10.0) -> None:
    """Every message sent so far reaches its reader's mailbox (see the module's docstring)."""
    targets = list(driver.groups.values()) if groups is None else groups
    for _ in range(2):
        markers: set[str] = set()
        for g in targets:
            messages, g.queued = g.queued, []
            g.link.send(dataplane.Grant(None, True, messages))
        deadline = time.monotonic() + timeout
        while len(markers) < len(targets):
            if time.monotonic() > deadline:
                missing = sorted({g.name for g in targets} - markers)
                raise TimeoutError(f"groups {missing} did not answer a flush within "
                                   f"{timeout:g} s")
            relay(driver, POLL_S, markers)


def hold_all(driver: _Driver, timeout: float) -> list[_Group]:
    """Hold every group at a cut (no hook in flight); the groups held, in order.

    ``timeout`` is for all the groups together (each is held in turn, with
    what is left of it): a stuck hook costs a cut, or the end, one timeout.

    Raises:
        TimeoutError: a group's hooks did not return within ``timeout``; the
            groups held so far stay held (the caller releases them or stops).
    """
    held: list[_Group] = []
    deadline = time.monotonic() + timeout
    for g in driver.groups.values():
        left = max(0.0, deadline - time.monotonic())
        ok = (driver.ask(g.name, group.Hold(left), left + 5.0) if g.remote
              else driver.kernel.hold(left))
        if not ok:
            raise _NotHeld(g.name, timeout, held)
        held.append(g)
    return held


class _NotHeld(TimeoutError):
    def __init__(self, name: str, timeout: float, held: list[_Group]) -> None:
        super().__init__(f"no consistent cut within {timeout:g} s: group {name!r} had "
                         f"hooks in flight")
        self.held = held


def release(driver: _Driver, groups: list[_Group]) -> None:
    """Let held groups go on."""
    for g in groups:
        if g.remote:
            driver.ask(g.name, group.Release(), 30.0)
        else:
            driver.kernel.release()


def cut(driver: _Driver, timeout: float | None) -> dict[str, Any]:
    """One state tree of every group at a consistent cut, in real time.

    Raises:
        TimeoutError: a group's hooks in flight did not return within ``timeout``
            (the groups go on as if not asked).
    """
    limit = driver.stop_timeout if timeout is None else timeout
    held: list[_Group] = []
    try:
        held = hold_all(driver, limit)
        flush(driver, timeout=limit)
        return driver._gather(now_ns(driver), limit)
    except _NotHeld as exc:
        held = exc.held
        raise TimeoutError(f"state_dict(): {exc}") from None
    finally:
        release(driver, held)


def start(driver: _Driver, tree: dict[str, Any] | None) -> None:
    """The end of a real-time start: on_start's messages delivered, then every clock runs."""
    flush(driver, timeout=driver.start_timeout)
    for g in driver.groups.values():
        if g.remote:
            origin = driver.ask(g.name, group.RunFree(), 30.0)
            # A new process (a restart) has a timer, and maybe a machine, of its own.
            g.ages = (MessageAges(origin) if g.member is not None and isinstance(origin, int)
                      else None)
        else:
            driver.kernel.run_free()
    if not driver.clock_started:  # a restart does not move the run's clock
        driver.clock_started = True
        driver.start_mono_ns = time.monotonic_ns()
        driver.start_ns = tree["time_ns"] if tree is not None else 0

