"""The Thespian actors of a placed run's control plane, and the messages between them.

`Coordinator` runs in a process of its own, created by the host's
`ProcessSystem`; it creates one `GroupActor` per group process (its children,
so Thespian tells it, with ``ChildActorExited``, when one ends) and pushes a
notice to the host's ``notices`` socket (pyzmq) when a group ends without
being asked to. `GroupActor` runs in its group's process: it imports the
group's target, calls it to make the group's server, and answers the host's
requests with ``server.handle(request)``.

Who talks to whom (every arrow a Thespian message but the last)::

    host --StartGroup/StopGroup/StopAll--> coordinator --Init/Close--> group actor
    host <--GroupStarted/GroupStopped/...-- coordinator <--Started/Closed--
    host --Call--> group actor, host <--Answer-- group actor (direct, one hop)
    coordinator --notice (JSON over zmq PUSH)--> host's PULL socket

Requests and answers of ``Call`` travel as pickled bytes inside the message,
so that a value that does not pickle fails where it is made, with its own
error, and so that the host unpickles them itself. Every message type here is
a module-level ``NamedTuple``: Thespian pickles messages, and the other side
must find their classes under this module's name.

Nothing of this module is a public API: `mujou_actors.distributed.system`
is what the host uses.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import shutil
import signal
import sys
import threading
import traceback
from datetime import timedelta
from typing import Any, NamedTuple

import zmq
from thespian.actors import (
    ActorExitRequest,
    ActorTypeDispatcher,
    ChildActorExited,
    PoisonMessage,
    WakeupMessage,
)

from ..errors import describe
from ._loopback import alive
from ._mainscript import import_main

NOTICE_LINGER_MS = 500  # how long a closing coordinator may spend flushing notices
# The capability naming a convention's member machine; a group actor created with the
# requirement {MEMBER: name} lands on that member (GroupActor.actorSystemCapabilityCheck).
MEMBER = "mujou.member"
TICK = timedelta(milliseconds=40)  # the coordinator's check of its groups' processes


# --------------------------------------------------------------------------- messages

class Failure(NamedTuple):
    """An exception raised in a run's process, as it crosses to the host.

    Attributes:
        type_name (str): the exception's qualified class name.
        message (str): ``describe(exc)``: "Type: message".
        traceback (str): the formatted traceback, in the process that raised.
        pickled (bytes | None): the exception pickled, or ``None`` if it does not pickle.
    """

    type_name: str
    message: str
    traceback: str
    pickled: bytes | None

    @classmethod
    def of(cls, exc: BaseException) -> Failure:
        """The failure record of ``exc``; never raises, whatever ``exc`` does.

        Args:
            exc (BaseException): the exception just caught.

        Returns:
            Failure: its name, message, traceback and pickle.
        """
        try:
            kind = type(exc)
            type_name = f"{kind.__module__}.{kind.__qualname__}"
        except BaseException:  # noqa: BLE001 - a metaclass may make even this raise
            type_name = "<exception>"
        try:
            text = "".join(traceback.format_exception(exc))
        except BaseException:  # noqa: BLE001 - a broken __str__ must not hide the failure
            text = f"{describe(exc)}\n(the traceback could not be formatted)\n"
        try:
            pickled: bytes | None = pickle.dumps(exc)
        except BaseException:  # noqa: BLE001 - not every exception pickles
            pickled = None
        return cls(type_name, describe(exc), text, pickled)


class Configure(NamedTuple):
    """Host -> coordinator, first: where notices go, and whom to answer.

    ``folder`` (the host's private temporary folder, which holds the notices
    socket) is removed by the coordinator when it ends after the host died.
    """

    seq: int
    notices: str  # the host's PULL socket, e.g. "ipc:///tmp/mujou-run-x/notices"
    host: tuple[int, int | None]  # the host's pid and start time
    folder: str
    # Modules a fork server imports once, from which this machine's groups are then forked
    # (`_fork_groups`); () keeps spawn.
    preload: tuple[str, ...] = ()


class Configured(NamedTuple):
    """Coordinator -> host: the pids the host needs to end the run by force."""

    seq: int
    pid: int  # the coordinator's
    admin_pid: int  # Thespian's admin (the coordinator's parent)
    pgid: int  # the process group of every process of the run


class StartGroup(NamedTuple):
    """Host -> coordinator: create a group process and its server."""

    seq: int
    group: str
    target: str  # "package.module:function"
    # The target's keyword arguments, pickled by the host and unpickled by the group once
    # it imported the host's main script (which the coordinator never imports).
    kwargs: bytes
    sys_path: tuple[str, ...]  # folders put first on the group's sys.path
    member: str | None = None  # the convention member (machine) to run on; None: here
    main: tuple[tuple[str, str], ...] = ()  # the host's main script (_mainscript)


class Init(NamedTuple):
    """Coordinator -> group actor: build the server (see `StartGroup`)."""

    seq: int
    group: str
    target: str
    kwargs: bytes
    sys_path: tuple[str, ...]
    main: tuple[tuple[str, str], ...] = ()


class _Build(NamedTuple):
    """Group actor -> itself: build now (so that `Booting` is sent first)."""

    seq: int


class Booting(NamedTuple):
    """Group actor -> coordinator -> host: the group's process is up, building."""

    seq: int
    group: str
    pid: int


