"""Typed ports: ``Input``, ``Output``, ``connect`` and the Inputs' QoS buffers.

A port is declared on a node class (a descriptor that gives each node instance
its own port object on first access) or assigned in ``__init__``. This module
knows nothing of threads: while a net runs, each Output's ``send`` is a
function the dispatcher built for that run, and an Input's buffer is only
touched by its node's own hooks, which never overlap. The message types, their
checks and the copy a send makes live in `mujou_actors.messages`.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .errors import NotRunningError, PortTypeError
from .messages import Checker, _make_checker, _mismatch, _Spec

__all__ = ["Input", "Output", "connect"]

log = logging.getLogger("mujou_actors")


# ---------------------------------------------------------------------------
# Ports


class Port:
    """Common part of `Input` and `Output`: type, owner and path.

    A port object declared on a class is a template; each node instance gets
    its own bound copy on first attribute access (a descriptor), so two nodes of
    one class never share a port.
    """

    _kind = "port"

    def __init__(self, type_: Any = object, *, shape: Any = None, dtype: Any = None) -> None:
        label = getattr(type_, "__name__", repr(type_))
        self._spec = _Spec(type_, shape, dtype, f"{type(self).__name__}({label})")
        self._name: str | None = None
        self._owner: Any = None
        self._check: Checker | None = None

    # -- descriptor protocol: one port object per node instance ---------------
    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        bound = self._template_copy()
        bound._bind(instance, self._name or "?")
        instance.__dict__[self._name] = bound
        return bound

    def _template_copy(self) -> Port:
        raise NotImplementedError

    def _bind(self, owner: Any, name: str) -> None:
        if self._owner is not None and self._owner is not owner:
            raise ValueError(
                f"port {self.path!r} already belongs to another node; "
                f"make a new {type(self).__name__} for {type(owner).__name__}.{name}"
            )
        self._owner = owner
        self._name = name
        self._check = _make_checker(self._spec, self)

    # -- identity ---------------------------------------------------------------
    @property
    def name(self) -> str | None:
        """str | None: attribute name of the port on its node (None while unbound)."""
        return self._name

    @property
    def node(self) -> Any:
        """Node | None: the node the port belongs to (None while unbound)."""
        return self._owner

    @property
    def path(self) -> str:
        """str: dotted path ``"node.path.port"`` inside the running net.

        Before the node joins a run its path is not known yet, so the path is
        ``"ClassName.port"``.
        """
        owner = self._owner
        if owner is None:
            return f"<unbound {type(self).__name__}>"
        node_path = getattr(owner, "_mujou_path", None)
        if node_path is None:
            return f"{type(owner).__name__}.{self._name}"
        return f"{node_path}.{self._name}" if node_path else str(self._name)

    @property
    def type(self) -> type:
        """type: the declared message type (``torch.Tensor`` for tensor ports)."""
        return self._spec.type

    @property
    def shape(self) -> tuple[int | None, ...] | None:
        """tuple | None: declared tensor shape, None entries are free dimensions."""
        return self._spec.shape

    @property
    def dtype(self) -> torch.dtype | None:
        """torch.dtype | None: declared tensor dtype."""
        return self._spec.dtype

    def check(self, value: Any) -> Any:
        """Check ``value`` against the port's type.

        Returns:
            The value to deliver (an ``int`` sent on a ``float`` port becomes a
            ``float``).

        Raises:
            PortTypeError: the value does not match; names the port, what was
                expected and what was got.
        """
        check = self._check
        return value if check is None else check(value)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path} {self._spec.describe()}>"


class Input(Port):
    """An input port: a QoS buffer of received messages.

    Args:
        type_ (type): message type: a Python class (``int``, ``float``, ``str``,
            a dataclass, a NamedTuple, ...), ``torch.Tensor``, or ``object`` for
            anything. Default: ``object``.
        shape (tuple[int | None, ...], optional): for tensors, the shape;
            ``None`` marks a free dimension.
        dtype (torch.dtype, optional): for tensors, the dtype.
        depth (int | None): how many messages are kept; when full the oldest is
            discarded. A discarded message that no `read` or `drain` had
            returned is a drop, counted in `drops` and ``run.stats()``; one
            that was read is not. ``None`` keeps all. Default: 1.
        trigger (bool | None): whether a received message triggers an update.
            ``None`` means: iff the node has ``period=None``. Several messages
            that arrive before the triggered update starts give one update.

    Raises:
        TypeError: bad type, shape or dtype; ``depth`` neither None nor an int.
        ValueError: ``depth`` an int below 1.

    Example:
        ```python
        class Controller(Node):
            observation = Input(torch.Tensor, shape=(4,), dtype=torch.float64)
            setpoint = Input(float, depth=1)
        ```
    """

    _kind = "input"
    # Set on the Inputs of a synchronizer (`mujou_actors.sync`): the one that
    # declared it, and, while its node runs, whether each delivery to it is a
    # ``(send time ns, message)`` pair (the stamp the synchronizer matches on).
    # Class attributes: an Input of no synchronizer pays nothing for them.
    _sync: Any = None
    _stamped = False

    def __init__(
        self,
        type_: Any = object,
        *,
        shape: Any = None,
        dtype: Any = None,
        depth: int | None = 1,
        trigger: bool | None = None,
    ) -> None:
        super().__init__(type_, shape=shape, dtype=dtype)
        if depth is not None and type(depth) is not int:  # bool too: a flag is no bound
            raise TypeError(f"Input depth must be an int >= 1 or None, got {depth!r}")
        if depth is not None and depth < 1:
            raise ValueError(f"Input depth must be an int >= 1 or None, got {depth!r}")
        if trigger is not None and not isinstance(trigger, bool):
            raise TypeError(f"Input trigger must be None, True or False, got {trigger!r}")
        self._depth = depth
        self._trigger = trigger
        self._buffer: deque[Any] = deque(maxlen=depth)
        # Drops: messages discarded before any read() or drain() returned
        # them. _drops is counted by the node's own hooks' thread (messages
        # pushed out of the buffer), _lost by whoever bounds the node's
        # mailbox (messages dropped while waiting there, see mailbox.prune),
        # so that neither writes the other's counter.
        self._drops = 0
        self._lost = 0
        self._logged = False
        # What read() has returned, for telling a read message from an unseen
        # one when it is pushed out: _read says read() returned the newest
        # kept message since it came; with depth > 1, _seen holds the numbers
        # (1, 2, ... in arrival order, _count the newest's) of the kept
        # messages read() returned, oldest first (read() only ever returns the
        # newest, so at most one per kept message); made when first needed
        # (an empty deque takes 760 bytes).
        self._read = False
        self._seen: deque[int] | None = None
        self._count = 0
        self._sources: list[Output] = []

    def _template_copy(self) -> Input:
        spec = self._spec
        return Input(spec.type, shape=spec.shape, dtype=spec.dtype,
                     depth=self._depth, trigger=self._trigger)

    @property
    def depth(self) -> int | None:
        """int | None: QoS depth, the number of messages kept (None: unbounded)."""
        return self._depth

    @property
    def trigger(self) -> bool | None:
        """bool | None: the ``trigger`` setting as given (None: follow the period)."""
        return self._trigger

    @property
    def drops(self) -> int:
        """int: messages discarded unseen since the run started.

        A message is discarded when the buffer is full and a newer one comes
        (or, while it waits in the node's mailbox, once ``depth`` newer ones
        wait behind it). It counts as a drop unless a `read` or `drain`
        had returned it: a ``depth=1`` Input whose every message was read
        reports no drops, however often its message is replaced. For an
        Input of a synchronizer (`ExactTime`, `ApproximateTime`), the
        messages its synchronizer dropped without matching them.
        """
        return self._drops + self._lost

    def read(self) -> Any:
        """Return the newest kept message without consuming it.

        Returns:
            The newest kept message, or ``None`` when none is kept (before the
            first message, or after `drain`). Readers share the message
            with the other readers: do not modify it. A message once
            returned here is no longer counted as a drop when a newer one
            replaces it.
        """
        buf = self._buffer
        if buf:
            self._read = True
            return buf[-1]
        return None

    def drain(self) -> list[Any]:
        """Return and consume every kept message, oldest first."""
        buf = self._buffer
        out = list(buf)
        buf.clear()
        self._read = False
        if self._seen:
            self._seen.clear()
        return out

    def __len__(self) -> int:
        """The number of kept messages."""
        return len(self._buffer)

    def __bool__(self) -> bool:
        # A port is always truthy, whatever its length: ``if self.inp:`` would
        # otherwise silently mean "has messages".
        return True

    def _push(self, message: Any) -> None:
        """Keep one message (called by the owning actor before its hook runs)."""
        buf = self._buffer
        depth = self._depth
        if depth == 1:  # the default: one flag says whether the kept one was read
            if buf and not self._read:
                self._count_drops(1)
            self._read = False
        elif depth is not None:
            self._evict(1)
        buf.append(message)

    def _push_many(self, messages: list[Any]) -> None:
        """Keep several messages, oldest first: as many `_push` calls, in one go."""
        buf = self._buffer
        depth = self._depth
        if depth is None:  # keeps everything
            buf.extend(messages)
            return
        if not messages:
            return
        if depth == 1:
            unseen = len(messages) - 1 + (1 if buf and not self._read else 0)
            if unseen:
                self._count_drops(unseen)
            self._read = False
        else:
            self._evict(len(messages))
        buf.extend(messages)  # the deque's maxlen drops the oldest

    def _evict(self, n: int) -> None:
        """Count the drops of pushing ``n`` messages into a buffer of depth > 1.

        Of the messages pushed out (the oldest kept ones first, then the
        oldest of the ``n``), those read() had returned are not drops; the
        ``n`` are new, so none of them was.
        """
        seen = self._seen
        if seen is None:
            seen = self._seen = deque()
        if self._read:  # the newest kept one was read: remember it by number
            seen.append(self._count)
            self._read = False
        kept = len(self._buffer)
        over = kept + n - self._depth  # type: ignore[operator]
        self._count += n
        if over <= 0:
            return
        out = over if over < kept else kept  # kept messages pushed out
        last = self._count - n - kept + out  # the number of the newest of them
        while seen and seen[0] <= last:
            seen.popleft()
            out -= 1
        unseen = over - (over if over < kept else kept) + out
        if unseen:
            self._count_drops(unseen)

    def _count_drops(self, n: int) -> None:
        self._drops += n
        self._log_first_drop()

    def _log_first_drop(self) -> None:
        if not self._logged:
            self._logged = True
            # depth=1 asks for "the newest value": dropping is the intent
            # there, so it is logged at INFO; a deeper queue overflowing
            # means a reader that cannot keep up.
            log.log(
                logging.INFO if self._depth == 1 else logging.WARNING,
                "input %r is full (depth %d): dropping its oldest unread messages; "
                "drops are counted in run.stats()", self.path, self._depth,
            )

    def _reset(self) -> None:
        self._buffer.clear()
        self._drops = self._lost = self._count = 0
        self._logged = self._read = False
        self._seen = None

    def _restore(self, messages: list[Any]) -> None:
        """Replace the kept messages (a restore; not counted as drops).

        A snapshot does not say which kept messages had been read: they count
        as read, so a restored healthy net reports no drops it did not have.
        """
        buf = self._buffer
        buf.clear()
        buf.extend(messages[-self._depth:] if self._depth else messages)
        self._read = bool(buf)
        self._seen = None
        if self._depth is not None and self._depth > 1:
            self._read = False
            self._count = len(buf)
            self._seen = deque(range(1, len(buf) + 1))


class Output(Port):
    """An output port: ``send`` delivers a copy of a message to every connected Input.

    Args:
        type_ (type): message type, as for `Input`. Default: ``object``.
        shape (tuple[int | None, ...], optional): for tensors, the shape.
        dtype (torch.dtype, optional): for tensors, the dtype.
        foxglove (str, optional): the name of a Foxglove schema that each
            message follows, as JSON (``"foxglove.FrameTransform"``,
            ``"foxglove.SceneUpdate"``): the port's view in Foxglove (the live
            view, ``Recording(view=True)``, ``mujou view``, ``mujou
            export-view``) is the message's JSON object under that schema's
            name, which Foxglove's panels pick channels by (its 3D panel shows
            these two). The type must be one whose view is a JSON object: a
            ``dict`` (the schema's fields as keys), a NamedTuple or a
            dataclass (its fields). A ``timestamp`` the message lacks is its
            send time (docs/foxglove-3d.md). Default: None (the view's own schema).

    An Output may feed any number of Inputs; messages from one Output to one
    Input arrive in send order.

    Raises:
        TypeError: as `Input`; ``foxglove`` not a str, or given for a type
            whose view is no JSON object (a tensor, a number, a list).
        ValueError: ``foxglove`` is not a schema's name (dotted identifiers).
    """

    _kind = "output"

    def __init__(self, type_: Any = object, *, shape: Any = None, dtype: Any = None,
                 foxglove: str | None = None) -> None:
        super().__init__(type_, shape=shape, dtype=dtype)
        self._foxglove = _foxglove_schema(foxglove, self._spec.type)
        self._readers: list[Input] = []
        # Readers whose declared type is narrower than ours: checked at send.
        self._strict_readers: list[Input] = []
        # The run's send for this port (sends.make_send), None outside a
        # run; a run also installs it as the instance's ``send``.
        self._send: Callable[[Any], None] | None = None

    def _template_copy(self) -> Output:
        spec = self._spec
        return Output(spec.type, shape=spec.shape, dtype=spec.dtype, foxglove=self._foxglove)

    @property
    def foxglove(self) -> str | None:
        """str | None: the Foxglove schema the port's messages follow (its view's name), if any."""
        return self._foxglove

    @property
    def readers(self) -> tuple[Input, ...]:
        """tuple[Input, ...]: the connected Inputs, in connection order."""
        return tuple(self._readers)

    def send(self, value: Any) -> None:
        """Send a message to every connected Input.

        The value is checked against this port's type (and against a reader's
        narrower type), then copied: the caller may reuse or modify its buffer
        right after. Call it from a hook of the port's own node.

        A tensor that nothing but the send holds any more, a temporary such
        as ``self.out.send(torch.tanh(x))``, is handed to the readers as it
        is, without the copy: no one else can change it. That takes a plain
        ``torch.Tensor`` (no subclass) that the call itself passed in, with
        no other reference to it (no name, attribute or container of the
        caller's, no weak reference, no view of it, no DLPack capsule), not a
        view and on a storage of its own (``x[1:]``, ``x.detach()`` and
        ``x.expand(...)`` share ``x``'s), in memory torch allocated (not
        numpy's from ``torch.from_numpy``, nor a buffer's, nor shared with
        another process), outside autograd (no ``requires_grad``, no
        forward-mode dual level open), made in or out of inference mode as
        the send is, on the CPU, in a net without CUDA nodes, with no Python
        attribute set on it. A flat list,
        tuple or dict that only the send holds is rebuilt as always, and
        each tensor in it that only the container holds is handed over by
        the same rule. Anything the sender could still reach or change is
        copied. Readers get the same values either way, and the host's
        ``run.read`` its own copy.

        A reader whose Input declares a narrower type than this Output gets
        the value as its own check gives it: an ``int`` sent on an
        ``Output(int)`` or ``Output(object)`` arrives as a ``float`` at an
        ``Input(float)``, while ``run.read`` and subscribers see what was sent.
        While the node runs, ``send`` is replaced on the instance by the
        run's own function, which does all of this in one call (not for a
        subclass that overrides ``send``: its method runs, and this one hands
        over to the run's function).

        Args:
            value: the message; for tensor ports a ``torch.Tensor`` of the
                declared dtype and shape.

        Raises:
            PortTypeError: the value does not match this port's type or a
                connected Input's (the message names both ports); nothing is
                delivered then.
            NotRunningError: the node is not part of a running net, or the
                call does not come from a hook of the port's own node
                (checked first).
        """
        send = self._send
        if send is None:
            raise NotRunningError(f"output {self.path!r}: send() needs a running net")
        send(value)  # running: Output.send(port, v), a subclass's super().send(v), ...


def connect(output: Output, input: Input) -> None:
    """Connect an Output to an Input; checked at once.

    Args:
        output (Output): the sending port.
        input (Input): the receiving port.

    Raises:
        TypeError: the arguments are not an Output and an Input (in that order).
        PortTypeError: no message of the Output's type can match the Input's
            type; names both ports and their types.
        ValueError: the two ports are already connected.
    """
    if not isinstance(output, Output) or not isinstance(input, Input):
        raise TypeError(
            "connect(output, input) takes an Output then an Input, got "
            f"{type(output).__name__} and {type(input).__name__}"
        )
    if not input._spec.may_accept_some_of(output._spec):
        raise PortTypeError(
            f"cannot connect {output.path!r} ({output._spec.describe()}) to "
            f"{input.path!r} ({input._spec.describe()}): {_mismatch(output._spec, input._spec)}"
        )
    if input in output._readers:
        raise ValueError(f"{output.path!r} is already connected to {input.path!r}")
    for port in (output, input):
        if getattr(port.node, "_mujou_run", None) is not None:
            raise ValueError(f"cannot connect {port.path!r} while its node is running; "
                             "connect before mujou.run")
    output._readers.append(input)
    if not input._spec.accepts_all_of(output._spec):
        output._strict_readers.append(input)
    input._sources.append(output)


_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:[./][A-Za-z_][A-Za-z0-9_]*)*")


def _foxglove_schema(name: Any, type_: Any) -> str | None:
    """``Output(foxglove=)`` checked: None, or a schema's name on a type viewed as an object.

    Raises:
        TypeError: not a str; or a type whose view is no JSON object.
        ValueError: not dotted identifiers (``foxglove.SceneUpdate``), or over 256 characters.
    """
    if name is None:
        return None
    if not isinstance(name, str):
        raise TypeError(f"Output(foxglove=) takes a Foxglove schema's name such as "
                        f"'foxglove.SceneUpdate', got {name!r}")
    if len(name) > 256 or not _SCHEMA_NAME.fullmatch(name):
        raise ValueError(f"Output(foxglove=) takes a schema's name, dotted identifiers such as "
                         f"'foxglove.SceneUpdate', got {name[:80]!r}")
    objects = isinstance(type_, type) and (issubclass(type_, dict) or dataclasses.is_dataclass(
        type_) or (issubclass(type_, tuple) and hasattr(type_, "_fields")))
    if not objects:
        raise TypeError(f"Output(foxglove={name!r}) needs messages whose view is a JSON object "
                        f"(a dict, a NamedTuple or a dataclass of the schema's fields), not "
                        f"{getattr(type_, '__name__', repr(type_))}")
    return name


_port_names: weakref.WeakKeyDictionary[type, tuple[str, ...]] = weakref.WeakKeyDictionary()


def ports_of_class(cls: type) -> Iterable[str]:
    """Names of the ports declared on ``cls`` and its bases, in definition order.

    Worked out once per class (a run asks for every node's ports twice):
    ports are declared in class bodies.
    """
    names = _port_names.get(cls)
    if names is None:
        seen: dict[str, None] = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                if isinstance(value, Port):
                    seen[name] = None
        names = _port_names[cls] = tuple(seen)
    return names
