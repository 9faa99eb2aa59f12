"""Building a run's kernel: the actors, CUDA streams and waiters, the wiring.

What `mujou.run` does once every argument is checked and the nodes are
claimed: make one `Actor` per node, give CUDA nodes a stream and a waiter,
install each Output's send and keep the host's views of the ports (a
`Wiring`). The kernel's constructor seams (`Seams`) are here too: the CPU
tests put a fake CUDA runtime, fake waiters, a scripted timer, a failing
wiring or a slow disk there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from ..cuda import StreamWaiter, make_waiter
from ..devices import (
    CopyPath,
    CudaRuntime,
    HostCopier,
    WriteCopier,
    copy_stream_devices,
    device_copier,
    mark_ready,
    send_path,
    to_host,
)
from ..messages import copy_message
from ..ports import Input, Output, Port
from ..snapshot import save
from ..timers import Timer, make_timer
from .actor import Actor
from .replay import Feed, StandIn
from .sends import Outbox, Wire, make_send, stamped_message
from .views import HostView

if TYPE_CHECKING:
    from ..node import Node
    from ..sync import Synchronizer
    from .dispatcher import Dispatcher

__all__ = ["Seams", "Wiring", "make_actors", "setup_cuda", "wire", "unwire", "attach_syncs",
           "watch_listener"]


def make_actors(found: list[tuple[str, Node]], seeds: dict[str, int],
                tree: dict[str, Any] | None, stats: bool,
                ports: dict[str, Port], only: Collection[str] | None = None,
                replaced: Mapping[str, Feed] | None = None) -> list[Actor]:
    """One actor per node, in the net's order; seeds each node's generator.

    Args:
        found: ``(path, node)`` of every node of the net, parents first: a
            node's place in it is its order (what orders sends of one instant).
        seeds: the settled seed of every node, by path.
        tree: the state tree to restore, if any (its generators come with the
            nodes' states: those nodes are not reseeded here).
        stats: keep the timing statistics.
        ports: the ports of the nodes that get actors, by path (their Inputs
            are reset).
        only: the paths of the nodes that get actors (a kernel for some of
            the net's nodes); None: every node.
        replaced: the nodes of a replay that do not run, by path, with the
            feed of each one's recorded messages: they get a `replay.StandIn`.
    """
    actors: list[Actor] = []
    periods: dict[int, int] = {}
    for order, (path, node) in enumerate(found):
        if only is not None and path not in only:
            continue
        feed = None if replaced is None else replaced.get(path)
        actors.append(Actor(node, path, order, periods) if feed is None
                      else StandIn(node, path, order, periods, feed))
        if node._mujou_seed is None and (tree is None or path not in tree["seeds"]):
            node._mujou_reseed(seeds[path])  # a tree's generator state comes with the node's
        node._mujou_gen_seed = seeds[path]  # what Node.seed and Run.seeds show
        node._mujou_run_seeded = True  # later draws are the run's: no warning next time
    for port in ports.values():
        if isinstance(port, Input):
            port._reset()
    for actor in actors:
        actor.timed = stats
    return actors


def setup_cuda(actors: list[Actor], cuda_sync: str, seams: Seams) -> CudaRuntime | None:
    """Give CUDA nodes a stream and a waiter; synchronize the host's streams.

    Returns:
        CudaRuntime | None: the run's runtime; None, and CUDA untouched, when
        no node is on CUDA.
    """
    devices = {a.device for a in actors if a.device.type == "cuda"}
    if not devices:
        return None
    rt = seams.cuda_runtime()
    rt.set_sync(cuda_sync)
    for device in sorted(devices, key=str):
        # Tensors made in __init__ on the host's stream are complete before
        # any node's stream uses them.
        rt.wait(rt.current_stream(device))
    for actor in actors:
        actor.rt = rt
        if actor.device.type == "cuda":
            actor.stream = rt.new_stream(actor.device)
            actor.waiter = seams.make_waiter(cuda_sync)
            actor.kept_ready = rt.new_event()
    return rt


class Wiring:
    """A built net's ways to and from the host: the ports' views, the copies, the deliveries.

    Made by `wire`; used by the host's API (read, write, subscribe) and by the
    coordinator (a state tree's copies, a restore's messages).

    Args:
        actors: every actor of the run.
        dispatcher: the run's dispatcher (a host write is one of its deliveries).
        rt: the run's CUDA runtime, None without CUDA nodes.
    """

    def __init__(self, actors: list[Actor], dispatcher: Dispatcher,
                 rt: CudaRuntime | None) -> None:
        self.actor_of = {id(a.node): a for a in actors}
        self.rt = rt
        self.views: dict[int, HostView] = {}  # by id of the Output
        self.input_views: dict[int, HostView] = {}  # by id of the Input, made on demand
        self._dispatcher = dispatcher
        # The run's start time (ns; a restored run's is its tree's): what a host's
        # write before the timer starts (inputs=) is stamped with for a synchronizer.
        self.start_ns = 0

    def start_at(self, start_ns: int) -> None:
        """Say the run's start time (ns): a host's write before the timer starts gets it."""
        self.start_ns = start_ns

    def view(self, output: Output) -> HostView:
        """The host's view of ``output`` (its newest message, its listeners)."""
        return self.views[id(output)]

    def host_copy(self, message: Any) -> Any:
        """A private CPU copy of a message for the host (or a state tree)."""
        rt = self.rt
        if rt is None:
            return copy_message(message)
        return host_message(to_host(message, rt), HostCopier(rt))

    def host_view(self, message: Any) -> Any:
        """The host's CPU view of a sent message, not a private copy (a CUDA one once ready)."""
        return to_host(message, self.rt)

    def write_copy(self, value: Any, port: Input, owned: bool = False) -> Any:
        """The copy of a value that ``run.write``/``inputs=`` deliver to ``port``; with
        ``owned`` (a message decoded from another process: nothing else holds it), the
        value itself in a net without CUDA nodes (where a copy would only copy it)."""
        if owned and self.rt is None:
            return value
        return write_copy(value, self.actor_of[id(port.node)], self.rt)

    def deliver(self, port: Input, message: Any, hops: int = 0,
                stamp_ns: int | None = None) -> int:
        """Deliver ``message`` to ``port`` as the host (its listeners see it too).

        ``hops``: real time, a message from another group's update at delta
        ``hops - 1`` (see `Dispatcher.host_deliver`). ``stamp_ns``: its send
        time, for an Input of a synchronizer (a restored undelivered message,
        another group's send); None: the run's time now (before the timer
        starts: its start time).

        Returns:
            int: the delivery's number (`Dispatcher.host_deliver`).
        """
        actor = self.actor_of[id(port.node)]
        slot = actor.slot(port)
        sent = message
        if port._stamped:
            dispatcher = self._dispatcher
            if stamp_ns is None:
                stamp_ns = max(dispatcher.timer.now_ns(), self.start_ns)
            sent = stamped_message(stamp_ns, message)
        seq = self._dispatcher.host_deliver(actor, slot, sent, slot in actor.triggers, hops)
        view = self.input_views.get(id(port))
        if view is not None and view.listeners:
            view.publish(message)
        return seq

    def wait_kept(self, port: Input) -> None:
        """Wait until the values kept by a CUDA node's Input are on its device.

        Its receive work (waits for senders' events, copies) is queued on the
        node's stream, which the host's stream is not ordered after. The event
        is recorded after each batch of received values, before they are
        kept, so a later record than the one of a value read just before
        this call only covers more.
        """
        event = self.actor_of[id(port.node)].kept_ready
        if event is not None:
            self.rt.wait_ready(event)  # type: ignore[union-attr]

    def listen(self, port: Port, listener: Callable[[Any], None],
               now: Callable[[], int] | None = None) -> Callable[[], None]:
        """Attach ``listener`` to every message sent on or delivered to ``port``.

        Args:
            port (Port): an Output or an Input of the run.
            listener (Callable): called with each message, on the sending thread.
            now (Callable[[], int] | None): if given, ``listener`` is called with
                ``(t_ns, message)`` instead: the sending hook's time (ns of the
                run's timer, -1 before the timer started), or ``now()`` for a
                host's write to an Input (no hook sends it).

        Returns:
            Callable[[], None]: detaches it again.
        """
        if now is None:
            return self.listen_each(port, lambda sender: listener)
        return self.listen_each(port, lambda sender: _timed(listener, sender, now))

    def listen_each(self, port: Port,
                    make: Callable[[Actor | None], Callable[[Any], None]]) -> Callable[[], None]:
        """Attach a listener of its own to each way a message reaches ``port``.

        Args:
            port (Port): an Output or an Input of the run.
            make (Callable): ``make(sender)`` is the listener of the messages
                of ``sender``, the actor of an Output that sends on ``port``
                or feeds it (its ``flight`` holds the sending hook's stamp),
                or None for the host's writes to an Input.

        Returns:
            Callable[[], None]: detaches them again.
        """
        if isinstance(port, Output):
            pairs: list[tuple[HostView, Actor | None]] = [
                (self.view(port), self.actor_of[id(port.node)])]
        else:
            sources = port._sources  # type: ignore[attr-defined]
            pairs = [(self.view(s), self.actor_of[id(s.node)]) for s in sources]
            pairs.append((self.input_views.setdefault(id(port), HostView()), None))
        attached = [(view, make(sender)) for view, sender in pairs]
        for view, fn in attached:
            # Copy-on-write: senders iterate the list without a lock.
            view.listeners = view.listeners + [fn]

        def detach() -> None:
            for view, fn in attached:
                view.listeners = [x for x in view.listeners if x is not fn]

        return detach


def _timed(listener: Callable[[Any], None], sender: Actor | None,
           now: Callable[[], int]) -> Callable[[Any], None]:
    """``listener`` called with ``(t_ns, message)``: the sender's hook's time, else ``now()``."""
    if sender is None:
        def host_write(message: Any) -> None:
            listener((now(), message))
        return host_write

    flight = sender.flight  # [hook, stamp] in flight: a list read, as the sends read it

    def sent(message: Any) -> None:
        listener((flight[1][0], message))
    return sent


def watch_listener(put: Callable[[Any], None], count: Callable[[], int], sender: Actor | None,
                   now: Callable[[], int], with_time: bool,
                   messages: bool) -> Callable[[Any], None]:
    """The listener of a watch (`host.Watch`) on the messages of ``sender``: ``put``, ``count``.

    On the sending thread it appends the message (a reference: the watch's
    consumer copies it when it takes it), or its send time, or both, and
    counts it: two calls into C, no lock, no copy, no wakeup. The time is the
    sending hook's (``sender.flight``), or ``now()`` for a host's write
    (``sender`` None).
    """
    if not with_time:
        def plain(message: Any) -> None:
            put(message)
            count()
        return plain
    if sender is None:
        if not messages:
            def written_at(message: Any) -> None:
                put(now())
                count()
            return written_at

        def written(message: Any) -> None:
            put((now(), message))
            count()
        return written
    flight = sender.flight  # [hook, stamp] in flight: a list read, as the sends read it
    if not messages:
        def sent_at(message: Any) -> None:
            put(flight[1][0])
            count()
        return sent_at

    def sent(message: Any) -> None:
        put((flight[1][0], message))
        count()
    return sent


_NO_TRIGGERS: frozenset[Any] = frozenset()  # shared by the many nodes without one


def wire(actors: list[Actor], ports: dict[str, Port], dispatcher: Dispatcher,
         rt: CudaRuntime | None,
         outbox: Callable[[Output], Outbox] | None = None,
         outside_device: bool = False) -> Wiring:
    """Install each Output's send and each actor's set of triggering Inputs.

    Args:
        actors: the actors of the nodes being run.
        ports: their ports, by path.
        dispatcher: their dispatcher.
        rt: the CUDA runtime, None without CUDA nodes.
        outbox: for a kernel that runs some of a net's nodes: makes the outbox of
            an Output with readers outside it (`kernel.Kernel`); None: every
            reader must be among ``actors``.
        outside_device: the readers outside count as readers on the sender's
            CUDA device (a group whose data plane shares CUDA memory,
            `distributed.cudaipc`): a CUDA sender's outbox gets the device
            path's message (`devices.DeviceMessage`) instead of a host copy.

    Returns:
        Wiring: the host's views of the Outputs, and the run's copies.
    """
    wiring = Wiring(actors, dispatcher, rt)
    actor_of = wiring.actor_of
    for actor in actors:
        period_none = actor.period_ns is None
        actor.inputs = tuple(
            p for p in actor.node._mujou_ports().values() if isinstance(p, Input))
        syncs = list({id(p._sync): p._sync for p in actor.inputs if p._sync is not None}
                     .values())
        if isinstance(actor, StandIn):
            # A replaced node's Inputs take messages in, but never wake its stand-in:
            # its wakeups are the recording's keys, which it asks the dispatcher for.
            actor.triggers = _NO_TRIGGERS
            actor.target = dispatcher
            for sync in syncs:  # its hooks never run: its Inputs stay plain
                sync._detach()
            continue
        actor.triggers = frozenset(
            i for i, p in enumerate(actor.inputs)
            if (period_none if p.trigger is None else p.trigger)
        ) or _NO_TRIGGERS
        if syncs:
            attach_syncs(actor, syncs)
    for port in ports.values():
        if isinstance(port, Output):
            sender = actor_of[id(port.node)]
            routes: list[Wire] = []
            outside = False
            for r in port._readers:
                reader = actor_of.get(id(r.node))
                if reader is None:
                    outside = True
                    continue
                routes.append((r, reader, reader.slot(r) in reader.triggers))
            if outside and outbox is None:
                raise ValueError(f"output {port.path!r} has readers outside the nodes wired")
            view = wiring.views[id(port)] = HostView()
            copy = copier(sender, [a for _, a, _ in routes], rt, outside and outside_device)
            port._send = make_send(dispatcher.sends, sender, port, routes, view, copy,
                                   outbox(port) if outside and outbox is not None else None)
            if type(port).send is Output.send:  # a subclass's own send() stays in the way
                # An instance attribute: a hook's ``out.send(v)`` calls it directly.
                port.send = port._send  # type: ignore[method-assign,assignment]
    return wiring


def attach_syncs(actor: Actor, syncs: list[Synchronizer]) -> None:
    """Give the node's synchronizers its Inputs' messages, and settle them in its updates.

    Each synchronizer (`mujou_actors.sync`) takes its Inputs' stamped
    messages from here on, and the node's update first settles them (the
    matching, the callbacks), then runs ``on_update``: in the node's hook,
    context and hook time. Only a node with synchronizers has its update
    wrapped; the others call theirs as always.
    """
    for sync in syncs:
        sync._attach()
    update = actor.update

    def settled(node: Node, dt: float) -> None:
        for sync in syncs:
            sync._settle()
        update(node, dt)

    actor.update = settled


def unwire(ports: dict[str, Port]) -> None:
    """Take the run's sends off the Outputs: ``send`` needs a running net again."""
    for port in ports.values():
        if isinstance(port, Output):
            port._send = None
            port.__dict__.pop("send", None)  # back to Output.send: "needs a running net"


def copier(sender: Actor, readers: list[Actor], rt: CudaRuntime | None,
           outside_device: bool = False) -> Callable[[Any], Any]:
    """How an Output of ``sender`` copies each message, by its readers' devices.

    Also gives each reader the copy stream it needs on the sender's device.
    With ``outside_device``, readers outside the kernel count as readers on
    the sender's device (they get the message over CUDA IPC).
    """
    if rt is None:
        return copy_message  # a net without CUDA: plain value semantics
    device = sender.device
    reader_devices = [a.device for a in readers] + ([device] if outside_device else [])
    if send_path(device, reader_devices) is CopyPath.HOST:
        # A fresh copier per send: it keeps the streams its copies are on.
        return lambda value: host_message(value, HostCopier(rt))
    for reader in readers:
        if device in copy_stream_devices(reader.device, [device]):
            if device not in reader.copy_streams:
                reader.copy_streams[device] = rt.new_stream(device)
    place = device_copier(device, rt)
    # One ready event per Output, recorded again at each send (see mark_ready):
    # creating events on the workers is slow, and the run needs no more.
    event = rt.new_event()
    return lambda value: mark_ready(copy_message(value, place), device, rt, event)


def host_message(value: Any, copier: HostCopier) -> Any:
    """``value`` copied with ``copier`` (a `HostCopier`), once its copies are done."""
    message = copy_message(value, copier)
    copier.wait()
    return message


def write_copy(value: Any, actor: Actor, rt: CudaRuntime | None) -> Any:
    """The copy of a value that ``run.write``/``inputs=`` deliver to ``actor``."""
    if rt is None:
        return copy_message(value)
    return host_message(value, WriteCopier(actor.device, actor.stream, rt))


@dataclasses.dataclass(frozen=True)
class Seams:
    """What a run makes of the outside world; the defaults are the real ones.

    Args:
        cuda_runtime: makes the run's `CudaRuntime` (called only when a node
            is on CUDA).
        make_waiter: makes the waiter of one CUDA node from ``cuda_sync``.
        make_timer: makes the run's timer from ``timer=`` (``"realtime"``,
            ``"simulated"``); raises ``ValueError`` for another name.
        wire: wires the run's net (`wire`'s arguments, without ``outbox``).
        save_snapshot: writes one of the supervisor's snapshot trees to a
            file (``mujou.save``'s arguments); may raise.
    """

    cuda_runtime: Callable[[], CudaRuntime] = CudaRuntime
    make_waiter: Callable[[str], StreamWaiter] = make_waiter
    make_timer: Callable[[str], Timer] = make_timer
    wire: Callable[[list[Actor], dict[str, Port], Dispatcher, CudaRuntime | None],
                   Wiring] = wire
    save_snapshot: Callable[[Any, str], None] = save
