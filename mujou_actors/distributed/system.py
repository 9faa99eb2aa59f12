"""The control plane of a placed run: a private Thespian actor system and its processes.

`ProcessSystem` starts, for one run, a private Thespian ``multiprocTCPBase``
actor system (its own admin on a free port, ``transientUnique``, processes
started with ``spawn``), a `~mujou_actors.distributed.actors.Coordinator`
actor, and one group process per `ProcessSystem.start_group` (spawned, or,
with ``preload``, forked from the coordinator's fork server); it carries
control requests to a group's server (`ProcessSystem.ask`), tells the host
when a group process dies (`ProcessSystem.notices`, `ProcessSystem.take_exits`)
and ends it all (`ProcessSystem.shutdown`), with a bound on every wait.

Processes of one run (each a process of its own)::

    host (the caller) ── Thespian admin ── Thespian logger
                                        └─ coordinator ── group "a", group "b", ...
                            (with ``preload``: coordinator ── fork server ── groups)

The admin and the logger are Thespian's: they import Thespian and the standard
library, not the package; the coordinator imports only the part of the package
it runs (`actors`: no torch, since the package imports its public names when
first used); the group processes import the package and torch (about 1.4 s of
CPU each) and the host's main module (see below). All but the host are in one
process group (the admin's). Every one of them runs a watchdog thread that
ends its process when the host, or its own parent, is gone: within
``WATCH_PERIOD`` (0.25 s) it sends SIGTERM to its main thread (Thespian's
graceful end: a group's server's ``close()`` runs), and ``EXIT_GRACE`` (3 s)
later it ends the process if it is still there; so a killed host leaves
nothing behind.

What listens where (docs/security.md):

* every Thespian socket of the run, TCP on 127.0.0.1 only: the admin on its
  admin port (chosen by the operating system and held from then on: the host
  makes the listening socket and hands it to the admin, `start_admin`; never
  Thespian's shared default 1900), the logger, the coordinator, each group actor and the host's own
  reply socket, each on an ephemeral port; the addresses they tell each other
  are 127.0.0.1 too (Thespian's stock transport listens on every interface
  and advertises the machine's outward address; see
  `mujou_actors.distributed._loopback`). Every frame between them carries an
  HMAC of the run's control-plane key, checked before anything of it is
  unpickled (`mujou_actors.distributed._frames`): a fresh random key per run
  (`AdminSettings.key` ``None``), handed to each process in its spawn pipe, or
  a convention's, derived from ``MUJOU_SECRET``. A connection that does not
  prove the key is closed after a few hundred bytes, or after 10 s;
* the host's notices socket (zmq PULL): ``ipc://`` in a private temporary
  folder (mode 0700), or ``tcp://127.0.0.1`` on an ephemeral port where zmq
  has no ipc transport; the coordinator connects to it, nothing listens in the
  coordinator; its notices are JSON, never pickles;
* nothing else: the group's own data-plane sockets are the group server's
  business.

Threads: a `ProcessSystem` is driven from one thread (the run's driver
thread); only `notices` may be polled from it too. Thespian's ActorSystem
is not thread-safe, so every Thespian call here is made under a lock, held for
that one call (at most `POLL_S`) and never across another wait. In a group
process, Thespian's actor runs on the main thread and learns of SIGTERM (and
of its children's deaths, SIGCHLD) only if the signal wakes that thread: a
thread the group's server starts should be started inside
`mujou_actors.distributed._loopback.signals_blocked()`, or it may take the
signal and leave the main thread asleep.

How a group process finds the target: it is spawned with the host's
``sys.path`` (as it was when the `ProcessSystem` was made) and working folder,
plus the folders given in ``start_group(sys_path=...)``, put first. The host's
main module is imported in every group process, as ``spawn`` would (as
``__mp_main__``, which is also ``sys.modules["__main__"]`` there, so a target
``"__main__:make"`` names the host script's function), unless it is a ``-m``
package's ``__main__`` (the ``mujou`` command, pytest) or interactive; and
only there: the admin is started with it kept out of its spawn data, so the
admin, its logger and the coordinator start without it (`_mainscript`), and
a script's top-level imports (torch, say) are paid once per group, in
parallel, not once per process one after the other. A group imports it as it
builds its server, then unpickles its keyword arguments (which the host
pickles, so that the coordinator forwards them without the script). A script
must keep its work under ``if __name__ == "__main__":``: one that starts a
placed run at its top level is refused in the group's process, which says
why in a file of the host's private folder (`refuse_start`), and the host
raises that as the start's error.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import zmq

from ..errors import GroupDied, RemoteError, describe
from . import actors
from ._coordinator_handle import CoordinatorHandle
from ._loopback import LOOPBACK, _frames, alive, reserve_listener, start_time
from ._mainscript import main_of_this_process
from ._notices import Notices
from ._procs import (
    KILL_WAIT_S,
    end_all,
    end_process,
    group_members,
    kill,
    reap_starters,
    wait_gone,
)
from ._requests import POLL_S, Requests, members_gone
from ._starts import remote_error, start_error, start_failure
from .admin import AdminSettings, free_port, read_refusal, refuse_start, start_admin

# GroupExit and ProcessSystem are this module's own; the others are kept importable from
# here for their users (a group's `refuse_start`, the convention's and tests' names).
__all__ = ["AdminSettings", "GroupExit", "ProcessSystem", "POLL_S", "KILL_WAIT_S",
           "free_port", "reap_starters", "refuse_start", "remote_error", "start_admin"]

log = logging.getLogger("mujou_actors")

REAP_S = 2.0  # how long a group that was asked to end may take before it is killed


class GroupExit(NamedTuple):
    """A group process that ended without being asked to (`ProcessSystem.take_exits`).

    Attributes:
        group (str): the group's name.
        pid (int): its process id.
        reason (str): how it ended, e.g. ``"killed by SIGKILL (ChildActorExited)"``,
            ``"exited with code 3 (ChildActorExited)"``, or that the coordinator died.
    """

    group: str
    pid: int
    reason: str


class _Group:
    """The host's record of one started group."""

    def __init__(self, name: str, pid: int, address: Any, member: str | None = None) -> None:
        self.name = name
        self.pid = pid
        # On a member (another machine, as far as the run knows), its pid is that
        # machine's: nothing here looks it up, waits for it or kills it.
        self.member = member
        self.started = start_time(pid) if member is None else None
        self.address = address
        self.exit: GroupExit | None = None  # set once a notice said it ended

    @property
    def local_pid(self) -> list[int]:
        """Its pid in a list, if it runs on this machine; else an empty list."""
        return [] if self.member is not None else [self.pid]


