"""The tree codec's decoding, format 1 (its own parser) against format 2 (msgpack's C decoder).

What is measured
----------------
For each tree, its structure in both formats (format 2 from
``codec.encode``; format 1 written here from its documentation, since the
codec writes only format 2), then the CPU time of decoding each:

* **v1 µs**: ``codec.decode(structure, data_len, version=1)``, the parser
  that reads files written before format 2 (pure Python, counting memory);
* **v2 µs**: ``codec.decode(structure, data_len)`` (``codec.decode_batch`` for
  the batch), what every new snapshot, recording and data-plane batch takes;
* **ratio**: v1 / v2, how many times less CPU a decode takes in format 2.

Both make the same objects and the same empty tensors (``torch.empty``; the
tensor data is not read: it is the same raw bytes in both formats). The two
run alternately, in blocks of decodes each long enough for the clock
(``time.process_time_ns``: CPU, so other load on the machine stretches
neither), ``--blocks`` blocks each; the figure is the median block's time
per decode. Every decoded tree is checked against the tree once.

Trees: ``state dict`` (48 float32 tensors of an MLP and its optimizer's
step counts, the shape of a node's model), ``config`` (nested dicts, lists,
tuples, strs and numbers, 2 KB), ``batch x64`` (64 port messages: floats,
16-float tensors and ``(tensor, float)`` tuples; format 2 through
``decode_batch``, format 1 through ``decode``, whose parser the format-1
``decode_batch`` shared but for the tensor descriptions it read with
msgpack), ``deep`` (ten chains of dicts and lists 90 levels deep),
``ints+strs`` (10,000 small ints and 10,000 short strs) and ``small``
(``[1.5, 3, "x"]``: the fixed cost of one call).

Results: a table, and JSON in ``benchmarks/results/codec.json`` unless
``--json`` says otherwise.

Usage::

    python benchmarks/codec.py [--quick] [--blocks 15] [--json PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import torch
from common import machine, show_table, summary

from mujou_actors import codec

ROOT = Path(__file__).resolve().parent.parent
BLOCK_NS = 2_000_000  # a block of decodes takes about this much CPU: far above the clock's step
COLUMNS = (("v1_bytes", "v1 bytes", "{:,.0f}"), ("v2_bytes", "v2 bytes", "{:,.0f}"),
           ("v1_us", "v1 µs", "{:,.1f}"), ("v2_us", "v2 µs", "{:,.1f}"),
           ("ratio", "ratio", "{:.1f}x"))


def encode_v1(tree: Any) -> tuple[bytes, int]:
    """A tree in format 1 (the module docstring of ``codec``): its structure and data length."""
    offset = 0

    def packable(obj: Any) -> Any:
        nonlocal offset
        if isinstance(obj, dict):
            return {key: packable(value) for key, value in obj.items()}
        if isinstance(obj, list):
            return [packable(item) for item in obj]
        if isinstance(obj, tuple):
            return msgpack.ExtType(2, msgpack.packb([packable(item) for item in obj]))
        if isinstance(obj, torch.Tensor):
            meta = [str(obj.dtype).removeprefix("torch."), list(obj.shape), offset, obj.nbytes]
            offset += obj.nbytes
            return msgpack.ExtType(1, msgpack.packb(meta))
        return obj

    return msgpack.packb(packable(tree)), offset


def trees() -> dict[str, Any]:
    """The trees measured, by name (see the module docstring)."""
    sizes = [(64, 32), (64, 64), (64, 64), (64, 64), (8, 64), (64, 8)]
    model: dict[str, Any] = {}
    for i, (n_in, n_out) in enumerate(sizes * 2):
        model[f"layers.{i}.weight"] = torch.zeros(n_out, n_in)
        model[f"layers.{i}.bias"] = torch.zeros(n_out)
    state = {"model": model, "optim": {f"{k}.exp_avg": torch.zeros(v.shape)
                                       for k, v in list(model.items())[:24]},
             "steps": {k: 1000 for k in model}}
    config = {"run": {"name": "pendulum", "seed": 7, "dt": 0.002, "tags": ("a", "b", "c")},
              "nodes": [{"name": f"node{i}", "period": i * 0.01, "ports": ["obs", "act"],
                         "gains": (1.5, -0.25, 3), "extra": {"k": i, "on": i % 2 == 0}}
                        for i in range(24)]}
    batch = [1.5 if i % 3 == 0 else torch.ones(16) if i % 3 == 1 else (torch.ones(16), 1.0)
             for i in range(64)]
    deep: list[Any] = []
    for chain in range(10):
        node: Any = chain
        for level in range(89):
            node = {"k": node} if level % 2 else [node]
        deep.append(node)
    return {"state dict": state, "config": config, "batch x64": batch, "deep": deep,
            "ints+strs": {"ints": list(range(-100, 9_900)),
                          "strs": [f"w{i % 500}" for i in range(10_000)]},
            "small": [1.5, 3, "x"]}


def block_of(decode: Callable[[], Any]) -> int:
    """How many decodes make a block of about `BLOCK_NS` of CPU."""
    start = time.process_time_ns()
    decode()
    return max(1, BLOCK_NS // max(1, time.process_time_ns() - start))


def per_decode(decode: Callable[[], Any], n: int) -> float:
    """CPU nanoseconds per decode over a block of ``n`` decodes."""
    start = time.process_time_ns()
    for _ in range(n):
        decode()
    return (time.process_time_ns() - start) / n


def measure(name: str, tree: Any, blocks: int) -> dict[str, Any]:
    """Both formats' sizes and decode times for one tree (see the module docstring)."""
    v1, data_len = encode_v1(tree)
    tensors: list[tuple[torch.Tensor, int]] = []
    if name.startswith("batch"):
        v2 = codec.encode_batch(tree, [0] * len(tree), [object], tensors)

        def decode_v2() -> Any:
            return codec.decode_batch(v2, 0, len(tree), data_len)[0]
    else:
        v2, tensors = codec.encode(tree)

        def decode_v2() -> Any:
            return codec.decode(v2, data_len)[0]

    def decode_v1() -> Any:
        return codec.decode(v1, data_len, version=1)[0]

    assert sum(n for _, n in tensors) == data_len
    check(decode_v1(), tree)
    check(decode_v2(), tree)
    sides = {"v1": decode_v1, "v2": decode_v2}
    sizes = {side: block_of(decode) for side, decode in sides.items()}
    times: dict[str, list[float]] = {"v1": [], "v2": []}
    for i in range(blocks):
        for side in (("v1", "v2") if i % 2 == 0 else ("v2", "v1")):  # who goes first alternates
            times[side].append(per_decode(sides[side], sizes[side]) / 1000)
    v1_us, v2_us = (statistics.median(times[side]) for side in ("v1", "v2"))
    return {"v1_bytes": len(v1), "v2_bytes": len(v2), "v1_us": v1_us, "v2_us": v2_us,
            "ratio": v1_us / v2_us, "samples": {side: summary(t) for side, t in times.items()}}


