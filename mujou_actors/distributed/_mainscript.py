"""Which processes of a placed run import the host's main script, and how.

multiprocessing's ``spawn`` imports the parent's main module again in every
process it starts (as ``__mp_main__``, also ``sys.modules["__main__"]``
there), so that functions and classes defined in the script can be found by
name. A placed run needs that only in its group processes, which build the
user's net from a factory that may be the script's. Thespian's admin, its
logger and the run's coordinator never touch the script; yet a script that
imports torch at its top made each of them import torch (1.4-2.5 s of CPU, one
process after the other, before the groups could start).

So the host starts the admin with the main module kept out of its spawn data
(`main_kept_from_children`): the admin and every process it starts (the
coordinator, which starts the groups) begin without the script. Each group
imports it when it builds its server, from the host's own spawn data
(`main_of_this_process`, `import_main`), exactly as spawn would have: a
script started with ``-m`` or interactively is not imported (spawn's rules),
and ``multiprocessing.current_process()._inheriting`` is set during the
import, as during spawn's, so that a script that starts a placed run at its
top level is refused in the group as before (`placed._check_not_bootstrapping`).

This module imports only the standard library.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
from collections.abc import Iterator
from multiprocessing import spawn
from typing import Any

# The two keys of spawn's preparation data that make a child import the main module.
_MAIN_KEYS = ("init_main_from_name", "init_main_from_path")
_PLAIN = spawn.get_preparation_data
# Set in a thread while the processes it spawns are to start without the main module.
_KEPT = threading.local()


def _preparation_data(name: str) -> dict[str, Any]:
    """spawn's preparation data, without the main module in a thread that asked for that."""
    data: dict[str, Any] = _PLAIN(name)
    if getattr(_KEPT, "on", False):
        for key in _MAIN_KEYS:
            data.pop(key, None)
    return data


@contextlib.contextmanager
def main_kept_from_children() -> Iterator[None]:
    """While inside, processes that this thread starts with ``spawn`` skip the main module.

    It replaces ``multiprocessing.spawn.get_preparation_data`` (once, for the
    process) by a function that differs only in the thread inside this
    context: the data it returns there lacks the two keys that name the main
    module. Other threads, and this one outside, spawn as usual.
    """
    if spawn.get_preparation_data is not _preparation_data:
        spawn.get_preparation_data = _preparation_data
    outer = getattr(_KEPT, "on", False)
    _KEPT.on = True
    try:
        yield
    finally:
        _KEPT.on = outer


def main_of_this_process() -> tuple[tuple[str, str], ...]:
    """What a child needs to import this process's main module as spawn would.

    Returns:
        tuple[tuple[str, str], ...]: spawn's preparation data for it
        (``("init_main_from_path", "/abs/script.py")`` or
        ``("init_main_from_name", "package.module")``), or ``()`` where spawn
        imports nothing (no main module, or one spawn skips) and where the
        script is no file (read from standard input).
    """
    data = _PLAIN("mujou-group")
    path = data.get("init_main_from_path")
    if path is not None and not os.path.isfile(path):
        # A script read from standard input ("python - < run.py": "<stdin>") has no
        # file to import again; spawn would fail on it in every child. Skipped, as
        # an interactive session's: what it defines is checked where it is used
        # (`placement.factory_ref`).
        del data["init_main_from_path"]
    return tuple((key, data[key]) for key in _MAIN_KEYS if key in data)


def import_main(main: tuple[tuple[str, str], ...]) -> None:
    """Import the host's main module here, as spawn does at a child's start.

    Args:
        main (tuple[tuple[str, str], ...]): `main_of_this_process` of the host;
            ``()`` imports nothing.

    Raises:
        BaseException: whatever the script raises as it is imported (a placed
            run started at its top level: RuntimeError).
    """
    if not main:
        return
    process = multiprocessing.current_process()
    # spawn's own bootstrap sets this while it imports the main module; a script that
    # starts a run at its top level is told apart by it.
    process._inheriting = True  # type: ignore[attr-defined]
    try:
        spawn.prepare(dict(main))
    finally:
        process._inheriting = False  # type: ignore[attr-defined]
