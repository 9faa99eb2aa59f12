"""mujou_actors: PyTorch nodes as actors, typed ports, a shared worker pool,
simulated time that is bit-for-bit reproducible.

Import it as ``import mujou_actors as mujou``.
"""

from __future__ import annotations

from . import cuda as cuda  # the public submodule mujou.cuda
from . import testing as testing  # the public submodule mujou.testing
from .capsule import Capsule
from .errors import (
    AlgebraicLoopError,
    CallbackError,
    GroupDied,
    MujouError,
    NetError,
    NodeError,
    NotRunningError,
    PortTypeError,
    RecordingError,
    SnapshotError,
    StartTimeoutError,
    StopTimeoutError,
)
from .host import Subscription
from .liveview import FoxgloveServer, FoxgloveStats, serve_foxglove
from .node import Node
from .ports import Input, Output, connect
from .recording import Recording
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
    WorkerStats,
)
from .supervisor import Supervisor, latest_snapshot
from .trace import Tracer

__all__ = [
    "AlgebraicLoopError",
    "CallbackError",
    "Capsule",
    "CapsuleStats",
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
    "PortTypeError",
    "Recording",
    "RecordingChannelStats",
    "RecordingError",
    "RecordingStats",
    "Run",
    "RunStats",
    "SnapshotError",
    "SnapshotStats",
    "StartTimeoutError",
    "StopTimeoutError",
    "Subscription",
    "SubscriptionStats",
    "Supervisor",
    "Tracer",
    "WorkerStats",
    "connect",
    "latest_snapshot",
    "load",
    "run",
    "save",
    "serve_foxglove",
]

__version__ = "0.1.0"
