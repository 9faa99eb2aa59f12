"""The compiled build: which kernel modules it compiles, and the guard that keeps it honest.

A compiled build (any install, ``pip install -e .``; ``MUJOU_COMPILE=0`` opts out,
see ``setup.py``) compiles the modules named in `MODULES` with mypyc into
extension modules next to their sources, and writes a manifest
(`MANIFEST`) beside them: each module's source hash at build time. Python
would import an extension module before the ``.py`` of the same name, so
an edited source would silently lose to the build of its old text. This
module is the guard against that: `_runtime/__init__.py` runs `select`
before any of the kernel's modules is imported, and whenever the compiled
modules cannot be trusted (a source whose hash is not the manifest's, an
extension module without a manifest, a build that lacks some module) or
``MUJOU_PURE=1`` is set, `SourceFinder` goes first on ``sys.meta_path`` and
loads *every* module of the build from its source: never a mix of the two,
whose objects would not agree (a compiled class and a Python one of the
same name). An edit is warned of once, with the file and how to rebuild.

`BUILD` (in ``mujou_actors._runtime``) says which build runs, and why;
``mujou --version`` and the benchmarks' JSON show it.

This module imports nothing from the package and nothing outside the
standard library: ``setup.py`` loads it by path (without importing the
package, so without torch) for `MODULES`, `MANIFEST` and `source_hash`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import platform
import sys
import sysconfig
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["MODULES", "MANIFEST", "PACKAGE", "REBUILD", "Build", "Decision", "SourceFinder",
           "source_hash", "write_manifest", "read_manifest", "extensions", "select", "install"]

# The kernel modules a compiled build compiles, in import order. The one list:
# setup.py reads it (by path) and the guard checks it. Not compiled: sends.py,
# on purpose. A send hands over a value that nothing but the call holds
# (`sends.TEMPORARY`, a reference count). Called from Python bytecode (a hook),
# a compiled send reads 1 for a temporary and 2 for a value the caller keeps;
# called from C (a Cython or mypyc caller keeping the value in a local), it
# would read 1 for a kept value too and hand it over uncopied: value semantics
# broken. A send in Python reads the caller's local through its own frame.
MODULES: tuple[str, ...] = ("keys", "policy", "mailbox", "actor", "calendar", "dispatcher")

# The package the modules are in, and the manifest the build writes next to them.
PACKAGE = "mujou_actors._runtime"
MANIFEST = "_compiled.json"

# What a developer runs to rebuild (named in the warning).
REBUILD = "pip install -e ."


@dataclasses.dataclass(frozen=True)
class Build:
    """Which build of the kernel runs in this process, and why.

    Attributes:
        kind (str): ``"compiled"`` (the modules of ``modules`` are extension
            modules) or ``"python"`` (every kernel module runs from its source).
        reason (str): why, in a few words (``"not compiled"``, ``"MUJOU_PURE=1"``,
            ``"actor.py edited since the build"``, ``"mypyc 2.4.1"``...).
        modules (tuple[str, ...]): the modules that run compiled (empty for ``"python"``).
    """

    kind: str
    reason: str
    modules: tuple[str, ...] = ()

    def __str__(self) -> str:
        """``kind (reason)``, e.g. ``compiled (mypyc 2.4.1: keys, mailbox, actor)``."""
        if self.modules:
            return f"{self.kind} ({self.reason}: {', '.join(self.modules)})"
        return f"{self.kind} ({self.reason})"


@dataclasses.dataclass(frozen=True)
class Decision:
    """What `select` decided: the build, the modules to load from source, a warning.

    Attributes:
        build (Build): the build that runs.
        sources (tuple[str, ...]): modules of the package to load from their
            ``.py`` (a `SourceFinder` for them); empty: import as Python would.
        warning (str | None): what to warn of (an edited source, a broken
            build), None if nothing.
    """

    build: Build
    sources: tuple[str, ...] = ()
    warning: str | None = None


def source_hash(path: Path) -> str:
    """The SHA-256 of a file's bytes, hex: what the manifest records of each source."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(folder: Path, sources: Path, compiler: str) -> None:
    """Write the manifest of a build into ``folder``: the one format the guard reads.

    Args:
        folder (Path): where the build's extension modules are.
        sources (Path): the folder of the sources they were built from (each
            module of `MODULES` is hashed there, `source_hash`).
        compiler (str): what built them, as `Build.reason` will say it
            (``"mypyc 2.4.1"``, ``"cython 3.3.1"``).
    """
    manifest = {
        "format": 1,
        "compiler": compiler,
        "python": platform.python_version(),
        "platform": sysconfig.get_platform(),
        "modules": {name: source_hash(sources / f"{name}.py") for name in MODULES},
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def read_manifest(directory: Path) -> dict[str, object] | None:
    """The manifest in ``directory`` as written by the build; None if there is none.

    Raises:
        ValueError: the file is there but is not a manifest (not JSON, no
            ``modules`` mapping of names to hashes).
    """
    path = directory / MANIFEST
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    modules = data.get("modules") if isinstance(data, dict) else None
    if not isinstance(modules, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in modules.items()):
        raise ValueError(f"{path}: no 'modules' mapping of module names to source hashes")
    return data


def extensions(directory: Path) -> dict[str, Path]:
    """The extension modules in ``directory`` for this interpreter, by module name.

    Every one counts, listed in `MODULES` or not: a stale build of a module
    taken off the list would shadow its source as surely as a listed one.
    mypyc's shared library (a name ending in ``__mypyc``) is not a module of
    the package and is left out.
    """
    found: dict[str, Path] = {}
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return found
    for entry in entries:
        for suffix in suffixes:
            if entry.name.endswith(suffix):
                name = entry.name[:-len(suffix)]
                if not name.endswith("__mypyc"):
                    found.setdefault(name, Path(entry.path))
                break
    return found


def select(directory: Path, environ: Mapping[str, str] = os.environ) -> Decision:
    """Decide which build of the kernel modules in ``directory`` runs (no side effects).

    Args:
        directory (Path): the folder of the kernel's modules (``_runtime/``).
        environ (Mapping[str, str]): the environment; ``MUJOU_PURE`` set to
            anything but ``""`` or ``"0"`` asks for the sources. Default:
            ``os.environ``.

    Returns:
        The `Decision`. Compiled only if a manifest is there, each module it
        lists has its extension module, no other module has one, and every
        listed source has the hash recorded at build time. Whenever the
        sources run, every module of `MODULES`, of the manifest and with an
        extension module runs from its source.
    """
    try:
        manifest = read_manifest(directory)
        problem = None
    except ValueError as exc:
        manifest, problem = None, str(exc)
    recorded: dict[str, str] = {} if manifest is None else manifest["modules"]  # type: ignore[assignment]
    built = tuple(extensions(directory))
    names = tuple(dict.fromkeys([*MODULES, *recorded, *built]))  # in order, once each
    if environ.get("MUJOU_PURE", "") not in ("", "0"):
        return Decision(Build("python", "MUJOU_PURE=1"), names)
    if manifest is None and not built:
        if problem is not None:  # a manifest that cannot be read, and nothing compiled
            return Decision(Build("python", "not compiled"), names,
                            f"{problem}; ignored: no compiled kernel module is there")
        return Decision(Build("python", "not compiled"))
    if problem is not None:
        return Decision(Build("python", "unreadable manifest"), names,
                        f"{problem}. Running the kernel modules from their sources "
                        f"(slower); to rebuild: {REBUILD}")
    if manifest is None:
        return Decision(Build("python", "compiled modules without a manifest"), names,
                        f"compiled kernel modules ({', '.join(built)}) are in {directory} "
                        f"without the manifest {MANIFEST} that says which sources they were "
                        f"built from. Running every kernel module from its source (slower); "
                        f"to rebuild: {REBUILD}; or delete the extension modules")
    edited = [name for name in recorded if _hash_or_none(directory / f"{name}.py")
              != recorded[name]]
    if edited:
        files = ", ".join(str(directory / f"{name}.py") for name in edited)
        short = ", ".join(f"{name}.py" for name in edited)
        return Decision(Build("python", f"{short} edited since the build"), names,
                        f"edited since the compiled build: {files}. Running every compiled "
                        f"kernel module ({', '.join(recorded)}) from its source, which is "
                        f"slower. Rebuild with `{REBUILD}`, or set MUJOU_PURE=1 to run the "
                        f"sources without this warning")
    if set(built) != set(recorded):
        missing = sorted(set(recorded) - set(built))
        extra = sorted(set(built) - set(recorded))
        what = "; ".join(part for part in (
            missing and f"no extension module for {', '.join(missing)}",
            extra and f"extension modules not in the manifest: {', '.join(extra)}") if part)
        return Decision(Build("python", "incomplete build"), names,
                        f"the compiled build in {directory} is incomplete ({what}). Running "
                        f"every kernel module from its source (slower); to rebuild: {REBUILD}")
    compiler = manifest.get("compiler")
    return Decision(Build("compiled", compiler if isinstance(compiler, str) else "mypyc",
                          tuple(recorded)))


def _hash_or_none(path: Path) -> str | None:
    """`source_hash` of ``path``, or None if it cannot be read (a deleted source)."""
    try:
        return source_hash(path)
    except OSError:
        return None


class SourceFinder(importlib.abc.MetaPathFinder):
    """Finds some modules of a package in their ``.py`` sources, ahead of extension modules.

    Put first on ``sys.meta_path`` (`install`), it answers for exactly the
    modules it names, with the `importlib.machinery.SourceFileLoader` of the
    ``.py`` in the package's folder; any other module it leaves to the next
    finder.

    Args:
        package (str): the package's dotted name, e.g. ``mujou_actors._runtime``.
        directory (Path): the package's folder.
        names (Iterable[str]): the modules' names in the package, e.g. ``keys``.
    """

    def __init__(self, package: str, directory: Path, names: Iterable[str]) -> None:
        self.directory = directory
        self.files = {f"{package}.{name}": directory / f"{name}.py" for name in names}

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        """The source's spec for a module this finder names, else None."""
        source = self.files.get(fullname)
        if source is None:
            return None
        loader = importlib.machinery.SourceFileLoader(fullname, str(source))
        return importlib.util.spec_from_file_location(fullname, source, loader=loader)


def install(package: str, directory: Path, environ: Mapping[str, str] = os.environ) -> Build:
    """Select the build (`select`) and carry it out; return the `Build` that runs.

    Called once, by ``_runtime/__init__.py``, before any kernel module is
    imported: puts a `SourceFinder` first on ``sys.meta_path`` when the
    sources must run, and warns (`RuntimeWarning`) of why when it is not
    because ``MUJOU_PURE`` asked for them.

    Args:
        package (str): the kernel package's dotted name (`PACKAGE`).
        directory (Path): its folder.
        environ (Mapping[str, str]): the environment. Default: ``os.environ``.
    """
    decision = select(directory, environ)
    if decision.sources and not any(isinstance(f, SourceFinder) and f.directory == directory
                                    for f in sys.meta_path):
        sys.meta_path.insert(0, SourceFinder(package, directory, decision.sources))
    if decision.warning is not None:
        warnings.warn(decision.warning, RuntimeWarning, stacklevel=3)
    return decision.build
