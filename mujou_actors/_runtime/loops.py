"""Algebraic loops: cycles of triggering Inputs with no delay, found before a run starts.

A message sent at ``(t, d)`` triggers its reader at ``(t, d + 1)`` (a delta
cycle later, at the same instant): a ring of nodes that trigger one another
never lets simulated time advance. `find_loops` finds such rings in the
static net (strongly connected components of the graph "node -> node that
one of its Outputs triggers", iterative Tarjan: no recursion, whatever the
net's size), and `warn_loops` logs each one when a run starts. A ring may
still end (a node that stops sending); the dispatcher enforces the limit at
run time (``mujou.run(max_delta_cycles=)``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..ports import Input, Output

if TYPE_CHECKING:
    from ..node import Node

__all__ = ["DEFAULT_MAX_DELTA_CYCLES", "Loop", "find_loops", "warn_loops", "describe_loop"]

log = logging.getLogger("mujou_actors")

# The delta cycles one instant may take before the run stops with AlgebraicLoopError
# (mujou.run(max_delta_cycles=)): far above what any net without a loop needs
# (a chain of n triggered nodes takes n cycles), far below the key's 2**32.
DEFAULT_MAX_DELTA_CYCLES = 10_000

# One edge of a loop: (sender path, Output name, reader path, Input name).
Edge = tuple[str, str, str, str]
Loop = tuple[Edge, ...]


def _edges(found: Sequence[tuple[str, Node]]) -> dict[int, list[tuple[int, str, str]]]:
    """Index of a node -> [(index of a node it triggers, Output name, Input name)]."""
    index = {id(node): i for i, (_, node) in enumerate(found)}
    edges: dict[int, list[tuple[int, str, str]]] = {}
    for i, (_, node) in enumerate(found):
        for name, port in node._mujou_ports().items():
            if not isinstance(port, Output):
                continue
            for reader in port.readers:
                j = index.get(id(reader.node))
                if j is None or not _triggers(reader):
                    continue
                edges.setdefault(i, []).append((j, name, reader.name or "?"))
    return edges


def _triggers(inp: Input) -> bool:
    """Whether a message on ``inp`` triggers its node (DESIGN 3: ``trigger=None``)."""
    return inp.node.period is None if inp.trigger is None else bool(inp.trigger)


def _components(n: int, edges: dict[int, list[tuple[int, str, str]]]) -> list[list[int]]:
    """Strongly connected components (Tarjan's algorithm, iterative), each in found order."""
    order = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    stack: list[int] = []
    found: list[list[int]] = []
    counter = 0
    for root in range(n):
        if order[root] != -1:
            continue
        work = [(root, 0)]
        while work:
            v, k = work.pop()
            if k == 0:
                order[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            out = edges.get(v, ())
            if k < len(out):
                work.append((v, k + 1))
                w = out[k][0]
                if order[w] == -1:
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], order[w])
                continue
            if work:  # v is done: its parent takes its low link
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == order[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp.append(w)
                    if w == v:
                        break
                found.append(sorted(comp))
    return found


def _cycle(comp: list[int], edges: dict[int, list[tuple[int, str, str]]]) -> list[
        tuple[int, str, int, str]]:
    """One cycle through the first node of ``comp``, within it (breadth first: a shortest)."""
    members = set(comp)
    start = comp[0]
    came: dict[int, tuple[int, str, str]] = {}
    frontier = [start]
    while frontier:
        nxt: list[int] = []
        for v in frontier:
            for w, out, inp in edges.get(v, ()):
                if w not in members or w in came:
                    continue
                came[w] = (v, out, inp)
                if w == start:
                    nxt = []
                    break
                nxt.append(w)
            if start in came:
                break
        frontier = nxt
    path: list[tuple[int, str, int, str]] = []
    w = start
    while True:
        v, out, inp = came[w]
        path.append((v, out, w, inp))
        w = v
        if w == start:
            break
    path.reverse()
    return path


def find_loops(found: Sequence[tuple[str, Node]]) -> list[Loop]:
    """The algebraic loops of a net: one cycle of triggering connections per ring.

    Args:
        found (Sequence[tuple[str, Node]]): the net's nodes by path (`net.walk`).

    Returns:
        list[Loop]: per strongly connected component of the triggering graph
        that holds a cycle, one shortest cycle through its first node, as
        edges ``(sender path, Output, reader path, Input)`` in order; in the
        net's order.
    """
    edges = _edges(found)
    loops: list[Loop] = []
    for comp in _components(len(found), edges):
        v = comp[0]
        if len(comp) == 1 and all(w != v for w, _, _ in edges.get(v, ())):
            continue  # no cycle: a node alone that does not trigger itself
        loops.append(tuple((found[a][0], out, found[b][0], inp)
                           for a, out, b, inp in _cycle(comp, edges)))
    loops.sort(key=lambda loop: loop[0][0])
    return loops


def describe_loop(loop: Loop) -> str:
    """A loop in words: ``'a'.state -> 'b'.state, 'b'.command -> 'a'.command``."""
    return ", ".join(f"{s or '<root>'!r}.{o} -> {r or '<root>'!r}.{i}" for s, o, r, i in loop)


def warn_loops(found: Sequence[tuple[str, Node]], max_delta_cycles: int) -> list[Loop]:
    """Log a warning for each algebraic loop of the net (see `find_loops`); return them.

    Args:
        found (Sequence[tuple[str, Node]]): the net's nodes by path.
        max_delta_cycles (int): the run's limit, named in the warning.

    Returns:
        list[Loop]: the loops found.
    """
    loops = find_loops(found)
    for loop in loops:
        log.warning("algebraic loop: %s trigger one another at the same instant with no "
                    "delay (each message triggers its reader one delta cycle later): the "
                    "instant cannot end while they keep sending, and one past "
                    "max_delta_cycles=%d delta cycles stops the run with "
                    "AlgebraicLoopError. Break it: give one node a period, or make one "
                    "of these Inputs trigger=False", describe_loop(loop), max_delta_cycles)
    return loops
