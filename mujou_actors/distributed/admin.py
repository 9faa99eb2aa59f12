"""A Thespian admin of this process's own: how it is set up, started, and told of a refusal.

`start_admin` starts the admin of a run (`ProcessSystem`) or of a convention
member (`convention.Member`): Thespian's ``multiprocTCPBase`` with the run's
transport (`system_base`: every socket on the address asked for, every frame
under the control plane's key), on a port held from before its process starts
(`AdminSettings.listener`, `free_port`), without the host's main script, its
environment set while it starts, tried again until its bound while its
process is still starting. Each start leaves the pids of the children that
started an admin (`_procs.starters`) for the caller to reap.

A process of a run that must not start (a group importing a script that
starts a run at its top level) says why in a file of the run's private folder
(`refuse_start`, named by `REFUSAL_ENV` in every process of the run); the host
reads it (`read_refusal`) and raises it as the start's error.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import types
from collections.abc import Mapping
from typing import Any, NamedTuple

import psutil
from thespian.actors import ActorSystem, InvalidActorAddress
from thespian.system.multiprocTCPBase import ActorSystemBase

from ._loopback import LOOPBACK, reserve_listener, transport_for
from ._mainscript import main_kept_from_children
from ._procs import children
from ._procs import starters as new_starters

__all__ = ["AdminSettings", "REFUSAL_ENV", "free_port", "read_refusal", "refuse_start",
           "start_admin", "system_base"]

_SPAWN_POLL_S = 0.05  # how often a start looks whether its admin's process still starts
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


# The most of a refusal the host reads (`read_refusal`): a message, never a file's worth.
REFUSAL_MAX = 64 * 1024


def read_refusal(path: str) -> str | None:
    """What a process of the run left at ``path`` (`refuse_start`), if anything.

    Args:
        path (str): the refusal's file (``refused`` in the run's private folder).

    Returns:
        str | None: at most `REFUSAL_MAX` characters of it; ``None`` when there is none.
    """
    try:
        with open(path, errors="replace") as f:
            return f.read(REFUSAL_MAX)
    except OSError:
        return None


def _await_admin_process(before: set[int], deadline: float, refused: str) -> None:
    """After a try the admin did not answer: wait while its process is still starting.

    Thespian gives its admin 5 s; on a loaded machine its process may still be in
    ``spawn``'s start then. This waits, polling every 50 ms until ``deadline``,
    while a child of this process started with this start's environment
    (`REFUSAL_ENV` set to ``refused``, `_still_spawning`) has not yet made its own
    process group (Thespian's first step in the admin's process), so that the next
    try does not start a second admin.
    """
    while time.monotonic() < deadline and any(
            _still_spawning(pid, refused) for pid in children() - before):
        time.sleep(_SPAWN_POLL_S)


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
            started an admin (`_procs.starters`), also when the start fails: to reap
            (`_procs.reap_starters`); each is the process group of the admin's processes.
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
        before = children()
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
                    starters |= new_starters(before)
        finally:
            for name in ours:
                os.environ.pop(name, None)
            if outer is None:
                os.environ.pop(REFUSAL_ENV, None)
            else:
                os.environ[REFUSAL_ENV] = outer
    # A system base object of our own: Thespian's documented alternative to a name.
    return ActorSystem(base, capabilities, transientUnique=True)
