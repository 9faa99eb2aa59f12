"""The ready queue: a calendar of the keys at which actors are due, earliest first.

A heap holds the distinct keys (instants) at which pool actors are queued,
each packed into one int (`keys.pack`: sorts like the tuple, compares in C),
and per key a list of its actors (a *bucket*). Nodes on a common grid of
periods share keys, so queueing and taking an actor is O(1) for all but the
first of a key. Actors of one key are equally due; a bucket is taken whole,
in the order queued, when it fits in a batch, else from its end.

A bucket keeps the key tuple of its first actor, and every actor queued in it
refers to that one object (``queued_key``, and ``next_tick_ns`` when the tick
set the key). With 100,000 nodes an update's cost is mostly cache misses, and
an int or tuple made per actor is one more miss when the actor is next
claimed; the bucket's objects stay in cache.

**The liveness rule** (`Calendar.live`): an entry is live while its actor's
``queued_key`` is the bucket's key object and the actor is not busy. An actor
queued again at an earlier key leaves a stale entry behind, dropped when it
comes up; nothing is ever searched for and removed.

Dedicated-thread actors are not in the heap: their thread waits for their own
``queued_key``; `Calendar.earliest` counts them in.

**The tick plan** (`Calendar.plan`, a simulated run on the lone worker's
loop): in simulated time every tick falls on its period's grid, so the actors
of one period tick at the same instants, always. The plan groups them into a
`Cohort` each, made once when the run is wired: a cohort is queued as one
*standing* entry of its key's bucket and taken whole with it (`take_bucket`);
the first member to finish its tick queues it at the next instant
(`_join`), and every other member is back in it with one write (its
``queued_key``: the cohort's key object), not one append per actor per
instant. The liveness rule is the same: a member
queued elsewhere (triggered before its tick, a control envelope, failed) is
a stale entry of its cohort until it rejoins at the cohort's instant, and
runs from its own bucket meanwhile. A cohort whose members are all stale
leaves the queue when its instant comes up and is queued again by the first
member that comes back to its grid.

Every method is called with the dispatcher's lock held.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from .keys import CONTROL_KEY, CONTROL_T, SHIFT, Key, SharedKey

if TYPE_CHECKING:
    from .actor import Actor

__all__ = ["Calendar", "Cohort", "Group"]

# Actors taken from one bucket, with the bucket's key object: ``(key, actors)``.
# SharedKey (not Key): its identity is the liveness rule's.
Group = tuple[SharedKey, list["Actor"]]

# Cohorts of fewer actors are not planned: a cohort saves a bucket append per
# member per instant, and an actor alone on its period has nothing to share.
COHORT_MIN = 2


class Cohort:
    """The actors of one period in a planned run: one standing entry of the calendar.

    Attributes:
        period (int): the members' period, ns of the run's timer.
        actors (list[Actor]): the members, in the net's order; fixed for the run.
        t (int): the instant (ns) at which the cohort is queued; -1 while not queued.
        key (SharedKey): the key object of that instant's bucket (the members'
            ``queued_key`` while they are live in the cohort); None while not queued.
    """

    __slots__ = ("period", "actors", "t", "key")

    def __init__(self, period: int, actors: list[Actor]) -> None:
        self.period = period
        self.actors = actors
        self.t = -1
        self.key: SharedKey = None


class Calendar:
    """The queue of actors that have work due, by key (see the module's docstring).

    Args:
        dedicated (list[Actor]): the actors on dedicated threads (never in the heap).

    Attributes:
        queued (int): entries in the buckets, stale ones included (a trace counter;
            a cohort's members are not counted: a traced run has no plan).
        control_pending (int): control envelopes queued or in flight, all phases:
            while it is 0, no actor's control list is read when it is queued
            (counted by `count_control`).
        timed_open (bool): timed work may be queued (the dispatcher is running;
            set by `open_timed`).
    """

    __slots__ = ("_heap", "_due", "queued", "dedicated", "control_pending", "timed_open",
                 "_tick_t", "_tick_entry", "_standing")

    def __init__(self, dedicated: list[Actor]) -> None:
        self._heap: list[int] = []  # packed keys of the buckets
        # Per packed key: (the key tuple its actors share, its actors in the order queued).
        self._due: dict[int, tuple[SharedKey, list[Actor]]] = {}
        self.queued = 0
        self.dedicated = dedicated
        self.control_pending = 0
        self.timed_open = False
        # The (tick, 0) bucket the last `requeue` used and its tick, while that
        # bucket is queued (-1: none; `_pop_earliest` and `clear` reset it). The
        # actors finishing an instant mostly go to one next tick (a common
        # period): they skip the lookup, whose key (t_ns << SHIFT) is a big int.
        self._tick_t = -1
        self._tick_entry: tuple[SharedKey, list[Actor]] = (CONTROL_KEY, [])
        # The tick plan (`plan`): per packed key, the cohorts standing in its
        # bucket. Empty without a plan, and then never read but for its truth.
        self._standing: dict[int, list[Cohort]] = {}

    def plan(self, actors: list[Actor]) -> list[Cohort]:
        """Group the periodic actors of a simulated run into cohorts, one per period.

        Only for a calendar whose every actor is on the pool (no dedicated
        thread) and whose ticks never miss their grid (simulated time: see
        the module's docstring); called once, before anything is queued.
        Periods with fewer than `COHORT_MIN` actors stay in plain buckets.

        Returns:
            list[Cohort]: the cohorts made, each member's ``cohort`` set.
        """
        by_period: dict[int, list[Actor]] = {}
        for actor in actors:
            if actor.period_ns is not None and not actor.dedicated:
                by_period.setdefault(actor.period_ns, []).append(actor)
        cohorts: list[Cohort] = []
        for period, members in by_period.items():
            if len(members) >= COHORT_MIN:
                cohort = Cohort(period, members)
                for actor in members:
                    actor.cohort = cohort
                cohorts.append(cohort)
        return cohorts

    def _join(self, actor: Actor, cohort: Cohort, tick: int) -> bool:
        """Queue ``actor`` in ``cohort`` at its tick ``tick`` if the cohort is or can be there.

        A cohort not queued is queued at ``tick`` (the first member back on
        its grid brings it back). Returns False when the cohort is queued at
        another instant (the actor then takes a plain bucket).
        """
        if cohort.t != tick:
            if cohort.t != -1:
                return False
            code = tick << SHIFT  # (tick, 0) packed
            key: SharedKey
            found = self._due.get(code)
            if found is None:
                key = (tick, 0)  # one object (see requeue): the liveness rule is identity
                self._due[code] = (key, [])
                heapq.heappush(self._heap, code)
            else:
                key = found[0]
            standing = self._standing.get(code)
            if standing is None:
                self._standing[code] = [cohort]
            else:
                standing.append(cohort)
            cohort.t = tick
            cohort.key = key
        actor.queued_key = cohort.key
        actor.next_tick_ns = cohort.t  # the cohort's int (see the module's docstring)
        return True

    def count_control(self, n: int) -> None:
        """Count ``n`` control envelopes more queued or in flight (fewer if negative)."""
        self.control_pending += n

    def open_timed(self, open_: bool) -> None:
        """Let timed work be queued (True: the dispatcher runs) or not (False)."""
        self.timed_open = open_

    @staticmethod
    def live(actor: Actor, key: SharedKey) -> bool:
        """Whether an entry of ``actor`` in the bucket of ``key`` is live (the rule)."""
        return actor.queued_key is key and not actor.busy

    def schedule(self, actor: Actor) -> None:
        """Queue a non-busy actor at its earliest pending key.

        The key is a control envelope's (first), else the earlier of the next
        tick ``(t, 0)`` and the pending trigger; none while timed work is
        closed (held, stopping) or after the actor failed (until a restart).
        An actor already queued at that key or earlier stays as it is. A
        dedicated actor only gets its ``queued_key`` (its thread waits for it):
        the caller wakes the threads.
        """
        # control_pending first: with none anywhere, the actor's list is not read.
        key: SharedKey  # one object: the bucket's, the actor's queued_key
        if self.control_pending and actor.control:
            key, tick = CONTROL_KEY, None
        elif not self.timed_open or actor.failed:
            actor.queued_key = None
            return
        else:
            key = actor.trigger_key
            tick = actor.next_tick_ns
            if tick is not None and (key is None or (tick, 0) < key):
                key = (tick, 0)
            elif key is None:
                actor.queued_key = None
                return
        queued = actor.queued_key
        if queued is not None and queued <= key:
            return
        if actor.dedicated:
            actor.queued_key = key
            return
        cohort: Cohort | None = actor.cohort
        if cohort is not None and tick is not None and tick == key[0] and key[1] == 0 \
                and self._join(actor, cohort, tick):
            return
        code = (key[0] << SHIFT) | key[1]
        entry = self._due.get(code)
        if entry is None:
            self._due[code] = (key, [actor])
            heapq.heappush(self._heap, code)
        else:
            key = entry[0]  # the bucket's key object (see the module's docstring)
            entry[1].append(actor)
            if tick == key[0]:
                actor.next_tick_ns = key[0]
        actor.queued_key = key
        self.queued += 1

    def requeue(self, actor: Actor) -> None:
        """`schedule` for an actor whose hook has just finished, lean: runs once per update.

        The common case, a periodic actor with no trigger pending queued at
        its next tick, takes one bucket lookup, none when the last requeue
        used that tick's bucket (`_tick_t`), and neither for a member of a
        cohort queued at that tick (the plan); anything else (a trigger, a
        control envelope pending anywhere, timed work closed, a failed or
        dedicated actor, an actor queued already) is `schedule`'s.
        """
        tick = actor.next_tick_ns
        if tick is None or actor.trigger_key is not None or actor.queued_key is not None \
                or self.control_pending or not self.timed_open or actor.failed \
                or actor.dedicated:
            self.schedule(actor)
            return
        cohort: Cohort | None = actor.cohort
        if cohort is not None:  # planned: back in its cohort, one write (usually)
            if cohort.t == tick:
                actor.queued_key = cohort.key
                actor.next_tick_ns = cohort.t  # the cohort's int, as a bucket's
                return
            if self._join(actor, cohort, tick):
                return
        key: SharedKey
        if tick == self._tick_t:  # the last requeue's bucket, still queued: no lookup
            entry = self._tick_entry
            entry[1].append(actor)
            key = entry[0]
            actor.next_tick_ns = key[0]  # the bucket's int (see the module's docstring)
        else:
            code = tick << SHIFT  # (tick, 0) packed
            found = self._due.get(code)
            if found is None:
                # One key object, made once: compiled, a tuple display written to
                # two places would be boxed twice, and the liveness rule is identity.
                key = (tick, 0)
                entry = (key, [actor])
                self._due[code] = entry
                heapq.heappush(self._heap, code)
            else:
                entry = found
                entry[1].append(actor)
                key = entry[0]
                actor.next_tick_ns = key[0]
            self._tick_t, self._tick_entry = tick, entry
        actor.queued_key = key
        self.queued += 1

    def top(self) -> Actor | None:
        """A live actor of the earliest key (its bucket's last), dropping stale entries.

        The actor stays queued (`take_top` takes it).
        """
        heap, due = self._heap, self._due
        while heap:
            code = heap[0]
            key, bucket = due[code]
            while bucket:
                actor = bucket[-1]
                if actor.queued_key is key and not actor.busy:  # Calendar.live, inlined
                    return actor
                bucket.pop()
                self.queued -= 1
            if self._standing:
                for cohort in self._standing.get(code, ()):
                    for actor in cohort.actors:
                        if actor.queued_key is key and not actor.busy:
                            return actor
            self._pop_earliest()  # stale cohorts leave with it (their members rejoin later)
        return None

    def take_top(self) -> None:
        """Remove the actor just returned by `top` from its bucket."""
        self._due[self._heap[0]][1].pop()
        self.queued -= 1

    def top_is_control(self) -> bool:
        """Whether the earliest live entry is a control envelope's."""
        actor = self.top()
        return actor is not None and actor.queued_key[0] == CONTROL_T

    def earliest(self) -> Key | None:
        """The earliest key of all pending work, dedicated actors included."""
        top = self.top()
        best = None if top is None else top.queued_key
        for actor in self.dedicated:
            k = actor.queued_key
            if k is not None and not actor.busy and (best is None or k < best):
                best = k
        return best

    def take_bucket(self, most: int) -> list[Group]:
        """`take` with no budget and no later keys (simulated time), lean: once per delta cycle.

        The earliest bucket whole when it holds at most ``most`` entries (the
        common case), else what `take` takes from it; a planned instant (with
        cohorts standing in its bucket) whole, one group per cohort. The
        cohorts taken are no longer queued: each member rejoins as it
        finishes (`requeue`), which queues the cohort at its next instant.
        """
        code = self._heap[0]
        entry = self._due[code]
        bucket = entry[1]
        standing = self._standing.get(code) if self._standing else None
        if standing is not None:
            # A planned instant: its cohorts whole, the bucket's own actors whole too
            # (a cohort is one list; the claim skips its stale members).
            key = entry[0]
            groups = [entry] if bucket else []
            for cohort in standing:
                groups.append((key, cohort.actors))
            self._pop_earliest()
            self.queued -= len(bucket)
            return groups
        if len(bucket) > most:
            return self.take(most, None, None)
        self._pop_earliest()
        self.queued -= len(bucket)
        return [entry]

    def take(self, most: int, budget: int | None, limit_t: int | None) -> list[Group]:
        """Take the actors that may start together, from the earliest key on.

        Called with a live actor first in the earliest bucket. Takes that
        bucket (whole, in the order queued, when it fits in ``most`` and no
        budget applies; else from its end, one at a time, skipping stale
        entries, until ``most`` or the ``budget``), then, if ``limit_t`` is
        not None, the buckets of the following keys due by ``limit_t``
        (real time), never a control key's.

        Args:
            most: the most live actors to take.
            budget: nanoseconds of the members' mean hook times (see `cost`);
                None: no budget.
            limit_t: take later keys with ``t <= limit_t`` too (None: only the first).

        Returns:
            list[Group]: ``(key, actors)`` per key; a group may hold stale
            entries (the claim skips them, by `live`).
        """
        heap, due = self._heap, self._due
        spent = taken = 0
        groups: list[Group] = []
        while True:
            code = heap[0]  # the earliest key
            key, bucket = due[code]
            if budget is None and len(bucket) + taken <= most:
                self._pop_earliest()  # the whole bucket, in the order queued
                self.queued -= len(bucket)
                groups.append((key, bucket))
                taken += len(bucket)
            else:
                group: list[Actor] = []
                while bucket and taken < most:
                    actor = bucket.pop()
                    if not Calendar.live(actor, key):
                        self.queued -= 1
                        continue
                    if budget is not None:
                        spent += cost(actor, budget)
                        if taken and spent > budget:
                            bucket.append(actor)
                            break
                    self.queued -= 1
                    group.append(actor)
                    taken += 1
                groups.append((key, group))
                if bucket:
                    break
                self._pop_earliest()
            if limit_t is None or taken >= most or not heap:
                break
            t = heap[0] >> SHIFT
            if t > limit_t or t == CONTROL_T:
                break
        return groups

    def _pop_earliest(self) -> None:
        """Remove the earliest bucket: the one way a bucket leaves (but `clear`).

        `requeue`'s memory of its last bucket goes with it, whichever it was,
        and so do the cohorts standing in it (no longer queued).
        """
        code = heapq.heappop(self._heap)
        del self._due[code]
        self._tick_t = -1
        if self._standing:
            for cohort in self._standing.pop(code, ()):
                cohort.t = -1
                cohort.key = None

    def clear(self) -> None:
        """Forget every entry (a whole-net restore reschedules every actor)."""
        self._heap.clear()
        self._due.clear()
        self._tick_t = -1
        self.queued = 0
        for standing in self._standing.values():
            for cohort in standing:
                cohort.t = -1
                cohort.key = None
        self._standing.clear()


def cost(actor: Actor, budget: int) -> int:
    """What ``actor``'s next update counts against a batch's budget, in nanoseconds.

    Its mean hook time (``on_start`` included); the whole budget for its
    first update (so that nodes of unknown cost start in parallel); an eighth
    of it without timing statistics (batches of eight).
    """
    if not actor.timed:
        return budget // 8
    n = actor.updates
    return actor.hook_ns // n if n else budget
