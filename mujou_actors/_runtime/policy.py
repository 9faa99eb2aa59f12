"""Simulated and real time as policies: the dispatcher asks, a policy decides.

The dispatcher runs the same loops for both timers; where they differ, it asks
its policy (`SimulatedTime` or `RealTime`) and acts on the `Step` it returns.
A policy holds no lock, starts no thread and changes nothing: its methods are
functions of the facts they are given, so each rule can be tested on its own
(tests/test_policy.py).

The rules, in short:

* **Simulated time** runs work in ``(t, delta)`` order, one *delta cycle* at
  a time: work at a later key waits until everything earlier has finished
  (`SimulatedTime.advance`). A message sent at ``(t, d)`` triggers its reader
  at ``(t, d + 1)``. Consistent cuts fall between two instants; the end comes
  once every update due at ``t <= end`` has run. A kernel driven from outside
  (`kernel.Kernel`) also has a *bound*: no work after it starts until the
  driver grants more.
* **Real time** starts work when the clock reaches its key; a message
  triggers its reader at the sending update's time (lateness is end to end),
  one delta deeper: the delta counts the chain of triggered updates.
  The run ends once the work due by its end is done, or, if hooks keep
  running, ``grace`` after it.
"""

from __future__ import annotations

import enum

from .keys import CONTROL_KEY, Key

__all__ = ["Step", "Decision", "TimePolicy", "SimulatedTime", "RealTime", "make_policy"]


class Step(enum.Enum):
    """What the dispatcher does next (see `TimePolicy`)."""

    START = "start"            # work at the key may start now
    WAIT = "wait"              # wait: for ``arg`` seconds, or (None) for a notify
    NEXT_DELTA = "next_delta"  # simulated: the next delta cycle of this instant, at ``arg``
    NEXT_INSTANT = "next_instant"  # simulated: the timer moves on to key ``arg``
    CUT = "cut"                # simulated: the timer moves to ``arg`` ns and the net holds there
    HOLD = "hold"              # hold as soon as nothing is in flight
    STOP = "stop"              # a stop asked for at the instant's boundary: no more timed work
    END = "end"                # the run's end is reached
    AT_END = "at_end"          # real time: nothing more starts before the end (see at_end)
    PAUSE = "pause"            # simulated, driven from outside: the granted bound is reached
    IDLE = "idle"              # no work at all, and no end: wait for a notify


Decision = tuple[Step, "Key | int | float | None"]

_WAIT: Decision = (Step.WAIT, None)


class TimePolicy:
    """What differs between the timers; see `SimulatedTime` and `RealTime`.

    Attributes:
        simulated (bool): the timer is simulated; then a hook takes only the
            deliveries stamped before its own key (`Mailbox.take_deliveries`),
            in real time every delivery that has arrived.
        delta_step (int): added to a sender's delta cycle to give the key at
            which its message triggers a reader, ``(t, d + delta_step)``: 1.
            In real time ``t`` is the sending update's due time and the delta
            the depth of the chain of triggered updates since a tick or a
            host write (delta 0); a chain past ``max_delta_cycles`` is an
            algebraic loop.
        tight_slack (bool): the threads ask for tight timer slack (real time).
    """

    simulated = False
    delta_step = 1
    tight_slack = False

    def batch_max(self, workers: int) -> int:
        """The most actors one worker claims per lock acquisition (see the dispatcher)."""
        raise NotImplementedError

    def first_trigger(self, start_ns: int) -> Key:
        """The key at which messages written before the timer started trigger their readers."""
        raise NotImplementedError

    def defers(self, workers: int, sender_dedicated: bool, reader_dedicated: bool) -> bool:
        """Whether a send may leave its reader's trigger to the end of the sending hook.

        True where nothing could run the reader earlier anyway, which saves a
        lock hand-over per send.
        """
        raise NotImplementedError

    def control_stamp(self, frontier: Key, now_ns: int) -> Key:
        """The key that a control hook's sends carry (``on_start``, ``on_stop``).

        Before the timer starts (``frontier`` is the control key), the control
        key: the start moves the triggers it causes to just after the start.
        Later (a restart), the instant the run is at, so that its messages are
        ordered and trigger their readers like any hook's sends.
        """
        raise NotImplementedError

    def host_trigger(self, frontier: Key, now_ns: int) -> Key:
        """The key at which a message written by the host triggers its reader."""
        if frontier == CONTROL_KEY:  # the timer has not started: made first_trigger then
            return CONTROL_KEY
        return self._host_trigger(frontier, now_ns)

    def _host_trigger(self, frontier: Key, now_ns: int) -> Key:
        raise NotImplementedError


