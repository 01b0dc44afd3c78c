"""The layout holds: no module imports itself back through others, pods reads pages only
through ocrjobs' selectors, and no product module grows past ~400 lines without saying why.

Imports are read from the source (AST), module level only: an import inside a function
runs when it is called, which is how a write that must cross apps does it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tools.processes import REPO

PACKAGES = ("accounts", "fleetadmin", "ocrjobs", "pods", "podserver", "runpodsim", "tools")
MAX_LINES = 400
REASON = "Length:"  # a paragraph of the module docstring that says why it is longer


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


def test_no_product_module_is_over_400_lines_without_a_reason_in_its_docstring():
    long = []
    for name, path in _modules().items():
        lines = path.read_text().count("\n")
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        if lines > MAX_LINES and REASON not in docstring:
            long.append(f"{name}: {lines} lines")
    assert long == []
