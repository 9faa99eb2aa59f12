"""The host's view of one Output: what each send leaves for the host.

It lies below the dispatcher: a send (`sends.make_send`) writes into it,
and the host's side of the run (``Run.read``, subscriptions, waiters) reads
it, so a message's way through the code goes one way, down from the sender.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["HostView"]


class HostView:
    """The newest message of one Output (or host write to an Input) and its listeners.

    ``listeners`` is replaced, never changed in place (copy-on-write): a send
    iterates it without a lock.
    """

    __slots__ = ("last", "listeners")

    def __init__(self) -> None:
        self.last: Any = None
        self.listeners: list[Callable[[Any], None]] = []

    def publish(self, message: Any) -> None:
        """Call every listener with ``message``, in the order they were attached."""
        for listener in self.listeners:
            listener(message)
