"""Random nets for the placed-run property tests: a plain description and its factory.

A net is described by plain data (lists, dicts, ints, strs, None), so that a
hypothesis strategy can draw it, shrink it, and hand it to every group
process as ``net_kwargs``; `make_random_net` builds the same net from it in
every process (a placed run's factory must, see `placement.resolve_factory`).

The description::

    {"nodes": [node, ...], "edges": [[src, out, dst, in], ...]}

where each node is::

    {"path": "n1.c0",           # dotted: a child of the node "n1"
     "period_us": 2000 | None,  # None: triggered only
     "outs": ["int" | "float" | "tensor" | "big" | "object", ...],
     "ins": [[type, depth | None, trigger (None | True | False),
              "drain" | "read" | "skip"], ...],
     "sends": 1..3,             # messages per Output per hook
     "burst": 1..3,             # sends stop after this many updates of one instant
     "start": bool,             # sends once on every Output in on_start
     "seed": 7,                 # optional: the node's own seed (else the run's)
     "dedicated": True,         # optional: hooks on a thread of its own
     "fail_at": 3}              # optional: raises in this update, once per process

and an edge connects node ``src``'s Output ``out`` to node ``dst``'s Input
``in`` (indices into the lists). Parents come before their children.

Every `RandomNode` draws from its generator in each update, records every
message it takes in (exactly: ints, floats, tensors' values and dtypes), and
sends values made from its state, so a message lost, duplicated, reordered,
delivered at another delta cycle or changed in a bit shows in the state tree.
A node stops sending after ``burst`` updates with ``dt == 0`` (updates within
one instant), so that cycles through triggered nodes end.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import torch
from hypothesis import strategies as st

import mujou_actors as mujou

__all__ = ["RandomNode", "make_random_net", "reset_failures", "nets", "placements", "ACCEPTS",
           "TYPES"]

# "big": a tensor of BIG elements (64 KiB of float64: the data plane's shared memory).
TYPES: dict[str, Any] = {"int": int, "float": float, "tensor": torch.Tensor,
                         "big": torch.Tensor, "object": object}
IN_TYPES = ["float", "int", "object", "tensor"]
# What an Input of each type may be connected to (the Output types it accepts all of).
ACCEPTS = {"int": {"int"}, "float": {"int", "float"}, "tensor": {"tensor", "big"},
           "object": {"int", "float", "tensor", "big", "object"}}
MASK61 = (1 << 61) - 1
BIG = 8192


def _summary(message: Any) -> Any:
    """The message as exact plain data (a tensor's dtype and values), for the node's log."""
    if isinstance(message, torch.Tensor):
        if message.numel() > 64:  # its digest: every bit of it, in a short entry
            data = message.contiguous().numpy().tobytes()
            return [str(message.dtype), list(message.shape), hashlib.sha256(data).hexdigest()]
        return [str(message.dtype), message.tolist()]
    if isinstance(message, tuple):
        return ["tuple", [_summary(m) for m in message]]
    if isinstance(message, dict):
        return ["dict", {k: _summary(v) for k, v in message.items()}]
    if isinstance(message, list):
        return ["list", [_summary(m) for m in message]]
    return [type(message).__name__, message]


class RandomNode(mujou.Node):
    """A node of a random net: its ports, what it sends and how it reads come from ``spec``.

    A node with ``fail_at`` raises in that update (after its sends) once in
    the whole process (`failed` holds the paths of those that did), so a
    restart does not fail again; `reset_failures` before each run.
    """

    failed: set[str] = set()

    def __init__(self, spec: dict[str, Any]) -> None:
        period = spec["period_us"]
        super().__init__(period=None if period is None else period / 1e6, seed=spec.get("seed"),
                         dedicated_thread=spec.get("dedicated", False))
        self._ins: list[tuple[mujou.Input, str]] = []
        self._outs: list[tuple[mujou.Output, str]] = []
        for k, (kind, depth, trigger, mode) in enumerate(spec["ins"]):
            port = mujou.Input(TYPES[kind], depth=depth, trigger=trigger)
            setattr(self, f"i{k}", port)
            self._ins.append((port, mode))
        for k, kind in enumerate(spec["outs"]):
            out = mujou.Output(TYPES[kind])
            setattr(self, f"o{k}", out)
            self._outs.append((out, kind))
        self._sends = spec["sends"]
        self._burst_limit = spec["burst"]
        self._start_sends = spec["start"]
        self._fail_at = spec.get("fail_at")
        self.n = 0
        self.acc = 1
        self.burst = 0
        self.log: list[Any] = []
        self.x = torch.zeros(2, dtype=torch.float64)
        if "big" in spec["outs"]:
            self.buf = torch.zeros(BIG, dtype=torch.float64)

    def on_start(self) -> None:
        if self._start_sends:
            for j, (out, kind) in enumerate(self._outs):
                out.send(self._value(kind, -1, j))

    def on_update(self, dt: float) -> None:
        dt_ns = round(dt * 1e9)
        self.burst = self.burst + 1 if dt_ns == 0 else 0
        self.n += 1
        h = (self.acc * 1000003 + dt_ns) & MASK61
        for i, (port, mode) in enumerate(self._ins):
            if mode == "drain" or (mode == "skip" and self.n % 3 == 0):
                messages = port.drain()
            elif mode == "read":
                m = port.read()
                messages = [] if m is None else [m]
            else:
                messages = []  # "skip": they stay, and with a depth some are dropped
            for m in messages:
                self.log.append([self.n, i, _summary(m)])
        r = int(torch.randint(0, 1 << 30, (1,), generator=self.generator))
        self.acc = (h * 1000003 + r) & MASK61
        self.x = self.x * 0.5 + torch.randn(2, generator=self.generator, dtype=torch.float64)
        if self.burst < self._burst_limit:
            for k in range(self._sends):
                for j, (out, kind) in enumerate(self._outs):
                    out.send(self._value(kind, k, j))
        if self.n == self._fail_at and self.path not in RandomNode.failed:
            RandomNode.failed.add(self.path)  # type: ignore[arg-type]
            raise RuntimeError(f"{self.path} fails at its update {self.n}")

    def _value(self, kind: str, k: int, j: int) -> Any:
        """The ``k``-th message of a hook on Output ``j``: made from the node's state."""
        base = (self.acc + 31 * k + 7 * j) % 1000003
        if kind == "int":
            return base
        if kind == "float":
            return base / 7.0 + self.n
        if kind == "tensor":
            if k == 0:
                return self.x  # an attribute: the send must copy it
            return (self.x * (k + 1)).float()  # a temporary, float32: handed over
        if kind == "big":
            if k == 0:
                self.buf.add_(self.x[0])  # in place: what it sent before must not change
                return self.buf
            return torch.full((BIG,), float(base)) + torch.arange(BIG) * k  # handed over
        if k % 2 == 0:
            return (base, self.x + k)
        return {"n": self.n, "v": [base / 3.0, k]}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(n=self.n, acc=self.acc, burst=self.burst, log=copy.deepcopy(self.log))
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict({**state, "log": copy.deepcopy(state["log"])})


def reset_failures() -> None:
    """Let every node with ``fail_at`` fail once more (before a run)."""
    RandomNode.failed.clear()


def make_random_net(nodes: list[dict[str, Any]],
                    edges: list[list[int]]) -> dict[str, mujou.Node]:
    """The net a description gives (see the module's docstring): top-level nodes by name."""
    built: list[RandomNode] = []
    net: dict[str, mujou.Node] = {}
    by_path: dict[str, RandomNode] = {}
    for spec in nodes:
        node = RandomNode(spec)
        parent, _, name = spec["path"].rpartition(".")
        if parent:
            setattr(by_path[parent], name, node)
        else:
            net[name] = node
        by_path[spec["path"]] = node
        built.append(node)
    for src, out, dst, inp in edges:
        mujou.connect(getattr(built[src], f"o{out}"), getattr(built[dst], f"i{inp}"))
    return net


# -- strategies ------------------------------------------------------------------------

PERIODS_US = [1000, 2000, 3000, 5000, 1500, 2500, 700]


@st.composite
def _node(draw: st.DrawFn, path: str) -> dict[str, Any]:
    period = draw(st.one_of(st.none(), st.sampled_from(PERIODS_US)))
    outs = draw(st.lists(st.sampled_from(sorted(TYPES)), max_size=3))
    ins = draw(st.lists(st.tuples(
        st.sampled_from(IN_TYPES),
        st.one_of(st.none(), st.integers(1, 3)),
        st.sampled_from([None, None, True, False]),
        st.sampled_from(["drain", "drain", "read", "skip"])), max_size=3))
    spec = {"path": path, "period_us": period, "outs": outs,
            "ins": [list(i) for i in ins], "sends": draw(st.integers(1, 3)),
            "burst": draw(st.integers(1, 3)), "start": draw(st.booleans())}
    if draw(st.integers(0, 5)) == 0:
        spec["seed"] = draw(st.integers(0, 2**64 - 1))
    if draw(st.integers(0, 5)) == 0:
        spec["dedicated"] = True
    return spec


@st.composite
def nets(draw: st.DrawFn, max_top: int = 5, nested: bool = True) -> dict[str, Any]:
    """A random net description: 2..max_top top-level nodes, some with children and
    grandchildren; edges."""
    nodes: list[dict[str, Any]] = []
    for i in range(draw(st.integers(2, max_top))):
        nodes.append(draw(_node(f"n{i}")))
        if nested:
            for c in range(draw(st.integers(0, 2) if i % 2 else st.just(0))):
                nodes.append(draw(_node(f"n{i}.c{c}")))
                for g in range(draw(st.integers(0, 1))):
                    nodes.append(draw(_node(f"n{i}.c{c}.g{g}")))
    raw = draw(st.lists(st.tuples(*[st.integers(0, 63)] * 4), max_size=12))
    edges: list[list[int]] = []
    for a, b, c, d in raw:
        src, dst = nodes[a % len(nodes)], nodes[c % len(nodes)]
        if not src["outs"] or not dst["ins"]:
            continue
        out, inp = b % len(src["outs"]), d % len(dst["ins"])
        edge = [a % len(nodes), out, c % len(nodes), inp]
        if src["outs"][out] in ACCEPTS[dst["ins"][inp][0]] and edge not in edges:
            edges.append(edge)
    return {"nodes": nodes, "edges": edges}


GROUPS = ["a", "b", "c"]


@st.composite
def placements(draw: st.DrawFn, desc: dict[str, Any]) -> dict[str, str]:
    """A random placement of the net's node paths into 1..3 groups and the host's.

    Some paths are left out (their parent's group, or the host's), some name
    ``"host"`` explicitly; at least one node is placed outside the host.
    """
    paths = [n["path"] for n in desc["nodes"]]
    choice = st.sampled_from([None, None, "host", *GROUPS])
    placement = {p: g for p in paths if (g := draw(choice)) is not None}
    if all(g == "host" for g in placement.values()):
        placement[draw(st.sampled_from(paths))] = draw(st.sampled_from(GROUPS))
    return placement
