"""A simulated placed run on peer links: the host hands out segments, not rounds.

`Segments` is `rounds.SimulatedRounds` with one method changed: where peer
links apply (`Segments.applies`), `round` gives every group a *segment*, the
right to run up to the round's cap with its messages going straight to the
groups that read them and its time moved by the protocol in `peers`; the host
waits for the answers and is on no message's path. Everything else of the
rounds (the start, cuts, snapshots, restarts, the end, host requests between
rounds) is the same, because a segment ends as a round does: every message
sent in it is in its reader's kernel, and every group's next key is known.

A segment ends by itself when nothing is left up to its cap. The host ends it
sooner (a *pause*) for a host request (it is served between segments as
between rounds), a stop, or a node's failure (the supervisor decides then, as
after a round); a group's death *aborts* it (no flush: the restore that
follows reopens the mesh under a new generation).

Peer links apply to runs with every node in a group process (none in the
host's), without CUDA IPC, without a recording of ports or a timed
subscription (the driver's item listeners: a round at a time while one is in
force), and when no cycle of triggering links joins groups
(`triggering_cycle`); on one machine or across machines (a link with an end
on another machine is TCP with the run's secret, made before the mesh's
first frame: `peers.CrossLinks`). Where such a link cannot be made, the run
keeps the rounds (a warning says which link and why), decided as the timers
start or at a restore, never inside a segment. ``MUJOU_PEER_LINKS=0`` in the
host's environment keeps the rounds (docs/processes.md).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import zmq

from .._runtime.keys import Key
from . import dataplane
from .failures import GroupLost, Stuck, failed_in, reported_by
from .peers import FAR, CrossLinks, Unreachable, after, fall_back, links_between, mesh_spec
from .rounds import POLL_S, SimulatedRounds

_Driver = Any
_Group = Any

__all__ = ["Segments", "triggering_cycle", "ENV"]

log = logging.getLogger("mujou_actors")

ENV = "MUJOU_PEER_LINKS"  # "0": placed runs keep the host on every message's path
ABORT_WAIT_S = 5.0  # how long the groups that live get to answer an abort


def triggering_cycle(trig_in: dict[str, set[str]]) -> list[str] | None:
    """A cycle of groups each of which triggers a node of the next, or None.

    On such a cycle a promise moves one delta cycle per exchange (the null
    message storm of Chandy-Misra-Bryant with zero lookahead in time), so the
    host's rounds serve it better.
    """
    state: dict[str, int] = {}  # 1: on the path, 2: done
    for start in sorted(trig_in):
        if state.get(start):
            continue
        path = [start]
        stack = [iter(sorted(trig_in.get(start, ())))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
                continue
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(trig_in.get(nxt, ()))))
    return None


class Segments(SimulatedRounds):
    """`rounds.SimulatedRounds` whose rounds are segments on peer links where they apply.

    Args:
        driver (driver._Driver): the run's driver.
    """

    def __init__(self, driver: _Driver) -> None:
        super().__init__(driver)
        self.segments = 0  # segments answered (rounds counts them too, as a round each)
        self._number = 0
        self._generation = 0
        self._layout: tuple[Any, ...] | None = None  # the groups' processes and epochs
        self._sent_mesh: set[str] = set()  # groups told this generation's mesh
        # The links with an end off the host's machine, made for each generation (their
        # endpoints, for the mesh's spec); why they could not be, once that happened
        # (then: rounds).
        self.cross = CrossLinks(driver.peer_host)
        self._ahead: dict[str, str] = {}
        self.unreachable: str | None = None
        out, ins, trig_in = links_between(driver.routes, driver.owner)
        self._links = out, ins, trig_in
        cycle = triggering_cycle(trig_in)
        self._why_not = None if cycle is None else (
            "a cycle of triggering links between groups " + " -> ".join(map(repr, cycle)))
        if self._why_not is not None:
            log.info("placed run: the host's rounds, not peer links: %s", self._why_not)

    def applies(self) -> bool:
        """Whether the next round may be a segment (see the module's docstring)."""
        driver = self.driver
        if self._why_not is not None or self.unreachable is not None or driver.item_listeners:
            return False
        return all(g.remote and g.link.ipc is None and g.name not in driver.dead
                   for g in driver.groups.values())

    def round(self, cap: Key | None) -> bool:
        """A segment up to ``cap`` (or the end) where peer links apply, else a round.

        Returns False when no group may run (the end, or the cap reached).
        """
        if not self.applies():
            return super().round(cap)
        driver = self.driver
        limit = driver.end_key if cap is None else cap
        groups = list(driver.groups.values())
        if not any(g.due is not None and (limit is None or g.due <= limit) for g in groups):
            return False
        if not self._renew_mesh(groups):  # a link between machines could not be made
            return super().round(cap)
        promises = self._promises(groups)
        self._number += 1  # a marker names its segment: one of an earlier one is stale
        generation = self._generation
        granted: dict[str, _Group] = {}
        try:
            for g in groups:
                messages, g.queued = g.queued, []
                g.waiting = True
                mesh = None
                if g.name not in self._sent_mesh:
                    mesh = mesh_spec(driver.tmpdir, groups, *self._links, ahead=self._ahead)
                    self._sent_mesh.add(g.name)
                seg = dataplane.Segment(self._number, generation,
                                        {p: k for p, k in promises.items() if p != g.name},
                                        mesh)
                g.link.send(dataplane.Grant(limit, False, messages, None, seg))
                granted[g.name] = g
        except GroupLost as lost:
            # A group died while its grant waited to go (its link blocked): the groups
            # granted already run the segment and must end it before the restore, which
            # would otherwise meet them in it.
            self._abort(granted, [], lost.exit.group)
            raise
        self._collect_segment(groups)
        self.segments += 1
        self.rounds += 1
        return True

    def wake(self) -> None:
        """A host request was queued: the segment in progress is paused for it."""
        self.driver.wake.set()

    def start_timers(self, tree: dict[str, Any] | None) -> None:
        """As the rounds start (`SimulatedRounds.start_timers`), then the mesh is opened
        where peer links apply: whether its links between machines can be made is known
        before the first delta cycle of the timers (else the run keeps the rounds)."""
        super().start_timers(tree)
        if self.applies():
            self._renew_mesh(list(self.driver.groups.values()))

    def settle_end(self) -> None:
        """As the rounds end (`SimulatedRounds.settle_end`), then every group is told the
        least next key of all: a group's own settles in a segment go only as far as the
        promises it heard, and the final tree prunes as one process does at the end."""
        super().settle_end()
        driver = self.driver
        if self.segments and not driver.dead and all(g.remote for g in driver.groups.values()):
            self.deliver(list(driver.groups.values()))

    # -- the mesh ---------------------------------------------------------------------------
    def _renew_mesh(self, groups: list[_Group]) -> bool:
        """A new generation when a group's process or epoch changed (a restart, a restore):
        the old links may hold frames of the abandoned timeline. Its links between
        machines are made first (`peers.CrossLinks`).

        Returns:
            bool: False when one of those could not be made: the run keeps the rounds
            from here on (said once, with why).
        """
        layout = tuple((g.name, g.pid, g.launches, g.link.epoch) for g in groups)
        if layout != self._layout:
            self._layout = None  # until this generation's links are made
            self._generation += 1
            self._sent_mesh.clear()
            try:
                self._ahead = self.cross.open(groups, self._generation)
            except Unreachable as exc:
                self.unreachable = str(exc)
                fall_back(self.unreachable, started=self.rounds > 0)
                return False
            self._layout = layout
        return True

    def _promises(self, groups: list[_Group]) -> dict[str, Key]:
        """Each group's promise from the next keys the host knows: the least of its
        own and, one delta cycle later, those of the groups that trigger it (a fixed
        point; the triggering links form no cycle)."""
        _, _, trig_in = self._links
        promise = {g.name: FAR if g.due is None else g.due for g in groups}
        for _ in range(len(groups)):
            changed = False
            for name in promise:
                for p in trig_in.get(name, ()):
                    k = after(promise[p])
                    if k < promise[name]:
                        promise[name], changed = k, True
            if not changed:
                break
        return promise

    # -- the answers ------------------------------------------------------------------------
    def _collect_segment(self, groups: list[_Group]) -> None:
        """Wait for every group's answer; pause the segment for a request, a stop or a
        failure; abort it when a group dies (raised as `GroupLost` once the others
        answered)."""
        driver = self.driver
        pending = {g.name: g for g in groups}
        poller = zmq.Poller()
        for g in groups:
            poller.register(g.link.sock, zmq.POLLIN)
        poller.register(driver.wake.fileno(), zmq.POLLIN)
        notices = getattr(driver.system, "notices", None)
        if notices is not None:
            poller.register(notices, zmq.POLLIN)
        reported: list[Any] = []  # (group, failure), oldest first
        paused = False
        finals: list[tuple[_Group, dataplane.Reply]] = []
        while pending:
            ready = dict(poller.poll(int(POLL_S * 1000)))
            if driver.wake.fileno() in ready:
                driver.wake.clear()
            for name, g in list(pending.items()):
                while g.link.sock in ready and (reply := g.link.receive(0)) is not None:
                    reported += reported_by(g.name, reply)
                    driver._route(g, reply)  # published copies (sends cross directly)
                    if not reply.partial:
                        finals.append((g, reply))
                        del pending[name]
                        break
            driver.logs.poll()  # a long segment: the groups' log records while it runs
            try:  # (a pause to a dead group blocks until its death is found: GroupLost)
                if not paused and pending and (reported or driver.stop_asked.is_set()
                                               or not driver.requests.empty()):
                    self._end_segment(pending.values(), "pause")
                    paused = True
                driver._check_exits()
            except GroupLost as lost:
                self._abort(pending, finals, lost.exit.group)
                raise
            if driver.stop_asked.is_set() and pending and driver._stop_left() <= 0:
                raise Stuck(self.busy_in(list(pending.values())))
        self._take_finals(finals)
        failed = failed_in(reported)
        if failed is not None:
            raise failed

    def _end_segment(self, groups: Any, how: str) -> None:
        for g in groups:
            g.link.send(dataplane.Grant(None, False, [], None, how))

    def _abort(self, pending: dict[str, _Group], finals: list[Any], died: str) -> None:
        """A group died: the others end the segment at once; their answers are waited
        for (a bounded while), so that no answer of this segment is read as the next's."""
        driver = self.driver
        living = {n: g for n, g in pending.items() if n != died and n not in driver.dead}
        self._end_segment(living.values(), "abort")
        until = time.monotonic() + ABORT_WAIT_S
        while living and time.monotonic() < until:
            for name, g in list(living.items()):
                reply = g.link.receive(POLL_S / len(living))
                if reply is not None and not reply.partial:
                    finals.append((g, reply))
                    del living[name]
        self._take_finals(finals)
        self._layout = None  # the mesh is reopened after the restore

    def _take_finals(self, finals: list[tuple[_Group, dataplane.Reply]]) -> None:
        """The answers' next keys, frontiers and times, as a round's are taken."""
        for g, reply in finals:
            self.note_reply(g, reply)
