"""A watch's ``column`` batches: tensors of one dtype and shape sent raw, viewed by the watcher.

The endpoint (`endpoint.columns`) stacks a batch of plain tensors and sends
their bytes; the watcher (`attach.column_items`) makes each message's view.
The views must be exactly those the run's side makes (`view.project_tensor`
for ``echo``, `endpoint.full` for ``echo --full``), and a column the watcher
is sent must be checked before anything is allocated for it.
"""

from __future__ import annotations

import math
import struct
import threading
from pathlib import Path
from typing import Any

import msgpack
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mujou_actors as mujou
from mujou_actors import attach, endpoint
from mujou_actors.errors import AttachError
from mujou_actors.recording import view
from tests.test_attach import runtime  # noqa: F401 - runtime: a fixture

pytestmark = pytest.mark.timeout(120)

_DTYPES = {name: getattr(torch, name) for name in attach.COLUMN_CODES}


def _wire(columns: list[dict[str, Any]]) -> list[list[Any]]:
    """What the watcher makes of the columns, after a trip through msgpack as on the socket."""
    items: list[list[Any]] = []
    for column in columns:
        sent = msgpack.unpackb(msgpack.packb(column, use_bin_type=True), raw=False)
        items += attach.column_items(sent)
    return items


def _values(dtype: torch.dtype, n: int) -> st.SearchStrategy[list[Any]]:
    if dtype is torch.bool:
        return st.lists(st.booleans(), min_size=n, max_size=n)
    if dtype.is_floating_point:
        special = st.sampled_from([math.nan, math.inf, -math.inf, -0.0])
        return st.lists(st.one_of(st.floats(-1e4, 1e4, width=16), special),
                        min_size=n, max_size=n)
    info = torch.iinfo(dtype)
    low, high = max(info.min, -(2 ** 62)), min(info.max, 2 ** 62)
    return st.lists(st.integers(low, high), min_size=n, max_size=n)


@st.composite
def _batches(draw: Any) -> list[tuple[int, torch.Tensor]]:
    name = draw(st.sampled_from(sorted(_DTYPES)))
    dtype = _DTYPES[name]
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=4)))
    rows = draw(st.integers(1, 5))
    n = math.prod(shape)
    batch = []
    for i in range(rows):
        values = draw(_values(dtype, n))
        t = torch.tensor(values, dtype=torch.float64 if dtype.is_floating_point else None)
        batch.append((1_000 * (i + 1), t.to(dtype).reshape(shape)))
    return batch


@settings(max_examples=150, deadline=None)
@given(_batches())
def test_a_columns_views_are_the_views_the_run_makes_of_each_tensor(
        batch: list[tuple[int, torch.Tensor]]) -> None:
    for full_values, make in ((False, view.project_tensor), (True, endpoint.full)):
        columns = endpoint.columns(batch, full_values)

        assert columns is not None and len(columns) == 1
        assert _wire(columns) == [[t_ns, make(t)] for t_ns, t in batch]


def test_a_column_of_float64_vectors_is_their_bytes_back_to_back_in_send_order() -> None:
    batch = [(5, torch.tensor([1.0, 2.0])), (9, torch.tensor([3.0, math.nan]))]
    batch = [(t, m.double()) for t, m in batch]

    (column,) = endpoint.columns(batch, False)  # type: ignore[misc]

    assert column == {"t_ns": [5, 9], "dtype": "float64", "shape": [2],
                      "data": struct.pack("=4d", 1.0, 2.0, 3.0, math.nan), "flat": True}
    assert attach.column_items(column) == [
        [5, {"shape": [2], "dtype": "float64", "data": [1.0, 2.0]}],
        [9, {"shape": [2], "dtype": "float64", "data": [3.0, None]}]]


def test_a_small_matrix_keeps_its_flat_values_in_a_view_and_not_in_full() -> None:
    m = torch.arange(6, dtype=torch.int32).reshape(2, 3)

    (viewed,) = _wire(endpoint.columns([(1, m)], False))  # type: ignore[arg-type]
    (whole,) = _wire(endpoint.columns([(1, m)], True))  # type: ignore[arg-type]

    assert viewed[1] == {"shape": [2, 3], "dtype": "int32", "data": [[0, 1, 2], [3, 4, 5]],
                         "flat": [0, 1, 2, 3, 4, 5]}
    assert whole[1] == {"shape": [2, 3], "dtype": "int32", "data": [[0, 1, 2], [3, 4, 5]]}


@pytest.mark.parametrize("case", ["two shapes", "two dtypes", "a subclass", "a non-tensor",
                                  "complex", "bfloat16", "nine dimensions", "summarised",
                                  "too many lists"])
