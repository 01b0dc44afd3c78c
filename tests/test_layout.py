"""The layout holds: no module imports itself back through others; imports run one way,
fleetadmin (the platform) <- pods <- ocrjobs, but for the crossings named in CROSSINGS; pods
never imports ocrjobs, even inside a function (it asks and tells it through pods/hooks.py); no
private name is imported across modules; an import inside a function says why it is there, and
there are at most MAX_FUNCTION_LEVEL of them; no product module grows past ~400 lines without
saying why, and no function past MAX_FUNCTION_LINES.

Imports are read from the source (AST). An import inside a function runs when it is called: it
is for a module that cannot load earlier (models before the app registry, an SDK only some
deployments use), never a way around the direction.
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
MAX_FUNCTION_LEVEL = 10  # imports of project modules inside functions, in every product package
MAX_FUNCTION_LINES = 60  # a def from its line to its last, docstring and comments included
# Layers, lowest first: a module imports at module level only from its own layer or below.
LAYERS = {"accounts": 0, "fleetadmin": 0, "pods": 1, "ocrjobs": 2}
# (importer, imported) prefixes allowed to import upwards at module level, and why.
CROSSINGS = {
    ("fleetadmin.urls", "ocrjobs"): "the root URLconf routes to each app's views",
    ("fleetadmin.urls", "pods"): "the root URLconf routes to each app's views",
    ("fleetadmin.asgi", "pods"): "the ASGI entry serves pods' websockets and preloads the runpod SDK",
    ("fleetadmin.asgi", "ocrjobs"): "the ASGI entry serves the job page's websocket",
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


def _pods_to_ocrjobs(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {
        (module, target)
        for module, targets in graph.items()
        if module == "pods" or module.startswith("pods.")
        for target in targets
        if target == "ocrjobs" or target.startswith("ocrjobs.")
    }


def test_pods_never_imports_ocrjobs_even_inside_a_function():
    assert _pods_to_ocrjobs(_graph(deferred=True)) == set()


def test_the_pods_check_finds_an_import_of_ocrjobs_inside_a_function(tmp_path):
    module = tmp_path / "boot.py"
    module.write_text("import json\n\n\ndef joined():\n    from ocrjobs.services.dispatchers import dispatch_ensure\n")
    modules = {"pods.services.boot": module, "ocrjobs.services.dispatchers": tmp_path / "d.py"}
    graph = {"pods.services.boot": _imports(module, "pods.services.boot", modules, deferred=True)}
    assert _pods_to_ocrjobs(graph) == {("pods.services.boot", "ocrjobs.services.dispatchers")}
    assert _pods_to_ocrjobs({"ocrjobs.x": {"pods.y"}, "pods.y": {"fleetadmin.z"}}) == set()


def _private_names_imported(path: Path, name: str, modules: dict[str, Path]) -> list[str]:
    """Names with a leading underscore this module takes from another project module, by an import
    (``from m import _x``) or off a module it imported (``m._x``): ``line: module._x`` each."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found, module_names = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            if base.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    module_names.add(alias.asname or alias.name)
                elif alias.name.startswith("_"):
                    found.append(f"{node.lineno}: {base}.{alias.name}")
        elif isinstance(node, ast.Import):
            module_names.update(alias.asname for alias in node.names if alias.asname and alias.name in modules)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in module_names:
            if node.attr.startswith("_") and not node.attr.startswith("__"):
                found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_private_name_is_imported_across_modules():
    modules = _modules()
    imported = [
        f"{path.relative_to(REPO)}:{line}"
        for name, path in modules.items()
        for line in _private_names_imported(path, name, modules)
    ]
    assert imported == []


def test_the_private_name_check_finds_an_import_and_a_read_off_a_module(tmp_path):
    module = tmp_path / "split.py"
    module.write_text(
        "from ocrjobs.services.jobs import _nudge, job_refresh\nfrom ocrjobs.services import pages\n"
        "from django.db import _private_of_a_library\n\n\ndef f():\n    from . import _helper\n"
        "    return pages._first_reading_kept, pages.__name__\n"
    )
    modules = {name: module for name in ("ocrjobs.services.split", "ocrjobs.services.jobs", "ocrjobs.services.pages")}
    assert _private_names_imported(module, "ocrjobs.services.split", modules) == [
        "1: ocrjobs.services.jobs._nudge",
        "7: ocrjobs.services._helper",
        "8: pages._first_reading_kept",
    ]


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


def _long_functions(paths) -> list[str]:
    """Every function (or method) of ``paths`` longer than MAX_FUNCTION_LINES, with its length."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(Path(path).read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{Path(path).name}:{node.name}: {lines} lines")
    return found


def test_no_product_function_is_over_60_lines():
    assert _long_functions(_modules().values()) == []


def test_the_function_length_check_finds_a_long_method_and_passes_one_at_the_limit(tmp_path):
    module = tmp_path / "m.py"
    body = "        x = 1\n" * (MAX_FUNCTION_LINES - 1)
    module.write_text(f"class A:\n    async def at_limit(self):\n{body}\n    def over(self):\n{body}        y = 2\n")
    assert _long_functions([module]) == [f"m.py:over: {MAX_FUNCTION_LINES + 1} lines"]


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
    graph = {"pods.x": {"ocrjobs.services.y", "ocrjobs.selectors.z"}, "ocrjobs.a": {"pods.b"}, "fleetadmin.urls": {"pods.views"}}  # fmt: skip
    assert _upward(graph) == {("pods.x", "ocrjobs.services.y"), ("pods.x", "ocrjobs.selectors.z")}


def _function_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports of project modules that are not at the top of the module (inside a function)."""
    at_top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom) or id(node) in at_top:
            continue
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        if getattr(node, "level", 0) or any(name.split(".")[0] in PACKAGES for name in names):
            found.append(node)
    return found


def _unexplained_function_level_imports(path: Path) -> list[int]:
    """Lines of the imports of project modules inside a function with no FUNCTION_LEVEL comment on
    their line or in the comments, imports and blank lines just above them."""
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in _function_level_imports(ast.parse(source, filename=str(path))):
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


def _function_level_count(paths) -> int:
    return sum(len(_function_level_imports(ast.parse(path.read_text(), filename=str(path)))) for path in paths)


def test_there_are_at_most_ten_imports_of_project_modules_inside_functions():
    assert _function_level_count(_modules().values()) <= MAX_FUNCTION_LEVEL


def test_the_function_level_count_counts_every_import_inside_a_function_and_no_other(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import json\nfrom pods import models\n\n\ndef f():\n    import json\n    from pods import models\n"
        "    from . import sibling\n\n\nclass C:\n    def g(self):\n        import ocrjobs.tasks, pods.tasks\n"
    )
    assert _function_level_count([module]) == 3
    assert _function_level_count([module] * 4) > MAX_FUNCTION_LEVEL
