"""Peer links: simulated time moved by the groups themselves, messages from group to group.

With the host's rounds (`rounds.SimulatedRounds`) every delta cycle that
sends to another group costs a round trip through the host: a grant, the
reply, the host's routing, the next grant. On peer links (one machine:
`segments.Segments` says when they apply) the host
hands every group a *segment*, a key up to which it may run (the next
snapshot, the end, or none), and the groups move their time between them
with the conservative protocol of Chandy, Misra and Bryant (Misra, 1986,
"Distributed discrete-event simulation", ACM Computing Surveys 18(1)):

- Each group sends, with every frame to a group that reads it, its
  *promise*: a key below which it will send nothing more. It is the least of
  its own next key and, for every group whose messages trigger one of its
  nodes, that group's promise one delta cycle later (a message sent at
  ``(t, d)`` triggers its reader at ``(t, d + 1)``).
- A group runs its next delta cycle when its key is no later than the
  segment's bound and than the promise of every group that sends to it:
  nothing can then reach it below that key, and a message at the key itself
  is seen from the next delta cycle on, as in one process. So each message
  reaches its reader's kernel before the reader runs past the message's key,
  stamped as in one process, and the results are the one process's, bit for
  bit, for any placement.
- Nor does it enter an instant while any other group may still run in an
  earlier one (every group hears every other's promise): one process ends
  the instant in which a hook failed and runs nothing later before its
  supervisor decides, so the hooks that run, and their counts, are the one
  process's under failures too. Groups thus move instant by instant
  together, and the delta cycles of an instant run where they may.
- A promise one delta cycle ahead is the protocol's lookahead. A cycle of
  triggering links between groups would need as many exchanges as delta
  cycles to move time on (Chandy-Misra's null-message storm): such nets keep
  the host's rounds (`segments.triggering_cycle`).

A segment ends when every group has nothing left up to the bound and every
group that sends to it has promised past it (the group answers the host then,
its next key in the answer), or when the host ends it (``pause``: a host
request, a stop, a failure elsewhere): the group stops before its next delta
cycle, sends a marker on each of its links, and answers once a marker (or a
promise past the bound) came from every group that sends to it, so every
message sent before the pause is in its reader's kernel, as after a round.
``abort`` (a group died) answers at once: the restore that follows reopens
the mesh. A node's failure is told to the host at once (a partial answer)
and holds the group's promise at the failed delta cycle (a ``one_for_one``
restart sends its ``on_start`` messages stamped there) until the host ends
the segment.
"""

from __future__ import annotations

import time
from typing import Any

import zmq

from .._runtime.kernel import LAST_DELTA, Kernel
from .._runtime.keys import Key
from ..errors import NodeError
from . import dataplane

__all__ = ["FAR", "PeerMesh", "run_segment", "RealTimePeers", "Abandoned", "links_between",
           "mesh_spec"]

_Group = Any  # driver._Group (the driver imports this module through segments)

FAR: Key = (1 << 62, LAST_DELTA)  # no promise: this group sends nothing more
NO_BOUND: Key = (1 << 62, 0)  # a segment without a bound: it ends when all is idle (< FAR)
POLL_S = 0.05  # how often a wait for peers looks at its host (a gone host ends the loop)
PUBLISH_S = 0.02  # published copies go to the host at least this often in a segment


def after(key: Key) -> Key:
    """The delta cycle after ``key`` (a message sent at ``key`` triggers its reader there)."""
    return key if key >= FAR else (key[0], key[1] + 1)


def links_between(routes: dataplane.Routes, owner: dict[str, str]
                  ) -> tuple[dict[str, dict[int, list[str]]], dict[str, set[str]],
                             dict[str, set[str]]]:
    """Who sends to whom: per group, its Outputs read in other groups (with those
    groups), the groups that send to it, and those whose messages trigger one of
    its nodes.

    Args:
        routes (dataplane.Routes): the net's Outputs and their readers.
        owner (dict[str, str]): node path -> group.
    """
    out: dict[str, dict[int, list[str]]] = {}
    ins: dict[str, set[str]] = {}
    trig_in: dict[str, set[str]] = {}
    for o, path in enumerate(routes.outputs):
        sender = owner[path.rpartition(".")[0]]
        readers: dict[str, bool] = {}
        for r in routes.readers[o]:
            g = owner[r.rpartition(".")[0]]
            readers[g] = readers.get(g, False) or r in routes.triggering[o]
        for g, triggers in sorted(readers.items()):
            if g == sender:
                continue
            out.setdefault(sender, {}).setdefault(o, []).append(g)
            ins.setdefault(g, set()).add(sender)
            if triggers:
                trig_in.setdefault(g, set()).add(sender)
    return out, ins, trig_in


