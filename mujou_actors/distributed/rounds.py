"""A placed run in simulated time: the conservative protocol's rounds, one strategy object.

The driver (`driver._Driver`) keeps what every placed run has (the groups,
the host's requests, the supervisor, the end); how the groups' time moves is
this strategy's, or `realtime.RealTimeRelay`'s: the driver holds one of the
two as ``driver.timing`` and asks it, never ``if realtime``.

The protocol is conservative and centralised. The driver knows each group's
next due key. In a *round* (`SimulatedRounds.round`) it grants each group
whose next key is no later than every other group's next key the right to
run its delta cycles up to that bound (inclusive): the others' messages can
only arrive one delta cycle after a key they run, so nothing can reach the
group below its bound. A group stops early after a delta cycle whose sends
leave it; the driver carries those messages to their readers' groups
(lowering the next key of a group whose reader they trigger to the delta
cycle after the send) with the next grant. The groups granted in a round run
at once, in their processes, so groups at the same key (two nodes with the
same period) run in parallel, and a group alone ahead runs many delta cycles
per round. Every message therefore reaches its reader's kernel before the
reader's kernel runs past the message's key, stamped as in one process: the
results are bit-identical to the single-process run's, for any placement
and worker counts.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from .._runtime.kernel import LAST_DELTA
from .._runtime.keys import Key
from ..errors import GroupDied, NotRunningError, describe
from . import dataplane, group
from .failures import Failed, GroupLost, Stuck, failed_in, reported_by

# The placed run's driver and its groups (driver._Driver, driver._Group): driver.py
# imports this module, so they are named here, not imported.
_Driver = Any
_Group = Any

__all__ = ["SimulatedRounds"]

log = logging.getLogger("mujou_actors")

POLL_S = 0.05  # how often a wait for replies looks at exits and a stop
# What a stuck group's entry of StopTimeoutError.stuck says until its stop names the hooks.
UNKNOWN_HOOKS = "a grant (the group's hooks unknown)"
_FAR = (1 << 62, LAST_DELTA)  # a group alone with no end: it runs until it sends


class SimulatedRounds:
    """How a simulated placed run moves its groups' time: grants, replies, messages carried.

    Args:
        driver (driver._Driver): the run's driver; the rounds read its groups,
            its end and its stop, and raise what stops them (`failures.Failed`,
            `failures.GroupLost`, `failures.Stuck`) for its supervisor to take.

    Every method runs on the driver's thread.
    """

    name = "simulated"
    lowers_due = True  # a routed message triggers its reader's group at the next delta cycle

    def __init__(self, driver: _Driver) -> None:
        self.driver = driver
        self.rounds = 0

    # -- the rounds -----------------------------------------------------------------------
    def run(self) -> None:
        """Rounds until the end, a stop or a failure; the supervisor's snapshots on their grid."""
        driver = self.driver
        while not driver.stop_asked.is_set():
            driver._serve_requests()
            if driver.stop_asked.is_set():
                return
            if driver.end_key is None and all(g.due is None for g in driver.groups.values()):
                # Nothing is due and there is no duration: as in one process, the run
                # waits, its time standing still, for a host write (a request) or stop().
                driver._wait_for_request()
                continue
            limit = driver.end_key
            snap = driver.recovery.next_cut
            if snap is not None and (limit is None or (snap, LAST_DELTA) <= limit):
                limit = (snap, LAST_DELTA)
            if not self.round(limit):
                if snap is not None and limit == (snap, LAST_DELTA):
                    self.flush()
                    driver.recovery.snapshot(snap)
                    continue
                return

    def round(self, cap: Key | None) -> bool:
        """Grant every group that may run; wait for the replies, carry the messages.

        Returns False when no group may run (the end, or the cap reached).
        """
        driver = self.driver
        limit = driver.end_key if cap is None else cap
        granted: list[tuple[_Group, Key | None]] = []
        settled = self.settled()
        for g in driver.groups.values():
            if g.due is None:
                continue
            others = [h.due for h in driver.groups.values() if h is not g and h.due is not None]
            bound = min(others) if others else None
            if limit is not None and (bound is None or limit < bound):
                bound = limit
            if bound is None:
                bound = _FAR
            if g.due <= bound:
                granted.append((g, bound))
        if not granted:
            return False
        # A group that may not run takes its messages all the same (bound None): what
        # waits in the driver, and in its mailboxes once settled, stays bounded.
        running = {id(g) for g, _ in granted}
        granted += [(g, None) for g in driver.groups.values() if g.queued and id(g) not in running]
        # Remote groups first, the host's own group last: they all run at once.
        granted.sort(key=lambda gb: not gb[0].remote)
        for g, bound in granted:
            messages, g.queued = g.queued, []
            g.waiting = True
            g.link.send(dataplane.Grant(bound, False, messages, settled))
        self.collect([g for g, _ in granted])
        self.rounds += 1
        return True

    def settled(self) -> Key | None:
        """The least next key of every group: every delta cycle before it is over
        everywhere and its messages were routed (`Kernel.settle`); None: no work left."""
        dues = [g.due for g in self.driver.groups.values() if g.due is not None]
        return min(dues) if dues else None

    def collect(self, waiting: list[_Group]) -> None:
        """Wait for the replies of ``waiting``, then take them in; a dead group or a stop
        is the way out."""
        driver = self.driver
        pending = list(waiting)
        replies: list[tuple[_Group, dataplane.Reply]] = []
        poller = zmq.Poller()
        for g in pending:
            if g.remote:
                poller.register(g.link.sock, zmq.POLLIN)
        notices = getattr(driver.system, "notices", None)
        if notices is not None:
            poller.register(notices, zmq.POLLIN)
        if driver.monitor is not None:  # a lost machine wakes the wait as a crash notice does
            poller.register(driver.monitor.fileno(), zmq.POLLIN)
        for g in list(pending):
            if not g.remote:
                replies.append((g, g.link.receive(0)))
                pending.remove(g)
        while pending:
            ready = dict(poller.poll(int(POLL_S * 1000)))
            for g in list(pending):
                if g.link.sock in ready:
                    reply = g.link.receive(0)
                    if reply is not None:
                        replies.append((g, reply))
                        pending.remove(g)
            driver._check_exits()
            # After a stop, the grants in flight get what is left of the end's one
            # stop_timeout, not one of their own (issue 28, item 5).
            if driver.stop_asked.is_set() and pending and driver._stop_left() <= 0:
                raise Stuck(self.busy_in(pending))
        self._take_replies(replies)

    def busy_in(self, groups: list[_Group]) -> dict[str, str]:
        """The hooks in flight in ``groups`` (whose grants the end gave up on), each with its
        group: ``{path: "on_update (in group 'a')"}`` (`group.Busy`, asked of the control
        thread, free while the grant's hook runs); a group that cannot say is named itself."""
        busy: dict[str, str] = {}
        for g in groups:
            try:
                hooks = self.driver.ask(g.name, group.Busy(), 5.0)
            except BaseException as exc:  # noqa: BLE001 - its stop says more, or its death
                log.debug("group %r did not say which hooks run: %s", g.name, describe(exc))
                hooks = None
            if not hooks:
                busy[g.name] = UNKNOWN_HOOKS
                continue
            busy.update({p: f"{h} (in group {g.name!r})" for p, h in hooks.items()})
        return busy

    def _take_replies(self, replies: list[tuple[_Group, dataplane.Reply]]) -> None:
        """Take a round's replies in: every group's next key first, then the messages.

        In that order because a message lowers its reader's next key: a
        reply of the reader's own taken afterwards must not raise it again.
        """
        driver = self.driver
        reported = []
        for g, reply in replies:
            reported += reported_by(g.name, reply)
            self.note_reply(g, reply)
        for g, reply in replies:
            driver._route(g, reply)
        failed = failed_in(reported)
        if failed is not None:
            raise failed

    def note_reply(self, g: _Group, reply: dataplane.Reply) -> None:
        """A group's answer taken in: its next key, frontier and time (the run's too)."""
        driver = self.driver
        g.waiting = False
        g.due = reply.due
        if reply.frontier > g.frontier:
            g.frontier = reply.frontier
        if reply.time_ns > g.time_ns:
            g.time_ns = reply.time_ns
            if reply.time_ns > driver.time_ns:
                driver.time_ns = reply.time_ns

    def deliver(self, groups: list[_Group], take: bool = False) -> None:
        """Hand ``groups`` what waits for them and learn their next keys; nothing runs.

        ``take``: they also ship what their nodes sent meanwhile (``on_start``'s
        messages, a restarted node's), which crosses now.
        """
        settled = None if take else self.settled()
        for g in groups:
            messages, g.queued = g.queued, []
            g.link.send(dataplane.Grant(None, take, messages, settled))
        if groups:
            self.collect(groups)

    # -- what the driver asks of its strategy ---------------------------------------------
    def refresh(self, groups: list[_Group]) -> None:
        """Deliver what waits for ``groups`` and learn their next keys (nothing runs)."""
        self.deliver(groups)

    def flush(self) -> None:
        """Deliver every message waiting in the driver (no group runs)."""
        self.deliver([g for g in self.driver.groups.values() if g.queued])

    def finish_latest(self) -> None:
        """Every group finishes the latest instant any group has reached.

        Raises:
            failures.Failed: a hook of that instant failed.
        """
        driver = self.driver
        t = max([g.time_ns for g in driver.groups.values()] + [driver.time_ns])
        while self.round((t, LAST_DELTA)):
            pass

    def cut(self, timeout: float | None) -> dict[str, Any]:
        """The state tree of every group at a consistent cut: the latest instant finished
        everywhere, every message between groups delivered."""
        driver = self.driver
        while True:
            t = max([g.time_ns for g in driver.groups.values()] + [driver.time_ns])
            try:
                while self.round((t, LAST_DELTA)):
                    pass
                break
            except (Failed, GroupLost) as failed:
                # A hook fails (or a group dies) on the way to the cut: the supervisor
                # decides, as between rounds; after a restart the cut is taken anew.
                if not driver.recovery.supervise(failed):
                    driver.stop_asked.set()  # the run ends with it, as between rounds
                    raise NotRunningError("state_dict(): the run failed before the cut "
                                          "(join() raises why)") from None
        self.flush()
        return driver._gather(t, timeout)

    def snapshot_tree(self, t: int) -> dict[str, Any] | None:
        """The supervisor's snapshot at ``t``: every group has finished it (the rounds
        stopped there); never missed."""
        return self.driver._gather(t, None)

    def restarted_node(self, g: _Group) -> None:
        """A node of ``g`` restarted (``one_for_one``): what its ``on_start`` sent, stamped
        at the failed delta cycle, crosses now (its readers may not run past it without)."""
        self.deliver([g], take=True)

    def before_restore(self, failed_in: _Group) -> bool:
        """Before a ``one_for_all`` restore after a node of ``failed_in`` failed: every group
        runs to the end of the failed instant, as one process holds at an instant's
        boundary. A hook failing meanwhile is counted as one process counts it; False when
        the supervisor then gives up (the failure is recorded)."""
        driver = self.driver
        t = failed_in.frontier[0]
        while True:
            try:
                if not self.round((t, LAST_DELTA)):
                    return True
            except Failed as again:
                if not driver.recovery.count_again(again):
                    return False

    def write_key(self) -> Key | None:
        """The key at which a host write comes in: the latest delta cycle any group has
        entered (no group has run past it, so it sorts as in one process); None before
        the timers start."""
        key: Key = max(h.frontier for h in self.driver.groups.values())
        return None if key == (-1, 0) else key

    def written(self, g: _Group) -> None:
        """After a host write into ``g``: its next key, which the write may have lowered."""
        self.refresh([g])

    def start_sends(self, left: float) -> None:
        """What ``on_start`` sent crosses to its readers before any timer starts."""
        self.deliver(list(self.driver.groups.values()), take=True)

    def start_timers(self, tree: dict[str, Any] | None) -> None:
        """The timers start: every group's first due key."""
        driver = self.driver
        self.refresh(list(driver.groups.values()))
        driver.start_ns = tree["time_ns"] if tree is not None else 0

    def ended_at(self) -> int:
        """The run's time at its end: its duration's end when it ran to it, else as far as
        the groups got."""
        driver = self.driver
        if driver.end_ns is not None and not driver.failures and not driver.stop_asked.is_set():
            return int(driver.end_ns)
        return int(driver.time_ns)

    def settle_end(self) -> None:
        """Every message on its way between groups into its reader's Inputs (the final
        tree holds them as pending, as one process's does)."""
        driver = self.driver
        if not any(isinstance(f, GroupDied) for f in driver.failures):
            # One process ends (a stop, a failure) at the end of the instant it is
            # in: every group finishes the latest instant any group has reached,
            # so that the final tree is a consistent cut (at the end: nothing runs).
            try:
                self.finish_latest()
            except Failed as failed:  # a hook of that instant: the run fails too
                driver.failures += [f.error for f in [failed, *failed.others]]
        self.flush()

    def wake(self) -> None:
        """A host request was queued: the rounds serve it between two rounds (no wake)."""

    def local_notify(self) -> Any:
        """What the host's own group calls as its nodes send: nothing (grants collect)."""
        return None
