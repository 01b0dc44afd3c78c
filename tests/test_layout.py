"""The layout holds: no module imports itself back through others; imports run one way,
fleetadmin (the platform) <- pods <- ocrjobs, but for the crossings named in CROSSINGS; pods
reads pages only through ocrjobs' selectors; an import inside a function says why it is there;
no product module grows past ~400 lines without saying why.

Imports are read from the source (AST). An import inside a function runs when it is called,
which is how a write that must cross apps against the direction does it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tools.processes import REPO

PACKAGES = ("accounts", "fleetadmin", "ocrjobs", "pods", "podserver", "runpodsim", "tools")
MAX_LINES = 400
REASON = "Length:"  # starts a paragraph of the module docstring that says why it is longer
# An import inside a function carries this in a comment on its line or just above it (its block).
FUNCTION_LEVEL = "function-level:"
# Layers, lowest first: a module imports at module level only from its own layer or below.
LAYERS = {"accounts": 0, "fleetadmin": 0, "pods": 1, "ocrjobs": 2}
# (importer, imported) prefixes allowed to import upwards at module level, and why.
CROSSINGS = {
    ("fleetadmin.urls", "ocrjobs"): "the root URLconf routes to each app's views",
    ("fleetadmin.urls", "pods"): "the root URLconf routes to each app's views",
    ("fleetadmin.asgi", "pods"): "the ASGI entry serves pods' websockets and preloads the runpod SDK",
    ("fleetadmin.asgi", "ocrjobs"): "the ASGI entry serves the job page's websocket",
    ("pods", "ocrjobs.selectors"): "pods reads pages and jobs through ocrjobs' selectors only",
}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).with_suffix("")
            if "migrations" in relative.parts:
                continue
            parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
            found[".".join(parts)] = path
    return found


def _imports(path: Path, name: str, modules: dict[str, Path], *, deferred: bool = False) -> set[str]:
    """The project modules this one imports when it is imported (``deferred``: or in a function)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()

    def add(dotted: str) -> None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        if dotted and dotted != name:
            targets.add(dotted)

    for node in ast.walk(tree) if deferred else tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return targets


def _graph(*, deferred: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, modules, deferred=deferred) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle, as a list of modules, or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str]:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[module] = 2
        return []

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return []


def test_no_module_imports_itself_back_through_others():
    assert _cycle(_graph()) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "d": {"a"}}) == []


def _is_selectors(module: str) -> bool:
    return module == "ocrjobs.selectors" or module.startswith("ocrjobs.selectors.")


def test_pods_reads_pages_only_through_the_ocrjobs_selectors_and_defers_the_writes_that_cross():
    at_import = {
        (module, target)
        for module, targets in _graph().items()
        if module.startswith("pods")
        for target in targets
        if target.startswith("ocrjobs") and not _is_selectors(target)
    }
    assert at_import == set()
    # In a function too: a page is read through a selector, written through an ocrjobs service.
    reads = {
        (module, target)
        for module, targets in _graph(deferred=True).items()
        if module.startswith("pods")
        for target in targets
        if target.startswith("ocrjobs")
        and not _is_selectors(target)
        and not target.startswith(("ocrjobs.services", "ocrjobs.tasks"))
    }
    assert reads == set()


def _lengths_unexplained(modules: dict[str, Path]) -> list[str]:
    """Modules over MAX_LINES whose docstring has no REASON paragraph, and modules back under it
    whose docstring still carries one (a reason that no longer holds)."""
    found = []
    for name, path in modules.items():
        source = path.read_text()
        lines = source.count("\n")
        docstring = ast.get_docstring(ast.parse(source)) or ""
        explained = any(line.startswith(REASON) for line in docstring.splitlines())
        if lines > MAX_LINES and not explained:
            found.append(f"{name}: {lines} lines and no {REASON!r} paragraph in its docstring")
        elif lines <= MAX_LINES and explained:
            found.append(f"{name}: {lines} lines, yet its docstring says why it is long")
    return found


def test_no_product_module_is_over_400_lines_without_a_reason_in_its_docstring():
    assert _lengths_unexplained(_modules()) == []


def test_the_length_check_finds_a_long_module_without_a_reason_and_a_stale_reason(tmp_path):
    body = "x = 1\n" * MAX_LINES
    modules = {}
    for name, docstring in [("long", "What it says of a Content-Length: header."),
                            ("explained", f"What it does.\n\n{REASON} why."), ("short", f"{REASON} once long.")]:  # fmt: skip
        modules[name] = tmp_path / f"{name}.py"
        modules[name].write_text(f'"""{docstring}"""\n' + (body if name != "short" else ""))
    assert [line.split(":")[0] for line in _lengths_unexplained(modules)] == ["long", "short"]


def _crossing(module: str, target: str) -> bool:
    return any(
        (module == a or module.startswith(a + ".")) and (target == b or target.startswith(b + "."))
        for a, b in CROSSINGS
    )


def _upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if LAYERS.get(target.split(".")[0], -1) > LAYERS.get(module.split(".")[0], 99) and not _crossing(module, target)
    }


def test_imports_run_one_way_fleetadmin_then_pods_then_ocrjobs_but_for_the_named_crossings():
    assert _upward(_graph()) == set()


def test_the_direction_check_finds_an_upward_import():
    assert _upward({"pods.x": {"ocrjobs.services.y", "ocrjobs.selectors.z"}, "ocrjobs.a": {"pods.b"}}) == {
        ("pods.x", "ocrjobs.services.y")
    }


def _unexplained_function_level_imports(path: Path) -> list[int]:
    """Lines of the imports of project modules inside a function with no FUNCTION_LEVEL comment on
    their line or in the comments, imports and blank lines just above them."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source, filename=str(path))
    at_top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom) or id(node) in at_top:
            continue
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        if not (getattr(node, "level", 0) or any(name.split(".")[0] in PACKAGES for name in names)):
            continue
        block = lines[node.lineno - 1 : node.end_lineno]
        above = node.lineno - 2
        while above >= 0 and (not lines[above].strip() or lines[above].strip().startswith(("#", "from ", "import "))):
            block.append(lines[above])
            above -= 1
        if not any(FUNCTION_LEVEL in line for line in block):
            found.append(node.lineno)
    return found


def test_every_import_inside_a_function_names_its_reason():
    modules = _modules()
    unexplained = [
        f"{path.relative_to(REPO)}:{line}"
        for path in modules.values()
        for line in _unexplained_function_level_imports(path)
    ]
    assert unexplained == []


def test_the_function_level_check_finds_an_unexplained_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    import json\n    from pods import models\n\n\n"
        "def g():\n    # function-level: a reason\n    from pods import models\n    from ocrjobs import tasks\n"
    )
    assert _unexplained_function_level_imports(module) == [3]
