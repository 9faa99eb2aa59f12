"""mujou_actors: PyTorch nodes as actors, typed ports, a shared worker pool,
simulated time that is bit-for-bit reproducible.

Import it as ``import mujou_actors as mujou``.
"""

from __future__ import annotations

import importlib as _importlib
import sys as _sys
import types as _types
import typing as _typing

# The public names are imported when first used, not when the package is: a process that
# needs only a corner of it (a placed run's coordinator: Thespian and the standard library)
# then starts without torch, about 1.4-2.5 s of CPU and 220 MB (docs/processes.md,
# "Start-up"). Type checkers and readers see the plain imports below.
if _typing.TYPE_CHECKING:
    from . import cuda as cuda  # the public submodule mujou.cuda
    from . import testing as testing  # the public submodule mujou.testing
    from .deadlines import DeadlineMiss
    from .distributed.placement import Placement
    from .errors import (
        AlgebraicLoopError,
        CallbackError,
        GroupDied,
        MujouError,
        NetError,
        NodeError,
        NotRunningError,
        ParamError,
        PortTypeError,
        RecordingError,
        SnapshotError,
        StartTimeoutError,
        StopTimeoutError,
    )
    from .host import Subscription, Watch
    from .node import Node
    from .params import Param
    from .ports import Input, Output, connect
    from .recording.capsule import Capsule
    from .recording.liveview import FoxgloveServer, FoxgloveStats, serve_foxglove
    from .recording.recorder import Recording
    from .recording.replay import Replay
    from .run import Run, run
    from .snapshot import load, save
    from .stats import (
        CapsuleStats,
        GroupStats,
        MachineStats,
        NodeStats,
        RecordingChannelStats,
        RecordingStats,
        RunStats,
        SnapshotStats,
        SubscriptionStats,
        SyncStats,
        WorkerStats,
    )
    from .supervisor import Supervisor, latest_snapshot
    from .sync import ApproximateTime, ExactTime
    from .trace import Tracer

__all__ = [
    "AlgebraicLoopError",
    "ApproximateTime",
    "CallbackError",
    "Capsule",
    "CapsuleStats",
    "DeadlineMiss",
    "ExactTime",
    "FoxgloveServer",
    "FoxgloveStats",
    "GroupDied",
    "GroupStats",
    "Input",
    "MachineStats",
    "MujouError",
    "NetError",
    "Node",
    "NodeError",
    "NodeStats",
    "NotRunningError",
    "Output",
    "Param",
    "ParamError",
    "Placement",
    "PortTypeError",
    "Recording",
    "RecordingChannelStats",
    "RecordingError",
    "RecordingStats",
    "Replay",
    "Run",
    "RunStats",
    "SnapshotError",
    "SnapshotStats",
    "StartTimeoutError",
    "StopTimeoutError",
    "Subscription",
    "SubscriptionStats",
    "Supervisor",
    "SyncStats",
    "Tracer",
    "Watch",
    "WorkerStats",
    "connect",
    "latest_snapshot",
    "load",
    "run",
    "save",
    "serve_foxglove",
]

# Each public name -> the submodule that defines it; the public submodules are themselves.
_SUBMODULES = frozenset(("cuda", "testing"))
_LAZY: dict[str, str] = {
    "cuda": "cuda", "testing": "testing", "Capsule": "recording.capsule", "Subscription": "host",
    "Watch": "host",
    "FoxgloveServer": "recording.liveview", "FoxgloveStats": "recording.liveview",
    "serve_foxglove": "recording.liveview", "DeadlineMiss": "deadlines",
    "Node": "node", "Input": "ports", "Output": "ports", "connect": "ports",
    "Placement": "distributed.placement", "Recording": "recording.recorder",
    "Replay": "recording.replay", "Run": "run", "run": "run", "load": "snapshot",
    "save": "snapshot",
    "Supervisor": "supervisor", "latest_snapshot": "supervisor", "Tracer": "trace",
    "ExactTime": "sync", "ApproximateTime": "sync", "Param": "params",
    **dict.fromkeys(("AlgebraicLoopError", "CallbackError", "GroupDied", "MujouError",
                     "NetError", "NodeError", "NotRunningError", "ParamError", "PortTypeError",
                     "RecordingError", "SnapshotError", "StartTimeoutError",
                     "StopTimeoutError"), "errors"),
    **dict.fromkeys(("CapsuleStats", "GroupStats", "MachineStats", "NodeStats",
                     "RecordingChannelStats", "RecordingStats", "RunStats", "SnapshotStats",
                     "SubscriptionStats", "SyncStats", "WorkerStats"), "stats"),
}


def __getattr__(name: str) -> _typing.Any:
    """A public name, imported from its submodule on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    found = _importlib.import_module(f"{__name__}.{module}")
    value = found if name in _SUBMODULES else getattr(found, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The names a finished import would hold: what is loaded and every public name."""
    return sorted(set(globals()) | set(_LAZY))


class _Package(_types.ModuleType):
    """The package's module type: ``mujou.run`` stays the function.

    Importing a submodule sets it as an attribute of its package, so the first
    ``import mujou_actors.run`` (the module that defines ``run``) would make
    ``mujou.run`` the module; the module stays reachable in ``sys.modules``.
    """

    def __setattr__(self, name: str, value: _typing.Any) -> None:
        if name == "run" and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package

# ``import mujou_actors.mcapfile`` and the other paths of modules now in recording/ (one release).
from ._moved import install as _install_old_paths  # noqa: E402 - after the class is set

_install_old_paths()

__version__ = "0.1.0"
