"""Records grtool reads back are decoded through one declaration each (issue #36 §1): an edited index.json, export
sidecar or docid_bytes.json is one line naming the file and the field, exit 1 or 2, never a traceback and never an
answer other than the intact record's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import EXAMPLES, run_cli
from index_helpers import BUNDLED
from strict_cli_helpers import DEEP, grtool, one_line

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
    "dollar row past n": (lambda m: _set("params.dollar_row", m["params"]["n"] + 1)(m), "dollar_row"),
    "dollar row 0, the empty suffix's": (_set("params.dollar_row", 0), "dollar_row"),
    "dollar row another row": (lambda m: _set("params.dollar_row", m["params"]["dollar_row"] % m["params"]["n"] + 1)(m), "dollar_row"),
    "documents more than doc_ids.txt holds": (_set("sizes.documents", 10**6), "sizes.documents"),
    "format": (_set("format", "grtool-index/9"), "format"),
    "files empty": (_set("files", {}), "files"),
    "file entry bytes negative": (lambda m: m["files"]["doc_ids.txt"].update(bytes=-1), "files"),
    "file name with a slash": (lambda m: m["files"].update({"../x": {"bytes": 1}}), "files"),
    "file named the parent": (lambda m: m["files"].update({"..": {"bytes": 4096}}), "files"),
    "total bytes": (lambda m: _set("sizes.total_bytes", m["sizes"]["total_bytes"] + 1)(m), "total_bytes"),
    "shorter longest sequence": (lambda m: _set("sizes.max_sequence_tokens", m["sizes"]["max_sequence_tokens"] - 1)(m), "max_sequence_tokens"),
    "tokens moved between sizes and n": (lambda m: (_set("sizes.tokens", m["sizes"]["tokens"] - 1)(m), _set("params.n", m["params"]["n"] - 1)(m)), "tokens"),
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
    _one_line_naming(run_cli("index", "stats", idx, "--json", check=False, process=True), "index.json", "FIFO")  # a hang guard of its own


# ------------------------------------------------------------------------------------------- exports


@pytest.fixture
def export_file(tmp_path) -> Path:
    """A GMR export written by grtool's own writer (rows and sidecar)."""
    from grtool.vocab.provenance import write_sidecar

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
    "json_array true on JSON Lines": (_set("json_array", True), "json_array"),
    "file with a slash": (_set("file", "../gmr.jsonl"), "file"),
    "questions count": (_set("questions", {"count": 2, "sha256": "0" * 64, "qids": ["q1"]}), "questions"),
    "created not a time": (_set("created", "yesterday"), "created"),
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
    from grtool.vocab.provenance import decode_sidecar, sidecar_path
    from grtool.records import DamagedRecord

    _edit_sidecar(export_file, _set("rows", -1))
    with pytest.raises(DamagedRecord, match=r"grtool\.json: export record: field rows"):
        decode_sidecar(sidecar_path(export_file))
    proc = run_cli("show", export_file, check=False)
    _one_line_naming(proc, "grtool.json", "rows")


# ------------------------------------------------------------------------------ bracket decoding files


DOCID_BYTES_EDITS = {
    "negative docids": (_set("docids", -1), "docids"),
    "docids off by one": (lambda m: _set("docids", m["docids"] + 1)(m), "docids"),
    "open as a number": (_set("open", 1), "open"),
    "same brackets": (_set("close", "["), "close"),
    "unknown format": (_set("format", "x"), "format"),
    "a file size negative": (lambda m: m["files"]["docid_bytes.bin"].update(bytes=-5), "files"),
    "an extra file": (lambda m: m["files"].update({"other.bin": m["files"]["docid_bytes.bin"]}), "files"),
}


