"""Recordings for the replay tests, and the keys a run's sends carry.

`record` runs a net to its end with ``mujou.run(record=...)``. `capture` runs
a net and keeps ``(t_ns, delta, message)`` of every send of some Outputs (the
sender's key read on the sending thread), for tests that look at the keys
themselves.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable
from typing import Any

import mujou_actors as mujou
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


def record(net: Any, path: str | os.PathLike[str], *, only: Iterable[str] | None = None,
           **kwargs: Any) -> mujou.Run:
    """Run ``net`` to its end with ``mujou.run(**kwargs)``, recording to ``path``.

    Args:
        only: ``Recording(ports=)`` (fnmatch patterns of the Output paths); None: all.

    Returns:
        Run: the ended run (joined).
    """
    run = mujou.run(net, record=mujou.Recording(path, ports=only), **kwargs)
    run.join()
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
