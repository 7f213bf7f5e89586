"""Generic values read as given (issue #45, item 5): integer ids kept digit for digit, a float id that lost digits
refused, blank ids, questions, answers and document texts rejected with their reason, split names normalised
once (case, blanks; validation and val are dev), and a documents file keyed ``doc_id`` (grtool's own column name)
read by that id. Through the library's ingest on files written here (our own text)."""

from __future__ import annotations

import json
from pathlib import Path

from grtool.corpus.ingest import ingest
from grtool.store.stage import read_table

DOCS = [{"id": "d1", "title": "Ada Quill", "text": "Ada Quill drew maps of the Lowmere valley."},
        {"id": "d2", "title": "Lowmere", "text": "Lowmere is a river town with paper mills."}]  # fmt: skip


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _rejects(out: Path, table: str) -> dict[str, str]:
    f = out / table / "_rejects" / "part-00000.jsonl"
    rows = [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []
    return {r["position"]: r["reason"] for r in rows}


def test_integer_ids_past_64_bits_keep_every_digit(tmp_path):
    docs = _write(tmp_path / "docs.jsonl", DOCS)
    lines = [f'{{"qid": 123456789012345678901234567890{n}, "question": "Who drew maps {n}?", "answer": "Ada", "gold_doc_ids": ["d1"]}}\n'
             for n in (1, 2)]  # fmt: skip
    (tmp_path / "q.jsonl").write_text("".join(lines))
    out = tmp_path / "out"
    ingest([docs, tmp_path / "q.jsonl"], out)
    assert sorted(read_table(out / "questions").column("qid").to_pylist()) == ["1234567890123456789012345678901", "1234567890123456789012345678902"]


def test_a_float_id_that_lost_digits_is_refused(tmp_path):
    docs = _write(tmp_path / "docs.jsonl", DOCS)
    q = _write(tmp_path / "q.jsonl", [{"qid": 1.2345678901234567e25, "question": "Who?", "answer": "Ada", "gold_doc_ids": ["d1"]},
                                      {"qid": "ok", "question": "Who drew maps?", "answer": "Ada", "gold_doc_ids": ["d1"]}])  # fmt: skip
    out = tmp_path / "out"
    ingest([docs, q], out, allow_rejects=True)
    assert list(_rejects(out, "questions").values()) == ["field 'qid' has the wrong type"]


def test_blank_values_are_rejected_with_their_reason(tmp_path):
    docs = _write(tmp_path / "docs.jsonl", [*DOCS, {"id": "d3", "title": "Empty", "text": "   "}])
    q = _write(tmp_path / "q.jsonl", [
        {"qid": " ", "question": "Who drew maps?", "answer": "Ada", "gold_doc_ids": ["d1"]},
        {"qid": "q2", "question": "  ", "answer": "Ada", "gold_doc_ids": ["d1"]},
        {"qid": "q3", "question": "Who drew maps?", "answer": "", "gold_doc_ids": ["d1"]},
        {"qid": "q4", "question": "Which town has mills?", "answer": "Lowmere", "gold_doc_ids": ["d2"]},
    ])  # fmt: skip
    out = tmp_path / "out"
    report = ingest([docs, q], out, allow_rejects=True)
    assert sorted(_rejects(out, "questions").values()) == ["empty answer", "empty question", "field 'qid' is blank"]
    assert list(_rejects(out, "documents").values()) == ["empty document text"]
    assert read_table(out / "questions").column("qid").to_pylist() == ["q4"]
    assert report.questions_by_dataset == {"generic": 4}  # every question record read: 1 kept + 3 rejected (before: 1)
    assert report is not None


def test_split_names_are_normalised_once(tmp_path):
    docs = _write(tmp_path / "docs.jsonl", DOCS)
    q = _write(tmp_path / "q.jsonl", [{"qid": f"q{i}", "question": f"Who drew maps {i}?", "answer": "Ada", "gold_doc_ids": ["d1"], "split": split}
                                      for i, split in enumerate(["Validation ", "val", "TRAIN", " test", "dev", "training", "weird\x1b[31m"])])  # fmt: skip
    out = tmp_path / "out"
    report = ingest([docs, q], out, allow_rejects=True)
    splits = dict(zip(*(read_table(out / "questions").column(c).to_pylist() for c in ("qid", "split"))))
    assert splits == {"q0": "dev", "q1": "dev", "q2": "train", "q3": "test", "q4": "dev", "q5": "train"}
    assert list(_rejects(out, "questions").values()) == ["field 'split' holds a control character"]
    # what was mapped is said once in the summary (before: silently)
    assert report.splits_read_as == {"'Validation ' as dev": 1, "'val' as dev": 1, "'TRAIN' as train": 1, "' test' as test": 1, "'training' as train": 1}


def test_a_documents_file_keyed_doc_id_is_read_by_that_id(tmp_path):
    docs = _write(tmp_path / "docs.jsonl", [{"doc_id": d["id"], "title": d["title"], "text": d["text"]} for d in DOCS])
    q = _write(tmp_path / "q.jsonl", [{"qid": "q1", "question": "Which town has mills?", "answer": "Lowmere", "gold_doc_ids": ["d2"]}])
    out = tmp_path / "out"
    ingest([docs, q], out)
    [gold] = read_table(out / "questions").column("gold_doc_ids").to_pylist()
    titles = dict(zip(*(read_table(out / "documents").column(c).to_pylist() for c in ("doc_id", "title"))))
    assert [titles[g] for g in gold] == ["Lowmere"]


def test_a_nan_id_from_a_table_export_is_blank_not_the_id_nan(tmp_path):
    # before: NaN became the qid "nan", and a gold id NaN resolved to the document whose id was NaN too
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [float("nan"), 2.0], "title": ["Ada Quill", "Lowmere"], "text": [DOCS[0]["text"], DOCS[1]["text"]]}), tmp_path / "docs.parquet")
    q = _write(tmp_path / "q.jsonl", [{"qid": "q1", "question": "Which town has mills?", "answer": "Lowmere", "gold_doc_ids": [2]}])
    pq.write_table(pa.table({"qid": [float("nan")], "question": ["Who drew maps?"], "answer": ["Ada"], "gold_doc_ids": [["2"]]}), tmp_path / "q2.parquet")
    out = tmp_path / "out"
    ingest([tmp_path / "docs.parquet", q, tmp_path / "q2.parquet"], out, allow_rejects=True)
    assert "nan" not in read_table(out / "questions").column("qid").to_pylist()
    assert "field 'id' is blank" in _rejects(out, "documents").values() and "field 'qid' is blank" in _rejects(out, "questions").values()


