"""No import cycle in src/dueq, counting every import: module level, ``if TYPE_CHECKING:`` and in
functions.

import-linter's layers contracts (pyproject.toml) read the same graph, but they only see the edges
that go the wrong way between *named layers*, and a free ``:`` group lets its members import each
other both ways. A circle of type-only imports costs nothing at run time, but it is still a circle
in the design: each module of it can only be read, tested and changed knowing all the others. So
this test builds the module graph itself with an ``ast`` scan of the source (no import of dueq, so
an import that would fail at run time is still seen) and asserts that its strongly connected
components (Tarjan) are single modules.

Edges: ``import dueq.a.b`` gives dueq.a.b; ``from dueq.a import b`` gives dueq.a.b when that is a
module, else dueq.a (b is a name in it); relative imports are resolved against the importing
module's package. The implicit edge from a module to its parent package (Python runs
dueq/a/__init__.py before dueq/a/b.py) is not counted: a package's ``__init__`` re-exporting its
children is the normal shape, not a cycle. An import of a package by its own ``__init__``'s child is
counted (dueq/a/b.py doing ``from dueq.a import x`` is an edge b -> a, and with a's re-export of b
that is a cycle).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from paths_support import SRC

ROOT = "dueq"


def modules(src: Path = SRC) -> dict[str, Path]:
    """Every module of the dueq package, by dotted name (a package is its ``__init__``)."""
    found: dict[str, Path] = {}
    for path in sorted((src / ROOT).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(
    tree: ast.AST, name: str, is_package: bool, known: dict[str, Path]
) -> Iterator[tuple[str, int]]:
    """(module, line) for every import in ``tree``, wherever it sits, resolved to a dueq module."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == ROOT or alias.name.startswith(ROOT + "."):
                    yield _nearest(alias.name, known), node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                if node.level > 1:
                    base_parts = base_parts[: -(node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if not (base == ROOT or base.startswith(ROOT + ".")):
                continue
            for alias in node.names:
                child = f"{base}.{alias.name}"
                yield (child if child in known else _nearest(base, known)), node.lineno


def _nearest(dotted: str, known: dict[str, Path]) -> str:
    """The module itself, or its nearest enclosing package that exists (``import dueq.x.y`` of a
    name that is no module)."""
    while dotted not in known and "." in dotted:
        dotted = dotted.rpartition(".")[0]
    return dotted


def import_graph(src: Path = SRC) -> dict[str, dict[str, int]]:
    """module -> {imported module: first line}: every import counted, the implicit child -> parent
    package edge not."""
    known = modules(src)
    graph: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: dict[str, int] = {}
        for target, line in _imported(tree, name, path.name == "__init__.py", known):
            edges.setdefault(target, line)  # a self-import too: kept, so the test can name it
        graph[name] = edges
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    found.append(sorted(component))
    return found


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The components of more than one module, largest first."""
    return sorted((c for c in strongly_connected(graph) if len(c) > 1), key=lambda c: (-len(c), c))


def _describe(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    members = set(component)
    lines = [f"{len(component)} modules: {', '.join(component)}"]
    for name in component:
        for target, line in sorted(graph[name].items()):
            if target in members and target != name:
                lines.append(f"    {name} -> {target} (line {line})")
    return "\n".join(lines)


def test_no_module_imports_itself() -> None:
    graph = import_graph()
    assert [name for name, edges in graph.items() if name in edges] == []


def test_no_import_cycle_counting_type_checking_and_function_imports() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles (every import counted):\n" + "\n".join(
        _describe(c, graph) for c in found
    )


def test_the_scan_sees_each_kind_of_import(tmp_path: Path) -> None:
    # The scanner on a made-up package: a module-level, a TYPE_CHECKING and a function-level import,
    # relative and absolute, a name from a module and a module from a package, and the parent edge
    # left out.
    pkg = tmp_path / ROOT
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from dueq.a import thing\n")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from dueq.sub import b\n"
        "thing = 1\n"
    )
    (pkg / "sub" / "__init__.py").write_text("from .b import value\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import c\nvalue = 2\n")
    (pkg / "c.py").write_text("import dueq.a\n")
    graph = import_graph(tmp_path)
    assert graph == {
        "dueq": {"dueq.a": 1},
        "dueq.a": {"dueq.sub.b": 3},
        "dueq.sub": {"dueq.sub.b": 1},
        "dueq.sub.b": {"dueq.c": 2},
        "dueq.c": {"dueq.a": 1},
    }
    assert cycles(graph) == [["dueq.a", "dueq.c", "dueq.sub.b"]]
