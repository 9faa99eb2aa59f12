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

import json
import logging
import os
import pickle
import shutil
import signal
import socket
import tempfile
import threading
import time
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import psutil
import zmq
from thespian.actors import (
    ActorExitRequest,
    ActorSystem,
    ActorSystemFailure,
    InvalidActorAddress,
    PoisonMessage,
)
from thespian.system.multiprocTCPBase import ActorSystemBase

from ..errors import GroupDied, RemoteError, describe
from . import actors
from ._loopback import (
    LOOPBACK,
    _frames,
    alive,
    reserve_listener,
    signals_blocked,
    start_time,
    transport_for,
)
from ._mainscript import main_kept_from_children, main_of_this_process

__all__ = ["AdminSettings", "GroupExit", "ProcessSystem", "POLL_S"]

log = logging.getLogger("mujou_actors")

POLL_S = 0.05  # the longest one Thespian call waits; a request's wait is made of these
REAP_S = 2.0  # how long a group that was asked to end may take before it is killed
KILL_WAIT_S = 1.0  # how long a killed process may take to be gone
MEMBER_CHECK_S = 1.0  # how often a start on another machine asks whether that machine answers
MEMBER_MISSES = 2  # unanswered asks in a row before a start gives that machine up
# One admin start at a time sets this process's environment (`start_admin`): another
# start's variables would otherwise reach that admin, or be taken away under it.
_ENVIRONMENT = threading.Lock()
# Names, in every process of a run (inherited from the admin), the file in the run's
# private folder where a process that refuses to start says why (`refuse_start`); it
# also marks the admin's process while it starts (`_await_admin_process`).
REFUSAL_ENV = "MUJOU_RUN_REFUSAL"


def refuse_start(message: str) -> None:
    """Tell the host why this process of a run refuses to start; never raises.

    A group process refuses while it imports a main script that starts a run at
    its top level (`placed._check_not_bootstrapping`); the host raises the
    message when that group's start fails (`ProcessSystem.start_groups`), rather
    than the group's own error. Nothing happens outside a process of a run.

    Args:
        message (str): what the host raises (a ``RuntimeError``'s message).
    """
    path = os.environ.get(REFUSAL_ENV)
    if not path:
        return
    try:  # whole or not at all: the host may read it at any moment
        with open(f"{path}.{os.getpid()}", "w") as f:
            f.write(message)
        os.replace(f"{path}.{os.getpid()}", path)
    except OSError:
        pass  # its folder is gone: so is the host's wait


# The most of a refusal the host reads (`_refusal`): a message, never a file's worth.
REFUSAL_MAX = 64 * 1024


def _refusal(path: str) -> str | None:
    """What a process of the run left at ``path`` (`refuse_start`), if anything: at most
    `REFUSAL_MAX` characters of it."""
    try:
        with open(path, errors="replace") as f:
            return f.read(REFUSAL_MAX)
    except OSError:
        return None


def _await_admin_process(before: set[int], deadline: float, refused: str) -> None:
    """After a try the admin did not answer: wait while its process is still starting.

    Thespian gives its admin 5 s; on a loaded machine its process may still be in
    ``spawn``'s start then. This waits, polling every `POLL_S` until ``deadline``,
    while a child of this process started with this start's environment
    (`REFUSAL_ENV` set to ``refused``, `_still_spawning`) has not yet made its own
    process group (Thespian's first step in the admin's process), so that the next
    try does not start a second admin.
    """
    while time.monotonic() < deadline and any(
            _still_spawning(pid, refused) for pid in _children() - before):
        time.sleep(POLL_S)


def _still_spawning(pid: int, refused: str) -> bool:
    """Whether child ``pid`` is a Thespian admin's process still in ``spawn``'s start.

    That is: it runs, was started by ``spawn`` (not its resource tracker, a
    child too, which runs on), with `REFUSAL_ENV` set to ``refused`` in its
    environment, and has not yet made a process group of its own (Thespian's
    first step in it). A process that ends (or is refused to us) while it is
    read is not one.
    """
    try:
        proc = psutil.Process(pid)
        if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) \
                or os.getpgid(pid) == pid:
            return False
        return ("--multiprocessing-fork" in proc.cmdline()
                and proc.environ().get(REFUSAL_ENV) == refused)
    except (psutil.Error, OSError):  # NoSuchProcess, ZombieProcess, AccessDenied; getpgid's
        return False


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