@pytest.mark.parametrize("case", sorted(DOCID_BYTES_EDITS))
def test_an_edited_docid_bytes_record_is_listed_by_validate_and_never_answers(index_dir, tmp_path, case):
    from grtool.index.docid_bytes import RECORD, load_docid_bytes, open_docid_bytes
    from grtool.errors import GrtoolError

    idx = tmp_path / "idx"
    shutil.copytree(index_dir, idx)
    texts = list(open_docid_bytes(idx))
    edit, field = DOCID_BYTES_EDITS[case]
    meta = json.loads((idx / RECORD).read_text())
    edit(meta)
    (idx / RECORD).write_text(json.dumps(meta))
    with pytest.raises(GrtoolError, match=rf"docid_bytes\.json.*{field}"):
        load_docid_bytes(idx)
    report = run_cli("validate", idx, "--json", check=1)
    problems = [p for s in json.loads(report.stdout)["stages"] for p in s["problems"]]
    assert any("docid_bytes.json" in p and field in p for p in problems), problems
    # bracket decoding itself either writes the files anew from docids.parquet or refuses: never other texts
    try:
        again = list(open_docid_bytes(idx))
    except GrtoolError as e:
        assert "docid_bytes.json" in str(e)
    else:
        assert again == texts


# ------------------------------------------------------------------------------------ lookup cache


@pytest.fixture(scope="module")
def lookup_dir(tmp_path_factory) -> Path:
    from grtool.docid.lookup_files import open_lookup
    from index_helpers import write_triples_stage

    root = tmp_path_factory.mktemp("lookup")
    rows = [json.loads(line) for line in BUNDLED.read_text().splitlines()]
    write_triples_stage(root / "triples", rows)
    return open_lookup(root / "triples", root=root / "cache").path


LOOKUP_EDITS = {
    "negative count": (_set("count", -1), "count"),
    "count NaN": (lambda m: json.dumps(m).replace('"count": 12', '"count": NaN'), "lookup.json"),
    "documents more than triples": (lambda m: _set("documents", m["count"] + 1)(m), "documents"),
    "documents off by one": (lambda m: _set("documents", m["documents"] - 1)(m), "arrays"),
    "a dtype of another width": (lambda m: m["arrays"]["fkeys"].update(dtype="<u4"), "arrays.fkeys.dtype"),
    "an unknown dtype": (lambda m: m["arrays"]["fdocs"].update(dtype="<f8"), "arrays.fdocs.dtype"),
    "lengths apart": (lambda m: m["arrays"]["fdocs"].update(length=m["arrays"]["fdocs"]["length"] + 1), "arrays.fdocs.length"),
    "length as text": (lambda m: m["arrays"]["bkeys"].update(length="9"), "arrays.bkeys.length"),
    "no arrays": (_set("arrays", _DROP), "arrays"),
    "doc_ids_bytes": (lambda m: _set("doc_ids_bytes", m["doc_ids_bytes"] + 1)(m), "doc_ids.bin"),
}


@pytest.mark.parametrize("case", sorted(LOOKUP_EDITS))
def test_an_edited_lookup_record_is_refused_and_listed_by_validate(lookup_dir, tmp_path, case):
    from grtool.docid.lookup_files import RECORD, load_lookup
    from grtool.errors import GrtoolError

    d = tmp_path / lookup_dir.name
    shutil.copytree(lookup_dir, d)
    edit, field = LOOKUP_EDITS[case]
    meta = json.loads((d / RECORD).read_text())
    text = edit(meta)
    (d / RECORD).write_text(text if isinstance(text, str) else json.dumps(meta))
    with pytest.raises(GrtoolError, match=field.replace(".", r"\.")):
        load_lookup(d)
    report = run_cli("validate", d, "--json", check=1)
    problems = [p for s in json.loads(report.stdout)["stages"] for p in s["problems"]]
    assert any(field in p for p in problems), problems


def test_the_intact_lookup_validates(lookup_dir):
    run_cli("validate", lookup_dir)


# ------------------------------------------------------------------------------------ train --config

CONFIG_CASES = {
    "learning_rate: true": "learning_rate",
    "learning_rate: [1]": "learning_rate",
    "learning_rate: fast": "learning_rate",
    "per_device_batch_size: 2.5": "per_device_batch_size",
    "per_device_batch_size: '2'": "per_device_batch_size",
    "lora: 1": "lora",
    "system: {a: 1}": "system",
    "bogus_key: 1": "bogus_key",
    "- a list": "mapping",
    "a: [": "YAML",
}


