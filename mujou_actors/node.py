"""``Node``: settings, generator, hooks, child nodes, ports and default state.

A node knows nothing of threads or of the run that runs it: the run walks the
tree of nodes, gives each a path and an actor, and calls the hooks.
"""

from __future__ import annotations

import functools
import math
import os
import random
import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from ._checks import is_int, is_number
from .deadlines import check_deadlines
from .devices import validate_device
from .errors import ParamError
from .params import params_of_class
from .ports import Port, ports_of_class

if TYPE_CHECKING:
    from .deadlines import DeadlineMiss

# Only the names users import (docs/reference.md); the package's own helpers stay importable.
__all__ = ["Node"]

# Attributes the framework keeps on a node are prefixed so that they never
# collide with a user's own fields (as Pykka does).
_PREFIX = "_mujou_"


def _check_period(period: Any, where: str) -> int | None:
    """Validate a period in seconds; return it in integer nanoseconds."""
    if period is None:
        return None
    if not is_number(period):
        raise TypeError(f"{where}: period must be a number of seconds or None, got {period!r}")
    if not math.isfinite(period) or period <= 0:
        raise ValueError(f"{where}: period must be a finite number > 0 or None, got {period!r}")
    period_ns = round(period * 1_000_000_000)
    if period_ns < 1:
        raise ValueError(f"{where}: period {period!r} s is shorter than 1 ns")
    return period_ns


def check_seed(seed: Any, where: str) -> int | None:
    """Validate a seed: ``Node(seed=)``, ``mujou.run(seed=)`` and the seeds of a tree.

    One check for all of them, so that a seed one of them accepts is never
    refused by another (a tree records the seeds a run used).

    Args:
        seed: the value given.
        where (str): what the message names first (``"mujou.run"``, a class).

    Returns:
        int | None: ``seed`` (None for None).

    Raises:
        TypeError: ``seed`` is not an int (a bool or a float included) nor None.
        ValueError: an int outside ``[0, 2**64)``.
    """
    if seed is None:
        return None
    if not is_int(seed):
        raise TypeError(f"{where}: seed must be an int or None, got {seed!r}")
    if not 0 <= seed < 2**64:
        raise ValueError(f"{where}: seed must be in [0, 2**64), got {seed!r}")
    return seed


# One OS entropy read per process (and per forked child) rather than one per
# seed: a run of 100,000 nodes without a seed draws 100,000 of them.
_seeder = random.Random(secrets.randbits(256))
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _seeder.seed(secrets.randbits(256)))


def random_seed() -> int:
    """A fresh seed, different on every call: from a generator seeded by the OS's entropy."""
    return _seeder.getrandbits(63)