def test_split_names_given_on_the_command_line_are_normalised_as_records_are(tmp_path, cli):
    docs = _write(tmp_path / "docs.jsonl", DOCS)
    q = _write(tmp_path / "q.jsonl", [{"qid": f"q{i}", "question": f"Who drew maps {i}?", "answer": "Ada", "gold_doc_ids": ["d1"]} for i in range(6)])
    err = cli("corpus", "ingest", docs, q, "--split", " Validation ", "--out", tmp_path / "out").stderr
    assert set(read_table(tmp_path / "out" / "questions").column("split").to_pylist()) == {"dev"}  # before: " Validation "
    assert "--split ' Validation ' is read as 'dev'" in err, err
    err = cli("corpus", "ingest", docs, q, "--split", "dev\x07", "--out", tmp_path / "o2", check=2).stderr
    assert "--split 'dev\\x07': a split name holds a control character" in err, err  # before: "is not blank"
    # corpus split --names: the same names, and two that normalise alike are one (before: splits "train" and "TRAIN")
    cli("corpus", "split", tmp_path / "out", "--ratios", "0.5,0.5", "--names", " Train ,Validation", "--resplit", "--out", tmp_path / "s")
    assert set(read_table(tmp_path / "s" / "questions").column("split").to_pylist()) <= {"train", "dev"}
    assert "split names must be distinct" in cli("corpus", "split", tmp_path / "out", "--ratios", "0.5,0.5", "--names", "train,TRAIN", "--resplit", "--out", tmp_path / "s2", check=2).stderr


def test_keys_of_musique_paragraphs_no_converter_reads_are_named(tmp_path):
    """A MuSiQue paragraph's keys other than idx, title, paragraph_text and is_supporting are not kept anywhere:
    the summary names them as paragraphs[].KEY (before: only top-level keys were named, these went unsaid)."""
    from conftest import REPO

    [record, *_] = [json.loads(line) for line in (REPO / "tests" / "data" / "musique" / "musique_ans_v1.0_dev.samples.jsonl").read_text().splitlines()]
    record["paragraphs"][0]["url"] = "https://example.org/a"
    record["paragraphs"][1]["retrieved_by"] = "bm25"
    out = tmp_path / "out"
    report = ingest([_write(tmp_path / "musique_ans_v1.0_dev.jsonl", [record])], out)
    [entry] = report.detected
    assert entry["dataset"] == "musique" and entry["unread"] == ["paragraphs[].retrieved_by", "paragraphs[].url"]


def test_a_key_given_twice_in_a_line_is_rejected_with_its_reason(tmp_path):
    """A JSON reader keeps the last of two values for one key without a word (before: "B?" was the question)."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps(DOCS[0]) + "\n" + '{"id": "d2", "title": "Lowmere", "text": "a", "text" : "Lowmere is a river town."}\n')  # a blank before the colon too
    q = tmp_path / "q.jsonl"
    q.write_text('{"qid": "q1", "question": "A?", "question": "B?", "answer": "Ada", "gold_doc_ids": ["d1"]}\n'
                 '{"qid": "q2", "question": "Who drew maps?", "answer": "Ada", "gold_doc_ids": ["d1"], "meta": {"k": 1, "k": 2}}\n'
                 '{"qid": "q3", "question": "Who said \\"a\\": b?" , "answer" : "Ada", "gold_doc_ids": ["d1"]}\n')  # fmt: skip
    out = tmp_path / "out"
    ingest([docs, q], out, allow_rejects=True)
    assert sorted(_rejects(out, "questions").values()) == ["key given twice", "key given twice"]
    assert list(_rejects(out, "documents").values()) == ["key given twice"]
    assert read_table(out / "questions").column("qid").to_pylist() == ["q3"]  # a quote and colon in a text, spaces: no repeat