class AdminSettings(NamedTuple):
    """How a `ProcessSystem`'s Thespian admin is set up, where not as by default.

    The default is a private admin on a free port of 127.0.0.1;
    `mujou_actors.distributed.convention.leader_admin` makes the settings of
    a convention's leader.

    Attributes:
        port (int): the admin's TCP port.
        host (str): the address every socket of the run is bound to (see
            `mujou_actors.distributed._loopback.transport_for`).
        capabilities (Mapping[str, Any]): added to the admin's capabilities.
        environment (Mapping[str, str]): variables set in this process while
            the admin starts (its processes inherit them); one the user set
            already is left as it is.
        key (bytes | None): the control plane's key (`_frames.control_key` of
            ``MUJOU_SECRET`` for a convention's leader); ``None`` for a fresh
            random key of this run's own (`_frames.new_key`).
        listener (socket.socket | None): a socket listening on ``port`` already
            (`_loopback.reserve_listener`, the port chosen by the operating
            system), handed to the admin; ``None``: `start_admin` binds
            ``port`` itself. Closed here once the admin has started.
    """

    port: int
    host: str = LOOPBACK
    capabilities: Mapping[str, Any] = {}
    environment: Mapping[str, str] = {}
    key: bytes | None = None
    listener: socket.socket | None = None


def system_base(host: str, key: bytes, listener: socket.socket | None = None,
                folder: str | None = None) -> type[ActorSystemBase]:
    """Thespian's ``multiprocTCPBase`` whose sockets are bound to ``host``, frames under ``key``.

    Args:
        host (str): 127.0.0.1, another IPv4 address of this machine, or
            ``"0.0.0.0"`` (see `mujou_actors.distributed._loopback.transport_for`).
        key (bytes): the control plane's key.
        listener (socket.socket | None): the listening socket handed to the
            admin that the system base starts (`_loopback.reserve_listener`).
        folder (str | None): the host's private folder of the run, removed by
            the run's processes when they find the host gone (`_loopback`'s watchdog).

    Returns:
        type[ActorSystemBase]: the system base class, made anew (Thespian never
        pickles it, only its transport class).
    """
    return type("_RunTCPBase", (ActorSystemBase,),
                {"transportType": transport_for(host, key, listener, folder)})


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


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound, read, released).

    Another process may take it before the caller binds it: an admin's port
    is reserved instead (`_loopback.reserve_listener`).

    Returns:
        int: the port.
    """
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _children() -> set[int]:
    """The pids of this process's children, zombies included (empty if none can be listed)."""
    try:
        return {child.pid for child in psutil.Process().children()}
    except psutil.Error:
        return set()


def group_members(pgids: set[int]) -> set[int]:
    """The processes whose process group is one of ``pgids``, zombies included.

    psutil has no process-group id, so each pid's is asked of the kernel
    (``getpgid``); a process that ends meanwhile, or whose group the system
    will not tell (macOS does not, for another session), is left out.

    Args:
        pgids (set[int]): process-group ids.

    Returns:
        set[int]: their members' pids (this process's too, if it is one).
    """
    found: set[int] = set()
    if not pgids:
        return found
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) in pgids:
                found.add(pid)
        except OSError:  # gone since psutil listed it, or not ours to ask
            pass
    return found


def pgid_of(pid: int) -> int | None:
    """A process's process-group id; ``None`` once it is gone (or may not be asked).

    Args:
        pid (int): the process.

    Returns:
        int | None: its process group.
    """
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _starters(before: set[int]) -> set[int]:
    """The children that started a Thespian admin: new since ``before``, group leaders.

    Thespian starts its admin from a short-lived child that calls ``setsid``
    and forks the admin, so that child's pid is the process group of every
    process of the run.
    """
    found = set()
    for pid in _children() - before:
        if pgid_of(pid) == pid:
            found.add(pid)
    return found


