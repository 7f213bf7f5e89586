"""The floors hold, and a tool says so: `lint-imports` checks the contracts in ``.importlinter``; grimp's import
graph (lazy imports inside functions and ``TYPE_CHECKING`` imports included) has no circle between modules and
none between packages; the floor diagrams in README.md and docs/development.md are the contract's layers."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from conftest import REPO
from imports_helpers import cycles

CONTRACTS = REPO / ".importlinter"
DIAGRAMS = [REPO / "README.md", REPO / "docs" / "development.md"]


def lint_imports(*args: str) -> subprocess.CompletedProcess:
    """`lint-imports` of the interpreter's environment, on this checkout's grtool, writing no cache."""
    command = Path(sys.executable).with_name("lint-imports")
    if not command.is_file():
        pytest.skip("import-linter is not installed (the test extra)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([str(command), "--no-cache", "--no-logo", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_lint_imports_keeps_every_contract():
    proc = lint_imports()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout and "BROKEN" not in proc.stdout


def test_lint_imports_fails_on_a_broken_contract(tmp_path):
    """The same check with store/ put above cli/ (which imports it) must fail: the tool does check."""
    broken = tmp_path / "broken.ini"
    broken.write_text("[importlinter]\nroot_package = grtool\n\n[importlinter:contract:upside-down]\nname = store above cli\ntype = layers\ncontainers =\n    grtool\nlayers =\n    store\n    cli\n")
    proc = lint_imports(str(broken))
    assert proc.returncode != 0
    assert "BROKEN" in proc.stdout and "grtool.cli" in proc.stdout


def module_graph() -> dict[str, set[str]]:
    """Every grtool module and the grtool modules it imports, as grimp reads them. An import of a compiled
    extension (``from grtool.index import _fm``) is one of the extension, which grimp cannot see, not of the
    package that holds it."""
    graph = grimp.build_graph("grtool", cache_dir=None)
    edges: dict[str, set[str]] = {m: set() for m in graph.modules}
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            details = graph.get_import_details(importer=importer, imported=imported)
            if details and all(_imports_an_extension(imported, d["line_contents"]) for d in details):
                continue
            edges[importer].add(imported)
    return edges


def _imports_an_extension(package: str, line: str) -> bool:
    """``from package import name`` where ``name`` is a compiled extension (``name.*.so``) in the package's folder."""
    words = line.replace(",", " ").split()
    if words[:2] != ["from", package] or "import" not in words[2:]:
        return False
    name = words[words.index("import") + 1]
    return any(REPO.joinpath(*package.split(".")).glob(f"{name}.*.so"))


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_circle_between_modules():
    assert cycles(module_graph()) == []


def test_no_circle_between_packages():
    packages: dict[str, set[str]] = {}
    for importer, imported in module_graph().items():
        packages.setdefault(package_of(importer), set()).update(package_of(m) for m in imported if package_of(m) != package_of(importer))
    for targets in list(packages.values()):
        for t in targets:
            packages.setdefault(t, set())
    assert cycles(packages) == []


def contract_floors() -> list[set[str]]:
    config = configparser.ConfigParser()
    config.read(CONTRACTS)
    layers = config["importlinter:contract:floors"]["layers"].split("\n")
    return [{name.strip() for name in line.split("|")} for line in layers if line.strip()]


def diagram_floors(path: Path) -> list[set[str]]:
    """The floors of the first code block under a document's "## Architecture" heading: each line's leading
    ``name/`` (a package) and ``name.py`` (a module) words, up to the description."""
    text = path.read_text()
    assert "\n## Architecture\n" in text, f"{path.name}: no '## Architecture' section"
    section = text.split("\n## Architecture\n", 1)[1]
    block = section.split("```", 2)[1].split("\n", 1)[1]
    floors = []
    for line in block.splitlines():
        names = []
        for word in line.split():
            if not (word.endswith("/") or word.endswith(".py")):
                break
            names.append(word.removesuffix("/").removesuffix(".py"))
        if names:
            floors.append(set(names))
    return floors


@pytest.mark.parametrize("path", DIAGRAMS, ids=lambda p: p.name)
def test_floor_diagram_is_the_contract(path):
    assert diagram_floors(path) == contract_floors()


def test_every_package_and_module_has_a_floor():
    """A new subpackage or top-level module must be given a floor (``exhaustive`` makes lint-imports say so too)."""
    on_floors = set().union(*contract_floors())
    present = {p.name for p in (REPO / "grtool").iterdir() if (p / "__init__.py").is_file()}
    present |= {p.stem for p in (REPO / "grtool").glob("*.py") if p.stem not in ("__init__", "__main__")}
    assert present == on_floors
