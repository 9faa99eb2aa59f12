"""A placed run in real time: each group on its own clock, messages passed on as they come.

`RealTimeRelay` is the driver's strategy for it (``driver.timing``), as
`rounds.SimulatedRounds` is for simulated time: the driver asks one of the
two, never ``if realtime``. `PeerRelay`, the default, is the same with the
groups' messages going straight to the groups that read them on peer links
where they apply (`peers.RealTimePeers`): the relay below is then only for
the copies the host asked for, failures and the cuts' markers.

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
heartbeat measures. `start_timers` keeps each group's timer origin (the
answer to `group.RunFree`), and `relay` notes, for every message it takes
from a group on another machine, the host's clock at its arrival minus the
send's stamp on the member's clock (`MessageAges`): the message's age less
the clock offset, which `Run.stats` adds back with the estimate of the
moment (`MachineStats.message_age_p50`). On peer links the messages never
reach the host: `PeerRelay.tell_clocks` gives each group the origins of the
groups on other machines that send to it, and the group notes the ages of
their messages as they arrive, on its own clock (`peers.RealTimePeers`),
for the host to collect with its figures (`placed_run.machine_stats`). Both
are real-time figures only: simulated time notes none.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import zmq

from . import dataplane, peers
from .failures import failed_in, reported_by
from .peers import CrossLinks, Unreachable, fall_back, links_between, mesh_spec

# The placed run's driver and its groups (driver._Driver, driver._Group): driver.py
# imports this module, so they are named here, not imported.
_Driver = Any
_Group = Any

__all__ = ["RealTimeRelay", "PeerRelay", "MessageAges", "AGE_SAMPLES"]

log = logging.getLogger("mujou_actors")

POLL_S = 0.05
AGE_SAMPLES = peers.AGE_SAMPLES  # the newest messages whose ages a `MessageAges` keeps


class MessageAges(peers.AgeRing):
    """The raw ages of the newest messages from one group on another machine that the
    host's relay took (real time).

    A raw age is the host's ``time.monotonic_ns()`` when the message reached
    the driver minus the send's stamp on the member's monotonic clock: the
    true age less the member's clock offset (its clock minus the host's).
    Adding the offset's estimate gives the age (`placed_run.machine_stats`);
    the offset is applied when the figures are asked for, not per message.

    Args:
        origin_ns (int): the group's timer origin on its machine's monotonic
            clock (`group.RunFree`'s answer): a send stamped ``t_ns`` was
            made at the member's monotonic ``t_ns + origin_ns``.
    """

    __slots__ = ("origin_ns",)

    def __init__(self, origin_ns: int) -> None:
        super().__init__()
        self.origin_ns = origin_ns

    def add(self, now_ns: int, sends: Sequence[tuple[Any, ...]]) -> None:
        """Note the messages of one reply (items, stamped ``t_ns`` first) that came at
        ``now_ns`` (the host's monotonic clock)."""
        self.note(now_ns - self.origin_ns, sends)


class RealTimeRelay:
    """How a real-time placed run moves: every group free on its clock, the host relaying.

    Args:
        driver (driver._Driver): the run's driver; the relay reads its groups,
            its end and its stop, and raises a group's reported failure as
            `failures.Failed` for its supervisor to take.

    Every method runs on the driver's thread.
    """

    name = "realtime"
    lowers_due = False  # a relayed message triggers its reader as it arrives, as a host write
    rounds = 0  # no rounds: the groups run free

    def __init__(self, driver: _Driver) -> None:
        self.driver = driver
        self.flushes = 0  # the passes of flushes so far (a peer link's marker names its pass)
        # Each group process's timer origin on its machine's monotonic clock (`group.RunFree`'s
        # answer), from the latest `start_timers`; none for the host's own group.
        self.origins: dict[str, int] = {}

    def now_ns(self) -> int:
        """The run's time: the host's monotonic clock since the start, ns."""
        driver = self.driver
        return int(driver.start_ns + time.monotonic_ns() - driver.start_mono_ns)

    def run(self) -> None:
        """Relay messages until the end (``duration`` on the host's clock), a stop or a failure."""
        driver = self.driver
        end = driver.end_ns
        while not driver.stop_asked.is_set():
            driver._serve_requests()
            t = self.now_ns()
            driver.time_ns = t
            if end is not None and t >= end:
                return
            if driver.recovery.next_cut is not None and t >= driver.recovery.next_cut:
                driver.recovery.snapshot(t)
                continue
            wait = POLL_S
            if end is not None:
                wait = min(wait, (end - t) / 1e9)
            if driver.recovery.next_cut is not None:
                wait = min(wait, (driver.recovery.next_cut - t) / 1e9)
            self.relay(max(0.0, wait))

    def _poller(self) -> zmq.Poller:
        driver = self.driver
        poller = zmq.Poller()
        for g in driver.groups.values():
            if g.remote:
                poller.register(g.link.sock, zmq.POLLIN)
        poller.register(driver.wake.fileno(), zmq.POLLIN)
        notices = getattr(driver.system, "notices", None)
        if notices is not None:
            poller.register(notices, zmq.POLLIN)
        return poller

    def relay(self, wait: float, markers: set[str] | None = None) -> None:
        """Take in what the groups sent within ``wait`` seconds; pass it on to the readers.

        With ``markers``, the names of groups whose flush marker came are
        added to it. A failure a group reports is raised (`failures.Failed`)
        once its messages are passed on.
        """
        driver = self.driver
        ready = dict(self._poller().poll(int(wait * 1000)))
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
                if reply.time_ns > g.time_ns:
                    g.time_ns = reply.time_ns
                failed = failed_in(reported_by(g.name, reply))
                if failed is not None:
                    raise failed
        self.refresh(())
        driver._check_exits()

    def refresh(self, groups: Any) -> None:
        """Send every group the messages waiting for it (no answer is expected; the groups
        run free, so there is no next key to learn). ``groups``, which the simulated
        rounds' `refresh` takes, is not needed: one relay pushes to all at once."""
        for g in self.driver.groups.values():
            if g.queued:
                messages, g.queued = g.queued, []
                g.link.send(dataplane.Grant(None, False, messages))

    def flush(self, groups: list[_Group] | None = None, timeout: float | None = None) -> None:
        """Every message sent so far reaches its reader's mailbox (see the module's docstring).

        Args:
            groups: the groups to flush (None: all).
            timeout: seconds for each of the two passes (None: the run's ``stop_timeout``).

        Raises:
            TimeoutError: a group did not answer a flush in time.
        """
        driver = self.driver
        limit = driver.stop_timeout if timeout is None else timeout
        targets = list(driver.groups.values()) if groups is None else groups
        for _ in range(2):
            markers: set[str] = set()
            self.flushes += 1
            for g in targets:
                messages, g.queued = g.queued, []
                g.link.send(self.flush_grant(messages))
            deadline = time.monotonic() + limit
            while len(markers) < len(targets):
                if time.monotonic() > deadline:
                    missing = sorted({g.name for g in targets} - markers)
                    raise TimeoutError(f"groups {missing} did not answer a flush within "
                                       f"{limit:g} s")
                self.relay(POLL_S, markers)

    def flush_grant(self, messages: list[dataplane.Item]) -> dataplane.Grant:
        """The grant of a flush's pass to a group, with the messages waiting for it."""
        return dataplane.Grant(None, True, messages)

    def hold_all(self, timeout: float) -> list[_Group]:
        """Hold every group at a cut (no hook in flight); the groups held, in order.

        ``timeout`` is for all the groups together (each is held in turn, with
        what is left of it): a stuck hook costs a cut, or the end, one timeout.

        Raises:
            TimeoutError: a group's hooks did not return within ``timeout``; the
                groups held so far stay held (the caller releases them or stops).
        """
        driver = self.driver
        held: list[_Group] = []
        deadline = time.monotonic() + timeout
        for g in driver.groups.values():
            left = max(0.0, deadline - time.monotonic())
            if not g.control.hold(left):
                raise _NotHeld(g.name, timeout, held)
            held.append(g)
        return held

    def release(self, groups: list[_Group]) -> None:
        """Let held groups go on."""
        for g in groups:
            g.control.release()

    def cut(self, timeout: float | None) -> dict[str, Any]:
        """One state tree of every group at a consistent cut, in real time.

        Raises:
            TimeoutError: a group's hooks in flight did not return within ``timeout``
                (the groups go on as if not asked).
        """
        driver = self.driver
        limit = driver.stop_timeout if timeout is None else timeout
        held: list[_Group] = []
        try:
            held = self.hold_all(limit)
            self.flush(timeout=limit)
            return driver._gather(self.now_ns(), limit)
        except _NotHeld as exc:
            held = exc.held
            raise TimeoutError(f"state_dict(): {exc}") from None
        finally:
            self.release(held)

    def snapshot_tree(self, t: int) -> dict[str, Any] | None:
        """The supervisor's snapshot, cut now (``t`` is its grid time); None when a group
        cannot be held within the snapshots' bound (the snapshot is missed). Before the
        clocks run (the first, `start_timers`): every group's state at ``t`` as it is
        (nothing runs, every message was delivered), within the start's bound."""
        driver = self.driver
        try:
            if not driver.clock_started:
                return driver._gather(t, driver.start_timeout)
            return self.cut(driver.recovery.snapshots.bound())
        except TimeoutError as exc:
            log.debug("snapshot missed: %s", exc)
            return None

    def restarted_node(self, g: _Group) -> None:
        """A node of ``g`` restarted (``one_for_one``): what waits for the groups goes out."""
        self.refresh([g])

    def before_restore(self, failed_in: _Group) -> bool:
        """Before a ``one_for_all`` restore: nothing to finish (no instants in real time)."""
        return True

    def write_key(self) -> None:
        """A host write comes in now, as in one process (no key)."""
        return None

    def written(self, g: _Group) -> None:
        """After a host write: nothing (delivered now; the relay carries what it causes)."""

    def start_sends(self, left: float) -> None:
        """What ``on_start`` sent reaches its readers before any clock runs."""
        self.flush(timeout=left)

    def start_timers(self, tree: dict[str, Any] | None) -> None:
        """The end of a real-time start: on_start's messages delivered, the supervisor's
        first snapshot (the run's first start only), then every clock runs.

        The first snapshot is taken before any clock runs, as one process takes
        it: the state right after the start, every message delivered, nothing
        held. Taken once the clocks ran, it was a cut of running groups, and
        a group that died before it (a crash at an early tick on a loaded
        machine) left the supervisor nothing to restore from: the run failed.
        """
        driver = self.driver
        self.flush(timeout=driver.start_timeout)
        if not driver.clock_started:
            driver.recovery.first_snapshot(tree["time_ns"] if tree is not None else 0)
        self.origins = {}
        for g in driver.groups.values():
            origin = g.control.run_free()
            # A new process (a restart) has a timer, and maybe a machine, of its own.
            g.ages = MessageAges(origin) if g.member is not None and origin is not None else None
            if origin is not None:
                self.origins[g.name] = origin
        if not driver.clock_started:  # a restart does not move the run's clock
            driver.clock_started = True
            driver.start_mono_ns = time.monotonic_ns()
            driver.start_ns = tree["time_ns"] if tree is not None else 0

    def ended_at(self) -> int:
        """The run's time at its end: the time the relay stopped at (`run` keeps it)."""
        return int(self.driver.time_ns)

    def settle_end(self) -> None:
        """Every message on its way between groups into its reader's Inputs: every group
        held, with what is left of the end's one ``stop_timeout``, then flushed."""
        driver = self.driver
        self.hold_all(driver._stop_left())
        self.flush()

    def wake(self) -> None:
        """A host request was queued: wake the relay's wait (else it would wait out its poll)."""
        self.driver.wake.set()

    def local_notify(self) -> Any:
        """What the host's own group calls as its nodes send: the relay's wake."""
        return self.driver.wake.set


class PeerRelay(RealTimeRelay):
    """`RealTimeRelay` with the groups' port messages on peer links where they apply.

    Each group sends its messages straight to the groups that read them
    (`peers.RealTimePeers`), on a ZeroMQ ``PAIR`` link per pair of groups
    (on the host's machine, in the run's private folder, large tensors
    through shared memory; with an end on another machine, TCP with the
    run's secret, every tensor inline): one hop, without the host. The host
    keeps what must be central: the cuts (hold, then a flush whose markers
    cross every link: `RealTimePeers.flush`), supervision, published copies
    (``run.read``, recordings, the live view) and host writes. Every restart
    (`start_timers`) opens a new mesh generation: frames of the abandoned
    timeline are dropped.

    Peer links apply, as in simulated time (`segments.Segments.applies`), to
    runs with every node in a group process and no CUDA IPC, and whose links
    between machines could be made when the mesh opened (`peers.CrossLinks`,
    before the clocks run); else the host relays, as `RealTimeRelay` (a
    warning says which link could not be made, and why).

    Args:
        driver (driver._Driver): the run's driver.
    """

    def __init__(self, driver: _Driver) -> None:
        super().__init__(driver)
        self.generation = 0  # of the mesh the groups were told last
        self.live = False  # the groups' messages cross on peer links
        self._links = links_between(driver.routes, driver.owner)
        self.cross = CrossLinks(driver.peer_host)  # the links with an end off the host's machine
        self.unreachable: str | None = None  # why one could not be made (then: the relay)

    def applies(self) -> bool:
        """Whether peer links can carry the run's messages (see the class's docstring)."""
        driver = self.driver
        return self.unreachable is None and all(
            g.remote and g.link.ipc is None and g.name not in driver.dead
            for g in driver.groups.values())

    def flush_grant(self, messages: list[dataplane.Item]) -> dataplane.Grant:
        """A flush's pass names itself on peer links: each group's answer waits for the
        markers of that pass from every group that sends to it."""
        if not self.live:
            return super().flush_grant(messages)
        return dataplane.Grant(None, True, messages, None,
                               dataplane.Segment(self.flushes, self.generation, {}))

    def start_timers(self, tree: dict[str, Any] | None) -> None:
        """A new mesh generation for every group (where peer links apply), then as
        `RealTimeRelay.start_timers`: its flush proves every group's links open."""
        driver = self.driver
        groups = list(driver.groups.values())
        self.live = self.applies()
        if self.live:
            self.generation += 1
            try:
                ahead = self.cross.open(groups, self.generation)
            except Unreachable as exc:
                self.unreachable = str(exc)
                fall_back(self.unreachable, started=driver.clock_started)
                self.live = False
        if self.live:
            spec = mesh_spec(driver.tmpdir, groups, *self._links, ahead=ahead)
            for g in groups:
                g.link.send(dataplane.Grant(None, False, [], None,
                                            dataplane.Segment(0, self.generation, {}, spec)))
        super().start_timers(tree)
        if self.live:
            self.tell_clocks(groups)

    def tell_clocks(self, groups: list[_Group]) -> None:
        """Tell each group the timer origins of the groups on other machines that send to
        it (`group.PeerClocks`, of this mesh generation), now that every timer runs: it
        notes the ages of their messages from then on (`peers.RealTimePeers`)."""
        ins, origins = self._links[1], self.origins
        machine = {g.name: peers.machine_of(g) for g in groups}
        for g in groups:
            clocks = {p: (machine[p], origins[p]) for p in sorted(ins.get(g.name, ()))
                      if p in machine and p in origins and machine[p] != machine[g.name]}
            if clocks:
                g.control.peer_clocks(self.generation, clocks)


class _NotHeld(TimeoutError):
    def __init__(self, name: str, timeout: float, held: list[_Group]) -> None:
        super().__init__(f"no consistent cut within {timeout:g} s: group {name!r} had "
                         f"hooks in flight")
        self.held = held