def start_admin(host: str, key: bytes, capabilities: dict[str, Any],
                environment: Mapping[str, str], folder: str, timeout: float,
                starters: set[int], what: str, listener: socket.socket | None = None) -> Any:
    """Start a Thespian admin (and its logger) of this process's own, and open it.

    The admin is started on the port of ``capabilities`` (``"Admin Port"``),
    bound to ``host``: on ``listener``, a socket listening there already,
    handed to the admin process (else one made here, `_loopback.reserve_listener`;
    if that port is taken, Thespian's own probe and bind decide). The port is
    thus the admin's from before its process starts (seconds on a loaded
    machine) to its end. The admin starts without the host's main module
    (`_mainscript.main_kept_from_children`). Thespian waits 5 s for a
    new admin to answer; this tries again until ``timeout``: the next try
    finds the port in use, and waits for that admin to answer, never starting
    another (which could not bind it, and would print a traceback). This
    process's copy of the listening socket is closed on the way out (the
    admin keeps the port). Thespian's own
    log file (``thesplog``: ``$TMPDIR/thespian.log`` unless ``THESPLOG_FILE``
    says otherwise) goes into ``folder``: the admin's processes inherit the
    setting from the environment while it starts. A ``THESPLOG_FILE`` of the
    user's wins; so do the user's values of the variables of ``environment``.
    The environment is set and taken back under a lock, so concurrent starts
    in one process wait for each other (the wait counts against ``timeout``).

    Args:
        host (str): the address every socket of the actor system is bound to
            (`system_base`).
        key (bytes): the control plane's key: every frame between the
            processes of the actor system carries its HMAC (`system_base`).
        capabilities (dict[str, Any]): the admin's capabilities.
        environment (Mapping[str, str]): variables set in this process while
            the admin starts (those the user has not set already).
        folder (str): where Thespian's log file goes (``thespian.log``): the
            host's private folder, which the admin's processes remove if they
            find this process gone (killed while the run starts, say).
        timeout (float): seconds for the admin to answer.
        starters (set[int]): gets the pids of this process's children that
            started an admin (`_starters`), also when the start fails: to reap
            (`reap_starters`); each is the process group of the admin's processes.
        what (str): how the error names the admin (``"the run's Thespian admin
            (port 1234)"``).
        listener (socket.socket | None): the admin's listening socket
            (`_loopback.reserve_listener`); closed here. ``None``: one is made
            for the port of ``capabilities``.

    Returns:
        Any: the Thespian ``ActorSystem`` on that admin (``transientUnique``:
        a system base object of our own, not the process-wide one; not
        thread-safe).

    Raises:
        TimeoutError: the admin did not answer within ``timeout`` seconds
            (``"{what} did not answer within {timeout} s"``); what the caller
            started goes on running: it ends it (``starters`` says what).
    """
    variables = {"THESPLOG_FILE": os.path.join(folder, "thespian.log"), **environment}
    refused = os.path.join(folder, "refused")
    if listener is None:
        try:
            listener = reserve_listener(host, int(capabilities["Admin Port"]))
        except OSError:
            listener = None  # taken: Thespian's probe finds whose it is
    try:
        return _start_admin(host, key, capabilities, variables, timeout, starters, what,
                            listener, folder, refused)
    finally:
        if listener is not None:
            listener.close()  # the admin has its own copy