@pytest.mark.parametrize("text", sorted(CONFIG_CASES))
def test_a_bad_config_is_one_line_naming_the_key(tmp_path, text):
    from grtool.errors import InputError
    from grtool.train.config import read_config_file

    conf = tmp_path / "c.yaml"
    conf.write_text(text + "\n")
    with pytest.raises(InputError) as e:
        read_config_file(conf)
    assert str(conf) in str(e.value) and CONFIG_CASES[text] in str(e.value) and "\n" not in str(e.value)


def test_a_valid_config_keeps_its_values(tmp_path):
    from grtool.train.config import read_config_file

    conf = tmp_path / "c.yaml"
    conf.write_text("learning-rate: 1e-6\nwarmup_ratio: '0.1'\nepochs: 2\nlora: true\nsystem: null\npreset: thinkgr\n")
    got = read_config_file(conf)
    assert got == {"learning_rate": 1e-6, "warmup_ratio": 0.1, "epochs": 2.0, "lora": True, "system": None, "preset": "thinkgr"}
    assert isinstance(got["epochs"], float)


# ------------------------------------------------------------------------------------ export rows


ROW_CASES = {
    "an empty target": ({"kind": "memorization", "doc_id": "d", "input": "t", "target": "  "}, "target"),
    "a row that is a list": ([1, 2], "object"),
    "an unknown kind": ({"kind": "ranking", "doc_id": "d", "input": "t", "target": "x"}, "kind"),
    "a negative step": ({"kind": "retrieval", "qid": "q", "step": -1, "input": "i", "target": "t", "doc_id": None}, "step"),
    "a step as bool": ({"kind": "retrieval", "qid": "q", "step": True, "input": "i", "target": "t", "doc_id": None}, "step"),
    "an extra field": ({"kind": "memorization", "doc_id": "d", "input": "t", "target": "x", "extra": 1}, "extra"),
    "a nested target": ({"kind": "memorization", "doc_id": "d", "input": "t", "target": {"a": [1]}}, "target"),
}


@pytest.mark.parametrize("case", sorted(ROW_CASES))
@pytest.mark.parametrize("layout", ["jsonl", "array one per line", "array on one line"])
def test_an_export_row_of_the_wrong_shape_is_named_by_record_and_field(export_file, case, layout):
    from grtool.vocab.provenance import write_sidecar

    bad, field = ROW_CASES[case]
    good = {"kind": "memorization", "doc_id": "d0", "input": "title", "target": "text"}
    rows = [good, bad, good]
    if layout == "jsonl":
        text = "".join(json.dumps(r) + "\n" for r in rows)
    elif layout == "array one per line":
        text = "[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n"
    else:
        text = json.dumps(rows)
    export_file.write_text(text)
    write_sidecar(export_file, kind="gmr", fmt="gmr", rows=3, json_array=layout != "jsonl", inputs=[])
    report = run_cli("validate", export_file, "--json", check=1)
    problems = [p for s in json.loads(report.stdout)["stages"] for p in s["problems"]]
    assert any("row 2" in p and field in p and "gmr.jsonl" in p for p in problems), problems


@pytest.mark.parametrize("layout", ["array one per line", "array on one line", "jsonl"])
def test_a_deeply_nested_export_row_is_one_line_naming_the_row(export_file, layout):
    from grtool.vocab.provenance import write_sidecar

    good = json.dumps({"kind": "memorization", "doc_id": "d0", "input": "title", "target": "text"})
    deep = '{"kind": "memorization", "doc_id": "d", "input": "t", "target": ' + "[" * 100_000 + "]" * 100_000 + "}"
    if layout == "jsonl":
        text = f"{good}\n{deep}\n"
    elif layout == "array one per line":
        text = f"[\n{good},\n{deep}\n]\n"
    else:
        text = f"[{good},{deep}]"
    export_file.write_text(text)
    write_sidecar(export_file, kind="gmr", fmt="gmr", rows=2, json_array=layout != "jsonl", inputs=[])
    report = run_cli("validate", export_file, "--json", check=1)
    assert "Traceback" not in report.stderr
    problems = [p for s in json.loads(report.stdout)["stages"] for p in s["problems"]]
    assert any("gmr.jsonl" in p and ("row 2" in p or "line 2" in p or "record 2" in p) for p in problems), problems


