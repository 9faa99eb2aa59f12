"""An Output declared with a Foxglove schema (``Output(dict, foxglove=...)``): its view.

What Foxglove's 3D panel needs of a channel: the schema's name (``foxglove.FrameTransform``,
``foxglove.SceneUpdate``) and the message's fields. The live view, a recording's view
channels, ``export-view`` and ``mujou view`` all give the same; a ``timestamp`` the message
lacks is its send time.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import NamedTuple

import pytest
import torch

import mujou_actors as mujou
from mujou_actors.errors import RecordingError
from mujou_actors.recording import mcapfile
from mujou_actors.recording.recview import channel_views, export_view
from mujou_actors.recording.view import Projection

MS = 1_000_000


class Pose(NamedTuple):
    """A NamedTuple of Foxglove's fields: its view is the object of its fields.

    Its nested value is a dict: a recording's readers give a nested NamedTuple
    back as an array (docs/recording.md), which is no Foxglove object.
    """

    position: dict
    frame_id: str


class Scene(mujou.Node):
    """Every 10 ms: a transform (a dict) and a scene whose second entity has its own timestamp."""

    transform = mujou.Output(dict, foxglove="foxglove.FrameTransform")
    scene = mujou.Output(dict, foxglove="foxglove.SceneUpdate")
    pose = mujou.Output(Pose, foxglove="foxglove.PoseInFrame")
    plain = mujou.Output(dict)

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.k = 0

    def on_update(self, dt: float) -> None:
        self.k += 1
        self.transform.send({"parent_frame_id": "world", "child_frame_id": "cart",
                             "translation": {"x": float(self.k), "y": 0.0, "z": 0.0},
                             "rotation": {"x": 0.0, "y": 0.0, "z": 0.0, "w": 1.0}})
        self.scene.send({"deletions": [], "entities": [
            {"frame_id": "cart", "id": "bob", "spheres": [
                {"pose": {"position": {"x": 0.0, "y": 0.0, "z": 0.6}}, "size": {
                    "x": 0.1, "y": 0.1, "z": 0.1}, "color": {"r": 1, "g": 0, "b": 0, "a": 1}}]},
            {"frame_id": "cart", "id": "old", "timestamp": {"sec": 7, "nsec": 0}},
        ]})
        self.pose.send(Pose({"x": 1.0, "y": 2.0, "z": 3.0}, "cart"))
        self.plain.send({"k": self.k})


def test_foxglove_is_checked_when_the_output_is_declared() -> None:
    assert mujou.Output(dict, foxglove="foxglove.SceneUpdate").foxglove == "foxglove.SceneUpdate"
    assert mujou.Output(dict).foxglove is None
    assert Scene().transform.foxglove == "foxglove.FrameTransform"  # the node's own copy

    @dataclasses.dataclass
    class Fields:
        frame_id: str

    assert mujou.Output(Fields, foxglove="my_msgs/Thing").foxglove == "my_msgs/Thing"
    for type_ in (float, torch.Tensor, object, list):
        with pytest.raises(TypeError, match="needs messages whose view is a JSON object"):
            mujou.Output(type_, foxglove="foxglove.Log")
    with pytest.raises(TypeError, match="takes a Foxglove schema's name"):
        mujou.Output(dict, foxglove=3)  # type: ignore[arg-type]
    for name in ("", "foxglove..Log", "a b", "x" * 300):
        with pytest.raises(ValueError, match="dotted identifiers"):
            mujou.Output(dict, foxglove=name)


def test_the_view_is_named_after_the_schema_and_stamped_where_it_lacks_a_timestamp() -> None:
    projection = Projection("s.scene", dict, foxglove="foxglove.SceneUpdate")
    message = {"entities": [{"id": "a"}, {"id": "b", "timestamp": {"sec": 1, "nsec": 2}}],
               "deletions": [], "note": "x"}

    view = projection.to_json(message, 2_500_000_000)

    assert projection.schema_name == "foxglove.SceneUpdate"
    assert projection.schema["title"] == "foxglove.SceneUpdate"
    assert projection.schema["type"] == "object"
    stamp = {"sec": 2, "nsec": 500_000_000}
    assert view == {"entities": [{"id": "a", "timestamp": stamp},
                                 {"id": "b", "timestamp": {"sec": 1, "nsec": 2}}],
                    "deletions": [], "note": "x", "timestamp": stamp}
    assert "timestamp" not in message["entities"][0]  # the message itself is never changed
    plain = Projection("s.plain", dict)
    assert plain.to_json({"k": 1}, 5) == {"k": 1} and plain.schema_name.startswith(
        "mujou.view.")
    typed = Projection("s.pose", Pose, foxglove="foxglove.PoseInFrame")
    assert typed.schema["properties"]["frame_id"] == {"type": "string"}
    assert typed.to_json(Pose({"x": 1, "y": 2, "z": 3}, "f"), -1) == {
        "position": {"x": 1, "y": 2, "z": 3}, "frame_id": "f",
        "timestamp": {"sec": 0, "nsec": 0}}


def test_a_recording_keeps_the_schema_in_its_view_channels_and_in_export_view(
        tmp_path: pathlib.Path) -> None:
    path, out = tmp_path / "run.mcap", tmp_path / "view.mcap"
    mujou.run(Scene(), timer="simulated", duration=0.02,
              record=mujou.Recording(path, view=True)).join(timeout=60)
    done = export_view(path, out)
    info, exported = mcapfile.info(path), mcapfile.info(out)

    assert [(c.topic, c.foxglove) for c in info.channels] == [
        ("transform", "foxglove.FrameTransform"), ("scene", "foxglove.SceneUpdate"),
        ("pose", "foxglove.PoseInFrame"), ("plain", None)]
    names = [(c.topic, c.type) for c in info.views]
    assert names == [("/view/transform", "foxglove.FrameTransform"),
                     ("/view/scene", "foxglove.SceneUpdate"),
                     ("/view/pose", "foxglove.PoseInFrame"),
                     ("/view/plain", "mujou.view.builtins.dict")]
    assert [(c.topic, c.type) for c in exported.views] == names
    assert [c.schema for c in exported.views] == [c.schema for c in info.views]
    views = list(mcapfile.Reader(path).views())
    assert list(mcapfile.Reader(out).views()) == views and done.messages["scene"] == 2
    transform = [v for of, _, _, v in views if of == "transform"]
    assert transform[1] == {"parent_frame_id": "world", "child_frame_id": "cart",
                            "translation": {"x": 2.0, "y": 0.0, "z": 0.0},
                            "rotation": {"x": 0.0, "y": 0.0, "z": 0.0, "w": 1.0},
                            "timestamp": {"sec": 0, "nsec": 20 * MS}}
    scene = next(v for of, _, t, v in views if of == "scene" and t == 10 * MS)
    bob, old = scene["entities"]
    assert bob["timestamp"] == {"sec": 0, "nsec": 10 * MS} and bob["spheres"][0]["pose"] == {
        "position": {"x": 0.0, "y": 0.0, "z": 0.6}}
    assert old["timestamp"] == {"sec": 7, "nsec": 0}  # given: kept
    # the lossless channel holds the message as sent, without the view's stamps
    sent = next(r.message for r in mcapfile.read(path) if r.topic == "scene")
    assert "timestamp" not in sent["entities"][0]
    # mujou view serves what the file's views hold (the same projection)
    projections = channel_views(info)
    assert projections["scene"].projection.schema_name == "foxglove.SceneUpdate"
    assert json.loads(projections["scene"].encode(sent, 10 * MS)) == scene


def test_the_live_view_advertises_the_schema_and_sends_the_stamped_message() -> None:
    pytest.importorskip("websockets.sync.client")
    from tests.test_foxglove import Client

    run = mujou.run(Scene(), timer="realtime", duration=5.0)
    server = mujou.serve_foxglove(run, 0)
    try:
        client = Client(server.port)
        client.recv_until(lambda: "transform" in client.channels, "the advertise")
        channel = client.channels["transform"]
        client.send({"op": "subscribe", "subscriptions": [{"id": 1,
                                                            "channelId": channel["id"]}]})
        client.recv_until(lambda: client.of(1), "a transform")
        client.unsubscribe_and_close(1)
    finally:
        server.close()
        run.stop()
        run.join(timeout=20)

    assert (channel["schemaName"], channel["encoding"]) == ("foxglove.FrameTransform", "json")
    assert json.loads(channel["schema"])["title"] == "foxglove.FrameTransform"
    assert client.channels["scene"]["schemaName"] == "foxglove.SceneUpdate"
    first = client.of(1)[0]
    sent_at = next(t for s, t, _ in client.data if s == 1)
    assert first["child_frame_id"] == "cart" and first["translation"]["x"] >= 1.0
    assert first["timestamp"] == {"sec": sent_at // 10**9, "nsec": sent_at % 10**9}


def test_a_file_whose_foxglove_name_is_no_schema_name_is_a_recording_error(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "bad.mcap"
    writer = mcapfile.Writer(path)
    writer.write_run({"format": mcapfile.FORMAT})
    spec = mcapfile.ChannelSpec("s.out", "s", "out", 0, dict, foxglove="foxglove.Scene\x1b[2J")
    writer.add_channel(spec)
    writer.close({})

    with pytest.raises(RecordingError, match="is not a schema's name"):
        mcapfile.info(path)
