"""The end of a placed run: the last cut, every group's stop, the final tree, all closed.

A placed run ends as one process does: timed work stops at the end of the
instant the run is in (simulated time) or at once (real time); the last cut
(`Ending.last_cut`, inside the supervised loop, so that a group found dead
there is restored and the run finished like any other) settles every message
between groups into its reader's Inputs and takes the final figures; then
every group runs its ``on_stop`` hooks and gives its final tree
(`Ending.finish`), the trees are merged into the run's final state (none
when a group died or was stuck: never a partial tree), the run's outputs are
closed in the one order of `outputs.close_outputs`, and the processes, links
and shared memory of the run go. The hooks in flight share one
``stop_timeout`` across these steps (`_Driver._stop_left`), as in one process.

`Ending` is the driver's (``driver.end``); every method runs on the driver's
thread (or the start's, for a start that failed).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Mapping
from typing import Any

from .._runtime.outputs import close_outputs
from ..errors import GroupDied, NodeError, NotRunningError, StopTimeoutError, describe
from . import group, tracing, wire
from .failures import GroupLost, Stuck
from .rounds import UNKNOWN_HOOKS

# The placed run's driver (driver._Driver): driver.py imports this module, so it is
# named here, not imported.
_Driver = Any

__all__ = ["Ending"]

log = logging.getLogger("mujou_actors")


class Ending:
    """The end of one placed run (see the module's docstring).

    Args:
        driver (driver._Driver): the run's driver: its groups, failures and
            results (``final_tree``, ``final_error``, ``final_stats``, ``stuck``,
            ``dead``), which the end writes and `placed_run.PlacedRun` reads.

    Attributes:
        cut_done (bool): the last cut and the final stats are taken (`last_cut`).
    """

    def __init__(self, driver: _Driver) -> None:
        self.driver = driver
        self.cut_done = False

    def finish(self) -> None:
        """Stop every group (on_stop), take the final state, end the processes."""
        driver = self.driver
        driver.rounds_ended = time.perf_counter()  # the benchmarks' wall time of the rounds
        driver.ending = True
        driver._end_begins()
        if driver._watcher is not None:
            driver._watcher.close()
        stuck = driver.stuck
        trees: list[dict[str, Any]] = []
        missing: dict[str, str] = {}  # groups that gave no final state, and why
        try:
            self._stop_groups(stuck, trees, missing)
        finally:
            # The groups' last log records (their on_stop's), before the recording closes.
            driver.logs.finish()
            driver.end_wall = time.monotonic()
            driver.time_ns = driver.timing.ended_at()
            if driver.dead:
                # A tree without a dead group's nodes would restore a different net.
                driver.final_error = GroupDied(
                    sorted(driver.dead)[0], driver.groups[sorted(driver.dead)[0]].pid,
                    "its nodes' state died with its process: the run has no final state "
                    "(restore the supervisor's latest snapshot instead)")
            elif missing:
                # Likewise a tree without a stuck group's nodes, or one whose stop failed:
                # the run ends with its failure and no final state, never a partial one.
                driver.final_error = _no_final_state(missing)
                if not driver.failures and not stuck:
                    driver.failures.append(driver.final_error)
            elif trees:
                try:
                    driver.final_tree = group.merge_trees(trees, driver.time_ns, driver.order)
                except BaseException as exc:  # state_dict() raises it
                    driver.final_error = exc
            # The groups are stopped, their processes still there (the trace's records);
            # every published item is routed (the recording). The one order of outputs.py.
            # (The recorder stays: stats() reads its figures after the end.)
            close_outputs(driver.failures, time_ns=driver.time_ns,
                          stop_timeout=driver.stop_timeout, trace=self._trace_writer(),
                          recorder=driver.recorder, snapshots=driver.recovery.snapshots,
                          host=driver.host)
            try:
                driver.system.shutdown(driver.stop_timeout)
            except BaseException as exc:
                log.error("placed run: shutting the processes down failed: %s", describe(exc))
            for g in driver.groups.values():
                g.link.close()
            driver.wake.close()  # its pipe, one a run (a late set is a no-op)
            if driver.monitor is not None:
                driver.monitor.close()
            if driver.run_id is not None:
                wire.remove_blocks(driver.run_id)  # a killed group's pools too
            shutil.rmtree(driver.tmpdir, ignore_errors=True)
            if stuck and not driver.failures:
                driver.failures.append(StopTimeoutError(stuck, driver.stop_timeout))
            driver.ended.set()

    def _trace_writer(self) -> tuple[str, Callable[[], None]] | None:
        """A traced run's file and the function that writes it from every group's records
        (distributed/tracing.py; a group whose records cannot be taken is left out)."""
        driver = self.driver
        trace, driver.trace = driver.trace, None
        if trace is None:
            return None
        limit = driver.stop_timeout + 5.0
        other = {"timer": driver.timing.name,
                 "nodes": len(driver.order),
                 "groups": {g.name: {"pid": g.pid, "nodes": list(g.nodes)}
                            for g in driver.groups.values()}}

        def write() -> None:
            tracing.write_placed(trace, driver.groups.values(),
                                 lambda g: driver.ask(g.name, group.TakeTrace(), limit),
                                 other, self._clocks())

        return str(trace.tracer.path), write

    def _clocks(self) -> dict[str, tracing.Clock]:
        """Each group on another machine's clock offset now (the heartbeat's estimate)."""
        driver = self.driver
        statuses = driver.monitor.members() if driver.monitor is not None else {}
        clocks = {}
        for g in driver.groups.values():
            if g.member is not None:
                status = statuses.get(g.name)
                est = None if status is None else status.offset
                clocks[g.name] = tracing.Clock(g.member, None if est is None else est.offset_ns,
                                               None if est is None else est.uncertainty_ns)
        return clocks

    def last_cut(self) -> None:
        """The end's consistent cut and final stats, before any group stops.

        Run inside the supervised loop (`_main`): a group found dead here (it
        died, or its machine was lost, as the run reached its end: the
        heartbeat may tell of it only now) raises, and the supervisor restores
        it and finishes the run, as for a death found between two rounds.
        Every remote group answers the final stats' request, so a death up to
        this moment is found here, not by the stop that follows.
        """
        driver = self.driver
        if driver.stuck or driver.dead or any(g.waiting for g in driver.groups.values()):
            return
        driver._end_begins()  # a real-time run's hooks in flight get one stop_timeout from here
        try:
            driver.timing.settle_end()
        except (GroupLost, GroupDied, Stuck):
            raise
        except BaseException as exc:  # a group's hooks not held in time: the rest still ends
            log.warning("placed run: the last messages could not be delivered: %s",
                        describe(exc))
        # After the last messages are in (their drops count), before the stop.
        driver.final_stats = driver.group_stats(strict=True)
        driver._check_exits()

    def _stop_groups(self, stuck: dict[str, str], trees: list[dict[str, Any]],
                       missing: dict[str, str]) -> None:
        """Stop every group (their final trees into ``trees``, their stuck nodes into
        ``stuck``, the groups without a tree and why into ``missing``)."""
        driver = self.driver
        if not self.cut_done:  # a failure ended the rounds: the cut as far as it goes
            if not driver.stuck and not driver.dead \
                    and not any(g.waiting for g in driver.groups.values()):
                try:
                    driver.timing.settle_end()
                except BaseException as exc:  # a dead group: the others still stop
                    log.warning("placed run: the last messages could not be delivered: %s",
                                describe(exc))
            try:  # after the last messages are in (their drops count), before the stop
                driver.final_stats = driver.group_stats()
            except BaseException as exc:  # a dead group has none; the rest is still ended
                log.warning("placed run: the final stats could not be taken: %s",
                            describe(exc))
        for g in driver.groups.values():
            if g.name in driver.dead:
                continue  # nothing to stop; its death is the run's failure already
            # Its hooks in flight get what is left of the end's one stop_timeout; its
            # on_stop hooks a stop_timeout of their own, as in one process.
            idle = driver._idle_left()
            try:
                hooks, tree = g.control.stop(driver.stop_timeout, not g.waiting, idle)
                took = tree is not None
                if took:
                    trees.append(tree)
                named = _stuck_hooks(hooks)
                if named and stuck.get(g.name) == UNKNOWN_HOOKS:
                    del stuck[g.name]  # its stop names them now
                for p, h in named.items():
                    stuck[p] = f"{h} (in group {g.name!r})"
                if not took:
                    missing[g.name] = ("stuck in a hook" if hooks else
                                       "its grant did not end within stop_timeout")
            except GroupDied as exc:  # it died as the run ended
                driver.dead.add(g.name)
                if not driver.failures:
                    driver.failures.append(exc)
            except BaseException as exc:
                log.error("placed run: stopping group %r failed: %s", g.name, describe(exc))
                missing[g.name] = f"its stop failed: {describe(exc)}"
                if not isinstance(exc, NotRunningError) and not driver.failures:
                    driver.failures.append(exc)


def _stuck_hooks(hooks: Any) -> dict[str, str]:
    """A stop's stuck nodes as ``{path: hook}`` (`group.stop_kernel`); a list of paths
    (a group server that names no hooks) as ``"a hook"`` each."""
    if isinstance(hooks, Mapping):
        return dict(hooks)
    return {p: "a hook" for p in hooks}


def _no_final_state(missing: Mapping[str, str]) -> NodeError:
    """What ``state_dict()`` raises after an end that left groups without a final state."""
    why = "; ".join(f"group {name!r}: {reason}" for name, reason in sorted(missing.items()))
    return NodeError("", "state_dict", f"state_dict(): the run has no final state ({why}); "
                     f"a tree without these groups' nodes would restore another net")
