"""The JSON view of messages, and Recording(view=True): view channels beside the lossless ones."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import pathlib
from typing import Any, NamedTuple

import pytest
import torch
from mcap.reader import make_reader

import mujou_actors as mujou
from mujou_actors.recording import mcapfile
from mujou_actors.recording.view import MAX_DEPTH, MAX_ELEMENTS, Projection, from_json
from mujou_actors.testing import assert_replay_matches

pytestmark = pytest.mark.timeout(120)


class Command(NamedTuple):
    force: float
    step: int


@dataclasses.dataclass
class Pose:
    x: float
    tags: list[str]


def _json(projection: Projection, message: Any, t_ns: int = 0) -> Any:
    return json.loads(projection.encode(message, t_ns))  # valid JSON, parsed back


# -- projection ------------------------------------------------------------------------------


def test_a_float_is_wrapped_as_value_and_its_schema_says_number_or_null() -> None:
    p = Projection("sim.energy", float)

    assert _json(p, 1.5) == {"value": 1.5}
    assert p.schema["properties"]["value"] == {"type": ["number", "null"]}
    assert p.schema["$schema"].startswith("https://json-schema.org/")


def test_non_finite_floats_are_null_and_the_json_stays_valid() -> None:
    p = Projection("x.y", torch.Tensor)

    assert _json(Projection("a.b", float), math.nan) == {"value": None}
    assert _json(Projection("a.b", float), -math.inf) == {"value": None}
    assert _json(p, torch.tensor([1.0, math.nan, math.inf]))["data"] == [1.0, None, None]
    assert b"NaN" not in p.encode(torch.tensor([math.nan]), 0)


def test_bool_int_str_and_bytes_are_json_values() -> None:
    assert _json(Projection("a.b", bool), True) == {"value": True}
    assert _json(Projection("a.b", int), 7) == {"value": 7}
    assert _json(Projection("a.b", str), "hi") == {"value": "hi"}
    assert _json(Projection("a.b", bytes), b"\x00\x01") == {"value": "AAE="}


def test_a_small_tensor_holds_its_shape_dtype_and_values() -> None:
    p = Projection("sim.state", torch.Tensor, (2, 2), torch.float64)

    got = _json(p, torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64))

    assert got == {"shape": [2, 2], "dtype": "float64", "data": [[1.0, 2.0], [3.0, 4.0]],
                   "flat": [1.0, 2.0, 3.0, 4.0]}


def test_plot_reads_a_flat_array_up_to_64_elements_and_a_1d_tensors_data() -> None:
    p = Projection("sim.state", torch.Tensor, None, None)

    cube = _json(p, torch.arange(8).reshape(2, 2, 2))
    with_nan = _json(p, torch.tensor([[float("nan"), 1.0]]))
    line = _json(p, torch.tensor([1.0, 2.0]))
    big = _json(p, torch.zeros(8, 9))
    complex_ = _json(p, torch.zeros(2, 2, dtype=torch.complex64))

    assert cube["flat"] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert with_nan["flat"] == [None, 1.0]
    assert line == {"shape": [2], "dtype": "float32", "data": [1.0, 2.0]}
    assert "flat" not in big and len(big["data"]) == 8  # 72 > PLOT_ELEMENTS
    assert "flat" not in complex_
    assert p.schema["properties"]["flat"]["type"] == "array"


def test_a_tensor_over_the_limit_holds_statistics_of_its_finite_values() -> None:
    t = torch.arange(MAX_ELEMENTS + 1, dtype=torch.float32)
    t[0] = math.nan

    got = _json(Projection("a.b", torch.Tensor), t)

    assert got == {"shape": [MAX_ELEMENTS + 1], "dtype": "float32", "numel": MAX_ELEMENTS + 1,
                   "min": 1.0, "max": float(MAX_ELEMENTS), "mean": (1 + MAX_ELEMENTS) / 2}


def test_a_namedtuple_a_dataclass_and_a_dict_are_objects_of_their_fields() -> None:
    assert _json(Projection("c.cmd", Command), Command(0.5, 3)) == {"force": 0.5, "step": 3}
    assert _json(Projection("c.pose", Pose), Pose(1.0, ["a"])) == {"x": 1.0, "tags": ["a"]}
    assert _json(Projection("c.d", dict), {"k": (1, 2), 3: None}) == {"k": [1, 2], "3": None}
    schema = Projection("c.cmd", Command).schema
    assert schema["properties"] == {"force": {"type": ["number", "null"]},
                                    "step": {"type": "integer"}}


def test_a_nesting_deeper_than_the_limit_ends_in_null_instead_of_recursing() -> None:
    deep: Any = 1
    for _ in range(MAX_DEPTH + 50):
        deep = [deep]

    got = _json(Projection("a.b", object), deep)["value"]

    depth = 0
    while isinstance(got, list):
        got, depth = got[0], depth + 1
    assert got is None and depth == MAX_DEPTH


@pytest.mark.parametrize(("shape", "tensor", "encoding"), [
    ((None, None), torch.arange(6, dtype=torch.uint8).reshape(2, 3), "mono8"),
    ((None, None, 3), torch.arange(18, dtype=torch.uint8).reshape(2, 3, 3), "rgb8"),
    ((3, None, None), torch.arange(18, dtype=torch.uint8).reshape(2, 3, 3).permute(2, 0, 1),
     "rgb8"),
])
def test_a_declared_uint8_image_port_is_a_foxglove_raw_image(shape: Any, tensor: torch.Tensor,
                                                             encoding: str) -> None:
    p = Projection("cam.image", torch.Tensor, shape, torch.uint8)

    got = _json(p, tensor, 1_500_000_001)

    assert p.schema_name == "foxglove.RawImage"
    assert got["timestamp"] == {"sec": 1, "nsec": 500_000_001}
    assert (got["frame_id"], got["width"], got["height"], got["encoding"]) == (
        "cam.image", 3, 2, encoding)
    assert got["step"] == 3 * (1 if encoding == "mono8" else 3)
    hwc = tensor.permute(1, 2, 0) if shape[0] == 3 else tensor
    assert base64.b64decode(got["data"]) == hwc.contiguous().numpy().tobytes()


def test_a_port_that_does_not_declare_uint8_is_not_an_image_port() -> None:
    p = Projection("cam.image", torch.Tensor, (None, None, 3), None)

    assert p.schema_name != "foxglove.RawImage"
    assert _json(p, torch.zeros(1, 1, 3, dtype=torch.uint8))["shape"] == [1, 1, 3]


def test_from_json_makes_the_declared_type() -> None:
    assert from_json({"value": 2}, float) == 2.0 and type(from_json(2, float)) is float
    assert math.isnan(from_json({"value": None}, float))
    t = from_json({"data": [[1, 2]]}, torch.Tensor, (1, 2), torch.float64)
    assert t.dtype == torch.float64 and t.tolist() == [[1.0, 2.0]]
    assert from_json({"force": 1, "step": 2}, Command) == Command(1.0, 2)
    image = Projection("c.i", torch.Tensor, (3, None, None), torch.uint8)
    sent = torch.arange(12, dtype=torch.uint8).reshape(3, 2, 2)
    back = from_json(image.to_json(sent, 0), torch.Tensor, (3, None, None), torch.uint8)
    assert torch.equal(back, sent)


def test_from_json_refuses_what_cannot_be_the_declared_type() -> None:
    with pytest.raises(TypeError, match="expected a number"):
        from_json({"value": "x"}, float)
    with pytest.raises(ValueError, match="no field"):
        from_json({"force": 1, "nope": 2}, Command)


# -- Recording(view=True) --------------------------------------------------------------------------


class Plant(mujou.Node):
    state = mujou.Output(torch.Tensor, shape=(2,), dtype=torch.float64)
    energy = mujou.Output(float)
    command = mujou.Output(Command)
    image = mujou.Output(torch.Tensor, shape=(4, 4), dtype=torch.uint8)

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.state.send(torch.tensor([self.n * 0.1, -1.0], dtype=torch.float64))
        self.energy.send(math.nan if self.n == 2 else self.n / 4)
        self.command.send(Command(self.n * 0.5, self.n))
        self.image.send(torch.full((4, 4), self.n, dtype=torch.uint8))


def _record(record: pathlib.Path | mujou.Recording) -> None:
    mujou.run({"plant": Plant()}, timer="simulated", duration=0.05, seed=1,
              record=record).join(timeout=60)


def test_a_view_recording_writes_a_json_view_channel_beside_each_recorded_output(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "run.mcap"

    _record(mujou.Recording(path, view=True))

    info = mcapfile.info(path)
    assert [c.topic for c in info.channels] == ["plant.state", "plant.energy", "plant.command",
                                                "plant.image"]
    assert [(v.topic, v.view_of, v.count) for v in info.views] == [
        (f"/view/{c.topic}", c.topic, c.count) for c in info.channels]
    views = [v for v in mcapfile.Reader(path).views()]
    energy = [value for topic, _, _, value in views if topic == "plant.energy"]
    assert energy == [{"value": 0.25}, {"value": None}, {"value": 0.75}, {"value": 1.0},
                      {"value": 1.25}]
    command = [(seq, t, value) for topic, seq, t, value in views if topic == "plant.command"]
    assert command[0] == (0, 10_000_000, {"force": 0.5, "step": 1})
    state = [value for topic, _, _, value in views if topic == "plant.state"]
    assert state[2] == {"shape": [2], "dtype": "float64", "data": [0.30000000000000004, -1.0]}


def test_the_view_channels_are_json_with_json_schemas_that_any_mcap_reader_reads(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "run.mcap"
    _record(mujou.Recording(path, view=True))

    with open(path, "rb") as f:
        seen = {}
        for schema, channel, message in make_reader(f).iter_messages():
            if channel.topic.startswith("/view/"):
                seen.setdefault(channel.topic, (schema, channel, json.loads(message.data)))

    image_schema, image_channel, image = seen["/view/plant.image"]
    assert (image_channel.message_encoding, image_schema.name, image_schema.encoding) == (
        "json", "foxglove.RawImage", "jsonschema")
    assert (image["width"], image["height"], image["encoding"]) == (4, 4, "mono8")
    assert base64.b64decode(image["data"]) == bytes([1] * 16)
    float_schema = json.loads(seen["/view/plant.energy"][0].data)
    assert float_schema["properties"]["value"]["type"] == ["number", "null"]


def test_the_lossless_channels_are_unchanged_by_the_views_and_replay_bit_for_bit(
        tmp_path: pathlib.Path) -> None:
    plain, viewed = tmp_path / "plain.mcap", tmp_path / "viewed.mcap"
    _record(plain)
    _record(mujou.Recording(viewed, view=True))

    a = list(mcapfile.read(plain, types={"plant.command": Command}))
    b = list(mcapfile.read(viewed, types={"plant.command": Command}))

    assert mcapfile.info(plain).views == []
    assert len(a) == len(b) == 20
    for x, y in zip(a, b, strict=True):
        assert x[:4] == y[:4]
        if isinstance(x.message, torch.Tensor):
            assert torch.equal(x.message, y.message) and x.message.dtype == y.message.dtype
        elif isinstance(x.message, float) and math.isnan(x.message):
            assert math.isnan(y.message)
        else:
            assert x.message == y.message
    assert assert_replay_matches(viewed, {"plant": Plant()}) == 20


# Quick all the same: the quick subset's one run placed in processes of their own, so
# that it exercises the process machinery (distributed/system.py, actors, admin) at all.
@pytest.mark.timeout(180)
def test_a_placed_run_writes_the_same_views_as_one_process(tmp_path: pathlib.Path) -> None:
    from tests.placed_support import make_net

    one, placed = tmp_path / "one.mcap", tmp_path / "placed.mcap"
    mujou.run(make_net(), timer="simulated", duration=0.2, seed=3,
              record=mujou.Recording(one, view=True)).join(timeout=60)

    run = mujou.run("tests.placed_support:make_net", placement={"ctrl": "c"},
                    timer="simulated", duration=0.2, seed=3,
                    record=mujou.Recording(placed, view=True))
    run.join(timeout=120)

    def views(path: pathlib.Path) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for topic, seq, t, value in mcapfile.Reader(path).views():
            out.setdefault(topic, []).append((seq, t, value))
        return out

    assert views(placed) == views(one) and sum(map(len, views(one).values())) > 20
