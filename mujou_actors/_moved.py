"""The modules' old paths, kept importable for one release after the move to ``recording/``.

``import mujou_actors.mcapfile`` (and the other modules that moved into
`mujou_actors.recording`) still works: a finder on ``sys.meta_path`` answers
the old name with the module at its new path, the same module object, and
warns with a `DeprecationWarning` that names the new path. Nothing is imported
until an old path is: the finder is a dictionary lookup for every other import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence

# Old path -> new path. Remove in the release after 0.1 (docs/reference.md says so).
MOVED = {f"mujou_actors.{old}": f"mujou_actors.recording.{new}" for old, new in (
    ("mcapfile", "mcapfile"), ("recview", "recview"), ("playback", "playback"),
    ("liveview", "liveview"), ("view", "view"), ("replay", "replay"), ("capsule", "capsule"))}


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths of `MOVED`; loads each as its new module."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}  # new path -> spec

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        """A spec for an old path, None for any other name (the next finder looks)."""
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        """The module at the new path (imported if it is not yet), after the warning."""
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there (the old path goes "
                      "in the next release)", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._specs.setdefault(new, module.__spec__)  # before the import system overwrites it
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module ran at its new path. Its own spec is put back.

        The import system sets ``__spec__`` on what `create_module` returned
        (the shared module); the new path's spec stays the true one.
        """
        module.__spec__ = self._specs[module.__name__]


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (the package's import calls this)."""
    if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        sys.meta_path.append(_OldPaths())
