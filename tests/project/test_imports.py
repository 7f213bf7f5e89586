"""The package's import graph has no cycles (each layer imports only what lies below it), counted from the source:
every ``import grtool…`` and ``from grtool… import`` at any depth (lazy imports inside functions included), except
those under ``if TYPE_CHECKING:``, which never run."""

from __future__ import annotations

from imports_helpers import cycles, import_graph


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    """No module imports anything that imports it back, the CLI included (tests/project/test_layers.py checks the same with
    grimp, and the floors with lint-imports)."""
    assert cycles(import_graph()) == []
