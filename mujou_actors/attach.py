"""Attaching to a running net from another process: the runtime folder, the frames, the client.

What ``mujou ls``, ``nodes``, ``ports``, ``echo``, ``hz``, ``top`` and ``stats``
use (docs/cli.md, "Watching a running net"); the run's side, the endpoint
that answers, is `mujou_actors.endpoint`.

Where. Each run (one process or placed, started from Python or the CLI)
opens, as `mujou.run` returns, a Unix socket in the user's runtime folder
(`runtime_dir`: ``$MUJOU_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/mujou``, else
``/tmp/mujou-<uid>``). The folder is made with mode 0700 and checked before
anything is put in it (a folder, not a link, owned by this user, no access
for others); the socket is 0600, and each connection's peer must be this
user (``SO_PEERCRED``). Beside the socket, ``<id>.json`` holds the run's facts
(pid, file, start, timer, nodes), which `list_runs` reads; an entry whose
process is gone, or whose socket nobody listens on, is removed there. The
endpoint closes, and both files go, when the run ends (and at the process's
exit). Nothing listens on the network. ``MUJOU_ATTACH=0`` turns it off.

Frames. A 4-byte big-endian length, then a msgpack map: never pickle, no
extension types, decoded within msgpack's limits (a request at most
`MAX_REQUEST` bytes, an answer at most `MAX_FRAME`). A request is ``{"op":
...}``: ``hello``, ``nodes``, ``ports``, ``stats``, ``params`` (``path``
optional), ``set_param`` (``path``, ``value``: its text) (each answered by one
map with ``"ok"``; a refused set or an unknown parameter also with
``"refused": True``: `Refused`), or ``watch`` (a port: answered, then a stream
of batches until the client goes or the run ends).

Batches. A watch's batch holds ``items`` (``[t_ns, view]``, each view its own
msgpack bytes, made on the run's side), ``stamps`` (``hz``: send times only)
or a ``column``: messages that are all plain tensors of one dtype and shape
(the common case of a sensor's port) sent as their raw bytes back to back,
whose views the watcher makes (`column_items`), so that the watched process
spends a stack and a copy per batch, not a view per message.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import socket
import stat
import struct
import tempfile
from collections.abc import Iterator
from typing import Any

import msgpack

from .errors import AttachError, describe

__all__: list[str] = []  # nothing public: the `mujou` commands are its clients

log = logging.getLogger("mujou_actors")


PROTOCOL = 2
"""The version of the frames; ``hello`` answers it, and a client refuses another.