def _start_admin(host: str, key: bytes, capabilities: dict[str, Any],
                 variables: Mapping[str, str], timeout: float, starters: set[int], what: str,
                 listener: socket.socket | None, folder: str, refused: str) -> Any:
    """`start_admin`'s tries, with the environment set (``refused``: `refuse_start`'s file)."""
    base_class = system_base(host, key, listener, folder)
    deadline = time.monotonic() + timeout
    with _ENVIRONMENT:
        ours = [name for name in variables if name not in os.environ]
        for name in ours:
            os.environ[name] = variables[name]
        outer = os.environ.get(REFUSAL_ENV)  # a run's process starting a run of its own
        os.environ[REFUSAL_ENV] = refused
        before = _children()
        try:
            while True:
                try:
                    # Not the host's main script: only the group processes need it, and
                    # they import it themselves (_mainscript).
                    with main_kept_from_children():
                        base = base_class(types.SimpleNamespace(capabilities=capabilities))
                    break
                except InvalidActorAddress as exc:
                    # Thespian waits 5 s for its admin and its logger to be up: on a
                    # loaded machine that takes longer.
                    _await_admin_process(before, deadline, refused)
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"{what} did not answer within {timeout} s"
                                           ) from exc
                finally:
                    starters |= _starters(before)
        finally:
            for name in ours:
                os.environ.pop(name, None)
            if outer is None:
                os.environ.pop(REFUSAL_ENV, None)
            else:
                os.environ[REFUSAL_ENV] = outer
    # A system base object of our own: Thespian's documented alternative to a name.
    return ActorSystem(base, capabilities, transientUnique=True)


