"""The Thespian transport of a placed run: TCP on 127.0.0.1, frames authenticated; a watchdog.

Thespian's ``TCPTransport`` listens on every interface (it binds ``('', port)``),
advertises the machine's outward address, and unpickles whatever reaches its
sockets. `transport_for` makes the transport of a run: the same transport with
every address it makes (the socket it listens on, the address it tells
others, the admin's) on 127.0.0.1 or another address the user chose, and every
frame it sends or reads authenticated with the run's control-plane key
(`mujou_actors.distributed._frames`: an HMAC checked before a byte of the
pickle is decoded, a restricted unpickler after). It is the transport of
every process of a placed run: Thespian hands each new process (the admin,
its logger, every actor) its parent's transport class, so one class made in
the host reaches them all, and the key travels with it, in the spawn pipe
between the two processes (`_RunThisFile`), never in a frame. Thespian has no
hook for its serializer: the functions of its module that frame or read are
copied with a namespace of their own (`_rebound`), so its module, and a stock
Thespian system in the same process, are left as they are.

This file is also run on its own, by path, in each of those processes
(`runpy.run_path`: the class pickles as "run this file, take the class"), so
that the admin and the logger get it without importing the package (which
imports torch: about 1.4 s and 220 MB a process). It therefore imports only the
standard library, Thespian and its sibling ``_frames`` (loaded by path too),
never the package.

The watchdog: in every process of a run but the host, a daemon thread checks
every `WATCH_PERIOD` seconds that the host process, and the process's own
parent (but in the admin, whose parent exited at its start), are alive. When
one is gone, it sends SIGTERM to its own process (Thespian's graceful end: an
actor gets ``ActorExitRequest``; the admin and the logger just end) and ends
the process with ``os._exit`` `EXIT_GRACE` seconds later if it is still there.
So a run whose host is killed leaves no process behind. The watchdog that
finds the host gone also removes the host's private folder of the run (the
``mujou-run-*`` or ``mujou-convention-*`` folder that the class was made for,
`transport_for`'s ``folder``): the host removes it at the end, the coordinator
when the host is killed after its start, and this covers a host killed while
the run starts, before the coordinator knows the folder (issue 28, item 8). The watchdog thread
blocks every signal (`signals_blocked`), so that SIGCHLD and SIGTERM reach
Thespian's main thread.

The admin's listening socket is made by the host, before the admin starts
(`reserve_listener`: port 0 lets the operating system choose), and handed to
the admin process in its spawn pipe with the admin's endpoint; the admin
listens on it instead of binding a port of its own (`_RunTransport`). So the
port cannot be taken between its choice and the admin's bind (the admin binds
only once its process has started: seconds, on a loaded machine),
and a second try of the start finds the port in use (Thespian's probe) and
waits for that admin instead of starting another, which could not bind it.

`Wake`, a self-pipe that wakes a thread waiting in a `zmq.Poller`, is here
(the lowest module of the package's distributed part) so that the data plane
and the heartbeat share one.

Nothing of this module is a public API.
"""

from __future__ import annotations

import contextlib
import copyreg
import gc
import importlib.util
import multiprocessing
import operator
import os
import pickle
import runpy
import shutil
import signal
import socket
import sys
import threading
import time
import types
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, cast

import thespian.system.transport.TCPTransport as _tcp
from thespian.system.timing import ExpirationTimer
from thespian.system.transport.IPBase import IPActorAddress
from thespian.system.transport.TCPTransport import ExternalTransportCopy, TCPTransport


