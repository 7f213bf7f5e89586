"""Records grtool reads back are decoded through one declaration each (issue #36 §1): an edited index.json, export
sidecar or docid_bytes.json is one line naming the file and the field, exit 1 or 2, never a traceback and never an
answer other than the intact record's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli

HERE = Path(__file__).resolve().parent
BUNDLED = HERE / "data" / "index_triples.jsonl"
DOCID = "Old Harbor Bridge, crosses, Saltmarsh River"


def _one_line_naming(proc, *names: str) -> str:
    err = proc.stderr
    assert proc.returncode in (1, 2), (proc.returncode, proc.stdout[-500:], err[-2000:])
    assert "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if " error: " in line or line.startswith("error:")]
    assert len(errors) == 1, err
    for name in names:
        assert name in errors[0], errors[0]
    return errors[0]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("idx") / "idx"
    run_cli("index", "build", "-", "--tokenizer", "qwen", "--out", out, input=BUNDLED.read_text())
    return out


@pytest.fixture(scope="module")
def intact(index_dir) -> dict:
    return json.loads(run_cli("index", "query", index_dir, DOCID, "--json").stdout)


def _edited(index_dir: Path, tmp_path: Path, edit) -> Path:
    copy = tmp_path / "idx"
    shutil.copytree(index_dir, copy)
    meta = json.loads((copy / "index.json").read_text())
    text = edit(meta)
    (copy / "index.json").write_text(text if isinstance(text, str) else json.dumps(meta))
    return copy


def _swap_markers(m):
    t = m["tokenizer"]
    t["docid_start_id"], t["docid_end_id"] = t["docid_end_id"], t["docid_start_id"]


def test_issue_example_swapped_marker_ids_are_refused(index_dir, intact, tmp_path):
    assert intact["docs"] == ["d-harbor", "d-river"]
    idx = _edited(index_dir, tmp_path, _swap_markers)
    line = _one_line_naming(run_cli("index", "query", idx, DOCID, "--json", check=False), "index.json", "docid_start_id")
    assert "tokenizer.json" in line
    _one_line_naming(run_cli("index", "stats", idx, "--json", check=False), "index.json", "docid_start_id")
    proc = run_cli("validate", idx, check=1)
    assert "docid_start_id" in proc.stderr and "Traceback" not in proc.stderr


def test_issue_example_source_documents_is_refused(index_dir, tmp_path):
    idx = _edited(index_dir, tmp_path, lambda m: m.update(source="documents"))
    _one_line_naming(run_cli("index", "query", idx, DOCID, "--json", check=False), "index.json", "field source")
    proc = run_cli("validate", idx, check=1)
    assert "field source" in proc.stderr and "Traceback" not in proc.stderr


def _set(path: str, value):
    def edit(m):
        *parents, last = path.split(".")
        node = m
        for p in parents:
            node = node[p]
        if value is _DROP:
            del node[last]
        else:
            node[last] = value

    return edit


_DROP = object()
# (edit, the field the refusal names)
INDEX_EDITS = {
    "kind trie over fm files": (_set("kind", "trie"), "kind"),
    "kind numpy over fm files": (_set("kind", "numpy"), "kind"),
    "unknown kind": (_set("kind", "lsm"), "kind"),
    "unknown source": (_set("source", "passages"), "source"),
    "negative sequences": (_set("sizes.sequences", -1), "sizes.sequences"),
    "sequences as text": (_set("sizes.sequences", "9"), "sizes.sequences"),
    "more sequences": (_set("sizes.sequences", 10), "sizes"),
    "fewer tokens": (_set("sizes.tokens", 100), "sizes"),
    "NaN seconds": (lambda m: json.dumps(m).replace('"build_seconds": ' + json.dumps(m["build_seconds"]), '"build_seconds": NaN'), "index.json"),
    "1e999 seconds": (lambda m: json.dumps(m).replace('"build_seconds": ' + json.dumps(m["build_seconds"]), '"build_seconds": 1e999'), "build_seconds"),
    "infinite ratio": (lambda m: json.dumps(m).replace('"bits_per_token": ' + json.dumps(m["sizes"]["bits_per_token"]), '"bits_per_token": -1e999'), "bits_per_token"),
    "no tokenizer": (_set("tokenizer", _DROP), "tokenizer"),
    "start id as float": (_set("tokenizer.docid_start_id", 151851.5), "docid_start_id"),
    "start id equals end id": (lambda m: _set("tokenizer.docid_start_id", m["tokenizer"]["docid_end_id"])(m), "tokenizer"),
    "start id past the vocabulary": (_set("tokenizer.docid_start_id", 10**7), "tokenizer"),
    "start id another token": (_set("tokenizer.docid_start_id", 11), "docid_start_id"),
    "end id another token": (_set("tokenizer.docid_end_id", 11), "docid_end_id"),
    "flips claimed": (_set("params.flips", True), "flips"),
    "fm without n": (_set("params.n", _DROP), "params.n"),
    "fm n off by one": (lambda m: _set("params.n", m["params"]["n"] + 1)(m), "params.n"),
    "dollar row past n": (lambda m: _set("params.dollar_row", m["params"]["n"])(m), "dollar_row"),
    "documents more than doc_ids.txt holds": (_set("sizes.documents", 10**6), "sizes.documents"),
    "format": (_set("format", "grtool-index/9"), "format"),
    "files empty": (_set("files", {}), "files"),
    "file entry bytes negative": (lambda m: m["files"]["doc_ids.txt"].update(bytes=-1), "files"),
    "file name with a slash": (lambda m: m["files"].update({"../x": {"bytes": 1}}), "files"),
    "total bytes": (lambda m: _set("sizes.total_bytes", m["sizes"]["total_bytes"] + 1)(m), "total_bytes"),
    "an array": (lambda m: "[]", "index.json"),
    "deep nesting": (lambda m: "[" * 100_000 + "]" * 100_000, "index.json"),
    "empty file": (lambda m: "", "index.json"),
}


@pytest.mark.parametrize("case", sorted(INDEX_EDITS))
def test_an_edited_index_record_is_one_line_naming_the_field(index_dir, intact, tmp_path, case):
    edit, field = INDEX_EDITS[case]
    idx = _edited(index_dir, tmp_path, edit)
    proc = run_cli("index", "query", idx, DOCID, "--json", check=False)
    if proc.returncode == 0:  # an edit the reader may take: it must then answer as the intact index does
        assert json.loads(proc.stdout)["docs"] == intact["docs"], case
    else:
        _one_line_naming(proc, "index.json", field)
    report = run_cli("validate", idx, "--json", check=False)
    assert report.returncode == 1 and "Traceback" not in report.stderr, report.stderr[-2000:]
    problems = [p for s in json.loads(report.stdout)["stages"] for p in s["problems"]]
    assert any("index.json" in p and field in p for p in problems), problems


def test_the_intact_index_validates(index_dir):
    run_cli("validate", index_dir)


def test_a_fifo_index_record_does_not_hang(index_dir, tmp_path):
    import os

    idx = tmp_path / "idx"
    shutil.copytree(index_dir, idx)
    (idx / "index.json").unlink()
    os.mkfifo(idx / "index.json")
    _one_line_naming(run_cli("index", "stats", idx, "--json", check=False), "index.json", "FIFO")


# ------------------------------------------------------------------------------------------- exports


@pytest.fixture
def export_file(tmp_path) -> Path:
    """A GMR export written by grtool's own writer (rows and sidecar)."""
    from grtool.export.provenance import write_sidecar

    out = tmp_path / "gmr.jsonl"
    rows = [{"kind": "memorization", "doc_id": f"d{i}", "input": f"title {i}", "target": f"text {i}"} for i in range(3)]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_sidecar(out, kind="gmr", fmt="gmr", rows=3, json_array=False, inputs=[], command=["grtool", "export", "gmr"])
    return out


