"""The pipeline package knows stages only through its registry interface: it imports nothing of the CLI."""

from __future__ import annotations

import ast
import subprocess
import sys

from conftest import REPO

PIPELINE = REPO / "grtool" / "pipeline"


def test_pipeline_modules_load_without_the_cli():
    modules = sorted(f"grtool.pipeline.{p.stem}" for p in PIPELINE.glob("*.py") if p.stem != "__init__")
    code = f"import sys, importlib\nfor m in {modules!r}: importlib.import_module(m)\nprint(sorted(m for m in sys.modules if m == 'grtool.cli' or m.startswith('grtool.cli.')))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout
    assert "grtool.pipeline.slurm" in modules and "grtool.pipeline.executors" in modules


def test_no_pipeline_module_names_the_cli():
    """Not even lazily (an import inside a function, importlib with the module's name)."""
    for path in PIPELINE.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("grtool.cli"), f"{path.name}:{node.lineno}"
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("grtool.cli") for a in node.names), f"{path.name}:{node.lineno}"
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not node.value.startswith("grtool.cli"), f"{path.name}:{node.lineno}: {node.value!r}"