class Started(NamedTuple):
    """Group actor -> coordinator: the server is built."""

    seq: int
    group: str
    pid: int


class StartFailed(NamedTuple):
    """Group actor -> coordinator: importing or calling the target raised."""

    seq: int
    group: str
    failure: Failure


class GroupStarted(NamedTuple):
    """Coordinator -> host: answer to `StartGroup`, with the group actor's address."""

    seq: int
    group: str
    pid: int
    address: Any  # the group actor's Thespian ActorAddress


class GroupStartFailed(NamedTuple):
    """Coordinator -> host: answer to `StartGroup` when it failed.

    ``failure`` is set when the target raised; ``reason`` says how the process
    ended when it died during the start (``failure`` is then ``None``).
    """

    seq: int
    group: str
    failure: Failure | None
    reason: str


class Call(NamedTuple):
    """Host -> group actor: ``server.handle(pickle.loads(request))``.

    ``group`` is checked by the receiver: a dead actor's port may be another
    actor's by the time a late request reaches it.
    """

    seq: int
    group: str
    request: bytes


class Answer(NamedTuple):
    """Group actor -> host: the pickled return value, or the failure."""

    seq: int
    value: bytes | None
    failure: Failure | None


class StopGroup(NamedTuple):
    """Host -> coordinator: close a group's server and end its process."""

    seq: int
    group: str


class Forget(NamedTuple):
    """Host -> coordinator: a group on another machine is lost (the run's heartbeat
    says so; Thespian would tell only after minutes): forget it, so that it may start
    again, and ask its actor to exit should it still be there; answered with
    `GroupStopped`."""

    seq: int
    group: str


class Close(NamedTuple):
    """Coordinator -> group actor: call ``server.close()``, then say `Closed`."""

    group: str


class Closed(NamedTuple):
    """Group actor -> coordinator: ``close()`` returned (or raised: ``failure``)."""

    group: str
    failure: Failure | None


class GroupStopped(NamedTuple):
    """Coordinator -> host: the group's process has ended, as asked."""

    seq: int
    group: str
    failure: Failure | None  # what close() raised, if it did


class StopAll(NamedTuple):
    """Host -> coordinator: stop every group (see `StopGroup`); answer when all ended."""

    seq: int


class AllStopped(NamedTuple):
    """Coordinator -> host: every group's process has ended."""

    seq: int
    failures: dict[str, Failure]  # group -> what its close() raised


class Ping(NamedTuple):
    """Host -> any actor of the run: answer `Pong` (a liveness and latency probe)."""

    seq: int


class Pong(NamedTuple):
    """Answer to `Ping`, with the answering process's pid."""

    seq: int
    pid: int


# --------------------------------------------------------------------------- exit codes

# pid -> exit code of the coordinator's children as multiprocessing saw them
# (negative: killed by that signal). Filled by the wrapper below, in the coordinator, for
# the pids of `WATCHED` only, and emptied of a group's pid once its end is told
# (`Coordinator._ended`): one entry at most per running group, however long the run.
EXIT_CODES: dict[int, int | None] = {}
# The pids of this machine's groups whose end the coordinator has not told yet. A child
# whose end was told from the coordinator's tick (before Thespian reaped it) is no longer
# in it, so its late reap leaves nothing behind in `EXIT_CODES`.
WATCHED: set[int] = set()


