"""The JSON view of messages: what Foxglove's panels show of a port, and back.

A *view* is a JSON projection of a message, made for plotting and looking at
(Foxglove's Plot, Raw Messages, Image panels), not for replay: the lossless
channel of a recording stays the snapshot codec's. The recorder writes it
beside the lossless channel (``Recording(view=True)``) and the live server
(`mujou_actors.recording.liveview`) sends it to a Foxglove client. The rules:

* **A message becomes a JSON object.** A dict, NamedTuple, dataclass or tensor
  is one already; anything else (a number, a str, a list) is wrapped as
  ``{"value": ...}``, so that a float port plots as ``.value``.
* **Scalars**: ``None``, ``bool``, ``int`` and ``str`` as JSON has them; a
  ``float`` as a JSON number, except NaN and the infinities, which become
  ``null`` (JSON has no such numbers; Foxglove's Plot leaves a gap there);
  ``bytes`` as a base64 str.
* **Containers**: lists and tuples as arrays; dicts as objects (keys made
  str); NamedTuples and dataclasses as objects of their fields. At most
  `MAX_DEPTH` (32) levels deep; below that a value is ``null``.
* **Tensors** of at most `MAX_ELEMENTS` (1024) elements:
  ``{"shape", "dtype", "data"}``, ``data`` the nested list of the values
  (non-finite floats ``null``; a complex tensor's elements ``[re, im]``); a
  real tensor of two or more dimensions and at most `PLOT_ELEMENTS` (64) also
  ``flat``, its values in row-major order, which Foxglove's Plot indexes
  (``.flat[3]``; a 1-d tensor plots as ``.data[3]``).
  Larger tensors: ``{"shape", "dtype", "numel", "min", "max", "mean"}``, the
  statistics over the finite values (``null`` when there are none; none for
  a complex tensor).
* **Images**: a port that declares ``dtype=torch.uint8`` and a shape ``(H, W)``,
  ``(H, W, C)`` or ``(C, H, W)`` with C 1, 3 or 4 (given by the declaration:
  its last dimension if that is 1, 3 or 4, else its first) is an *image
  port*: its view is Foxglove's well-known ``foxglove.RawImage``
  (``timestamp``, ``frame_id`` (the port's path), ``width``, ``height``,
  ``encoding`` ``"mono8"``, ``"rgb8"`` or ``"rgba8"``, ``step``, ``data``
  base64), which the Image panel shows. A port that does not declare both
  is never an image port: the schema of a channel is fixed, and Foxglove
  picks a panel by it.
* **Anything else** (an object of a port typed ``object``): its ``repr``,
  at most 256 characters.
* **A Foxglove schema** declared by the Output (``Output(dict,
  foxglove="foxglove.SceneUpdate")``): the message's view is its JSON object
  as above (a dict's keys and values, a NamedTuple's or dataclass's fields),
  which the node makes in that schema's fields, and the channel's schema is
  named so, which is how Foxglove picks its panels (the 3D panel takes
  ``foxglove.FrameTransform`` and ``foxglove.SceneUpdate``). A ``timestamp``
  the object lacks, at its top level and in each object of a list at its top
  level (a SceneUpdate's entities and deletions), is the message's time, so a
  node need not know its time to stamp what it sends.

Every view channel has a JSON Schema (`Projection.schema`, draft 2020-12).
`from_json` goes the other way: the JSON a client publishes, made into a
message of an Input's declared type.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import typing
from typing import Any

import torch

__all__: list[str] = []  # nothing public: `Projection` is the recorder's and the live server's

MAX_ELEMENTS = 1024
"""The most elements of a tensor whose values a view holds; larger ones get statistics."""

PLOT_ELEMENTS = 64
"""The most elements of a tensor of two or more dimensions whose view also holds ``flat``.

Foxglove's Plot panel indexes one array (``/sim.state.flat[3]``); ``data`` is
nested for such a tensor. A 0-d or 1-d tensor's ``data`` is flat already."""

MAX_DEPTH = 32
"""The most levels of containers a view holds; deeper values are ``null``."""

MAX_REPR = 256
"""The most characters of the ``repr`` that stands for a value JSON cannot hold."""

IMAGE_SCHEMA_NAME = "foxglove.RawImage"

