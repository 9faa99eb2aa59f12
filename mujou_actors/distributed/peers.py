"""Peer links: simulated time moved by the groups themselves, messages from group to group.

With the host's rounds (`rounds.SimulatedRounds`) every delta cycle that
sends to another group costs a round trip through the host: a grant, the
reply, the host's routing, the next grant. On peer links
(`segments.Segments` says when they apply) the host
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
the mesh. An abort may come after a pause (a group found dead as the others
pause: their flush, or a send, then waits on it for good), so the host is
heard until the segment ends, a pause never hiding the abort behind it. Nor
does a segment outlive its timeline: the group's reset for a restore (its
kernel replaced), or a grant of the restore's epoch read in it, ends it too,
unanswered (that grant kept for the group's next read). A node's failure is
told to the host at once (a partial answer) and holds the group's promise at
the failed delta cycle (a ``one_for_one`` restart sends its ``on_start``
messages stamped there) until the host ends the segment.

One protocol, two transports (`dataplane.PeerLink`): the link between two
groups of one machine is ``ipc://`` with shared memory for large tensors, as
their links to the host on the host's machine: in the run's private folder
there, in the listening group's private folder on a member's
(`LocalFolder`); a link between two machines is ``tcp://`` with the run's
secret (CURVE), every tensor inline. The mesh's description (`mesh_spec`)
names the links with an end off the host's machine; their sockets cannot be
named ahead (the listening end's port is the system's pick on its own
machine, a member's folder is made there), so the host has them made before
the mesh's first frame (`CrossLinks`: the listening ends bound, the others
connected, every handshake waited for, through the groups' control
requests), and each group's `PeerMesh` takes its ends over. A member's
``ipc://`` link that cannot be made (no folder) is TCP instead, said in the
group's log. Where a TCP link cannot be made (a firewall, an address one
machine cannot reach), the run keeps the host's relay: decided when the mesh
is opened, before the timers start (or at a restore, which reopens the mesh
anyway), never in the middle of a segment.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from .._runtime.kernel import LAST_DELTA, Kernel
from .._runtime.keys import Key
from ..errors import NodeError, RemoteError
from . import dataplane
from ._loopback import LOOPBACK, MEMBER_FOLDER_ENV, PEER_FOLDER_PREFIX, remove_peer_folder

__all__ = ["FAR", "PeerMesh", "run_segment", "RealTimePeers", "Abandoned", "links_between",
           "mesh_spec", "CrossLinks", "Unreachable", "machine_of", "pair_key", "fall_back",
           "LocalFolder", "connect_end", "ipc_pools", "AgeRing", "AGE_SAMPLES"]

log = logging.getLogger("mujou_actors")

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
              ins: dict[str, set[str]], trig_in: dict[str, set[str]],
              ahead: dict[str, str] | None = None) -> dict[str, Any]:
    """The mesh as plain data, for `peers.PeerMesh` (msgpack: string keys only).

    ``ahead``: the links made before the mesh, those with an end off the host's
    machine (`pair_key` -> the listening end's endpoint, `CrossLinks.open`:
    ``tcp://`` between machines, ``ipc://`` between two groups of one member's),
    whose ends the groups already hold; every other link is ``ipc://`` in ``folder``.
    """
    return {"folder": folder, "groups": sorted(g.name for g in groups),
            "pools": {g.name: g.spawn.get("pools") for g in groups},
            "out": {g: [[o, rs] for o, rs in sorted(by.items())] for g, by in out.items()},
            "ins": {g: sorted(s) for g, s in ins.items()},
            "trig_in": {g: sorted(s) for g, s in trig_in.items()},
            "ahead": dict(ahead or {})}


def pair_key(groups: list[str], a: str, b: str) -> str:
    """The name of the link between groups ``a`` and ``b``: their indices in the sorted
    ``groups``, the lower first (its ``ipc://`` address ends with it)."""
    low, high = sorted((groups.index(a), groups.index(b)))
    return f"{low}-{high}"


def machine_of(g: _Group) -> str:
    """The machine a group runs on, as its placement names it; ``""``: the host's.

    Two groups whose machines differ are joined by TCP with the run's secret;
    two of one machine by ``ipc://`` and shared memory: in the run's private
    folder on the host's machine (named ahead, `mesh_spec`), in the listening
    group's private folder on a member's (`LocalFolder`, its address told by
    that group, `CrossLinks`; TCP where the folder or the socket cannot be
    made). Tests stand machines in for groups of one process here.
    """
    return g.member or ""


def ipc_pools(endpoint: str, server: bool) -> tuple[str | None, str | None]:
    """The shared-memory pools of the two ends of an ``ipc://`` link made ahead
    (`LocalFolder.bind`, `connect_end`): this end's and the other's, named after the
    folder and the socket, so that both ends know both names from the endpoint alone
    and the pools go with the folder (`_loopback.remove_peer_folder`).

    Args:
        endpoint (str): ``ipc://FOLDER/NAME``, FOLDER's name beginning with
            `_loopback.PEER_FOLDER_PREFIX`.
        server (bool): this end binds the address.

    Returns:
        tuple[str | None, str | None]: ``(mine, theirs)``; ``(None, None)``
        (every tensor inline) for an address of any other form.
    """
    folder, _, name = endpoint.removeprefix("ipc://").rpartition("/")
    tag = f"{os.path.basename(folder)}.{name}."
    if not (endpoint.startswith("ipc://") and tag.startswith(PEER_FOLDER_PREFIX)
            and all(c.isalnum() or c in "._-" for c in tag)):
        return None, None
    listening, connecting = tag + "s.", tag + "c."
    return (listening, connecting) if server else (connecting, listening)


class LocalFolder:
    """A group's private folder for the listening ``ipc://`` ends of its peer links to the
    groups of its own machine, on a member's machine (`CrossLinks`).

    Made at the first such end (``mkdtemp``: mode 0700, this user's) in the
    member's private folder (`_loopback.MEMBER_FOLDER_ENV`, in the environment
    of the member's processes; elsewhere the system's temporary folder), as
    the host's machine's links are in the run's private folder: only this
    user's processes can reach the sockets, and the frames on them are those
    of the host's machine's ``ipc://`` links (no CURVE). Removed with the
    pools of its links by `remove` (the group's close, or its end when it
    finds the host gone); what a killed group leaves goes with the member's
    folder (`_loopback.remove_folder`).
    """

    def __init__(self) -> None:
        self.path: str | None = None  # made at the first bind

    def bind(self, name: str, declared: list[type]) -> dataplane.PeerLink:
        """The listening end of a link: ``ipc://FOLDER/NAME``, with the shared-memory
        pools of `ipc_pools`.

        Args:
            name (str): the socket's file name (``peer-GENERATION-KEY``).
            declared (list[type]): every Output's declared type.

        Raises:
            ValueError: ``name`` is not a plain file name.
            OSError: the folder cannot be made.
            zmq.ZMQError: the address cannot be bound (too long a path, ...).
        """
        if not name or name.startswith(".") or "/" in name or "\0" in name:
            raise ValueError(f"not a socket's name: {name!r}")
        if self.path is None:
            self.path = tempfile.mkdtemp(prefix=PEER_FOLDER_PREFIX,
                                         dir=os.environ.get(MEMBER_FOLDER_ENV) or None)
        address = f"ipc://{self.path}/{name}"
        mine, theirs = ipc_pools(address, server=True)
        return dataplane.PeerLink(address, declared, server=True, mine=mine, theirs=theirs)

    def remove(self) -> None:
        """Remove the folder and its links' pools (idempotent; a later `bind` makes another)."""
        path, self.path = self.path, None
        if path is not None:
            remove_peer_folder(path)


def connect_end(endpoint: str, declared: list[type],
                key: Callable[[], bytes]) -> dataplane.PeerLink:
    """The connecting end of a link made ahead: to ``endpoint`` as its listening end told
    it (`CrossLinks`): ``ipc://`` with the pools of `ipc_pools`, or ``tcp://`` with the
    run's secret (``key()``, asked only then)."""
    if endpoint.startswith("ipc://"):
        mine, theirs = ipc_pools(endpoint, server=False)
        return dataplane.PeerLink(endpoint, declared, server=False, mine=mine, theirs=theirs)
    return dataplane.PeerLink(endpoint, declared, server=False, mine=None, theirs=None,
                              secret=key())


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
            whose messages trigger one of its nodes), ``ahead`` (the links
            made before the mesh, `pair_key` -> endpoint: `CrossLinks`).
        declared (list[type]): every Output's declared type (`Routes.declared`).
        before (PeerMesh | None): the mesh this one replaces (closed), whose
            counts go on here (`traffic`, `peer_bytes`, `refused`); None: from zero.
        ahead (dict[str, dataplane.PeerLink] | None): this group's ends of the
            links made before the mesh (between machines, or on a member's
            machine), by peer (`CrossLinks`; the group's ``BindPeers`` and
            ``ConnectPeers``): taken over here, closed with the mesh. Every link
            the spec names in ``ahead`` must be in it.
        waiting (Callable[[], None] | None): called while a connecting end waits for
            its peer to listen (`unixstream.UnixStream.connect`); raises to give up.

    Raises:
        zmq.ZMQError, OSError: a link's address cannot be bound (the links opened are
            closed).
        unixstream.StreamError: a peer of this machine did not listen within
            `unixstream.CONNECT_S` (likewise).
        RuntimeError: a link the spec names in ``ahead`` was not made before (the
            links opened and those of ``ahead`` are closed).
    """

    def __init__(self, me: str, generation: int, spec: dict[str, Any],
                 declared: list[type], before: PeerMesh | None = None,
                 ahead: dict[str, dataplane.PeerLink] | None = None,
                 waiting: Callable[[], None] | None = None) -> None:
        self.me = me
        # Port messages sent (once each, however many groups read it) and received,
        # bytes sent and received; the bytes by peer (what crossed machines, for
        # `placed_run.machine_stats`); the connections its TCP listeners refused:
        # from ``before`` (the meshes this one replaces) on.
        self._traffic = before.traffic() if before is not None else [0, 0, 0, 0]
        self._peer_bytes = before.peer_bytes() if before is not None else {}
        self._refused = before.refused if before is not None else 0
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
        # Each link's endpoint (its transport: ``ipc://`` or ``tcp://``), kept once closed.
        self.endpoints: dict[str, str] = {}
        made = dict(ahead or {})
        across: dict[str, str] = spec.get("ahead") or {}
        try:
            # The ends this group listens on first, then those it connects: a connect waits
            # for its peer's listening end, and every group binds before it connects.
            for p in sorted(peers, key=lambda p: groups.index(p) < mine):
                theirs = groups.index(p)
                key = pair_key(groups, me, p)
                if key in across:  # an end off the host's machine: made before the mesh
                    link = made.pop(p, None)
                    if link is None:
                        raise RuntimeError(f"group {me!r}: the link to group {p!r} is made "
                                           f"ahead ({across[key]}) but was not made for "
                                           f"mesh generation {generation}")
                else:
                    link = dataplane.PeerLink(
                        f"ipc://{spec['folder']}/peer-{generation}-{key}", declared,
                        server=mine < theirs,
                        mine=_pool(spec["pools"].get(me), generation, theirs),
                        theirs=_pool(spec["pools"].get(p), generation, mine), waiting=waiting)
                self.links[p] = link
                self.endpoints[p] = link.endpoint
            self.links = {p: self.links[p] for p in peers}  # in the groups' order
            streams = [link.sock for link in self.links.values() if link.direct]
            for link in self.links.values():
                link.also = [x for x in streams if x is not link.sock]  # type: ignore[misc]
        except BaseException:
            self.close()
            raise
        finally:
            for link in made.values():  # made for links this mesh does not have
                link.close()

    @property
    def direct(self) -> bool:
        """bool: every link is a Unix stream: any thread may post on them (a link between
        machines is a ZeroMQ socket, for the data-plane thread only)."""
        return all(link.direct for link in self.links.values())

    def pending(self) -> bool:
        """Whether a link holds a whole frame read ahead (no socket says so)."""
        return any(link.pending for link in self.links.values())

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

    def peer_bytes(self) -> dict[str, list[int]]:
        """``{peer: [bytes_in, bytes_out]}`` on the link to each group, these links' and
        the ones they replaced (which of them crossed machines: `placed_run.machine_stats`)."""
        out = {p: list(b) for p, b in self._peer_bytes.items()}
        for p, link in self.links.items():
            b = out.setdefault(p, [0, 0])
            b[0] += link.bytes_in
            b[1] += link.bytes_out
        return out

    @property
    def refused(self) -> int:
        """int: connections the TCP listeners of this mesh and of those it replaced refused
        (the CURVE handshake failed: a peer without the run's secret), until their own
        peer was in (`CrossLinks` waits for each)."""
        return self._refused + sum(link.refused for link in self.links.values())

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
        """Close every link (its shared-memory pool goes with it); `traffic`,
        `peer_bytes` and `refused` keep their counts."""
        self._traffic = self.traffic()
        self._peer_bytes = self.peer_bytes()
        self._refused = self.refused
        for link in self.links.values():
            link.close()
        self.links.clear()


def _pool(prefix: str | None, generation: int, other: int) -> str | None:
    return None if prefix is None else f"{prefix}p{generation}.{other}"


class _Segment:
    """One segment's loop on a group's data-plane thread (see the module's docstring)."""

    def __init__(self, kernel: Kernel, routes: dataplane.Routes, mesh: PeerMesh,
                 host: dataplane.GroupLink, segment: dataplane.Segment, cap: Key,
                 published: Any, host_gone: Any, step: Any, failure_of: Any,
                 stale: Callable[[], bool] | None = None) -> None:
        self.kernel, self.routes, self.mesh, self.host = kernel, routes, mesh, host
        self.epoch = host.epoch  # the segment grant's: a grant of another is a restore's
        self.stale = stale or _never  # the group was reset (a restore): the segment is over
        self.restored = False  # ended by a restore (`stale`, a later epoch): no answer
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
        """Called while a send to a peer waits: the host's abort, the group's reset for a
        restore (or the host's end) ends it. A pause does not: the host is heard on while
        the send waits, since the abort that a peer's death brings may follow the pause."""
        self.hear()
        if self.ending == "abort":
            raise Abandoned
        self.host_gone()

    def hear(self) -> None:
        """Take what the host said so far (never waits): a pause, then maybe the abort.

        An abort ends the segment whatever came before it, so a pause is no reason to
        stop listening (it was: a group paused while it sent to a peer that had just
        died waited for good on that peer, the host's abort unread behind the pause).
        The group's reset for a restore (`stale`) is an abort too: the host has given
        the segment up, and the restored kernel is not the one it ran.
        """
        while self.ending != "abort":
            if self.stale():
                self.ending, self.restored = "abort", True
                return
            said = self.host_says()
            if said is None:
                return
            self.ending = said

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
                        kernel.deliver(reader, message, t, delta, sender, owned=True)
                if number != self.number:
                    continue  # a promise or marker of an earlier segment: the host's is newer
                if kind == dataplane.PEER_MARKER:
                    self.marked.add(p)
                elif promise > mesh.promise_in[p]:
                    mesh.promise_in[p] = promise

    def host_says(self) -> str | None:
        """``"pause"`` / ``"abort"`` if the host ends the segment (never waits).

        A grant of a later epoch than the segment's (the host restored every
        group without this one's abort reaching it) ends the segment as an
        abort does; the grant is kept for the group's next read
        (`dataplane.GroupLink.put_back`), and the segment goes unanswered (the
        host has moved on to the restored timeline: an answer would be dropped).
        """
        host = self.host
        grant = host.receive(0)
        if grant is None:
            return None
        if host.epoch != self.epoch:
            host.put_back(grant, self.epoch)
            self.restored = True
            return "abort"
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
        if self.restored or self.stale():
            # The host restored every group meanwhile: it waits for no answer of this
            # segment (one would be dropped as of the abandoned timeline), and what the
            # restored kernel publishes goes with the answer to its next grant.
            return
        self.tell_host(final=True)

    def _loop(self) -> None:
        mesh, kernel, cap = self.mesh, self.kernel, self.cap
        while True:
            self.take_peers()
            self.hear()  # (paused: still heard, an abort may follow)
            ending = self.ending
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
        if self.mesh.pending():
            return  # frames read ahead while a send waited: no socket says so
        if not self.poller.poll(int(timeout * 1000)):
            self.host_gone()


class Abandoned(Exception):
    """A send to a peer waited and the links were given up meanwhile: the host aborted
    the segment (simulated time), or the group was reset for a restore (real time)."""


def run_segment(kernel: Kernel, routes: dataplane.Routes, mesh: PeerMesh,
                host: dataplane.GroupLink, grant: dataplane.Grant, published: Any,
                host_gone: Any, step: Any, failure_of: Any,
                stale: Callable[[], bool] | None = None) -> None:
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
        stale (Callable[[], bool] | None): whether the group was reset for a
            restore since the segment began (its kernel replaced): the segment
            ends then, as on the host's abort; None: never asked.

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
             failure_of, stale).run()


def _never() -> bool:
    return False


AGE_SAMPLES = 256  # the newest messages whose ages an `AgeRing` keeps (a power of 2)


class AgeRing:
    """The raw ages of the newest `AGE_SAMPLES` messages noted (real time), ns.

    A fixed array written in turn: noting a message costs one subtraction
    and one store, no allocation, whatever the run's length. What a raw age
    is, and which clock offsets turn it into the true age, its owner says
    (`realtime.MessageAges`: the host's relay; `RealTimePeers.clocks`: a
    group's peer links from another machine).
    """

    __slots__ = ("_ring", "_count")

    def __init__(self) -> None:
        self._ring = array("q", bytes(8 * AGE_SAMPLES))
        self._count = 0

    def note(self, base_ns: int, items: Sequence[tuple[Any, ...]]) -> None:
        """Note a raw age ``base_ns - t_ns`` for each of ``items`` (stamped ``t_ns`` first)."""
        ring, n = self._ring, self._count
        for item in items:
            ring[n & (AGE_SAMPLES - 1)] = base_ns - item[0]
            n += 1
        self._count = n

    @property
    def count(self) -> int:
        """int: the messages noted so far (the newest `AGE_SAMPLES` of them are kept)."""
        return self._count

    def raw(self) -> list[int]:
        """The raw ages kept (ns), oldest first: the newest `AGE_SAMPLES` at most."""
        n = self._count
        if n <= AGE_SAMPLES:
            return list(self._ring[:n])
        start = n & (AGE_SAMPLES - 1)
        return list(self._ring[start:]) + list(self._ring[:start])


class RealTimePeers:
    """A group's peer links in real time: its port messages straight to the groups that
    read them, and the flush of a cut on every link (the host's `realtime.PeerRelay`).

    In real time nothing waits for a promise: a message goes out as soon as
    it is shipped (the first send of a hook from the hook's own thread, the
    others by the group's data-plane thread: `group.GroupServer`), and is
    written into its reader's kernel as it comes (as a host write: it
    triggers its reader at once). Whoever ships, the sends are taken and
    queued under one lock, so each link keeps the order of the takes.
    Each link keeps its order, so the messages from one group to another
    arrive in the order they were sent, as on the host's relay.

    A cut's flush (a grant with ``take`` and a `dataplane.Segment` naming the
    flush): the group ships what its nodes sent, sends a marker numbered as the
    flush on every link to a group it sends to, and answers the host once a
    marker of that number (or a later one) came from every group that sends to
    it. Every message sent before the flush is then in its reader's kernel.

    Message ages: for each frame from a group on another machine, the
    group notes its own monotonic clock at the frame's arrival minus each
    send's stamp put on the sender's monotonic clock (the stamp plus the
    sender's timer origin), in that machine's `AgeRing`: the age plus this
    machine's clock offset less the sender's (each machine's clock minus the
    host's), which the host takes out (`placed_run.machine_stats`). The host
    tells the senders' origins once their timers run (`group.PeerClocks`):
    until then, and for links within one machine, nothing is noted.

    Args:
        mesh (PeerMesh): the group's links, of the host's latest generation.
        routes (dataplane.Routes): the net's Outputs and this group's readers.
    """

    def __init__(self, mesh: PeerMesh, routes: dataplane.Routes) -> None:
        self.mesh = mesh
        self.routes = routes
        # Sender group on another machine -> (its timer origin on its machine's monotonic
        # clock, that machine's ring): replaced whole (set by the control thread).
        self.clocks: dict[str, tuple[int, AgeRing]] = {}
        self.marked: dict[str, int] = {}  # the latest flush marker from each sender
        self.flushing: int | None = None  # the flush waiting for its senders' markers

    def post(self, sends: list[Any]) -> list[dataplane.PeerLink]:
        """Queue for each reading group its part of ``sends`` (`Kernel.take_sends`), in
        order, never waiting (`dataplane.PeerLink.post`).

        Returns:
            list[dataplane.PeerLink]: the links to `dataplane.PeerLink.drain` before
            the messages are used again (their sockets have not taken all of it yet).
        """
        mesh = self.mesh
        left = []
        for q, items in mesh.by_reader(sends, self.routes.output_index).items():
            link = mesh.links[q]
            if link.post(dataplane.PEER_ITEMS, mesh.generation, 0, (-1, 0), items):
                left.append(link)
        return left

    def take(self, kernel: Kernel, most: int | None = None) -> int:
        """Write what the peers sent into ``kernel`` (as host writes); note their markers.

        Args:
            kernel (Kernel): the group's kernel.
            most (int | None): at most this many frames from each link (an idle
                worker's read, `group.GroupServer`: it runs the hooks before it
                reads on, whatever a fast sender keeps sending); None: all that
                came (the data-plane thread's).

        Returns:
            int: the frames taken.
        """
        mesh, local, clocks = self.mesh, self.routes.local_readers, self.clocks
        taken = 0
        for p, link in mesh.links.items():
            clock = clocks.get(p)  # a sender on another machine, its timer's origin known
            left = -1 if most is None else most
            while left and (got := link.receive()) is not None:
                left -= 1
                taken += 1
                kind, generation, number, _, items = got
                if generation != mesh.generation:
                    continue  # of an abandoned timeline
                if clock is not None and items:
                    clock[1].note(time.monotonic_ns() - clock[0], items)
                for t, delta, sender, output, message in items:
                    for reader in local(output):
                        kernel.write(reader, message, (t, delta, sender), owned=True)
                if kind == dataplane.PEER_MARKER and number > self.marked.get(p, -1):
                    self.marked[p] = number
        return taken

    def give_back(self) -> list[dataplane.PeerLink]:
        """Give the blocks freed back on every link whose freed blocks reach an eighth of
        its sender's pool (`wire.Decoder.freed_due`): a group that only reads from a
        sender sends it no frame that would carry them.

        Returns:
            list[dataplane.PeerLink]: the links to drain (as `post`'s).
        """
        mesh = self.mesh
        return [link for link in mesh.links.values()
                if link.decoder.freed_due and link.give_back(mesh.generation)]

    def flush(self, number: int) -> list[dataplane.PeerLink]:
        """Start flush ``number``: a marker queued on every link to a reading group.

        Returns:
            list[dataplane.PeerLink]: the links to drain (as `post`'s).
        """
        mesh = self.mesh
        left = []
        for q in mesh.readers:
            link = mesh.links[q]
            if link.post(dataplane.PEER_MARKER, mesh.generation, number, (-1, 0), []):
                left.append(link)
        self.flushing = number
        return left

    def flushed(self) -> bool:
        """Whether the flush in progress is done (every sender's marker came); it ends then."""
        number = self.flushing
        if number is None or any(self.marked.get(p, -1) < number for p in self.mesh.ins):
            return False
        self.flushing = None
        return True


# -- the host's side: the links between machines --------------------------------------------

LINK_SETUP_S = 10.0  # the bound on the handshakes of a generation's links between machines


class Unreachable(Exception):
    """A peer link between machines could not be made (says which, where, and why)."""


class CrossLinks:
    """The host's side of the peer links with an end off the host's machine: made for each
    mesh generation before its first frame, through the groups' control requests.

    A ``tcp://`` link's listening end takes a port its own machine picks, and
    a member's ``ipc://`` link a folder there (`LocalFolder`), so no address
    can be named ahead as the host's machine's ``ipc://`` ones are. For each
    pair of groups not both on the host's machine (`machine_of`), the group
    first in the mesh's order listens, the other connects:

    1. every listening end is bound and the group answers with its endpoint
       (``BindPeers``): toward a group of another machine, with the run's
       secret (CURVE server), on the address its machine advertises
       (`peer_host`: the member's, the leader's for the host's machine;
       loopback unless the placement says otherwise); toward a group of its
       own member's machine, ``ipc://`` in its private folder there
       (``peer-GENERATION-KEY``, as on the host's machine, with shared memory:
       `LocalFolder`), or, where that cannot be made, TCP as between machines
       (the group logs why);
    2. every connecting end connects to it (``ConnectPeers``);
    3. every group waits for the handshake of each of its ends, all within one
       bound (``CheckPeers``), the connecting ends first (a wrong secret fails
       one at once, where its listener would wait out the bound for the right
       one): a wrong secret, a port a firewall drops, an address the other
       machine cannot reach fails here, before any frame.

    The groups hold their ends until their `PeerMesh` of that generation takes
    them over; `mesh_spec` names these links (`pair_key` -> endpoint, the
    transport its scheme). An ``ipc://`` end has no handshake: its check passes
    at once.

    Args:
        peer_host (Callable[[str, str], str] | None): the address to bind on
            machine ``m`` (``""``: the host's) for a link toward machine ``n``:
            ``peer_host(m, n)``; None: loopback (machines that tests stand in
            for groups of one host).
        timeout (float | None): the bound on step 3, seconds; None: `LINK_SETUP_S`.
    """

    def __init__(self, peer_host: Callable[[str, str], str] | None = None,
                 timeout: float | None = None) -> None:
        self.peer_host = peer_host
        self.timeout = LINK_SETUP_S if timeout is None else timeout
        self.opened = 0  # generations whose links were made
        self.links = 0  # TCP links made so far (between machines, or a member's fallback)
        self.local = 0  # ipc:// links on a member's machine made so far
        # The latest generation's links: pair_key -> the listening end's endpoint.
        self.endpoints: dict[str, str] = {}

    def pairs(self, groups: list[_Group]) -> list[tuple[_Group, _Group]]:
        """Every pair of groups with an end off the host's machine: (listening end,
        connecting end)."""
        ordered = sorted(groups, key=lambda g: g.name)
        return [(a, b) for i, a in enumerate(ordered) for b in ordered[i + 1:]
                if machine_of(a) or machine_of(b)]

    def open(self, groups: list[_Group], generation: int) -> dict[str, str]:
        """Make the links of mesh ``generation`` with an end off the host's machine (see the
        class's docstring).

        Returns:
            dict[str, str]: `pair_key` -> the listening end's endpoint (for `mesh_spec`);
            empty when every group is on the host's machine.

        Raises:
            Unreachable: a link could not be made, or a group did not answer in time
                (the groups' ends made so far are closed).
            GroupDied: a group died meanwhile (as any control request).
        """
        pairs = self.pairs(groups)
        if not pairs:
            return {}
        names = sorted(g.name for g in groups)
        by_name = {g.name: g for pair in pairs for g in pair}
        involved = {name: by_name[name] for name in sorted(by_name)}
        try:
            return self._open(pairs, names, involved, generation)
        except Unreachable:
            for g in involved.values():
                g.control.drop_peers()
            raise

    def _open(self, pairs: list[tuple[_Group, _Group]], names: list[str],
              involved: dict[str, _Group], generation: int) -> dict[str, str]:
        binds: dict[str, dict[str, str]] = {}
        local: dict[str, dict[str, str]] = {}  # the ipc:// ends' socket names, on a member
        for server, client in pairs:
            machine, toward = machine_of(server), machine_of(client)
            binds.setdefault(server.name, {})[client.name] = self._host(machine, toward)
            if machine == toward:
                local.setdefault(server.name, {})[client.name] = (
                    f"peer-{generation}-{pair_key(names, server.name, client.name)}")
        endpoints: dict[tuple[str, str], str] = {}
        for name, hosts in binds.items():
            try:
                bound = involved[name].control.bind_peers(generation, hosts,
                                                          local.get(name, {}))
            except (RemoteError, TimeoutError) as exc:  # not that machine's address; no answer
                raise Unreachable(f"group {name!r} on {_on(involved[name])} could not listen "
                                  f"for its peer links on {sorted(set(hosts.values()))}: "
                                  f"{_why(exc)}") from exc
            for peer, endpoint in bound.items():
                endpoints[(name, peer)] = endpoint
        connects: dict[str, dict[str, str]] = {}
        for (server, client), endpoint in endpoints.items():
            connects.setdefault(client, {})[server] = endpoint
        for name, reach in connects.items():
            try:
                involved[name].control.connect_peers(generation, reach)
            except (RemoteError, TimeoutError) as exc:  # an endpoint it cannot name; no answer
                raise Unreachable(f"group {name!r} on {_on(involved[name])} could not "
                                  f"connect its peer links to {sorted(reach.values())}: "
                                  f"{_why(exc)}") from exc
        deadline = time.monotonic() + self.timeout
        checks = [(n, False) for n in connects] + [(n, True) for n in binds]
        for name, listening in checks:
            g = involved[name]
            try:
                failed = g.control.check_peers(generation,
                                               max(0.1, deadline - time.monotonic()), listening)
            except (RemoteError, TimeoutError) as exc:  # a group too busy to answer in time
                raise Unreachable(f"group {name!r} on {_on(g)} did not say whether its peer "
                                  f"links are in: {exc}") from exc
            if failed:
                peer, why = sorted(failed.items())[0]
                pair = (name, peer) if (name, peer) in endpoints else (peer, name)
                raise Unreachable(
                    f"the peer link between group {name!r} on {_on(g)} and group {peer!r} on "
                    f"{_on(involved[peer])} (listening at {endpoints[pair]}) did not complete "
                    f"its handshake: {why}")
        self.opened += 1
        ipc = sum(e.startswith("ipc://") for e in endpoints.values())
        self.local += ipc
        self.links += len(endpoints) - ipc
        self.endpoints = {pair_key(names, s, c): e for (s, c), e in endpoints.items()}
        return dict(self.endpoints)

    def _host(self, machine: str, toward: str) -> str:
        return LOOPBACK if self.peer_host is None else self.peer_host(machine, toward)


def _why(exc: BaseException) -> BaseException:
    """What a group's control request raised there (a `RemoteError`'s own), else ``exc``."""
    return getattr(exc, "exception", None) or exc


def _on(g: _Group) -> str:
    """``machine 'robot'``, or ``the host's machine``, for messages."""
    m = machine_of(g)
    return f"machine {m!r}" if m else "the host's machine"


def fall_back(why: str, started: bool) -> None:
    """Say that the run's messages between groups take the host's relay from now on,
    because a peer link between machines could not be made (``started``: at a restore,
    not at the start)."""
    log.warning("placed run: the host relays every message between groups %s: %s",
                "from this restore on" if started else "for this run (peer links are off)",
                why)