def _record_exit_codes() -> None:
    """Make Thespian keep its children's exit codes in `EXIT_CODES` (this process only).

    Thespian reaps a dead child in ``_checkChildLiveness`` and drops its process
    object, exit code included, before it tells the parent actor; this wraps
    that function so the code is kept. Without it (another Thespian), a notice
    just does not name the code.
    """
    try:
        from thespian.system.multiprocCommon import MultiProcReplicator
        plain = MultiProcReplicator.__dict__["_checkChildLiveness"].__func__
    except (ImportError, KeyError, AttributeError):
        return
    if getattr(plain, "_mujou_wrapped", False):
        return

    def check(child_info: Any) -> bool:
        """Thespian's liveness check, keeping the exit code of a child found dead."""
        is_alive = bool(plain(child_info))
        if not is_alive:
            proc = getattr(child_info, "childProc", None)
            if proc is not None and getattr(proc, "pid", None) in WATCHED:
                EXIT_CODES[proc.pid] = proc.exitcode
        return is_alive

    check._mujou_wrapped = True  # type: ignore[attr-defined]
    MultiProcReplicator._checkChildLiveness = staticmethod(check)


# pid -> the process object of a group forked by this process's fork server: no child of
# this process (the fork server's), so its end is read from the object (its sentinel), not
# waitid. Filled in the coordinator (`_fork_groups`).
FORKED: dict[int, Any] = {}


def _fork_groups(preload: tuple[str, ...]) -> None:
    """Make Thespian start this process's child actors from a fork server (this process only).

    The fork server (multiprocessing's ``forkserver``) is started now and
    imports ``preload`` once (torch and the group's modules: 1.4-2.5 s of CPU),
    while the host goes on; every group process is then a fork of it, which
    starts in milliseconds instead of importing them again, and so does a
    restart. multiprocessing's own rule keeps it safe: the server is a fresh
    process with one thread, and forks only from it. Nothing it imports may
    initialize CUDA (importing torch does not; CUDA cannot be used in a child
    forked after its initialization): a group initializes it itself. Thespian's
    ``_startChildActor`` is wrapped to use that start method and to keep each
    child's process object in `FORKED` (`ended_child` reads it). Without the
    start method (not on this platform), nothing changes: spawn as before.
    """
    import multiprocessing
    from multiprocessing import forkserver

    try:
        from thespian.system.multiprocCommon import MultiProcReplicator
        plain = MultiProcReplicator.__dict__["_startChildActor"]
        context = multiprocessing.get_context("forkserver")
    except (ImportError, KeyError, ValueError):
        return
    if getattr(plain, "_mujou_wrapped", False):
        return
    context.set_forkserver_preload(list(preload))
    forkserver.ensure_running()  # its imports overlap with the host's start

    def start(self: Any, *args: Any, **kwargs: Any) -> None:
        """Thespian's child start, through the fork server; the child's process kept."""
        self.mpcontext = context
        plain(self, *args, **kwargs)
        child = self._child_procs[-1].childProc
        FORKED[child.pid] = child

    start._mujou_wrapped = True  # type: ignore[attr-defined]
    MultiProcReplicator._startChildActor = start


def exit_reason(pid: int | None) -> str:
    """How a child of this process ended, in words (see `ended_child`).

    Args:
        pid (int | None): the child.

    Returns:
        str: "killed by SIGKILL", "exited with code 3", or "exited" when unknown
        (or still ending).
    """
    return (ended_child(pid) if pid is not None else None) or "exited"


def ended_child(pid: int) -> str | None:
    """How a child of this process ended, in words; ``None`` while it has not ended.

    From `EXIT_CODES` once Thespian reaped it; else by peeking at it without
    reaping it (``waitid(..., WNOWAIT)``: Thespian reaps it later). A process
    whose main thread has ended but whose other threads are still ending shows
    as a zombie in /proc, but has no exit status yet: it has not ended.

    Args:
        pid (int): the child.

    Returns:
        str | None: "killed by SIGKILL", "exited with code 3", "exited" (ended,
        its status gone), or ``None`` (still running, or ending).
    """
    code = EXIT_CODES.get(pid)
    forked = FORKED.get(pid)
    if forked is not None and pid not in EXIT_CODES:
        code = forked.exitcode  # the fork server's report, through its sentinel
        if code is None:
            return None
    elif code is None and pid not in EXIT_CODES:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return "exited"  # reaped already (not through Thespian's check), or not ours
        if info is None:
            return None
        code = -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) \
            else info.si_status
    if code is None:
        return "exited"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


