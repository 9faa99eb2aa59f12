"""The shape of the code that makes some defects impossible by construction.

Each test scans the package's source (its syntax trees), so a change that
breaks one of these rules fails here, before it can show up as a hang or a
hook run outside its node's context.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "mujou_actors"
USER_CODE = {"on_start", "on_update", "on_stop", "state_dict", "load_state_dict"}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(PACKAGE)), ast.parse(p.read_text()))
            for p in sorted(PACKAGE.rglob("*.py"))]


def test_only_the_actor_calls_a_nodes_hooks_and_state_methods() -> None:
    """User code runs in one module, _runtime/actor.py, inside the node's context.

    Allowed elsewhere: node.py (Node's own default state_dict, which runs
    inside the hook that called it), the host's API on a Run (``run.``) and a
    driven kernel's (``kernel.``: `Kernel.state_dict` asks its actors).
    """
    found = []
    for name, tree in _modules():
        if name in ("_runtime/actor.py", "node.py"):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr in USER_CODE
                    and isinstance(node.ctx, ast.Load)
                    and ast.unparse(node.value).split(".")[-1] not in ("run", "self", "kernel")):
                found.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert found == []


def test_only_the_actor_enters_a_nodes_context() -> None:
    """Nothing but actor.py runs anything in a node's context (it also sets CURRENT there)."""
    calls = [(name, ast.unparse(node)) for name, tree in _modules()
             if name != "_runtime/actor.py" for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and node.func.attr == "run" and ast.unparse(node.func.value).endswith(".context")]
    assert calls == []


# Waits without a timeout, each with its way out. Anything new needs a bound, or a
# line here saying what ends it.
UNBOUNDED_WAITS = {
    # the snapshot writer's thread waits for work; close() notifies it
    ("supervisor.py", "self._cond.wait()"),
    # (Run.stop from the host waits for the end, coordinator.wait_ended(None), which is
    # itself bounded by stop_timeout; a None timeout is not a call without arguments.)
    # the CLI's own run: Ctrl-C stops it
    ("cli.py", "run.wait()"), ("cli.py", "run.join()"),
    # CUDA copies of one message: the GPU completes them (the waiter's cuda_sync)
    ("devices.py", "copier.wait()"), ("_runtime/build.py", "copier.wait()"),
    ("_runtime/actor.py", "copier.wait()"),
    # locks held only for a few statements by their holders, never across a wait
    ("_runtime/actor.py", "lock.acquire()"), ("_runtime/dispatcher.py", "self._cond.acquire()"),
    # the live view's asyncio tasks: a client's writer waits for messages (cancelled at
    # the client's end); the loop waits for its end (the run's end or close() sets it)
    ("recording/wsserver.py", "client.wake.wait()"), ("recording/wsserver.py", "self._stop.wait()"),
    # a recording's view, likewise (close() sets its end); its player waits for a
    # control (play, seek) or close(), each of which notifies the condition
    ("recording/playback.py", "cond.wait()"),
}


def test_every_wait_has_a_bound_or_a_named_way_out() -> None:
    found = set()
    for name, tree in _modules():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in {"wait", "join", "get", "acquire"}
                    and not node.args and not node.keywords):
                found.add((name, ast.unparse(node)))
    assert found <= UNBOUNDED_WAITS, sorted(found - UNBOUNDED_WAITS)


def test_the_kernel_never_imports_the_run_or_the_cli() -> None:
    found = []
    for name, tree in _modules():
        if not name.startswith("_runtime/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level and (node.module or "") in (
                    "run", "cli", "host") and node.level == 2:
                found.append(f"{name}: from ..{node.module}")
    assert found == []


def _package_imports(name: str, tree: ast.Module) -> set[str]:
    """The package's modules that module ``name`` imports (any kind), as dotted names."""
    here = name[:-len(".py")].split("/")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[:len(here) - (node.level - 1)]
            if node.module:
                found.add(".".join([*base, node.module]))
            else:  # from . import x: a module of the package, or a name of __init__.py
                for alias in node.names:
                    path = PACKAGE.joinpath(*base, alias.name + ".py")
                    found.add(".".join([*base, alias.name]) if path.exists() else "package")
        elif isinstance(node, ast.ImportFrom) and node.module == "mujou_actors":
            found.add("package")
        elif isinstance(node, ast.Import):
            found.update("package" for alias in node.names if alias.name == "mujou_actors")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mujou_actors."):
            found.add(node.module.removeprefix("mujou_actors."))  # type: ignore[union-attr]
    found.discard(name[:-len(".py")].replace("/", "."))
    return found


