"""Input synchronizers: ``ExactTime`` and ``ApproximateTime`` match messages that belong together.

A node that fuses a camera and an IMU wants the frame and the IMU reading of one
moment. A synchronizer declared on the node over some of its Inputs takes every
message they receive, with its stamp, and forms *matched sets*, one message per
Input, by the rule of the ``message_filters`` policy of the same name in ROS.

How it runs, and why:

* A message reaches a synchronized Input as a ``(send time ns, message)`` pair.
  The sends, the host's writes and other processes' deliveries make the pair
  for such an Input only (``Input._stamped``), so no other Input carries more.
* Taken into the Input before a hook, the pair goes to the synchronizer's
  arrivals (the Input keeps nothing itself), in the order in which the node
  takes its messages: by stamp in simulated time.
* The node's update first *settles* its synchronizers (`_runtime.build`
  wraps it): the arrivals are matched one by one (a ``stamp`` function runs
  here, inside the node's hook and context) and the callback gets each new
  set; then ``on_update`` runs. The sets are thus a pure function of what
  arrives, in its order: the same for any worker count, placement or replay.
* Its state (the queues, the set being searched for, kept sets, arrivals not
  yet settled) is the ``sync`` section of the state tree (`_runtime.cuts`).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from ._checks import declaration_of, is_int, is_number
from .ports import Input
from .stats import SyncStats

__all__ = ["ExactTime", "ApproximateTime"]

log = logging.getLogger("mujou_actors")

Entry = tuple[int, Any]  # (stamp in ns, message)
Fn = Callable[[int, Any], Any]  # applied to each message of a state, with its Input's index


class Synchronizer:
    """The base of `ExactTime` and `ApproximateTime` (not made directly).

    What both policies share: the declaration's checks, the arrivals, the
    sets, the statistics and the state. A policy subclass keeps the waiting
    messages and implements `_match` (one stamped message in; `_publish`
    for each set it completes, `_drop` for each message it gives up) and its
    part of the state.
    """

    _policy = ""  # the state's "policy": "exact" or "approximate"

    def __init__(self, inputs: tuple[Any, ...], *, queue: int,
                 stamp: Callable[[Any], float] | None,
                 callback: Callable[..., None] | None) -> None:
        try:
            self._check_declaration(inputs, queue, stamp, callback)
        except (TypeError, ValueError) as exc:
            raise _named(exc, self, inputs) from None
        self._inputs: tuple[Input, ...] = inputs
        self._queue = queue
        self._stamp = stamp
        self._callback = callback
        self._name: str | None = None  # its attribute on the node: found as a run starts
        self._reset()
        for inp in inputs:
            inp._sync = self
            # It keeps nothing itself, and its mailbox must not drop what waits for it
            # (the newest `depth` are not what a match needs): `queue` bounds it here.
            inp._depth = None

    def _check_declaration(self, inputs: tuple[Any, ...], queue: Any, stamp: Any,
                           callback: Any) -> None:
        """`__init__`'s checks of its arguments; each error starts with the policy's name."""
        where = type(self).__name__
        if len(inputs) < 2:
            raise ValueError(f"{where}: needs two Inputs or more to match, got {len(inputs)}")
        for k, inp in enumerate(inputs):
            if not isinstance(inp, Input):
                raise TypeError(f"{where}: argument {k} ({type(inp).__name__}) is not an Input; "
                                "give the node's Input ports (self.camera, self.imu)")
        for k, inp in enumerate(inputs):
            if any(inp is other for other in inputs[:k]):
                raise ValueError(f"{where}: Input {inp.path!r} is given twice")
            if inp._sync is not None:
                raise ValueError(f"{where}: Input {inp.path!r} already feeds "
                                 f"{type(inp._sync).__name__} {inp._sync.path!r}; an Input "
                                 "feeds one synchronizer")
        owners = {id(inp.node): inp for inp in inputs if inp.node is not None}
        if len(owners) > 1:
            raise ValueError(f"{where}: the Inputs {[i.path for i in owners.values()]} belong "
                             "to different nodes; a synchronizer matches Inputs of one node")
        if not is_int(queue):
            raise TypeError(f"{where}: queue must be an int >= 1, got {queue!r}")
        if queue < 1:
            raise ValueError(f"{where}: queue must be an int >= 1, got {queue!r}")
        for name, fn in (("stamp", stamp), ("callback", callback)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{where}: {name} must be a callable or None, got {fn!r}")

    # -- what the node uses ------------------------------------------------------------
    @property
    def inputs(self) -> tuple[Input, ...]:
        """tuple[Input, ...]: the synchronized Inputs, in the order of each set's messages."""
        return self._inputs

    @property
    def queue(self) -> int:
        """int: messages kept per Input while they wait for a match, and matched sets kept."""
        return self._queue

    @property
    def path(self) -> str:
        """str: the node's path and the synchronizer's attribute name (``"fuse.sync"``).

        ``"ClassName.attribute"`` before the node's first run.
        """
        node = self._inputs[0].node
        if node is None:
            return f"<{type(self).__name__}>"
        name = self._name or next((k for k, v in vars(node).items() if v is self), "?")
        if node._mujou_path is None:
            return f"{type(node).__name__}.{name}"
        return f"{node._mujou_path}.{name}" if node._mujou_path else name

    def read(self, *, stamped: bool = False) -> tuple[Any, ...] | None:
        """The newest matched set kept, without consuming it (as `Input.read`).

        Args:
            stamped (bool): give each message with its stamp, as a pair
                ``(stamp, message)``, the stamp in seconds of the run's timer
                (its send time, or what ``stamp=`` gave). Default: False.

        Returns:
            tuple | None: one message (or pair) per Input, in the order of
            `inputs`; None when no set is kept (none matched yet, after
            `drain`, or with a callback, which takes every set). A set once
            returned here is not counted in ``sets_dropped`` when newer sets
            push it out.
        """
        self._settle()
        if not self._sets:
            return None
        self._seen.add(self._made)
        return _with_stamps(self._sets[-1]) if stamped else self._sets[-1][1]

    def drain(self, *, stamped: bool = False) -> list[tuple[Any, ...]]:
        """Return and consume every matched set kept, oldest first (as `Input.drain`).

        Args:
            stamped (bool): each message as a pair ``(stamp, message)``, the
                stamp in seconds (as `read`). Default: False.

        Returns:
            list[tuple]: the sets, each one message (or pair) per Input in the
            order of `inputs`; empty with a callback, which takes every set.
        """
        self._settle()
        sets = [_with_stamps(s) if stamped else s[1] for s in self._sets]
        self._sets.clear()
        self._seen.clear()
        return sets

    @property
    def stamps(self) -> tuple[float, ...] | None:
        """The stamps (seconds of the run's timer) of the set being handed to the callback.

        Read it inside the callback: one stamp per Input, in the order of
        `inputs` (all equal for `ExactTime`). None outside a callback.
        """
        return self._handing

    def __len__(self) -> int:
        """The number of matched sets kept (0 with a callback)."""
        self._settle()
        return len(self._sets)

    def __bool__(self) -> bool:
        # Always true, as a port is: ``if self.sync:`` must not mean "has sets".
        return True

    def stats(self) -> SyncStats:
        """What it matched and dropped since its run started.

        Returns:
            SyncStats: the counts (messages dropped also count in the node's
            ``NodeStats.drops`` of their Input).
        """
        return SyncStats(path=self.path, matched=self._made_total,
                         dropped={str(inp.name): n for inp, n in zip(self._inputs, self._dropped,
                                                                      strict=True)},
                         sets_dropped=self._sets_dropped)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path} of {[i.name for i in self._inputs]}>"

    # -- what the run uses ---------------------------------------------------------------
    def _reset(self) -> None:
        """Empty, as a run starts: nothing waits, nothing is kept, nothing counted."""
        n = len(self._inputs)
        self._arrived: deque[tuple[int, int, Any]] = deque()
        # Each kept set: (its stamps, ns, one per Input; its messages).
        self._sets: deque[tuple[tuple[int, ...], tuple[Any, ...]]] = deque()
        self._handing: tuple[float, ...] | None = None  # the callback's set's stamps, s
        self._seen: set[int] = set()  # numbers of the kept sets read() returned
        self._made = 0  # the number of the newest set kept (kept ones are consecutive)
        self._made_total = 0
        self._dropped = [0] * n
        self._sets_dropped = 0
        self._logged = False
        self._reset_policy()

    def _attach(self) -> None:
        """Take its Inputs' messages for a run of its node: empty, stamped, arriving here."""
        self._reset()
        for i, inp in enumerate(self._inputs):
            # The actor pushes what its hook takes in (`Input._push`), each a
            # (stamp, message) pair; set on the instance, so other Inputs pay nothing.
            def push(pair: Any, i: int = i) -> None:
                self._arrived.append((i, pair[0], pair[1]))

            def push_many(pairs: list[Any], i: int = i) -> None:
                self._arrived.extend((i, t, m) for t, m in pairs)

            inp.__dict__.update(_push=push, _push_many=push_many, _restore=self._restore,
                                _stamped=True)

    def _detach(self) -> None:
        """Leave its Inputs plain (a replay's stand-in of its node takes their messages)."""
        for inp in self._inputs:
            for name in ("_push", "_push_many", "_restore", "_stamped"):
                inp.__dict__.pop(name, None)

    def _settle(self) -> None:
        """Match what arrived, in order, then hand the new sets to the callback (in a hook)."""
        arrived, stamp, callback = self._arrived, self._stamp, self._callback
        if not arrived and (callback is None or not self._sets):
            return  # every update and every read settle: most often nothing is there
        while arrived:
            i, t, message = arrived[0]
            if stamp is not None:
                t = self._stamp_of(i, message)  # may raise: the arrival waits, unmatched
            arrived.popleft()
            self._match(i, t, message)
        if callback is not None:
            sets = self._sets
            try:
                while sets:
                    stamps, messages = sets.popleft()
                    self._handing = tuple(t / 1e9 for t in stamps)
                    callback(*messages)
            finally:
                self._handing = None

    def _stamp_of(self, i: int, message: Any) -> int:
        value = self._stamp(message)  # type: ignore[misc]
        if not is_number(value) or not math.isfinite(value):
            raise TypeError(f"{type(self).__name__} {self.path!r}: stamp() returned {value!r} "
                            f"for a message of {self._inputs[i].path!r}; expected seconds of "
                            "the run's timer (a finite int or float)")
        return round(value * 1_000_000_000)

    def _publish(self, stamps: tuple[int, ...], messages: tuple[Any, ...]) -> None:
        """A matched set: for the callback, or kept (the oldest unread one dropped when full)."""
        self._made_total += 1
        sets = self._sets
        if self._callback is None and len(sets) == self._queue:
            oldest = self._made - len(sets) + 1
            sets.popleft()
            if oldest in self._seen:
                self._seen.discard(oldest)
            else:
                self._sets_dropped += 1
                self._log_drop("a matched set that was never read")
        self._made += 1
        sets.append((stamps, messages))

    def _drop(self, i: int, n: int) -> None:
        """Count ``n`` messages of Input ``i`` given up unmatched (also as the Input's drops)."""
        self._dropped[i] += n
        self._inputs[i]._drops += n  # the node's thread: as the Input's own drops
        if not self._logged:
            self._log_drop(f"a message of {self._inputs[i].path!r} that matched no set")

    def _log_drop(self, what: str) -> None:
        if not self._logged:
            # Matching rates that differ drops messages by design (a 100 Hz IMU
            # against a 30 Hz camera): said once, counted in the stats.
            self._logged = True
            log.info("%s %r dropped %s; drops are counted in run.stats() and its stats()",
                     type(self).__name__, self.path, what)

    # -- its part of a state tree ("sync": {path: entry}) -------------------------------
    def _state(self, copy: Callable[[Any], Any]) -> dict[str, Any]:
        """Its state as a tree's entry, each message made by ``copy`` (the host's copy)."""
        raw = {"policy": self._policy, "queued": [list(q) for q in self._queued()],
               "arrived": [list(a) for a in self._arrived],
               "sets": [list(s) for _, s in self._sets],
               "set_stamps": [list(t) for t, _ in self._sets], **self._policy_state()}
        return map_messages(raw, len(self._inputs), lambda i, m: copy(m))

    def _restore(self, kept: list[Any]) -> None:
        """A restore (`Actor.restore`): its Inputs keep nothing, and its first one brings
        its state, ``[entry]``, already copied onto the node's device (`cuts.restore_tree`)."""
        if kept:
            self._load(kept[0])

    def _load(self, entry: dict[str, Any]) -> None:
        """Take the state of a tree's checked entry (the restore's own copy)."""
        self._reset()
        for i, t, m in entry["queued"]:
            self._queue_again(i, t, m)
        self._arrived.extend((i, t, m) for i, t, m in entry["arrived"])
        # A tree from before the stamps were kept: each set's stamps unknown, -1 ns.
        stamps = entry.get("set_stamps") or [[-1] * len(self._inputs)] * len(entry["sets"])
        self._sets.extend((tuple(t), tuple(s)) for t, s in zip(stamps, entry["sets"],
                                                                strict=True))
        # Restored sets count as read, as an Input's restored messages do.
        self._made = len(self._sets)
        self._seen = set(range(1, self._made + 1))
        self._load_policy(entry)

    def _fit(self, entry: Any, convert: Fn) -> tuple[Any, list[str]]:
        """A tree's entry checked against this synchronizer: ``(converted entry, problems)``.

        ``convert`` puts each message back into its Input's declared type (a
        file's NamedTuples and dataclasses); each is then checked by its Input.
        """
        n = len(self._inputs)
        try:
            if not isinstance(entry, dict):
                raise ValueError(f"is a {type(entry).__name__}, not a dict")
            if entry.get("policy") != self._policy:
                raise ValueError(f"is the state of a {entry.get('policy')!r} policy, not "
                                 f"{self._policy!r}")
            entry = map_messages(entry, n, convert)
            self._check_policy_state(entry)
        except ValueError as exc:
            return entry, [f"sync[{self.path!r}] {exc}"]
        problems = []

        def check(i: int, m: Any) -> Any:
            try:
                self._inputs[i].check(m)
            except TypeError as exc:
                problems.append(f"sync[{self.path!r}]: {exc}")
            return m

        map_messages(entry, n, check)
        return entry, problems

    # -- a policy's own part ---------------------------------------------------------------
    def _reset_policy(self) -> None:
        raise NotImplementedError

    def _match(self, i: int, stamp: int, message: Any) -> None:
        raise NotImplementedError

    def _queued(self) -> Iterator[tuple[int, int, Any]]:
        """The waiting messages as ``(input index, stamp, message)``, each Input's in order."""
        raise NotImplementedError

    def _queue_again(self, i: int, stamp: int, message: Any) -> None:
        raise NotImplementedError

    def _policy_state(self) -> dict[str, Any]:
        raise NotImplementedError

    def _load_policy(self, entry: dict[str, Any]) -> None:
        raise NotImplementedError

    def _check_policy_state(self, entry: dict[str, Any]) -> None:
        raise NotImplementedError


