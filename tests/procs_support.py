"""Group servers for the process tests (tests/test_system.py), importable in a group process.

A group process imports ``tests.procs_support`` by name: the tests pass the
repository's root in ``start_group(sys_path=...)``. ``python -m tests.procs_support
PORT_FILE`` is the host of the host-death test: it starts a `ProcessSystem` with
one group, writes the pids of the run as JSON to PORT_FILE, and sleeps until it
is killed.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time
from typing import Any

ROOT = str(pathlib.Path(__file__).resolve().parent.parent)


class EchoServer:
    """Answers ``(kind, arg)`` requests: echo, pid, raise, sleep, exit.

    Args:
        name (str): the group's name, echoed back.
        close_error (str | None): ``close()`` raises a RuntimeError with this text.
        close_marker (str | None): a file ``close()`` writes (proof that it ran).
    """

    def __init__(self, name: str, close_error: str | None = None,
                 close_marker: str | None = None) -> None:
        self.name = name
        self.close_error = close_error
        self.close_marker = close_marker

    def handle(self, request: Any) -> Any:
        """Do what the request says.

        Args:
            request (Any): ``("echo", x)``, ``("pid", None)``, ``("raise", text)``,
                ``("unpicklable", text)`` (raises an exception that does not
                pickle), ``("sleep", seconds)``, ``("exit", code)`` (``os._exit``).

        Returns:
            Any: ``(name, x)`` for echo, the pid, or ``"slept"``.
        """
        kind, arg = request
        if kind == "echo":
            return (self.name, arg)
        if kind == "pid":
            return os.getpid()
        if kind == "raise":
            raise ValueError(arg)
        if kind == "unpicklable":
            raise Unpicklable(arg)
        if kind == "sleep":
            time.sleep(arg)
            return "slept"
        if kind == "exit":
            os._exit(arg)
        raise KeyError(kind)

    def close(self) -> None:
        """Write the marker, if any; raise, if asked to."""
        if self.close_marker:
            pathlib.Path(self.close_marker).write_text(self.name)
        if self.close_error:
            raise RuntimeError(self.close_error)


class Unpicklable(Exception):
    """An exception that does not pickle (it holds a lock)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        import threading

        self.lock = threading.Lock()


def make(name: str, **kwargs: Any) -> EchoServer:
    """The target of the tests' groups.

    Args:
        name (str): the group's name.
        **kwargs (Any): `EchoServer`'s other arguments.

    Returns:
        EchoServer: the server.
    """
    return EchoServer(name, **kwargs)


def fail(reason: str) -> EchoServer:
    """A target that raises.

    Args:
        reason (str): the error's text.

    Raises:
        RuntimeError: always.
    """
    raise RuntimeError(reason)


def host(pid_file: str) -> None:
    """Be the host of a run with one group; write its pids; sleep until killed.

    Args:
        pid_file (str): where to write ``{"host", "run", "admin_port", "folder"}`` as JSON.
    """
    from mujou_actors.distributed.system import ProcessSystem

    system = ProcessSystem(start_timeout=60)
    system.start_group("g", "tests.procs_support:make", {"name": "g"}, 60, sys_path=[ROOT])
    doc = {"host": os.getpid(), "run": system.run_pids(), "admin_port": system.admin_port,
           "folder": system._folder}
    tmp = pid_file + ".tmp"
    pathlib.Path(tmp).write_text(json.dumps(doc))
    os.replace(tmp, pid_file)
    time.sleep(120)  # killed long before (the test's bound); a leftover ends on its own


if __name__ == "__main__":
    host(sys.argv[1])
