"""Edited records of a stage or an index: one line naming the file, never a traceback and never a silent pass."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import EXAMPLES, run_cli
from index_helpers import BUNDLED


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A run directory with documents/ and questions/ ingested from the bundled MuSiQue example."""
    root = tmp_path_factory.mktemp("edited") / "corpus"
    run_cli("corpus", "ingest", EXAMPLES / "musique" / "musique_ans_v1.0_dev.example.jsonl", "--out", root)
    return root


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("adv-index") / "idx"
    run_cli("index", "build", "-", "--tokenizer", "llama3", "--kind", "numpy", "--out", out, input=BUNDLED.read_text())
    return out


EDITS = {
    "list": lambda m: [m], "string": lambda m: "index", "not-utf8": lambda m: b"\xff\xfe{",
    "files-a-list": lambda m: m.update(files=[1, 2], sizes=3, inputs=[5]),
    "bad-entries": lambda m: m["files"].update({"x": 5, "../../index.json": {"bytes": 1}}),
    "inputs-a-string": lambda m: m.update(inputs="abc"),
}  # fmt: skip


def _edited_index(index_dir: Path, target: Path, edit) -> Path:
    import json

    shutil.copytree(index_dir, target)
    meta = json.loads((target / "index.json").read_text())
    new = edit(meta)
    (target / "index.json").write_bytes(new if isinstance(new, bytes) else json.dumps(meta if new is None else new).encode())
    return target


def test_an_edited_index_json_is_one_line_never_a_traceback(index_dir, tmp_path):
    """index.json that is JSON but not an object, not UTF-8, or with entries of the wrong type: `index query` and
    `validate` crashed with AttributeError tracebacks; `index build --overwrite` (own_entries) too for files=[...]."""
    for name, edit in EDITS.items():
        idx = _edited_index(index_dir, tmp_path / "all" / name, edit)
        q = run_cli("index", "query", idx, "--ids", "1", check=False)
        assert q.returncode in (1, 2) and "Traceback" not in q.stderr, (name, q.stderr)  # 1: a damaged record
        v = run_cli("validate", idx, check=1)
        assert "Traceback" not in v.stderr and "FAIL" in v.stdout + v.stderr, (name, v.stderr)
    idx = tmp_path / "all" / "files-a-list"
    run_cli("index", "build", "-", "--tokenizer", "llama3", "--kind", "numpy", "--out", idx, "--overwrite", input=BUNDLED.read_text())
    run_cli("validate", idx)


RECORD_EDITS = {
    "manifest-list": ("documents/_manifest.json", b"[]"),
    "manifest-bad-table": ("documents/_manifest.json", lambda m: m.update(table=["x"])),
    "manifest-not-json": ("documents/_manifest.json", b"{bad"),
    "shard-record-list": ("documents/_shards/part-00000.json", b"[1]"),
    "shard-record-types": ("documents/_shards/part-00000.json", lambda r: r.update(rows="x", bytes=None)),
}  # fmt: skip


@pytest.mark.parametrize("name", RECORD_EDITS)
def test_an_edited_stage_record_is_one_line_and_never_a_silent_pass(corpus, tmp_path, name):
    """A manifest or shard record that is JSON of the wrong shape crashed `corpus stats`, `corpus merge` and
    `validate` with AttributeError/TypeError tracebacks (a shard record with a string `rows` was even read by
    stats), and `validate RUN/questions` passed with its gold check silently skipped when the sibling
    documents' manifest could not be read."""
    import json

    c = tmp_path / "c"
    shutil.copytree(corpus, c)
    rel, edit = RECORD_EDITS[name]
    f = c / rel
    if callable(edit):
        data = json.loads(f.read_text())
        edit(data)
        edit = json.dumps(data).encode()
    f.write_bytes(edit)
    for args in (("corpus", "stats", c), ("corpus", "merge", c, "--out", tmp_path / "m")):
        proc = run_cli(*args, check=1)  # a damaged record (DESIGN §8)
        assert "Traceback" not in proc.stderr and str(f) in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in run_cli("validate", c, check=1).stderr
    alone = run_cli("validate", c / "questions", check=1 if "manifest" in name else False)
    assert "Traceback" not in alone.stderr
    if "manifest" in name:
        assert "gold doc ids not checked" in alone.stdout + alone.stderr