def _named(exc: Exception, sync: Synchronizer, inputs: tuple[Any, ...]) -> Exception:
    """``exc``, a declaration's error, with the node class and attribute it was declared as.

    Its words start with the policy's name (``"ExactTime: ..."``); they become
    ``"ExactTime 'Fuse.sync': ..."`` when the node and attribute are known,
    ``"ExactTime of Fuse: ..."`` when only the node is. The node is the one
    the Inputs belong to, or the one whose method is making the synchronizer
    (Inputs made in ``__init__`` learn their node only as it returns); the
    attribute, the one the statement assigns it to (`declaration_of`).
    """
    policy = type(sync).__name__
    found = declaration_of(sync)
    node = next((inp.node for inp in inputs if isinstance(inp, Input) and inp.node is not None),
                None)
    owner = found.owner if _is_node(found.owner) else None
    if node is None:
        node = owner
    if node is None:
        return exc
    named = (f"{policy} '{type(node).__name__}.{found.attribute}'"
             if owner is node and found.attribute is not None
             else f"{policy} of {type(node).__name__}")
    return exc.__class__(named + str(exc).removeprefix(policy))


def _is_node(value: Any) -> bool:
    """Whether ``value`` is a node (node.py imports nothing of this module's: no import)."""
    return callable(getattr(type(value), "_mujou_bind_ports", None))


