"""Issue 36 §6: JSON that grtool writes is strict JSON: a non-finite number (a ratio over nothing) is null, never the
`NaN`/`Infinity` that Python's json module writes and that other JSON readers (jq, JavaScript) refuse.

grtool writes JSON through orjson (records, --json summaries, JSON Lines) and msgspec, which both write null for a
non-finite float; the standard library's json.dump/dumps (NaN by default) is not used anywhere in grtool.
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import numpy as np

import grtool
from grtool.index.build import dump_json
from grtool.store.records import dumps

PACKAGE = Path(grtool.__file__).parent


def strict_loads(text: str | bytes):
    def refuse(name: str):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_no_module_writes_json_with_the_standard_library():
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("dump", "dumps") and isinstance(node.value, ast.Name) and node.value.id == "json":
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module == "json" and any(a.name in ("dump", "dumps") for a in node.names):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not found, f"stdlib json writers (NaN/Infinity): {found}"


def test_records_and_summaries_write_null_for_non_finite_numbers():
    values = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "np": np.float64("nan"), "arr": np.array([np.inf, 1.0])}
    for text in (dumps(values), dump_json(values)):
        assert strict_loads(text) == {"nan": None, "inf": None, "-inf": None, "np": None, "arr": [None, 1.0]}
