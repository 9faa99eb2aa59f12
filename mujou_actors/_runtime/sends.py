"""The ``send`` of each Output: check, copy once, stamp, deliver, trigger.

When a run is built, every Output gets a send function made here (`make_send`)
and installed on the Output instance, so a hook's ``out.send(value)`` is a
single call. The data goes one way: the send checks the value (`ports` checks),
makes the one copy all readers share (the copier the build chose by the
readers' devices), appends one stamped delivery per connected Input to the
reader's mailbox, triggers the readers whose Input triggers, and records the
message in the Output's host view (`views.HostView`) for ``run.read`` and
subscriptions. What it needs from the dispatcher is the `SendTarget` protocol.

Where the copier is the plain clone (a net without CUDA nodes), a value that
nothing but the send holds is not copied: the send reads the Python
references to it (`TEMPORARY`, calibrated at import), and
`messages.sole_tensor` and `messages.take_message` the rest (see
`ports.Output.send` for the rule). A tensor the sender keeps is cloned there
and then, without going through `copy_message`.

There are three builders, each doing only what its Output needs: a lean one
for an Output with one reader and no trace or outbox (the common case, and the
one a ping-pong measures), one for several readers, and one for a traced run
or an Output with readers outside the kernel. Every send of one hook carries
the same stamp, made once per hook.
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Callable
from sys import getrefcount as _refs
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..devices import DeviceMessage
from ..errors import NotRunningError, PortTypeError
from ..messages import (
    SCALARS,  # immutable: a send shares them uncopied
    clone_tensor,
    copy_message,
    sole_tensor,
    take_message,
)
from .actor import CURRENT, NEVER, Actor
from .keys import Key, stamp
from .policy import TimePolicy

if TYPE_CHECKING:
    from ..ports import Input, Output
    from ..trace import Recorder

__all__ = ["SendTarget", "SendContext", "View", "Outbox", "Wire", "make_send",
           "stamped_message"]


# How a send triggers a reader: not at all (0), at once (NOW), or as the hook ends (DEFER).
NOW, DEFER = 1, 2

Send = Callable[[Any], None]
Outbox = Callable[[int, Any], None]
Copier = Callable[[Any], Any]
# A connected Input: (the Input, its node's actor, whether it triggers the node).
Wire = tuple["Input", Actor, bool]
# What a send does per reader: (slot, mailbox deque, reader, NOW/DEFER/0,
# the Input if its type is narrower than the Output's (else None), bounded).
Route = tuple[Any, ...]


def _temporary_refs() -> int:
    """The Python references a send reads to a value nothing but the send holds; 0: unknown.

    Calibrated once, at import, through the call a hook makes: a send set on
    a port instance, called as ``port.send(expression)``. The interpreter
    hands the argument's reference to the called function's frame, so a
    temporary is held by the send's parameter alone, and `sys.getrefcount`
    adds its own; that count is the interpreter's to decide (CPython 3.11:
    2), so it is measured rather than assumed, cold and once the call is
    specialized. A value the caller keeps must read higher through the same
    call, or no value is ever taken for a temporary (0). A build without the
    GIL (where other threads' references are counted apart) and other
    Pythons hand nothing over.
    """
    if sys.implementation.name != "cpython" or sysconfig.get_config_var("Py_GIL_DISABLED"):
        return 0
    counts: list[int] = []

    class Port:  # an Output while a net runs: its send set on the instance
        pass

    def send(value: Any) -> None:
        counts.append(_refs(value))  # where a send reads it: the parameter only

    port = Port()
    port.send = send  # type: ignore[attr-defined]
    kept = torch.empty(0)
    for _ in range(20):  # the first calls run cold, the later ones specialized
        port.send(torch.empty(0))  # type: ignore[attr-defined]
        port.send(kept)  # type: ignore[attr-defined]
    temporary, held = set(counts[::2]), set(counts[1::2])
    if len(temporary) != 1 or len(held) != 1 or min(held) <= min(temporary):
        return 0
    return temporary.pop()


TEMPORARY = _temporary_refs()
"""What `sys.getrefcount` reads in a send for a value that only the send holds (0: never)."""

_Tensor = torch.Tensor


class View(Protocol):
    """The host's view of one Output that a send updates: its newest message, its listeners."""

    last: Any
    listeners: list[Callable[[Any], None]]

    def publish(self, message: Any) -> None:
        """Hand ``message`` to every listener (on the sending thread)."""


class SendTarget(Protocol):
    """What a send asks of the dispatcher (each call takes the dispatcher's lock)."""

    def trigger(self, actor: Actor, key: Key) -> None:
        """Make ``actor`` run a triggered update at ``key`` (or earlier)."""

    def crowd(self, reader: Actor) -> None:
        """A send found ``reader``'s mailbox over its bound: prune it (now or between instants)."""


class SendContext:
    """What every send of one run shares: the time policy, worker count, target and trace.

    Args:
        policy (TimePolicy): the run's simulated or real time.
        workers (int): worker threads of the run (one worker defers more triggers).
        target (SendTarget): the dispatcher.
        trace (Recorder | None): the run's trace recorder, None without a trace.
    """

    __slots__ = ("policy", "workers", "target", "trace")

    def __init__(self, policy: TimePolicy, workers: int, target: SendTarget,
                 trace: Recorder | None) -> None:
        self.policy = policy
        self.workers = workers
        self.target = target
        self.trace = trace


def _not_in_hook(sender: Actor, output: Output, send: Send) -> NotRunningError:
    """The error of a send made outside a hook of the port's node (cold path)."""
    if output._send is not send:  # kept from a run that has ended
        if output._send is None:
            return NotRunningError(f"output {output.path!r}: send() needs a running net")
        return NotRunningError(
            f"output {output.path!r}: this send() belongs to a run that has ended; "
            "call the port's send() again (self.out.send) rather than keeping it")
    return NotRunningError(
        f"output {output.path!r}: send() from outside a hook of node "
        f"{sender.path or '<root>'!r} (from the host, or from another node's hook)")


def _copy_failed(output: Output, exc: ValueError | TypeError) -> ValueError | TypeError:
    """The error of a value that cannot be copied, naming the Output; of ``exc``'s kind.

    ValueError: containers nested too deep; TypeError: a tensor as a dict key,
    or an object that cannot be deep-copied.
    """
    kind = ValueError if isinstance(exc, ValueError) else TypeError
    return kind(f"output {output.path!r} sent a value that cannot be copied: {exc}")


def _reader_check(output: Output, reader: Input) -> Copier:
    """The check of a reader's narrower type, naming the Output that sent the value too."""
    check = reader._check
    assert check is not None  # a reader is narrower only when it checks something

    def checked(value: Any) -> Any:
        try:
            return check(value)
        except PortTypeError as exc:
            raise PortTypeError(f"output {output.path!r} sent to {exc}") from None

    return checked


def make_send(ctx: SendContext, sender: Actor, output: Output, routes: list[Wire],
              view: View, copy: Copier, outbox: Outbox | None = None) -> Send:
    """Build the ``send`` of one Output of ``sender`` for this run.

    The build installs it on the Output, so a hook's ``out.send(value)`` is a
    single call that checks, copies, stamps and delivers (see
    `ports.Output.send` for what it promises).

    Args:
        ctx (SendContext): what the run's sends share.
        sender (Actor): the actor owning the Output.
        output (Output): the Output.
        routes (list[Wire]): ``(input, reader actor, triggers)`` for every connected Input.
        view (OutputView): the host's view of the Output (``last`` and ``listeners``).
        copy: makes the message the readers share from the sent value
            (value semantics, on the path the readers' devices ask for).
            When it is `copy_message` (a net without CUDA nodes), a value
            nothing but the send holds is handed over instead, and a plain
            tensor is cloned without going through it.
        outbox: for an Output with readers outside the kernel (`kernel.Kernel`):
            called with ``(stamp, message)`` for each send, after the local
            readers got theirs. None in a run of the whole net.

    Returns:
        The send function: ``send(value)``; it raises `PortTypeError` for a
        value its Output or a reader's Input refuses (nothing is delivered
        then), and `NotRunningError` when called outside a hook of the
        Output's node.
    """
    # A trigger is deferred to the end of the sending hook when nothing
    # could run the reader earlier anyway (TimePolicy.defers): that saves a
    # lock hand-over per send.
    policy, workers = ctx.policy, ctx.workers
    for _, reader, _ in routes:
        reader.bound_mailbox()
    # Every send to a reader with a bounded Input checks the bound, also
    # those to its depth=None Inputs: in simulated time, whether a mailbox
    # is over its bound between two instants must be seen by its last send,
    # whichever thread made it (see Dispatcher._prune_crowded).
    plan = [(reader.slot(port), reader.mailbox.deliveries, reader,
             0 if not triggers else
             DEFER if policy.defers(workers, sender.dedicated, reader.dedicated) else NOW,
             port if port in output._strict_readers else None,
             reader.bound != NEVER)
            for port, reader, triggers in routes]
    if sender.deferred is None and any(route[3] is DEFER for route in plan):
        sender.deferred = {}  # made once; emptied as each hook ends
    # The readers' copier is the plain clone of copy_message (a net without
    # CUDA): a temporary may be handed over instead (see Output.send).
    plain = copy is copy_message
    # An Input of a synchronizer takes (send time, message) pairs (mujou_actors.sync):
    # only an Output that feeds one is built the general way, which makes them.
    synced = [port._stamped for port, _, _ in routes]
    if any(synced):
        return _send_traced(ctx, sender, output, routes, plan, view, copy, plain, outbox,
                            synced)
    if len(plan) == 1 and ctx.trace is None and outbox is None:
        return _send_one(ctx, sender, output, plan[0], view, copy, plain)
    if ctx.trace is None and outbox is None:
        return _send_many(ctx, sender, output, plan, view, copy, plain)
    return _send_traced(ctx, sender, output, routes, plan, view, copy, plain, outbox)


def _send_one(ctx: SendContext, sender: Actor, output: Output, route: Route,
              view: View, copy: Copier, plain: bool) -> Send:
    """`make_send` for an Output with one reader and no trace: the common case, lean.

    With ``plain`` (the readers' copier is `copy_message`'s clone), a value
    that nothing but the send holds (`TEMPORARY` references) is handed over
    uncopied when `sole_tensor` (a tensor) or `take_message` (a flat
    container) allow it; a tensor the sender still holds is cloned at once.
    """
    check, exact = output._check, output._spec.exact
    slot, box, reader, how, narrow, bounded = route
    crowd = ctx.target.crowd
    reader_check = None if narrow is None else _reader_check(output, narrow)
    reader_exact = None if narrow is None else narrow._spec.exact
    append = box.append
    # Used only for DEFER routes, which make_send gave a dict.
    deferred: dict[Actor, None] = {} if sender.deferred is None else sender.deferred
    order = sender.order
    trigger = ctx.target.trigger
    step = ctx.policy.delta_step
    running = CURRENT.get
    flight = sender.flight  # [hook, stamp] in flight (Actor.hook, Actor.stamp)
    temporary = TEMPORARY if plain else 0  # 0: no reading is a temporary's
    # The stamp of the hook in flight, packed once per hook (mailbox.stamp)
    # and shared by its messages: the sender's key object changes at
    # each hook, and is held here so its identity cannot be reused.
    seen: Any = None
    stamped = 0

    def send(value: Any) -> None:
        nonlocal seen, stamped
        if flight[0] is None or running(None) is not sender:
            raise _not_in_hook(sender, output, send)
        vt = type(value)
        if check is not None and vt is not exact:
            value = check(value)
            vt = type(value)
        if vt in SCALARS:  # immutable: shared as it is
            message = value
            if reader_check is not None and vt is not reader_exact:
                message = reader_check(value)  # a narrower reader: int -> float
        else:
            if reader_check is not None:
                reader_check(value)  # passes a non-scalar through as it is
            if vt is _Tensor and plain:
                # Nothing but this send holds it (no reference but the
                # parameter, and sole_tensor for the rest): handed over.
                if _refs(value) != temporary or not sole_tensor(value):
                    value = clone_tensor(value)
                message = value
            else:
                try:
                    if _refs(value) == temporary:  # a container only the send holds
                        message = value = take_message(value)
                    else:
                        message = value = copy(value)
                except (ValueError, TypeError) as exc:  # name the port (free unless raised)
                    raise _copy_failed(output, exc) from exc
        key = flight[1]
        if key is not seen:
            seen, stamped = key, stamp(key, order)
        append((stamped, slot, message))  # a delivery (mailbox.Delivery)
        if bounded and len(box) > reader.prune_at:
            crowd(reader)  # the mailbox's bound: see Actor.prune
        if how is DEFER:
            deferred[reader] = None
        elif how:
            # Real time: the triggered update is due when the sending
            # update was, so work caused by a tick due before the run's
            # end still runs, and lateness is end-to-end.
            t, d = key
            trigger(reader, (t, d + step))
        view.last = value
        if view.listeners:
            view.publish(value)

    return send


def _send_many(ctx: SendContext, sender: Actor, output: Output, plan: list[Route],
               view: View, copy: Copier, plain: bool) -> Send:
    """`make_send` for any number of readers, without a trace or an outbox.

    The message is made as in `_send_one`, once for all the readers.
    """
    check = output._check
    order = sender.order
    seen: Any = None
    stamped = 0
    trigger = ctx.target.trigger
    step = ctx.policy.delta_step
    running = CURRENT.get
    flight = sender.flight  # [hook, stamp] in flight (Actor.hook, Actor.stamp)
    temporary = TEMPORARY if plain else 0
    # Used only for DEFER routes, which make_send gave a dict.
    deferred: dict[Actor, None] = {} if sender.deferred is None else sender.deferred
    checks = [None if route[4] is None else _reader_check(output, route[4])
              for route in plan]
    narrow = any(c is not None for c in checks)
    crowd = ctx.target.crowd
    routes = [(slot, box, reader, how, bounded) for slot, box, reader, how, _, bounded in plan]

    def send(value: Any) -> None:
        nonlocal seen, stamped
        if flight[0] is None or running(None) is not sender:
            raise _not_in_hook(sender, output, send)
        if check is not None:
            value = check(value)
        # Every reader's check passes before anything is delivered; a
        # narrower reader gets a scalar as its own check gives it (an int
        # becomes a float for a float Input); other values pass as they
        # are and share the one copy.
        narrowed = [value if c is None else c(value) for c in checks] if narrow else None
        vt = type(value)
        if vt in SCALARS:
            pass
        elif vt is _Tensor and plain:  # as in _send_one
            if _refs(value) != temporary or not sole_tensor(value):
                value = clone_tensor(value)
        else:
            try:
                if _refs(value) == temporary:
                    value = take_message(value)
                else:
                    value = copy(value)
            except (ValueError, TypeError) as exc:  # name the port (free unless raised)
                raise _copy_failed(output, exc) from exc
        key = flight[1]
        if key is not seen:  # as in _send_one
            seen, stamped = key, stamp(key, order)
        t, d = key
        if narrowed is None:
            for slot, box, reader, how, bounded in routes:
                box.append((stamped, slot, value))  # a delivery (mailbox.Delivery)
                if bounded and len(box) > reader.prune_at:
                    crowd(reader)  # the mailbox's bound: see Actor.prune
                if how is DEFER:
                    deferred[reader] = None
                elif how:
                    trigger(reader, (t, d + step))
        else:
            for (slot, box, reader, how, bounded), mine in zip(routes, narrowed, strict=True):
                message = mine if type(mine) in SCALARS else value
                box.append((stamped, slot, message))
                if bounded and len(box) > reader.prune_at:
                    crowd(reader)
                if how is DEFER:
                    deferred[reader] = None
                elif how:
                    trigger(reader, (t, d + step))
        view.last = value
        if view.listeners:
            view.publish(value)

    return send


def stamped_message(t_ns: int, message: Any) -> Any:
    """What a synchronized Input receives: ``(t_ns, message)``, the stamp its synchronizer uses.

    A CUDA sender's device message keeps its wrapper (each reader gets its
    value on its own device), with the pair inside it.
    """
    if type(message) is DeviceMessage:
        return DeviceMessage((t_ns, message.value), message.device, message.event)
    return (t_ns, message)


def _send_traced(ctx: SendContext, sender: Actor, output: Output, routes: list[Wire],
                 plan: list[Route], view: View, copy: Copier, plain: bool,
                 outbox: Outbox | None, synced: list[bool] | None = None) -> Send:
    """`make_send` for any number of readers with a trace, an outbox or both.

    Also for an Output that feeds a synchronized Input (``synced``, by
    route): that reader gets the pair `stamped_message` makes.
    """
    check = output._check
    order = sender.order
    seen: Any = None
    stamped = 0
    trigger = ctx.target.trigger
    step = ctx.policy.delta_step
    running = CURRENT.get
    flight = sender.flight  # [hook, stamp] in flight (Actor.hook, Actor.stamp)
    trace = ctx.trace
    temporary = TEMPORARY if plain else 0
    # Used only for DEFER routes, which make_send gave a dict.
    deferred: dict[Actor, None] = {} if sender.deferred is None else sender.deferred
    checks = [None if route[4] is None else _reader_check(output, route[4])
              for route in plan]
    narrow = any(c is not None for c in checks)
    crowd = ctx.target.crowd

    def send(value: Any) -> None:
        nonlocal seen, stamped
        if flight[0] is None or running(None) is not sender:
            raise _not_in_hook(sender, output, send)
        if check is not None:
            value = check(value)
        narrowed = [value if c is None else c(value) for c in checks] if narrow else None
        vt = type(value)
        if vt in SCALARS:
            pass
        elif vt is _Tensor and plain:  # as in _send_one
            if _refs(value) != temporary or not sole_tensor(value):
                value = clone_tensor(value)
        else:
            try:
                if _refs(value) == temporary:
                    value = take_message(value)
                else:
                    value = copy(value)
            except (ValueError, TypeError) as exc:  # name the port (free unless raised)
                raise _copy_failed(output, exc) from exc
        key = flight[1]
        if key is not seen:  # as in _send_one
            seen, stamped = key, stamp(key, order)
        t, d = key
        if trace is not None:  # before any reader can see the message
            seq = sender.seq = sender.seq + 1  # names the trace's flow arrows
            trace.send(sender, output, seq, routes)
        for i, (slot, box, reader, how, _, bounded) in enumerate(plan):
            message = value
            if narrowed is not None and type(narrowed[i]) in SCALARS:
                message = narrowed[i]
            if synced is not None and synced[i]:
                message = stamped_message(t, message)
            if trace is None:
                box.append((stamped, slot, message))  # a delivery (mailbox.Delivery)
            else:
                box.append((stamped, slot, message, seq))
            if bounded and len(box) > reader.prune_at:
                crowd(reader)  # the mailbox's bound: see Actor.prune
            if how is DEFER:
                deferred[reader] = None
            elif how:
                trigger(reader, (t, d + step))
        if outbox is not None:  # readers outside the kernel get the checked value
            outbox(stamped, value)
        view.last = value
        if view.listeners:
            view.publish(value)

    return send
