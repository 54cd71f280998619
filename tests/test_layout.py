"""The rooms and which way the arrows run, read from the code's own imports.

- ``tasks/`` imports neither ``methods/`` nor ``harness/``; ``methods/`` neither ``tasks/`` nor ``harness/``;
- the runtime (``harness/`` outside ``harness.analysis`` and ``harness.training``) imports neither;
- inside the runtime, the decode room (``harness.decode``) imports no protocol and nothing of the
  record but its schema (the declared figures its output carries); the protocols
  (``harness.protocols``) import the decode room, and of the record only its schema; the record
  (``harness.record``) imports neither the decode room nor the protocols;
- no module imports an entry point (``harness.run``, ``harness.bench``, ``harness.lm_eval_model``,
  ``harness.record.migrate``): the library is what entry points share;
- no import cycle between modules.

Every ``import`` counts, also one inside a function. An edge goes to the module named (for
``from a.b import c``: ``a.b.c`` when that is a module, else ``a.b``), not to its parent packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "methods", "tasks")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that ``path`` imports."""
    found: set[str] = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in modules}
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports(path, modules) - {name} for name, path in modules.items()}


ROOMS = ("harness.analysis", "harness.training", "harness.decode", "harness.protocols", "harness.record")
ENTRY_POINTS = ("harness.run", "harness.bench", "harness.lm_eval_model", "harness.record.migrate")


def room(module: str) -> str:
    if module == "harness.record.schema":
        return "harness.record.schema"
    for name in ROOMS:
        if module == name or module.startswith(name + "."):
            return name
    return "harness (runtime)" if module.startswith("harness") else module.split(".")[0]


OUTSIDE = {"harness.analysis", "harness.training"}
RUNTIME = {"harness (runtime)", "harness.decode", "harness.protocols", "harness.record", "harness.record.schema"}
FORBIDDEN = {
    "tasks": {"methods", *RUNTIME, *OUTSIDE},
    "methods": {"tasks", *RUNTIME, *OUTSIDE},
    "harness (runtime)": OUTSIDE,
    "harness.record.schema": {*RUNTIME - {"harness.record.schema"}, *OUTSIDE, "tasks", "methods"},
    "harness.decode": {"harness.protocols", "harness.record", *OUTSIDE, "tasks"},
    "harness.protocols": {"harness.record", *OUTSIDE},
    "harness.record": {"harness.decode", "harness.protocols", *OUTSIDE},
}


def test_each_room_imports_only_what_it_may(graph):
    wrong = sorted(
        f"{source} imports {target}"
        for source, targets in graph.items()
        for target in targets
        if room(target) in FORBIDDEN.get(room(source), set())
    )
    assert wrong == []


def test_no_module_imports_an_entry_point(graph):
    wrong = sorted(
        f"{source} imports {target}" for source, targets in graph.items() for target in targets & set(ENTRY_POINTS)
    )
    assert wrong == []


def test_no_import_cycle(graph):
    # Tarjan's strongly connected components: a component of more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert cycles == []


def test_the_checks_see_the_imports_they_judge(graph):
    # The checks above are only as good as the graph: it must hold edges of every kind.
    assert "methods.base" in graph["harness.decode.engine"]
    assert "tasks.dialogs.world" in graph["tasks.dialogs.simulate"]
    assert "harness.analysis.stats" in graph["harness.analysis.spec"]
    assert "methods.kvpop.checkpoint" in graph["methods.kvpop.policy"]