_ENCODINGS = {1: "mono8", 3: "rgb8", 4: "rgba8"}
_CHANNELS = {v: k for k, v in _ENCODINGS.items()}
_SCALAR_SCHEMAS: dict[type, dict[str, Any]] = {
    bool: {"type": "boolean"}, int: {"type": "integer"}, float: {"type": ["number", "null"]},
    str: {"type": "string"}, bytes: {"type": "string", "contentEncoding": "base64"},
    type(None): {"type": "null"},
}
_TENSOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "shape": {"type": "array", "items": {"type": "integer"}},
        "dtype": {"type": "string"},
        "data": {"description": "nested list of the values (at most 1024 elements)"},
        "flat": {"type": "array", "items": {"type": ["number", "boolean", "null"]},
                 "description": "the values in row-major order, for Plot: a tensor of two "
                                "or more dimensions and at most 64 elements"},
        "numel": {"type": "integer"},
        "min": {"type": ["number", "null"]},
        "max": {"type": ["number", "null"]},
        "mean": {"type": ["number", "null"]},
    },
    "required": ["shape", "dtype"],
}
_TIME_SCHEMA = {"type": "object", "properties": {"sec": {"type": "integer", "minimum": 0},
                                                 "nsec": {"type": "integer", "minimum": 0}}}
IMAGE_SCHEMA: dict[str, Any] = {
    "title": IMAGE_SCHEMA_NAME,
    "description": "A raw image (Foxglove's well-known schema)",
    "type": "object",
    "properties": {
        "timestamp": _TIME_SCHEMA,
        "frame_id": {"type": "string"},
        "width": {"type": "integer", "minimum": 0},
        "height": {"type": "integer", "minimum": 0},
        "encoding": {"type": "string"},
        "step": {"type": "integer", "minimum": 0},
        "data": {"type": "string", "contentEncoding": "base64"},
    },
    "required": ["timestamp", "frame_id", "width", "height", "encoding", "step", "data"],
}
"""The JSON Schema of ``foxglove.RawImage`` (JSON encoding: ``data`` in base64)."""


def _name(cls: Any) -> str:
    return f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else str(cls)


def _fields(cls: type) -> list[str] | None:
    """A NamedTuple's or a dataclass's field names; None for other types."""
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return list(cls._fields)
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return None


def _hints(cls: type) -> dict[str, Any]:
    """A class's resolved field annotations ({} when they do not resolve)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - a name an annotation uses is missing: no hints
        return {}


def image_layout(shape: tuple[int | None, ...] | None, dtype: torch.dtype | None,
                 ) -> tuple[str, int] | None:
    """Whether a port's declaration makes it an image port, and how.

    Args:
        shape (tuple[int | None, ...] | None): the declared shape.
        dtype (torch.dtype | None): the declared dtype.

    Returns:
        tuple[str, int] | None: ``("hwc", channels)`` or ``("chw", channels)``
        (a rank-2 shape is ``("hwc", 1)``); None: not an image port.
    """
    if dtype is not torch.uint8 or shape is None:
        return None
    if len(shape) == 2:
        return ("hwc", 1)
    if len(shape) != 3:
        return None
    if shape[2] in _ENCODINGS:
        return ("hwc", shape[2])
    if shape[0] in _ENCODINGS:
        return ("chw", shape[0])
    return None


def schema_of(cls: Any, depth: int = 0) -> dict[str, Any]:
    """The JSON Schema of a value of declared type ``cls`` (not wrapped in ``value``).

    Args:
        cls (Any): the declared type (an annotation that is not a class: any).
        depth (int): levels already walked (fields of fields stop at `MAX_DEPTH`).

    Returns:
        dict: the schema.
    """
    if not isinstance(cls, type) or depth >= MAX_DEPTH:
        return {}
    for scalar, schema in _SCALAR_SCHEMAS.items():
        if cls is scalar:
            return dict(schema)
    if issubclass(cls, torch.Tensor):
        return dict(_TENSOR_SCHEMA)
    names = _fields(cls)
    if names is not None:
        hints = _hints(cls)
        return {"type": "object", "title": _name(cls),
                "properties": {n: schema_of(hints.get(n), depth + 1) for n in names}}
    if issubclass(cls, dict):
        return {"type": "object"}
    if issubclass(cls, (list, tuple)):
        return {"type": "array"}
    return {}


def _wraps(cls: Any) -> bool:
    """Whether a message of declared type ``cls`` is wrapped as ``{"value": ...}``."""
    if not isinstance(cls, type):
        return True  # object, Any: the message decides (see project)
    return not (issubclass(cls, (torch.Tensor, dict)) or _fields(cls) is not None)


def finite(x: float) -> float | None:
    """``x``, or None for NaN and the infinities (JSON has none: shown as null)."""
    return x if math.isfinite(x) else None


def _nonfinite_to_null(values: Any) -> Any:
    """A tensor's ``tolist()`` with NaN and the infinities made None (its rank deep)."""
    if isinstance(values, list):
        return [_nonfinite_to_null(v) for v in values]
    return finite(values) if isinstance(values, float) else values


