"""A placed run's trace: every process records its own part, the host writes one file.

With ``mujou.run(factory, placement=..., trace=...)`` each process that runs
nodes (every group, and the host when nodes stay in its group) records its
kernel's hooks, sends and reads into a buffer of its own (`Kernel(trace=)`):
the Tracer's capacity split evenly between them (`PlacedTrace.share`), so
the run holds no more records in all than one process would. A group
rebuilt for a restart keeps what its earlier kernel recorded
(`KernelTraces`); the records of a process that died are lost with it.

When the run ends, after every group's ``on_stop``, the host takes each
group's records over the control plane (`group.TakeTrace`: plain data only,
one packed ``bytes`` object per kernel) and writes ONE file
(`mujou_actors.trace.format_processes`): a Chrome-trace process per group
(``pid`` its pid, named ``group NAME``; ``host`` for the host's group), its
workers' tracks in it, and arrows for the messages between groups, from the
send in one process to the hook that read it in another. Both processes name
such a message alike, by the send's ``(t_ns, delta, sender)`` and the
reading Input, so the host pairs the two ends without any number crossing
with the message itself. Every process stamps its records with
``time.perf_counter_ns``, which on Linux reads CLOCK_MONOTONIC, one clock
for all the processes of a machine: their timelines line up as they are.
A group on another machine stamps on that machine's clock: its stamps are
shifted onto the host's by the heartbeat's estimate of the offset between
the two clocks (``clocks``), and the file says by how much and within what
bound (each process's label; ``otherData.groups``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from .._runtime.kernel import Kernel
from ..errors import describe
from ..trace import ProcessTrace, Tracer

__all__ = ["KernelTraces", "PlacedTrace", "write_placed", "Clock"]

log = logging.getLogger("mujou_actors")


class KernelTraces:
    """The trace parts of the kernels one process runs, one after the other.

    A restart rebuilds a group's kernel (and net): `track` each new kernel,
    and what the previous one recorded is kept as plain data (without its
    nodes, which are let go).

    Args:
        capacity (int | None): each kernel's trace buffer, in records (its
            ``Kernel(trace=)``); None: the run is not traced.
    """

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self._parts: list[dict[str, Any]] = []
        self._current: Kernel | None = None

    def track(self, kernel: Kernel) -> Kernel:
        """Follow ``kernel`` from now on; keep the previous one's part (it is stopped).

        Returns:
            Kernel: ``kernel``.
        """
        if self._current is not None:
            part = self._current.trace_part()
            if part is not None:
                self._parts.append(part)
        self._current = kernel
        return kernel

    def take(self) -> list[dict[str, Any]]:
        """Every kernel's part, oldest first (`Kernel.trace_part`); empty when untraced."""
        parts = list(self._parts)
        if self._current is not None:
            part = self._current.trace_part()
            if part is not None:
                parts.append(part)
        return parts


class Clock(NamedTuple):
    """Where a group on another machine ran, and its clock's offset from the host's.

    Attributes:
        machine (str): the convention member (machine).
        offset_ns (int | None): its monotonic clock minus the host's, ns (the
            heartbeat's estimate); None: not known (no answer yet).
        uncertainty_ns (int | None): the bound on that estimate, ns.
    """

    machine: str
    offset_ns: int | None
    uncertainty_ns: int | None


class PlacedTrace:
    """The host's side of a traced placed run: the Tracer, each process's share, its own parts.

    Args:
        tracer (Tracer): ``mujou.run``'s ``trace``.
        processes (int): the processes that run nodes (the groups, and the
            host when its group has nodes).
    """

    def __init__(self, tracer: Tracer, processes: int) -> None:
        self.tracer = tracer
        self.share = max(1, tracer.capacity // max(1, processes))
        self.local = KernelTraces(self.share)


def write_placed(trace: PlacedTrace, groups: Iterable[Any],
                 take: Callable[[Any], list[dict[str, Any]]], other: dict[str, Any],
                 clocks: Mapping[str, Clock] | None = None) -> None:
    """Take every group's trace parts and write the run's one file.

    A group whose parts cannot be taken (its process died, its control
    plane does not answer) is left out of the file and named in
    ``otherData["missing"]``; the others are written all the same. A
    group on another machine (in ``clocks``) has its stamps shifted onto
    the host's clock by its offset, when known; ``otherData["groups"]``
    (when ``other`` has it) gets its ``machine``, ``clock_offset_ns`` and
    ``clock_uncertainty_ns``.

    Args:
        trace (PlacedTrace): the run's.
        groups: the driver's groups (``name``, ``pid``, ``remote``), in order (the
            file lists the host's first).
        take: a group's parts (a remote group's `group.TakeTrace`; the host's
            own are ``trace.local``'s).
        other (dict): facts for ``otherData`` (JSON values).
        clocks (Mapping[str, Clock], optional): by group name, the groups
            on other machines.

    Raises:
        OSError: the file could not be written.
    """
    processes = []
    missing = []
    clocks = clocks or {}
    facts = other.get("groups", {})
    for name, clock in clocks.items():
        if name in facts:
            facts[name] = {**facts[name], "machine": clock.machine,
                           "clock_offset_ns": clock.offset_ns,
                           "clock_uncertainty_ns": clock.uncertainty_ns}
    for g in sorted(groups, key=lambda g: g.remote):  # the host first
        try:
            parts = take(g) if g.remote else trace.local.take()
        except Exception as exc:  # noqa: BLE001 - logged, and the group named in the file
            log.warning("placed run: the trace of group %r could not be taken: %s", g.name,
                        describe(exc))
            missing.append(g.name)
            continue
        clock = clocks.get(g.name, Clock("", None, None))
        processes.append(ProcessTrace(f"group {g.name}" if g.remote else "host", g.pid, parts,
                                      clock.machine, clock.offset_ns, clock.uncertainty_ns))
    trace.tracer._write_processes(processes, trace.share,
                                  {**other, "share": trace.share, "missing": missing})
