"""The views of a recording's messages, made from its lossless channels alone.

``mujou cat``, ``mujou export-view`` and ``mujou view`` show a recording as
the live view shows a run: each message made JSON by `mujou_actors.recording.view`'s
`Projection`. A recording names its ports' declared types as text
(``module:qualname``) and this module never imports what a file names: a
channel's projection is made from what the file says of it, within these
rules:

* ``torch:Tensor`` and the builtin scalar and container types
  (``builtins:float``, ``int``, ``bool``, ``str``, ``bytes``, ``NoneType``,
  ``dict``, ``list``, ``tuple``) are those types, so their views, schemas and
  image ports (a declared ``uint8`` shape) are what the recorder writes with
  ``Recording(view=True)``, byte for byte;
* a NamedTuple or a dataclass (a schema with ``fields``) is a stand-in class of
  the recorded name and field names (each field typed as above, else
  untyped), and a message (a tuple or a dict, as `mcapfile.read` gives it
  without ``types=``) is shown as the object of its fields; a field whose type
  is itself such a class is shown as the reader gives it (an array or an
  object) with an empty schema;
* any other type is shown as the live view shows a port typed ``object``.

A channel whose Output declared a Foxglove schema (``Output(dict,
foxglove="foxglove.SceneUpdate")``, the file's channel metadata ``foxglove``)
keeps it: its view is made as the live view makes it.

The log channel (``Recording(log=True)``, ``/mujou/log``) is no port's: it is
listed apart (`mcapfile.RecordingInfo.logs`), and `export_view` copies it as
it is, beside the views.

Reading goes through `mujou_actors.recording.mcapfile`'s bounded reader: a file that is
not a recording, or is damaged, raises `mujou.RecordingError`.
"""

from __future__ import annotations

import builtins
import dataclasses
import fnmatch
import heapq
import json
import keyword
import os
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from . import mcapfile
from .view import Projection, project

__all__ = ["ChannelView", "Exported", "channel_views", "export_view", "select_topics"]

_BUILTINS = frozenset({"float", "int", "bool", "str", "bytes", "NoneType", "dict", "list",
                       "tuple", "object"})


def _declared_type(name: str) -> type | None:
    """The class a recording's type name stands for, if it is one this module knows.

    Args:
        name (str): ``module:qualname`` as the file names it.

    Returns:
        type | None: ``torch.Tensor`` or a builtin type; None for any other name
        (nothing is imported).
    """
    if name == "torch:Tensor":
        return torch.Tensor
    module, _, qualname = name.partition(":")
    if module == "builtins" and qualname in _BUILTINS:
        return type(None) if qualname == "NoneType" else getattr(builtins, qualname)
    return None


def _stand_in(name: str, fields: list[Any]) -> type | None:
    """A dataclass of the recorded name and fields (None if the fields are no identifiers)."""
    names = [f[0] for f in fields if isinstance(f, list) and len(f) == 2]
    if len(names) != len(fields) or len(set(names)) != len(names) or not all(
            isinstance(n, str) and n.isidentifier() and not keyword.iskeyword(n)
            for n in names):
        return None
    module, _, qualname = name.partition(":")
    typed = [(n, _declared_type(str(t)) or Any) for n, t in fields]
    cls = dataclasses.make_dataclass(qualname.rpartition(".")[2] or "Message", typed)
    cls.__module__, cls.__qualname__ = module or "recording", qualname or cls.__name__
    return cls