def project_tensor(t: torch.Tensor, max_elements: int = MAX_ELEMENTS) -> dict[str, Any]:
    """A tensor's view: its values up to ``max_elements``, else its statistics.

    Args:
        t (torch.Tensor): any tensor (a CUDA one is copied to the CPU).
        max_elements (int): the most elements whose values the view holds
            (``mujou cat`` shows fewer, ``--full`` all). Default: `MAX_ELEMENTS`.

    Returns:
        dict: ``{"shape", "dtype", "data"}`` or ``{"shape", "dtype", "numel",
        "min", "max", "mean"}``.
    """
    # A view of up to MAX_ELEMENTS values is made without torch operations but tolist():
    # most let the GIL go and take it back, and the sender of a watched port waits for
    # it each time (5.6 us a 16-value tensor with torch.isfinite and friends; see
    # benchmarks/view.py). The dtype's and the shape's attributes are plain reads.
    if t.device.type != "cpu":
        t = t.detach().cpu()
    dtype = t.dtype
    shape = list(t.shape)
    out: dict[str, Any] = {"shape": shape, "dtype": str(dtype).removeprefix("torch.")}
    n = math.prod(shape)
    if dtype.is_complex:
        if n <= max_elements:
            out["data"] = _nonfinite_to_null(torch.view_as_real(t.resolve_conj()).tolist())
        else:
            out["numel"] = n
        return out
    if n <= max_elements:
        data = t.tolist()
        if dtype.is_floating_point and not _all_finite(data, len(shape)):
            data = _nonfinite_to_null(data)  # a walk in Python: only when needed
        out["data"] = data
        if len(shape) > 1 and n <= PLOT_ELEMENTS:
            out["flat"] = _flat(data, len(shape))
        return out
    out["numel"] = n
    values = t.detach().to(torch.float64).flatten()
    values = values[torch.isfinite(values)]
    if values.numel() == 0:
        out.update(min=None, max=None, mean=None)
    else:
        out.update(min=finite(values.min().item()), max=finite(values.max().item()),
                   mean=finite(values.mean().item()))
    return out


def _flat(values: list[Any], rank: int) -> list[Any]:
    """A nested list ``rank`` deep, its leaves in row-major order (no recursion: rank <= 64)."""
    for _ in range(rank - 1):
        values = [v for row in values for v in row]
    return values


def _all_finite(values: Any, rank: int) -> bool:
    """Whether a float tensor's ``tolist()`` (``rank`` deep) holds no NaN and no infinity."""
    if rank == 0:
        return math.isfinite(values)
    if rank == 1:
        return all(map(math.isfinite, values))
    return all(_all_finite(v, rank - 1) for v in values)


def project(message: Any, max_elements: int = MAX_ELEMENTS) -> Any:
    """A message's JSON value (not wrapped): see the module docstring for the rules.

    Args:
        message (Any): any message.
        max_elements (int): the most elements of a tensor whose values the
            value holds; larger tensors get statistics. Default: `MAX_ELEMENTS`.

    Returns:
        Any: something `json.dumps` writes with ``allow_nan=False``.
    """
    return _project(message, 0, max_elements)


def _project(value: Any, depth: int, limit: int = MAX_ELEMENTS) -> Any:
    vt = type(value)
    if vt is float:
        return finite(value)
    if value is None or vt is bool or vt is int or vt is str:
        return value
    if depth >= MAX_DEPTH:
        return None
    if isinstance(value, torch.Tensor):
        return project_tensor(value, limit)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, float):  # a float subclass (numpy's float64)
        return finite(float(value))
    if isinstance(value, (int, str)):  # subclasses (an IntEnum); a bool was taken above
        return value
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {name: _project(v, depth + 1, limit) for name, v in zip(value._fields, value,
                                                                   strict=False)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _project(getattr(value, f.name), depth + 1, limit)
                for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _project(v, depth + 1, limit)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_project(v, depth + 1, limit) for v in value]
    return repr(value)[:MAX_REPR]