def map_messages(entry: dict[str, Any], n: int, fn: Fn) -> dict[str, Any]:
    """A synchronizer's state entry with ``fn(input index, message)`` for each message.

    The one walk over an entry's messages: copying, loading, converting and
    checking a tree's entry all go through it.

    Args:
        entry (dict): a state entry (``"queued"`` and ``"arrived"``: lists of
            ``[input index, stamp ns, message]``; ``"sets"``: lists of one
            message per Input).
        n (int): the synchronizer's number of Inputs.
        fn (Callable[[int, Any], Any]): makes each message of the new entry.

    Returns:
        dict: a new entry; the other keys are kept as they are.

    Raises:
        ValueError: the entry is not of that shape (says where).
    """
    out = dict(entry)
    for key in ("queued", "arrived"):
        items = entry.get(key)
        if not isinstance(items, (list, tuple)):
            raise ValueError(f"[{key!r}] is not a list")
        made = []
        for item in items:
            if not (isinstance(item, (list, tuple)) and len(item) == 3 and is_int(item[0])
                    and 0 <= item[0] < n and is_int(item[1])):
                raise ValueError(f"[{key!r}] holds {_short(item)}, not [input index, stamp "
                                 "ns, message]")
            made.append([item[0], item[1], fn(item[0], item[2])])
        out[key] = made
    sets = entry.get("sets")
    if not isinstance(sets, (list, tuple)) or not all(
            isinstance(s, (list, tuple)) and len(s) == n for s in sets):
        raise ValueError(f"['sets'] is not a list of sets of {n} messages")
    out["sets"] = [[fn(i, m) for i, m in enumerate(s)] for s in sets]
    stamps = entry.get("set_stamps")
    if stamps is not None and not (isinstance(stamps, (list, tuple)) and len(stamps) == len(sets)
                                   and all(isinstance(t, (list, tuple)) and len(t) == n
                                           and all(is_int(v) for v in t) for t in stamps)):
        raise ValueError(f"['set_stamps'] is not a list of {n} stamps (int ns) per set")
    return out


