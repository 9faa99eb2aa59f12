"""A node's mailbox and the control envelopes: everything that reaches a node goes through it.

Two kinds of envelope reach an actor:

* control envelopes (`Start`, `Stop`, `Snapshot`, `Restore`): plain data, handled
  one at a time, before any timed work, by `Actor.handle` (the one place that
  calls the node's code);
* deliveries: a message for one of the node's Inputs, stamped with the time
  and delta cycle it was sent at and the sender's order in the net (see
  `keys.stamp`). Ordering by that stamp, and by send order within one stamp,
  is what makes simulated runs deterministic whatever the number of workers.

Timer ticks are not queued: a node's next tick is a single due time in its
schedule, so a late node skips ticks instead of accumulating a burst.

A mailbox is bounded by its node's Input depths (`Mailbox.prune`): of the
deliveries waiting for an Input, those its next hook would push out unseen
are dropped, and counted, while they wait.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import deque
from itertools import repeat, starmap
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from .keys import ORDER_BITS, Key, pack

if TYPE_CHECKING:
    from ..ports import Input

__all__ = ["Start", "Stop", "Snapshot", "Restore", "Delivery", "Mailbox", "STAMP", "SLOT",
           "MESSAGE", "SLACK", "prune_limit", "Envelope"]

# Getters of the fields of a delivery in a mailbox (see Delivery).
STAMP, SLOT, MESSAGE = itemgetter(0), itemgetter(1), itemgetter(2)

# A mailbox is pruned (`Mailbox.prune`) once it holds more deliveries than
# twice the depths of its node's bounded Inputs plus SLACK, and after a prune
# not before it has twice as many as were left (see `prune_limit`).
SLACK = 16

class Start:
    """Run the node's ``on_start``."""

    __slots__ = ()


class Stop:
    """Run the node's ``on_stop``."""

    __slots__ = ()


class Snapshot:
    """Copy the node's state into ``into[path]`` (errors into ``errors[path]``).

    Run by `Actor.take_state`. A state that cannot be taken is the caller's
    error (``run.state_dict()`` raises it), not a failure of the node: what
    the node's ``state_dict`` raises becomes a `NodeError` naming the node and
    the hook, while a value that a tree cannot hold stays the ``TypeError`` of
    `state.copy_state`, which names the node and the key.
    """

    __slots__ = ("into", "errors")
    hook = "state_dict"

    def __init__(self, into: dict[str, Any], errors: dict[str, BaseException]) -> None:
        self.into = into
        self.errors = errors


class Restore:
    """Load a node's state, its kept input messages and its ``dt`` reference.

    Run by `Actor.restore`. What raises there is reported like a hook's
    failure (`NodeError`, hook ``load_state_dict``) by whoever runs the
    envelope.

    Args:
        state: the node's state dict (None: the node's state is not loaded).
        inputs (dict[Input, list]): the messages each Input keeps, oldest first.
        last_update_ns (int | None): the time of the node's last update, ns.
    """

    __slots__ = ("state", "inputs", "last_update_ns")
    hook = "load_state_dict"

    def __init__(self, state: Any, inputs: dict[Input, list[Any]],
                 last_update_ns: int | None) -> None:
        self.state = state
        self.inputs = inputs
        self.last_update_ns = last_update_ns


# What a control phase posts to an actor's mailbox.
Envelope = Start | Stop | Snapshot | Restore


class Delivery(NamedTuple):
    """A message for one Input, with its stamp, as `Run.state_dict` lists them.

    This class names the fields for code off the hot path. The mailbox holds
    each delivery as a plain tuple ``(stamp, slot, message)``, and in a
    traced run, or from the host, ``(stamp, slot, message, seq)``:

    * ``stamp``: ``t_ns``, ``delta`` and the sender's order packed into one
      int (`stamp`), the same object for every send of one hook;
    * ``slot``: the Input's index in the reader's ``actor.inputs``;
    * ``seq``: the sender's send counter (it names a trace's flow arrows).

    Deliveries are ordered by stamp, and those of one stamp (one hook of one
    sender) by arrival, which is their send order: a stable sort on the stamp
    alone, so no per-message sequence number is made. A send allocates the
    tuple and nothing else; a tuple of ints and an immutable message holds no
    reference the garbage collector must follow, so the collector untracks it
    in its first pass instead of scanning every queued message again and
    again. (A NamedTuple costs five times as much to build.)
    """

    t_ns: int          # run time of the sending hook
    delta: int         # delta cycle of the sending hook
    sender: int        # sender's order in the net (HOST_ORDER for the host)
    input: Input       # the Input port (its slot, in a mailbox)
    message: Any