class Node:
    """A small stateful computation that runs as an actor.

    Subclass it, call ``super().__init__(...)`` first in ``__init__``, declare
    ports and override the hooks. All arguments are keyword-only.

    Args:
        period (float | None): seconds of the run's timer between two updates
            on average, kept as whole nanoseconds ``round(period * 1e9)``;
            updates are due at k times that (k = 1, 2, ...), so a period that
            is not a whole number of ns is off by up to 0.5 ns per tick.
            ``None``: no timer, the node updates when a triggering Input
            receives a message. Default: 0.01.
        seed (int | None): seed of ``self.generator``, in ``[0, 2**64)``.
            ``None``: the run's ``seed=`` derives one from the node's path,
            or, without it, every run draws a fresh one; such a node draws
            reproducibly only from ``on_start`` on. Default: None.
        device (str | torch.device): ``"cpu"`` or a CUDA device. ``"cuda"``
            without index is fixed to the current CUDA device now.
            Default: ``"cpu"``.
        dedicated_thread (bool): run the hooks, ``on_start`` included, on a
            thread of the node's own (named ``mujou-node-PATH``) instead of the
            shared workers: for hooks that block or rely on per-thread state.
            Default: False.
        budget (float | None): CPU seconds one ``on_update`` may take
            (``time.thread_time_ns`` of its thread, measured as it returns);
            at most ``deadline``. Default: None (no budget).
        deadline (float | None): seconds of the run's timer after an
            update's due time (its tick's, or its trigger's) by which
            ``on_update`` must have returned; needs a ``period``. In real
            time an update still running at its deadline is caught then, by
            the run's deadline monitor (a thread started only for nodes with
            a deadline), not when it returns. In simulated time, where a hook
            starts when due and the clock stands still while it runs, its CPU
            time is what is compared. A deadline or budget longer than the
            period is legal, and warned of as the run starts.
            Default: None (no deadline).
        on_miss (str): what a missed budget or deadline does, in real time:
            ``"warn"`` (log it, at most a line every 10 s per node),
            ``"skip"`` (skip the node's next tick), ``"safe"`` (call the
            node's ``on_deadline_miss`` once the update has returned),
            ``"stop"`` (stop the run, even while the update still runs:
            ``join()`` raises a `NodeError` whose cause is a
            ``DeadlineMissError``; no supervisor restarts the node). In
            simulated time every policy only warns, so that results never
            depend on the machine's speed. Every miss is counted in
            `NodeStats`. Default: ``"warn"``. See docs/nodes-and-ports.md,
            "Deadlines and budgets".

    Raises:
        ValueError: ``period`` not finite or <= 0; ``seed`` outside
            ``[0, 2**64)``; a device other than the CPU
            or CUDA (``"mps"``, ``"meta"``), or CUDA when it is not available;
            ``budget`` or ``deadline`` not > 0, a ``deadline`` without a
            period, a ``budget`` longer than the ``deadline``, an unknown
            ``on_miss``, ``"skip"`` without a period,
            ``"safe"`` without an ``on_deadline_miss`` of the class's own, or
            a policy other than ``"warn"`` with neither budget nor deadline.
        TypeError: an argument of the wrong type.

    Example:
        ```python
        class Noise(Node):
            out = Output(torch.Tensor, shape=(3,))

            def __init__(self):
                super().__init__(period=0.004, seed=7)

            def on_update(self, dt):
                self.out.send(torch.randn(3, generator=self.generator))
        ```
    """

    def __init__(
        self,
        *,
        period: float | None = 0.01,
        seed: int | None = None,
        device: str | torch.device = "cpu",
        dedicated_thread: bool = False,
        budget: float | None = None,
        deadline: float | None = None,
        on_miss: str = "warn",
    ) -> None:
        where = type(self).__name__
        self._mujou_period_ns = _check_period(period, where)
        self._mujou_budget_ns, self._mujou_deadline_ns, self._mujou_on_miss = check_deadlines(
            type(self), Node, self._mujou_period_ns, budget, deadline, on_miss)
        self._mujou_period = None if period is None else float(period)
        self._mujou_seed = check_seed(seed, where)
        self._mujou_device = validate_device(device, owner=where)
        if not isinstance(dedicated_thread, bool):
            raise TypeError(f"{where}: dedicated_thread must be a bool, got {dedicated_thread!r}")
        self._mujou_dedicated = dedicated_thread
        # The generator is made on first use (it holds 5 KB of state on the
        # CPU): a node that draws no random numbers never pays for it.
        self._mujou_gen_seed = seed  # None: drawn when first needed (a run sets one)
        self._mujou_generator: torch.Generator | None = None
        self._mujou_path: str | None = None
        self._mujou_run: object | None = None

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: a framework attribute missing
        # means the subclass never called super().__init__().
        if name.startswith(_PREFIX) or (
                "_mujou_period_ns" not in self.__dict__ and hasattr(Node, name)):
            raise AttributeError(
                f"{type(self).__name__}: call super().__init__(...) at the top of "
                f"__init__ before using the node (no {name} yet)"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- ports assigned in __init__ --------------------------------------------
    # A port assigned as an instance attribute (``self.out = Output(int)``, or
    # setattr in a loop) learns its node and name when the ``__init__`` that
    # assigned it returns: every subclass's ``__init__`` is wrapped once, here,
    # to bind them. Not a ``__setattr__``: that would tax every attribute write
    # of every hook (``self.count += 1`` cost ten times as much with one).
    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_mujou_binds_ports", False):
            return

        @functools.wraps(init)
        def __init__(self: Node, *args: Any, **kw: Any) -> None:
            init(self, *args, **kw)
            self._mujou_bind_ports()

        __init__._mujou_binds_ports = True  # type: ignore[attr-defined]
        cls.__init__ = __init__  # type: ignore[method-assign]

    def _mujou_bind_ports(self) -> None:
        """Bind the ports held as instance attributes to this node, by attribute name.

        Raises:
            ValueError: a port already belongs to another node.
        """
        for name, value in vars(self).items():
            if isinstance(value, Port) and (value._owner is not self or value._name != name):
                value._bind(self, name)

    # -- read-only settings -------------------------------------------------------
    @property
    def period(self) -> float | None:
        """float | None: seconds of the run's timer between updates (None: triggered)."""
        return self._mujou_period

    @property
    def seed(self) -> int | None:
        """int | None: the seed of ``self.generator``: what `Run.seeds` shows for the node.

        The ``seed`` argument when one was given. Otherwise the seed the latest
        run gave the node (derived from ``mujou.run(seed=)``, drawn at random,
        or taken from a restored tree), and None for such a node before its
        first run (unless its generator was used already: it then has the
        random seed it was made with).
        """
        return self._mujou_gen_seed

    @property
    def generator(self) -> torch.Generator:
        """torch.Generator: the node's own random generator, on the node's device.

        Made on first use and seeded with the node's seed (the ``seed``
        argument, else the one the run gives the node as it starts). A node
        without a seed of its own is seeded afresh by every run, so draws
        made before the run (in ``__init__``) are not reproducible: give such a
        node its own seed, or draw in ``on_start``.
        """
        gen = self._mujou_generator
        if gen is None:
            gen = self._mujou_generator = torch.Generator(device=self._mujou_device)
            gen.manual_seed(self._mujou_seed_now())
        return gen

    def _mujou_seed_now(self) -> int:
        """The generator's seed, drawn at random if neither the node nor a run gave one."""
        if self._mujou_gen_seed is None:
            self._mujou_gen_seed = random_seed()
        return self._mujou_gen_seed

    def _mujou_reseed(self, seed: int) -> None:
        """Seed the generator afresh (the run's derived seed, or a restored one)."""
        self._mujou_gen_seed = seed
        if self._mujou_generator is not None:
            self._mujou_generator.manual_seed(seed)

    # Set on the instance once the node has been in a run (which seeded its
    # generator); the class's False costs the nodes nothing per instance.
    _mujou_run_seeded = False

    def _mujou_drew_before_run(self) -> bool:
        """Whether the generator was drawn from before any run seeded it (in ``__init__``).

        Such draws came from a random seed that no run records: a run that
        seeds the generator afresh makes them unreproducible. Told by the
        generator's state, which differs from a fresh one of its seed once
        anything was drawn.
        """
        gen = self._mujou_generator
        if gen is None or self._mujou_run_seeded or self._mujou_seed is not None:
            return False
        fresh = torch.Generator(device=self._mujou_device)
        fresh.manual_seed(self._mujou_seed_now())
        return not torch.equal(gen.get_state(), fresh.get_state())

    @property
    def device(self) -> torch.device:
        """torch.device: where the node computes (``cpu`` or ``cuda:N``)."""
        return self._mujou_device

    @property
    def dedicated_thread(self) -> bool:
        """bool: whether the node's hooks run on a thread of its own."""
        return self._mujou_dedicated

    @property
    def budget(self) -> float | None:
        """float | None: CPU seconds one ``on_update`` may take (None: no budget)."""
        ns = self._mujou_budget_ns
        return None if ns is None else ns / 1e9

    @property
    def deadline(self) -> float | None:
        """float | None: seconds after an update is due by which it must return (None: none)."""
        ns = self._mujou_deadline_ns
        return None if ns is None else ns / 1e9

    @property
    def on_miss(self) -> str:
        """str: the policy for a missed budget or deadline (``"warn"``, ``"skip"``...)."""
        return self._mujou_on_miss

    @property
    def path(self) -> str | None:
        """str | None: dotted attribute path from the run's root (root: ``""``).

        None while the node has never been part of a run.
        """
        return self._mujou_path

    # -- hooks ----------------------------------------------------------------------
    def on_start(self) -> None:
        """Called once per start (and per restart), before any update."""

    def on_update(self, dt: float) -> None:
        """Called on every tick (and triggering message).

        Args:
            dt (float): seconds of the run's timer since this node's previous
                update (since the start for the first one); with the
                simulated timer, for a node never late, exactly the period
                rounded to whole nanoseconds (``round(period * 1e9) / 1e9``).
        """

    def on_stop(self) -> None:
        """Called once when the run ends, for every node whose ``on_start`` ran."""

    def on_deadline_miss(self, miss: DeadlineMiss) -> None:
        """Called after an ``on_update`` that missed its budget or deadline (``on_miss="safe"``).

        Real time only, in the node's context on the thread of the update,
        once the update has returned and before the node's next hook: the
        place to put the node in a safe state (hold the last command, send a
        stop). It never runs beside the node's own ``on_update``: an update
        caught still running at its deadline is counted and logged then, and
        this hook called only as the update returns (a running hook cannot
        be interrupted). Its time counts in the update's. What it raises
        fails the node as ``on_update`` would.

        Args:
            miss (DeadlineMiss): what was missed, by how much.
        """

    def on_param(self, name: str, old: Any, new: Any) -> None:
        """Called when a set from outside the node changed one of its parameters (`Param`).

        In the node's context, on the thread of the update that applies the
        set (the node's first update at or after the set's key: its next
        delta cycle), just before that update's ``on_update``; the attribute
        already holds ``new``. One call per set, in the order they were made
        (a set to the value it already has is called too). Not called for the
        node's own attribute writes. What it raises fails the node as
        ``on_update`` would.

        Args:
            name (str): the parameter's name (its attribute).
            old: its value before the set.
            new: its value now.
        """

    # -- state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The node's own state (not its children's: they have their own entries).

        Holds ``"generator"``, every parameter (`Param`) by its name, and every
        attribute that is a ``torch.Tensor``, ``nn.Module`` or
        ``torch.optim.Optimizer`` (by their own ``state_dict``). The
        generator's entry is its state tensor once it has been used, and
        until then just its seed (an int: a generator that drew nothing is
        fully given by its seed). Subclasses extend it by calling ``super()``.

        Returns:
            dict[str, Any]: attribute name -> value.
        """
        gen = self._mujou_generator
        state: dict[str, Any] = {
            "generator": self._mujou_seed_now() if gen is None else gen.get_state()}
        for name in params_of_class(type(self)):
            state[name] = getattr(self, name)
        for name, value in vars(self).items():
            if name.startswith(_PREFIX):
                continue
            if isinstance(value, torch.Tensor):
                state[name] = value
            elif isinstance(value, (torch.nn.Module, torch.optim.Optimizer)):
                state[name] = value.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned; tensors go to the node's device.

        Strict, like ``nn.Module.load_state_dict(strict=True)``: every problem is
        collected into one error before anything changes. Keys of the default
        state (the generator, tensor, module and optimizer attributes) must all
        be there, with tensors of the same shape and dtype; a parameter's key
        may be left out (a tree from before it was declared: the value stays),
        and its value must keep the parameter's rules; any other key sets a
        plain attribute that exists already (a subclass's own state), but never
        a port, a method, a child node or a framework attribute.

        Args:
            state (dict[str, Any]): as returned by `state_dict`.

        Raises:
            ValueError: missing or unexpected keys, a tensor of another shape or
                dtype, or a generator state of the wrong kind (a CUDA
                generator's state into a CPU node or the reverse); the message
                names the node and every key at fault.
        """
        problems = list(self._mujou_state_problems(state))
        if problems:
            where = (f"node {self._mujou_path!r}" if self._mujou_path is not None
                     else f"{type(self).__name__} (not in a run yet)")
            raise ValueError(f"{where}: cannot load this state: " + "; ".join(problems))
        gen = state["generator"]
        if isinstance(gen, int):
            self._mujou_reseed(gen)
        else:
            self.generator.set_state(gen.cpu())
        for name, value in state.items():
            if name == "generator":
                continue
            current = getattr(self, name)
            if isinstance(current, torch.Tensor):
                with torch.no_grad():
                    # Queued without a host wait (a blocking copy would spin on the
                    # stream); the run waits for the node's stream after the restore.
                    current.copy_(value.to(current.device, non_blocking=True))
            elif isinstance(current, (torch.nn.Module, torch.optim.Optimizer)):
                current.load_state_dict(value)
            else:
                object.__setattr__(self, name, value)

    def _mujou_state_problems(self, state: Any) -> Iterator[str]:
        """Everything that keeps ``state`` from loading, in words."""
        if not isinstance(state, dict):
            yield f"a state is a dict, got {type(state).__name__}"
            return
        expected = Node.state_dict(self)
        params = params_of_class(type(self))
        missing = sorted(set(expected) - set(state) - set(params))
        if missing:
            yield f"missing key(s) {missing}"
        if "generator" in state:
            yield from _generator_problems(state["generator"], self._mujou_device)
        for name, value in state.items():
            if name == "generator":
                continue
            if name in params:
                try:
                    params[name].check(value, f"parameter {name!r}")
                except ParamError as exc:
                    yield str(exc)
                continue
            yield from self._mujou_key_problems(name, value)

    def _mujou_key_problems(self, name: Any, value: Any) -> Iterator[str]:
        if not isinstance(name, str) or name.startswith(_PREFIX) or not hasattr(self, name):
            yield f"unexpected key {name!r}"
            return
        current = getattr(self, name)
        if isinstance(current, (Port, Node)) or callable(current) and not isinstance(
                current, (torch.Tensor, torch.nn.Module)):
            yield f"key {name!r} names a {type(current).__name__}, which is not state"
        elif isinstance(current, torch.Tensor):
            if not isinstance(value, torch.Tensor):
                yield f"state[{name!r}] is a {type(value).__name__}, expected a tensor"
            elif value.shape != current.shape or value.dtype != current.dtype:
                yield (f"state[{name!r}] is {value.dtype} {tuple(value.shape)}, "
                       f"expected {current.dtype} {tuple(current.shape)}")
        elif isinstance(current, (torch.nn.Module, torch.optim.Optimizer)) and not isinstance(
                value, dict):
            yield f"state[{name!r}] is a {type(value).__name__}, expected a state dict"

    # -- introspection used by the run ----------------------------------------------
    def _mujou_ports(self) -> dict[str, Port]:
        """Every port of this node by attribute name (binds declared ones)."""
        ports: dict[str, Port] = {}
        for name in ports_of_class(type(self)):
            port = getattr(self, name)
            if isinstance(port, Port):
                ports[name] = port
        for name, value in vars(self).items():
            if isinstance(value, Port):
                if value._owner is not self:  # assigned after __init__ returned
                    value._bind(self, name)
                ports[name] = value
        return ports

    def _mujou_children(self) -> Iterator[tuple[str, Node]]:
        """Child nodes held as attributes, or in lists, tuples and dicts of them."""
        for name, value in vars(self).items():
            if name.startswith(_PREFIX):
                continue
            yield from iter_nodes(name, value)

    def __repr__(self) -> str:
        where = "" if self._mujou_path is None else f" {self._mujou_path or '<root>'!r}"
        return f"<{type(self).__name__}{where}>"


def _is_seed(value: Any) -> bool:
    return is_int(value) and 0 <= value < 2**64


_generator_states: dict[str, tuple[torch.dtype, int]] = {}


def _generator_problems(gen: Any, device: torch.device) -> Iterator[str]:
    """What keeps ``gen`` from being a generator entry for a node on ``device``.

    A seed fits any device. A state tensor must be what ``get_state`` gives
    for this device type (a CPU generator's and a CUDA generator's differ);
    that dtype and size are learnt once per device type from a throwaway
    generator, so checking never makes the node's own.
    """
    if _is_seed(gen):
        return
    kind = device.type
    if not isinstance(gen, torch.Tensor):
        text = repr(gen) if isinstance(gen, (int, float, str, type(None))) else type(gen).__name__
        yield (f"state['generator'] is {text}: expected a seed (an int in [0, 2**64)) or "
               f"the state tensor of a {kind} generator")
        return
    spec = _generator_states.get(kind)
    if spec is None:
        state = torch.Generator(device=device).get_state()
        spec = _generator_states[kind] = (state.dtype, state.numel())
    if (gen.dtype, gen.numel()) != spec:
        yield (f"state['generator'] is a {gen.dtype} tensor of {gen.numel()} elements; a "
               f"{kind} generator's state is {spec[0]} of {spec[1]} (saved on another device "
               "type?)")


def iter_nodes(prefix: str, value: Any) -> Iterator[tuple[str, Node]]:
    """Nodes in ``value`` (a node, or a list/tuple/dict of them) with dotted paths."""
    if isinstance(value, Node):
        yield prefix, value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if isinstance(item, Node):
                yield f"{prefix}.{i}" if prefix else str(i), item
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, Node) and isinstance(key, (str, int)):
                yield f"{prefix}.{key}" if prefix else str(key), item
