"""The test tree mirrors the package (docs/development.md): every test module sits in tests/<folder>/, the folder
named after a subpackage of grtool/ (or project/: top-level modules and repository-wide rules; bench/: the bench/
scripts); basenames are unique (the folders are not packages); no test module imports another test module or
reaches tests/ as a package, and none builds a path from its own location (tests/paths_helpers.py does)."""

from __future__ import annotations

import ast
import re

from paths_helpers import BENCH, REPO, TESTS

SUBPACKAGES = {p.parent.name for p in (REPO / "grtool").glob("*/__init__.py")}
FOLDERS = SUBPACKAGES | {"project", BENCH.name}
MODULES = sorted(TESTS.rglob("test_*.py"))
OWN_LOCATION = re.compile(r"Path\(__file__\)|__file__\)\.resolve\(\)|parents\[")


def test_every_test_module_sits_in_a_folder_named_after_a_subpackage():
    assert MODULES and BENCH.is_dir()
    misplaced = [p.relative_to(TESTS).as_posix() for p in MODULES if p.parent.parent != TESTS or p.parent.name not in FOLDERS]
    assert misplaced == [], f"tests/<folder>/test_<subject>.py with <folder> one of {sorted(FOLDERS)}"


def test_test_module_names_are_unique():
    seen: dict[str, str] = {}
    clashes = [f"{seen[p.name]} and {p.relative_to(TESTS)}" for p in MODULES if seen.setdefault(p.name, str(p.relative_to(TESTS))) != str(p.relative_to(TESTS))]
    assert clashes == []


def test_no_test_module_imports_another_or_finds_files_from_its_own_location():
    found = []
    for path in MODULES:
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.relative_to(TESTS)} imports {n}" for n in names if n.split(".")[0] == "tests" or n.split(".")[-1].startswith("test_")]
        found += [f"{path.relative_to(TESTS)}: {m.group(0)}" for m in OWN_LOCATION.finditer(text)]
    assert found == [], "share through tests/conftest.py or tests/*_helpers.py; paths come from tests/paths_helpers.py"
