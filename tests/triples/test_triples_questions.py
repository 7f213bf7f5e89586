"""`triples extract --questions N [--split S]` (#48): the documents of N questions only, so a CPU user extracts the
triples of a small set (the run itself, with the embedded model, is in test_own_data_guide.py)."""

from __future__ import annotations

import json

from grtool.corpus.ingest import ingest
from grtool.store.stage import read_table
from grtool.triples.extract import question_documents


def test_question_documents_are_the_gold_of_the_first_questions_of_the_split(examples, tmp_path):
    ingest([examples / "musique" / n for n in ("musique_ans_v1.0_dev.example.jsonl", "musique_ans_v1.0_train.example.jsonl", "musique_full_v1.0_dev.example.jsonl")], tmp_path / "corpus")
    rows = read_table(tmp_path / "corpus" / "questions").to_pylist()
    train = [r for r in rows if r["split"] == "train"]
    qids, docs = question_documents(tmp_path / "corpus", 2, ("train",))
    assert qids == [r["qid"] for r in train[:2]]
    assert docs == {d for r in train[:2] for d in r["gold_doc_ids"]}
    # an unanswerable question has no gold: its context paragraphs are what chains offer it
    unanswerable = next(r for r in rows if not r["answerable"])
    position = [r["qid"] for r in rows].index(unanswerable["qid"])
    qids, docs = question_documents(tmp_path / "corpus", position + 1)
    assert qids[-1] == unanswerable["qid"] and set(json.loads(unanswerable["meta"])["context_doc_ids"]) <= docs


def test_questions_option_refuses_limit_stdin_and_unknown_splits(examples, tmp_path, cli):
    ingest([examples / "inline" / "qa.jsonl"], tmp_path / "corpus", split="dev")
    proc = cli("triples", "extract", tmp_path / "corpus", "--questions", "2", "--limit", "3", "--out", tmp_path / "o", check=2)
    assert "give one of them" in proc.stderr
    proc = cli("triples", "extract", "-", "--questions", "2", "--out", tmp_path / "o", check=2, input="")
    assert "CORPUS must be a run directory holding questions/" in proc.stderr
    proc = cli("triples", "extract", tmp_path / "corpus", "--questions", "2", "--split", "train", "--out", tmp_path / "o", check=2)
    assert "--split train: no question" in proc.stderr
    assert not (tmp_path / "o").exists()