def test_messages_a_column_cannot_carry_get_a_view_each_from_the_run(case: str) -> None:
    a = torch.zeros(3)
    cases: dict[str, list[tuple[int, Any]]] = {
        "two shapes": [(1, a), (2, torch.zeros(4))],
        "two dtypes": [(1, a), (2, a.double())],
        "a subclass": [(1, torch.nn.Parameter(a))],
        "a non-tensor": [(1, a), (2, 3.0)],
        "complex": [(1, torch.zeros(2, dtype=torch.complex64))],
        "bfloat16": [(1, a.bfloat16())],
        "nine dimensions": [(1, torch.zeros([1] * 9))],
        "summarised": [(1, torch.zeros(view.MAX_ELEMENTS + 1))],
        "too many lists": [(1, torch.zeros(attach.COLUMN_ELEMENTS + 1, 0))],
    }
    batch = cases[case]

    assert endpoint.columns(batch, False) is None


def test_a_full_tensor_may_be_a_column_that_a_view_would_summarise() -> None:
    big = torch.arange(view.MAX_ELEMENTS + 1, dtype=torch.int16)

    assert endpoint.columns([(1, big)], False) is None
    (item,) = _wire(endpoint.columns([(1, big)], True))  # type: ignore[arg-type]
    assert item[1] == endpoint.full(big)


def test_columns_are_cut_at_their_cells_bound_keeping_the_order() -> None:
    row = attach.COLUMN_ELEMENTS // 4
    batch = [(i, torch.full((row,), i, dtype=torch.uint8)) for i in range(10)]

    columns = endpoint.columns(batch, True)

    assert columns is not None and [len(c["t_ns"]) for c in columns] == [4, 4, 2]
    assert [t for c in columns for t in c["t_ns"]] == list(range(10))
    assert [v[1]["data"][0] for v in _wire(columns)] == list(range(10))


def test_the_watchers_plot_bound_is_the_views() -> None:
    assert attach.PLOT_ELEMENTS == view.PLOT_ELEMENTS
    assert attach.COLUMN_ELEMENTS == endpoint.MAX_FULL_ELEMENTS


_GOOD = {"t_ns": [1], "dtype": "float32", "shape": [2], "data": struct.pack("=2f", 1, 2),
         "flat": True}


@pytest.mark.parametrize("bad, words", [
    ({"dtype": "bfloat16"}, "'bfloat16'"),
    ({"dtype": None}, "None"),
    ({"data": b"\0" * 7}, "7 bytes for 1 rows of shape [2]"),
    ({"shape": [2, -1]}, "wrong types"),
    ({"shape": [1] * 9, "data": b"\0" * 4}, "wrong types"),
    ({"shape": [attach.COLUMN_ELEMENTS, 0], "t_ns": [1, 2], "data": b""}, "cells"),
    ({"t_ns": "1"}, "wrong types"),
    ({"data": "text"}, "wrong types"),
])
def test_a_column_that_is_not_one_is_refused_before_its_values_are_made(
        bad: dict[str, Any], words: str) -> None:
    with pytest.raises(AttachError, match="a column that is not one") as info:
        attach.column_items({**_GOOD, **bad})

    assert words in str(info.value)


def test_the_good_column_of_those_refusals_is_read() -> None:
    assert attach.column_items(_GOOD) == [[1, {"shape": [2], "dtype": "float32",
                                               "data": [1.0, 2.0]}]]


class _Pose(mujou.Node):
    """Sends n (n its update) in every place of a 2x2 tensor; its first update waits on a gate."""

    pose = mujou.Output(torch.Tensor, shape=(2, 2))

    def __init__(self, gate: threading.Event) -> None:
        super().__init__(period=0.001)
        self.n = 0
        self.gate = gate

    def on_update(self, dt: float) -> None:
        if self.n == 0:
            assert self.gate.wait(60)  # the run stays at its first instant until watched
        self.n += 1
        self.pose.send(torch.full((2, 2), float(self.n)))


def test_a_watcher_of_a_tensor_port_gets_every_message_in_columns(
        runtime: Path,  # noqa: F811 - the fixture
        monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[int] = []
    real = attach.column_items
    monkeypatch.setattr(attach, "column_items",
                        lambda c: sent.append(len(c["t_ns"])) or real(c))  # type: ignore
    gate = threading.Event()
    run = mujou.run({"pose": _Pose(gate)}, timer="simulated", duration=0.5)
    watch_of_run = run.watch

    def watch_and_open(*args: Any, **kwargs: Any) -> Any:
        watching = watch_of_run(*args, **kwargs)
        gate.set()  # the endpoint watches: the run may leave its first instant
        return watching

    monkeypatch.setattr(run, "watch", watch_and_open)
    entry = attach.list_runs()[0]
    with attach.Connection(entry) as conn:
        watch = conn.watch("pose.pose", depth=1_000)
        batches = [next(watch)]
        run.join()
        batches += list(watch)

    items = [item for b in batches for item in b.get("items", ())]
    assert batches[-1]["end"] is True and batches[-1]["lost"] == 0
    assert sum(sent) == len(items) > 0  # every message came in a column
    # Every message, in order, each its own view.
    assert [v["data"] for _, v in items] == [[[float(k)] * 2] * 2 for k in range(1, 501)]
    assert [v["flat"] for _, v in items] == [[float(k)] * 4 for k in range(1, 501)]
    assert [t for t, _ in items] == [k * 1_000_000 for k in range(1, 501)]
