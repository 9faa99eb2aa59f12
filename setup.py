"""Build of mujou_actors: the kernel's hot modules compiled, pure Python where that fails.

Any install (``pip install -e .``, a wheel) compiles the modules that
``mujou_actors/_runtime/compiled.py`` lists (`MODULES`, the one list) with
mypyc into extension modules beside their sources, and writes a manifest of
their source hashes next to them, which the import-time guard checks (see
``compiled.py``); the metadata is in ``setup.cfg``. ``MUJOU_COMPILE=0``
builds the pure-Python package instead::

    pip install -e .                                  # mypy fetched for the build
    pip install --no-build-isolation -e .             # mypy from the venv (test extra)
    MUJOU_COMPILE=0 pip install -e .                  # pure Python, no compile

Compiling needs mypy (it ships mypyc) and a C compiler, not torch: mypy is
told to treat every module it is not compiling as ``Any`` (torch, thespian,
msgpack and the package's other modules alike), which also keeps the
compile short. When it cannot compile (no mypy, a type error, no compiler),
the install still succeeds, as pure Python, and says why on stderr.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
RUNTIME = ROOT / "mujou_actors" / "_runtime"
# The shared library that holds the compiled code; each module gets a small shim.
GROUP = "mujou_actors._runtime._kernel"


def _compiled() -> ModuleType:
    """``mujou_actors/_runtime/compiled.py``, loaded by path: without the package or torch."""
    spec = importlib.util.spec_from_file_location("_mujou_compiled", RUNTIME / "compiled.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


COMPILED = _compiled()
# Compiled unless asked not to: the compiled kernel is faster (benchmarks/builds.py).
COMPILE = os.environ.get("MUJOU_COMPILE", "1").strip().lower() not in ("0", "no", "false")


def _warn(message: str) -> None:
    """Say on stderr why this install is pure Python (pip shows it with -v, and on failure)."""
    print(f"\nWARNING: mujou_actors: {message}; installing pure Python.\n", file=sys.stderr)


_EXTENSIONS: list[Any] | None = None


def _mypyc_extensions() -> list[Any]:
    """The extension modules of the compiled build (mypyc), made once; [] if it cannot be."""
    global _EXTENSIONS
    if _EXTENSIONS is not None:
        return _EXTENSIONS
    _EXTENSIONS = []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _warn("mypy (mypyc) is not installed in the build environment")
        return _EXTENSIONS
    # Relative paths: setuptools records only relative dependencies of an extension.
    target = Path(os.path.relpath(ROOT / "build" / "mypyc"))
    target.mkdir(parents=True, exist_ok=True)
    config = target / "mypy.ini"
    # Only the compiled modules are analysed: every other import (torch, thespian,
    # msgpack, the package's other modules) is Any, so no torch is needed to build.
    config.write_text(
        "[mypy]\n"
        f"python_version = {sys.version_info[0]}.{sys.version_info[1]}\n"
        "follow_imports = skip\n"
        "ignore_missing_imports = True\n"
        f"cache_dir = {target / 'mypy_cache'}\n")
    sources = [os.path.relpath(RUNTIME / f"{name}.py") for name in COMPILED.MODULES]
    try:
        _EXTENSIONS = mypycify(["--config-file", str(config), *sources],
                               opt_level="3", group_name=GROUP, target_dir=str(target))
    except (SystemExit, Exception) as exc:  # noqa: BLE001 - mypyc exits on a type error
        _warn(f"mypyc could not compile {', '.join(sources)} ({exc!r})")
    return _EXTENSIONS


class BuildExt(build_ext):
    """``build_ext`` that compiles with mypyc (unless ``MUJOU_COMPILE=0``), or falls back.

    The mypyc extensions are made when the command is set up (not when
    ``setup.py`` is read: pip reads it several times, and mypyc takes a
    while). A build that fails leaves no extension module behind and
    removes an earlier build's from the sources, so the install is pure
    Python; one that succeeds writes the manifest next to the extension
    modules, in the build folder and, for an editable install, beside the
    sources.
    """

    def finalize_options(self) -> None:
        """Make the mypyc extensions (if asked for) before setuptools looks at them."""
        if COMPILE:
            self.distribution.ext_modules = list(_mypyc_extensions())
        super().finalize_options()
        if COMPILE and not self.distribution.ext_modules:
            # mypyc failed (said above): with no extension left, setuptools skips
            # run(), so an earlier build's modules are removed here, not there.
            self._remove_build(sources=True)

    def run(self) -> None:
        """Build the extensions; on failure warn and leave a pure-Python install."""
        if not self.extensions:
            if COMPILE:  # mypyc failed (said above): no earlier build may stay in place
                self._remove_build(sources=True)
            return
        from distutils.errors import CCompilerError, DistutilsError

        self._remove_build()  # no module of an earlier build may outlive this one
        try:
            super().run()
        except (CCompilerError, DistutilsError, OSError) as exc:
            _warn(f"compiling the kernel failed ({exc})")
            self._remove_build(sources=True)
            self.extensions = []
            self.distribution.ext_modules = []
            return
        self._write_manifests()

    def _folders(self, sources: bool = False) -> list[Path]:
        """Where the kernel's extension modules go: the build folder, and the sources.

        The sources' folder when building in place (an editable install), or
        with ``sources``: a build of this tree that failed, after which an
        earlier build beside the sources would be stale (the guard would run
        the sources and blame an edit rather than the failed build).
        """
        folders = [Path(self.build_lib, *COMPILED.PACKAGE.split("."))]
        if sources or self.inplace or getattr(self, "editable_mode", False):
            folders.append(RUNTIME)
        return folders

    def _remove_build(self, sources: bool = False) -> None:
        """Remove the kernel's extension modules and manifest (a failed build, a stale one)."""
        shared = GROUP.rsplit(".", 1)[1] + "__mypyc"
        for folder in self._folders(sources):
            for path in COMPILED.extensions(folder).values():
                path.unlink()
            for path in folder.glob(shared + ".*"):
                path.unlink()
            (folder / COMPILED.MANIFEST).unlink(missing_ok=True)

    def _write_manifests(self) -> None:
        """Record each compiled module's source hash next to its extension module."""
        import mypy.version

        for folder in self._folders():
            if folder.is_dir():
                COMPILED.write_manifest(folder, RUNTIME, f"mypyc {mypy.version.__version__}")


if __name__ == "__main__":
    setup(
        # A placeholder until BuildExt makes the real ones (mypyc runs only if the
        # extensions are built): it marks the build as having extensions only when
        # compiling, so that build_ext runs and the wheel is a platform one.
        ext_modules=[Extension(f"{COMPILED.PACKAGE}.{COMPILED.MODULES[0]}", sources=[])]
        if COMPILE else [],
        cmdclass={"build_ext": BuildExt},
        # With build isolation, the build environment gets mypy only when it compiles.
        setup_requires=["mypy>=1.10"] if COMPILE else [],
    )
