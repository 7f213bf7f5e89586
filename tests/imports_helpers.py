"""Reading grtool's import graph from its source (tests/project/test_imports.py, tests/project/test_layers.py, tests/cli/test_declared_commands.py),
and an environment in which a command cannot import torch (tests that prove a command decides without it)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from paths_helpers import REPO


PACKAGE = REPO / "grtool"


def _runtime_imports(tree: ast.AST) -> list[str]:
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("grtool"):
            submodules = [alias.name for alias in node.names if _is_submodule(node.module, alias.name)]
            names.extend(f"{node.module}.{name}" for name in submodules)
            if len(submodules) < len(node.names):  # a name defined by the module itself, not one of its submodules
                names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names if alias.name.startswith("grtool"))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def _is_submodule(package: str, name: str) -> bool:
    """``from package import name`` loads a submodule (a .py file, a folder or a compiled extension)."""
    folder = PACKAGE.parent.joinpath(*package.split("."))
    return (folder / f"{name}.py").is_file() or (folder / name).is_dir() or any(folder.glob(f"{name}.*.so"))


def import_graph() -> dict[str, set[str]]:
    modules = {}
    for f in PACKAGE.rglob("*.py"):
        name = ".".join(f.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = f
    return {m: {t for t in _runtime_imports(ast.parse(f.read_text())) if t in modules and t != m} for m, f in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def without_torch(folder: Path) -> dict[str, str]:
    """Environment variables for a child process in which ``import torch`` exits 99: a stand-in ``torch`` package in
    ``folder`` first on the path. A command that still exits with its own code never imported torch."""
    stand_in = folder / "torch"
    stand_in.mkdir(parents=True, exist_ok=True)
    (stand_in / "__init__.py").write_text("raise SystemExit(99)\n")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}