def image(t: torch.Tensor, layout: tuple[str, int], t_ns: int, frame_id: str) -> dict[str, Any]:
    """A uint8 image tensor as a ``foxglove.RawImage`` JSON object.

    Args:
        t (torch.Tensor): ``(H, W)``, ``(H, W, C)`` or ``(C, H, W)``, uint8.
        layout (tuple[str, int]): `image_layout`'s answer for its port.
        t_ns (int): its time, ns (negative: 0).
        frame_id (str): the frame (the port's path).

    Returns:
        dict: the RawImage.

    Raises:
        ValueError: the tensor is not such an image.
    """
    order, _ = layout
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype != torch.uint8 or t.dim() not in (2, 3):
        raise ValueError(f"not a uint8 image: shape {tuple(t.shape)}, {t.dtype}")
    if t.dim() == 2:
        t = t.unsqueeze(2)
    elif order == "chw":
        t = t.permute(1, 2, 0)
    height, width, channels = t.shape
    if channels not in _ENCODINGS:
        raise ValueError(f"an image has 1, 3 or 4 channels, got {channels}")
    t_ns = max(t_ns, 0)
    return {"timestamp": {"sec": t_ns // 1_000_000_000, "nsec": t_ns % 1_000_000_000},
            "frame_id": frame_id, "width": width, "height": height,
            "encoding": _ENCODINGS[channels], "step": width * channels,
            "data": base64.b64encode(t.contiguous().numpy().tobytes()).decode("ascii")}


class Projection:
    """The view of one port: its schema, and its messages as JSON bytes.

    Args:
        topic (str): the port's path (an image's ``frame_id``).
        type_ (Any): the declared message type.
        shape (tuple[int | None, ...] | None): a tensor port's declared shape.
        dtype (torch.dtype | None): a tensor port's declared dtype.
        foxglove (str | None): the Foxglove schema the Output declares
            (``Output(dict, foxglove="foxglove.SceneUpdate")``): the view's
            schema name, its messages stamped where they lack a ``timestamp``.
    """

    def __init__(self, topic: str, type_: Any, shape: tuple[int | None, ...] | None = None,
                 dtype: torch.dtype | None = None, foxglove: str | None = None) -> None:
        self.topic = topic
        self.layout = None if foxglove is not None else image_layout(shape, dtype)
        self.foxglove = foxglove
        self.schema: dict[str, Any]
        if foxglove is not None:
            # Foxglove knows its own schemas by name: the JSON Schema only says what the
            # declared type says (a NamedTuple's fields), and where the schema is defined.
            self.schema_name = foxglove
            self.schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
                           **schema_of(type_), "type": "object", "title": foxglove,
                           "description": f"Foxglove's {foxglove} (see "
                                          "https://docs.foxglove.dev/docs/visualization/"
                                          "message-schemas/introduction)"}
        elif self.layout is not None:
            self.schema_name = IMAGE_SCHEMA_NAME
            self.schema = IMAGE_SCHEMA
        else:
            inner = schema_of(type_)
            wrap = _wraps(type_)
            self.schema_name = f"mujou.view.{_name(type_)}"
            self.schema = ({"type": "object", "properties": {"value": inner}} if wrap
                           else inner)
            self.schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
                           **self.schema, "title": self.schema_name}

    @classmethod
    def of(cls, port: Any) -> Projection:
        """The projection of a bound port (its path, type, shape, dtype and Foxglove schema)."""
        return cls(port.path, port.type, port.shape, port.dtype,
                   getattr(port, "foxglove", None))

    def to_json(self, message: Any, t_ns: int) -> dict[str, Any]:
        """The message's view, a JSON object.

        Args:
            message (Any): the message.
            t_ns (int): its time, ns (an image's timestamp).

        Returns:
            dict: the JSON object.
        """
        if self.layout is not None and isinstance(message, torch.Tensor):
            return image(message, self.layout, t_ns, self.topic)
        value = _project(message, 0)
        if type(value) is not dict:
            return {"value": value}
        if self.foxglove is not None:
            _stamp_missing(value, t_ns)
        return value

    def encode(self, message: Any, t_ns: int) -> bytes:
        """The message's view as UTF-8 JSON (always valid JSON: no NaN).

        Args:
            message (Any): the message.
            t_ns (int): its time, ns.

        Returns:
            bytes: the JSON text.
        """
        return json.dumps(self.to_json(message, t_ns), allow_nan=False,
                          separators=(",", ":")).encode()


