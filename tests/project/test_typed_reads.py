"""A record decoded through its declaration is handed on as the typed value (issue #45): no module under grtool/
decodes the same bytes again as plain JSON after ``decode_record`` (or ``read_record``, a ``decode_*`` reader,
``msgspec.json.decode(..., type=...)``) checked them. The check reads the source, function by function: a plain
decode (``orjson.loads``, ``json.loads``, ``msgspec.json.decode`` without a type) of an expression naming what a
typed decode in the same function was given is the pattern the issue removed, and so is ``to_builtins`` around a
typed read."""

from __future__ import annotations

import ast
import textwrap

import msgspec
from paths_helpers import REPO

GRTOOL = REPO / "grtool"
TYPED_READERS = ("decode_record", "read_record")


def _called(call: ast.Call) -> str:
    """``orjson.loads``, ``msgspec.json.decode``, ``decode_record``: the dotted name a call is made by."""
    parts = []
    node = call.func
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _typed(call: ast.Call) -> bool:
    name = _called(call)
    last = name.rsplit(".", 1)[-1]
    if name == "msgspec.json.decode":
        return any(k.arg == "type" for k in call.keywords)
    return last in TYPED_READERS or last.startswith("decode_")


def _plain(call: ast.Call) -> bool:
    name = _called(call)
    return name in ("orjson.loads", "json.loads") or (name == "msgspec.json.decode" and not any(k.arg == "type" for k in call.keywords))


def _names(node: ast.AST) -> set[str]:
    """The variables an expression reads (not the functions it calls: ``Path`` in two reads is not one value)."""
    nodes = list(ast.walk(node))
    called = {n.func.id for n in nodes if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return {n.id for n in nodes if isinstance(n, ast.Name)} - called


def decoded_twice(source: str) -> list[str]:
    """``function: plain decode`` for each plain decode of what a typed decode in the same function was given."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call)]
        given = set().union(*(_names(c.args[0]) for c in calls if _typed(c) and c.args))
        for call in calls:
            if _plain(call) and call.args and _names(call.args[0]) & given:
                found.append(f"{fn.name}: {ast.unparse(call)}")
            elif _called(call).endswith("to_builtins") and call.args and isinstance(call.args[0], ast.Call) and _typed(call.args[0]):
                found.append(f"{fn.name}: {ast.unparse(call)}")  # decoded, then turned back into JSON values at once
    return found


def test_no_module_decodes_a_typed_record_again_as_plain_json():
    found = {str(f.relative_to(GRTOOL.parent)): hits for f in sorted(GRTOOL.rglob("*.py")) if (hits := decoded_twice(f.read_text()))}
    assert not found, found


def test_the_check_finds_the_pattern_it_forbids():
    """What load_manifest did before the issue, and a wrapper decoding the file again after its typed reader."""
    before = textwrap.dedent("""
        def load_manifest(path):
            data = read_record_bytes(path / MANIFEST, what="manifest")
            decode_record(data, Manifest, source=path, what="manifest")
            return msgspec.json.decode(data)

        def read_sidecar(path):
            decode_sidecar(path)
            return orjson.loads(Path(path).read_bytes())

        def read_report(data):
            msgspec.json.decode(data, type=RecallReport)
            return orjson.loads(data)

        def _read_holder(path):
            return to_builtins(read_record(path, LockHolder, what="lock holder"))
    """)
    assert [hit.split(":")[0] for hit in decoded_twice(before)] == ["load_manifest", "read_sidecar", "read_report", "_read_holder"]
    after = textwrap.dedent("""
        def load_manifest(path):
            return decode_record(read_record_bytes(path / MANIFEST, what="manifest"), Manifest, source=path, what="manifest")

        def load_plan(root, identity):
            plan = read_record(root / PLAN, SpillPlan, what="spill plan")
            return plan if plan.identity == orjson.loads(dumps(identity)) else None
    """)
    assert decoded_twice(after) == []


def test_a_key_the_declaration_lacks_is_named_at_any_depth():
    """What the index writer checks before it installs index.json: nothing it writes is dropped by the typed read."""
    from grtool.records import undeclared_keys

    written = {"sizes": {"tokens": 3, "docids_skipped": 1}, "params": {"flips": True}, "files": [{"a": 1}]}
    decoded = {"sizes": {"tokens": 3}, "params": {"flips": True}, "files": [{}]}
    assert undeclared_keys(written, decoded) == ["sizes.docids_skipped"]
    assert undeclared_keys(decoded, decoded) == []


class Inner(msgspec.Struct, omit_defaults=True):
    size: int | None = None


class Outer(msgspec.Struct, omit_defaults=True):
    name: str
    inner: Inner
    by_part: dict[str, Inner] = {}


def test_the_writer_check_reads_the_declaration_not_the_encoding():
    """A field written at its default is declared even where its Struct omits defaults when it encodes, and a key
    under a nested Struct that its declaration lacks is named: the check walks the declarations."""
    from grtool.records import undeclared_keys

    written = {"name": "a", "inner": {"size": None}, "by_part": {"p": {"size": 1, "extra": 2}}}
    decoded = msgspec.convert(written, Outer)
    assert msgspec.to_builtins(decoded)["inner"] == {}  # what the old to_builtins comparison would have flagged
    assert undeclared_keys(written, decoded) == ["by_part.p.extra"]


def test_a_key_given_twice_is_damage_at_any_depth():
    """JSON readers keep the last of two values for one key without a word; a record grtool wrote never repeats
    one, so a repeated key is an edit whose meaning is unknown (before: read last-wins, exit 0)."""
    import pytest

    from grtool.records import DamagedRecord, decode_record

    assert decode_record(b'{"name": "a", "inner": {"size": 1}}', Outer, source="r.json", what="record").inner.size == 1
    for text, key in ((b'{"name": "a", "name": "b", "inner": {}}', "name"), (b'{"name": "a", "inner": {"size": 1, "size": 2}}', "size"),
                      (b'{"name": "a", "inner": {}, "by_part": {"x": {}, "x": {"size": 3}}}', "x")):  # fmt: skip
        with pytest.raises(DamagedRecord, match=f"r.json: record: field {key} is given twice in one object"):
            decode_record(text, Outer, source="r.json", what="record")
    # Keys repeated in separate objects, and a number Python's own reader refuses, are no repeat.
    assert decode_record(b'{"name": "a", "inner": {"size": 1}, "by_part": {"x": {"size": 2}}}', Outer, source="r", what="r").by_part["x"].size == 2
    assert decode_record(b'{"name": "a", "inner": {}, "skipped": ' + b"9" * 5000 + b"}", Outer, source="r", what="r").name == "a"