def reap_starters(starters: set[int]) -> set[int]:
    """Reap the processes that started an admin (our children; they exit at once).

    Nobody else waits for them (Thespian forgets them), so they would stay
    zombies. Waits up to `KILL_WAIT_S` in all, polling every 10 ms.

    Args:
        starters (set[int]): their pids (`start_admin`); not changed.

    Returns:
        set[int]: those reaped now, or not (any more) children of this process;
        the others still run after the wait.
    """
    reaped = set()
    deadline = time.monotonic() + KILL_WAIT_S
    for pid in sorted(starters):
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid  # not our child, or reaped already
            if done or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        if done:
            reaped.add(pid)
    return reaped


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
        self._lock = threading.Lock()
        self._preload = tuple(preload)
        # Whether a group on another machine is lost (the run's heartbeat: set by the
        # placed run), so that a request to it fails at once instead of timing out.
        self.lost_check: Callable[[str], bool] | None = None
        # Whether a convention member (a machine) answers now (set by the placed run):
        # a start on a machine that stops answering fails then, not at its timeout.
        self.member_check: Callable[[str], bool] | None = None
        self._seq = 0
        self._groups: dict[str, _Group] = {}
        self._exits: list[GroupExit] = []
        self._closed = False
        self._asys: Any = None
        self._coordinator: Any = None
        self._coordinator_pid: int | None = None
        self._coordinator_started: int | None = None
        self._coordinator_gone = False
        self._admin_pid: int | None = None
        self._pgids: set[int] = set()  # the run's process group (more after a retried start)
        self._starters: set[int] = set()  # our children that started an admin: to reap
        self._monitor: threading.Thread | None = None
        self._monitor_stop = threading.Event()
        self._folder = tempfile.mkdtemp(prefix="mujou-run-")
        self._context: zmq.Context[Any] = zmq.Context()
        self._pull: zmq.Socket[Any] = self._context.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        if zmq.has("ipc"):
            self._notices_address = f"ipc://{self._folder}/notices"
            self._pull.bind(self._notices_address)
        else:
            port = self._pull.bind_to_random_port(f"tcp://{LOOPBACK}")
            self._notices_address = f"tcp://{LOOPBACK}:{port}"
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
            self._asys = start_admin(settings.host, key, capabilities, settings.environment,
                                     self._folder, timeout, self._starters,
                                     f"the run's Thespian admin (port {self.admin_port})",
                                     settings.listener)
        finally:
            self._pgids |= self._starters  # the run's process group (the admin's)
        with self._lock:
            self._coordinator = self._asys.createActor(actors.Coordinator)
        seq = self._next()
        configure = actors.Configure(seq, self._notices_address,
                                     (os.getpid(), start_time(os.getpid())), self._folder,
                                     self._preload)
        reply = self._request(self._coordinator, configure,
                              seq, max(deadline - time.monotonic(), 1.0),
                              "the coordinator's start")
        self._coordinator_pid, self._admin_pid = reply.pid, reply.admin_pid
        self._pgids.add(reply.pgid)
        self._coordinator_started = start_time(reply.pid)
        self._reap_starters()
        self._monitor = threading.Thread(target=self._watch_coordinator,
                                         name="mujou-coordinator-monitor", daemon=True)
        with signals_blocked():  # the host's signals are for its main thread
            self._monitor.start()

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
        return self._pull

    def take_exits(self) -> list[GroupExit]:
        """The group processes found ended since the last call, oldest first; never waits.

        A group ended by `stop_group`, or whose `start_group` raised, is not
        among them. When the coordinator itself died, every group still
        running is reported (its process ends with the coordinator).

        Returns:
            list[GroupExit]: the exits; an empty list when there are none.
        """
        # Asked after every poll of a round: look before receiving, since an empty
        # socket's recv raises zmq.Again, which costs tens of microseconds to make.
        while int(self._pull.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            try:
                raw = self._pull.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            notice = json.loads(raw)
            if "coordinator" in notice:
                self._coordinator_gone = True
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
        seq = self._next()
        try:  # the coordinator forgets it too (it would refuse to start it again)
            self._request(self._coordinator, actors.Forget(seq, group), seq, 5.0,
                          f"forgetting group {group!r}", check=self._check_coordinator)
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

        The members of the run's process group (`group_members`), and the pids known.

        Returns:
            list[int]: the pids, in increasing order.
        """
        known = [p for p in (self._admin_pid, self._coordinator_pid) if p is not None]
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
        seqs = {name: self._next() for name in groups}
        booted: dict[str, int] = {}

        def booting(reply: Any) -> bool:
            if isinstance(reply, actors.Booting):
                booted[reply.group] = reply.pid
                return True
            return False

        deadline = time.monotonic() + timeout
        on = dict(members or {})
        main = main_of_this_process()
        sends = [(self._coordinator, actors.StartGroup(
                     seqs[name], name, target, pickle.dumps(dict(kwargs)), tuple(sys_path),
                     on.get(name), () if name in on else main))
                 for name, (target, kwargs) in groups.items()]
        gone: list[str] = []  # machines of ``on`` found not answering during the wait
        def checks() -> None:
            self._check_coordinator()
            if check is not None:
                check()

        replies = self._request_many(sends, set(seqs.values()), timeout,
                                     check=checks, interim=booting,
                                     give_up=self._members_gone(set(on.values()), gone))
        started: dict[str, _Group] = {}
        failures: list[tuple[str, BaseException]] = []
        for name, (target, _) in groups.items():
            reply = replies.get(seqs[name])
            what = f"the start of group {name!r} ({target})"
            if isinstance(reply, actors.GroupStarted):
                started[name] = _Group(name, reply.pid, reply.address, on.get(name))
            elif reply is None:
                self._abandon(name, None if name in on else booted.get(name), name in on)
                if on.get(name) in gone:  # first: it is why the others were given up
                    failures.insert(0, (name, GroupDied(
                        name, booted.get(name), f"machine {on[name]!r} stopped answering "
                                                f"while the group started")))
                elif gone:
                    failures.append((name, TimeoutError(
                        f"{what}: given up when machine {gone[0]!r} stopped answering; "
                        f"its process was ended")))
                else:
                    failures.append((name, TimeoutError(
                        f"{what}: not done within {timeout} s; its process was ended")))
            else:  # GroupStartFailed: its process is ending (the coordinator asked it to)
                pid = booted.get(name)
                if pid is not None and name not in on:
                    self._end_process(pid, max(deadline - time.monotonic(), REAP_S))
                if reply.failure is None:
                    failures.append((name, GroupDied(
                        name, pid, f"its process ended while building its server "
                                   f"({target}): {reply.reason}")))
                else:
                    failures.append((name, self._remote_error(
                        name, f"could not start {target!r}", reply.failure)))
        self._groups.update(started)
        if failures:
            for name in started:
                try:
                    self.stop_group(name, max(deadline - time.monotonic(), REAP_S))
                except Exception:  # noqa: BLE001 - the start's failure is what is raised
                    pass
            error = failures[0][1]
            why = _refusal(os.path.join(self._folder, "refused"))
            if why is not None:  # a script that starts a run as a group imports it
                raise RuntimeError(why) from None  # the group's own error says it again
            if len(failures) > 1:
                error.add_note("Other groups failed too: " + ", ".join(
                    f"{n!r} ({describe(e)})" for n, e in failures[1:]))
            raise error
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
        seq = self._next()
        reply = self._request(entry.address, actors.Call(seq, group, payload), seq, timeout,
                              f"the {name} request to group {group!r}",
                              check=lambda: self._check_group(entry))
        if reply.failure is not None:
            raise self._remote_error(group, f"handle({name}) raised", reply.failure)
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
        seq = self._next()
        try:
            reply = self._request(self._coordinator, actors.StopGroup(seq, group), seq,
                                  timeout, f"the stop of group {group!r}",
                                  check=self._check_coordinator)
        except TimeoutError:
            self._kill(entry.local_pid)
            del self._groups[group]
            raise TimeoutError(f"group {group!r}: close() and the end of its process took "
                               f"more than {timeout} s; the process was killed") from None
        except GroupDied:  # the coordinator is gone: end the process here
            self._kill(entry.local_pid)
            del self._groups[group]
            raise
        if entry.member is None:
            self._end_process(entry.pid, max(deadline - time.monotonic(), 0.0), entry.started)
        del self._groups[group]
        if reply.failure is not None:
            raise self._remote_error(group, "close() raised", reply.failure)

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
        self._monitor_stop.set()  # the coordinator is about to end, as asked
        deadline = time.monotonic() + timeout
        failures: dict[str, RemoteError] = {}
        try:
            if self._asys is not None:
                failures = self._stop_all(deadline - timeout / 2)
                self._end_coordinator(deadline - timeout / 4)
                with self._lock:
                    self._asys.shutdown()  # Thespian's: the admin and the logger
        finally:
            self._asys = None
            self._end_run(deadline)
            if self._monitor is not None:
                self._monitor.join(timeout=KILL_WAIT_S)
            self._pull.close(linger=0)
            self._context.term()
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

    # ----------------------------------------------------------------- requests

    def _next(self) -> int:
        """A new request number (answers carry it; stale answers are dropped)."""
        self._seq += 1
        return self._seq

    def _request(self, to: Any, msg: Any, seq: int, timeout: float, what: str,
                 check: Callable[[], None] | None = None) -> Any:
        """Send ``msg`` to an actor and wait for the answer numbered ``seq``.

        Returns:
            Any: the answer.

        Raises:
            TimeoutError: none within ``timeout``, naming ``what``.
        """
        replies = self._request_many([(to, msg)], {seq}, timeout, check)
        if seq not in replies:
            raise TimeoutError(f"{what}: no answer within {timeout} s")
        return replies[seq]

    def _request_many(self, sends: list[tuple[Any, Any]], seqs: set[int], timeout: float,
                      check: Callable[[], None] | None = None,
                      interim: Callable[[Any], bool] | None = None,
                      give_up: Callable[[], bool] | None = None) -> dict[int, Any]:
        """Send messages to actors and wait for the answers numbered ``seqs``.

        The wait is made of Thespian calls of at most `POLL_S` each, under the
        lock; between them ``check`` may raise (a dead process), ``give_up()``
        returning ``True`` ends the wait with the answers so far, and answers
        of other numbers (late ones) are dropped. ``interim(answer)`` returning
        ``True`` marks an answer as progress, not the end.

        Args:
            sends (list[tuple[Any, Any]]): (actor address, message) to send, in order.
            seqs (set[int]): the numbers of the answers awaited.
            timeout (float): seconds for all of them.
            check (Callable[[], None] | None): called between waits; raises to give up.
            interim (Callable[[Any], bool] | None): see above.
            give_up (Callable[[], bool] | None): called between waits (see above).

        Returns:
            dict[int, Any]: number -> answer; those missing at the deadline are absent.

        Raises:
            RuntimeError: the system is shut down, or an actor failed on a message
                (Thespian's ``PoisonMessage``).
        """
        deadline = time.monotonic() + timeout
        replies: dict[int, Any] = {}
        pending = list(sends)
        while len(replies) < len(seqs):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with self._lock:
                if self._asys is None:
                    raise RuntimeError("the process system is shut down")
                if pending:  # the others' sends go on in the next calls' transport runs
                    to, msg = pending.pop(0)
                    try:
                        reply = self._asys.ask(to, msg, min(left, 0.005 if pending else POLL_S))
                    except ActorSystemFailure:
                        # The transmit itself failed (seen under load: BadPacketError
                        # while the peer's socket was not accepting yet): nothing was
                        # delivered, so it is sent again, within the same deadline.
                        pending.insert(0, (to, msg))
                        reply = None
                else:
                    reply = self._asys.listen(min(left, POLL_S))
            seq = getattr(reply, "seq", None)
            if isinstance(reply, PoisonMessage):
                failed = getattr(reply.poisonMessage, "seq", None)
                if failed in seqs:
                    raise RuntimeError(f"an actor failed on {type(reply.poisonMessage).__name__}"
                                       f":\n{reply.details}")
            elif seq in seqs and seq not in replies and not (interim and interim(reply)):
                replies[seq] = reply
            if check is not None:
                check()
            if give_up is not None and len(replies) < len(seqs) and give_up():
                break
        return replies

    def _members_gone(self, machines: set[str], gone: list[str]) -> Callable[[], bool] | None:
        """A ``give_up`` for a start on ``machines``: every `MEMBER_CHECK_S`, whether one
        of them stopped answering (`member_check`), `MEMBER_MISSES` times in a row (one
        slow answer of a loaded machine is not its end); those found go in ``gone``.

        Without it, a start on a machine that died after it was chosen (its
        admin took the creation, then went) would wait for its whole timeout.
        """
        check = self.member_check
        if check is None or not machines:
            return None
        next_at = time.monotonic() + MEMBER_CHECK_S
        misses = dict.fromkeys(machines, 0)

        def give_up() -> bool:
            nonlocal next_at
            if time.monotonic() < next_at:
                return False
            for m in sorted(machines):
                misses[m] = 0 if check(m) else misses[m] + 1
            gone.extend(m for m in sorted(machines) if misses[m] >= MEMBER_MISSES)
            next_at = time.monotonic() + MEMBER_CHECK_S
            return bool(gone)
        return give_up

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
        self._check_coordinator()

    def _check_coordinator(self) -> None:
        """Raise `GroupDied` (for every group) if the coordinator is gone."""
        pid = self._coordinator_pid
        if self._coordinator_gone or (pid is not None
                                      and not alive(pid, self._coordinator_started)):
            raise GroupDied("<coordinator>", pid, "the run's coordinator process is gone; "
                            "every group went with it")

    def _exited(self, group: _Group, reason: str) -> None:
        """Record a group's unasked end (once)."""
        if group.exit is None:
            group.exit = GroupExit(group.name, group.pid, reason)
            self._exits.append(group.exit)

    @staticmethod
    def _remote_error(group: str, what: str, failure: actors.Failure) -> RemoteError:
        """The host's error for a failure in a group process."""
        exception = None
        if failure.pickled is not None:
            try:
                exception = pickle.loads(failure.pickled)
            except Exception:  # noqa: BLE001 - its class may not exist here; the text stays
                exception = None
        if not isinstance(exception, BaseException):
            exception = None
        return RemoteError(f"group {group!r}: {what}: {failure.message}", group=group,
                           type_name=failure.type_name, remote_traceback=failure.traceback,
                           exception=exception)

    # ----------------------------------------------------------------- ending processes

    def _abandon(self, group: str, booted: int | None, on_member: bool = False) -> None:
        """After a start was given up: tell the coordinator, kill the process if known.

        A group on another machine is forgotten (`actors.Forget`): its end may
        never be told (its machine may be gone), and a stop would wait for it,
        so the group could not be started again.
        """
        seq = self._next()
        msg = actors.Forget(seq, group) if on_member else actors.StopGroup(seq, group)
        try:
            self._request(self._coordinator, msg, seq, POLL_S * 4,
                          f"the abandon of group {group!r}")
        except (TimeoutError, RuntimeError):
            pass  # the process is killed below, or by shutdown's sweep of the process group
        if booted is not None:
            self._kill([booted])

    def _stop_all(self, until: float) -> dict[str, RemoteError]:
        """`StopAll` through the coordinator until ``until``; then kill the groups left.

        Returns:
            dict[str, RemoteError]: what the groups' ``close()`` raised.
        """
        failures: dict[str, RemoteError] = {}
        if self._groups and self._coordinator is not None:
            seq = self._next()
            try:
                reply = self._request(self._coordinator, actors.StopAll(seq), seq,
                                      max(until - time.monotonic(), POLL_S),
                                      "the stop of every group", check=self._check_coordinator)
            except (TimeoutError, GroupDied, RuntimeError):
                pass  # the groups left are killed below
            else:
                failures = {group: self._remote_error(group, "close() raised", failure)
                            for group, failure in reply.failures.items()}
        pids = [p for g in self._groups.values() for p in g.local_pid]
        self._groups.clear()
        self._wait_gone(pids, max(until - time.monotonic(), 0.0))
        self._kill(pids)
        return failures

    def _end_coordinator(self, until: float) -> None:
        """Ask the coordinator to end, wait for its process until ``until``, then kill it.

        Done before Thespian's own shutdown, so that the admin has no child
        left to wait for (Thespian waits up to 10 s for one that does not answer).
        """
        pid = self._coordinator_pid
        if pid is None or not alive(pid, self._coordinator_started):
            return
        with self._lock:
            if self._asys is not None:  # no answer comes: a short wait sends it
                self._asys.ask(self._coordinator, ActorExitRequest(), 0.01)
        if not self._wait_gone([pid], max(until - time.monotonic(), 0.0)):
            self._kill([pid])

    def _end_run(self, deadline: float) -> None:
        """Wait until ``deadline`` for every process of the run to be gone; kill the rest."""
        if not self._wait_gone(self.run_pids, max(deadline - time.monotonic(), 0.0)):
            self._kill_group()
            self._kill(self.run_pids())
            self._wait_gone(self.run_pids, KILL_WAIT_S)
        self._reap_starters()

    def _wait_gone(self, pids: list[int] | Callable[[], list[int]], timeout: float) -> bool:
        """Whether the processes are gone within ``timeout`` (polled every 10 ms)."""
        deadline = time.monotonic() + timeout
        while True:
            left = pids() if callable(pids) else [p for p in pids if alive(p)]
            if not left:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def _end_process(self, pid: int, timeout: float, started: int | None = None) -> None:
        """Wait for a process asked to end; kill it if it is still there after ``timeout``."""
        if not self._wait_gone([pid] if alive(pid, started) else [], timeout):
            self._kill([pid])

    def _kill(self, pids: list[int]) -> None:
        """SIGKILL the processes still there; wait up to `KILL_WAIT_S` for them to go."""
        for pid in pids:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self._wait_gone(pids, KILL_WAIT_S)

    def _kill_group(self) -> None:
        """SIGKILL the run's process group, if one of its members still runs (so it is ours).

        (A process group's id is not reused while a member lives, so then the
        group is still the run's.)
        """
        for pid in self.run_pids():
            pgid = pgid_of(pid)
            if pgid is not None and pgid in self._pgids:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def _reap_starters(self) -> None:
        """Reap the processes that started an admin (`reap_starters`); forget those reaped."""
        self._starters -= reap_starters(self._starters)

    def _watch_coordinator(self) -> None:
        """The monitor thread: push a notice if the coordinator process dies."""
        pid, started = self._coordinator_pid, self._coordinator_started
        if pid is None:
            return
        while not self._monitor_stop.wait(0.1):
            if not alive(pid, started):
                push = self._context.socket(zmq.PUSH)
                try:
                    push.setsockopt(zmq.LINGER, 0)
                    push.connect(self._notices_address)
                    push.send(json.dumps({"coordinator": pid}).encode(), zmq.NOBLOCK)
                    self._monitor_stop.wait(0.2)  # let it go out before the close
                except zmq.ZMQError:
                    pass  # the run is being shut down
                finally:
                    push.close(linger=0)
                return
