"""The hot path's inlined copies of a rule cannot drift from the rule unnoticed.

The kernel inlines a few rules where a call per message, per update or per
delta cycle showed in `benchmarks/inlined.py` (docs/performance.md, "The
kernel's inlined rules": a copy is kept only where its call costs 1 % of a
unit or more); each copy carries a comment naming its rule. Each row of `COPIES`
pins, by a fingerprint of their syntax trees, the rule's function and the
function that holds its copy. When either changes, this test fails with the
pair to compare: make the copy say what the rule says, then update the row's
fingerprints (the failure prints the new ones).
"""

from __future__ import annotations

import ast
import hashlib
import pathlib
import textwrap
from typing import Any

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "mujou_actors"

# (file of the copy, the text that marks it, the function that holds it, the rule as
#  "file:Qualified.name", fingerprints of the holder and of the rule)
COPIES: list[tuple[str, str, str, str, str, str]] = [
    ('_runtime/actor.py', "run_update's common case with now == due, inlined",
     'Actor.run_due', '_runtime/actor.py:Actor.run_update',
     '369f3e39c418', 'a663fcaaa193'),
    ('_runtime/actor.py', 'What call() does, inlined for the common case',
     'Actor.run_update', '_runtime/actor.py:Actor.call',
     'a663fcaaa193', 'ad9e374d3384'),
    ('_runtime/calendar.py', '# Calendar.live, inlined',
     'Calendar.top', '_runtime/calendar.py:Calendar.live',
     '98fbe8125c4f', '2f3ad9d63738'),
    ('_runtime/dispatcher.py', '# Calendar.live, inlined',
     '_claim_simulated', '_runtime/calendar.py:Calendar.live',
     'd74a2eb6b18b', '2f3ad9d63738'),
    ('_runtime/dispatcher.py', "RealTime.start's common case, inlined",
     'Dispatcher._may_start', '_runtime/policy.py:RealTime.start',
     'f70085151d62', '3460dede4d1c'),
    ('_runtime/dispatcher.py', "SimulatedTime.advance's NEXT_DELTA, inlined",
     'Dispatcher._advance', '_runtime/policy.py:SimulatedTime.advance',
     '889de6380d4c', '8c47b7ba6871'),
    ('_runtime/dispatcher.py', "(_advance's NEXT_INSTANT, inlined",
     'Dispatcher._lone_loop', '_runtime/dispatcher.py:Dispatcher._advance',
     'bd1660c2a566', '889de6380d4c'),
    ('_runtime/dispatcher.py', '_lower_trigger, inlined: per send',
     'Dispatcher._finish_lone', '_runtime/dispatcher.py:Dispatcher._lower_trigger',
     '4c5a4ebbcf98', '978560d945f3'),
    ('_runtime/dispatcher.py', '`_run_claimed` for simulated time, inlined',
     'Dispatcher._run_members', '_runtime/dispatcher.py:Dispatcher._run_claimed',
     '648b63bb5e77', 'd969fb4490d9'),
]


def _functions(path: pathlib.Path) -> dict[str, ast.AST]:
    """Every function of a module by its qualified name (``Class.method``)."""
    return _functions_of(ast.parse(path.read_text()))


def _functions_of(module: ast.AST) -> dict[str, ast.AST]:
    """Every function of a parsed module by its qualified name."""
    found: dict[str, ast.AST] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    found[name] = child
                visit(child, f"{name}.")

    visit(module, "")
    return found


def _fingerprint(node: ast.AST) -> str:
    """The function's syntax tree, without line numbers, hashed (12 hex digits)."""
    return hashlib.sha256(ast.dump(node).encode()).hexdigest()[:12]


def _lines(file: str, holder: str, mark: str) -> list[int]:
    """The lines of ``holder`` (a function of ``file``) that carry ``mark``."""
    path = PACKAGE / file
    fn = _functions(path)[holder]
    text = path.read_text().splitlines()
    return [n for n in range(fn.lineno, (fn.end_lineno or fn.lineno) + 1)  # type: ignore[attr-defined]
            if mark in text[n - 1]]


def test_every_inlined_copy_is_listed_with_its_rule() -> None:
    marked = {(str(p.relative_to(PACKAGE)), n + 1)
              for p in PACKAGE.joinpath("_runtime").glob("*.py")
              for n, line in enumerate(p.read_text().splitlines())
              if "inlined" in line or "inlines" in line}
    listed = {(file, n) for file, mark, holder, *_ in COPIES for n in _lines(file, holder, mark)}

    assert all(_lines(file, holder, mark) for file, mark, holder, *_ in COPIES)
    assert marked <= listed, sorted(marked - listed)


def test_no_rule_or_copy_changed_without_the_other_being_checked() -> None:
    changed = []
    for file, mark, holder, rule, holder_print, rule_print in COPIES:
        rule_file, rule_name = rule.split(":")
        now = (_fingerprint(_functions(PACKAGE / file)[holder]),
               _fingerprint(_functions(PACKAGE / rule_file)[rule_name]))
        if now != (holder_print, rule_print):
            changed.append(f"{rule} and its copy in {file} {holder} ({mark!r}): "
                           f"compare them, then pin {now[0]!r}, {now[1]!r}")

    assert changed == [], "\n".join(changed)


def _benchmark() -> Any:
    """benchmarks/inlined.py as a module (standard library only at import)."""
    import importlib.util
    import sys

    path = PACKAGE.parent / "benchmarks" / "inlined.py"
    spec = importlib.util.spec_from_file_location("_mujou_bench_inlined", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_the_benchmark_measures_each_copy_against_a_call_to_its_rule() -> None:
    """benchmarks/inlined.py lists the copies listed here, and can replace each by its call.

    Each replacement is found exactly once in its file (at its indentation),
    leaves a module that parses, and changes the function that holds the copy:
    so the benchmark cannot drift from the kernel unnoticed either.
    """
    bench = _benchmark()

    assert sorted((c.file, c.mark, c.holder, c.rule) for c in bench.COPIES) == sorted(
        (file, mark, holder, rule) for file, mark, holder, rule, *_ in COPIES)
    for copy in bench.COPIES:
        source = (PACKAGE / copy.file).read_text()
        changed = bench.without(copy, source)
        assert textwrap.indent(copy.new, " " * copy.indent) in changed, copy.name
        holder = _fingerprint(_functions_of(ast.parse(changed))[copy.holder])
        assert holder != _fingerprint(_functions(PACKAGE / copy.file)[copy.holder]), copy.name