def _with_stamps(kept: tuple[tuple[int, ...], tuple[Any, ...]]) -> tuple[Any, ...]:
    """A kept set as ``(stamp s, message)`` pairs (a stamp of -1 ns: unknown, None)."""
    stamps, messages = kept
    return tuple((None if t < 0 else t / 1e9, m) for t, m in zip(stamps, messages, strict=True))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def _ints(value: Any, n: int) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == n and all(
        is_int(v) and v >= 0 for v in value)


class ExactTime(Synchronizer):
    """Match messages of several Inputs that carry the same stamp.

    The policy of ``message_filters``' ``TimeSynchronizer`` (its
    ``ExactTime`` policy): a set is one message of each Input, all with the
    same stamp, handed over as soon as its last message arrives. Once a set
    of stamp ``s`` is matched, the messages still waiting with an earlier
    stamp can never be matched (stamps come in order) and are dropped, as
    is a message that arrives stamped before ``s``. A second message of one
    Input with a stamp already waiting replaces the first (a drop).

    Declare it in the node's ``__init__``, as an attribute, over Inputs of
    that node; they then feed it alone (their own ``read``/``drain`` stay
    empty). Its sets go to ``callback`` at the start of the node's next
    update, before ``on_update``, or without a callback wait for `read` and
    `drain`. Its queues are state: a snapshot holds them, and a restore or a
    replay gives the same sets.

    Args:
        *inputs (Input): two Inputs or more of the node; each set holds one
            message of each, in this order.
        queue (int): messages of each Input kept while they wait for a match
            (the oldest dropped when a newer one finds it full), and matched
            sets kept for `read` and `drain`. Default: 10.
        stamp (Callable[[Any], float] | None): the stamp of a message, in
            seconds of the run's timer (``lambda m: m.stamp`` for a message that
            carries its capture time, as a ROS header does); kept to the
            nanosecond. ``None``: the time of the update that sent it (the
            host's writes: the run's time when written). Default: None.
        callback (Callable[..., None] | None): called with the messages of
            each set (``callback(camera, imu)``) at the start of the node's
            next update, in the node's hook. Default: None.

    Raises:
        TypeError: an argument that is not an Input, a non-int ``queue``, a
            ``stamp`` or ``callback`` that is not callable.
        ValueError: fewer than two Inputs, an Input given twice or already
            synchronized, Inputs of different nodes, ``queue`` < 1.

    Example:
        ```python
        class Fuse(mujou.Node):
            camera = mujou.Input(torch.Tensor)
            imu = mujou.Input(torch.Tensor)

            def __init__(self):
                super().__init__(period=None)
                self.sync = mujou.ExactTime(self.camera, self.imu, queue=10,
                                            callback=self.on_pair)

            def on_pair(self, frame, reading): ...
        ```
    """

    _policy = "exact"

    def __init__(self, *inputs: Input, queue: int = 10,
                 stamp: Callable[[Any], float] | None = None,
                 callback: Callable[..., None] | None = None) -> None:
        super().__init__(inputs, queue=queue, stamp=stamp, callback=callback)

    def _reset_policy(self) -> None:
        self._q: list[dict[int, Any]] = [{} for _ in self._inputs]  # stamp -> message
        self._last: int | None = None  # the stamp of the latest set

    def _match(self, i: int, stamp: int, message: Any) -> None:
        waiting = self._q[i]
        if self._last is not None and stamp < self._last:
            self._drop(i, 1)  # every other Input is past it: it can never match
            return
        if stamp in waiting:
            del waiting[stamp]  # replaced by the newer one
            self._drop(i, 1)
        waiting[stamp] = message
        if all(stamp in q for q in self._q):
            matched = tuple(q.pop(stamp) for q in self._q)
            stamps = (stamp,) * len(self._q)
            self._last = stamp
            for k, q in enumerate(self._q):
                old = [s for s in q if s < stamp]
                for s in old:
                    del q[s]
                if old:
                    self._drop(k, len(old))
            self._publish(stamps, matched)
        elif len(waiting) > self._queue:
            del waiting[min(waiting)]
            self._drop(i, 1)

    def _queued(self) -> Iterator[tuple[int, int, Any]]:
        for i, q in enumerate(self._q):
            for stamp, message in q.items():
                yield i, stamp, message

    def _queue_again(self, i: int, stamp: int, message: Any) -> None:
        self._q[i][stamp] = message

    def _policy_state(self) -> dict[str, Any]:
        return {"last": self._last}

    def _load_policy(self, entry: dict[str, Any]) -> None:
        self._last = entry["last"]

    def _check_policy_state(self, entry: dict[str, Any]) -> None:
        last = entry.get("last")
        if last is not None and not is_int(last):
            raise ValueError(f"['last'] is {_short(last)}, not None or a stamp (int ns)")