class ChannelView:
    """The view of one recorded channel: its `Projection`, and its messages as JSON.

    Args:
        channel (mcapfile.ChannelInfo): the channel, as `mcapfile.info` lists it.
    """

    def __init__(self, channel: mcapfile.ChannelInfo) -> None:
        self.channel = channel
        self.topic = channel.topic
        fields = channel.schema.get("fields") if isinstance(channel.schema, dict) else None
        cls = _declared_type(channel.type)
        self.fields: list[str] | None = None
        if cls is None and isinstance(fields, list):
            cls = _stand_in(channel.type, fields)
            if cls is not None:
                self.fields = [f[0] for f in fields]
        dtype = getattr(torch, channel.dtype, None) if channel.dtype else None
        shape = None if channel.shape is None else tuple(channel.shape)
        self.projection = Projection(channel.topic, cls if cls is not None else object,
                                     shape, dtype if isinstance(dtype, torch.dtype) else None,
                                     foxglove=channel.foxglove)

    def as_declared(self, message: Any) -> Any:
        """A NamedTuple's or dataclass's message (a tuple or a dict) as the object of its fields.

        Args:
            message (Any): a decoded message.

        Returns:
            Any: a dict of the fields for such a channel, else ``message``.
        """
        if self.fields is not None and isinstance(message, (list, tuple)) \
                and len(message) == len(self.fields):
            return dict(zip(self.fields, message, strict=True))
        return message

    def encode(self, message: Any, t_ns: int) -> bytes:
        """The message's view as the live view and ``Recording(view=True)`` write it (UTF-8 JSON).

        Args:
            message (Any): a decoded message.
            t_ns (int): its time, ns (an image's timestamp; negative: 0).

        Returns:
            bytes: the JSON text.
        """
        return self.projection.encode(self.as_declared(message), max(t_ns, 0))

    def summary(self, message: Any, max_elements: int | None) -> Any:
        """The message's JSON value for a terminal (``mujou cat``): not wrapped, no image.

        Args:
            message (Any): a decoded message.
            max_elements (int | None): the most elements of a tensor shown by
                value (larger ones by shape, dtype and statistics); None: all.

        Returns:
            Any: a JSON value.
        """
        limit = 1 << 62 if max_elements is None else max_elements
        return project(self.as_declared(message), limit)


def channel_views(info: mcapfile.RecordingInfo) -> dict[str, ChannelView]:
    """The view of each recorded channel of a recording, by topic (the net's order).

    Args:
        info (mcapfile.RecordingInfo): what `mcapfile.info` found.

    Returns:
        dict[str, ChannelView]: one per lossless channel (view channels left out).
    """
    return {c.topic: ChannelView(c) for c in info.channels}


def select_topics(info: mcapfile.RecordingInfo, patterns: Iterable[str]) -> list[str]:
    """The recorded topics that match any of ``patterns`` (globs), in the file's order.

    The log channel (``/mujou/log``), if the file has one, comes last.

    Args:
        info (mcapfile.RecordingInfo): the recording.
        patterns (Iterable[str]): Output paths or ``/mujou/log``, or ``fnmatch``
            globs (``"sim.*"``); none: every topic.

    Returns:
        list[str]: the topics.

    Raises:
        ValueError: a pattern matches no channel (the message names it and
            lists the channels).
    """
    topics = [c.topic for c in (*info.channels, *info.logs)]
    wanted = list(patterns)
    if not wanted:
        return topics
    for pattern in wanted:
        if not any(fnmatch.fnmatchcase(t, pattern) for t in topics):
            raise ValueError(f"{info.path} has no channel {pattern!r}; its channels: "
                             f"{', '.join(topics) or 'none'}")
    return [t for t in topics if any(fnmatch.fnmatchcase(t, p) for p in wanted)]


@dataclasses.dataclass(frozen=True)
class Exported:
    """What `export_view` wrote.

    Attributes:
        path (str): the file written.
        channels (int): view channels written.
        messages (dict[str, int]): view messages written per Output path.
        failed (dict[str, int]): messages whose view could not be made, per
            Output path (left out, as ``Recording(view=True)`` leaves them out).
        logs (int): log records copied (the source's ``/mujou/log``; 0: none).
    """

    path: str
    channels: int
    messages: dict[str, int]
    failed: dict[str, int]
    logs: int = 0


