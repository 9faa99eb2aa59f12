"""The host's end of a run's crash notices: a zmq PULL socket, and a watch on the coordinator.

The coordinator pushes ``{"group", "pid", "reason"}`` (JSON, never a pickle)
when a group's process ends unasked; nothing listens in the coordinator, it
connects to the host's socket: ``ipc://`` in the run's private folder (mode
0700), or ``tcp://127.0.0.1`` on an ephemeral port where zmq has no ipc
transport. A thread of the host (`Notices.watch`) pushes
``{"coordinator": pid}`` to the same socket if the coordinator's own process
dies, since nobody else would tell.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import zmq

from ._loopback import LOOPBACK, alive, signals_blocked

__all__ = ["Notices"]

_WATCH_S = 0.1  # how often the coordinator's watch looks at its process


class Notices:
    """The PULL socket of a run's notices, and the thread that watches the coordinator.

    Args:
        folder (str): the run's private folder (the ``ipc://`` socket's place).
    """

    def __init__(self, folder: str) -> None:
        self._context: zmq.Context[Any] = zmq.Context()
        self._pull: zmq.Socket[Any] = self._context.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        if zmq.has("ipc"):
            self.address = f"ipc://{folder}/notices"
            self._pull.bind(self.address)
        else:
            port = self._pull.bind_to_random_port(f"tcp://{LOOPBACK}")
            self.address = f"tcp://{LOOPBACK}:{port}"
        self._monitor: threading.Thread | None = None
        self._monitor_stop = threading.Event()

    @property
    def socket(self) -> zmq.Socket[Any]:
        """zmq.Socket: the PULL socket, readable while notices wait (read them with `take`)."""
        return self._pull

    def take(self) -> list[dict[str, Any]]:
        """The notices that arrived, oldest first; never waits.

        Returns:
            list[dict[str, Any]]: each ``{"group", "pid", "reason"}`` or
            ``{"coordinator": pid}``; empty when there are none.
        """
        notices = []
        # Asked after every poll of a round: look before receiving, since an empty
        # socket's recv raises zmq.Again, which costs tens of microseconds to make.
        while int(self._pull.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            try:
                raw = self._pull.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            notices.append(json.loads(raw))
        return notices

    def watch(self, pid: int, started: int | None) -> None:
        """Start the thread that pushes a notice if the coordinator's process dies.

        Args:
            pid (int): the coordinator's process.
            started (int | None): its start time (`_loopback.start_time`).
        """
        self._monitor = threading.Thread(target=self._watch, args=(pid, started),
                                         name="mujou-coordinator-monitor", daemon=True)
        with signals_blocked():  # the host's signals are for its main thread
            self._monitor.start()

    def stop_watching(self) -> None:
        """Stop the watch (the coordinator is about to end, as asked); it ends in `close`."""
        self._monitor_stop.set()

    def close(self, timeout: float) -> None:
        """Stop the watch, close the socket and terminate its context.

        Args:
            timeout (float): seconds at most for the watch's thread to end.
        """
        self._monitor_stop.set()
        if self._monitor is not None:
            self._monitor.join(timeout=timeout)
        self._pull.close(linger=0)
        self._context.term()

    def _watch(self, pid: int, started: int | None) -> None:
        """The watch's thread: push a notice once the coordinator's process is gone."""
        while not self._monitor_stop.wait(_WATCH_S):
            if not alive(pid, started):
                push = self._context.socket(zmq.PUSH)
                try:
                    push.setsockopt(zmq.LINGER, 0)
                    push.connect(self.address)
                    push.send(json.dumps({"coordinator": pid}).encode(), zmq.NOBLOCK)
                    self._monitor_stop.wait(0.2)  # let it go out before the close
                except zmq.ZMQError:
                    pass  # the run is being shut down
                finally:
                    push.close(linger=0)
                return
