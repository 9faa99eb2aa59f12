"""Deadlines and budgets of a node's ``on_update``: the declaration's check and the miss.

A node declares them next to its period (``Node(budget=, deadline=,
on_miss=)``); the run measures each ``on_update`` of such a node as it
returns (`_runtime.actor.guard_deadlines`), in real time catches one still
running at its deadline (`_runtime.overdue.DeadlineMonitor`), and handles a
miss by the node's policy. This module holds what the node and the kernel
share: the check of the declaration (`check_deadlines`), the declarations
that are legal but suspect (`suspect_deadlines`), and `DeadlineMiss`, the
record of one miss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ._checks import is_number

__all__ = ["DeadlineMiss"]

ON_MISS = ("warn", "skip", "safe", "stop")
"""The policies of ``Node(on_miss=)``."""


@dataclass(frozen=True)
class DeadlineMiss:
    """One ``on_update`` that ran past its node's budget or deadline.

    Given to the node's ``on_deadline_miss`` (``on_miss="safe"``) and held by
    the `~mujou_actors.errors.DeadlineMissError` of ``on_miss="stop"``.

    Attributes:
        path (str): the node's dotted path (``""``: the root).
        due (float): seconds of the run's timer: the time the update stands
            for (its tick's due time, or its trigger's time).
        run_time (float): CPU seconds the hook's thread spent in it
            (``time.thread_time_ns``); 0.0 for a miss caught while the hook
            ran (``running``: a thread's CPU time is read as its hook returns).
        finished (float): seconds after ``due`` at which it returned. Real
            time: read on the run's timer. Simulated time: ``run_time`` (a
            hook starts exactly when due there, and the simulated clock
            stands still while it runs). For a miss caught while the hook
            ran: the seconds after ``due`` at which it was caught, still
            running (so it finished later still).
        budget (float | None): the node's budget, seconds; None: none declared.
        deadline (float | None): the node's deadline, seconds; None: none declared.
        running (bool): caught by the run's deadline monitor while the hook
            was still running, past its deadline (real time; the record
            `DeadlineMissError` holds when ``on_miss="stop"`` stopped the run
            then). False: measured as the hook returned. Default: False.
    """

    path: str
    due: float
    run_time: float
    finished: float
    budget: float | None
    deadline: float | None
    running: bool = False

    @property
    def budget_missed(self) -> bool:
        """bool: ``run_time`` exceeded the budget."""
        return self.budget is not None and self.run_time > self.budget

    @property
    def deadline_missed(self) -> bool:
        """bool: the update finished later than ``deadline`` after ``due``."""
        return self.deadline is not None and self.finished > self.deadline

    def __str__(self) -> str:
        parts = []
        if self.budget_missed:
            parts.append(f"ran {_ms(self.run_time)} of CPU time, over its budget of "
                         f"{_ms(self.budget)}")  # type: ignore[arg-type]
        if self.deadline_missed:
            done = "is still running" if self.running else "finished"
            parts.append(f"{done} {_ms(self.finished)} after it was due, past its deadline "
                         f"of {_ms(self.deadline)}")  # type: ignore[arg-type]
        return (f"node {self.path or '<root>'!r}: on_update due at t={self.due:.6f} s "
                + " and ".join(parts))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def check_deadlines(cls: type, base: type, period_ns: int | None, budget: Any, deadline: Any,
                    on_miss: Any) -> tuple[int | None, int | None, str]:
    """Check ``Node(budget=, deadline=, on_miss=)``; return the two in ns and the policy.

    Args:
        cls (type): the node's class (named by the errors; ``"safe"`` needs
            its ``on_deadline_miss``).
        base (type): `Node`, whose ``on_deadline_miss`` does nothing.
        period_ns (int | None): the node's checked period, ns.
        budget, deadline, on_miss: the arguments given.

    Raises:
        TypeError: ``budget`` or ``deadline`` not a number nor None,
            ``on_miss`` not a str.
        ValueError: the rule each error names: ``budget`` or ``deadline`` not
            finite and > 0 (or under 1 ns); a deadline without a period; a
            budget longer than the deadline; an ``on_miss`` not in `ON_MISS`;
            ``"skip"`` without a period; ``"safe"`` without an
            ``on_deadline_miss`` of the class's own; an ``on_miss`` other than
            ``"warn"`` with neither budget nor deadline.
    """
    where = cls.__name__
    budget_ns = _check_limit("budget", budget, where)
    deadline_ns = _check_limit("deadline", deadline, where)
    if deadline_ns is not None and period_ns is None:
        raise ValueError(f"{where}: deadline needs a period (it counts from each tick's due "
                         "time); give the node a period, or declare a budget instead")
    if budget_ns is not None and deadline_ns is not None and budget_ns > deadline_ns:
        # A thread's CPU time grows no faster than the wall clock, and an update starts
        # no earlier than it is due: one over such a budget is past its deadline already.
        raise ValueError(f"{where}: budget ({_ms(budget_ns / 1e9)}) must not exceed deadline "
                         f"({_ms(deadline_ns / 1e9)}): an update over that budget has run "
                         "past its deadline already, so the budget would never be the one "
                         "missed; give a budget <= deadline, or only one of them")
    if not isinstance(on_miss, str):
        raise TypeError(f"{where}: on_miss must be one of {', '.join(map(repr, ON_MISS))}, "
                        f"got {on_miss!r}")
    if on_miss not in ON_MISS:
        raise ValueError(f"{where}: on_miss must be one of {', '.join(map(repr, ON_MISS))}, "
                         f"got {on_miss!r}")
    if on_miss != "warn" and budget_ns is None and deadline_ns is None:
        raise ValueError(f"{where}: on_miss={on_miss!r} without a budget or a deadline: "
                         "nothing can be missed")
    if on_miss == "skip" and period_ns is None:
        raise ValueError(f"{where}: on_miss='skip' skips the next tick and needs a period")
    if on_miss == "safe" and not overrides(cls, base, "on_deadline_miss"):
        raise ValueError(f"{where}: on_miss='safe' calls the node's on_deadline_miss(self, "
                         "miss), which the class does not define")
    return budget_ns, deadline_ns, on_miss


def suspect_deadlines(period_ns: int | None, budget_ns: int | None,
                      deadline_ns: int | None) -> list[str]:
    """The legal declarations that are likely mistakes, each as the rule it breaks.

    Warned of as the run starts (`net.warn_suspect_net`, naming the node):

    * a ``deadline`` longer than the ``period``: a tick's update should end
      before the next tick is due; one that ends later (yet in time for its
      deadline) makes that tick late, an overrun, without a miss;
    * a ``budget`` longer than the ``period`` (with a deadline, which is no
      shorter than the budget, both are warned of): an update that uses its
      whole budget makes the next tick late, and the node needs more than
      one CPU to keep up.

    Args:
        period_ns (int | None): the node's period, ns (None: triggered only).
        budget_ns (int | None): its budget, ns (None: none).
        deadline_ns (int | None): its deadline, ns (None: none).

    Returns:
        list[str]: one sentence per rule broken; [] for none.
    """
    if period_ns is None:
        return []
    period = _ms(period_ns / 1e9)
    found = []
    if deadline_ns is not None and deadline_ns > period_ns:
        found.append(f"deadline ({_ms(deadline_ns / 1e9)}) is longer than its period "
                     f"({period}): an update may end after the next tick is due and still "
                     "meet its deadline, making that tick late (an overrun, not a miss); "
                     "a deadline <= period is what a tick's update must keep")
    if budget_ns is not None and budget_ns > period_ns:
        found.append(f"budget ({_ms(budget_ns / 1e9)}) is longer than its period ({period}): "
                     "an update that uses it makes the next tick late, and the node needs "
                     "more than one CPU to keep up; a budget <= period is what it can keep")
    return found


def _check_limit(name: str, value: Any, where: str) -> int | None:
    """A budget or deadline in seconds, as whole ns (None for None)."""
    if value is None:
        return None
    if not is_number(value):
        raise TypeError(f"{where}: {name} must be a number of seconds or None, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{where}: {name} must be a finite number of seconds > 0 or None, "
                         f"got {value!r}")
    ns = round(value * 1_000_000_000)
    if ns < 1:
        raise ValueError(f"{where}: {name} {value!r} s is shorter than 1 ns")
    return ns


def overrides(cls: type, base: type, hook: str) -> bool:
    """Whether a class below ``base`` defines ``hook``, found as Python finds it.

    Looked up in the classes' own namespaces, never through a node (only
    _runtime/actor.py touches a node's hooks; tests/test_architecture.py).
    """
    for klass in cls.__mro__:
        if hook in vars(klass):
            return klass is not base
    return False