def mesh_spec(folder: str, groups: list[_Group], out: dict[str, dict[int, list[str]]],
              ins: dict[str, set[str]], trig_in: dict[str, set[str]]) -> dict[str, Any]:
    """The mesh as plain data, for `peers.PeerMesh` (msgpack: string keys only)."""
    return {"folder": folder, "groups": sorted(g.name for g in groups),
            "pools": {g.name: g.spawn.get("pools") for g in groups},
            "out": {g: [[o, rs] for o, rs in sorted(by.items())] for g, by in out.items()},
            "ins": {g: sorted(s) for g, s in ins.items()},
            "trig_in": {g: sorted(s) for g, s in trig_in.items()}}


class PeerMesh:
    """A group's links to every other group of the run, of one mesh generation.

    Args:
        me (str): this group's name.
        generation (int): the mesh's generation (`dataplane.Segment.generation`).
        spec (dict): the mesh, as the host describes it (`mesh_spec`):
            ``folder`` (the run's private folder for the sockets), ``groups``
            (every group, sorted: a link's address names their indices),
            ``pools`` (each group's shared-memory prefix, or None), ``out``
            (per group: ``[output, [reader groups]]`` pairs), ``ins`` and
            ``trig_in`` (per group: the groups that send to it, and those
            whose messages trigger one of its nodes).
        declared (list[type]): every Output's declared type (`Routes.declared`).
        traffic (list[int] | None): the counts of the mesh this one replaces
            (`traffic`), carried on; None: from zero.

    Raises:
        zmq.ZMQError: a link's address cannot be bound (the links opened are closed).
    """

    def __init__(self, me: str, generation: int, spec: dict[str, Any],
                 declared: list[type], traffic: list[int] | None = None) -> None:
        self.me = me
        # Port messages sent (once each, however many groups read it) and received,
        # bytes sent and received: from `traffic` (the mesh this one replaces) on.
        self._traffic = list(traffic or (0, 0, 0, 0))
        self.generation = generation
        groups: list[str] = spec["groups"]
        mine = groups.index(me)
        self.out: dict[int, list[str]] = {o: [g for g in readers if g != me]
                                          for o, readers in spec["out"].get(me, [])}
        self.ins: list[str] = list(spec["ins"].get(me, []))
        self.trig_in: list[str] = list(spec["trig_in"].get(me, []))
        # Every other group: its promise bounds this group's instants too (see `bound`).
        peers = [g for g in groups if g != me]
        self.others = peers
        self.readers = {g for gs in self.out.values() for g in gs}  # groups it sends to
        self.promise_in: dict[str, Key] = {p: (-1, 0) for p in peers}
        self.announced: Key | None = None
        self.links: dict[str, dataplane.PeerLink] = {}
        try:
            for p in peers:
                theirs = groups.index(p)
                low, high = sorted((mine, theirs))
                address = f"ipc://{spec['folder']}/peer-{generation}-{low}-{high}"
                self.links[p] = dataplane.PeerLink(
                    address, declared, server=mine < theirs,
                    mine=_pool(spec["pools"].get(me), generation, theirs),
                    theirs=_pool(spec["pools"].get(p), generation, mine))
        except BaseException:
            self.close()
            raise

    def promise(self, due: Key | None) -> Key:
        """This group's promise with ``due`` its next key: the least key it may send at."""
        least = FAR if due is None else due
        for p in self.trig_in:
            k = after(self.promise_in[p])
            if k < least:
                least = k
        return least

    def bound(self) -> Key:
        """The latest key this group may run.

        No later than the promise of any group that sends to it (its messages
        must be in first), and no later than the instant of any group's promise:
        one process ends a failed instant and runs nothing after it before its
        supervisor decides, so no group may enter an instant while another may
        still fail in an earlier one.
        """
        least = FAR
        for k in self.promise_in.values():
            if k[0] < least[0]:
                least = (k[0], LAST_DELTA)
        for p in self.ins:
            k = self.promise_in[p]
            if k < least:
                least = k
        return least

    def done(self, cap: Key) -> bool:
        """Whether no group that sends to this one may still send up to ``cap``."""
        promise_in = self.promise_in
        return all(promise_in[p] > cap for p in self.ins)

    def traffic(self) -> list[int]:
        """``[messages_in, messages_out, bytes_in, bytes_out]`` on these links and the
        ones they replaced (a message sent to several groups counts once out)."""
        links = self.links.values()
        t = self._traffic
        return [t[0] + sum(k.messages_in for k in links), t[1],
                t[2] + sum(k.bytes_in for k in links), t[3] + sum(k.bytes_out for k in links)]

    def by_reader(self, sends: list[Any], index: dict[str, int]) -> dict[str, list[dataplane.Item]]:
        """``sends`` (`Kernel.take_sends`, in order) as items for each reading group, in order;
        each counted once as sent (`traffic`), however many groups read it.

        Args:
            sends (list[OutsideSend]): what this group's nodes sent outside it.
            index (dict[str, int]): Output path -> index (`Routes.output_index`).
        """
        per: dict[str, list[dataplane.Item]] = {}
        crossing = 0
        for s in sends:
            o = index[s.output]
            readers = self.out.get(o)
            if readers:
                crossing += 1
                for q in readers:
                    per.setdefault(q, []).append((s.t_ns, s.delta, s.sender, o, s.message))
        self._traffic[1] += crossing
        return per

    def close(self) -> None:
        """Close every link (its shared-memory pool goes with it); `traffic` keeps
        their counts."""
        self._traffic = self.traffic()
        for link in self.links.values():
            link.close()
        self.links.clear()


