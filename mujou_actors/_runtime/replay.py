"""The stand-in of a replaced node: an actor whose wakeups are the keys of a recording.

A replay (``mujou.run(replay=..., replace=[...])``) runs a net in which some
nodes are *replaced*: their code does not run, and a `StandIn` takes their
place in the kernel. It is the actor of the same node (the same path, the
same Outputs with their sends, the same order in the net), so every message
it sends is stamped ``(t_ns, delta, order)`` exactly as the node's own sends
were, and every reader sorts and triggers on it as it did in the recorded run.

What the stand-in sends comes from a `Feed`: the recorded messages grouped by
the key ``(t_ns, delta)`` of the hook that sent them, in key order, each
group's messages in send order. The stand-in's schedule is that feed:

* ``on_start`` (the `Start` envelope) sends the group recorded at the control
  key (what the node's own ``on_start`` sent), then takes the next group and
  lowers its own trigger key to that group's key;
* each wakeup, a triggered update at ``self.stamp``, sends the group due at
  that key (any earlier one too: a real-time wakeup that comes late), takes
  the next group and asks for a wakeup at its key (`SendTarget.trigger`, as a
  send to a triggering Input does);
* it has no period, and none of its Inputs triggers it (`build.wire` gives it
  none): the node's upstream still runs and its messages reach the node's
  Inputs (reads, subscriptions and state trees show them), and the stand-in
  takes them in at its wakeups, as any node takes its deliveries, but never
  runs because of them;
* ``on_stop``, ``state_dict`` and ``load_state_dict`` of the node are never
  called: its entry in a state tree is ``{}``; a loaded tree (``state=``, a
  ``one_for_all`` restart) makes it resume with the groups after the tree's
  time (every group at ``t <= time_ns`` was sent before that cut).

Reading the feed (the file, decoding) happens inside the stand-in's hooks, on
the thread that runs them, never under the dispatcher's lock: it counts as
the node's hook time, and what it raises is the node's failure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch

from .actor import Actor
from .keys import CONTROL_KEY, MASK, Key
from .mailbox import Restore, Snapshot

if TYPE_CHECKING:
    from ..node import Node
    from ..ports import Output

__all__ = ["Feed", "Group", "StandIn", "Target"]

# One key's recorded messages: (key, the Outputs, the messages), in send order.
# Two lists rather than pairs: a message popped from its list is held by nothing
# else, so the send hands it over instead of copying it (sends.TEMPORARY).
Group = tuple[Key, list["Output"], list[Any]]

_CPU = torch.device("cpu")


def _nothing() -> None:
    """The stand-in's ``on_stop``."""


class Feed(Protocol):
    """The recorded messages of one replaced node, as groups of one key each."""

    def open(self, after: Key | None) -> Iterator[Group]:
        """The groups in increasing key order, each key once.

        Args:
            after (Key | None): None: from the first group (the control key's,
                what ``on_start`` sent, comes first if recorded); a key: only
                the groups with a later key (and never the control key's).
        """


class Target(Protocol):
    """What a stand-in asks of its dispatcher: a wakeup (`sends.SendTarget.trigger`)."""

    def trigger(self, actor: Actor, key: Key) -> None:
        """Make ``actor`` run a triggered update at ``key`` (or earlier)."""