class ApproximateTime(Synchronizer):
    """Match messages of several Inputs whose stamps are close: the best set, not the first.

    The ``ApproximateTime`` policy of ROS's ``message_filters``, with the
    algorithm its wiki documents (implemented anew here). The *size* of a set
    is its latest stamp less its earliest. Each set holds one message per
    Input; no message is in two sets; sets never cross (each Input's
    messages are used in stamp order); no set could be made of the messages
    dropped between two sets; and each set is the smallest of those that
    follow the previous one. It works with a *pivot*: the latest of the
    earliest waiting messages of each Input, which every set searched for
    from there holds, and hands a set over as soon as no later message
    could make a smaller one (counting on each Input's stamps rising).
    With ``slop``, a set never spans more than ``slop`` (the policy's
    ``setMaxIntervalDuration``): messages that cannot be in one are dropped.

    The result depends only on the stamps and the order of each Input's
    messages, given a ``queue`` large enough for the gaps between the
    Inputs. Unlike ``message_filters``, there is no age penalty (its C++
    policy's default is 0.1, its wiki's 0) and no lower bound between two
    messages of an Input; and unlike ``rospy``'s ``ApproximateTimeSynchronizer``,
    ``slop`` bounds the best set rather than accepting the first set within
    it. See `ExactTime` for how it is declared, fed and read.

    Args:
        *inputs (Input): two Inputs or more of the node; each set holds one
            message of each, in this order.
        slop (float | None): the largest size of a set, seconds of the run's
            timer (kept to the nanosecond); ``None``: any size. Default: None.
        queue (int): messages of each Input kept while the search goes on
            (over it, the oldest is dropped and the search starts again), and
            matched sets kept for `read` and `drain`. Default: 10.
        stamp (Callable[[Any], float] | None): as for `ExactTime`. Default: None.
        callback (Callable[..., None] | None): as for `ExactTime`. Default: None.

    Raises:
        TypeError: as for `ExactTime`; ``slop`` neither None nor a number.
        ValueError: as for `ExactTime`; ``slop`` negative or not finite.

    Example:
        ```python
        self.sync = mujou.ApproximateTime(self.camera, self.imu, slop=0.005, queue=10)
        ...
        for frame, reading in self.sync.drain(): ...
        ```
    """

    _policy = "approximate"

    def __init__(self, *inputs: Input, slop: float | None = None, queue: int = 10,
                 stamp: Callable[[Any], float] | None = None,
                 callback: Callable[..., None] | None = None) -> None:
        if slop is not None and not is_number(slop):
            raise _named(TypeError(f"ApproximateTime: slop must be a number of seconds or "
                                   f"None, got {slop!r}"), self, inputs)
        if slop is not None and (not math.isfinite(slop) or slop < 0):
            raise _named(ValueError(f"ApproximateTime: slop must be a finite number of "
                                    f"seconds >= 0, got {slop!r}"), self, inputs)
        self._slop = None if slop is None else round(slop * 1_000_000_000)
        super().__init__(inputs, queue=queue, stamp=stamp, callback=callback)

    @property
    def slop(self) -> float | None:
        """float | None: the largest size of a set, seconds (whole ns); None: any."""
        return None if self._slop is None else self._slop / 1e9

    def _reset_policy(self) -> None:
        n = len(self._inputs)
        # Each Input's waiting messages, oldest first. While a set is searched
        # for (pivot >= 0), the first message of each is the candidate's, and
        # the first swept[k] of Input k are behind the sweep: the search looks
        # at the windows made of each Input's message after them.
        self._q: list[list[Entry]] = [[] for _ in range(n)]
        self._swept = [0] * n
        self._pivot = -1
        # An Input that dropped a message for its queue may not give the next
        # pivot until the sweep shows it could not have mattered.
        self._bad = [False] * n
        self._unordered = False

    def _match(self, i: int, stamp: int, message: Any) -> None:
        waiting = self._q[i]
        if waiting and stamp < waiting[-1][0] and not self._unordered:
            self._unordered = True
            log.warning("ApproximateTime %r: a message of %r is stamped %d ns, before the one "
                        "that came before it (%d ns); the policy takes each Input's messages "
                        "in stamp order, so its sets may not be the best ones", self.path,
                        self._inputs[i].path, stamp, waiting[-1][0])
        waiting.append((stamp, message))
        self._sweep()
        if len(waiting) > self._queue:
            # Over its bound: the search gives up (what it swept past waits
            # again), this Input's oldest message goes, and the Input may not
            # give the next pivot (the message it lost might have made a
            # better set), as message_filters does.
            self._swept[:] = [0] * len(self._q)
            waiting.pop(0)
            self._drop(i, 1)
            self._bad[i] = True
            if self._pivot >= 0:
                self._pivot = -1
                self._sweep()

    def _sweep(self) -> None:
        """Search on while every Input has a message ahead of the sweep; publish what is proven."""
        q, swept, n = self._q, self._swept, len(self._q)
        while all(swept[k] < len(q[k]) for k in range(n)):
            times = [q[k][swept[k]][0] for k in range(n)]
            lo, hi = _bounds(times)
            start, end = times[lo], times[hi]
            for k in range(n):
                if k != hi:
                    self._bad[k] = False
            if self._pivot < 0:
                if (self._slop is not None and end - start > self._slop) or self._bad[hi]:
                    # Too wide, or a pivot that lost messages: the earliest
                    # message can be in no set (any later window starts later).
                    q[lo].pop(0)
                    self._drop(lo, 1)
                    continue
                self._pivot = hi  # the fronts are the first candidate; hi the pivot
            else:
                first, last = self._candidate()
                if end - start < last - first:
                    # A smaller window: the new candidate. What the sweep
                    # passed before it can be in no set.
                    for k in range(n):
                        if swept[k]:
                            del q[k][:swept[k]]
                            self._drop(k, swept[k])
                            swept[k] = 0
            swept[lo] += 1
            first, last = self._candidate()
            pivot_t = q[self._pivot][0][0]
            # Every later window holds [pivot_t, end] at least: when that is
            # no smaller than the candidate, nothing later can beat it.
            if lo == self._pivot or end - last >= pivot_t - first:
                self._publish_candidate()
            elif any(swept[k] == len(q[k]) for k in range(n)):
                self._look_ahead(pivot_t, first, last)

    def _look_ahead(self, pivot_t: int, first: int, last: int) -> None:
        """Prove the candidate best before the Inputs that ran dry send again, if it is.

        An Input with no message ahead of the sweep sends its next one no
        earlier than its latest (stamps rise), and a window with the pivot
        ends no earlier than the pivot: assume it comes then, and sweep on
        over the messages that are there. If even that cannot beat the
        candidate, hand it over now; else undo the moves and wait.
        """
        q, swept, n = self._q, self._swept, len(self._q)
        moved = [0] * n
        while True:
            times = [q[k][swept[k]][0] if swept[k] < len(q[k]) else max(q[k][-1][0], pivot_t)
                     for k in range(n)]
            lo, hi = _bounds(times)
            if times[hi] - last >= pivot_t - first:
                self._publish_candidate()
                return
            if times[hi] - last < times[lo] - first:  # an optimistic window could beat it
                for k in range(n):
                    swept[k] -= moved[k]
                return
            swept[lo] += 1  # a real message: the one assumed comes at pivot_t or later
            moved[lo] += 1

    def _candidate(self) -> tuple[int, int]:
        """The earliest and the latest stamp of the candidate (each Input's first message)."""
        stamps = [queue[0][0] for queue in self._q]
        return min(stamps), max(stamps)

    def _publish_candidate(self) -> None:
        fronts = [queue.pop(0) for queue in self._q]
        self._swept[:] = [0] * len(self._q)
        self._pivot = -1
        self._publish(tuple(t for t, _ in fronts), tuple(m for _, m in fronts))

    def _queued(self) -> Iterator[tuple[int, int, Any]]:
        for i, queue in enumerate(self._q):
            for stamp, message in queue:
                yield i, stamp, message

    def _queue_again(self, i: int, stamp: int, message: Any) -> None:
        self._q[i].append((stamp, message))

    def _policy_state(self) -> dict[str, Any]:
        return {"swept": list(self._swept), "pivot": self._pivot, "bad": list(self._bad)}

    def _load_policy(self, entry: dict[str, Any]) -> None:
        self._swept[:] = list(entry["swept"])
        self._pivot = entry["pivot"]
        self._bad[:] = [bool(b) for b in entry["bad"]]

    def _check_policy_state(self, entry: dict[str, Any]) -> None:
        n = len(self._inputs)
        counts = [0] * n
        for i, _, _ in entry["queued"]:
            counts[i] += 1
        swept, pivot, bad = entry.get("swept"), entry.get("pivot"), entry.get("bad")
        if not isinstance(swept, (list, tuple)) or not _ints(swept, n) or any(
                s > c for s, c in zip(swept, counts, strict=True)):
            raise ValueError(f"['swept'] is {_short(swept)}, not {n} counts of queued messages")
        if not (is_int(pivot) and -1 <= pivot < n) or (pivot >= 0 and 0 in counts):
            raise ValueError(f"['pivot'] is {_short(pivot)}, not -1 or the index of an Input "
                             "with queued messages")
        if not (isinstance(bad, (list, tuple)) and len(bad) == n
                and all(isinstance(b, bool) for b in bad)):
            raise ValueError(f"['bad'] is {_short(bad)}, not {n} bools")


def _bounds(times: list[int]) -> tuple[int, int]:
    """The index of the earliest time (the first of equals) and of the latest (the last).

    The ties go as in message_filters, so the same stamps give the same sets.
    """
    lo = hi = 0
    for k in range(1, len(times)):
        if times[k] < times[lo]:
            lo = k
        if times[k] >= times[hi]:
            hi = k
    return lo, hi