class ProcessSystem:
    """One run's private Thespian actor system: group processes, requests, crash notices.

    Made and used by the host's driver thread, and only by it (see the
    module's docstring on threads). Every method waits at most its timeout
    (plus `KILL_WAIT_S` where it had to kill a process). Use it as a context
    manager, or call `shutdown`.

    Args:
        start_timeout (float): seconds for the actor system and the coordinator
            to be up (on an idle machine about 0.5 s). Thespian's own bounds
            also apply: its admin must answer within 5 s, and it waits up to
            50 s for a new actor's process.
        admin (AdminSettings | None): the admin's port, address, further
            capabilities and environment (a convention's leader); ``None``
            for a private admin on a free port of 127.0.0.1.
        preload (Sequence[str]): modules that this machine's group processes
            share: the coordinator starts a fork server that imports them once,
            and forks every group from it (a start or restart then takes
            milliseconds, not their imports). Empty (the default): each group
            process is spawned and imports what it needs itself.

    Raises:
        TimeoutError: the admin or the coordinator did not answer in time
            (everything started is ended first).
    """

    def __init__(self, *, start_timeout: float = 30.0,
                 admin: AdminSettings | None = None, preload: Sequence[str] = ()) -> None:
        self._preload = tuple(preload)
        # Whether a group on another machine is lost (the run's heartbeat: set by the
        # placed run), so that a request to it fails at once instead of timing out.
        self.lost_check: Callable[[str], bool] | None = None
        # Whether a convention member (a machine) answers now (set by the placed run):
        # a start on a machine that stops answering fails then, not at its timeout.
        self.member_check: Callable[[str], bool] | None = None
        self._requests = Requests()  # the actor system, under its lock
        self._groups: dict[str, _Group] = {}
        self._exits: list[GroupExit] = []
        self._closed = False
        self._coordinator = CoordinatorHandle(self._requests)
        self._admin_pid: int | None = None
        self._pgids: set[int] = set()  # the run's process group (more after a retried start)
        self._starters: set[int] = set()  # our children that started an admin: to reap
        self._folder = tempfile.mkdtemp(prefix="mujou-run-")
        self._notices = Notices(self._folder)
        if admin is None:  # the operating system's choice, held until the admin has it
            listener = reserve_listener(LOOPBACK)
            admin = AdminSettings(int(listener.getsockname()[1]), listener=listener)
        self._admin_settings = admin
        self.admin_port = self._admin_settings.port
        try:
            self._start(start_timeout)
        except BaseException:
            self.shutdown(timeout=5.0)
            raise

    def _start(self, timeout: float) -> None:
        """Start the admin (and its logger) and the coordinator; learn their pids.

        The admin as `start_admin` starts it (Thespian's own log file in the
        run's private folder, removed at the end; the variables of
        `AdminSettings.environment` set while it starts, the user's values
        winning).
        """
        settings = self._admin_settings
        capabilities = {"Admin Port": self.admin_port, "Process Startup Method": "spawn",
                        **settings.capabilities}
        deadline = time.monotonic() + timeout
        try:
            key = settings.key if settings.key is not None else _frames.new_key()
            self._requests.open(start_admin(
                settings.host, key, capabilities, settings.environment, self._folder, timeout,
                self._starters, f"the run's Thespian admin (port {self.admin_port})",
                settings.listener))
        finally:
            self._pgids |= self._starters  # the run's process group (the admin's)
        reply = self._coordinator.start(self._notices.address, self._folder, self._preload,
                                        deadline - time.monotonic())
        self._admin_pid = reply.admin_pid
        self._pgids.add(reply.pgid)
        self._starters -= reap_starters(self._starters)  # forgotten once reaped
        self._notices.watch(reply.pid, self._coordinator.started)

    @property
    def _coordinator_pid(self) -> int | None:
        """The coordinator's process, once it answered (for tests and tools)."""
        return self._coordinator.pid

    # ----------------------------------------------------------------- the API

    @property
    def folder(self) -> str:
        """str: the run's private temporary folder (mode 0700), removed at the end.

        Also by the coordinator when the host is killed: a placed run puts its
        own socket files here, so that nothing of it is left behind.
        """
        return self._folder

    @property
    def notices(self) -> zmq.Socket[Any]:
        """The socket that becomes readable when a group process ended unasked.

        A zmq PULL socket, for the driver's ``zmq.Poller`` (with its other
        sockets); read it with `take_exits`, not directly. A notice arrives
        a few milliseconds after the process died (see
        ``benchmarks/control.py``).
        """
        return self._notices.socket

    def take_exits(self) -> list[GroupExit]:
        """The group processes found ended since the last call, oldest first; never waits.

        A group ended by `stop_group`, or whose `start_group` raised, is not
        among them. When the coordinator itself died, every group still
        running is reported (its process ends with the coordinator).

        Returns:
            list[GroupExit]: the exits; an empty list when there are none.
        """
        for notice in self._notices.take():
            if "coordinator" in notice:
                self._coordinator.gone = True
                reason = f"the coordinator (pid {notice['coordinator']}) died"
                for group in self._groups.values():
                    self._exited(group, reason)
                continue
            entry = self._groups.get(notice["group"])
            if entry is not None and entry.pid == notice["pid"]:
                self._exited(entry, notice["reason"])
        exits, self._exits = self._exits, []
        return exits

    def lost(self, group: str, reason: str) -> None:
        """Record that a group on a member is gone (its heartbeat stopped): it may start again.

        Thespian tells of a lost machine only after minutes; the run's own
        heartbeat (`heartbeat.Monitor`) tells sooner. The exit is not one of
        `take_exits`'s (the caller knows of it already). The coordinator
        forgets the group (within 5 s), so that it may be started again.

        Raises:
            GroupDied: the coordinator is gone.

        Args:
            group (str): the group's name (unknown names are ignored).
            reason (str): why, for the errors that name it.
        """
        entry = self._groups.get(group)
        if entry is not None and entry.exit is None:
            entry.exit = GroupExit(entry.name, entry.pid, reason)
        try:  # the coordinator forgets it too (it would refuse to start it again)
            self._coordinator.forget(group, 5.0)
        except TimeoutError:
            log.warning("group %r: the coordinator did not answer the loss in time", group)

    def pid(self, group: str) -> int:
        """The process id of a group (its latest process, if it was started again).

        Args:
            group (str): the group's name.

        Returns:
            int: its pid.

        Raises:
            KeyError: no such group was started (or it was stopped).
        """
        return self._group(group).pid

    def run_pids(self) -> list[int]:
        """The processes of the run still running (admin, logger, coordinator, groups).

        The members of the run's process group (`_procs.group_members`), and the pids known.

        Returns:
            list[int]: the pids, in increasing order.
        """
        known = [p for p in (self._admin_pid, self._coordinator.pid) if p is not None]
        known += [p for g in self._groups.values() for p in g.local_pid]
        found = set(known) | group_members(self._pgids)
        return sorted(p for p in found if p != os.getpid() and alive(p))

    def start_group(self, group: str, target: str, kwargs: dict[str, Any], timeout: float,
                    sys_path: Sequence[str] = (), member: str | None = None,
                    check: Callable[[], None] | None = None) -> int:
        """Start a group process and build its server: ``server = target(**kwargs)`` there.

        The coordinator creates the group's actor (a new process, which
        imports the package); the actor imports ``target``'s module and calls
        it. A group whose process ended (see `take_exits`) may be started
        again under the same name. `start_groups` starts several at once.

        Args:
            group (str): the group's name.
            target (str): ``"package.module:function"``, importable in the new
                process; the function returns the server (``handle(request)``,
                ``close()``).
            kwargs (dict[str, Any]): its keyword arguments: plain picklable data.
            timeout (float): seconds for all of it (spawn, imports, the call).
            sys_path (Sequence[str]): folders to put first on the new process's
                ``sys.path`` before the import.
            member (str, optional): the convention member (machine) to start it
                on (this system must lead a convention: `AdminSettings`);
                None: this machine.
            check (Callable[[], None], optional): called every `POLL_S` or so
                while it starts; what it raises ends the start and is raised
                (the caller's own watch: the data plane's handshake).

        Returns:
            int: the group process's pid (on its machine).

        Raises:
            TypeError: ``group`` or ``target`` is not a str.
            ValueError: a group of that name runs already.
            RemoteError: the target could not be imported, or raised (its
                traceback is in the error); the process has been ended.
            GroupDied: the process died before the server was built, or the
                machine it starts on stopped answering (`member_check`).
            TimeoutError: not done within ``timeout``; the process has been ended.
        """
        return self.start_groups({group: (target, kwargs)}, timeout, sys_path,
                                 {} if member is None else {group: member}, check)[group]

    def start_groups(self, groups: Mapping[str, tuple[str, Mapping[str, Any]]], timeout: float,
                     sys_path: Sequence[str] = (),
                     members: Mapping[str, str] | None = None,
                     check: Callable[[], None] | None = None) -> dict[str, int]:
        """Start several group processes at once (their imports overlap); see `start_group`.

        All or nothing: if one fails, those that started are stopped, and the
        first failure, in the mapping's order, is raised (the others are named
        in a note).

        Args:
            groups (Mapping[str, tuple[str, Mapping[str, Any]]]): group name ->
                ``(target, kwargs)``.
            timeout (float): seconds for all of them.
            sys_path (Sequence[str]): folders to put first on every new
                process's ``sys.path``.
            members (Mapping[str, str], optional): group name -> the convention
                member to start it on (see `start_group`); the others here.
            check (Callable[[], None], optional): see `start_group`.

        Returns:
            dict[str, int]: group name -> pid.

        Raises:
            TypeError: a name or target is not a str.
            ValueError: a group of one of those names runs already.
            RemoteError: a target could not be imported, or raised.
            GroupDied: a process died before its server was built, or a machine
                stopped answering.
            TimeoutError: not all done within ``timeout``.
        """
        self._check_open()
        for name, (target, _) in groups.items():
            if not isinstance(name, str) or not isinstance(target, str):
                raise TypeError(f"a group name and its target are str, not "
                                f"{type(name).__name__} and {type(target).__name__}")
            old = self._groups.get(name)
            if old is not None and old.exit is None and (old.member is not None
                                                          or alive(old.pid, old.started)):
                raise ValueError(f"group {name!r} is running already (pid {old.pid})")
        for name in groups:
            self._groups.pop(name, None)
        seqs = {name: self._requests.next() for name in groups}
        booted: dict[str, int] = {}

        def booting(reply: Any) -> bool:
            if isinstance(reply, actors.Booting):
                booted[reply.group] = reply.pid
                return True
            return False

        deadline = time.monotonic() + timeout
        on = dict(members or {})
        main = main_of_this_process()
        sends = [(self._coordinator.address, actors.StartGroup(
                     seqs[name], name, target, pickle.dumps(dict(kwargs)), tuple(sys_path),
                     on.get(name), () if name in on else main))
                 for name, (target, kwargs) in groups.items()]
        gone: list[str] = []  # machines of ``on`` found not answering during the wait
        def checks() -> None:
            self._coordinator.check()
            if check is not None:
                check()

        replies = self._requests.request_many(sends, set(seqs.values()), timeout,
                                              check=checks, interim=booting,
                                              give_up=members_gone(self.member_check,
                                                                   set(on.values()), gone))
        started: dict[str, _Group] = {}
        failures: list[tuple[str, BaseException]] = []
        for name, (target, _) in groups.items():
            reply, pid = replies.get(seqs[name]), booted.get(name)
            if isinstance(reply, actors.GroupStarted):
                started[name] = _Group(name, reply.pid, reply.address, on.get(name))
                continue
            if reply is None:  # given up: the coordinator drops it, its process is killed
                self._coordinator.abandon(name, name in on)
            if pid is not None and name not in on and reply is None:
                kill([pid])
            elif pid is not None and name not in on:  # ending: the coordinator asked it to
                end_process(pid, max(deadline - time.monotonic(), REAP_S))
            error = start_failure(name, target, reply, pid, on.get(name), gone, timeout)
            # A machine that stopped answering is why the others were given up: first.
            failures.insert(0 if reply is None and on.get(name) in gone else len(failures),
                            (name, error))
        self._groups.update(started)
        if failures:
            for name in started:
                try:
                    self.stop_group(name, max(deadline - time.monotonic(), REAP_S))
                except Exception:  # noqa: BLE001 - the start's failure is what is raised
                    pass
            why = read_refusal(os.path.join(self._folder, "refused"))
            if why is not None:  # a script that starts a run as a group imports it
                raise RuntimeError(why) from None  # the group's own error says it again
            raise start_error(failures)
        return {name: entry.pid for name, entry in started.items()}

    def ask(self, group: str, request: Any, timeout: float) -> Any:
        """A control request to a group's server: ``server.handle(request)`` there.

        The request and the value travel pickled (Thespian's transport).

        Args:
            group (str): the group's name.
            request (Any): any picklable object.
            timeout (float): seconds to wait for the answer.

        Returns:
            Any: what ``handle`` returned.

        Raises:
            KeyError: no such group was started.
            RemoteError: ``handle`` raised (its traceback is in the error).
            TypeError: the request does not pickle, or the answer does not
                unpickle in this process.
            GroupDied: the group's process is gone, or went while this waited
                (found within `POLL_S`).
            TimeoutError: no answer within ``timeout`` (a late answer is dropped).
        """
        self._check_open()
        entry = self._group(group)
        self._check_group(entry)
        name = type(request).__name__
        try:
            payload = pickle.dumps(request)
        except Exception as exc:  # noqa: BLE001 - pickle raises several kinds
            raise TypeError(f"the {name} request to group {group!r} does not pickle: "
                            f"{describe(exc)}") from exc
        seq = self._requests.next()
        reply = self._requests.request(entry.address, actors.Call(seq, group, payload), seq,
                                       timeout, f"the {name} request to group {group!r}",
                                       check=lambda: self._check_group(entry))
        if reply.failure is not None:
            raise remote_error(group, f"handle({name}) raised", reply.failure)
        try:
            return pickle.loads(reply.value)
        except Exception as exc:  # noqa: BLE001 - unpickling raises several kinds
            raise TypeError(f"the answer of group {group!r} to the {name} request does not "
                            f"unpickle here: {describe(exc)}") from exc

    def stop_group(self, group: str, timeout: float) -> None:
        """Stop a group: ``server.close()`` in its process, then the process ends.

        Args:
            group (str): the group's name (a group already gone is just forgotten).
            timeout (float): seconds for ``close()`` and the end of the process;
                past it, the process is killed.

        Raises:
            KeyError: no such group was started.
            RemoteError: ``close()`` raised (the process has ended all the same).
            TimeoutError: ``close()`` did not return in time; the process was killed.
        """
        self._check_open()
        entry = self._group(group)
        deadline = time.monotonic() + timeout
        try:
            reply = self._coordinator.stop(group, timeout)
        except (TimeoutError, GroupDied) as exc:  # GroupDied: the coordinator is gone
            kill(entry.local_pid)  # ended here
            del self._groups[group]
            if isinstance(exc, GroupDied):
                raise
            raise TimeoutError(f"group {group!r}: close() and the end of its process took "
                               f"more than {timeout} s; the process was killed") from None
        if entry.member is None:
            end_process(entry.pid, max(deadline - time.monotonic(), 0.0), entry.started)
        del self._groups[group]
        if reply.failure is not None:
            raise remote_error(group, "close() raised", reply.failure)

    def shutdown(self, timeout: float = 10.0) -> dict[str, RemoteError]:
        """End the run: every server's ``close()``, every process, the sockets; idempotent.

        Every group's ``close()`` gets half of ``timeout``; a group still there
        after that is killed. Then the coordinator is asked to end (killed past
        three quarters of ``timeout``) and Thespian's own shutdown ends the
        admin and its logger; any process of the run still there when
        ``timeout`` is spent is killed. Afterwards no process of the run is
        left and nothing listens on the admin port.

        Args:
            timeout (float): seconds for the graceful part (plus `KILL_WAIT_S`
                if something had to be killed; and Thespian's own 10 s bound
                on its shutdown, should its admin stop answering).

        Returns:
            dict[str, RemoteError]: the groups whose ``close()`` raised, and
            what (also logged, on the ``mujou_actors`` logger); empty when none
            did, and on a second call.
        """
        if self._closed:
            return {}
        self._closed = True
        self._notices.stop_watching()  # the coordinator is about to end, as asked
        deadline = time.monotonic() + timeout
        failures: dict[str, RemoteError] = {}
        try:
            if self._requests.is_open:
                failures = self._stop_all(deadline - timeout / 2)
                self._coordinator.end(deadline - timeout / 4)
                self._requests.close()  # Thespian's shutdown: the admin and the logger
        finally:
            self._requests.close(shutdown=False)
            # Every process of the run, then the admin's starters (reaped: our children).
            end_all(self.run_pids, self._pgids, max(deadline - time.monotonic(), 0.0))
            self._starters -= reap_starters(self._starters)
            self._notices.close(KILL_WAIT_S)
            shutil.rmtree(self._folder, ignore_errors=True)
        for error in failures.values():
            log.error("%s\n%s", error, error.remote_traceback)
        return failures

    def __enter__(self) -> ProcessSystem:
        """The system itself (``with ProcessSystem() as system: ...``)."""
        return self

    def __exit__(self, *exc: object) -> None:
        """`shutdown`, with its default timeout."""
        self.shutdown()

    # ----------------------------------------------------------------- helpers

    def _group(self, group: str) -> _Group:
        """The record of a started group."""
        entry = self._groups.get(group)
        if entry is None:
            raise KeyError(f"no group {group!r} in this run")
        return entry

    def _check_open(self) -> None:
        """Refuse calls after `shutdown`."""
        if self._closed:
            raise RuntimeError("the process system is shut down")

    def _check_group(self, entry: _Group) -> None:
        """Raise `GroupDied` if the group's process is gone."""
        if entry.exit is not None:
            raise GroupDied(entry.name, entry.pid, entry.exit.reason)
        if entry.member is None and not alive(entry.pid, entry.started):
            raise GroupDied(entry.name, entry.pid, "its process is gone")
        if entry.member is not None and self.lost_check is not None \
                and self.lost_check(entry.name):
            raise GroupDied(entry.name, entry.pid, f"lost: machine {entry.member!r} stopped "
                                                   f"answering the run's heartbeat")
        self._coordinator.check()

    def _exited(self, group: _Group, reason: str) -> None:
        """Record a group's unasked end (once)."""
        if group.exit is None:
            group.exit = GroupExit(group.name, group.pid, reason)
            self._exits.append(group.exit)

    # ----------------------------------------------------------------- ending processes

    def _stop_all(self, until: float) -> dict[str, RemoteError]:
        """`StopAll` through the coordinator until ``until``; then kill the groups left.

        Returns:
            dict[str, RemoteError]: what the groups' ``close()`` raised.
        """
        failures: dict[str, RemoteError] = {}
        if self._groups:
            failures = {group: remote_error(group, "close() raised", failure) for group, failure
                        in self._coordinator.stop_all(until - time.monotonic()).items()}
        pids = [p for g in self._groups.values() for p in g.local_pid]
        self._groups.clear()
        wait_gone(pids, max(until - time.monotonic(), 0.0))
        kill(pids)
        return failures