def test_an_index_of_documents_relabelled_docids_is_refused(tmp_path):
    """The other direction of the issue's example: no docid table to tell, the sequences themselves do."""
    from grtool.store.schemas import DOCUMENTS
    from grtool.store.stage import StageSpec, StageWriter

    stage = StageWriter(tmp_path / "docs", StageSpec("documents", DOCUMENTS))
    with stage.shard(0) as sh:
        sh.count_in(3)
        sh.write_rows([{"doc_id": f"d{i}", "title": f"t{i}", "text": f"harbor bridge number {i}", "datasets": ["test"]} for i in range(3)])
    stage.finish()
    idx = tmp_path / "idx"
    run_cli("index", "build", tmp_path / "docs", "--tokenizer", "qwen", "--source", "documents", "--out", idx)
    intact = run_cli("index", "query", idx, "harbor bridge", "--json")
    assert json.loads(intact.stdout)["read_as"] == "prefix"
    meta = json.loads((idx / "index.json").read_text())
    meta["source"] = "docids"
    (idx / "index.json").write_text(json.dumps(meta))
    _one_line_naming(run_cli("index", "query", idx, "harbor bridge", "--json", check=False), "index.json", "field source")
    proc = run_cli("validate", idx, check=1)
    assert "field source" in proc.stderr and "Traceback" not in proc.stderr


def _plan(rows: list, buckets: int) -> str:
    table = f'{{"buckets": {buckets}, "rows": {rows}, "rejects": 0}}'
    return f'{{"identity": {{}}, "documents": {table}, "questions": {table}}}'


@pytest.mark.parametrize("work", ["_ingest_work", "_merge_work"])
@pytest.mark.parametrize(
    "plan, field",
    [
        (_plan([1, 2], 3), "rows"),  # a count per bucket, not fewer
        (_plan([-1], 1), "rows"),
        (_plan([1], 0), "buckets"),
        (_plan([1], 1).replace('"identity": {}', '"identity": {"x": ' + DEEP + "}"), "nested"),
    ],
)
def test_a_damaged_spill_plan_is_one_line_naming_it(tmp_path, work, plan, field):
    """A spill plan left by a stopped ingest or merge is read back through its declaration: a damaged one is one
    line naming plan.json and the field (exit 1), never a traceback nor rows written by a wrong plan."""
    source = tmp_path / "corpus"
    if work == "_merge_work":
        grtool("corpus", "ingest", EXAMPLES / "2wikimultihopqa", "--out", source).check_returncode()
    out = tmp_path / "out"
    (out / work).mkdir(parents=True)
    (out / work / "plan.json").write_text(plan)
    args = ("ingest", EXAMPLES / "2wikimultihopqa") if work == "_ingest_work" else ("merge", source)
    one_line(grtool("corpus", *args, "--out", out), 1, "plan.json", field)


def test_the_slurm_job_records_are_exactly_their_declaration(tmp_path):
    """Every _pipeline/slurm/STAGE.json a run submits is the bytes its declaration encodes: the writer builds the
    SlurmJobRecord, so no field can be written that the reader does not know."""
    import slurm_fakes
    from slurm_plan_helpers import plan_config

    from grtool.pipeline.records import read_slurm_job
    from grtool.records import to_builtins
    from grtool.store.records import dumps

    env = slurm_fakes.install(tmp_path / "slurm")
    out = tmp_path / "run"
    config = Path(plan_config(tmp_path, "", "{ tasks = 3 }", out))
    proc = grtool("pipeline", "run", config, "--executor", "slurm", env=env)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    records = sorted((out / "_pipeline" / "slurm").glob("*.json"))
    assert [p.stem for p in records] == ["index", "ingest", "triples"]
    for path in records:
        record = read_slurm_job(path)
        assert path.read_bytes() == dumps(to_builtins(record)), path
    triples = read_slurm_job(out / "_pipeline" / "slurm" / "triples.json")
    assert triples.tasks == 3 and triples.jobs.run and triples.jobs.finalize
