"""Every exception the framework raises, under one base class.

The family is split by meaning, as in Trio: misuse of the API (``PortTypeError``,
plus plain ``ValueError``/``TypeError`` for bad settings), a node's failure
(``NodeError``), bad data (``SnapshotError``, ``RecordingError``; ``WireError``
on the data plane between processes), the data plane between machines (``SecretError``,
``HandshakeError``), time (``StartTimeoutError``,
``StopTimeoutError``; ``JoinTimeoutError``, members of a convention that did
not join), the CUDA driver (``SyncModeError``, also
``mujou.cuda.SyncModeError``) and the processes of a placed run (``GroupDied``;
``RemoteError``, the control plane's). `describe` formats any exception for a
message (`reason`: its message alone); `keep_end_failure` adds a failure found
as a run ends to its own.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any

__all__ = [
    "MujouError",
    "PortTypeError",
    "NodeError",
    "AlgebraicLoopError",
    "ParamError",
    "SnapshotError",
    "RecordingError",
    "StartTimeoutError",
    "StopTimeoutError",
    "NotRunningError",
    "NetError",
    "CallbackError",
    "SyncModeError",
]
# RemoteError and JoinTimeoutError (below) are not in __all__: the control plane's, not
# public API (tests/test_public_api.py: a public module's __all__ lists public names).
# MessageChangedError and DeadlineMissError neither: they reach users as a NodeError's
# __cause__.


class MujouError(Exception):
    """Base class of every exception defined by mujou_actors."""


class PortTypeError(MujouError, TypeError):
    """A message, or a connection, does not match a port's declared type.

    Raised by `mujou_actors.connect` when an Output's type cannot feed an
    Input, and by ``Output.send``, ``Run.write`` and ``run(inputs=...)`` when a
    value does not match. The message names the port path, what was expected and
    what was got. It is a ``TypeError``, so ``except TypeError`` catches it too.
    """


class NodeError(MujouError):
    """A hook of a node raised; the run that ran it has stopped.

    Also what ``Run.state_dict()`` raises when a node's ``state_dict`` raised
    (hook ``"state_dict"``); that run goes on. The original exception is the
    ``__cause__``.

    Attributes:
        path (str): dotted path of the failed node (``""`` for the root).
        hook (str): name of the hook that raised (``"on_update"``, ...).
        failures (list[NodeError]): every failure the run saw, in order; the
            first is this error itself. Later ones (for example an ``on_stop``
            that raised while the run was ending) are also logged.
    """

    def __init__(self, path: str, hook: str, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.hook = hook
        self.failures: list[NodeError] = [self]

    @classmethod
    def from_hook(cls, path: str, hook: str, exc: BaseException) -> NodeError:
        """The error reporting that ``exc`` came out of the hook ``hook`` of a node.

        Args:
            path (str): the node's dotted path (``""`` for the root).
            hook (str): the hook's name (``"on_update"``, ``"state_dict"``, ...).
            exc (BaseException): what the hook raised; becomes the ``__cause__``.

        Returns:
            NodeError: "node 'path' raised in hook: Type: message", whatever
            ``exc``'s own ``__str__`` does.
        """
        err = cls(path, hook, f"node {path or '<root>'!r} raised in {hook}: {describe(exc)}")
        err.__cause__ = exc
        return err


class AlgebraicLoopError(NodeError, RuntimeError):
    """One instant took more than ``max_delta_cycles`` delta cycles: an algebraic loop.

    Nodes that trigger one another with no delay (an *algebraic loop*: the
    plant triggered by the command, the controller by the state) run delta
    cycles at one instant for as long as they keep sending: simulated time
    never advances; in real time their updates stay due at that instant
    (a triggered update is due when its cause was) and run back to back.
    ``mujou.run`` warns of every such ring of triggering Inputs when it
    starts; an instant past ``max_delta_cycles`` stops the run
    with this error, which ``join()`` and the ``with`` block raise as they
    raise a node's failure (it is a ``NodeError``, and a ``RuntimeError``).

    Attributes:
        nodes (list[str]): paths of the nodes of the loop, those that updated
            in its last delta cycles and those of the ring found before the start.
        loop (str): the ring's connections in words (``""`` if none was found).
        time_ns (int): the instant, ns of the run's timer.
        delta (int): the delta cycle the run had reached at that instant (real
            time: the depth of the chain of triggered updates, see
            `policy.TimePolicy.delta_step`).
        path (str): the first of ``nodes``; hook: ``"on_update"``.
    """

    def __init__(self, nodes: list[str], time_ns: int, delta: int, loop: str = "",
                 group: str = "") -> None:
        names = ", ".join(repr(p or "<root>") for p in nodes) or "?"
        ring = f" (the ring: {loop})" if loop else ""
        where = f" in group {group!r}" if group else ""
        super().__init__(
            nodes[0] if nodes else "", "on_update",
            f"algebraic loop: nodes {names} triggered one another for {delta} delta cycles "
            f"at the instant t = {time_ns} ns ({time_ns / 1e9:g} s of the run's timer)"
            f"{where}{ring}; the instant never ends. Give one node a period, or make one "
            f"of the Inputs trigger=False (or raise mujou.run(max_delta_cycles=))")
        self.nodes = list(nodes)
        self.loop = loop
        self.time_ns = time_ns
        self.delta = delta

    def __reduce__(self) -> tuple[Any, ...]:
        return (_algebraic_loop, (self.nodes, self.time_ns, self.delta, self.loop, str(self)))


def _algebraic_loop(nodes: list[str], time_ns: int, delta: int, loop: str,
                    message: str) -> AlgebraicLoopError:
    """`AlgebraicLoopError` rebuilt with its message as it was (pickling)."""
    err = AlgebraicLoopError(nodes, time_ns, delta, loop)
    err.args = (message,)
    return err


class MessageChangedError(MujouError, RuntimeError):
    """A node changed a message it received in place (``mujou.run(check_read_only=True)``).

    Messages are read-only: every reader of an Output gets the same object,
    so a reader that changes it in place (``x += 1`` or ``x[0] = 0`` on a
    tensor or a numpy array, ``m.append(...)`` on a list, ``m["k"] = v`` on a
    dict, ``m.field = v`` on a dataclass) changes what the other readers see.
    With ``check_read_only=True`` the run compares, before and after the
    reader's ``on_update``, each received tensor's version counter
    (``tensor._version``, moved by every in-place operation) and every other
    message's fingerprint (its pickle bytes); one that differs fails the
    node with this error as the `NodeError`'s ``__cause__``, naming the node
    and its Input. Copy first (``x = x.clone()``, ``copy.deepcopy(m)``,
    ``a.copy()``) or build a new value.

    Attributes:
        path (str): dotted path of the node that changed the message.
        port (str): dotted path of the Input that received it.
        kind (str): what was changed: ``"tensor"``, or the message's type
            (``"list"``, ``"dict"``, ``"numpy.ndarray"``, ``"mymodule.Pose"``).
    """

    def __init__(self, path: str, port: str, kind: str = "tensor") -> None:
        if kind == "tensor":
            text = (f"node {path or '<root>'!r} changed a tensor received on {port!r} in "
                    "place in on_update; messages are read-only (every reader of the Output "
                    "gets the same tensor): clone it first (x = x.clone()) or use an "
                    "out-of-place operation")
        else:
            text = (f"node {path or '<root>'!r} changed a {kind} received on {port!r} in "
                    "place in on_update; messages are read-only (every reader of the Output "
                    f"gets the same {kind}): change a copy (copy.deepcopy(message), or "
                    "array.copy() for a numpy array) or build a new value")
        super().__init__(text)
        self.path = path
        self.port = port
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.port, self.kind))


class DeadlineMissError(MujouError, RuntimeError):
    """A node with ``on_miss="stop"`` missed its budget or deadline (real time).

    The node fails with it (the `NodeError` that ``join()`` raises has it as
    its ``__cause__``) and the run stops, whatever the supervisor's
    ``restart``: restarting a node that is too slow would only miss again.
    An update still running at its deadline fails the node then, not when it
    returns (``miss.running``). In a placed run the error stays in its group
    process: ``join()``'s `NodeError` has a ``RemoteTraceback`` whose
    ``type_name`` is ``"DeadlineMissError"`` as its cause.

    Attributes:
        miss (mujou_actors.DeadlineMiss): the node, the update's due time,
            its measured CPU and finish times, the budget and the deadline.
    """

    def __init__(self, miss: Any) -> None:
        super().__init__(f"{miss} (on_miss='stop')")
        self.miss = miss

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.miss,))


class ParamError(MujouError, ValueError):
    """A parameter set was refused: no such parameter, or a value that breaks one of its rules.

    Raised by `Run.set_param`, ``mujou run --param``, a node's own attribute
    write and `Param.parse` (and sent back to a client of the attach endpoint
    or of Foxglove's Parameters panel) before anything changes.

    Attributes:
        param (str): what was set, e.g. ``"parameter 'sensor.noise'"``.
        rule (str): the rule it breaks, in words (its type, range, choices,
            read-only), or which parameters there are.
    """

    def __init__(self, param: str, rule: str) -> None:
        super().__init__(f"{param}: {rule}")
        self.param = param
        self.rule = rule

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.param, self.rule))


class SnapshotError(MujouError):
    """A snapshot file or state tree is truncated, corrupted, foreign or too new."""


class RecordingError(MujouError):
    """A recording (an MCAP file) that is not MCAP, not mujou's, or damaged.

    Raised by the readers of ``mujou_actors.recording.mcapfile``, and so by every public
    way of reading a recording or a crash capsule (``mujou.run(replay=)``,
    ``reproduce_failure``, ``assert_replay_matches``, ``mujou inspect
    FILE.mcap``, ``mujou replay``), for every file that does not read: a
    checksum that does not match, a record past its bounds or the reader's
    limits, a capsule's facts of the wrong shape (docs/recording.md,
    "Untrusted files"). A file cut short by a crash is not an error: it reads
    up to its last complete record. The message names the file, what is wrong
    and, where known, the offset of the record where it broke.

    Attributes:
        path (str): the file.
        reason (str): what is wrong, in words.
        offset (int | None): the offset (bytes) of the record that does not
            read, None when not known.
    """

    def __init__(self, path: str, reason: str, offset: int | None = None) -> None:
        where = "" if offset is None else f" (the record at byte {offset})"
        super().__init__(f"{path}: {reason}{where}")
        self.path = path
        self.reason = reason
        self.offset = offset

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (across processes) with the arguments it is made from, not its message.
        return (type(self), (self.path, self.reason, self.offset))


class WireError(MujouError, ValueError):
    """Frames of the data plane between group processes that do not decode.

    Raised by ``mujou_actors.distributed.wire.Decoder.decode`` for frames that
    are not a batch of port messages, are truncated or damaged, or name shared
    memory that is gone; the message says which, and where. Not in
    ``__all__``: the data plane's own, not raised by the public API.
    """


class SecretError(MujouError, ValueError):
    """The shared secret of the data plane between machines is missing or unfit.

    Raised by ``mujou_actors.distributed.secret.load_secret``: no secret set
    (the message says how to set one), both ``MUJOU_SECRET`` and
    ``MUJOU_SECRET_FILE`` set, a secret file missing, unreadable or open to
    its group or others, a secret too short. The message names the variable
    or the file and what was expected. Not in ``__all__``: the data plane's own.
    """


class HandshakeError(MujouError, ConnectionError):
    """An authenticated data-plane connection between machines was refused or never made.

    Raised by ``mujou_actors.distributed.secret.Handshake.wait`` (and the data
    plane's links over TCP): the connecting side's CURVE handshake failed (the
    server holds another secret, or no CURVE at all), or no handshake
    succeeded within the bound (the listening side's message then says how
    many connections it refused, and why: a connection without the secret is
    never an error on its own there). Not in ``__all__``: the data plane's own.

    Attributes:
        address (str): the endpoint concerned (``tcp://HOST:PORT``).
        reason (str): what happened, in words (``... the secrets differ``).
        server (bool): whether this side was the CURVE server (it bound).
    """

    def __init__(self, address: str, reason: str, *, server: bool) -> None:
        side = "accepting on" if server else "connecting to"
        super().__init__(f"data plane {side} {address}: {reason}")
        self.address = address
        self.reason = reason
        self.server = server

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (a group's own refusal crosses to the host) with what it is made from.
        return (functools.partial(type(self), server=self.server), (self.address, self.reason))


class AttachError(MujouError, OSError):
    """A running net's local endpoint cannot be used (``mujou ls``, ``echo``, ``hz``...).

    Raised by ``mujou_actors.attach``: the runtime folder is unsafe (not a
    folder, owned by another user, open to others), no running net matches
    the RUN given (or several do), the run has ended, or it answered with an
    error (no such port). The message says which, in words. Not in
    ``__all__``: the ``mujou`` commands' own.
    """


class StartTimeoutError(MujouError, TimeoutError):
    """Nodes had not finished ``on_start`` (or the restore) when ``start_timeout`` ran out.

    Raised by `mujou_actors.run`. The run was stopped first: the nodes whose
    ``on_start`` had returned got their ``on_stop``, and the net was released,
    so its nodes may be run again. A node still inside its hook is left
    behind on its thread (a daemon thread), as at a stop that times out.

    Attributes:
        stuck (dict[str, str]): node path -> name of the hook it is stuck in
            (``"on_start"``, or ``"load_state_dict"`` for a restore).
        not_started (list[str]): paths of the nodes whose hook never began
            (queued behind a stuck one), in the net's order.
        timeout (float): the ``start_timeout`` that ran out, seconds.
    """

    def __init__(self, stuck: dict[str, str], not_started: list[str], timeout: float) -> None:
        parts = []
        if stuck:
            names = ", ".join(f"{p or '<root>'!r} in {h}" for p, h in stuck.items())
            parts.append(f"still running: {names}")
        if not_started:
            parts.append("never started: " + ", ".join(repr(p or "<root>") for p in not_started))
        super().__init__(f"start timed out after {timeout:g} s: {'; '.join(parts)}")
        self.stuck = stuck
        self.not_started = not_started
        self.timeout = timeout

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle with the constructor's arguments (a placed run's group raises it too)."""
        return (type(self), (self.stuck, self.not_started, self.timeout))


class StopTimeoutError(MujouError, TimeoutError):
    """Nodes were still inside a hook when ``stop_timeout`` ran out.

    Their threads are left behind (they are daemon threads) and their
    ``on_stop`` is not run, since it would overlap the hook still running.

    Attributes:
        stuck (dict[str, str]): node path -> name of the hook it is stuck in.
    """

    def __init__(self, stuck: dict[str, str], timeout: float) -> None:
        names = ", ".join(f"{p or '<root>'!r} in {h}" for p, h in stuck.items())
        super().__init__(f"stop timed out after {timeout} s: still running: {names}")
        self.stuck = stuck


class NotRunningError(MujouError, RuntimeError):
    """A port was used outside a running net, or from the wrong node."""


class NetError(MujouError, ValueError):
    """The net given to ``mujou.run`` is not valid.

    For example: a node reachable under two paths, a port connected to a node
    outside the net, a node already running in another run, or a node whose
    ``__init__`` did not call ``super().__init__()``.
    """


class CallbackError(MujouError):
    """A host callback given to ``Run.subscribe`` raised; the run has stopped.

    The original exception is the ``__cause__``.
    """


class GroupDied(MujouError):
    """A group process of a placed run ended unasked (killed, crashed, ``os._exit``).

    Also what the control plane (`mujou_actors.distributed.system.ProcessSystem`)
    raises for a request to a group whose process is gone, or goes while the
    request waits, and from ``start_group`` when the process ended before its
    server was built.

    Attributes:
        group (str): the group's name.
        pid (int | None): its process id (``None`` if it ended before it was known).
        reason (str): how it ended, as far as the host could learn.
    """

    def __init__(self, group: str, pid: int | None, reason: str) -> None:
        where = f" (pid {pid})" if pid is not None else ""
        super().__init__(f"group {group!r}{where} died: {reason}")
        self.group = group
        self.pid = pid
        self.reason = reason


class SyncModeError(MujouError, RuntimeError):
    """The CUDA scheduling flag could not be read or set.

    Raised by `mujou_actors.cuda.set_sync_mode` when the device's primary
    context is already active with another mode (the mode must be chosen
    before the first CUDA use in the process), when the value read back from
    the driver is not the one asked for, when there is no CUDA driver or
    device, and when a driver call fails (the message names the call and the
    ``CUresult`` code, as named by ``cuGetErrorName``); also by
    `mujou_actors.cuda.get_sync_mode`. It is a ``RuntimeError``. Import it as
    ``mujou.cuda.SyncModeError``.

    Attributes:
        device (int | None): the device ordinal concerned, or ``None`` when the
            error is not about one device (no driver, no device).
        current (str | None): the mode in effect on that device when known.
    """

    def __init__(self, message: str, *, device: int | None = None,
                 current: str | None = None) -> None:
        super().__init__(message)
        self.device = device
        self.current = current


class RemoteError(MujouError):
    """Code in a group process of a placed run raised; the process goes on.

    Raised in the host by `mujou_actors.distributed.system.ProcessSystem`:
    by ``start_group`` when the group's target cannot be imported or raised,
    by ``ask`` when the server's ``handle`` raised, by ``stop_group`` when its
    ``close`` raised (the process has ended then). The message names the group
    and what raised; the remote traceback, as text, is added as a note (so a
    printed traceback shows it) and kept in ``remote_traceback``. When the
    original exception pickles and unpickles, it is ``exception`` and the
    ``__cause__``.

    Attributes:
        group (str): the group whose process raised.
        type_name (str): qualified class name of the remote exception.
        remote_traceback (str): the formatted traceback, in the group's process.
        exception (BaseException | None): the remote exception, if it crossed.
    """

    def __init__(self, message: str, *, group: str, type_name: str, remote_traceback: str,
                 exception: BaseException | None = None) -> None:
        super().__init__(message)
        self.group = group
        self.type_name = type_name
        self.remote_traceback = remote_traceback
        self.exception = exception
        if remote_traceback:
            self.add_note(f"Remote traceback (group {group!r}):\n{remote_traceback.rstrip()}")
        if exception is not None:
            self.__cause__ = exception


class JoinTimeoutError(MujouError, TimeoutError):
    """Members a convention's leader waited for had not joined it within the join timeout.

    Raised by `mujou_actors.distributed.convention.wait_for_members` (and so
    before any node of a run placed on them starts). The message names the
    names missing and the members the leader knows. It is a ``TimeoutError``:
    a member may only be late (started later, or slow to start), or may never
    come (a misspelt name).

    Attributes:
        missing (tuple[str, ...]): the names no member had, sorted.
        known (dict[str, dict[str, Any]]): the members the leader knew at the
            end, name -> capabilities.
        leader (str): the leader's address, ``"host:port"``.
        timeout (float): the join timeout, in seconds.
    """

    def __init__(self, missing: tuple[str, ...], known: dict[str, dict[str, Any]],
                 leader: str, timeout: float) -> None:
        names = ", ".join(repr(name) for name in missing)
        members = ", ".join(repr(name) for name in sorted(known)) or "none"
        super().__init__(f"no member named {names} joined the convention of the leader at "
                         f"{leader} within {timeout:g} s (the members it knows: {members})")
        self.missing = missing
        self.known = known
        self.leader = leader
        self.timeout = timeout


def describe(exc: BaseException) -> str:
    """``"Type: message"`` of an exception, for error messages, logs and traces.

    Never raises, whatever the exception object does: its ``__str__`` may
    raise (any BaseException), or return something that is not a ``str``, or
    a ``str`` subclass with methods of its own (never called here). The
    message then says that ``__str__`` raised, so reporting a failure can
    never lose it. ``__repr__`` is not called.

    Args:
        exc (BaseException): any exception.

    Returns:
        str: the type's name, then ``": "`` and the message when there is one.
    """
    try:
        name = type(exc).__name__
        if type(name) is not str:
            name = "<exception>"
    except BaseException:  # noqa: BLE001 - a metaclass may make even this raise
        name = "<exception>"
    broken = f"<{name}.__str__ raised>"
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - a broken __str__ must not hide the failure
        text = broken
    if type(text) is not str:  # a str subclass: a plain copy (formatting it would call it)
        text = str.__str__(text) if isinstance(text, str) else broken
    return f"{name}: {text}" if text else name


def reason(exc: BaseException) -> str:
    """An exception's message alone, never empty: for a message that says what went wrong.

    Unlike `describe`, no type name before a message (``"bad length"``, not
    ``"ValueError: bad length"``): for the reasons the codec, the snapshot
    files, the recordings and the data plane give for bytes that do not read.

    Args:
        exc (BaseException): any exception.

    Returns:
        str: ``str(exc)``, or the type's name when that is empty or raises.
    """
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - the type's name is still worth showing
        text = ""
    return text or type(exc).__name__


def keep_end_failure(failures: list[BaseException], exc: BaseException, what: str,
                     lock: Any = None) -> None:
    """Add ``exc``, found as a run ends (a trace or recording not written), to its failures.

    Said once: ``join()`` raises a run's first failure, so a first one is
    said there and not logged too (docs/cli.md: an error the caller reports
    is not logged a second time); one after an earlier failure is never
    raised, so it is logged, naming ``what``, as nothing else would say it.

    Args:
        failures (list[BaseException]): the run's failures, the first the one
            ``join()`` raises.
        exc (BaseException): the failure found.
        what (str): what failed, for the log line (``"could not write the
            trace file t.json"``).
        lock (optional): a lock that guards ``failures``, held while adding.
    """
    with lock if lock is not None else contextlib.nullcontext():
        failures.append(exc)
        raised = failures[0] is exc
    if not raised:
        logging.getLogger("mujou_actors").error(
            "%s: %s (join() raises the run's first failure, not this one)", what, describe(exc))