class SimulatedTime(TimePolicy):
    """Simulated time: delta cycles in key order, bit-identical for any number of workers."""

    simulated = True
    delta_step = 1

    def batch_max(self, workers: int) -> int:
        return 1024 if workers == 1 else 64

    def first_trigger(self, start_ns: int) -> Key:
        return (start_ns, 1)

    def defers(self, workers: int, sender_dedicated: bool,
               reader_dedicated: bool) -> bool:
        # A triggered update at (t, d + 1) waits for the instant (t, d) to finish.
        return True

    def control_stamp(self, frontier: Key, now_ns: int) -> Key:
        return frontier

    def _host_trigger(self, frontier: Key, now_ns: int) -> Key:
        t, d = frontier  # running, or held at a cut: the next delta cycle
        return (t, d + 1)

    def advance(self, key: Key | None, frontier: Key, *, stop_requested: bool,
                hold_requested: bool, end_ns: int | None, cut_ns: int | None,
                bound: Key | None) -> Decision:
        """Nothing is in flight and ``key`` is the earliest work (None: none): what next.

        Args:
            key: the earliest pending key, or None when nothing is pending.
            frontier: the key of the delta cycle that has just finished.
            stop_requested: a stop waits for the end of the current instant.
            hold_requested: a consistent cut is asked for (the host, a restart).
            end_ns: the run's end (every update due at ``t <= end_ns`` runs), or None.
            cut_ns: the time of the next scheduled cut (a supervisor snapshot), or None.
            bound: the latest key a driven kernel may start (`kernel.Kernel.step`);
                None: no bound.

        Returns:
            Decision: ``PAUSE`` at the bound; ``NEXT_DELTA`` to go on at the
            same instant; at an instant's boundary, in this order: ``STOP``,
            ``CUT`` (the cut falls before the next work and not after the end),
            ``HOLD``, ``END`` (no work due by the end), ``IDLE`` (no work and
            no end), else ``NEXT_INSTANT``.
        """
        if bound is not None and (key is None or key > bound):
            return (Step.PAUSE, None)
        t_next = None if key is None else key[0]
        if t_next is not None and t_next == frontier[0]:
            return (Step.NEXT_DELTA, key)
        if stop_requested:
            return (Step.STOP, None)
        if cut_ns is not None and (t_next is None or t_next > cut_ns) and (
                end_ns is None or cut_ns <= end_ns):
            return (Step.CUT, cut_ns)
        if hold_requested:
            return (Step.HOLD, None)
        if t_next is None or (end_ns is not None and t_next > end_ns):
            return (Step.IDLE, None) if end_ns is None else (Step.END, None)
        return (Step.NEXT_INSTANT, key)


class RealTime(TimePolicy):
    """Real time: work starts when the monotonic clock reaches its key."""

    tight_slack = True

    def batch_max(self, workers: int) -> int:
        # Several workers: no batches. A hook that is slow now and then would
        # hold its batch-mates while another worker is idle, and in real time
        # that lateness is what the user sees.
        return 1024 if workers == 1 else 1

    def first_trigger(self, start_ns: int) -> Key:
        return (start_ns, 0)

    def defers(self, workers: int, sender_dedicated: bool,
               reader_dedicated: bool) -> bool:
        # One worker, busy with the sender: nothing can run the reader earlier.
        return workers == 1 and not sender_dedicated and not reader_dedicated

    def control_stamp(self, frontier: Key, now_ns: int) -> Key:
        return CONTROL_KEY if frontier == CONTROL_KEY else (now_ns, 0)

    def _host_trigger(self, frontier: Key, now_ns: int) -> Key:
        return (now_ns, 0)

    def start(self, key: Key, now_ns: int, end_ns: int | None, grace_ns: int) -> Decision:
        """Whether work at ``key`` may start at ``now_ns``; else how long to wait.

        Args:
            key: the earliest pending key (not the control key).
            now_ns: the timer's time, ns.
            end_ns: the run's end, or None.
            grace_ns: how long after the end hooks in flight may hold the run.

        Returns:
            Decision: ``START``; ``WAIT`` (seconds until ``key`` is due); or
            ``AT_END`` when the work is due after the end, or the grace is
            over: `at_end` decides then.
        """
        if end_ns is not None and (key[0] > end_ns or now_ns >= end_ns + grace_ns):
            return (Step.AT_END, None)
        if key[0] <= now_ns:
            return (Step.START, None)
        return (Step.WAIT, (key[0] - now_ns) / 1e9)

    def at_end(self, now_ns: int, end_ns: int, grace_ns: int, inflight: int,
               earliest: Key | None) -> Decision:
        """Nothing due may start before the end: ``END`` once the work due by it is done.

        Hooks still in flight ``grace_ns`` after the end no longer hold the
        run: it ends, and stopping reports them as stuck.
        """
        if now_ns < end_ns:
            return (Step.WAIT, (end_ns - now_ns) / 1e9)
        late = now_ns >= end_ns + grace_ns
        if late or (not inflight and (earliest is None or earliest[0] > end_ns)):
            return (Step.END, None)
        return (Step.WAIT, (end_ns + grace_ns - now_ns) / 1e9)


def make_policy(simulated: bool) -> SimulatedTime | RealTime:
    """The policy of a run whose timer is simulated (or not)."""
    return SimulatedTime() if simulated else RealTime()
