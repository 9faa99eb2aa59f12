"""The compiled build: which build runs, and the guard that never lets a stale one shadow a source.

Most tests work on a folder that looks like a build (sources, stand-ins for
extension modules, a manifest), so they run on the pure build too; those
that need a real compiled build skip without one, saying how to make it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import mujou_actors._runtime as runtime
from mujou_actors._runtime import compiled

ROOT = Path(__file__).resolve().parent.parent
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
NO_BUILD = f"no compiled build here (`{compiled.REBUILD}` makes one)"


def _fake_build(folder: Path, names: tuple[str, ...] = compiled.MODULES) -> None:
    """Sources, an "extension module" of each (junk bytes) and the manifest of a build."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / f"{name}.py").write_text(f"WHO = {name!r}\n")
        (folder / f"{name}{SUFFIX}").write_bytes(b"not an extension module")
    manifest = {"format": 1, "compiler": "mypyc (test)",
                "modules": {name: compiled.source_hash(folder / f"{name}.py") for name in names}}
    (folder / compiled.MANIFEST).write_text(json.dumps(manifest))


def test_a_folder_without_a_build_runs_the_sources_as_python_imports_them(
        tmp_path: Path) -> None:
    (tmp_path / "keys.py").write_text("")

    decision = compiled.select(tmp_path, {})

    assert decision == compiled.Decision(compiled.Build("python", "not compiled"))
    assert str(decision.build) == "python (not compiled)"


def test_a_build_whose_sources_match_its_manifest_runs_compiled(tmp_path: Path) -> None:
    _fake_build(tmp_path)

    decision = compiled.select(tmp_path, {"MUJOU_PURE": "0"})

    assert decision.build == compiled.Build("compiled", "mypyc (test)", compiled.MODULES)
    assert (decision.sources, decision.warning) == ((), None)
    assert str(decision.build) == f"compiled (mypyc (test): {', '.join(compiled.MODULES)})"


def test_an_edited_source_runs_every_module_from_source_and_says_which_and_how_to_rebuild(
        tmp_path: Path) -> None:
    _fake_build(tmp_path)
    edited = tmp_path / f"{compiled.MODULES[-1]}.py"
    edited.write_text(edited.read_text() + "# an edit\n")

    decision = compiled.select(tmp_path, {})

    assert decision.build == compiled.Build("python", f"{edited.name} edited since the build")
    assert decision.sources == compiled.MODULES  # all of them, never a mix
    assert decision.warning is not None
    assert str(edited) in decision.warning and compiled.REBUILD in decision.warning
    assert "MUJOU_PURE=1" in decision.warning


def test_mujou_pure_runs_every_module_from_source_without_a_warning(tmp_path: Path) -> None:
    _fake_build(tmp_path)

    decision = compiled.select(tmp_path, {"MUJOU_PURE": "1"})

    assert decision == compiled.Decision(compiled.Build("python", "MUJOU_PURE=1"),
                                         compiled.MODULES)


def test_extension_modules_without_a_manifest_run_from_source_with_a_warning(
        tmp_path: Path) -> None:
    _fake_build(tmp_path)
    (tmp_path / compiled.MANIFEST).unlink()

    decision = compiled.select(tmp_path, {})

    assert decision.build.kind == "python"
    assert decision.sources == compiled.MODULES
    assert decision.warning is not None and compiled.MANIFEST in decision.warning


@pytest.mark.parametrize("change", ["missing", "extra", "unreadable"])
def test_an_incomplete_or_unreadable_build_runs_every_module_from_source(
        tmp_path: Path, change: str) -> None:
    _fake_build(tmp_path)
    if change == "missing":  # a module of the manifest without its extension module
        (tmp_path / f"{compiled.MODULES[0]}{SUFFIX}").unlink()
    elif change == "extra":  # a module taken off the list, its old build still there
        (tmp_path / "sends.py").write_text("")
        (tmp_path / f"sends{SUFFIX}").write_bytes(b"stale")
    else:
        (tmp_path / compiled.MANIFEST).write_text("{not json")

    decision = compiled.select(tmp_path, {})

    assert decision.build.kind == "python"
    assert set(compiled.MODULES) <= set(decision.sources)
    assert ("sends" in decision.sources) == (change == "extra")
    assert decision.warning is not None and compiled.REBUILD in decision.warning