def test_the_import_table_of_the_architecture_page_is_the_real_one() -> None:
    # docs/architecture.md, "Imports": each row names what its modules import,
    # and each module imports only modules of the rows below its own.
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text().split("## Imports")[1]
    rows = [line.split("|")[1:3] for line in text.splitlines() if line.startswith("| `")]
    modules = {name[:-len(".py")].replace("/", "."): tree for name, tree in _modules()}
    row_of: dict[str, int] = {}
    listed: dict[str, set[str]] = {}
    for i, (cell, imports) in enumerate(rows):
        names = {t for t in _ticked(imports) if t in modules}
        if "the public package" in imports:
            names.add("package")
        for path in _ticked(cell):
            module = path.removesuffix(".py").replace("/", ".")
            if path.endswith(".py") and module in modules:
                row_of.setdefault(module, i)
                listed.setdefault(module, names)
    wrong, above = [], []
    for name, tree in _modules():
        module = name[:-len(".py")].replace("/", ".")
        real = _package_imports(name, tree)
        if module == "__main__":
            continue  # named in cli.py's row
        if module not in listed:
            wrong.append(f"{module}: not in the table")
            continue
        if real != listed[module]:
            wrong.append(f"{module}: imports {sorted(real)}, "
                         f"the table says {sorted(listed[module])}")
        above += [f"{module} imports {dep}, listed above it" for dep in real
                  if dep in row_of and row_of[dep] <= row_of[module] and module != "__init__"]
    assert wrong + above == [], "\n".join(wrong + above)


def _ticked(text: str) -> list[str]:
    """The names between backticks in ``text``."""
    return text.split("`")[1::2]


def test_the_kernels_parts_write_no_field_of_another_part() -> None:
    # The calendar, the mailbox and the kernel's listener change their own fields
    # through their methods: no `self.part.field = ...` and no `calendar.field = ...`
    # anywhere in the kernel, so what writes a part's state is found in the part.
    # (An Actor is the record its dispatcher owns and writes under the lock; a
    # port's and a node's framework fields are the run's to set; neither is a part.)
    found = []
    for name, tree in _modules():
        if not name.startswith("_runtime/"):
            continue
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = [t for target in node.targets
                           for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for t in targets:
                if not isinstance(t, ast.Attribute):
                    continue
                base = t.value
                if (isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name)
                        and base.value.id == "self") or (
                        isinstance(base, ast.Name) and base.id in ("calendar", "mailbox")):
                    found.append(f"{name}:{node.lineno}: {ast.unparse(t)} = ...")
    assert found == [], "\n".join(found)


def test_the_kernel_types_its_project_objects_by_their_class_not_any() -> None:
    # A node, a port, an actor or the CUDA runtime typed `Any` hides the class
    # from mypy: a parameter, field or return annotation of these names in
    # `_runtime/` names the class (under TYPE_CHECKING where importing it
    # would make a cycle).
    meant = {"node", "port", "input", "inputs", "actor", "actors", "reader", "rt", "waiter",
             "dispatcher", "listener", "prune", "_deliver"}
    found = []
    for name, tree in _modules():
        if not name.startswith("_runtime/"):
            continue
        for node in ast.walk(tree):
            annotated: list[tuple[str, ast.expr | None]] = []
            if isinstance(node, ast.FunctionDef):
                args = node.args
                annotated += [(a.arg, a.annotation) for a in
                              [*args.posonlyargs, *args.args, *args.kwonlyargs]]
                annotated.append((node.name, node.returns))
            elif isinstance(node, ast.AnnAssign):
                target = node.target
                label = target.attr if isinstance(target, ast.Attribute) else ast.unparse(target)
                annotated.append((label, node.annotation))
            for label, annotation in annotated:
                text = "" if annotation is None else ast.unparse(annotation)
                # The object itself, or a container's element or key, typed Any (a
                # message, which is any value, stays Any: list[Any], Callable[[Any], ...]).
                if label in meant and (text.startswith("Any") or "[Any," in text):
                    found.append(f"{name}:{node.lineno}: {label}: {text}")
    assert found == [], "\n".join(found)


