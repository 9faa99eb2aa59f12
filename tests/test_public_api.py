"""The public surface: __all__, the runtime names, the docs' reference and docstrings."""

from __future__ import annotations

import inspect
import pathlib
import re
import subprocess
import sys

import pytest

import mujou_actors as mujou

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_all_lists_exactly_the_public_runtime_names() -> None:
    for name in dir(mujou):  # the lazy names, loaded
        getattr(mujou, name)
    public = {n for n in vars(mujou) if not n.startswith("_")}
    modules = {n for n in public if inspect.ismodule(getattr(mujou, n))}

    assert set(mujou.__all__) == public - modules - {"annotations"}


@pytest.mark.slow
def test_the_package_imports_its_names_when_used_and_run_stays_the_function() -> None:
    code = ("import sys, mujou_actors.distributed.actors as a, mujou_actors as m\n"
            "print('torch' in sys.modules, 'mujou_actors.run' in sys.modules)\n"
            "f = m.run\n"
            "import mujou_actors.run\n"
            "print(m.run is f, callable(m.run), type(m.Node).__name__, 'torch' in sys.modules)\n"
            "print(set(dir(m)) >= set(m.__all__))\n"
            "try:\n    m.nothing\nexcept AttributeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, check=True).stdout.splitlines()

    # a placed run's coordinator imports this module: it must not pay for torch
    assert out == ["False False", "True True type True", "True",
                   "module 'mujou_actors' has no attribute 'nothing'"]


# The limits docs/state.md names (`mujou_actors.snapshot.MAX_DEPTH`, ...): public constants
# that are not in the reference.
DOCUMENTED_CONSTANTS = {"MAX_DEPTH", "MEMORY_PER_BYTE", "MEMORY_SLACK", "V2_MEMORY_PER_BYTE",
                        "MAX_NESTING"}


def test_public_modules_list_only_public_names_in_all() -> None:
    import importlib
    import pkgutil

    text = (ROOT / "docs" / "reference.md").read_text()
    members = {name.strip() for group in re.findall(r"members: \[(.*?)\]", text)
               for name in group.split(",")}
    public = set(mujou.__all__) | members | DOCUMENTED_CONSTANTS
    wrong = {}
    recording = importlib.import_module("mujou_actors.recording")
    names = [f"mujou_actors.{info.name}" for info in pkgutil.iter_modules(mujou.__path__)]
    names += [f"mujou_actors.recording.{info.name}"
              for info in pkgutil.iter_modules(recording.__path__)]
    for name in names:
        if name.rsplit(".", 1)[1].startswith("_"):
            continue
        module = importlib.import_module(name)
        extra = sorted(set(getattr(module, "__all__", ())) - public)
        if extra:
            wrong[name] = extra

    assert wrong == {}


@pytest.mark.slow
def test_the_old_paths_of_the_recording_modules_import_the_moved_module_and_warn() -> None:
    code = ("import warnings, mujou_actors.recording.mcapfile as new\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    import mujou_actors.mcapfile as old\n"
            "    from mujou_actors import playback\n"
            "print(old is new, old.__spec__.name, playback.__name__)\n"
            "print([(w.category.__name__, str(w.message).split(';')[0].split()[0])\n"
            "       for w in caught])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, check=True).stdout.splitlines()

    assert out == [
        "True mujou_actors.recording.mcapfile mujou_actors.recording.playback",
        "[('DeprecationWarning', 'mujou_actors.mcapfile'),"
        " ('DeprecationWarning', 'mujou_actors.playback')]"]


def test_sync_mode_error_is_one_class_under_two_names() -> None:
    from mujou_actors import errors

    assert mujou.cuda.SyncModeError is errors.SyncModeError
    assert issubclass(errors.SyncModeError, (mujou.MujouError, RuntimeError))


def test_the_docs_reference_lists_every_public_name() -> None:
    text = (ROOT / "docs" / "reference.md").read_text()

    headings = re.findall(r"^## (\w+)\s*$", text, flags=re.M)

    assert headings == list(mujou.__all__)


def test_every_public_name_and_method_has_a_docstring() -> None:
    missing = []
    for name in mujou.__all__:
        obj = getattr(mujou, name)
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if attr.startswith("_") or not (callable(value) or isinstance(value, property)):
                    continue
                if not (getattr(value, "__doc__", None) or "").strip():
                    missing.append(f"{name}.{attr}")

    assert missing == []


@pytest.mark.slow
def test_import_is_quick_and_initialises_no_cuda_and_no_example_dependencies() -> None:
    code = (
        "import time, sys, torch\n"
        "t0 = time.perf_counter()\n"
        "import mujou_actors\n"
        "took = time.perf_counter() - t0\n"
        "heavy = [m for m in ('mujoco', 'gymnasium', 'matplotlib', 'rich', 'thespian')"
        " if m in sys.modules]\n"
        "print(took, torch.cuda.is_initialized(), heavy)\n"
    )

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split(maxsplit=2)

    assert float(out[0]) < 1.0
    assert out[1] == "False"
    assert out[2].strip() == "[]"


@pytest.mark.slow
def test_the_docs_build_without_warnings(tmp_path) -> None:
    import shutil

    mkdocs = shutil.which("mkdocs") or str(pathlib.Path(sys.executable).parent / "mkdocs")

    result = subprocess.run([mkdocs, "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)

    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "reference" / "index.html").exists()


def test_the_code_passes_ruff() -> None:
    import shutil

    ruff = shutil.which("ruff") or str(pathlib.Path(sys.executable).parent / "ruff")

    result = subprocess.run([ruff, "check", "mujou_actors", "tests", "examples", "benchmarks"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)

    assert result.returncode == 0, result.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)  # a cold mypy cache on a loaded machine takes minutes
def test_the_package_passes_mypy() -> None:
    # pyproject.toml's [tool.mypy] says how strict: every function typed, typed bodies checked.
    pytest.importorskip("mypy", reason="mypy is not installed (it comes with the test extra)")

    result = subprocess.run([sys.executable, "-m", "mypy", "mujou_actors"],
                            cwd=ROOT, capture_output=True, text=True, timeout=540)

    assert result.returncode == 0, result.stdout + result.stderr