def merged(path: str, records: Iterable[mcapfile.Record], allow_damaged: bool = False,
           with_logs: bool = True) -> Iterator[mcapfile.Record | mcapfile.LogEntry]:
    """A recording's messages and its log records (`mcapfile.Reader.logs`), by time.

    Two passes over the file side by side: each in its own order (a
    simulated run's, by time), taken by time (the earlier first; a message
    before a record of the same time).

    Args:
        path (str): the recording.
        records (Iterable[mcapfile.Record]): its messages (`mcapfile.read`, or a part).
        allow_damaged (bool): read a damaged file up to its damage. Default: False.
        with_logs (bool): take the log records too; False: the messages alone.

    Returns:
        Iterator[mcapfile.Record | mcapfile.LogEntry]: both, as one stream.
    """
    if not with_logs:
        return iter(records)
    logs = mcapfile.Reader(path, allow_damaged=allow_damaged).logs()
    return heapq.merge(records, logs, key=lambda item: max(item.t_ns, 0))


def export_view(source: str | os.PathLike[str], target: str | os.PathLike[str], *,
                allow_damaged: bool = False) -> Exported:
    """Write the Foxglove view channels of a recording to a new MCAP file, running no node.

    ``target`` gets the ``mujou.run`` metadata of ``source`` and, for each of
    its recorded Outputs, the channel ``/view/<path>`` that
    ``mujou.Recording(path, view=True)`` would have written (JSON, its JSON Schema,
    ``foxglove.RawImage`` or the schema its Output declares, metadata
    ``mujou.view_of``), one message per lossless message at its time; and the
    source's log channel (``/mujou/log``, ``Recording(log=True)``), copied.
    Foxglove opens it as it is.

    Args:
        source (str | os.PathLike): a recording.
        target (str | os.PathLike): the file to write (replaced if it exists).
        allow_damaged (bool): export a damaged recording up to its first
            damaged record. Default: False.

    Returns:
        Exported: the channels and messages written.

    Raises:
        FileNotFoundError: ``source`` does not exist.
        RecordingError: ``source`` is not a mujou recording, or is damaged.
        ValueError: ``target`` is ``source``.
        OSError: ``target`` cannot be written.
    """
    source, target = os.fspath(source), os.fspath(target)
    if os.path.exists(target) and os.path.samefile(source, target):
        raise ValueError(f"export_view: {target!r} is the recording itself; name another file")
    found = mcapfile.info(source, allow_damaged=allow_damaged)
    views = channel_views(found)
    writer = mcapfile.Writer(target + ".part")
    try:
        writer.write_run({**found.run, "view_of": os.path.basename(source)})
        ids = {topic: writer.add_view_channel(topic, v.projection.schema_name,
                                              v.projection.schema)
               for topic, v in views.items()}
        log_id = writer.add_log_channel() if found.logs else -1
        counts = dict.fromkeys(views, 0)
        failed: dict[str, int] = {}
        logs = 0
        for record in merged(source, mcapfile.read(source, allow_damaged=allow_damaged),
                             allow_damaged, with_logs=log_id >= 0):
            if isinstance(record, mcapfile.LogEntry):
                writer.write(log_id, record.t_ns, json.dumps(
                    record.to_json(), separators=(",", ":")).encode())
                logs += 1
                continue
            view = views[record.topic]
            try:
                data = view.encode(record.message, record.t_ns)
            except Exception:  # noqa: BLE001 - a view never fails the export (nor a recording)
                failed[record.topic] = failed.get(record.topic, 0) + 1
                continue
            writer.write(ids[record.topic], max(record.t_ns, 0), data)
            counts[record.topic] += 1
        writer.close()
    except BaseException:
        writer.abandon()
        if os.path.exists(target + ".part"):
            os.unlink(target + ".part")
        raise
    os.replace(target + ".part", target)
    return Exported(target, len(ids), counts, failed, logs)