# --------------------------------------------------------------------------- coordinator

class _Entry:
    """What the coordinator knows of one group: its actor, pid and state.

    States: ``"starting"`` (its server is being built; ``start`` is the host's
    request), ``"running"``, ``"failed"`` (the target raised; its exit is
    expected), ``"stopping"`` (asked to stop; ``stop`` is the host's request, or
    ``None`` under `StopAll`). ``member``: the convention member (machine) its
    process runs on, ``None`` for this machine.
    """

    def __init__(self, address: Any, start: tuple[int, Any], member: str | None = None) -> None:
        self.address = address
        self.member = member
        self.pid: int | None = None
        self.state = "starting"
        self.start: tuple[int, Any] | None = start
        self.stop: tuple[int, Any] | None = None
        self.failure: Failure | None = None


class Coordinator(ActorTypeDispatcher):
    """Creates, watches and stops the group actors of a run; tells the host of crashes.

    It runs no user code, so it always answers at once. When a group's process
    ends unasked, it pushes ``{"group", "pid", "reason"}`` as JSON to the host's
    notices socket, right from Thespian's ``ChildActorExited`` (itself sent on
    SIGCHLD).

    Linux gives SIGCHLD to any thread of the process that does not block it,
    and torch starts threads that do not: one that gets it leaves Thespian's
    main thread asleep in ``select``, and the child's end unnoticed. So the
    coordinator also wakes every `TICK` seconds: any signal that another
    thread took is handled then, and a group whose process is gone but not
    reported is reported from here (and SIGCHLD is sent to the main thread,
    so that Thespian forgets the child too). A group on a convention member is
    no child of this process: only Thespian's ``ChildActorExited`` (from the
    member's admin) tells of its end, and the run's heartbeat of a lost member.
    """

    def __init__(self) -> None:
        super().__init__()
        self._groups: dict[str, _Entry] = {}
        self._context: zmq.Context[Any] | None = None
        self._push: zmq.Socket[Any] | None = None
        self._stop_all: tuple[int, Any] | None = None
        self._close_failures: dict[str, Failure] = {}
        self._exiting = False
        self._host: tuple[int, int | None] | None = None
        self._folder = ""
        _record_exit_codes()

    # One handler per message class (Thespian's ActorTypeDispatcher: ``receiveMsg_`` and
    # the class's name, the most derived class of the message first). No class here
    # derives from another handled one, so the order of the handlers does not matter.

    def receiveMsg_WakeupMessage(self, msg: WakeupMessage, sender: Any) -> None:  # noqa: N802
        """The `TICK`'s wakeup: look at the groups' processes (`_tick`)."""
        self._tick()

    def receiveMsg_ChildActorExited(self, msg: ChildActorExited,  # noqa: N802
                                    sender: Any) -> None:
        """A group actor's process ended (Thespian's notice): answer, or tell the host."""
        name = next((g for g, e in self._groups.items() if e.address == msg.childAddress),
                    None)
        if name is not None:  # else its second notice (goodbye and SIGCHLD): done already
            self._ended(name)

    def receiveMsg_StopGroup(self, msg: StopGroup, sender: Any) -> None:  # noqa: N802
        """The host stops a group; answered when its process ended (`_stop`)."""
        self._stop(msg.group, (msg.seq, sender))

    def receiveMsg_Forget(self, msg: Forget, sender: Any) -> None:  # noqa: N802
        """The host gave a group on a member up: forget it, answer at once."""
        entry = self._groups.pop(msg.group, None)
        if entry is not None:
            self.send(entry.address, ActorExitRequest())  # lost: it may still be there
        self.send(sender, GroupStopped(msg.seq, msg.group, None))

    def receiveMsg_StopAll(self, msg: StopAll, sender: Any) -> None:  # noqa: N802
        """The host stops every group; answered when none is left."""
        self._stop_all = (msg.seq, sender)
        for group in list(self._groups):
            self._stop(group, None)
        self._maybe_all_stopped()

    def receiveMsg_Ping(self, msg: Ping, sender: Any) -> None:  # noqa: N802
        """Answer with this process's pid."""
        self.send(sender, Pong(msg.seq, os.getpid()))

    def receiveMsg_ActorExitRequest(self, msg: ActorExitRequest,  # noqa: N802
                                    sender: Any) -> None:
        """The coordinator ends: close the notices socket; the host's folder if it is gone."""
        self._exiting = True
        self._close_push()
        if self._host is not None and self._folder and not alive(*self._host):
            shutil.rmtree(self._folder, ignore_errors=True)  # nobody else will now

    def receiveMsg_PoisonMessage(self, msg: PoisonMessage, sender: Any) -> None:  # noqa: N802
        """A message this actor sent failed where it went: said on stderr."""
        print(f"mujou coordinator: a message failed: {msg.details}", file=sys.stderr)

    def receiveMsg_Configure(self, msg: Configure, sender: Any) -> None:  # noqa: N802
        """The host's first message: connect the notices socket, start the fork server,
        answer with the pids of the run."""
        if msg.preload:
            _fork_groups(msg.preload)
        self._close_push()
        self._host, self._folder = msg.host, msg.folder
        self._context = zmq.Context()
        self._push = self._context.socket(zmq.PUSH)
        self._push.setsockopt(zmq.LINGER, NOTICE_LINGER_MS)
        self._push.connect(msg.notices)
        self.send(sender, Configured(msg.seq, os.getpid(), os.getppid(), os.getpgrp()))
        self.wakeupAfter(TICK)

    def _tick(self) -> None:
        """Report the groups whose process is gone unreported; handle stolen signals."""
        if self._exiting:
            return
        # Only this machine's groups: a group on a member is no child of this process
        # (its pid is the member's), and waitid would call it ended at once. Its end is
        # told by its member's admin (ChildActorExited, forwarded here) or, the member
        # lost, by the run's heartbeat.
        gone = {g: reason for g, e in self._groups.items() if e.pid is not None
                and e.member is None and (reason := ended_child(e.pid)) is not None}
        if gone:
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGCHLD)
        for name, reason in gone.items():
            self._ended(name, reason)
        self.wakeupAfter(TICK)

    def _close_push(self) -> None:
        """Close the notices socket and its context (bounded by the linger)."""
        if self._push is not None:
            self._push.close()
            self._push = None
        if self._context is not None:
            self._context.term()
            self._context = None

    def receiveMsg_StartGroup(self, msg: StartGroup, sender: Any) -> None:  # noqa: N802
        """The host starts a group: create its actor (a new process), ask it to build."""
        entry = self._groups.get(msg.group)
        if entry is not None and entry.member is None and entry.pid is not None:
            # The host saw the process gone (a request found it dead) and restarts it
            # before this coordinator's tick or Thespian's notice told its end: told now.
            reason = ended_child(entry.pid)
            if reason is not None:
                self._ended(msg.group, reason)
        if msg.group in self._groups:
            failure = Failure("ValueError", f"ValueError: group {msg.group!r} already exists",
                              "", None)
            self.send(sender, GroupStartFailed(msg.seq, msg.group, failure, ""))
            return
        # On a member: the leader's admin finds no fit (actorSystemCapabilityCheck)
        # and hands the creation to the member whose capability names it.
        address = self.createActor(GroupActor, targetActorRequirements=None
                                   if msg.member is None else {MEMBER: msg.member})
        self._groups[msg.group] = _Entry(address, (msg.seq, sender), msg.member)
        self.send(address, Init(msg.seq, msg.group, msg.target, msg.kwargs, msg.sys_path,
                                  msg.main))

    def receiveMsg_Booting(self, msg: Booting | Started | StartFailed,  # noqa: N802
                           sender: Any) -> None:
        """A group's start went on: tell the host its pid (`Booting`), or answer its start
        (`Started`: the server is built; `StartFailed`: the target raised)."""
        entry = self._groups.get(msg.group)
        if entry is None or entry.start is None or entry.start[0] != msg.seq:
            return  # a start already given up
        seq, host = entry.start
        if isinstance(msg, Booting | Started) and entry.member is None:
            WATCHED.add(msg.pid)  # a child of this process: its exit code is kept
        if isinstance(msg, Booting):
            entry.pid = msg.pid
            self.send(host, msg)
        elif isinstance(msg, Started):
            entry.pid, entry.state, entry.start = msg.pid, "running", None
            self.send(host, GroupStarted(seq, msg.group, msg.pid, entry.address))
        else:
            entry.state, entry.start = "failed", None
            self.send(entry.address, ActorExitRequest())
            self.send(host, GroupStartFailed(seq, msg.group, msg.failure, ""))

    receiveMsg_Started = receiveMsg_StartFailed = receiveMsg_Booting  # noqa: N815

    def _stop(self, group: str, request: tuple[int, Any] | None) -> None:
        """Stop one group: ``Close`` it (or end it, while it starts); answer when it ended."""
        entry = self._groups.get(group)
        if entry is None:
            if request is not None:
                self.send(request[1], GroupStopped(request[0], group, None))
            return
        if request is not None:
            entry.stop = request
        if entry.state == "stopping":
            return
        was, entry.state = entry.state, "stopping"
        if was == "running":
            self.send(entry.address, Close(group))
        else:  # starting (its start is answered when it ends) or failed (already ending)
            self.send(entry.address, ActorExitRequest())

    def receiveMsg_Closed(self, msg: Closed, sender: Any) -> None:  # noqa: N802
        """A group's ``close()`` returned (or raised): end its actor, and so its process."""
        entry = self._groups.get(msg.group)
        if entry is None:
            return
        entry.failure = msg.failure
        self.send(entry.address, ActorExitRequest())

    def _ended(self, name: str, reason: str | None = None) -> None:
        """A group's process ended (or is ending: its goodbye): answer, or tell the host."""
        entry = self._groups.pop(name)
        if reason is None:  # how it ended is known only of a child of this process
            reason = (exit_reason(entry.pid) if entry.member is None
                      else f"ended on member {entry.member!r}")
        reason = f"{reason} (ChildActorExited)"
        if entry.pid is not None:  # told: one entry per live group, however many restarts
            FORKED.pop(entry.pid, None)
            EXIT_CODES.pop(entry.pid, None)
            WATCHED.discard(entry.pid)
        if entry.start is not None:  # died while building its server
            seq, host = entry.start
            self.send(host, GroupStartFailed(seq, name, None, reason))
        elif entry.state == "stopping":
            if entry.stop is not None:
                self.send(entry.stop[1], GroupStopped(entry.stop[0], name, entry.failure))
            elif entry.failure is not None:  # stopped by StopAll: its answer reports it
                self._close_failures[name] = entry.failure
        elif entry.state == "running":
            self._notify(name, entry.pid, reason)
        self._maybe_all_stopped()

    def _notify(self, group: str, pid: int | None, reason: str) -> None:
        """Push a crash notice to the host (never blocks: dropped if it cannot go)."""
        if self._push is None:
            return
        notice = json.dumps({"group": group, "pid": pid, "reason": reason}).encode()
        try:
            self._push.send(notice, zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            print(f"mujou coordinator: notice for {group!r} not sent: {exc}", file=sys.stderr)

    def _maybe_all_stopped(self) -> None:
        """Answer `StopAll` once no group is left."""
        if self._stop_all is not None and not self._groups:
            seq, host = self._stop_all
            self._stop_all = None
            self.send(host, AllStopped(seq, dict(self._close_failures)))
            self._close_failures.clear()


# --------------------------------------------------------------------------- group actor

class GroupActor(ActorTypeDispatcher):
    """Holds one group's server in its own process and answers the host's calls.

    The server is what the target returned; it needs ``handle(request)`` and
    ``close()``. ``close()`` is called once: on `Close`, or when the actor is
    asked to exit (the system's shutdown; SIGTERM from the watchdog when the
    host or the coordinator died).
    """

    @staticmethod
    def actorSystemCapabilityCheck(capabilities: dict[str, Any],  # noqa: N802 (Thespian's)
                                   requirements: dict[str, Any]) -> bool:
        """Whether an actor system may hold the actor: the member it requires, if any.

        Thespian asks it where the actor is to be created; where it answers
        ``False`` (the leader, for a group placed on a member), Thespian's
        admins forward the creation to a convention member that answers ``True``.

        Args:
            capabilities (dict[str, Any]): the actor system's capabilities.
            requirements (dict[str, Any]): ``createActor``'s
                ``targetActorRequirements`` (``{MEMBER: name}`` or none).

        Returns:
            bool: ``True`` when no member is required or the system is that member.
        """
        wanted = (requirements or {}).get(MEMBER)
        return wanted is None or capabilities.get(MEMBER) == wanted

    def __init__(self) -> None:
        super().__init__()
        self._server: Any = None
        self._init: Init | None = None
        self._parent: Any = None
        self._closed = False

    # One handler per message class (Thespian's ActorTypeDispatcher), as in `Coordinator`.

    def receiveMsg_Call(self, msg: Call, sender: Any) -> None:  # noqa: N802
        """The host's request: answered with ``server.handle(request)`` (`_call`)."""
        self.send(sender, self._call(msg) if self._init is not None
                  and msg.group == self._init.group else
                  Answer(msg.seq, None, Failure.of(LookupError(
                      f"a request for group {msg.group!r} reached another actor"))))

    def receiveMsg_Ping(self, msg: Ping, sender: Any) -> None:  # noqa: N802
        """Answer with this process's pid."""
        self.send(sender, Pong(msg.seq, os.getpid()))

    def receiveMsg_Init(self, msg: Init, sender: Any) -> None:  # noqa: N802
        """The coordinator's start: tell it this pid, then build (a message to itself)."""
        self._init, self._parent = msg, sender
        self.send(sender, Booting(msg.seq, msg.group, os.getpid()))
        self.send(self.myAddress, _Build(msg.seq))

    def receiveMsg_Close(self, msg: Close, sender: Any) -> None:  # noqa: N802
        """``server.close()``; answered with what it raised, if it did."""
        self.send(sender, Closed(msg.group, self._close()))

    def receiveMsg_ActorExitRequest(self, msg: ActorExitRequest,  # noqa: N802
                                    sender: Any) -> None:
        """The actor ends: ``server.close()`` if not yet, its failure on stderr."""
        failure = self._close()
        if failure is not None:
            print(f"mujou group: close() raised on exit:\n{failure.traceback}",
                  file=sys.stderr)

    def receiveMsg__Build(self, msg: _Build, sender: Any) -> None:  # noqa: N802
        """Build the server (`_build`), after `Booting` has gone out."""
        self._build()

    def _build(self) -> None:
        """Import the host's script and the target, call it with the kwargs, keep the server."""
        init = self._init
        if init is None:
            return
        try:
            for folder in reversed(init.sys_path):
                if folder not in sys.path:
                    sys.path.insert(0, folder)
            import_main(init.main)
            module_name, _, function_name = init.target.partition(":")
            if not module_name or not function_name:
                raise ValueError(f"target {init.target!r} is not 'package.module:function'")
            function = getattr(importlib.import_module(module_name), function_name)
            self._server = function(**pickle.loads(init.kwargs))
        except BaseException as exc:  # noqa: BLE001 - reported to the host, whatever it is
            self.send(self._parent, StartFailed(init.seq, init.group, Failure.of(exc)))
            return
        self.send(self._parent, Started(init.seq, init.group, os.getpid()))

    def _call(self, msg: Call) -> Answer:
        """``server.handle(request)``, its value pickled, or the failure."""
        try:
            if self._server is None:
                raise RuntimeError("the group's server is not built (or is closed)")
            value = self._server.handle(pickle.loads(msg.request))
            return Answer(msg.seq, pickle.dumps(value), None)
        except BaseException as exc:  # noqa: BLE001 - reported to the host, whatever it is
            return Answer(msg.seq, None, Failure.of(exc))

    def _close(self) -> Failure | None:
        """``server.close()`` once; what it raised, if it did."""
        if self._closed or self._server is None:
            return None
        self._closed = True
        server, self._server = self._server, None
        try:
            server.close()
        except BaseException as exc:  # noqa: BLE001 - reported to the host, whatever it is
            return Failure.of(exc)
        return None