def test_the_source_finder_answers_for_the_modules_it_names_only(tmp_path: Path) -> None:
    finder = compiled.SourceFinder("pkg", tmp_path, ["keys"])

    spec = finder.find_spec("pkg.keys", None)

    assert spec is not None and spec.origin == str(tmp_path / "keys.py")
    assert isinstance(spec.loader, importlib.machinery.SourceFileLoader)
    assert finder.find_spec("pkg.actor", None) is None
    assert finder.find_spec("keys", None) is None


def _package_copy(tmp_path: Path, edit: bool) -> Path:
    """A copy of the package whose kernel has a (fake) build: junk extension modules and
    a manifest, true to the sources unless ``edit``."""
    shutil.copytree(ROOT / "mujou_actors", tmp_path / "mujou_actors",
                    ignore=shutil.ignore_patterns("__pycache__", f"*{SUFFIX}", compiled.MANIFEST))
    folder = tmp_path / "mujou_actors" / "_runtime"
    hashes = {name: compiled.source_hash(folder / f"{name}.py") for name in compiled.MODULES}
    for name in compiled.MODULES:
        (folder / f"{name}{SUFFIX}").write_bytes(b"junk: importing this fails")
    if edit:
        hashes[compiled.MODULES[-1]] = "0" * 64  # as if the source changed after the build
    (folder / compiled.MANIFEST).write_text(json.dumps({"format": 1, "modules": hashes}))
    return folder


_PROBE = (
    "import importlib, json, warnings\n"
    "warnings.simplefilter('always')\n"
    "import mujou_actors._runtime as r\n"
    "files = {m: importlib.import_module('mujou_actors._runtime.' + m).__file__"
    " for m in r.compiled.MODULES}\n"
    "print(json.dumps({'build': [r.BUILD.kind, r.BUILD.reason], 'files': files}))\n"
)


def _probe(cwd: Path, **env: str) -> tuple[dict[str, object], str]:
    """Import the package found in ``cwd`` in a fresh process: its build and module files."""
    environ = {k: v for k, v in os.environ.items() if k != "MUJOU_PURE"} | env
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


@pytest.mark.slow
def test_a_copy_of_the_package_with_an_edited_source_imports_the_sources_and_warns(
        tmp_path: Path) -> None:
    folder = _package_copy(tmp_path, edit=True)
    edited = folder / f"{compiled.MODULES[-1]}.py"

    found, stderr = _probe(tmp_path)

    # The junk extension modules would fail to import: every module came from its source.
    assert found["build"] == ["python", f"{edited.name} edited since the build"]
    assert found["files"] == {m: str(folder / f"{m}.py") for m in compiled.MODULES}
    assert stderr.count("RuntimeWarning") == 1
    assert str(edited) in stderr and compiled.REBUILD in stderr


@pytest.mark.slow
def test_a_copy_of_the_package_under_mujou_pure_imports_the_sources_silently(
        tmp_path: Path) -> None:
    folder = _package_copy(tmp_path, edit=False)

    found, stderr = _probe(tmp_path, MUJOU_PURE="1")

    assert found["build"] == ["python", "MUJOU_PURE=1"]
    assert found["files"] == {m: str(folder / f"{m}.py") for m in compiled.MODULES}
    assert "Warning" not in stderr


def test_the_compiled_modules_are_the_ones_in_use_in_a_compiled_build() -> None:
    if runtime.BUILD.kind != "compiled":
        pytest.skip(f"{NO_BUILD}; this process runs {runtime.BUILD}")
    from mujou_actors._runtime import actor, keys

    # Imported here, not looked up: run alone, this file has not imported policy yet.
    modules = [importlib.import_module(f"{compiled.PACKAGE}.{name}")
               for name in runtime.BUILD.modules]

    assert runtime.BUILD.modules == compiled.MODULES
    assert all(m.__file__ is not None and m.__file__.endswith(SUFFIX) for m in modules)
    assert not inspect.isfunction(keys.pack)  # a compiled function, not a Python one
    assert not inspect.isfunction(actor.Actor.run_due)


def test_a_compiled_actor_keeps_a_hooks_key_object_as_it_was_given() -> None:
    # The sends restamp only when the hook's key is another object (keys.SharedKey).
    import mujou_actors as mujou
    from mujou_actors._runtime.actor import Actor

    actor = Actor(mujou.Node(period=0.01), "n", 0)
    key = (5, 6)

    actor.stamp = actor.queued_key = actor.trigger_key = key

    assert actor.stamp is key and actor.queued_key is key and actor.trigger_key is key