def test_a_number_but_not_a_bool_is_checked_only_by_checks() -> None:
    # `_checks.is_number` / `is_int` are the one check: no function elsewhere
    # asks both whether a value is a bool and whether it is an int or a float.
    # The codec's encoder tells the types apart to write each in its own
    # format (a bool is not written as an int): no argument check.
    encoders = {("codec.py", "_convert"), ("codec.py", "convert")}
    found = []
    for name, tree in _modules():
        if name == "_checks.py":
            continue
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef) or (name, func.name) in encoders:
                continue
            asked: dict[str, set[str]] = {}
            for call in ast.walk(func):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                        and call.func.id == "isinstance" and len(call.args) == 2):
                    value, kinds = (ast.unparse(a) for a in call.args)
                    asked.setdefault(value, set()).update(
                        k for k in ("bool", "int", "float") if k in kinds.replace(" ", "")
                        .strip("()").split(","))
            found += [f"{name}: {func.name}({value})" for value, kinds in asked.items()
                      if "bool" in kinds and kinds & {"int", "float"}]
    assert found == [], "\n".join(found)


def test_the_dispatchers_public_methods_take_its_lock_but_those_the_page_lists() -> None:
    # docs/architecture.md, "The locking rule": the public methods that take no lock.
    unlocked = {"crowd", "hook_of", "pending_deliveries", "start_threads", "join_threads",
                "thread_names", "is_own_thread", "end_ns", "next_cut_ns", "frontier"}
    through = {"stop_at_boundary": "_request_stop", "stop_now": "_request_stop"}
    tree = dict(_modules())["_runtime/dispatcher.py"]
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Dispatcher")
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    found = set()
    for name in methods:
        if name.startswith("_"):
            continue
        target = methods[through.get(name, name)]
        if "with self._cond" not in ast.unparse(target):
            found.add(name)
    assert found == unlocked
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    rule = page.split("**The locking rule.**")[1].split("## ")[0]
    assert {n for n in unlocked if f"`{n}`" not in rule} == set()


def test_d_names_a_delta_cycle_and_only_in_the_kernel() -> None:
    # The vocabulary (issue 14): `d` is a delta cycle, in `_runtime/` only; a
    # dimension, a delivery or a dispatcher is spelled out.
    found = [f"{name}:{node.lineno}" for name, tree in _modules()
             if not name.startswith("_runtime/") for node in ast.walk(tree)
             if (isinstance(node, ast.Name) and node.id == "d")
             or (isinstance(node, ast.arg) and node.arg == "d")]
    assert found == []


def test_every_function_of_the_mailbox_is_used_by_the_kernel() -> None:
    # The mailbox is the kernel's plain data: what it offers (docs/architecture.md
    # names `Mailbox.put` as the way in from outside the hooks) is what the
    # kernel calls, so the page cannot point at code that nothing runs.
    tree = dict(_modules())["_runtime/mailbox.py"]
    offered = {f.name for node in tree.body
               for f in ([node] if isinstance(node, ast.FunctionDef) else
                         node.body if isinstance(node, ast.ClassDef) else [])
               if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")}
    called = set()
    for name, module in _modules():
        if name == "_runtime/mailbox.py":
            continue
        for node in ast.walk(module):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Name):
                called.add(node.func.id)
            elif (isinstance(node.func, ast.Attribute)  # a method: called on a mailbox
                    and ast.unparse(node.func.value).endswith("mailbox")):
                called.add(node.func.attr)
    assert offered - called == set()


def test_the_host_asks_a_group_for_anything_only_through_the_drivers_ask() -> None:
    """A node's failure in a group's control request reaches the host as a `NodeError`
    (node, hook, group), never as the control plane's `RemoteError`: `_Driver.ask` is
    where it is turned into one, so every request to a group goes through it. Allowed:
    ``check_same_net``'s ``Describe``, which runs no hook, before the driver exists."""
    found = []
    for name, tree in _modules():
        if not name.startswith("distributed/") or name == "distributed/system.py":
            continue
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef) or \
                    (name, function.name) in {("distributed/driver.py", "ask"),
                                              ("distributed/recovery.py", "check_same_net")}:
                continue
            found += [f"{name}:{call.lineno} {ast.unparse(call.func)}"
                      for call in ast.walk(function)
                      if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                      and call.func.attr == "ask"
                      and ast.unparse(call.func.value).split(".")[-1] == "system"]
    assert found == []