def _stamp_missing(value: dict[str, Any], t_ns: int) -> None:
    """Give a Foxglove message's view the time ``t_ns`` where it lacks a ``timestamp``.

    At its top level and in each object of a list at its top level (a
    SceneUpdate's entities and deletions, a FrameTransforms' transforms).
    ``value`` is the view just made (`_project` built it): changed in place.
    """
    t = max(t_ns, 0)
    when = {"sec": t // 1_000_000_000, "nsec": t % 1_000_000_000}
    for item in [value, *(i for v in value.values() if type(v) is list for i in v)]:
        if type(item) is dict and "timestamp" not in item:
            item["timestamp"] = dict(when)


# -- from JSON: what a client publishes to an Input ----------------------------------------


def from_json(value: Any, type_: Any, shape: tuple[int | None, ...] | None = None,
              dtype: torch.dtype | None = None) -> Any:
    """A message of a port's declared type from the JSON a client sent.

    The inverse of the view where it has one: ``{"value": x}`` for a port
    whose view wraps is ``x``; a tensor port takes a nested list, or an object
    with ``data`` (a tensor's view), made a tensor of the declared dtype (else
    torch's default for the values); an image port also takes a
    ``foxglove.RawImage`` object; ``null`` on a float port is NaN; a
    NamedTuple or dataclass port takes an object of its fields (each made its
    annotated type the same way). The port's own check (``Run.write``) then
    refuses what does not fit.

    Args:
        value (Any): the parsed JSON.
        type_ (Any): the declared type.
        shape (tuple[int | None, ...] | None): a tensor port's declared shape.
        dtype (torch.dtype | None): a tensor port's declared dtype.

    Returns:
        Any: the message.

    Raises:
        TypeError / ValueError: the JSON cannot be made that type.
    """
    return _from_json(value, type_, shape, dtype, 0)


def _from_json(value: Any, type_: Any, shape: Any, dtype: Any, depth: int) -> Any:
    if depth >= MAX_DEPTH:
        raise ValueError(f"nested more than {MAX_DEPTH} levels")
    if _wraps(type_) and isinstance(value, dict) and set(value) == {"value"}:
        value = value["value"]
    if not isinstance(type_, type):
        return value
    if issubclass(type_, torch.Tensor):
        return _tensor(value, shape, dtype)
    if type_ is float:
        if value is None:
            return math.nan
        if type(value) in (int, float):
            return float(value)
        raise TypeError(f"expected a number, got {type(value).__name__}")
    if type_ is bytes and isinstance(value, str):
        return base64.b64decode(value, validate=True)
    names = _fields(type_)
    if names is not None:
        if not isinstance(value, dict):
            raise TypeError(f"expected an object with the fields {names}, got "
                            f"{type(value).__name__}")
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise ValueError(f"no field {unknown} in {type_.__name__} (fields: {names})")
        hints = _hints(type_)
        return type_(**{k: _from_json(v, hints.get(k), None, None, depth + 1)
                        for k, v in value.items()})
    if issubclass(type_, tuple) and isinstance(value, list):
        return tuple(value)
    return value


def _tensor(value: Any, shape: Any, dtype: Any) -> torch.Tensor:
    layout = image_layout(shape, dtype)
    if layout is not None and isinstance(value, dict) and "encoding" in value:
        return _from_image(value, layout, len(shape))
    if isinstance(value, dict):
        if "data" not in value:
            raise ValueError("a tensor is a nested list, or an object with 'data'")
        value = value["data"]
    if isinstance(value, bool | int | float | None) or isinstance(value, list):
        data = _null_to_nan(value)
        return torch.tensor(data, dtype=dtype)
    raise TypeError(f"a tensor is a nested list of numbers, got {type(value).__name__}")


def _null_to_nan(values: Any) -> Any:
    if isinstance(values, list):
        return [_null_to_nan(v) for v in values]
    return math.nan if values is None else values


def _from_image(value: dict[str, Any], layout: tuple[str, int], rank: int) -> torch.Tensor:
    """A ``foxglove.RawImage`` object as a uint8 tensor laid out as its port declares."""
    encoding = value.get("encoding")
    if encoding not in _CHANNELS:
        raise ValueError(f"image encoding {encoding!r} (supported: {sorted(_CHANNELS)})")
    channels = _CHANNELS[encoding]
    width, height = int(value["width"]), int(value["height"])
    raw = base64.b64decode(value["data"], validate=True)
    if len(raw) != width * height * channels:
        raise ValueError(f"an image of {width}x{height} {encoding} has "
                         f"{width * height * channels} bytes, got {len(raw)}")
    t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(height, width, channels)
    if layout[0] == "chw":
        return t.permute(2, 0, 1).contiguous()
    return t.squeeze(2) if rank == 2 else t