def _sibling(name: str) -> Any:
    """This package's module ``name`` of this folder, imported without the package.

    In Thespian's admin and logger this file runs by path, without the
    package (whose import would import torch); a module it needs is loaded
    the same way, under its own name, so that a later import of the package
    in the same process finds that one.
    """
    full = f"mujou_actors.distributed.{name}"
    module = sys.modules.get(full)
    if module is None:
        spec = importlib.util.spec_from_file_location(
            full, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
        assert spec is not None and spec.loader is not None  # a file of this folder
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
    return module


_frames = _sibling("_frames")

LOOPBACK = "127.0.0.1"
ANY = "0.0.0.0"  # every interface (transport_for): Thespian's stock binding
WATCH_PERIOD = 0.25  # seconds between two checks of the host and the parent
EXIT_GRACE = 3.0  # seconds from the SIGTERM to os._exit, for close() on the way out

# Set by runpy.run_path's init_globals when this file runs in a process of a run:
# (pid, start time) of the host. Absent where the module is imported normally (the host).
_RUN_HOST: tuple[int, int | None] | None = globals().get("_RUN_HOST")
# Likewise the address the sockets of this process's actor system are bound to
# (`transport_for`); 127.0.0.1 where the module is imported normally.
_BIND: str = globals().get("_BIND", LOOPBACK)
# And the run's control-plane key (`_frames`), handed over in the spawn pipe.
_KEY: bytes | None = globals().get("_KEY")
# And the host's private folder of the run: removed by the watchdog that finds the host gone.
_RUN_FOLDER: str | None = globals().get("_RUN_FOLDER")

# A convention member's private folder (`convention.Member`'s ``mujou-convention-*``), in
# the environment of the processes its admin starts: a group there makes the folder of its
# peer links' ``ipc://`` ends inside it (`peers.LocalFolder`), so what a killed group left
# goes with the member's folder (`remove_folder`: its end, or a watchdog that finds it gone).
MEMBER_FOLDER_ENV = "MUJOU_MEMBER_FOLDER"
# The name of such a group's folder begins with it, and so do the names of the
# shared-memory pools of the links whose ends it holds (`remove_peer_folder`).
PEER_FOLDER_PREFIX = "mujou-peers-"
_SHM_DIR = "/dev/shm"  # where the pools are (`wire`'s)

# Serializes the windows in which Thespian's addresses default to one host
# (held for a socket's creation and bind, never across a wait).
_WINDOW = threading.RLock()
_plain_address_init = IPActorAddress.__init__
_window_host = LOOPBACK  # the host of the window open now (under _WINDOW)
_watchdog_started = False
# The listening socket handed to this process for the transport being made now, with
# the thread making it (`_adopting`); None otherwise.
_adopted: tuple[int, socket.socket] | None = None


def reserve_listener(host: str, port: int = 0) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening: an admin's, made before the admin.

    Handed to the admin process (see the module's docstring), it makes the
    port the admin's from the moment it is chosen. Connections made before
    the admin runs wait in its backlog; the caller closes its own copy once
    the admin has started (the admin keeps the port).

    Args:
        host (str): the address to bind to (``"0.0.0.0"`` for every interface).
        port (int): the port; 0 lets the operating system choose a free one.

    Returns:
        socket.socket: the listening socket (``getsockname()[1]`` is its port).

    Raises:
        OSError: the port is taken (``EADDRINUSE``), or the address is not this machine's.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Thespian's own
        sock.bind(("" if host == ANY else host, port))
        sock.listen(_tcp.LISTEN_DEPTH)
    except BaseException:
        sock.close()
        raise
    return sock


class _Adopted(socket.socket):
    """A listening socket handed over: Thespian's bind of it to its own port is a no-op."""

    def bind(self, address: Any) -> None:
        if address[1] not in (0, self.getsockname()[1]):
            raise OSError(f"the admin's socket listens on port {self.getsockname()[1]}, "
                          f"not {address[1]}")


def _new_socket(*args: Any, **kwargs: Any) -> socket.socket:
    """``socket.socket`` for Thespian's transport: the adopted socket, if this thread has one."""
    global _adopted
    if _adopted is not None and _adopted[0] == threading.get_ident():
        sock, _adopted = _adopted[1], None
        return sock
    return socket.socket(*args, **kwargs)


@contextlib.contextmanager
def _adopting(listener: socket.socket | None) -> Iterator[None]:
    """The transport made in this block (on this thread) listens on ``listener``."""
    global _adopted
    if listener is None:
        yield
        return
    with _WINDOW:
        _adopted = (threading.get_ident(), _Adopted(fileno=listener.detach()))
        try:
            yield
        finally:
            left, _adopted = _adopted, None
            if left is not None:  # not taken (not an admin's transport): not leaked
                left[1].close()


# Thespian's transport module's ``socket``, but for the socket its transport listens on.
_sockets = types.ModuleType("socket")
_sockets.__dict__.update(vars(socket))
_sockets.socket = _new_socket  # type: ignore[attr-defined]


def _bound_address_init(self: Any, af: Any, socktype: Any, proto: Any, baseaddr: Any,
                        port: Any, external: Any = False) -> None:
    """``IPActorAddress.__init__`` with the window's host in place of "any" or "find out".

    Thespian turns a missing address into the machine's outward address and
    binds "external" addresses to ``''`` (every interface); here both become
    the window's host (127.0.0.1 unless `transport_for` says otherwise), but
    for `ANY`, which keeps Thespian's own way.
    """
    host = _window_host
    if host != ANY and baseaddr in (None, "", "0.0.0.0"):
        baseaddr = host
    _plain_address_init(self, af, socktype, proto, baseaddr, port, external)
    if host != ANY and self.bindname[0] in ("", "0.0.0.0"):
        self.bindname = (host, *self.bindname[1:])


@contextlib.contextmanager
def loopback_addresses(host: str = LOOPBACK) -> Iterator[None]:
    """A window in which every Thespian IP address made in this process is on ``host``.

    Thespian builds its addresses inside ``TCPTransport.__init__`` and
    ``getAdminAddr`` with no way to pass a host, so their class's ``__init__``
    is swapped for the length of the call, under a lock (a few microseconds:
    a socket is created, bound and set listening).

    Args:
        host (str): an IPv4 address of this machine (127.0.0.1 by default), or
            `ANY` for Thespian's own choice (every interface, the outward
            address advertised).
    """
    global _window_host
    with _WINDOW:
        previous_host, previous_init = _window_host, IPActorAddress.__init__
        _window_host = host
        IPActorAddress.__init__ = _bound_address_init
        try:
            yield
        finally:
            _window_host = previous_host
            IPActorAddress.__init__ = previous_init


class _PickledByPath(type):
    """Metaclass of the run's transport classes: a class pickles by this file's path.

    ``copyreg`` (which multiprocessing's pickler consults before pickling a
    class by its module's name) reduces it to "run this file with runpy, take
    the attribute", so the process that unpickles it needs no import of the
    package.
    """


class _RunThisFile:
    """Pickles as ``runpy.run_path(<this file>, {"_RUN_HOST": ..., "_BIND": ..., "_KEY": ...})``.

    Unpickled, it is the file's globals, run anew with the run's host, the
    address to bind to and the control plane's key. It is pickled only into
    the spawn pipe of a process the run starts (multiprocessing's, private to
    the two processes): never into a frame (`_frames.on_the_wire`).

    Args:
        bind (str): the address the sockets of the unpickling process are bound to.
        key (bytes): the run's control-plane key.
        folder (str | None): the host's private folder of the run (removed
            by a watchdog that finds the host gone); None: none.
    """

    def __init__(self, bind: str, key: bytes, folder: str | None = None) -> None:
        self.bind = bind
        self.key = key
        self.folder = folder

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """The call that runs this file in the unpickling process.

        Raises:
            pickle.PicklingError: asked while a control-plane frame is pickled
                (the key would go on the wire).
        """
        if _frames.on_the_wire():
            raise pickle.PicklingError("a run's transport class never travels in a frame")
        return (runpy.run_path, (os.path.abspath(__file__),
                                 {"_RUN_HOST": run_host(), "_BIND": self.bind, "_KEY": self.key,
                                  "_RUN_FOLDER": self.folder},
                                 "mujou_actors.distributed._loopback"))


def _reduce_class(cls: type) -> tuple[Any, tuple[Any, ...]]:
    """Reduce a transport class of this file to "this file run anew for its address and key"."""
    return (operator.getitem, (_RunThisFile(getattr(cls, "host", LOOPBACK),
                                            getattr(cls, "key", b""),
                                            getattr(cls, "folder", None)), "_RUN_TRANSPORT"))


copyreg.pickle(_PickledByPath, _reduce_class)


def remove_peer_folder(path: str) -> None:
    """Remove a group's folder of peer-link sockets (`peers.LocalFolder`) and the
    shared-memory pools named after it (those of both ends of each link bound there).

    Mappings that processes still hold stay valid until they close them.

    Args:
        path (str): the folder (its name begins with `PEER_FOLDER_PREFIX`).
    """
    shutil.rmtree(path, ignore_errors=True)
    _remove_pools(os.path.basename(path) + ".")


def remove_folder(folder: str) -> None:
    """Remove a private folder of a run or of a member, with the pools of the groups' peer
    folders in it (`remove_peer_folder`: those a killed group left behind).

    Args:
        folder (str): the folder.
    """
    try:
        names = os.listdir(folder)
    except OSError:
        names = []
    for name in names:
        if name.startswith(PEER_FOLDER_PREFIX):
            _remove_pools(name + ".")
    shutil.rmtree(folder, ignore_errors=True)


def _remove_pools(prefix: str) -> None:
    """Unlink every file of ``/dev/shm`` whose name begins with ``prefix`` (a peer folder's
    name and a dot: never a file of another program's)."""
    if not prefix.startswith(PEER_FOLDER_PREFIX):
        return
    try:
        names = os.listdir(_SHM_DIR)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(_SHM_DIR, name))


def run_host() -> tuple[int, int | None]:
    """The host of the run this process belongs to: (pid, start time), this process in the host.

    Returns:
        tuple[int, int | None]: the pid and the start time in clock ticks
        since boot (``/proc/PID/stat``; ``None`` where there is no /proc).
    """
    if _RUN_HOST is not None:
        return _RUN_HOST
    return os.getpid(), start_time(os.getpid())


def start_time(pid: int) -> int | None:
    """A process's start time (clock ticks since boot), which tells a reused pid apart.

    Args:
        pid (int): the process.

    Returns:
        int | None: the 22nd field of ``/proc/PID/stat``, ``None`` if unreadable.
    """
    stat = stat_fields(pid)
    return int(stat[19]) if stat is not None else None


# Read here, not through psutil (which the package uses to list processes, _procs.py):
# a process is told from a reused pid by its start time as the exact integer of clock
# ticks that every process of the run reads alike (psutil offers only create_time, a
# float of seconds made from it and the boot time), and this module is loaded by path in
# Thespian's admin and logger, where each import is paid at every start.
def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name, ``None`` if unreadable.

    Args:
        pid (int): the process.

    Returns:
        list[str] | None: ``[state, ppid, pgrp, ...]`` (the start time at index
        19); ``None`` when there is no such process or no /proc.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()  # the name may hold spaces and parentheses


def alive(pid: int, started: int | None = None) -> bool:
    """Whether a process runs: it exists, is no zombie, and (if given) started then.

    A process whose main thread has ended while other threads of it are still
    ending (``/proc/PID/stat`` says "Z" then, for some milliseconds on a busy
    machine) still runs: it still holds its files and sockets.

    Args:
        pid (int): the process.
        started (int | None): its start time as `start_time` gave it, to tell a
            pid reused by another process apart; ``None`` not to check.

    Returns:
        bool: ``True`` while it runs. Without /proc: whether ``os.kill(pid, 0)``
        finds it.
    """
    stat = stat_fields(pid)
    if stat is not None:
        if stat[0] == "X" or (started is not None and int(stat[19]) != started):
            return False
        if stat[0] == "Z":
            try:
                return len(os.listdir(f"/proc/{pid}/task")) > 1  # threads still ending
            except OSError:
                return False
        return True
    if os.path.isdir("/proc/self"):
        return False  # /proc works, so the process is gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _start_watchdog() -> None:
    """Start this process's watchdog thread (once): see the module's docstring.

    Also silences the finalizers' errors of its teardown (`_quiet_teardown`).
    """
    global _watchdog_started
    with _WINDOW:
        if _watchdog_started or _RUN_HOST is None or os.getpid() == _RUN_HOST[0]:
            return
        _watchdog_started = True
    _quiet_teardown()
    watched = [_RUN_HOST]
    # The admin's parent is a starter process that exits as soon as it has forked it.
    if multiprocessing.current_process().name != "ThespianAdmin":
        parent = os.getppid()
        watched.append((parent, start_time(parent)))
    with signals_blocked():
        threading.Thread(target=_watch, args=(watched,), name="mujou-run-watchdog",
                         daemon=True).start()


@contextlib.contextmanager
def signals_blocked() -> Iterator[None]:
    """Threads started inside this block get no signals; the main thread gets them all.

    Thespian's actors learn of a dead child from SIGCHLD, and of a shutdown
    from SIGTERM, only if the signal wakes their main thread, blocked in
    ``select``: Linux gives a process's signal to any thread that does not
    block it, and one given to another Python thread just waits until the
    main thread wakes for some other reason (seconds, or never). A new thread
    inherits the signal mask of the thread that starts it, so the mask is set
    around the start and put back.
    """
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _watch(watched: list[tuple[int, int | None]]) -> None:
    """The watchdog's loop: end this process once one of ``watched`` is gone.

    ``watched[0]`` is the host: when it is gone, the run's folder goes too.
    """
    while all(alive(pid, started) for pid, started in watched):
        time.sleep(WATCH_PERIOD)
    try:
        if _RUN_FOLDER and not alive(*watched[0]):
            # Killed before the coordinator learnt the folder (or with it): the
            # host cannot remove it now; whoever of its run sees it first does.
            remove_folder(_RUN_FOLDER)
        # to the main thread, which Thespian's loop runs on (a signal to the
        # process may go to any thread that does not block it)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
        time.sleep(EXIT_GRACE)
    finally:
        sys.stderr.flush()
        os._exit(70)


def _quiet_teardown() -> None:
    """In a process of a run: print no error of a finalizer during the interpreter's teardown.

    Objects freed while the interpreter clears its modules (more of them after
    ``gc.freeze``) run finalizers that find their module's names gone
    (Thespian's ``TCPTransport.__del__``, torch's library finalizers) and
    raise ``TypeError: 'NoneType' object is not callable``, which Python would
    print as "Exception ignored in ...". Nothing can act on them then; other
    unraisable errors, before the teardown, are printed as usual.
    """
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not sys.is_finalizing():
            previous(unraisable)

    sys.unraisablehook = hook


UNTRUSTED_PERIOD = timedelta(seconds=10)  # for a connection to send a frame's valid header
MAX_UNTRUSTED = 32  # connections at once that have not sent one yet (the oldest closed first)


def _rebound(fn: Any, namespace: dict[str, Any]) -> Any:
    """A copy of Thespian's function ``fn`` that looks its global names up in ``namespace``."""
    copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__,
                              fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    copy.__doc__ = fn.__doc__
    return copy


def _rebound_members(cls: type, namespace: dict[str, Any]) -> dict[str, Any]:
    """Every function, static and class method of ``cls`` itself, `_rebound` to ``namespace``."""
    members: dict[str, Any] = {}
    for name, value in vars(cls).items():
        if isinstance(value, types.FunctionType):
            members[name] = _rebound(value, namespace)
        elif isinstance(value, (staticmethod, classmethod)):
            members[name] = type(value)(_rebound(value.__func__, namespace))
    return members


def _incoming_class(base: type, namespace: dict[str, Any]) -> type:
    """Thespian's incoming connection ``base``, with authenticated frames and a short leash.

    Until a frame's header passes its check (`_frames.AuthReceiveBuffer`), a
    connection may live `UNTRUSTED_PERIOD` (Thespian's own bound is 7 minutes);
    after that, Thespian's bound.
    """
    init = _rebound(_tcp.TCPIncoming_Common.__init__, namespace)

    def __init__(self: Any, rmtAddr: Any, baseSock: Any, rcvBuf: Any = None) -> None:  # noqa: N803
        init(self, rmtAddr, baseSock, rcvBuf)
        self.opened = time.monotonic()
        self.trusted = bool(getattr(self._rData, "trusted", False))
        if not self.trusted:
            self._expires = ExpirationTimer(UNTRUSTED_PERIOD)

    def addData(self: Any, newData: Any) -> None:  # noqa: N802, N803 (Thespian's names)
        self._rData.addMore(newData)
        if not self.trusted and self._rData.trusted:
            self.trusted = True
            self._expires = ExpirationTimer(_tcp.MAX_INCOMING_SOCKET_PERIOD)

    thespians_delay = base.delay  # type: ignore[attr-defined]  # Thespian's, untyped

    def delay(self: Any, current_time: Any = None) -> Any:
        # Thespian's loop leaves a zero delay out of its wait, and a connection's time
        # runs out between the loop's look at the timers (the run's `_handlePossible
        # Incoming`, after the wait) and its next reading of them (before the next
        # wait): one that ran out in that gap was waited for no more and kept open
        # until some other event came (1 stranger in 240 in a loaded CI run). An
        # untrusted connection's delay is never zero, so the loop wakes once more
        # for it, and it is closed then.
        left = thespians_delay(self, current_time)
        return left if left or self.trusted else _AT_ONCE

    return type(base.__name__, (base,), {"__init__": __init__, "addData": addData,
                                         "delay": delay, "__module__": __name__})


_AT_ONCE = timedelta(microseconds=1)  # the least wait Thespian's loop does not leave out


class _RunTransport:
    """What the transport of a run adds to Thespian's: addresses, a watchdog, a cap, a quick end.

    Mixed into the classes `transport_for` makes, before Thespian's own
    ``TCPTransport`` (whose functions those classes hold rebound to the
    run's frames).
    """

    host: str = LOOPBACK  # the address every socket of it is bound to (or ANY)
    key: bytes = b""  # the control plane's key (`_frames`)
    auth: Any = None  # the `_frames.FrameAuth` of that key
    # In the host, while it starts an admin: the admin's listening socket
    # (`reserve_listener`), handed over with the admin's endpoint (`prepEndpoint`).
    listener: socket.socket | None = None
    handed = False  # whether an admin's endpoint carried ``listener`` already

    def __init__(self, initType: Any, *args: Any) -> None:  # noqa: N803 (Thespian's name)
        with loopback_addresses(self.host), _adopting(getattr(initType, "listener", None)):
            super().__init__(initType, *args)  # type: ignore[call-arg]
        _start_watchdog()

    def prepEndpoint(self, assignedLocalAddr: Any, capabilities: Any) -> Any:  # noqa: N802, N803
        """Thespian's endpoint of a new process; the admin's carries its listening socket.

        Args:
            assignedLocalAddr (Any): the new process's address (the admin's, or local).
            capabilities (Any): the system's capabilities.

        Returns:
            Any: Thespian's ``TCPEndpoint``, with ``listener`` set for the admin
            (pickled into the admin's spawn pipe as a passed file descriptor).
        """
        endpoint = super().prepEndpoint(assignedLocalAddr, capabilities)  # type: ignore[misc]
        if self.listener is not None and endpoint.args[1] is not None \
                and endpoint.args[1] == self._adminAddr:  # type: ignore[attr-defined]
            endpoint.listener = self.listener
            type(self).handed = True
        return endpoint

    def probeAdmin(self, addr: Any) -> bool:  # noqa: N802 (Thespian's name)
        """Whether an admin may run at ``addr``: not before ``listener`` was handed to ours.

        Thespian starts an admin only where binding its port fails; the port of
        ``listener`` is taken by this process itself until an admin has it.

        Args:
            addr (Any): the admin's address.

        Returns:
            bool: False (start one) while ``listener`` was not handed over yet;
            else Thespian's probe (True once ours was started: wait for it).
        """
        if self.listener is not None and not self.handed:
            return False
        return bool(super().probeAdmin(addr))  # type: ignore[misc]

    @classmethod
    def getAdminAddr(cls, capabilities: dict[str, Any]) -> Any:  # noqa: N802 (Thespian's name)
        """The admin's address, on the transport's host (127.0.0.1).

        Args:
            capabilities (dict[str, Any]): the system's capabilities (its admin port).

        Returns:
            Any: a Thespian ``ActorAddress``.
        """
        with loopback_addresses(cls.host):
            return TCPTransport.getAdminAddr(capabilities)

    def _acceptNewIncoming(self) -> None:  # noqa: N802 (Thespian's name)
        """Accept a connection (Thespian's), then close the oldest beyond `MAX_UNTRUSTED`.

        A connection that has not sent a valid frame header is untrusted;
        more than `MAX_UNTRUSTED` at once (a flood, slow clients) close the
        oldest, counted as refusals.
        """
        super()._acceptNewIncoming()  # type: ignore[misc]
        sockets = self._incomingSockets  # type: ignore[attr-defined]
        untrusted = sorted((inc.opened, fd) for fd, inc in sockets.items()
                           if not getattr(inc, "trusted", True))
        for _, fd in untrusted[:max(len(untrusted) - MAX_UNTRUSTED, 0)]:
            sockets.pop(fd).close()
            self.auth.refuse("too many connections that have not authenticated")

    def _handlePossibleIncoming(self, incomingSocket: Any, fileno: int,  # noqa: N802, N803
                                *args: Any, **kwargs: Any) -> Any:
        """Thespian's handling of an incoming connection, but an untrusted one past its time.

        Thespian keeps a connection whose time is up while reads of it only
        say "nothing yet" (up to 20 tries, backing off); one that has not
        proved the key in `UNTRUSTED_PERIOD` is closed at once.

        "Up" is decided by Thespian's own reading of the connection's timer
        (a ``timedelta``, so less than half a microsecond left reads as none),
        as its loop reads it; while the connection is open that loop still
        wakes for it (its ``delay`` is never zero: `_incoming_class`), so one
        that sends nothing is closed at the next wake-up, not kept until some
        other event woke the process (tests caught one kept for minutes).
        """
        if (not getattr(incomingSocket, "trusted", True) and incomingSocket.socket is not None
                and not incomingSocket._expires.view().remaining()):
            incomingSocket.close()
            self.auth.refuse(f"no valid frame within {UNTRUSTED_PERIOD.total_seconds():g} s")
            return None
        return super()._handlePossibleIncoming(  # type: ignore[misc]
            incomingSocket, fileno, *args, **kwargs)

    def abort_run(self, drain: bool = False) -> Any:
        """End the transport's run loop; in a process of a run, also make its end quick.

        Thespian calls it only when the process's actor (or the admin) is
        ending. With torch loaded, the interpreter's last garbage collections
        take about 0.4 s; objects frozen by ``gc.freeze`` are skipped by them
        (they are still finalized as their references go, and the streams
        flushed; only reference cycles are left to the operating system).
        Not in the host, whose transport Thespian also aborts after a failed send.

        Args:
            drain (bool): let the pending sends go out first (Thespian's meaning).

        Returns:
            Any: what Thespian's ``abort_run`` returns.
        """
        if _RUN_HOST is not None and os.getpid() != _RUN_HOST[0]:
            gc.freeze()
        return super().abort_run(drain)  # type: ignore[misc]

    def external_transport_clone(self) -> Any:
        """The transport a host thread uses to create an actor, on 127.0.0.1 too.

        Returns:
            Any: a new transport of this class sharing this one's admin.
        """
        return type(self)(ExternalTransportCopy(), self._adminAddr,  # type: ignore[attr-defined]
                          self.txOnly, False)  # type: ignore[attr-defined]


def transport_for(host: str, key: bytes, listener: socket.socket | None = None,
                  folder: str | None = None) -> type[TCPTransport]:
    """A transport class of a run: its sockets bound to ``host``, its frames under ``key``.

    Thespian's ``TCPTransport`` with every function of its module's that
    makes or reads a frame (its ``serializer``, its receive buffers and
    incoming connections) looking up the run's `_frames.FrameAuth` instead
    of ``pickle``: its functions are copied with a namespace of their own
    (Thespian has no hook for a serializer), so Thespian's module, and any
    stock Thespian system of the same process, are left as they are.

    Args:
        host (str): an IPv4 address of this machine, or `ANY` (every interface,
            the machine's outward address advertised, as Thespian's own
            transport does). Nothing is checked here (see
            `mujou_actors.distributed.convention` for who may listen where).
        key (bytes): the control plane's key (`_frames.new_key` for a run on
            one machine, `_frames.control_key` of ``MUJOU_SECRET`` across machines).
        listener (socket.socket | None): the listening socket of the admin this
            class's system starts (`reserve_listener`); it stays in this
            process (the class pickles without it).
        folder (str | None): the host's private folder of the run, which the
            watchdog of each process the run starts removes when it finds the
            host gone (see the module's docstring); None: none.

    Returns:
        type[TCPTransport]: a new class (it pickles, for a process the run
        starts, as this file run anew with ``host`` and ``key``).
    """
    auth = _frames.FrameAuth(key)
    namespace = dict(vars(_tcp))
    namespace["serializer"] = auth
    namespace["socket"] = _sockets
    namespace["ReceiveBuffer"] = lambda _deserialize: _frames.AuthReceiveBuffer(auth)
    namespace["TCPIncoming"] = _incoming_class(_tcp.TCPIncoming, namespace)
    namespace["TCPIncomingPersistent"] = _incoming_class(_tcp.TCPIncomingPersistent, namespace)
    thespian = type("_ThespianTCP", (TCPTransport,), {**_rebound_members(TCPTransport, namespace),
                                                      "__module__": __name__})
    name = "LoopbackTCPTransport" if host == LOOPBACK else "BoundTCPTransport"
    return cast(type[TCPTransport], _PickledByPath(
        name, (_RunTransport, thespian),
        {"host": host, "key": key, "auth": auth, "listener": listener, "folder": folder,
         "__module__": __name__,
         "__doc__": f"Thespian's TCP transport of a run, bound to {host}, frames authenticated."}))


# In a process of a run (this file run by `_RunThisFile`): the run's transport class.
_RUN_TRANSPORT = transport_for(_BIND, _KEY, folder=_RUN_FOLDER) if _KEY is not None else None


class Wake:
    """A self-pipe that wakes a thread waiting in a `zmq.Poller` or ``select``.

    Readable once `set`, until `clear`. The data plane's waiter in real time
    (`mujou_actors.distributed.dataplane`, the driver and each group) and the
    heartbeat's threads (their stop, the Monitor's notice of changes) poll
    one. `set` may be called from any thread (a worker after a send) and costs
    one ``os.write`` only when the waiter has not been woken since its last
    `clear`. Once closed, `set` and `clear` do nothing.
    """

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._set = False
        self._lock = threading.Lock()

    def fileno(self) -> int:
        """int: the file descriptor to poll, the read end (readable once woken)."""
        return self._r

    def set(self) -> None:
        """Wake the waiter: make the read end readable (idempotent until `clear`)."""
        if self._set:
            return
        with self._lock:
            self._write()

    def poke(self) -> None:
        """`set`, but never waiting: skipped while another `set` or the waiter's `clear`
        holds the lock (the first wakes the waiter anyway; after the second the waiter
        looks for work). For a caller that may run inside either on the same thread: a
        weak reference's callback that a garbage collection runs (`wire.Decoder.on_freed`).
        """
        if self._set or not self._lock.acquire(blocking=False):
            return
        try:
            self._write()
        finally:
            self._lock.release()

    def _write(self) -> None:
        """Under the lock: make the read end readable unless it is already."""
        if not self._set:
            self._set = True
            try:
                os.write(self._w, b"\0")
            except OSError:
                pass  # full: readable anyway; closed: nobody polls it any more

    def clear(self) -> None:
        """Read everything written so far; called by the waiter before it looks for work,
        so that later `set` calls wake it again."""
        with self._lock:
            self._set = False
            try:
                while os.read(self._r, 4096):
                    pass
            except OSError:
                pass  # empty now (BlockingIOError), or closed

    def close(self) -> None:
        """Close both ends; idempotent. Under the lock, the numbers forgotten first: a
        `set` meanwhile must not write to a descriptor number opened again since."""
        with self._lock:
            fds, self._r, self._w = (self._r, self._w), -1, -1
            self._set = True  # `set` returns at once from now on
        for fd in fds:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