2: a watch's batch may be a ``column`` of tensors (`column_items`).
"""


MAX_REQUEST = 64 * 1024
"""The largest request frame a run reads, bytes; a longer one closes the connection."""


MAX_FRAME = 32 * 1024 * 1024
"""The largest answer frame, bytes (a message whose view is larger is replaced by a note)."""


LENGTH = struct.Struct(">I")  # a frame's length, before its msgpack body


COLUMN_CODES = {"float64": "d", "float32": "f", "float16": "e", "int64": "q", "int32": "i",
                "int16": "h", "int8": "b", "uint8": "B", "uint16": "H", "uint32": "I",
                "uint64": "Q", "bool": "?"}
"""The dtypes (torch's names) a ``column`` may hold, and their `struct` format characters."""


COLUMN_ELEMENTS = 1 << 20
"""The most cells of one ``column``: its rows times each row's cells (the product of
its shape, a zero dimension counted as one), 8 MiB of float64 at most."""


COLUMN_RANK = 8
"""The most dimensions of a ``column``'s tensors (deeper ones are viewed on the run's side)."""


PLOT_ELEMENTS = 64  # the views' ``flat`` bound: recording.view.PLOT_ELEMENTS (a test pins both)


def column_items(column: Any) -> list[list[Any]]:
    """A ``column`` batch's ``[t_ns, view]`` items: each row's view made here, in the watcher.

    A column is ``{"t_ns": [...], "dtype": name, "shape": [...], "data": bytes,
    "flat": bool}``: one row of ``prod(shape)`` values per send time, native
    byte order (the run is on this machine). Each view is what the run's side
    would have made of the tensor (``recording.view.project_tensor``, or
    ``endpoint.full`` when ``flat`` is false): its shape, dtype and values,
    NaN and the infinities as None, and ``flat`` (its values in row-major
    order) for a tensor of two or more dimensions and at most 64 elements.

    Raises:
        AttachError: a column that is not one (an unknown dtype, a shape or a
            data length that does not add up): nothing is allocated past
            what its bytes hold.
    """
    try:
        stamps, dtype, shape = column["t_ns"], column["dtype"], column["shape"]
        data, with_flat = column["data"], bool(column.get("flat"))
        code = COLUMN_CODES[dtype]
        if (not isinstance(stamps, list) or not isinstance(shape, list)
                or len(shape) > COLUMN_RANK
                or not all(type(dim) is int and dim >= 0 for dim in shape)
                or not isinstance(data, bytes)):
            raise TypeError("fields of the wrong types")
        n = math.prod(shape)
        if len(stamps) * cells(shape) > COLUMN_ELEMENTS:
            raise ValueError(f"{len(stamps)} rows of shape {shape}: over {COLUMN_ELEMENTS} cells")
        if len(data) != len(stamps) * n * struct.calcsize(code):
            raise ValueError(f"{len(data)} bytes for {len(stamps)} rows of shape {shape}")
        values = list(struct.unpack(f"={len(stamps) * n}{code}", data))
    except (KeyError, TypeError, ValueError, struct.error) as exc:
        raise AttachError(f"the run sent a column that is not one ({describe(exc)})") from None
    floating = code in "dfe"
    plot = with_flat and len(shape) > 1 and n <= PLOT_ELEMENTS
    items: list[list[Any]] = []
    for i, t_ns in enumerate(stamps):
        row = values[i * n:(i + 1) * n]
        if floating and not all(map(math.isfinite, row)):
            row = [v if math.isfinite(v) else None for v in row]
        view: dict[str, Any] = {"shape": shape, "dtype": dtype, "data": _nest(row, shape)}
        if plot:
            view["flat"] = row
        items.append([t_ns, view])
    return items


def cells(shape: Any) -> int:
    """A ``column`` row's cells: the product of its shape, a zero dimension counted as one.

    It bounds the lists a view of that shape holds as well as its values.
    """
    return math.prod(max(dim, 1) for dim in shape)


def _nest(row: list[Any], shape: list[int]) -> Any:
    """A row of values in row-major order as a tensor's ``tolist()`` of ``shape`` (no recursion)."""
    if not shape:
        return row[0]
    values: list[Any] = row
    for k in range(len(shape) - 1, 0, -1):
        dim, count = shape[k], math.prod(shape[:k])
        values = [values[i * dim:(i + 1) * dim] for i in range(count)]
    return values


class Refused(AttachError):
    """The run refused what a request asked: no such parameter, or a value it cannot take.

    The asker's to fix (the message says what, in the run's words), unlike an
    `AttachError` of a run that went away.
    """


def runtime_dir(create: bool = True) -> str:
    """The user's folder of run endpoints, checked (and made, 0700, if ``create``).

    ``$MUJOU_RUNTIME_DIR`` if set, else ``$XDG_RUNTIME_DIR/mujou`` when that
    folder is this user's, else ``<tempdir>/mujou-<uid>``.

    Args:
        create (bool): make the folder if it is missing (its parent must
            exist). Default: True.

    Returns:
        str: the folder's path (it may not exist when ``create`` is False).

    Raises:
        AttachError: the path is not a folder (a file, a link), belongs to
            another user, or others may read, write or enter it; or it cannot
            be made.
    """
    path = os.environ.get("MUJOU_RUNTIME_DIR")
    if not path:
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        if xdg and _owned_dir(xdg):
            path = os.path.join(xdg, "mujou")
        else:
            path = os.path.join(tempfile.gettempdir(), f"mujou-{os.getuid()}")
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise AttachError(f"the runtime folder {path} cannot be made: {describe(exc)}") \
                from exc
    check_dir(path)
    return path


def _owned_dir(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def check_dir(path: str) -> None:
    """Refuse a runtime folder that others could use to read or fake a run's endpoint.

    Args:
        path (str): the folder; a missing one passes (nothing is in it).

    Raises:
        AttachError: a link or not a folder, another user's, or a mode that
            lets others in (group or other bits set), naming the fix.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise AttachError(f"the runtime folder {path} is not a folder (a link or a file): "
                          f"remove it, or set MUJOU_RUNTIME_DIR to a folder of your own")
    if st.st_uid != os.getuid():
        raise AttachError(f"the runtime folder {path} belongs to uid {st.st_uid}, not to you "
                          f"(uid {os.getuid()}): another user may read or fake your runs' "
                          f"endpoints there; set MUJOU_RUNTIME_DIR to a folder of your own")
    if st.st_mode & 0o077:
        raise AttachError(f"the runtime folder {path} has mode {stat.S_IMODE(st.st_mode):04o}: "
                          f"others may open it; make it 0700 (chmod 700 {path}) or remove it")


def enabled() -> bool:
    """Whether runs open an endpoint: unless ``MUJOU_ATTACH`` is ``0`` (or ``false``, ``no``)."""
    return os.environ.get("MUJOU_ATTACH", "1").strip().lower() not in ("0", "false", "no", "off")


def frame(value: Any) -> bytes:
    """``value`` as one frame: its msgpack bytes after their length.

    Raises:
        ValueError: the bytes exceed `MAX_FRAME`.
        TypeError / OverflowError: msgpack cannot pack the value.
    """
    data = msgpack.packb(value, use_bin_type=True)
    if len(data) > MAX_FRAME:
        raise ValueError(f"a frame of {len(data)} bytes exceeds {MAX_FRAME}")
    return LENGTH.pack(len(data)) + data


def unpack(data: bytes, limit: int) -> Any:
    """A frame's body decoded by msgpack within ``limit`` (no extension types).

    Raises:
        AttachError: bytes that do not decode.
    """
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, max_ext_len=0,
                               max_str_len=limit, max_bin_len=limit, max_array_len=limit,
                               max_map_len=limit)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several kinds
        raise AttachError(f"a frame that does not decode ({describe(exc)})") from None


@dataclasses.dataclass(frozen=True)
class RunEntry:
    """A running net as ``mujou ls`` lists it (its facts file).

    Attributes:
        id (str): ``<pid>-<hex>``, the files' name (unique per run).
        pid (int): the process that runs it (a placed run's host).
        file (str): the file it comes from (`script`).
        net (str): what `mujou.run` was given.
        started (float): when it started, seconds since the epoch.
        timer (str): ``"realtime"`` or ``"simulated"``.
        nodes (int): its nodes.
        groups (int): its groups (1: one process).
        socket (str): the endpoint's path.
    """

    id: str
    pid: int
    file: str
    net: str
    started: float
    timer: str
    nodes: int
    groups: int
    socket: str


def _alive(pid: int) -> bool:
    """Whether the process of a facts file still runs (a zombie does not: it serves nothing)."""
    import psutil  # only a client lists runs; a run that opens its endpoint never needs it

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # someone else's process: it exists
        return True


def _listens(path: str) -> bool:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(1.0)
    try:
        sock.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True  # busy (a full backlog): it listens
    finally:
        sock.close()
    return True


def list_runs(folder: str | None = None, *, probe: bool = True) -> list[RunEntry]:
    """The running nets of this user, oldest first; stale entries are removed.

    An entry is stale when its process is gone, or (``probe``) when nothing
    listens on its socket any more (a pid used again by another process).

    Args:
        folder (str, optional): the runtime folder. Default: `runtime_dir`.
        probe (bool): connect to each socket to see that it listens. Default: True.

    Returns:
        list[RunEntry]: by start time.

    Raises:
        AttachError: the runtime folder is unsafe (`check_dir`).
    """
    folder = runtime_dir(create=False) if folder is None else folder
    check_dir(folder)
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(folder, name)
        entry = _read_entry(folder, path)
        if entry is None:
            continue
        if not _alive(entry.pid) or (probe and not _listens(entry.socket)):
            for stale in (path, entry.socket):
                try:
                    os.unlink(stale)
                except OSError:
                    pass
            continue
        found.append(entry)
    return sorted(found, key=lambda e: (e.started, e.id))


def _read_entry(folder: str, path: str) -> RunEntry | None:
    """A facts file as a `RunEntry`; None for one that is not whole (being written, damaged)."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(MAX_REQUEST))
        return RunEntry(id=str(data["id"]), pid=int(data["pid"]), file=str(data["file"]),
                        net=str(data.get("net", "")), started=float(data["started"]),
                        timer=str(data.get("timer", "?")), nodes=int(data.get("nodes", 0)),
                        groups=int(data.get("groups", 1)),
                        socket=os.path.join(folder, f"{data['id']}.sock"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def find_run(spec: str, runs: list[RunEntry]) -> RunEntry:
    """The one run that ``spec`` names: a pid, an id, or a prefix of the file's name.

    Args:
        spec (str): what the user gave as RUN.
        runs (list[RunEntry]): `list_runs`.

    Returns:
        RunEntry: the run.

    Raises:
        AttachError: none matches, or several do (each named).
    """
    if not runs:
        raise AttachError(f"no running net to watch (RUN {spec!r}): start one with "
                          f"`mujou run FILE` or mujou.run(...) (a run opened with "
                          f"MUJOU_ATTACH=0 cannot be watched)")
    matches = [r for r in runs if r.id == spec]
    if not matches and spec.isdigit():
        matches = [r for r in runs if r.pid == int(spec)]
    if not matches:
        matches = [r for r in runs if os.path.basename(r.file).startswith(spec)
                   or r.file.startswith(spec)]
    listed = "; ".join(f"{r.pid} {os.path.basename(r.file)} (id {r.id})" for r in runs)
    if not matches:
        raise AttachError(f"no running net matches {spec!r}: RUN is a pid, a run's id or the "
                          f"start of its file's name (running: {listed})")
    if len(matches) > 1:
        named = "; ".join(f"{r.pid} {os.path.basename(r.file)} (id {r.id})" for r in matches)
        raise AttachError(f"{spec!r} matches {len(matches)} running nets: {named}; name one "
                          f"by its pid, or by its id when one process runs several")
    return matches[0]


class Connection:
    """A client's connection to a run's endpoint.

    Args:
        entry (RunEntry): the run (`find_run`).
        timeout (float): wall seconds to wait for any one answer. Default: 30.

    Raises:
        AttachError: the run has ended (nothing listens), or answers another
            protocol.
    """

    def __init__(self, entry: RunEntry, timeout: float = 30.0) -> None:
        self.entry = entry
        self.answer: dict[str, Any] | None = None  # a watch's first answer (`watch`)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(entry.socket)
        except OSError as exc:
            self._sock.close()
            raise AttachError(f"run {entry.pid} ({os.path.basename(entry.file)}) has ended "
                              f"or cannot be reached ({describe(exc)})") from None
        self.hello = self.request("hello")
        if self.hello.get("protocol") != PROTOCOL:
            self.close()
            raise AttachError(f"run {entry.pid} speaks protocol {self.hello.get('protocol')}, "
                              f"this mujou {PROTOCOL}: use the mujou of the run's environment")

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request, return its answer.

        Raises:
            Refused: the run refused what was asked (a parameter's set).
            AttachError: the run answered another error, or went away.
        """
        self._sock.sendall(frame({"op": op, **fields}))
        answer = self.receive()
        if answer is None:
            raise AttachError(f"run {self.entry.pid} ({os.path.basename(self.entry.file)}) "
                              f"went away (it has ended)")
        if not answer.get("ok", True):
            kind = Refused if answer.get("refused") else AttachError
            raise kind(str(answer.get("error")))
        return answer

    def receive(self, timeout: float | None = -1.0) -> dict[str, Any] | None:
        """The next frame, decoded; None when the run closed the connection.

        Args:
            timeout (float | None): wall seconds (None: no bound; -1: the
                connection's). A frame begun is always read whole.

        Raises:
            TimeoutError: nothing came within ``timeout``.
            AttachError: a frame too large, or not a map.
        """
        if timeout != -1.0:
            self._sock.settimeout(timeout)
        head = self._exactly(4)
        if head is None:
            return None
        (n,) = LENGTH.unpack(head)
        if n > MAX_FRAME:
            raise AttachError(f"the run sent a frame of {n} bytes (at most {MAX_FRAME})")
        self._sock.settimeout(30.0)
        body = self._exactly(n)
        if body is None:
            return None
        value = unpack(body, MAX_FRAME)
        if not isinstance(value, dict):
            raise AttachError("the run sent a frame that is not a map")
        return value

    def _exactly(self, n: int) -> bytes | None:
        chunks = bytearray()
        while len(chunks) < n:
            try:
                data = self._sock.recv(min(n - len(chunks), 1 << 20))
            except ConnectionResetError:
                return None
            if not data:
                return None
            chunks += data
        return bytes(chunks)

    def watch(self, port: str, mode: str = "view", depth: int | None = None,
              ) -> Iterator[dict[str, Any]]:
        """Watch a port: its batches as they come (``items`` or ``stamps``, ``lost``), then
        an ``end`` frame when the run ends.

        Each item of ``items`` is ``[t_ns, view]``, the view decoded (a
        ``column`` batch is turned into ``items`` here: `column_items`). The
        connection serves nothing else afterwards.

        Raises:
            AttachError: no such port (the error names the likeliest ones).
        """
        self.answer = self.request("watch", port=port, mode=mode, depth=depth)
        while True:
            batch = self.receive(None)
            if batch is None:
                return
            if "items" in batch:
                batch["items"] = [[t, unpack(v, MAX_FRAME)] for t, v in batch["items"]]
            elif "column" in batch:
                batch["items"] = column_items(batch.pop("column"))
            yield batch
            if batch.get("end"):
                return

    def close(self) -> None:
        """Close the connection (a watch's subscription ends with it)."""
        self._sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
