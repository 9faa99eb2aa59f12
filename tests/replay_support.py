"""Recordings for the replay tests, and the keys a run's sends carry.

`record` runs a net and writes every message of its Outputs, with the key of
the hook that sent it (the sender actor's stamp, read on the sending thread),
through `mujou_actors.mcapfile.Writer`: the file a recorded run writes.
`capture` runs a net and keeps ``(t_ns, delta, message)`` of every send of
some Outputs, for tests that look at the keys themselves.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

import mujou_actors as mujou
from mujou_actors import mcapfile
from mujou_actors._runtime import build
from mujou_actors.ports import Output

_run = importlib.import_module("mujou_actors.run")

__all__ = ["record", "capture"]


def _listening(each: Callable[[Output, Any], Callable[[Any], None] | None]) -> build.Seams:
    """Seams whose wiring attaches ``each(output, sender actor)``'s listener to every Output."""

    def wire(actors: Any, ports: Any, dispatcher: Any, rt: Any) -> build.Wiring:
        wiring = build.wire(actors, ports, dispatcher, rt)
        for port in ports.values():
            if isinstance(port, Output):
                listener = each(port, wiring.actor_of[id(port.node)])
                if listener is not None:
                    wiring.listen(port, listener)
        return wiring

    return build.Seams(wire=wire)


def record(net: Any, path: str | os.PathLike[str], *, only: Iterable[str] = ("*",),
           **kwargs: Any) -> mujou.Run:
    """Run ``net`` to its end with ``mujou.run(**kwargs)``, its Outputs recorded to ``path``.

    Args:
        only: fnmatch patterns of the Output paths to record (default: all).

    Returns:
        Run: the ended run (joined).
    """
    lock = threading.Lock()
    writer = mcapfile.Writer(path)
    patterns = list(only)
    counts: dict[int, int] = {}

    def each(port: Output, actor: Any) -> Callable[[Any], None] | None:
        if not any(fnmatch.fnmatchcase(port.path, p) for p in patterns):
            return None
        channel = writer.add_channel(mcapfile.ChannelSpec.of(port, actor.path, actor.order))
        counts[channel] = 0

        def listen(message: Any) -> None:
            t, delta = actor.stamp
            with lock:
                writer.write_message(channel, counts[channel], t, delta, message)
                counts[channel] += 1

        return listen

    run = _run._start(net, seams=_listening(each), **kwargs)
    try:
        run.join()
    finally:
        run.wait()
        writer.write_run({"format": "1", "timer": kwargs.get("timer", "realtime"),
                          "seed": str(kwargs.get("seed")),
                          "seeds": json.dumps(dict(run.seeds))})
        writer.close({"time_ns": str(run.time_ns), "failure": ""})
    return run


def capture(net: Any, outputs: Iterable[str], **kwargs: Any) -> tuple[mujou.Run, dict[str, list]]:
    """Run ``net`` to its end; ``(t_ns, delta, message)`` of every send of ``outputs``.

    Returns:
        The ended run and, by Output path, its sends in order.
    """
    sent: dict[str, list] = {o: [] for o in outputs}

    def each(port: Output, actor: Any) -> Callable[[Any], None] | None:
        out = sent.get(port.path)
        if out is None:
            return None
        return lambda message: out.append((*actor.stamp, message))

    run = _run._start(net, seams=_listening(each), **kwargs)
    run.join()
    return run, sent