def _pool(prefix: str | None, generation: int, other: int) -> str | None:
    return None if prefix is None else f"{prefix}p{generation}.{other}"


class _Segment:
    """One segment's loop on a group's data-plane thread (see the module's docstring)."""

    def __init__(self, kernel: Kernel, routes: dataplane.Routes, mesh: PeerMesh,
                 host: dataplane.GroupLink, segment: dataplane.Segment, cap: Key,
                 published: Any, host_gone: Any, step: Any, failure_of: Any) -> None:
        self.kernel, self.routes, self.mesh, self.host = kernel, routes, mesh, host
        self.number, self.cap = segment.number, cap
        self.published, self.host_gone = published, host_gone
        self.step, self.failure_of = step, failure_of
        self.marked: set[str] = set()
        self.failure: dict[str, Any] | None = None
        self.more: list[dict[str, Any]] = []  # the failure's delta cycle's other failures
        self.told = False  # the failure went to the host (a partial answer)
        self.settled: Key = (-1, 0)
        self.last_publish = time.monotonic()
        self.marked_out = False  # pausing: this group's markers are sent
        # The host's view replaces the last segment's: between two segments a host write
        # or a restart may have lowered a group's next key below what it promised then.
        for p, k in segment.promises.items():
            if p in mesh.promise_in:
                mesh.promise_in[p] = k
        mesh.announced = None  # announced again: one frame per link per segment
        self.ending: str | None = None  # "pause" / "abort" once the host said so
        self.poller = zmq.Poller()
        for link in mesh.links.values():
            self.poller.register(link.sock, zmq.POLLIN)
            # A send waits while its peer is not connected yet (it is opening its
            # links); a peer that died is the host's to see: its abort ends the wait.
            link.blocked = self._blocked
        self.poller.register(host.sock, zmq.POLLIN)

    def _blocked(self) -> None:
        """Called while a send to a peer waits: the host's abort (or its end) ends it."""
        self.ending = self.ending or self.host_says()
        if self.ending == "abort":
            raise Abandoned
        self.host_gone()

    # -- what comes in ----------------------------------------------------------------
    def take_peers(self) -> None:
        """Deliver what the peers sent, note their promises and markers (never waits)."""
        mesh, kernel, local = self.mesh, self.kernel, self.routes.local_readers
        for p, link in mesh.links.items():
            while (got := link.receive()) is not None:
                kind, generation, number, promise, items = got
                if generation != mesh.generation:
                    continue  # of an abandoned mesh (cannot happen on a reopened one)
                for t, delta, sender, output, message in items:
                    for reader in local(output):
                        kernel.deliver(reader, message, t, delta, sender)
                if number != self.number:
                    continue  # a promise or marker of an earlier segment: the host's is newer
                if kind == dataplane.PEER_MARKER:
                    self.marked.add(p)
                elif promise > mesh.promise_in[p]:
                    mesh.promise_in[p] = promise

    def host_says(self) -> str | None:
        """``"pause"`` / ``"abort"`` if the host ends the segment (never waits)."""
        grant = self.host.receive(0)
        if grant is None:
            return None
        if grant.segment in ("pause", "abort"):
            return grant.segment
        raise RuntimeError(f"group: a grant came in the middle of a segment: {grant!r}")

    # -- what goes out ----------------------------------------------------------------
    def ship(self, sends: list[Any], due: Key | None) -> None:
        """Send each peer its messages and this group's promise (if either is new)."""
        mesh = self.mesh
        per = mesh.by_reader(sends, self.routes.output_index)
        promise = self.kernel.frontier if self.failure is not None else mesh.promise(due)
        if self.failure is not None and mesh.announced is not None:
            promise = min(promise, mesh.announced)
        announced = mesh.announced
        fresh = promise != announced
        # A group this one sends nothing to reads only the instant of its promise (`bound`),
        # and only while it may still run in the segment: one that promised past the cap
        # has nothing left to run, answers the host and reads its links no more (frames
        # to it would pile up until the link's high-water mark blocked this group).
        # Nor does a promise past the cap tell a group more than the one before it did.
        moved = announced is None or promise[0] != announced[0]
        sent_to, promise_in, cap = mesh.readers, mesh.promise_in, self.cap
        news = fresh and (announced is None or announced <= cap)
        for q in mesh.others:
            items = per.get(q)
            if items or (news and (q in sent_to or moved and (
                    announced is None or promise_in[q] <= cap))):
                mesh.links[q].send(dataplane.PEER_ITEMS, mesh.generation, self.number, promise,
                                   items or [])
        mesh.announced = promise

    def tell_host(self, final: bool) -> None:
        """The segment's answer (``final``), or a partial one: a failure, published copies."""
        kernel = self.kernel
        published = self.published.take() if self.published is not None else []
        failure, more = None, []
        if self.failure is not None and not self.told:
            failure, more, self.told = self.failure, self.more, True
        if not final and failure is None and not published:
            return
        self.last_publish = time.monotonic()
        self.host.send(dataplane.Reply(
            due=kernel.next_due(), time_ns=kernel.time_ns if kernel.timing else 0, sends=[],
            failure=failure, published=published, frontier=kernel.frontier,
            partial=not final, more_failures=more))

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> None:
        """Run the segment to its end (see the module's docstring); answer the host."""
        try:
            self._loop()
        except Abandoned:
            pass  # a send to a dead peer waited: the restore reopens the mesh
        self.tell_host(final=True)

    def _loop(self) -> None:
        mesh, kernel, cap = self.mesh, self.kernel, self.cap
        while True:
            self.take_peers()
            self.ending = ending = self.ending or self.host_says()
            if ending == "abort":
                break
            due = kernel.next_due()
            # Every delivery is followed by a settle (also a pause's last: the segment
            # may be the run's last), so each Input is pruned as one process prunes it.
            settled = min(mesh.bound(), FAR if due is None else due)
            if settled > self.settled:
                kernel.settle(settled)
                self.settled = settled
            if ending == "pause":
                if self.flushed():
                    break
                self.wait(POLL_S)
                continue
            if self.failure is None and due is not None and due <= cap and due <= mesh.bound():
                self.run_cycle(due)
                continue
            self.ship([], due)
            if self.failure is None and (due is None or due > cap) and mesh.done(cap):
                break
            self.wait(POLL_S)

    def run_cycle(self, due: Key) -> None:
        """One delta cycle; its sends (and a failure) go out at once."""
        kernel = self.kernel
        try:
            self.step(kernel, due, None)
        except NodeError as exc:
            # The cycle ran to its end: its sends go, and the group's promise stays at
            # it until the host ends the segment (a restart may send from here).
            self.failure = self.failure_of(exc)
            self.more = [self.failure_of(f) for f in kernel.take_failures()]
        self.ship(kernel.take_sends(), kernel.next_due())
        if self.failure is not None and not self.told:
            self.tell_host(final=False)
        elif self.published is not None and time.monotonic() - self.last_publish > PUBLISH_S:
            self.tell_host(final=False)

    def flushed(self) -> bool:
        """Pausing: markers sent; True once every sender's marker (or promise past the
        bound) is in."""
        mesh = self.mesh
        if not self.marked_out:
            for q in mesh.others:
                mesh.links[q].send(dataplane.PEER_MARKER, mesh.generation, self.number,
                                   mesh.announced or (-1, 0), [])
            self.marked_out = True
        return all(p in self.marked or mesh.promise_in[p] > self.cap for p in mesh.ins)

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for a frame from a peer or the host; a gone host
        ends the process."""
        if not self.poller.poll(int(timeout * 1000)):
            self.host_gone()


class Abandoned(Exception):
    """A send to a peer waited and the links were given up meanwhile: the host aborted
    the segment (simulated time), or the group was reset for a restore (real time)."""


def run_segment(kernel: Kernel, routes: dataplane.Routes, mesh: PeerMesh,
                host: dataplane.GroupLink, grant: dataplane.Grant, published: Any,
                host_gone: Any, step: Any, failure_of: Any) -> None:
    """Run one segment on the group's data-plane thread (see the module's docstring).

    Args:
        kernel (Kernel): the group's kernel (simulated time).
        routes (dataplane.Routes): the net's Outputs and this group's readers.
        mesh (PeerMesh): the group's links, of the segment's generation.
        host (dataplane.GroupLink): the link to the host (pauses come on it; the
            answers go on it).
        grant (dataplane.Grant): the segment's grant: its messages are delivered
            first, its ``bound`` is the segment's (None: no bound).
        published (group.Published | None): the copies the host subscribed to.
        host_gone (Callable[[], None]): called while waiting; ends the process
            when the host is gone.
        step (Callable): ``step(kernel, due, None)`` runs one delta cycle (`group._step`).
        failure_of (Callable): a `NodeError` as plain data (`group.failure_of`).

    Raises:
        RuntimeError: the host sent a grant other than a pause in the segment.
        Whatever the kernel raises other than a node's failure (the caller reports it).
    """
    assert isinstance(grant.segment, dataplane.Segment)
    for t, delta, sender, output, message in grant.messages:
        for reader in routes.local_readers(output):
            kernel.deliver(reader, message, t, delta, sender)
    cap = NO_BOUND if grant.bound is None else grant.bound
    _Segment(kernel, routes, mesh, host, grant.segment, cap, published, host_gone, step,
             failure_of).run()


class RealTimePeers:
    """A group's peer links in real time: its port messages straight to the groups that
    read them, and the flush of a cut on every link (the host's `realtime.PeerRelay`).

    In real time nothing waits for a promise: a message goes out as soon as
    the group's data-plane thread ships it and is written into its reader's
    kernel as it comes (as a host write: it triggers its reader at once).
    Each link keeps its order, so the messages from one group to another
    arrive in the order they were sent, as on the host's relay.

    A cut's flush (a grant with ``take`` and a `dataplane.Segment` naming the
    flush): the group ships what its nodes sent, sends a marker numbered as the
    flush on every link to a group it sends to, and answers the host once a
    marker of that number (or a later one) came from every group that sends to
    it. Every message sent before the flush is then in its reader's kernel.

    Args:
        mesh (PeerMesh): the group's links, of the host's latest generation.
        routes (dataplane.Routes): the net's Outputs and this group's readers.
    """

    def __init__(self, mesh: PeerMesh, routes: dataplane.Routes) -> None:
        self.mesh = mesh
        self.routes = routes
        self.marked: dict[str, int] = {}  # the latest flush marker from each sender
        self.flushing: int | None = None  # the flush waiting for its senders' markers

    def ship(self, sends: list[Any]) -> None:
        """Send each reading group its part of ``sends`` (`Kernel.take_sends`), in order."""
        mesh = self.mesh
        for q, items in mesh.by_reader(sends, self.routes.output_index).items():
            mesh.links[q].send(dataplane.PEER_ITEMS, mesh.generation, 0, (-1, 0), items)

    def take(self, kernel: Kernel) -> None:
        """Write what the peers sent into ``kernel`` (as host writes); note their markers."""
        mesh, local = self.mesh, self.routes.local_readers
        for p, link in mesh.links.items():
            while (got := link.receive()) is not None:
                kind, generation, number, _, items = got
                if generation != mesh.generation:
                    continue  # of an abandoned timeline
                for t, delta, sender, output, message in items:
                    for reader in local(output):
                        kernel.write(reader, message, (t, delta, sender))
                if kind == dataplane.PEER_MARKER and number > self.marked.get(p, -1):
                    self.marked[p] = number

    def flush(self, number: int) -> None:
        """Start flush ``number``: a marker on every link to a reading group."""
        mesh = self.mesh
        for q in mesh.readers:
            mesh.links[q].send(dataplane.PEER_MARKER, mesh.generation, number, (-1, 0), [])
        self.flushing = number

    def flushed(self) -> bool:
        """Whether the flush in progress is done (every sender's marker came); it ends then."""
        number = self.flushing
        if number is None or any(self.marked.get(p, -1) < number for p in self.mesh.ins):
            return False
        self.flushing = None
        return True