def _edit_sidecar(path: Path, edit) -> None:
    side = path.with_name(path.name + ".grtool.json")
    meta = json.loads(side.read_text())
    text = edit(meta)
    side.write_text(text if isinstance(text, str) else json.dumps(meta))


SIDECAR_EDITS = {
    "negative rows": (_set("rows", -3), "rows"),
    "rows as text": (_set("rows", "3"), "rows"),
    "rows 1e999": (lambda m: json.dumps(m).replace('"rows": 3', '"rows": 1e999'), "rows"),
    "unknown kind": (_set("kind", "dpo"), "kind"),
    "format of another kind": (_set("trainer_format", "trl"), "trainer_format"),
    "no sha256": (_set("sha256", _DROP), "sha256"),
    "sha256 not hex": (_set("sha256", "x" * 64), "sha256"),
    "json_array as text": (_set("json_array", "no"), "json_array"),
    "file with a slash": (_set("file", "../gmr.jsonl"), "file"),
    "questions count": (_set("questions", {"count": 2, "sha256": "0" * 64, "qids": ["q1"]}), "questions"),
    "an array": (lambda m: "[1]", "grtool.json"),
    "deep nesting": (lambda m: '{"a":' * 50_000 + "1" + "}" * 50_000, "grtool.json"),
}


def test_the_intact_export_validates(export_file):
    run_cli("validate", export_file.parent)


@pytest.mark.parametrize("case", sorted(SIDECAR_EDITS))
def test_an_edited_export_record_is_named_by_validate(export_file, case):
    edit, field = SIDECAR_EDITS[case]
    _edit_sidecar(export_file, edit)
    report = run_cli("validate", export_file.parent, "--json", check=1)
    assert "Traceback" not in report.stderr
    problems = [p for s in json.loads(report.stdout)["stages"] for p in s["problems"]]
    assert any("gmr.jsonl.grtool.json" in p and field in p for p in problems), problems


def test_an_edited_export_record_is_refused_by_its_readers(export_file):
    """Readers other than validate decode the same declaration (a DamagedRecord, not a silent default)."""
    from grtool.export.provenance import read_sidecar, sidecar_path
    from grtool.records import DamagedRecord

    _edit_sidecar(export_file, _set("rows", -1))
    with pytest.raises(DamagedRecord, match=r"grtool\.json: export record: field rows"):
        read_sidecar(sidecar_path(export_file))
    proc = run_cli("show", export_file, check=False)
    _one_line_naming(proc, "grtool.json", "rows")

