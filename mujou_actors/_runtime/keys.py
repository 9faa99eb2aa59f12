"""Keys of the schedule and stamps of deliveries: a time, a delta cycle and an order.

Work in a run is ordered by a *key* ``(t_ns, delta)``: the time in integer
nanoseconds of the run's timer and the delta cycle within that instant
(simulated time; in real time the delta counts the triggered updates of the
chain since a tick or a host write, see `policy.TimePolicy.delta_step`).
Control envelopes use `CONTROL_KEY`, before every timed key.

A key travels packed into one int, ``(t_ns << SHIFT) | delta`` (`pack`): it
sorts like the tuple and compares in C. A delivery's *stamp* (`stamp`) packs
the sender's order in the net in too, so that sorting deliveries by stamp
orders them by ``(t_ns, delta, sender)``: what makes a simulated run's
results independent of the number of workers.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Key", "SharedKey", "SHIFT", "MASK", "ORDER_BITS", "HOST_ORDER", "CONTROL_KEY",
           "CONTROL_T", "HOST_STAMP", "pack", "unpack", "stamp", "unstamp"]

# ``(t_ns, delta)``; t_ns may be -1 (CONTROL_KEY).
Key = tuple[int, int]
# A Key whose object identity matters (a hook's ``Actor.stamp``: its sends
# restamp only when it is another object). Typed Any so that the compiled
# build keeps it a Python object: mypyc stores a ``tuple[int, int]`` field
# unboxed and builds a new tuple at every read, so ``is`` would never hold.
# (A ``Key | None`` field, such as ``Actor.queued_key``, stays an object.)
SharedKey = Any

# A packed key: (t_ns << SHIFT) | delta. A delta cycle count stays below 2**32.
SHIFT, MASK = 32, (1 << 32) - 1
# A delivery's stamp: (packed key << ORDER_BITS) | (sender order + 1).
ORDER_BITS = 32
_ORDER_MASK = (1 << ORDER_BITS) - 1

# Sender order used for the host's writes (run.write, inputs=): before any node.
HOST_ORDER = -1

CONTROL_KEY: Key = (-1, 0)  # control envelopes sort before every timed key
CONTROL_T = CONTROL_KEY[0]


def pack(key: Key) -> int:
    """``(t_ns, delta)`` packed into one int that sorts like the tuple."""
    return (key[0] << SHIFT) | key[1]


def unpack(code: int) -> Key:
    """The ``(t_ns, delta)`` key packed in ``code`` (see `pack`)."""
    return code >> SHIFT, code & MASK


def stamp(key: Key, order: int) -> int:
    """The stamp of the sends of a hook at ``key`` by the sender of ``order``.

    One int that sorts like ``(t_ns, delta, order)``; ``order`` is the
    sender's order in the net, or `HOST_ORDER`.
    """
    return (pack(key) << ORDER_BITS) | (order + 1)


def unstamp(value: int) -> tuple[int, int, int]:
    """``(t_ns, delta, sender order)`` of a delivery's stamp (see `stamp`)."""
    t, d = unpack(value >> ORDER_BITS)
    return t, d, (value & _ORDER_MASK) - 1


HOST_STAMP = stamp(CONTROL_KEY, HOST_ORDER)  # the host's writes: before every node's send
