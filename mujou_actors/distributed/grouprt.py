"""A real-time group's server: sends shipped as they come, peer links read by idle workers.

`group.GroupServer` runs a group's kernel in its process; in simulated time the
host's grants drive it. In real time (``mujou.run(timer="realtime")``) the
group runs on its own clock, and `RealTimeGroupServer` adds what that takes:

* the **data-plane thread's loop** (`RealTimeGroupServer._serve`): the host's
  link (relayed messages, a new mesh of peer links, a cut's flush), the wake
  (the kernel's sends, failures of workers), and a sweep of the peer links
  every `COVER_MS` while no idle worker takes them;
* the **direct hop** (`_sent`): a hook's first send to another group goes on
  the peer links from the hook's own thread, no thread woken in between;
* the **idle reader** (`idleread`): one idle worker at a time waits on the
  peer links and delivers what comes itself (Leader/Followers), so a message
  reaches its hook after one wake-up;
* the **peer links' life in real time**: opened for each mesh generation the
  host describes, given up at a reset for a restore (the timeline they
  carried is over), a cut's flush answered once every sender's marker is in.

Locks: whoever reads the links takes the read lock, whoever queues sends on
them the ship lock, the read lock first where both are; neither is held
while a send waits for a socket.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from typing import Any

import zmq

from .._runtime.kernel import Kernel
from ..errors import describe
from . import dataplane, idleread, peers
from .group import GroupServer, PeerClocks, failure_of, shipped

__all__ = ["COVER_MS", "LEADER_FRAMES", "RealTimeGroupServer"]

# While every worker runs a hook, the data-plane thread moves what came on the peer links
# into the kernel after at most this many milliseconds, so a message waits in its reader's
# mailbox (its QoS depth keeping the newest), not in the socket pushing back on its sender.
COVER_MS = 1
# The frames an idle worker takes from each peer link before it runs what they triggered.
LEADER_FRAMES = 64

log = logging.getLogger("mujou_actors")


class RealTimeGroupServer(GroupServer):
    """A real-time group's kernel in its process (see the module's docstring).

    Args: as `groupmain.serve`, with ``timer="realtime"``.

    Attributes:
        direct_ships (int): ships from a hook's own thread (`_sent`); the rest
            are the data-plane thread's.
    """

    TIMER = "realtime"

    def __init__(self, **kwargs: Any) -> None:
        # Set before the base makes the kernel (`_attach`) and starts the data-plane thread.
        # Whoever reads the peer links (the data-plane thread, or an idle worker) reads and
        # delivers under this lock, so each link's frames reach the kernel once and in order.
        self._read_lock = threading.Lock()
        self._reader: idleread.IdleReader | None = None  # the current kernel's
        self._idle_reads = 0  # deliveries by idle workers, of the kernels before this one
        self._seen_readable = False  # a worker waited on readable links at the last sweep
        self._peers_rt: peers.RealTimePeers | None = None  # while open
        self._peers_stale = False  # reset for a restore: the links are given up
        # Whoever ships (a worker, the data-plane thread) takes the kernel's sends and queues
        # them on the peer links under this lock, so each link keeps the order of the takes;
        # the waits for a link's socket come after it is let go.
        self._ship_lock = threading.Lock()
        self._direct = -1  # the stamp of the hook whose first send was shipped directly
        self.direct_ships = 0
        self._ship_failures: list[BaseException] = []  # a worker's, reported by the data plane
        super().__init__(**kwargs)

    def _kernel_hooks(self) -> dict[str, Any]:
        """The kernel wakes the data-plane thread for its sends and calls `_sent` from the
        thread of a hook that sent to another group."""
        return {"notify": self._wake.set, "sent": self._sent}

    def _attach(self, kernel: Kernel) -> None:
        """Set the idle reader on a new kernel (where the C library has ``ppoll``)."""
        if idleread.available:
            reader = idleread.IdleReader(self._readable,
                                         lambda rt: self._read_peers(kernel, rt),
                                         self._worker_failed)
            kernel.set_reader(reader.read, reader.wake.set)
            self._reader = reader

    def reset(self, timeout: float) -> list[str]:
        """As `GroupServer.reset`; the peer links are given up first (no delivery into the
        kernel being stopped), and the old kernel's reader is closed after."""
        with self._read_lock:
            self._peers_stale = True  # the data-plane thread gives its links up
        reader = self._reader
        stuck = super().reset(timeout)
        if reader is not None:  # its kernel's workers are gone (or stuck in a hook)
            self._idle_reads += reader.reads
            reader.close()
        return stuck

    def close(self, timeout: float = 10.0, idle: float | None = None) -> dict[str, str]:
        """As `GroupServer.close`; then the reader's wake is closed (the kernel's workers
        are gone, or stuck in a hook)."""
        stuck = super().close(timeout, idle)
        if self._reader is not None:
            self._reader.close()
        return stuck

    def _set_peer_clocks(self, request: PeerClocks) -> None:
        """As `GroupServer._set_peer_clocks`, and now for the links of that generation
        if they are open."""
        super()._set_peer_clocks(request)
        rt = self._peers_rt
        if rt is not None and rt.mesh.generation == request.generation:
            rt.clocks = self._peer_clocks[1]

    @property
    def idle_reads(self) -> int:
        """int: real time, the waits in which an idle worker delivered what came on the
        peer links itself (`idleread`), over the group's kernels so far."""
        reader = self._reader
        return self._idle_reads + (0 if reader is None else reader.reads)

    def _serve(self) -> None:
        """Real time: ship sends as they come, deliver what arrives, until closed."""
        link, wake = self._link, self._wake
        (poller, covered), polled = self._realtime_poller(None), None
        looked = time.monotonic()  # when the host's process was last looked for
        while not self._closing.is_set():
            if self._peers_stale:
                self._drop_peers()
            rt = self._peers_rt
            if rt is not polled:  # peer links opened or given up: poll what is open now
                (poller, covered), polled = self._realtime_poller(rt), rt
            # Frames read ahead while a send waited (`_drain`) are in no socket any more.
            pending = rt is not None and rt.mesh.pending()
            ready = dict(poller.poll(0 if pending else COVER_MS if covered else 100))
            if not ready and not pending and not (covered and self._uncovered(covered)):
                if time.monotonic() - looked >= 0.1:  # not at each sweep (COVER_MS)
                    looked = time.monotonic()
                    self._end_if_host_gone()
                continue
            try:
                if wake.fileno() in ready:
                    wake.clear()
                    self._ship()
                if link.sock in ready:
                    while (grant := link.receive(0)) is not None:
                        self._take(grant)
                if self._peers_rt is not None:
                    self._take_peers()
            except peers.Abandoned:  # a marker waited for a peer and the group was reset
                self._drop_peers()
            except BaseException as exc:  # reported to the host, never swallowed
                if self._closing.is_set():
                    log.info("group %r: closing; the messages in flight ended with %s",
                             self.group, describe(exc))
                    break  # stopped under it, the process ending (see `_serve`)
                link.send(dataplane.Reply(due=None, time_ns=self._time(), sends=[],
                                          failure=failure_of(exc)))
        self._drop_peers()  # under the ship lock: a closing kernel's hooks may still send
        if self._mesh is not None:
            self._mesh.close()
        link.close()
        wake.close()

    def _uncovered(self, covered: Any) -> bool:
        """Whether something came on the peer links that no idle worker takes (the
        data-plane thread's sweep, every `COVER_MS`).

        Also when a worker waits but the bytes were there at the sweep before too:
        it then missed them (the links' `on_replaced` wakes it where that is known
        to happen), so it is woken to look again and this thread reads them, a
        millisecond late rather than never.
        """
        if not covered.poll(0):
            self._seen_readable = False
            return False
        reader = self._reader
        if reader is None or not reader.waiting:
            self._seen_readable = False
            return True
        if self._seen_readable:
            self._seen_readable = False
            reader.wake.set()
            return True
        self._seen_readable = True
        return False

    def _realtime_poller(self, rt: peers.RealTimePeers | None) -> tuple[zmq.Poller, Any]:
        """What the data-plane thread waits on: the host's link, the wake, and the peer
        links of ``rt`` unless idle workers read them (`idleread`); then also a
        ``select.poll`` of those, which it looks at every `COVER_MS` (else None)."""
        poller = zmq.Poller()
        poller.register(self._link.sock, zmq.POLLIN)
        poller.register(self._wake.fileno(), zmq.POLLIN)
        if rt is None:
            return poller, None
        covered = None
        if self._reader is not None and rt.mesh.direct:
            covered = select.poll()
            for peer in rt.mesh.links.values():
                covered.register(peer.sock.fileno(), select.POLLIN)
        else:
            for peer in rt.mesh.links.values():
                poller.register(peer.sock, zmq.POLLIN)
        return poller, covered

    def _sent(self, stamped: int) -> None:
        """Real time, on the thread of a hook that sent to another group (the kernel's
        ``sent``): the direct hop.

        The hook's first such send goes to its reading groups from this thread,
        on the peer links: no thread is woken between the hook and the link. The
        sends after it in the same hook (the same stamp), and every send while no
        peer link is open, are shipped by the data-plane thread, woken for them,
        in batches: a hook that sends many messages pays one frame for them, not
        one each, and goes on while they are shipped.
        """
        rt = self._peers_rt
        if stamped == self._direct or rt is None or not rt.mesh.direct:
            # (A link between machines is a ZeroMQ socket: the data-plane thread's alone.)
            self._wake.set()
            return
        self._direct = stamped
        try:
            with self._ship_lock:
                rt = self._peers_rt
                if rt is None or self._peers_stale:
                    self._wake.set()
                    return
                left = rt.post(self.kernel.take_sends())
                self.direct_ships += 1
            for link in left:
                link.drain()
        except peers.Abandoned:  # the links are given up (a reset, or closing): see _drop_peers
            self._wake.set()
        except BaseException as exc:  # noqa: BLE001 - the data-plane thread reports it
            self._worker_failed(exc)

    def _worker_failed(self, exc: BaseException) -> None:
        """A worker's direct ship or read failed: the data-plane thread reports it (`_ship`)
        as its own failures are reported, never swallowed."""
        self._ship_failures.append(exc)
        self._wake.set()

    def _readable(self) -> tuple[peers.RealTimePeers, list[int]] | None:
        """For an idle worker (`idleread.IdleReader`): the peer links open now and their
        descriptors; None when none are, they are given up (a reset), or one is a ZeroMQ
        socket (one thread's only). Under the read lock: no link closes meanwhile."""
        with self._read_lock:
            rt = self._peers_rt
            if rt is None or self._peers_stale or not rt.mesh.direct:
                return None
            return rt, [link.sock.fileno() for link in rt.mesh.links.values()]

    def _read_peers(self, kernel: Kernel, rt: peers.RealTimePeers) -> bool:
        """An idle worker of ``kernel`` delivers what the links of ``rt`` brought (at most
        `LEADER_FRAMES` a link: it runs their hooks before it reads on), if both are
        still the group's; a flush's markers are then the data-plane thread's to answer
        (its socket to the host is its own). Whether it delivered anything."""
        with self._read_lock:
            if self._peers_rt is not rt or self._peers_stale or self.kernel is not kernel:
                return False
            taken = rt.take(kernel, LEADER_FRAMES)
        if rt.flushing is not None:
            self._wake.set()
        return taken > 0

    def _ship(self) -> None:
        """Real time: what the nodes sent outside goes to the groups that read it (peer
        links) or to the host; published copies and failures go to the host."""
        if self._ship_failures:  # a worker's direct ship failed: reported as any ship's
            raise self._ship_failures.pop(0)
        left: list[dataplane.PeerLink] = []
        with self._ship_lock:
            rt = self._peers_rt

            def to_peers(sends: list[Any]) -> None:
                assert rt is not None
                left.extend(rt.post(sends))

            replies = shipped(self.kernel, self.routes, self.published,
                              to_peers if rt is not None else None)
            if rt is not None:
                left += rt.give_back()
        self._drain(left)
        for reply in replies:
            self._link.send(reply)

    def _drain(self, links: list[dataplane.PeerLink]) -> None:
        """Wait until the peer links' sockets took what was queued on them (dp thread)."""
        try:
            for link in links:
                link.drain(read=True)
        except peers.Abandoned:
            # A send waited for a peer and this group was reset meanwhile (a restore):
            # the messages are of the abandoned timeline.
            self._drop_peers()

    def _take(self, grant: dataplane.Grant) -> None:
        """Real time: deliver messages from other groups as they come (as host writes);
        open the peer links the host describes; answer a cut's flush."""
        kernel = self.kernel
        seg = grant.segment
        if isinstance(seg, dataplane.Segment) and seg.mesh is not None:
            self._open_peers(seg)
        for t, delta, sender, output, message in grant.messages:  # decoded: the kernel's
            for reader in self.routes.local_readers(output):
                kernel.write(reader, message, (t, delta, sender), owned=True)
        if grant.take:  # a cut's flush: what was sent so far goes first, then the marker
            self._ship()
            rt = self._peers_rt
            if rt is not None and isinstance(seg, dataplane.Segment):
                with self._ship_lock:  # after every send taken so far, on every link
                    left = rt.flush(seg.number)  # answered once every sender's marker is in
                self._drain(left)
                self._take_peers()
            else:
                self._link.send(dataplane.Reply(due=None, time_ns=kernel.time_ns, sends=[],
                                                marker=True))

    def _take_peers(self) -> None:
        """Real time: deliver what the peers sent; answer a flush whose markers are all in."""
        rt = self._peers_rt
        assert rt is not None
        with self._read_lock:
            if not self._peers_stale:
                rt.take(self.kernel)
        if rt.flushing is not None and rt.flushed():
            self._ship()
            self._link.send(dataplane.Reply(due=None, time_ns=self.kernel.time_ns, sends=[],
                                            marker=True))

    def _open_peers(self, seg: dataplane.Segment) -> None:
        """Real time: the links of the host's new mesh generation (the old ones closed)."""
        self._drop_peers()
        assert seg.mesh is not None
        if self._mesh is not None:
            self._mesh.close()  # (closed already unless the host relayed meanwhile)
        # A connecting end waits for its peer to listen: a reset or the host's end ends it.
        mesh = peers.PeerMesh(self.group, seg.generation, seg.mesh, self.routes.declared,
                              self._mesh, self._held_peers(seg.generation),
                              waiting=self._peer_blocked)
        for peer in mesh.links.values():
            peer.blocked = self._peer_blocked
            # Nothing waits for this group's answers in real time: the blocks of a
            # sender it never sends to go back once an eighth of its pool is freed.
            # (`poke`: it may run inside this thread's own `clear`, from a collection.)
            peer.decoder.on_freed = self._wake.poke
            if mesh.direct:  # a connection accepted onto a number a worker waits on
                peer.sock.on_replaced = self._wake_reader
        rt = peers.RealTimePeers(mesh, self.routes)
        generation, clocks = self._peer_clocks
        if generation == seg.generation:  # told before this thread opened the mesh
            rt.clocks = clocks
        with self._read_lock, self._ship_lock:
            self._mesh, self._peers_stale = mesh, False
            self._peers_rt = rt
        self._wake_reader()  # an idle worker waits on the links too, from now on

    def _wake_reader(self) -> None:
        """Make an idle worker waiting on the peer links look at them again (new ones)."""
        reader = self._reader
        if reader is not None:
            reader.wake.set()

    def _peer_blocked(self) -> None:
        """Called while a send to a peer waits (the peer not connected yet, or dead): the
        host gone ends the process; a reset or a close gives the links up."""
        self._end_if_host_gone()
        if self._peers_stale or self._closing.is_set():
            raise peers.Abandoned

    def _drop_peers(self) -> None:
        """Real time: give the peer links up (a reset: the timeline they carried is over);
        until the host opens new ones, messages go through the host."""
        with self._read_lock, self._ship_lock:  # no worker reads or ships on a link closing
            self._peers_stale = False
            if self._peers_rt is not None:
                self._peers_rt = None
                assert self._mesh is not None
                self._mesh.close()
        self._wake_reader()  # a worker waiting on the closed links waits without them