def prune_limit(depths: tuple[int | None, ...], left: int = 0) -> int:
    """How many deliveries a mailbox may hold before it is pruned again.

    Args:
        depths: the depth of each of the node's Inputs, by slot (None: unbounded).
        left: the deliveries a prune left (those of unbounded Inputs, or
            within their Inputs' depths).

    Returns:
        Twice the bounded depths plus `SLACK`, or twice ``left`` if more:
        pruning costs at most a constant per delivery, even with a backlog
        for an unbounded Input that no prune can shorten.
    """
    base = 2 * sum(depth for depth in depths if depth is not None) + SLACK
    return max(base, 2 * left)


def _newest(deliveries: list[tuple[Any, ...]], depths: tuple[int | None, ...],
            removed: list[int]) -> list[tuple[Any, ...]]:
    """The deliveries a hook would keep of ``deliveries`` (in order): of each Input's,
    its depth's newest; counts the others into ``removed`` (per slot)."""
    room = list(depths)  # how many more of each slot survive, from the newest
    kept: list[tuple[Any, ...]] = []
    # A reversed copy, not reversed(): mypyc cannot compile reversed() of this list.
    for delivery in deliveries[::-1]:
        slot = delivery[1]
        left = room[slot]
        if left is None:
            kept.append(delivery)
        elif left:
            room[slot] = left - 1
            kept.append(delivery)
        else:
            removed[slot] += 1
    kept.reverse()
    return kept