def test_mujou_version_says_which_build_runs() -> None:
    from click.testing import CliRunner

    from mujou_actors.cli import main

    result = CliRunner().invoke(main, ["--version"])

    assert result.exit_code == 0
    assert f"kernel build: {runtime.BUILD}" in result.output


@pytest.mark.slow
def test_a_build_without_a_c_compiler_installs_pure_python_and_says_why(
        tmp_path: Path) -> None:
    pytest.importorskip("mypyc.build", reason="mypy (mypyc) is not installed")
    for path in ("setup.py", "setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / path, tmp_path / path)
    shutil.copytree(ROOT / "mujou_actors", tmp_path / "mujou_actors",
                    ignore=shutil.ignore_patterns("__pycache__", f"*{SUFFIX}", compiled.MANIFEST))
    env = os.environ | {"MUJOU_COMPILE": "1", "CC": "false", "LDSHARED": "false"}

    done = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)

    folder = tmp_path / "mujou_actors" / "_runtime"
    assert done.returncode == 0, done.stderr
    assert "compiling the kernel failed" in done.stderr and "pure Python" in done.stderr
    assert compiled.extensions(folder) == {}
    assert not (folder / compiled.MANIFEST).exists()
    assert compiled.select(folder, {}).build == compiled.Build("python", "not compiled")


def test_the_builds_benchmark_refuses_a_tree_without_a_compiled_build() -> None:
    built = (ROOT / "mujou_actors" / "_runtime" / compiled.MANIFEST).exists()
    if runtime.BUILD.kind == "compiled" or built:  # built: run with MUJOU_PURE=1, say
        pytest.skip("a compiled build is here: the comparison would run for minutes")

    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "builds.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)

    assert done.returncode == 2
    assert "no compiled build" in done.stderr and compiled.REBUILD in done.stderr


def _builds_module() -> Any:
    path = ROOT / "benchmarks" / "builds.py"
    spec = importlib.util.spec_from_file_location("_builds_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_builds_benchmark_runs_each_build_where_it_says_and_checks_what_ran(
        tmp_path: Path) -> None:
    builds = _builds_module()
    trees = {"cython": tmp_path}

    compiled_env = builds._environ("compiled", trees)
    pure_env = builds._environ("python", trees)
    cython_env = builds._environ("cython", trees)

    assert "MUJOU_PURE" not in compiled_env and pure_env["MUJOU_PURE"] == "1"
    assert "MUJOU_PURE" not in cython_env
    assert cython_env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)
    assert compiled_env.get("PYTHONPATH") == os.environ.get("PYTHONPATH")
    mypyc = {"build": ["compiled", "compiled (mypyc 2.4.1: keys)"]}
    cython = {"build": ["compiled", "compiled (cython 3.3.1: keys)"]}
    pure = {"build": ["python", "python (MUJOU_PURE=1)"]}
    assert [builds._ran("compiled", r) for r in (mypyc, cython, pure)] == [True, False, False]
    assert [builds._ran("cython", r) for r in (mypyc, cython, pure)] == [False, True, False]
    assert [builds._ran("python", r) for r in (mypyc, cython, pure)] == [False, False, True]


def test_the_builds_benchmark_says_what_its_cython_build_needs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = _builds_module()
    monkeypatch.setitem(sys.modules, "Cython", None)  # as if not installed: import fails

    with pytest.raises(RuntimeError, match=r"needs Cython: pip install -e '\.\[bench\]'"):
        builds.build_cython(tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing copied before the check


def test_a_manifest_written_by_write_manifest_is_the_one_the_guard_trusts(tmp_path: Path) -> None:
    _fake_build(tmp_path)  # sources and "extension modules" of every module
    (tmp_path / compiled.MANIFEST).unlink()

    compiled.write_manifest(tmp_path, tmp_path, "cython 9.9 (test)")

    manifest = compiled.read_manifest(tmp_path)
    assert manifest is not None and manifest["compiler"] == "cython 9.9 (test)"
    assert manifest["modules"] == {name: compiled.source_hash(tmp_path / f"{name}.py")
                                   for name in compiled.MODULES}
    assert compiled.select(tmp_path, {}).build == compiled.Build(
        "compiled", "cython 9.9 (test)", compiled.MODULES)
