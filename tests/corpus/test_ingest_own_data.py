"""Own data without friction (#48): the inline layout (paragraphs inside each question), ``--columns`` for other key
names, Parquet and Arrow inputs (what Hugging Face ``datasets`` writes), the keys a layout does not read named in
the summary, and ambiguous gold titles stopping ingest unless ``--allow-rejects``.

Expected rows are computed here from the records as written: each paragraph's doc_id is grtool's hash of its own
title and text, the gold list the supporting paragraphs in the order given.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grtool.corpus.doc_hash import doc_id
from grtool.corpus.ingest import ingest
from grtool.errors import InputError
from grtool.store.stage import read_table


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _questions(out: Path) -> dict[str, dict]:
    return {r["qid"]: r for r in read_table(out / "questions").to_pylist()}


def _expected_gold(record: dict) -> list[str]:
    return [doc_id(p["title"], p["text"]) for p in record["paragraphs"] if p["is_supporting"]]


@pytest.fixture
def inline_file(examples) -> Path:
    return examples / "inline" / "qa.jsonl"


def test_inline_layout_is_detected_and_reads_paragraphs_as_documents_and_gold(inline_file, tmp_path):
    records = _lines(inline_file)
    report = ingest([inline_file], tmp_path / "auto")
    (entry,) = report.detected
    assert (entry["records"], entry["layout"], entry["by"], entry["dataset"]) == ("questions", "inline", "detected", "generic")
    questions = _questions(tmp_path / "auto")
    assert set(questions) == {r["id"] for r in records}
    for r in records:
        q = questions[r["id"]]
        assert q["gold_doc_ids"] == _expected_gold(r) and q["question"] == r["question"] and q["answer"] == r["answer"]
        assert q["answer_aliases"] == r.get("aliases", [])
    paragraphs = {doc_id(p["title"], p["text"]) for r in records for p in r["paragraphs"]}
    assert {d["doc_id"] for d in read_table(tmp_path / "auto" / "documents").to_pylist()} == paragraphs
    assert report.paragraphs == sum(len(r["paragraphs"]) for r in records) and report.documents == len(paragraphs)
    # named explicitly: --dataset inline, or generic (both are your own data); the rows are the same
    for name in ("inline", "generic"):
        ingest([inline_file], tmp_path / name, dataset=name)
        assert _questions(tmp_path / name) == questions


def test_inline_records_without_id_get_a_question_hash_and_bad_paragraphs_are_rejects(tmp_path):
    good = {
        "question": "Which brook?",
        "answer": ["Lisk", "the Lisk"],
        "split": "dev",
        "paragraphs": [{"title": "Heron Mill", "text": "Heron Mill stands on the Lisk.", "is_supporting": True}, {"text": "An untitled paragraph."}],
    }
    bad = {"id": "x", "question": "q", "answer": "a", "paragraphs": [{"title": "T", "text": 3}]}
    out = tmp_path / "out"
    report = ingest([_write(tmp_path / "mine.jsonl", [good, bad])], out)
    (q,) = _questions(out).values()
    assert q["qid"].startswith("q-") and q["split"] == "dev" and q["answer_aliases"] == ["the Lisk"]
    assert q["gold_doc_ids"] == [doc_id("Heron Mill", "Heron Mill stands on the Lisk.")]
    assert report.rejected == {"questions: field 'paragraphs' has the wrong type": 1}


def test_columns_map_other_key_names_and_are_validated(inline_file, tmp_path, cli):
    flashrag = [
        {
            "id": r["id"],
            "query": r["question"],
            "golden_answers": [r["answer"], *r.get("aliases", [])],
            "paragraphs": [{"heading": p["title"], "text": p["text"], "gold": p["is_supporting"]} for p in r["paragraphs"]],
        }
        for r in _lines(inline_file)
    ]
    source = _write(tmp_path / "flashrag_dev.jsonl", flashrag)
    with pytest.raises(InputError, match=r"unknown schema .*try --columns answer=golden_answers,question=query"):
        ingest([source], tmp_path / "unmapped")
    out = tmp_path / "mapped"
    ingest([source], out, columns="question=query, answer=golden_answers,title=heading,is_supporting=gold")
    reference = tmp_path / "reference"
    ingest([inline_file], reference, split="dev")
    assert _questions(out) == _questions(reference)

    proc = cli("corpus", "ingest", source, "--columns", "questio=query", "--out", tmp_path / "o1", check=2)
    assert "unknown target name 'questio'" in proc.stderr
    proc = cli("corpus", "ingest", source, "--columns", "question=query,aliases=answer_aliases", "--out", tmp_path / "o2", check=2)
    assert "--columns aliases=answer_aliases: no record of the inputs has the key 'answer_aliases'" in proc.stderr
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    with pytest.raises(InputError, match="is not TARGET=SOURCE"):
        ingest([source], tmp_path / "o3", columns="question")
    # a record holding the target under both names is a reject, not a silent choice
    twice = _write(tmp_path / "twice_dev.jsonl", [{**flashrag[0], "question": "another"}, flashrag[1]])
    report = ingest([twice], tmp_path / "o4", columns="question=query,answer=golden_answers,title=heading,is_supporting=gold")
    assert report.questions == 1 and report.rejected == {"questions: key given twice": 1}


def test_parquet_file_and_save_to_disk_folder_are_read_like_json_lines(inline_file, tmp_path):
    datasets = pytest.importorskip("datasets")
    records = _lines(inline_file)
    data = datasets.Dataset.from_list(records)
    data.to_parquet(str(tmp_path / "qa.parquet"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(records[:8]), "validation": datasets.Dataset.from_list(records[8:])}).save_to_disk(str(tmp_path / "saved"))
    reference = tmp_path / "reference"
    ingest([inline_file], reference)
    expected = _questions(reference)

    ingest([tmp_path / "qa.parquet"], tmp_path / "from-parquet")
    assert _questions(tmp_path / "from-parquet") == expected

    report = ingest([tmp_path / "saved"], tmp_path / "from-arrow")
    assert {(Path(e["path"]).parent.name, e["split"]) for e in report.detected} == {("train", "train"), ("validation", "dev")}
    got = _questions(tmp_path / "from-arrow")  # the folder's state.json / dataset_info.json are not read as inputs
    assert {q: {**row, "split": None} for q, row in got.items()} == {q: {**row, "split": None} for q, row in expected.items()}
    assert {q for q, row in got.items() if row["split"] == "train"} == {r["id"] for r in records[:8]}


def test_a_cut_parquet_file_names_the_file(inline_file, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    path = tmp_path / "qa.parquet"
    pq.write_table(pa.Table.from_pylist(_lines(inline_file)), path)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(InputError, match=r"qa\.parquet, row 1: not a readable Parquet file"):
        ingest([path], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_keys_a_layout_does_not_read_are_named(tmp_path, cli):
    questions = _write(
        tmp_path / "questions_dev.jsonl",
        [
            {
                "qid": "a1",
                "question": "Which brook?",
                "answer": "Lisk",
                "answer_aliases": ["the Lisk"],
                "gold_titles": ["Heron Mill"],
                "supporting_paragraphs": [{"title": "Heron Mill", "text": "Heron Mill stands on the Lisk."}],
            }
        ],
    )
    documents = _write(tmp_path / "documents.jsonl", [{"id": "d1", "title": "Heron Mill", "text": "Heron Mill stands on the Lisk.", "url": "x"}])
    report = ingest([questions, documents], tmp_path / "out", dataset="generic")
    unread = {Path(e["path"]).name: e.get("unread") for e in report.detected}
    assert unread == {"questions_dev.jsonl": ["answer_aliases", "supporting_paragraphs"], "documents.jsonl": ["url"]}
    proc = cli("corpus", "ingest", questions, documents, "--dataset", "generic", "--out", tmp_path / "cli")
    assert "answer_aliases, supporting_paragraphs" in proc.stderr and "--columns aliases=answer_aliases" in proc.stderr
    # read under their names, they are no longer named
    report = ingest([questions, documents], tmp_path / "mapped", dataset="generic", columns="aliases=answer_aliases")
    assert report.detected[0]["unread"] == ["supporting_paragraphs"]
    assert _questions(tmp_path / "mapped")["a1"]["answer_aliases"] == ["the Lisk"]


def test_ambiguous_gold_titles_stop_ingest_unless_allowed(tmp_path, cli):
    documents = _write(
        tmp_path / "documents.jsonl",
        [{"id": "m1", "title": "Heron Mill", "text": "Heron Mill stands on the Lisk."}, {"id": "m2", "title": "Heron Mill", "text": "Heron Mill is also a farm near Saxby."}],
    )
    questions = _write(
        tmp_path / "questions_dev.jsonl",
        [{"qid": f"q{i}", "question": "Which mill?", "answer": "Heron Mill", "gold_titles": ["Heron Mill"]} for i in range(3)]
        + [{"qid": "ok", "question": "Which mill?", "answer": "Heron Mill", "gold_doc_ids": ["m1"]}],
    )
    out = tmp_path / "out"
    proc = cli("corpus", "ingest", questions, documents, "--dataset", "generic", "--out", out, check=1)
    message = " ".join(proc.stderr.split())
    assert "line 1 (qid 'q0'): 'Heron Mill' is the title of 2 different documents" in message
    assert "(and 2 more questions); nothing was written" in message and "gold_doc_ids" in message and "--allow-rejects" in message
    assert not out.exists()
    proc = cli("corpus", "ingest", questions, documents, "--dataset", "generic", "--out", out, "--allow-rejects", "--json")
    report = json.loads(proc.stdout)
    assert report["questions"] == 1 and report["rejected"] == {"questions: ambiguous gold title": 3}