def check(got: Any, want: Any) -> None:
    """The decoded tree is the tree: types, keys, values; tensors by dtype and shape."""
    if isinstance(want, torch.Tensor):
        assert type(got) is torch.Tensor and (got.dtype, got.shape) == (want.dtype, want.shape)
    elif isinstance(want, dict):
        assert type(got) is dict and list(got) == list(want)
        for key in want:
            check(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            check(g, w)
    else:
        assert type(got) is type(want) and got == want


def main(argv: list[str] | None = None) -> int:
    """Measure every tree; print the table; write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=15, help="blocks of decodes per format")
    ap.add_argument("--quick", action="store_true", help="3 blocks")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/codec.json")
    cfg = ap.parse_args(argv)
    if cfg.quick:
        cfg.blocks = 3
    if cfg.blocks < 1:
        ap.error("--blocks must be >= 1")
    torch.set_num_threads(1)
    results = {name: measure(name, tree, cfg.blocks) for name, tree in trees().items()}
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    show_table(f"Decoding, CPU per decode, {when}, {machine()}, median of {cfg.blocks} blocks",
               "tree", results, COLUMNS)
    cfg.json.parent.mkdir(parents=True, exist_ok=True)
    cfg.json.write_text(json.dumps({
        "date": when, "machine": machine(), "mujou_actors": codec.__file__,
        "versions": {"torch": torch.__version__, "msgpack": ".".join(map(str, msgpack.version))},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items()},
        "results": results}, indent=1))
    print(f"wrote {cfg.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
