"""`grtool validate`: manifest against shard records and files, and cross-table references of single directories."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import EXAMPLES, TEST_DATA, run_cli
from grtool.store.schemas import DOCUMENTS, QUESTIONS
from grtool.store.stage import StageSpec, StageWriter


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    """A real run directory (documents/ and questions/) from the bundled HotpotQA example."""
    out = tmp_path_factory.mktemp("ingest") / "run"
    run_cli("corpus", "ingest", EXAMPLES / "hotpotqa" / "hotpot_dev_distractor_v1.example.json", "--out", out)
    return out


@pytest.fixture
def run(ingested, tmp_path):
    """A private copy of the ingested run, free to tamper with."""
    return shutil.copytree(ingested, tmp_path / "run")


def _validate(path, code):
    proc = run_cli("validate", path, check=code)
    return proc.stdout + proc.stderr


def _validate_json(path, code):
    return json.loads(run_cli("validate", path, "--json", check=code).stdout)


def _edit_manifest(stage, edit):
    m = json.loads((stage / "_manifest.json").read_bytes())
    edit(m)
    (stage / "_manifest.json").write_text(json.dumps(m))


def _write(path, table, schema, parts):
    """A finished stage directory with one shard per entry of ``parts`` (a list of row lists)."""
    stage = StageWriter(path, StageSpec(table, schema, command=["grtool", "test"]), num_parts=len(parts))
    for i, rows in enumerate(parts):
        with stage.shard(i) as shard:
            shard.count_in(len(rows))
            shard.write_rows(rows)
    return stage.finish()


def _doc(i):
    return {"doc_id": f"d{i}", "title": f"T{i}", "text": f"text {i}", "datasets": ["x"]}


def _question(qid, gold):
    return {"qid": qid, "dataset": "x", "split": "dev", "question": "?", "answer": "a", "answer_aliases": [], "gold_doc_ids": gold, "type": None, "answerable": True, "meta": "{}"}


# ------------------------------------------------------------------------------------------- clean


def test_clean_run_and_each_stage_alone_pass(run):
    _validate(run, 0)
    _validate(run / "documents", 0)
    _validate(run / "questions", 0)  # the gold check against the sibling documents runs and passes


def test_json_output_shape(run):
    out = _validate_json(run, 0)
    assert out["ok"] is True
    assert {s["table"] for s in out["stages"]} == {"documents", "questions"}
    for s in out["stages"]:
        assert set(s) == {"path", "table", "problems", "notes", "checked", "stops"}
        assert s["problems"] == [] and s["notes"] == [] and s["stops"] == []
        assert s["checked"]["shards"] == 1 and s["checked"]["rows"] > 0

    (run / "documents" / "part-00000.parquet").write_bytes(b"garbage")
    out = _validate_json(run / "documents", 1)
    assert out["ok"] is False and len(out["stages"]) == 1
    assert any("part-00000.parquet" in p for p in out["stages"][0]["problems"])


# ------------------------------------------------------------------------------- shards and manifest


def test_corrupted_shard_bytes_fail_naming_the_file(run):
    shard = run / "questions" / "part-00000.parquet"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    text = _validate(run, 1)
    assert "part-00000.parquet: sha256 does not match" in text
    assert "FAIL" in text and "questions" in text


@pytest.mark.parametrize(
    "field, value",
    [("sha256", "0" * 64), ("rows", 999), ("bytes", 1)],
)
def test_tampered_manifest_shard_entry_fails(run, field, value):
    _edit_manifest(run / "documents", lambda m: m["shards"]["part-00000"].update({field: value}))
    problems = _validate_json(run / "documents", 1)["stages"][0]["problems"]
    # a row count that no longer sums to the manifest's rows fails the manifest's own rule first
    named = "_manifest.json: manifest: field rows: " if field == "rows" else "_manifest.json: part-00000 " + field
    assert any(named in p and (field == "rows" or "_shards/part-00000.json" in p) for p in problems), problems


def test_tampered_manifest_totals_fail(run):
    _edit_manifest(run / "documents", lambda m: m["counters"].update({"in": m["counters"]["in"] + 1}))
    problems = _validate_json(run / "documents", 1)["stages"][0]["problems"]
    assert any(p.startswith("_manifest.json: counters.in") for p in problems), problems
    # rows that are not the sum of the shards the manifest lists: the manifest's own rule (grtool.store.records)
    _edit_manifest(run / "documents", lambda m: m.update({"rows": 999}))
    problems = _validate_json(run / "documents", 1)["stages"][0]["problems"]
    assert any("_manifest.json: manifest: field rows: 999" in p for p in problems), problems


def test_tampered_shard_record_fails_against_the_file(run):
    record = run / "documents" / "_shards" / "part-00000.json"
    rec = json.loads(record.read_bytes())
    rec["rows"] = 999
    record.write_text(json.dumps(rec))
    text = _validate(run / "documents", 1)
    assert "_manifest.json: part-00000 rows" in text  # the manifest no longer agrees with the record
    assert "part-00000.parquet:" in text and "rows, _shards/part-00000.json says 999" in text


def test_shard_without_record_and_record_without_shard_fail(tmp_path):
    docs = tmp_path / "documents"
    _write(docs, "documents", DOCUMENTS, [[_doc(0)], [_doc(1)]])
    (docs / "part-00000.parquet").unlink()
    shutil.copy(docs / "part-00001.parquet", docs / "part-00007.parquet")
    text = _validate(docs, 1)
    assert "part-00000.parquet: recorded as done in _shards/part-00000.json but the file is missing" in text
    assert "part-00007.parquet: shard file without a completion record" in text


def test_manifest_listing_an_uncommitted_shard_fails(tmp_path):
    docs = tmp_path / "documents"
    _write(docs, "documents", DOCUMENTS, [[_doc(0)], [_doc(1)]])
    (docs / "_shards" / "part-00001.json").unlink()
    (docs / "part-00001.parquet").unlink()
    text = _validate(docs, 1)
    assert "_manifest.json: lists part-00001 but _shards/part-00001.json does not exist" in text


def test_manifest_lagging_behind_newer_records_is_a_note(tmp_path):
    # Task A commits part 0 and merges; task B commits part 1 and has not merged yet.
    docs = tmp_path / "documents"
    stage = StageWriter(docs, StageSpec("documents", DOCUMENTS, command=["grtool", "test"]), num_parts=2)
    for i in range(2):
        with stage.shard(i) as shard:
            shard.count_in(1)
            shard.write_rows([_doc(i)])
        if i == 0:
            stage.finish()
    out = _validate_json(docs, 0)["stages"][0]
    assert out["problems"] == []
    assert len(out["notes"]) == 1 and "part-00001" in out["notes"][0] and "lags" in out["notes"][0]
    assert out["checked"] == {"rows": 2, "shards": 2}  # the unmerged shard is still verified
    stage.finish()
    assert _validate_json(docs, 0)["stages"][0]["notes"] == []


# ----------------------------------------------------------------------------------- cross-table


def test_questions_alone_checked_against_sibling_documents(tmp_path):
    _write(tmp_path / "documents", "documents", DOCUMENTS, [[_doc(0), _doc(1)]])
    _write(tmp_path / "questions", "questions", QUESTIONS, [[_question("q1", ["d0", "d1"]), _question("q2", ["d1", "d9"])]])
    text = _validate(tmp_path / "questions", 1)
    assert "1 gold doc ids" in text and "q2 -> d9" in text
    _validate(tmp_path / "documents", 0)  # documents reference nothing
    whole = _validate_json(tmp_path, 1)
    [q] = [s for s in whole["stages"] if s["table"] == "questions"]
    assert any("q2 -> d9" in p for p in q["problems"])


def test_questions_without_sibling_documents_pass(tmp_path):
    _write(tmp_path / "questions", "questions", QUESTIONS, [[_question("q1", ["d9"])]])
    _validate(tmp_path / "questions", 0)


def test_ingested_questions_alone_fail_when_a_gold_document_is_removed(run):
    import pyarrow.parquet as pq

    gold = {d for row in pq.read_table(run / "questions" / "part-00000.parquet").to_pylist() for d in row["gold_doc_ids"]}
    victim = sorted(gold)[0]
    docs = [r for r in pq.read_table(run / "documents" / "part-00000.parquet").to_pylist() if r["doc_id"] != victim]
    shutil.rmtree(run / "documents")
    _write(run / "documents", "documents", DOCUMENTS, [docs])
    text = _validate(run / "questions", 1)
    assert victim in text and "gold doc ids" in text


def test_incomplete_sibling_documents_is_a_note(tmp_path):
    stage = StageWriter(tmp_path / "documents", StageSpec("documents", DOCUMENTS, command=["grtool", "test"]), num_parts=2)
    with stage.shard(0) as shard:
        shard.count_in(1)
        shard.write_rows([_doc(0)])
    stage.finish()
    _write(tmp_path / "questions", "questions", QUESTIONS, [[_question("q1", ["d9"])]])
    out = _validate_json(tmp_path / "questions", 0)["stages"][0]
    assert any("not complete" in n for n in out["notes"])


# ----------------------------------------------------------------------------------- lost manifests


def test_a_stage_that_lost_its_manifest_fails_the_run_naming_it(run):
    (run / "documents" / "_manifest.json").unlink()
    out = _validate_json(run, 1)
    [docs] = [s for s in out["stages"] if s["path"].endswith("documents")]
    assert docs["table"] == "documents"  # told by its shards' schema
    assert any("_manifest.json is missing" in p and "part-*.parquet" in p for p in docs["problems"]), docs
    # The gold check the questions needed cannot be done: said, not silently skipped.
    [q] = [s for s in out["stages"] if s["table"] == "questions"]
    assert any("gold doc ids not checked" in n and "no _manifest.json" in n for n in q["notes"]), q
    # Each directory alone: the orphan fails, and the questions fail since their check cannot be done.
    assert "_manifest.json is missing" in _validate(run / "documents", 1)
    assert "gold doc ids not checked" in _validate(run / "questions", 1)


def test_shards_alone_without_records_or_manifest_fail(tmp_path):
    docs = tmp_path / "run" / "documents"
    _write(docs, "documents", DOCUMENTS, [[_doc(0)]])
    shutil.rmtree(docs / "_shards")
    (docs / "_manifest.json").unlink()
    text = _validate(tmp_path / "run", 1)
    assert "FAIL" in text and str(docs) in text and "_manifest.json is missing: 1 part-*.parquet file(s) and 0 shard record(s)" in text


def test_a_directory_without_anything_to_validate_says_what_it_found(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "notes.txt").write_text("hello")
    text = _validate(tmp_path / "empty", 1)
    assert "no stage directory (_manifest.json, part-*.parquet), no index (index.json) and no export" in " ".join(text.split())
    assert "no such file or directory" in run_cli("validate", tmp_path / "missing", check=2).stderr


# ------------------------------------------------------------------------------------------- indexes

BUNDLED_TRIPLES = TEST_DATA / "index_triples.jsonl"


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """A run directory with a triples stage and the index built from it with the real CLI."""
    from grtool.store.schemas import TRIPLES

    root = tmp_path_factory.mktemp("indexed") / "run"
    rows = [json.loads(line) for line in BUNDLED_TRIPLES.read_text().splitlines()]
    _write(root / "triples", "triples", TRIPLES, [rows[:6], rows[6:]])
    run_cli("index", "build", root / "triples", "--tokenizer", "qwen", "--out", root / "index")
    return root


@pytest.fixture
def indexed_run(indexed, tmp_path):
    return shutil.copytree(indexed, tmp_path / "run")


def test_index_is_validated_with_the_run(indexed_run):
    out = _validate_json(indexed_run, 0)
    [index] = [s for s in out["stages"] if s["table"] == "index"]
    assert index["problems"] == [] and index["notes"] == []
    assert index["checked"]["kind"] == "fm" and index["checked"]["probes"] == 3 and index["checked"]["documents"] == 4
    text = _validate(indexed_run, 0)
    assert "ok " in text and "index, fm," in text
    _validate(indexed_run / "index", 0)  # the index directory alone


def test_index_with_a_changed_file_fails(indexed_run):
    f = indexed_run / "index" / "seq_lengths.npy"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0x01
    f.write_bytes(bytes(data))
    assert "seq_lengths.npy: sha256 does not match index.json" in _validate(indexed_run, 1)
    (indexed_run / "index" / "doc_ids.txt").unlink()
    assert "doc_ids.txt: listed in index.json but missing" in _validate(indexed_run / "index", 1)


def test_index_json_rewritten_to_match_damaged_files_still_fails(indexed_run):
    # Checksums alone are not enough when index.json was edited to agree: the index must still answer.
    import numpy as np

    from grtool.store.records import sha256_file

    idx = indexed_run / "index"
    lengths = np.load(idx / "seq_lengths.npy")
    lengths[0] += 1
    np.save(idx / "seq_lengths.npy", lengths)
    meta = json.loads((idx / "index.json").read_text())
    meta["files"]["seq_lengths.npy"] = {"bytes": (idx / "seq_lengths.npy").stat().st_size, "sha256": sha256_file(idx / "seq_lengths.npy")}
    (idx / "index.json").write_text(json.dumps(meta))
    said = _validate(idx, 1)  # opening the index confirms its sizes against seq_lengths.npy
    assert "index.json: field sizes.tokens: 119, but seq_lengths.npy gives 120" in said


def test_index_of_triples_changed_since_is_stale(tmp_path):
    from grtool.store.schemas import TRIPLES

    rows = [json.loads(line) for line in BUNDLED_TRIPLES.read_text().splitlines()]
    _write(tmp_path / "run" / "triples", "triples", TRIPLES, [rows])
    run_cli("index", "build", tmp_path / "run" / "triples", "--tokenizer", "qwen", "--out", tmp_path / "run" / "index")
    _validate(tmp_path / "run", 0)
    shutil.rmtree(tmp_path / "run" / "triples")
    _write(tmp_path / "run" / "triples", "triples", TRIPLES, [rows[:5], rows[5:]])  # the same rows, other shards
    out = _validate_json(tmp_path / "run", 1)
    [index] = [s for s in out["stages"] if s["table"] == "index"]
    assert any(p.startswith("stale: input") and "triples" in p for p in index["problems"]), index


def test_a_run_killed_before_its_first_stage_directory_is_named_as_such(tmp_path, examples):
    # before: "nothing grtool wrote is here", although its lock names the command that was stopped
    import signal

    from hold_helpers import held

    out = tmp_path / "corpus"
    held(["corpus", "ingest", examples / "musique" / "musique_ans_v1.0_dev.example.jsonl", "--out", out], "locked", signal.SIGKILL, tmp_path / "holds")
    err = " ".join(run_cli("validate", out, check=1).stderr.split())
    assert "a grtool run started here (grtool corpus ingest" in err and "stopped before it wrote its first stage directory" in err, err


def test_the_current_directory_is_validated_by_its_name_dot(run, monkeypatch):
    """`grtool validate .` stopped with a traceback (the sidecar of a path without a name of its own)."""
    monkeypatch.chdir(run / "questions")
    assert "ok . (questions" in run_cli("validate", ".").stderr
    monkeypatch.chdir(run)
    assert run_cli("validate", ".").returncode == 0


def test_reports_under_a_run_are_judged_with_it_and_status_marks_a_changed_export(run, tmp_path):
    """`validate RUN` and `report RUN` judge the reports, plots and JSON files grtool wrote under the run by their
    records, as `validate FILE` does (before: a report edited and another removed were "ok" in the run, exit 0);
    `status RUN` marks an export whose size is not the recorded one."""
    stats, overlap = run / "stats.png", run / "overlap.png"
    run_cli("corpus", "stats", run, "--plot", stats)
    run_cli("corpus", "overlap", run, "--plot", overlap)
    assert _validate(run, 0)
    stats.write_bytes(stats.read_bytes() + b" ")
    overlap.unlink()
    out = _validate_json(run, 1)
    files = {r["path"]: r["problems"] for r in out["stages"] if r["table"] == "file"}
    assert any("changed since grtool wrote it" in p for p in files[str(stats)]), files
    assert any("missing, but" in p for p in files[str(overlap)]), files
    states = {Path(r["path"]).name: r["state"] for r in json.loads(run_cli("status", run, "--json").stdout)["files"]}
    assert states == {"stats.png": "changed since it was written (grtool validate)", "overlap.png": "missing (grtool validate)"}, states
    page = tmp_path / "r.html"
    run_cli("report", run, "--out", page, check=1)  # written, and failing as validate fails
    assert "stats.png" in page.read_text() and "FAIL" in page.read_text()

    gmr = run / "data" / "gmr.jsonl"
    run_cli("export", "gmr", run, "--out", gmr)
    gmr.write_text(gmr.read_text()[:40])
    [row] = json.loads(run_cli("status", run, "--json").stdout)["exports"]
    assert row["kind"] == "gmr: changed since it was written (grtool validate)", row


def test_a_damaged_checkpoint_record_is_named_once(tmp_path):
    checkpoint = tmp_path / "ck" / "sft"
    checkpoint.mkdir(parents=True)
    (checkpoint / "grtool.json").write_text('{"kind": "train sft", "kind": "x"}')
    [problem] = _validate_json(checkpoint, 1)["stages"][0]["problems"]
    assert problem.startswith(f"{checkpoint / 'grtool.json'}: the checkpoint record: ") and problem.count("grtool.json") == 1, problem


def test_a_report_s_place_taken_by_a_fifo_or_its_record_by_a_link_fails(run):
    """Before: a FIFO where a plot was is "missing" (or, named itself, "nothing grtool wrote is here"), and a record
    linked in was ok while the next run refused it."""
    import os

    plot, record = run / "s.png", run / ".s.png.grtool-file.json"
    run_cli("corpus", "stats", run, "--plot", plot)
    plot.unlink()
    os.mkfifo(plot)
    for path in (plot, run):
        problems = [p for r in _validate_json(path, 1)["stages"] for p in r["problems"]]
        assert any("a FIFO stands where .s.png.grtool-file.json records the file grtool wrote" in p for p in problems), problems
    plot.unlink()
    plot.mkdir()  # a directory holding nothing grtool wrote, named itself: judged by the record (before: "nothing grtool wrote")
    problems = [p for r in _validate_json(plot, 1)["stages"] for p in r["problems"]]
    assert any("a directory stands where .s.png.grtool-file.json records the file grtool wrote" in p for p in problems), problems
    plot.rmdir()
    run_cli("corpus", "stats", run, "--plot", plot)
    record.rename(run / "kept.json")
    record.symlink_to("kept.json")
    problems = [p for r in _validate_json(run, 1)["stages"] for p in r["problems"]]
    assert any("a symbolic link where grtool keeps the file's record" in p for p in problems), problems
    [row] = json.loads(run_cli("status", run, "--json").stdout)["files"]
    assert row["state"] == "damaged record (grtool validate)", row  # as validate says (before: ok)


def test_corpus_stats_json_of_a_run_without_questions(tmp_path):
    """A run with documents and no questions stage has no questions_total: its report still prints (before the
    report was optional in its declaration: a RuntimeError, exit 1)."""
    run_cli("corpus", "ingest", EXAMPLES / "hotpotqa-wiki", "--out", tmp_path / "wiki")
    shown = json.loads(run_cli("corpus", "stats", tmp_path / "wiki", "--json").stdout)
    assert "questions_total" not in shown and shown["documents"]["total"] > 0, shown
