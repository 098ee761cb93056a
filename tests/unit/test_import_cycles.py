"""No import cycle among the modules of bklib and jobs.

Two modules that import each other work only in one import order, and only while neither
uses the other's names at import time; a deferred import inside a function hides the cycle
rather than removing it. So every import counts here: module level, inside functions, and
under ``TYPE_CHECKING`` (mypy follows those too). Shared code moves to the module it belongs
to, as the ZooKeeper store's connect-string parser did (``bklib.meta.stores.zookeeper``).

The graph's edges: ``import a.b.c`` and ``from a.b import c`` (``c`` a submodule) depend on
``a.b.c``; ``from a.b import name`` on ``a.b``. Importing ``a.b.c`` also runs the
``__init__`` of ``a`` and ``a.b``, so those are edges too, except for the importer's own
packages: they have already begun to run before the importer can.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OURS = ("bklib", "jobs")

Graph = dict[str, set[str]]


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module under ``root/<package>``, by dotted name (a package is its ``__init__``)."""
    out: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _parents(module: str) -> Iterator[str]:
    """``a.b.c`` -> ``a``, ``a.b``."""
    parts = module.split(".")
    for i in range(1, len(parts)):
        yield ".".join(parts[:i])


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """``name`` itself when it is one of ours, else its longest prefix that is."""
    for candidate in [name, *reversed(list(_parents(name)))]:
        if candidate in modules:
            return candidate
    return None


def _imported(
    node: ast.Import | ast.ImportFrom, package: str, modules: dict[str, Path]
) -> set[str]:
    """The modules one import statement names, inside a module of ``package``."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = node.module or ""
    if node.level:
        anchor = package.split(".")
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, *([base] if base else [])])
    named = {f"{base}.{alias.name}" for alias in node.names}
    submodules = {n for n in named if n in modules}
    # A name that is not a submodule of ours is an attribute of ``base``.
    return submodules | ({base} if len(submodules) < len(named) else set())


def import_graph(root: Path = REPO, packages: Iterable[str] = OURS) -> Graph:
    """Each module of ``packages`` and the modules of ours it imports, anywhere in it."""
    modules = module_files(root, packages)
    graph: Graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        own = {name, *_parents(name)}
        edges: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _imported(node, package, modules):
                known = _known(target, modules)
                if known is None:
                    continue
                edges.add(known)
                edges.update(p for p in _parents(known) if p not in own and p in modules)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module
    (Tarjan's algorithm, iterative), as ``[a, b, ..., a]``, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component: set[str] = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(component)
    return sorted(_cycle_in(graph, c) for c in components)


def _cycle_in(graph: Graph, component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth first)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_every_kind_of_import_is_an_edge(tmp_path: Path) -> None:
    """The scan sees what it must (else the test of the tree would pass vacuously)."""
    _write(
        tmp_path,
        {
            "bklib/__init__.py": "",
            "bklib/a/__init__.py": "from bklib.a.x import X\n",
            "bklib/a/x.py": "from . import y\nfrom .z import Z\nimport os\n",
            "bklib/a/y.py": "def f():\n    from bklib.b import w\n",
            "bklib/a/z.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    import bklib.b.v\nZ = 1\n",
            "bklib/b/__init__.py": "",
            "bklib/b/w.py": "from bklib.a import X\n",
            "bklib/b/v.py": "from ..a.x import X\n",
        },
    )
    graph = import_graph(tmp_path, ["bklib"])
    assert graph["bklib.a"] == {"bklib.a.x"}
    # The importer's own packages are not edges: they have already begun to run.
    assert graph["bklib.a.x"] == {"bklib.a.y", "bklib.a.z"}
    assert graph["bklib.a.y"] == {"bklib.b.w", "bklib.b"}
    assert graph["bklib.a.z"] == {"bklib.b.v", "bklib.b"}
    assert graph["bklib.b.w"] == {"bklib.a"}
    assert graph["bklib.b.v"] == {"bklib.a.x", "bklib.a"}
    assert cycles(graph) == [["bklib.a", "bklib.a.x", "bklib.a.y", "bklib.b.w", "bklib.a"]]


def test_a_package_init_that_imports_its_importer_is_a_cycle(tmp_path: Path) -> None:
    """``p/__init__`` runs before ``p.m``: a module that imports ``p.m`` while ``p``'s
    ``__init__`` imports it back is a cycle even though it never names ``p``."""
    _write(
        tmp_path,
        {
            "jobs/__init__.py": "",
            "jobs/p/__init__.py": "from jobs.q import helper\n",
            "jobs/p/m.py": "",
            "jobs/q.py": "from jobs.p.m import thing\n",
        },
    )
    assert cycles(import_graph(tmp_path, ["jobs"])) == [["jobs.p", "jobs.q", "jobs.p"]]


def test_no_import_cycle_in_bklib_and_jobs() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)