class StandIn(Actor):
    """The actor of a replaced node: sends its recorded messages at their recorded keys.

    Args:
        node (Node): the replaced node (its hooks never run).
        path (str): its dotted path; order (int): its order in the net.
        periods (dict[int, int] | None): as `Actor`'s.
        feed (Feed): its recorded messages.
    """

    __slots__ = ("feed", "target", "_groups", "_next", "_seek", "_resume")

    def __init__(self, node: Node, path: str, order: int, periods: dict[int, int] | None,
                 feed: Feed) -> None:
        super().__init__(node, path, order, periods)
        self.feed = feed
        self.target: Target | None = None  # the dispatcher, set by build.wire
        self._groups: Iterator[Group] | None = None
        self._next: Group | None = None
        self._seek: Key | None = None  # reopen the feed after this key at the next wakeup
        self._resume = False  # a tree was loaded: resume after its time
        # Its wakeups are the feed's keys: no ticks, no thread of its own, and the
        # messages it sends are the decoded ones, on the CPU (readers on a CUDA
        # device get them there as from any CPU node).
        self.period_ns = None
        self.dedicated = False
        self.device = _CPU
        self.update = self._wake

    # -- the hooks: Actor runs them in the node's context, as it runs the node's ---------
    def control_hook(self, hook: str) -> Callable[[], None]:
        """The stand-in's own ``on_start`` (`_start`); its ``on_stop`` does nothing.

        Nothing of the node's was started, so nothing is stopped; the node's
        code never runs.
        """
        return self._start if hook == "on_start" else _nothing

    def _start(self) -> None:
        """``on_start``: send what the node's ``on_start`` sent; ask for the first wakeup.

        A restart of the stand-in alone (``one_for_one``, after its hook
        raised) comes while the run goes on, stamped at the run's current
        key: the recording goes on after that key, and what ``on_start``
        sent at the start is not sent again.
        """
        key = self.stamp
        if key != CONTROL_KEY:
            self._seek = key
            self._next = None
            self._ask((key[0], key[1] + 1))  # the next delta cycle: the restart's is running
            return
        self._seek = None
        self._groups = self.feed.open(None)
        self._next = next(self._groups, None)
        nxt = self._next
        if nxt is not None and nxt[0] == CONTROL_KEY:
            self._send(nxt)
            self._next = nxt = next(self._groups, None)
        if nxt is not None:
            self._ask(nxt[0])

    def _wake(self, node: Node, dt: float) -> None:
        """A wakeup at ``self.stamp``: send the groups due by it; ask for the next one."""
        if self._seek is not None:  # a tree was loaded: the groups after its time
            self._groups = self.feed.open(self._seek)
            self._seek = None
            self._next = next(self._groups, None)
        key = self.stamp
        nxt = self._next
        while nxt is not None and nxt[0] <= key:
            self._send(nxt)
            self._next = nxt = next(self._groups, None)  # type: ignore[arg-type]
        if nxt is not None:
            self._ask(nxt[0])

    def _send(self, group: Group) -> None:
        """Send one group's messages on their Outputs, in their recorded order."""
        _, outputs, messages = group
        outputs.reverse()
        messages.reverse()
        while messages:
            # Popped: the message reaches the send held by nothing else (handed over).
            outputs.pop().send(messages.pop())

    def _ask(self, key: Key) -> None:
        """A wakeup at ``key``: the trigger key is taken as the hook is finished."""
        target = self.target
        assert target is not None  # set as the net is wired, before any hook runs
        target.trigger(self, key)

    # -- the schedule -------------------------------------------------------------------
    def schedule_first_tick(self, start_ns: int) -> None:
        """The timer starts (or restarts) at ``start_ns``: after a loaded tree, resume there.

        Called under the dispatcher's lock: the feed is reopened at the next
        wakeup, which is asked for at once (the earliest key the run starts
        with; the dispatcher raises it to that).
        """
        super().schedule_first_tick(start_ns)
        if self._resume:
            self._resume = False
            self._seek = (start_ns, MASK)  # every group at t <= start_ns was sent before the cut
            self._next = None
            self.trigger_key = (start_ns, 0)

    # -- state: the stand-in has none of its own ---------------------------------------
    def take_state(self, envelope: Snapshot) -> None:
        """The stand-in's entry in a state tree: ``{}`` (the node's code never ran)."""
        envelope.into[self.path] = {}

    def restore(self, envelope: Restore) -> None:
        """Load the kept messages of the node's Inputs, not its state; resume after the cut."""
        super().restore(Restore(None, envelope.inputs, envelope.last_update_ns))
        self._resume = True
