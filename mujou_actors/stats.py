"""Statistics of a run: frozen records returned by ``Run.stats()``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# Only the names users import (docs/reference.md); the package's own helpers stay importable.
__all__ = ["NodeStats", "WorkerStats", "SnapshotStats", "SubscriptionStats", "GroupStats",
           "MachineStats", "RecordingStats", "RecordingChannelStats", "CapsuleStats", "RunStats",
           "SyncStats"]


@dataclass(frozen=True)
class NodeStats:
    """Counters of one node since the run started.

    Attributes:
        path (str): the node's dotted path.
        updates (int): ``on_update`` calls.
        overruns (int): ticks skipped because the node fell a period or more
            behind (real time only; a simulated node is never late). Only
            ticks due by the run's end count: for a periodic node,
            ``updates + overruns`` is the number of ticks due.
        dt_mean (float): mean ``dt`` in seconds of the run's timer (0 before
            the first update).
        dt_max (float): largest ``dt`` in seconds.
        lateness_p50 (float): median of (start - due) of the node's newest
            256 updates (not of the whole run), seconds; a late tick is
            measured from the latest tick due that it stands for.
        lateness_p99 (float): 99th percentile of the same 256, seconds.
        hook_time (float): wall seconds spent in the node's hooks.
        drops (Mapping[str, int]): per Input name, messages discarded by its
            QoS depth before any ``read()`` or ``drain()`` returned them
            (pushed out of the full Input, or dropped from the mailbox while
            newer ones waited); a message that was read and then replaced is
            not a drop.
        restarts (int): restarts by the supervisor.
        budget_misses (int): updates whose CPU time exceeded the node's
            ``budget`` (0 without one; see docs/nodes-and-ports.md,
            "Deadlines and budgets").
        deadline_misses (int): updates that returned later than the node's
            ``deadline`` after they were due (0 without one). An update may
            miss both.
    """

    path: str
    updates: int
    overruns: int
    dt_mean: float
    dt_max: float
    lateness_p50: float
    lateness_p99: float
    hook_time: float
    drops: Mapping[str, int] = field(default_factory=dict)
    restarts: int = 0
    budget_misses: int = 0
    deadline_misses: int = 0


@dataclass(frozen=True)
class WorkerStats:
    """One worker or dedicated thread.

    Attributes:
        name (str): thread name (``mujou-worker-N`` or ``mujou-node-PATH``).
        busy (float): share of wall time since the start spent in hooks (0..1).
    """

    name: str
    busy: float


@dataclass(frozen=True)
class SnapshotStats:
    """The supervisor's snapshots so far.

    Attributes:
        count (int): snapshots taken (the first one, right after the start, included).
        pause_mean (float): mean wall seconds the run paused to copy the state.
        pause_max (float): longest such pause, wall seconds.
        write_mean (float): mean wall seconds to write a file (0 without files).
        files (int): files written.
        skipped (int): snapshots that got no file because the writer was still
            busy with earlier ones when the next one came (real time only; the
            snapshot still served restarts).
        missed (int): periodic snapshots not taken because the net could not
            be brought to a consistent cut in time (a hook that did not
            return; see docs/state.md); the first behind the same hook calls
            is logged as a warning (later ones at debug level), and the next
            multiple of ``snapshot_every`` tries again.
    """

    count: int = 0
    pause_mean: float = 0.0
    pause_max: float = 0.0
    write_mean: float = 0.0
    files: int = 0
    skipped: int = 0
    missed: int = 0


@dataclass(frozen=True)
class SubscriptionStats:
    """What the host's observers of one port got and lost (`Run.subscribe`, `wait_for`, `watch`).

    The counts add up over every subscription, every ``wait_for`` call and
    every watch on the port during the run, cancelled subscriptions and
    watches and returned calls included. A message counts once for each
    observer it was queued for: for each subscription, ``delivered + dropped
    + undelivered`` (plus what was discarded by ``cancel()``) is what was sent
    after it was made; for each watch, ``taken + dropped`` plus what it still
    holds (or discarded by ``cancel()``).

    Attributes:
        port (str): the port's dotted path.
        subscriptions (int): `Run.subscribe` calls on the port.
        delivered (int): callback calls (those that raised included).
        dropped (int): messages dropped from a subscription's full queue:
            its callback was ``depth`` messages behind.
        undelivered (int): messages still queued for a callback when the
            run ended and ``stop_timeout`` ran out.
        waits (int): `Run.wait_for` calls on the port.
        wait_dropped (int): messages dropped unseen from a full ``wait_for``
            queue: its predicate was ``depth`` messages behind.
        watches (int): `Run.watch` calls on the port (``mujou echo``'s and
            ``mujou hz``'s included).
        watch_taken (int): messages taken from its watches (`Watch.take`).
        watch_dropped (int): messages pushed out of a watch's full queue
            before they were taken (`Watch.dropped`).
    """

    port: str
    subscriptions: int = 0
    delivered: int = 0
    dropped: int = 0
    undelivered: int = 0
    waits: int = 0
    wait_dropped: int = 0
    watches: int = 0
    watch_taken: int = 0
    watch_dropped: int = 0


@dataclass(frozen=True)
class SyncStats:
    """What one synchronizer (`ExactTime`, `ApproximateTime`) matched and dropped.

    Counted since its node's run started; a restored run counts from its
    restore, as the Inputs' drops do.

    Attributes:
        path (str): the synchronizer's dotted path (its node's path and its
            attribute name), or ``"ClassName.attribute"`` before a run.
        matched (int): sets matched (handed to the callback, or kept for
            ``read()`` and ``drain()``).
        dropped (Mapping[str, int]): per Input name, messages dropped without
            being matched (they are also in the node's ``NodeStats.drops``).
        sets_dropped (int): matched sets discarded from the full ``queue`` of
            kept sets before ``read()`` or ``drain()`` returned them (no
            callback only).
    """

    path: str
    matched: int = 0
    dropped: Mapping[str, int] = field(default_factory=dict)
    sets_dropped: int = 0


@dataclass(frozen=True)
class GroupStats:
    """One group process of a placed run (``mujou.run(..., placement=...)``).

    Attributes:
        name (str): the group's name (``"host"``: the host's own group).
        pid (int): its process id.
        cpu_time (float): CPU seconds of that process so far (user + system,
            all its threads; ``os.times``).
        nodes (tuple[str, ...]): the paths of the nodes it runs.
        messages_in (int): port messages it received from other groups.
        messages_out (int): port messages it sent to other groups (on peer
            links, a message read in several groups counts once).
        bytes_in (int): bytes it received on the data plane, its link to the
            host and its peer links (frames, headers included; tensors through
            shared memory count their descriptor only).
        bytes_out (int): bytes it sent on the data plane.
        drops (int): messages its nodes' Inputs dropped (QoS depth), summed.
        machine (str): the convention member (machine) it runs on; ``""``:
            the host's machine (docs/machines.md).
        clock_offset_ns (int | None): on another machine, its clock's offset
            from the host's (its ``time.monotonic_ns()`` minus the host's, the
            heartbeat's NTP estimate, ns); None on the host's machine or
            before the first heartbeat answer.
        clock_uncertainty_ns (int | None): the bound on that estimate's
            error, ns (half the round trip and the clocks' drift since).
        rtt_ns (int | None): the last heartbeat round trip to it, ns.
        refused (int): the connections that failed the CURVE handshake (a
            peer without the run's secret: another secret, or no CURVE): on
            another machine, at the host's end of its data-plane link while
            the host waited for the group's own; and at its own listening
            ends of peer links to groups on other machines while it waited
            for its peer's. Each is logged (at most a line every 10 s). 0 on
            one machine.
        cuda_ipc (Mapping[str, Any] | None): with CUDA IPC between groups
            (``MUJOU_CUDA_IPC=1``, docs/processes.md), its data-plane end's
            figures: ``exported`` (CUDA tensors sent as IPC handles),
            ``released`` (given back by their readers), ``in_flight`` and
            ``bytes_in_flight`` (not given back yet), ``forwarded`` (the host's
            relay) and ``fallbacks`` (reason -> tensors copied to the CPU
            instead: ``"bound"``, ``"not shareable"``, ``"unavailable"``); None
            without CUDA IPC, and for the host's own group.
    """

    name: str
    pid: int
    cpu_time: float
    nodes: tuple[str, ...]
    messages_in: int
    messages_out: int
    bytes_in: int
    bytes_out: int
    drops: int
    machine: str = ""
    clock_offset_ns: int | None = None
    clock_uncertainty_ns: int | None = None
    rtt_ns: int | None = None
    refused: int = 0
    cuda_ipc: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class MachineStats:
    """One machine of a placed run: the host's, or a convention member that runs groups.

    Its bytes are those that crossed the network into it or out of it: a
    group's link to the host, and its peer links to groups on other machines
    (a peer link between two groups of one machine crosses none).

    Attributes:
        name (str): the machine's name, as placements name it (the member's
            ``mujou worker --name``: ``"robot"`` of ``"robot:control"``);
            ``""``: the host's machine, the one that called ``mujou.run``
            (as `GroupStats.machine` names it, so that
            ``stats.machines[group.machine]`` is a group's machine).
        hostname (str): its host name, as its group processes report it
            (``socket.gethostname()``); the host's own for ``""``; ``""``
            for a member none of whose groups has answered.
        groups (tuple[str, ...]): the names of the groups it runs (the
            host's machine: ``"host"`` among them when the host's process
            runs nodes), in the order of `RunStats.groups`.
        pids (tuple[int, ...]): their process ids, in the same order.
        cpu_time (float): CPU seconds of those processes so far, summed
            (user + system, all their threads; `GroupStats.cpu_time`).
        bytes_in (int): data-plane bytes that came into this machine from
            other machines (frames and their headers, as `GroupStats.bytes_in`
            counts them; not TCP's or CURVE's own): for a member, what its
            groups received on their links to the host and on their peer
            links to groups of other machines; for the host's machine, what
            the members' groups sent on their links to the host and what its
            own groups received on their peer links from the members'. The
            heartbeat's bytes are not in it.
        bytes_out (int): the same, to other machines.
        heartbeat_bytes_in (int): the heartbeat's frames that came into
            this machine (a member: the pings to its groups; the host's
            machine: every member's answers), bytes.
        heartbeat_bytes_out (int): the heartbeat's frames it sent, bytes.
        clock_offset_ns (int | None): a member's monotonic clock minus the
            host's (``time.monotonic_ns()``), ns: the heartbeat's NTP
            estimate of its group with the tightest bound (the processes of
            one machine share one clock). None for the host's machine (the
            reference) and before the first heartbeat answer.
        clock_uncertainty_ns (int | None): the bound on that estimate's
            error, ns: the true offset lies within
            ``clock_offset_ns ± clock_uncertainty_ns``.
        rtt_ns (int | None): that group's last heartbeat round trip, ns.
        message_age_p50 (float | None): real time only: the median age, in
            seconds, of the messages this machine's groups sent to groups on
            other machines, each measured where it first reached another
            machine (from the start of the hook that sent it, on the sender's
            clock): at the host's driver for the messages the host relays, at
            the reading group for those on peer links; the clocks put on the
            host's by the machines' offsets (``clock_offset_ns``), of the
            newest 256 messages of each group at the host and of each sending
            machine at each reading group. Each age is within the two
            machines' ``clock_uncertainty_ns`` of the true one. Messages
            between groups of one machine, and those the host sends on, are
            not measured. None in simulated time, before the machines' first
            heartbeat answers and before any message; for the host's machine
            (whose messages the host relays on its own clock) unless its
            groups send on peer links to the members' groups.
        message_age_p99 (float | None): the 99th percentile of the same, seconds.
        refused (int): a member's: the connections refused at the host's ends
            of its groups' data-plane links and at its groups' listening ends
            of peer links (`GroupStats.refused`, summed); the host's machine's:
            every member's, and its own groups'.
    """

    name: str
    hostname: str
    groups: tuple[str, ...]
    pids: tuple[int, ...]
    cpu_time: float
    bytes_in: int
    bytes_out: int
    heartbeat_bytes_in: int = 0
    heartbeat_bytes_out: int = 0
    clock_offset_ns: int | None = None
    clock_uncertainty_ns: int | None = None
    rtt_ns: int | None = None
    message_age_p50: float | None = None
    message_age_p99: float | None = None
    refused: int = 0


@dataclass(frozen=True)
class RecordingChannelStats:
    """What the recording did with one recorded Output's messages (``mujou.run(record=...)``).

    ``sent`` is ``recorded + dropped + unrecordable`` plus what is still
    queued for the writer.

    Attributes:
        port (str): the Output's dotted path (the channel's topic).
        sent (int): messages sent on it since the run started.
        recorded (int): messages written to the file.
        dropped (int): messages not recorded because the writer's queue was
            full (``when_full="drop"``), or still queued when the end's bound
            (``stop_timeout``) ran out.
        unrecordable (int): messages the file cannot hold (a type the
            snapshot codec does not store, on a port typed ``object``);
            the first is logged.
        bytes (int): bytes of message data written (the records' data).
    """

    port: str
    sent: int = 0
    recorded: int = 0
    dropped: int = 0
    unrecordable: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class RecordingStats:
    """The recording of a run to an MCAP file (docs/recording.md).

    Attributes:
        file (str): the file's path.
        recorded (int): messages written, all channels.
        dropped (int): messages dropped (see `RecordingChannelStats.dropped`).
        unrecordable (int): messages the file cannot hold.
        bytes (int): bytes of message data written.
        queued (int): messages waiting for the writer now.
        when_full (str): the policy of a full queue: ``"drop"`` or ``"wait"``.
        error (str | None): what made the writer stop (it records nothing more
            then; `Run.join` raises it at the end), None while it works.
        channels (Mapping[str, RecordingChannelStats]): by Output path.
        log (RecordingChannelStats | None): the run's log records
            (``Recording(log=True)``, the channel ``/mujou/log``): ``sent`` the
            records taken (at or above the recorded level), ``dropped`` those
            the full queue left out (a record never waits for room) and those
            a placed run's group lost on their way to the host (in ``sent`` too),
            ``unrecordable`` those whose message could not be made; None
            without. The totals above are the Outputs' alone.
    """

    file: str
    recorded: int = 0
    dropped: int = 0
    unrecordable: int = 0
    bytes: int = 0
    queued: int = 0
    when_full: str = "drop"
    error: str | None = None
    channels: Mapping[str, RecordingChannelStats] = field(default_factory=dict)
    log: RecordingChannelStats | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "channels", MappingProxyType(dict(self.channels)))


@dataclass(frozen=True)
class CapsuleStats:
    """A run's crash capsule (``mujou.run(record_on_failure=...)``, docs/recording.md).

    Attributes:
        file (str): the capsule's path (written only when a node fails).
        kept (int): messages kept now (the window since the older snapshot).
        kept_bytes (int): their bytes (tensor and text bytes plus 64 each).
        evicted (int): messages let go for ``max_messages``/``max_bytes``
            before the window's end, all channels.
        snapshots (int): snapshots kept now (at most 2).
        failure (str | None): the first failure (``node.hook at T ns:
            exception``), None while no node failed.
        written (bool): the capsule file is written.
        error (str | None): what made writing it fail, None if nothing did.
    """

    file: str
    kept: int = 0
    kept_bytes: int = 0
    evicted: int = 0
    snapshots: int = 0
    failure: str | None = None
    written: bool = False
    error: str | None = None


@dataclass(frozen=True)
class RunStats:
    """A snapshot of a run's statistics.

    Attributes:
        time (float): the run's time in seconds of its timer.
        wall (float): wall seconds since the run started.
        nodes (Mapping[str, NodeStats]): by node path.
        workers (Mapping[str, WorkerStats]): by thread name.
        snapshots (SnapshotStats): the supervisor's snapshots and their timings.
        subscriptions (Mapping[str, SubscriptionStats]): by port path, the
            ports that the host subscribed to or waited on in this run (none:
            empty); the host's queues' deliveries and drops.
        groups (Mapping[str, GroupStats]): by group name, the processes of a
            placed run (empty for a run in one process).
        machines (Mapping[str, MachineStats]): by machine name, the
            machines of a placed run: the host's (``""``) first, then each
            member that runs groups (empty for a run in one process).
        recording (RecordingStats | None): the run's recording
            (``mujou.run(record=...)``); None when it records nothing.
        capsule (CapsuleStats | None): the run's crash capsule
            (``mujou.run(record_on_failure=...)``); None without one.
        syncs (Mapping[str, SyncStats]): by path, every synchronizer of the
            net (`ExactTime`, `ApproximateTime`; empty: none), as each one's
            ``stats()``, whatever process it runs in.
    """

    time: float
    wall: float
    nodes: Mapping[str, NodeStats]
    workers: Mapping[str, WorkerStats]
    snapshots: SnapshotStats = field(default_factory=SnapshotStats)
    subscriptions: Mapping[str, SubscriptionStats] = field(default_factory=dict)
    groups: Mapping[str, GroupStats] = field(default_factory=dict)
    machines: Mapping[str, MachineStats] = field(default_factory=dict)
    recording: RecordingStats | None = None
    capsule: CapsuleStats | None = None
    syncs: Mapping[str, SyncStats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "syncs", MappingProxyType(dict(self.syncs)))
        object.__setattr__(self, "nodes", MappingProxyType(dict(self.nodes)))
        object.__setattr__(self, "workers", MappingProxyType(dict(self.workers)))
        object.__setattr__(self, "subscriptions", MappingProxyType(dict(self.subscriptions)))
        object.__setattr__(self, "groups", MappingProxyType(dict(self.groups)))
        object.__setattr__(self, "machines", MappingProxyType(dict(self.machines)))


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100, nearest rank) of sorted values; 0 if empty."""
    if not sorted_values:
        return 0
    rank = max(0, min(len(sorted_values) - 1, -(-len(sorted_values) * q // 100) - 1))
    return sorted_values[int(rank)]