class Mailbox:
    """One node's mailbox: control envelopes and stamped deliveries.

    Senders append from any thread (``deque.append`` is atomic); only the
    thread that runs the node's hook takes envelopes out, and in real time
    it takes deliveries holding ``lock``, which a sender that prunes the
    mailbox holds too (`prune`).
    """

    __slots__ = ("control", "deliveries", "lock")

    def __init__(self) -> None:
        # A list, not a deque (56 bytes against 760 empty): control envelopes
        # are few, and only ever touched under the dispatcher's lock.
        self.control: list[Envelope] = []
        self.deliveries: deque[tuple[Any, ...]] = deque()  # (stamp, slot, message[, seq])
        # Made for a node with a bounded Input (`make_lock`, from
        # Actor.bound_mailbox); None for one that keeps every message: never
        # pruned, so its hooks need no lock to take them.
        self.lock: threading.Lock | None = None

    def make_lock(self) -> None:
        """Give the mailbox its lock: it has a bounded Input, so senders may prune it."""
        self.lock = threading.Lock()

    def put(self, delivery: tuple[Any, ...]) -> None:
        """Append one delivery ``(stamp, slot, message[, seq])`` (from any thread).

        For deliveries from outside the hooks (the host, another process); a
        hook's send appends to `deliveries` directly, one call less per send.
        """
        self.deliveries.append(delivery)

    def prune(self, depths: tuple[int | None, ...], by_stamp: bool,
              below: int | None = None) -> list[int]:
        """Drop the deliveries that the node's next hook would push out unseen.

        Every delivery now in the mailbox goes into the Inputs at the same
        next hook, so of those for an Input of depth ``n`` only the newest
        ``n`` can survive it: the older ones are removed now, which bounds the
        mailbox by the depths whatever the rate of the senders and however
        long the node's hooks take. The survivors are those the hook would
        keep, in the order it would keep them.

        The caller makes sure that every delivery now in the mailbox goes in
        at the same next hook: in simulated time, between two instants (no
        hook in flight, so none can take the earlier deliveries and leave the
        later ones); in real time, holding ``lock``, which the node holds while
        it takes deliveries (a hook takes all there are). Senders may append
        meanwhile: those wait behind the survivors. Or, with ``below``, that
        every delivery stamped below it goes in at the same next hook: only
        those are pruned, the others are kept as they are.

        Args:
            depths: the depth of each of the node's Inputs, by slot (None: unbounded).
            by_stamp: order by stamp (simulated time), not by arrival.
            below: prune only the deliveries stamped below this (simulated
                time; None: all).

        Returns:
            The deliveries removed, per slot.
        """
        queue = self.deliveries
        taken = list(starmap(queue.popleft, repeat((), len(queue))))
        if by_stamp:
            taken.sort(key=STAMP)  # stable, as take_deliveries sorts them
        later: list[tuple[Any, ...]] = []
        if below is not None:
            cut = bisect_left(taken, below, key=STAMP)
            later = taken[cut:]
            del taken[cut:]
            queue.extendleft(reversed(later))  # they stay, after the survivors
        if len(depths) == 1 and depths[0] is not None:  # one Input: the newest, in C
            depth = depths[0]
            queue.extendleft(reversed(taken[-depth:]))
            return [max(0, len(taken) - depth)]
        removed = [0] * len(depths)
        queue.extendleft(reversed(_newest(taken, depths, removed)))
        return removed

    def prune_cycles(self, depths: tuple[int | None, ...], bound: int,
                     below: int | None) -> tuple[list[int], int]:
        """Prune as one process would have at the end of each delta cycle (a driven kernel).

        One process looks at a mailbox at the end of every delta cycle
        (`Dispatcher._prune_crowded`): over ``bound``, it is pruned (`prune`)
        and the bound recomputed (`prune_limit`). A kernel driven from
        outside (another process's messages come in batches, after the
        cycles that sent them) may hold the deliveries of several cycles
        that it has not looked at in that way yet, and some of cycles still
        open. This walks the deliveries stamped below ``below`` cycle by
        cycle, in stamp order, and at the end of each does what one process
        did there, so what is left, what is dropped and the bound are the
        same as in one process. Deliveries stamped from ``below`` on stay as
        they are, after the others. (Cycles already looked at are walked
        again: their checks pass again, since a mailbox only shrinks between
        them.)

        The caller makes sure that no hook is in flight and that every
        delivery of a cycle below ``below`` has come (the conservative
        protocol's settled key: `distributed.driver`).

        Args:
            depths: the depth of each of the node's Inputs, by slot (None: unbounded).
            bound: the mailbox's bound now (``Actor.bound``).
            below: the least stamp of the first cycle not to look at (None: all).

        Returns:
            ``(removed, bound)``: the deliveries removed, per slot, and the new bound.
        """
        queue = self.deliveries
        taken = list(starmap(queue.popleft, repeat((), len(queue))))
        taken.sort(key=STAMP)
        end = len(taken) if below is None else bisect_left(taken, below, key=STAMP)
        removed = [0] * len(depths)
        held: list[tuple[Any, ...]] = []
        i = 0
        while i < end:
            # A delta cycle's stamps share their high bits: pack(t, delta) << ORDER_BITS.
            cycle_end = ((taken[i][0] >> ORDER_BITS) + 1) << ORDER_BITS
            j = bisect_left(taken, cycle_end, i, end, key=STAMP)
            held += taken[i:j]
            i = j
            if len(held) > bound:
                held = _newest(held, depths, removed)
                bound = prune_limit(depths, len(held))
        held += taken[end:]
        queue.extendleft(reversed(held))  # before any appended meanwhile, as `prune` does
        return removed, bound

    def take_messages(self) -> list[Any]:
        """Remove every delivery and return the messages alone, in arrival order.

        For real time, when every delivery goes to the one Input of the node:
        the messages are picked out in C, with no list of deliveries between.
        """
        queue = self.deliveries
        return list(map(MESSAGE, starmap(queue.popleft, repeat((), len(queue)))))

    def take_deliveries(
        self, before: Key | None
    ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """Remove and return the deliveries to apply before a hook.

        Args:
            before: in a simulated run, ``(t_ns, delta)`` of the hook about to
                run: only deliveries sent at an earlier instant are taken,
                sorted by stamp and, within a stamp, in arrival order.
                ``None`` (real time): all, in arrival order.

        Returns:
            ``(taken, kept)``: the deliveries to apply, and those left in the
            mailbox for a later hook (sent at the instant of ``before`` or later).
        """
        queue = self.deliveries
        # Exactly as many pops as there are deliveries now, in C: senders on
        # other threads may append meanwhile (those wait for a later hook), and
        # list(queue) + clear() could lose a message appended between the two.
        taken: list[tuple[Any, ...]] = list(starmap(queue.popleft, repeat((), len(queue))))
        if before is None or not taken:
            return taken, []
        least = pack(before) << ORDER_BITS  # the least stamp of that instant
        taken.sort(key=STAMP)  # stable: one sender's sends of one hook stay in send order
        if taken[-1][0] < least:
            return taken, []
        cut = bisect_left(taken, least, key=STAMP)
        kept = taken[cut:]
        del taken[cut:]
        queue.extendleft(reversed(kept))
        return taken, kept
